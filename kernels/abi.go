package kernels

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include "symm.h"

// symm_dtype reads line i of include/symm.h's SYMM_DTYPES table (0 past its
// end), so that Go reads every line without naming them.
#define SYMM_DTYPE_ENTRY_(name, code, size) {code, size, #name},
static int symm_dtype(int i, int *code, int *size, const char **name) {
  static const struct { int code, size; const char *name; } t[] = { SYMM_DTYPES(SYMM_DTYPE_ENTRY_) };
  if (i < 0 || i >= (int)(sizeof t / sizeof t[0])) return 0;
  *code = t[i].code, *size = t[i].size, *name = t[i].name;
  return 1;
}

// symm_dtype_count is the number of lines of SYMM_DTYPES.
#define SYMM_DTYPE_ONE_(name, code, size) +1
enum { symm_dtype_count = 0 SYMM_DTYPES(SYMM_DTYPE_ONE_) };
*/
import "C"

import (
	"fmt"
	"strings"
)

// Dtype is an element type of the collectives: a code of include/symm.h's
// SYMM_DTYPES table, which owns the codes, names and sizes.
type Dtype int

const (
	Float32  Dtype = C.SYMM_FLOAT32
	BFloat16 Dtype = C.SYMM_BFLOAT16
	Float16  Dtype = C.SYMM_FLOAT16
)

// NumDtypes is the number of dtypes (lines of SYMM_DTYPES), their codes
// being 0 to NumDtypes-1 (TestDtypesComeFromTheHeader checks): tables of
// kernels by dtype are this long.
const NumDtypes = C.symm_dtype_count

// dtypeInfo is a line of SYMM_DTYPES: the C name (SYMM_FLOAT32), the Go and
// Python one (float32) and the element size.
type dtypeInfo struct {
	cname, name string
	size        int
}

// dtypes is SYMM_DTYPES by code, read once from the header.
var dtypes = func() []dtypeInfo {
	var t []dtypeInfo
	var code, size C.int
	var name *C.char
	for i := C.int(0); C.symm_dtype(i, &code, &size, &name) != 0; i++ {
		for int(code) >= len(t) {
			t = append(t, dtypeInfo{})
		}
		cname := C.GoString(name)
		t[code] = dtypeInfo{cname: cname, name: strings.ToLower(strings.TrimPrefix(cname, "SYMM_")), size: int(size)}
	}
	return t
}()

// Dtypes lists every dtype of SYMM_DTYPES, by code.
func Dtypes() []Dtype {
	var ds []Dtype
	for i, d := range dtypes {
		if d.size != 0 {
			ds = append(ds, Dtype(i))
		}
	}
	return ds
}

func (d Dtype) info() dtypeInfo {
	if d >= 0 && int(d) < len(dtypes) {
		return dtypes[d]
	}
	return dtypeInfo{}
}

// String is the dtype's name (float32), as Python and the messages spell it.
func (d Dtype) String() string {
	if n := d.info().name; n != "" {
		return n
	}
	return fmt.Sprintf("dtype(%d)", int(d))
}

// Size is the element size in bytes (0 for an unknown dtype).
func (d Dtype) Size() int { return d.info().size }

// short is the dtype's name in kernel names: float32 → f32, bfloat16 →
// bf16, float16 → f16 (symm_ar_f32_v4_w2, symm_push_ar_bf16).
func (d Dtype) short() string { return strings.Replace(d.String(), "float", "f", 1) }
