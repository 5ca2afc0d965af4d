"""The ctypes binding against the contract: every function declared in
include/symm.h is typed in symm._loader, with the header's parameter and
result types (parsed from the header, mapped to ctypes), and exported by
the built library, and the error codes match the header's enum."""

from __future__ import annotations

import re

from conftest import HEADER, ROOT


def header_functions() -> set[str]:
    """The C functions: those after the header's `} /* extern "C" */` are C++
    functors for PyTorch (std:: parameters), reached by address, not ctypes."""
    text = HEADER.read_text().split('} /* extern "C" */')[0]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return set(re.findall(r"\b(symm_\w+)\s*\(", text))


def header_error_codes() -> dict[str, int]:
    text = HEADER.read_text()
    return {name: int(value) for name, value in re.findall(r"SYMM_(OK|ERR_\w+)\s*=\s*(\d+)", text)}


def test_every_header_function_is_typed():
    from symm._loader import PROTOTYPES

    declared = header_functions()
    assert declared, "no function found in the header"
    assert declared == set(PROTOTYPES), (
        f"in the header only: {sorted(declared - set(PROTOTYPES))}; "
        f"in the binding only: {sorted(set(PROTOTYPES) - declared)}"
    )


def test_every_function_is_exported_and_typed():
    import symm
    from symm._loader import PROTOTYPES, load

    lib = load()
    for name, (argtypes, restype) in PROTOTYPES.items():
        fn = getattr(lib, name)
        assert fn.argtypes == argtypes and fn.restype == restype, name
    assert symm.library_path().endswith(".so")


def test_error_codes_match_header():
    from symm import ErrorCode

    codes = header_error_codes()
    assert codes, "no error code found in the header"
    for name, value in codes.items():
        member = "OK" if name == "OK" else name[len("ERR_"):]
        assert ErrorCode[member] == value, name
    assert len(ErrorCode) == len(codes)


def test_enumerations_match_header():
    """symm._codes' IntEnums are the header's enumerations: the dtypes'
    SYMM_DTYPES table (codes and sizes), SYMM_SUM, SYMM_ALL_REDUCE_*,
    SYMM_TORCH_*; and
    the Python names derived from them index the algorithms by code."""
    from symm import _codes
    from symm._collectives import ALL_REDUCE_ALGORITHMS

    text = HEADER.read_text()
    dtypes = {name: (int(code), int(size))
              for name, code, size in re.findall(r"X\(SYMM_(\w+), (\d+), (\d+)\)", text)}
    assert dtypes, "no dtype found in the header's SYMM_DTYPES"
    assert {d.name: (int(d), d.size) for d in _codes.Dtype} == dtypes
    op_enum = re.search(r"enum \{([^}]*\bSYMM_SUM\b[^}]*)\}", text).group(1)  # the reduce operations' enum
    ops = {name: int(v) for name, v in re.findall(r"\bSYMM_(\w+)\s*=\s*(\d+)", op_enum)}
    assert {o.name: int(o) for o in _codes.ReduceOp} == ops
    algorithms = {name: int(v) for name, v in re.findall(r"\bSYMM_ALL_REDUCE_(\w+)\s*=\s*(\d+)", text)}
    assert {a.name: int(a) for a in _codes.AllReduceAlgorithm} == algorithms
    modes = {name: int(v) for name, v in re.findall(r"\bSYMM_TORCH_(\w+)\s*=\s*(\d+)", text)}
    assert {m.name: int(m) for m in _codes.TorchMode} == modes
    assert [ALL_REDUCE_ALGORITHMS.index(a.name.lower()) for a in _codes.AllReduceAlgorithm] == \
        [int(a) for a in _codes.AllReduceAlgorithm]


def test_trace_actions_match_header():
    """The SYMM_TRACE_* actions are PyTorch's names in upper case: symm.trace
    knows each, and the extension's table names each code (the Go side is
    tested in export/codes_test.go)."""
    from symm import trace

    text = HEADER.read_text()
    codes = {name.lower(): int(v) for name, v in re.findall(r"\bSYMM_TRACE_(\w+)\s*=\s*(\d+)", text)}
    assert codes and set(trace.ACTIONS) == set(codes)
    ext = (ROOT / "python" / "symm" / "_torch_ext_snapshot.h").read_text()
    table = re.search(r"trace_action_name\(int32_t a\) \{.*?\{(.*?)\};", ext, flags=re.S).group(1)
    assert re.findall(r'"(\w+)"', table) == sorted(codes, key=codes.get)


def test_hook_functions_have_addresses():
    from symm._loader import function_address

    for name in ("symm_pool_alloc", "symm_pool_free", "symm_torch_init", "symm_pool_empty_cache",
                 "symm_pool_set_memory_fraction", "symm_pool_record_stream"):
        assert function_address(name) > 0


ERROR_WORDS = re.compile(r"SYMM_ERR_|last error|\bNULL\b|-1\b|never fails|cannot fail|no error|throw", re.I)


def documented_functions() -> dict[str, str]:
    """Each C function of the header with the comment that documents it: the
    comment right above its declaration, or above the run of declarations it
    belongs to (put_signal, wait_signal and barrier share one)."""
    text = HEADER.read_text().split('} /* extern "C" */')[0]
    docs: dict[str, str] = {}
    comment, last_kind = "", None
    for block in re.split(r"(/\*.*?\*/)", text, flags=re.S):
        if block.startswith("/*"):
            comment, last_kind = block, "comment"
            continue
        for stmt in block.split(";"):
            if re.search(r"^\s*#|typedef|enum\s*\{|\}", stmt):
                if stmt.strip():
                    comment = comment if last_kind == "decl" else ""
                continue
            m = re.search(r"\b(symm_\w+)\s*\(", stmt)
            if m:
                docs[m.group(1)] = comment
                last_kind = "decl"
            elif stmt.strip():
                comment, last_kind = "", None
    return docs


def test_every_function_states_its_error_returns():
    docs = documented_functions()
    assert set(docs) == header_functions()
    silent = sorted(f for f, c in docs.items() if not ERROR_WORDS.search(c))
    assert not silent, f"functions whose comment says nothing of their errors: {silent}"


def header_prototypes() -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) of every C function of the
    header, as written there (comments dropped, whitespace normalized,
    parameter names removed)."""
    text = HEADER.read_text().split('} /* extern "C" */')[0]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)
    out = {}
    for stmt in text.split(";"):
        s = " ".join(stmt.split())
        if s.startswith("typedef") or "symm_" not in s:
            continue
        m = re.search(r"([\w\s\*]+?)\s*\b(symm_\w+)\s*\(([^()]*)\)$", s)
        if not m:
            continue
        ret, name, params = m.group(1).strip(), m.group(2), m.group(3).strip()
        ret = ret.split("}")[-1].replace('extern "C"', "").strip()
        types = []
        if params and params != "void":
            for p in params.split(","):
                p = p.strip()
                # Drop the parameter's name: the last identifier, unless the whole is a type.
                pm = re.match(r"^(.*?[\s\*])(\w+)$", p)
                types.append(" ".join((pm.group(1) if pm else p).replace("*", " * ").split()))
        out[name] = (" ".join(ret.replace("*", " * ").split()), types)
    return out


def c_to_ctypes(t: str):
    """The ctypes type the binding must use for C type t (as
    header_prototypes writes it): the header's own types, with the
    structs the binding defines by name and the others as void *."""
    import ctypes

    from symm import _loader

    structs = {"symm_stat_t": _loader.Stat, "symm_handle_info_t": _loader.HandleInfo,
               "symm_block_info_t": _loader.BlockInfo}
    scalars = {"int": ctypes.c_int, "size_t": ctypes.c_size_t, "uint64_t": ctypes.c_uint64,
               "int64_t": ctypes.c_int64, "uint32_t": ctypes.c_uint32, "int32_t": ctypes.c_int32,
               "double": ctypes.c_double, "symm_handle_t": ctypes.c_int64, "symm_store_t": ctypes.c_int64,
               "symm_pool_id_t": _loader.PoolId, "symm_segment_hook_fn": ctypes.c_void_p}
    base = t.replace("const ", "").strip()
    if base == "void":
        return None
    if base in ("char *",):
        return ctypes.c_char_p
    if base.endswith("*"):
        inner = base[:-1].strip()
        if inner in ("void", "char") or inner.endswith("*"):
            return ctypes.c_void_p
        if inner in structs:
            return ctypes.POINTER(structs[inner])
        if inner in scalars and scalars[inner] is not ctypes.c_void_p and inner != "symm_pool_id_t":
            return ctypes.POINTER(scalars[inner])
        return ctypes.c_void_p
    assert base in scalars, f"a C type this test does not map: {t!r}"
    return scalars[base]


# Where the binding types a pointer otherwise than the header's type maps
# to, on purpose (a pointer either way, the same in the ABI): (function,
# parameter index) -> the binding's type, and why.
POINTER_CHOICES = {
    ("symm_store_set", 2): ("c_char_p", "the value is Python bytes, passed as they are"),
    ("symm_store_get", 2): ("c_char_p", "the buffer is a ctypes string buffer"),
    ("symm_pool_snapshot_list", 2): ("c_void_p", "the caller passes an array's address"),
}


def test_binding_types_are_the_headers():
    """Each ctypes prototype is the header's: every parameter and the result
    have the ctypes type of the C type the header declares (a binding typed
    from itself would agree with anything), but for the pointers listed in
    POINTER_CHOICES."""
    import ctypes

    from symm._loader import PROTOTYPES

    protos = header_prototypes()
    assert protos.keys() == header_functions(), sorted(protos.keys() ^ header_functions())
    wrong = []
    for name, (ret, params) in sorted(protos.items()):
        argtypes, restype = PROTOTYPES[name]
        want_args = [c_to_ctypes(p) for p in params]
        for i in range(len(want_args)):
            if (name, i) in POINTER_CHOICES:
                assert params[i].endswith("*"), (name, i)
                want_args[i] = getattr(ctypes, POINTER_CHOICES[(name, i)][0])
        want_ret = c_to_ctypes(ret)
        if list(argtypes) != want_args or restype != want_ret:
            wrong.append(f"{name}: header ({ret}; {', '.join(params)}) wants {want_args} -> {want_ret}, "
                         f"the binding has {list(argtypes)} -> {restype}")
    assert not wrong, "\n".join(wrong)
