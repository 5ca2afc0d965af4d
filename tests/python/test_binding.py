"""The ctypes binding against the contract: every function declared in
include/symm.h is typed in symm._loader and exported by the built library,
and the error codes match the header's enum."""

from __future__ import annotations

import re

from conftest import HEADER


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
