"""The PyTorch extension's table of libsymm functions (python/symm/
_torch_ext_api.h's SYMM_EXT_API, _torch_ext_ops.h's SYMM_EXT_OPS) names each
function once and takes its type from include/symm.h (decltype): every
symbol it lists is declared in the header, every field the extension calls
is listed, and the two headers compile (g++ -fsyntax-only) against
stand-ins for torch's headers, which torch-free CI has not got: the types,
the macros and the resolution loop, not torch's API (tests/
check_torch_ext.sh compiles the whole extension against real torch)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import HEADER, PYTHON_DIR

PKG = PYTHON_DIR / "symm"
SOURCES = sorted(PKG.glob("_torch_ext*.h")) + [PKG / "_torch_ext.cpp"]


def x_list(path: Path, macro: str) -> dict[str, str]:
    """field -> symbol of the X-macro list macro in path."""
    text = path.read_text()
    m = re.search(rf"#define {macro}\(X\)(.*?)(?<!\\)\n(?!\s*X\()", text, flags=re.S)
    assert m, f"no {macro} list in {path.name}"
    return dict(re.findall(r"X\((\w+), (symm_\w+)", m.group(1)))


def header_symbols() -> set[str]:
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    return set(re.findall(r"\b(symm_\w+)\s*\(", text))


def test_every_listed_function_is_declared_in_the_header():
    api = x_list(PKG / "_torch_ext_api.h", "SYMM_EXT_API")
    ops = x_list(PKG / "_torch_ext_ops.h", "SYMM_EXT_OPS")
    assert len(api) >= 30 and len(ops) == 9, (api, ops)
    missing = sorted((set(api.values()) | set(ops.values())) - header_symbols())
    assert not missing, f"listed but not declared in include/symm.h: {missing}"


def test_no_prototype_is_typed_twice():
    """No hand-typed function pointer to a libsymm function is left, and the
    symbol names are not spelled again at the call sites (SYMM_NEED)."""
    for src in SOURCES:
        text = src.read_text()
        # (The CUDA driver's functions of _torch_ext_cuda_ipc.h, which come
        # from symm_driver_proc, return CUresult and are not libsymm's.)
        hand = re.findall(r"^\s*(?!CUresult)[\w:<>]+[\s*]*\(\*(\w+)\)\([^)]*\)\s*=\s*nullptr", text, flags=re.M)
        assert not hand, f"{src.name} types {hand} by hand"
        assert not re.search(r'\bneed\(g_api\.\w+, "', text), f"{src.name} names a symbol at a call"
        assert not re.search(r'resolve\(h, "symm_', text), f"{src.name} resolves a symbol outside the lists"


def test_every_field_called_is_listed():
    api = x_list(PKG / "_torch_ext_api.h", "SYMM_EXT_API")
    ops = x_list(PKG / "_torch_ext_ops.h", "SYMM_EXT_OPS")
    for src in SOURCES:
        # Without the lists' own macros and the comments.
        text = re.sub(r"^#define(?:.*\\\n)*.*$|//.*$", "", src.read_text(), flags=re.M)
        used_api = set(re.findall(r"\bg_api\.(\w+)", text)) | set(re.findall(r"\bSYMM_NEED\((\w+)\)", text))
        used_ops = set(re.findall(r"\bg_ops\.(\w+)", text)) - {"reduce"}
        assert used_api <= set(api), f"{src.name}: {sorted(used_api - set(api))} not in SYMM_EXT_API"
        assert used_ops <= set(ops), f"{src.name}: {sorted(used_ops - set(ops))} not in SYMM_EXT_OPS"


STUB = r"""
#pragma once
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
struct CUstream_st;
typedef CUstream_st *cudaStream_t;
namespace pybind11 {}
#define TORCH_CHECK(cond, ...) \
  do { if (!(cond)) { [](auto &&...) {}(__VA_ARGS__); throw std::runtime_error("check"); } } while (0)
namespace c10 {
using DeviceIndex = int8_t;
template <class T> using optional = std::optional<T>;
namespace cuda {
using MempoolId_t = std::pair<unsigned long long, unsigned long long>;
namespace CUDACachingAllocator { struct TraceEntry {}; }
struct Stream { cudaStream_t stream() const { return nullptr; } };
inline Stream getCurrentCUDAStream(DeviceIndex) { return {}; }
}  // namespace cuda
namespace CachingAllocator { inline std::string format_size(uint64_t) { return ""; } }
}  // namespace c10
namespace at {
enum class ScalarType { Float, BFloat16, Half };
constexpr ScalarType kFloat = ScalarType::Float, kBFloat16 = ScalarType::BFloat16, kHalf = ScalarType::Half;
struct Device { bool operator==(const Device &) const { return true; } };
struct Tensor {
  bool is_cuda() const { return true; }
  ScalarType scalar_type() const { return kFloat; }
  Device device() const { return {}; }
  bool is_contiguous() const { return true; }
  int64_t numel() const { return 0; }
  void *data_ptr() const { return nullptr; }
  int get_device() const { return 0; }
};
}  // namespace at
struct Library {
  template <class... A> void def(A &&...) {}
  template <class... A> void impl(A &&...) {}
};
#define TORCH_LIBRARY_FRAGMENT(ns, m) [[maybe_unused]] static void frag_##ns(Library &m)
#define TORCH_LIBRARY_IMPL(ns, k, m) [[maybe_unused]] static void impl_##ns##_##k(Library &m)
"""

STUB_HEADERS = [
    "torch/csrc/cuda/CUDAPluggableAllocator.h", "torch/extension.h", "torch/library.h", "c10/core/Allocator.h",
    "c10/cuda/CUDACachingAllocator.h", "c10/cuda/CUDAGuard.h", "c10/cuda/CUDAStream.h", "c10/util/Exception.h",
    "ATen/ATen.h", "cuda.h", "cuda_runtime_api.h",
]

USE = r"""
#include "_torch_ext_api.h"
#include "_torch_ext_ops.h"
int main() {
  load_api("libsymm.so");
  ops_init("libsymm.so");
  uint64_t base = 0, size = 0;
  int expandable = 0;
  check(SYMM_NEED(segment_of)(nullptr, &base, &size, &expandable), "segment_of");
  g_api.begin_pool(0, {1, 2}, [](CUstream_st *) { return true; });
  return static_cast<int>(run_collective(kTwoShot, at::Tensor{}, at::Tensor{}, {}, 0, 0, 1, 0, -1) +
                          run_push(at::Tensor{}, at::Tensor{}, 0, 0, -1) + run_signal(2, 0, 0, 0, 0, 0, -1));
}
"""


def test_tables_compile_against_the_header(tmp_path):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    for h in STUB_HEADERS:
        (tmp_path / h).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / h).write_text('#include "stub.h"\n')
    (tmp_path / "stub.h").write_text(STUB)
    (tmp_path / "use.cpp").write_text(USE)
    r = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}",
                        f"-I{HEADER.parent}", f"-I{PKG}", str(tmp_path / "use.cpp")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
