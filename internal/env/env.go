package env

/*
#include <stdlib.h>
*/
import "C"

import "unsafe"

// Get returns the value of the environment variable key, "" when unset.
func Get(key string) string {
	k := C.CString(key)
	defer C.free(unsafe.Pointer(k))
	if v := C.getenv(k); v != nil {
		return C.GoString(v)
	}
	return ""
}
