"""Symmetric memory from Python on the host backend: real processes, a real
libsymm TCP store, descriptor passing and shared mappings."""

from __future__ import annotations

import json
import textwrap

import pytest

from conftest import child_env, run_python

RANK_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    size = 1 << 16
    p = symm.symm_alloc(size)
    ctypes.memset(p, rank + 1, size)
    h = symm.rendezvous_ptr(p, st, "py", rank, world)
    h.barrier(timeout_ms=20000)
    seen = [ctypes.c_uint8.from_address(h.buffer_ptrs[r]).value for r in range(world)]
    last = [ctypes.c_uint8.from_address(h.buffer_ptrs[r] + size - 1).value for r in range(world)]
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    ctypes.memset(h.buffer_ptrs[nxt] + 8, 200 + rank, 8)
    h.put_signal(nxt, channel=2)
    h.wait_signal(prv, channel=2, timeout_ms=20000)
    got = ctypes.c_uint8.from_address(p + 8).value
    try:
        h.wait_signal(prv, channel=3, timeout_ms=50)
        timeout = None
    except symm.SymmError as e:
        timeout = [int(e.code), str(e)]
    h.barrier(timeout_ms=20000)
    same = symm.rendezvous_ptr(p, st, "py", rank, world).handle == h.handle
    direct = symm.world_within_direct_access_store(st, "py", rank, world) and h.world_within_direct_access()
    symm.symm_free(p)
    try:
        symm.symm_free(p)
        double = None
    except symm.SymmError as e:
        double = int(e.code)
    print(json.dumps({"rank": rank, "seen": seen, "last": last, "got": got, "timeout": timeout,
                      "same": same, "double": double, "multicast": symm.has_multicast_support(),
                      "direct": direct}))
    """
)


def run_ranks(tmp_path, source: str, world: int) -> list:
    """Runs source as world processes (argv: rank, world, store address)
    around a store server; returns each rank's last stdout line as JSON."""
    import subprocess
    import sys

    import symm

    server = symm.Store.server()
    try:
        script = tmp_path / "rank.py"
        script.write_text(source)
        env = child_env({"SYMM_RENDEZVOUS_TIMEOUT": "20s"})
        procs = [subprocess.Popen([sys.executable, str(script), str(r), str(world), server.address], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        server.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    return [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]


def test_four_processes_rendezvous_and_signal(tmp_path):
    for r in run_ranks(tmp_path, RANK_SCRIPT, 4):
        rank = r["rank"]
        assert r["seen"] == [1, 2, 3, 4] and r["last"] == [1, 2, 3, 4], r
        assert r["got"] == 200 + (rank - 1) % 4, "the previous rank wrote into our buffer"
        assert r["timeout"] and r["timeout"][0] == 8 and "rank" in r["timeout"][1], r  # SYMM_ERR_TIMEOUT
        assert r["same"] and r["double"] == 4 and r["multicast"] is False, r
        assert r["direct"] is True, "host memory: every rank reaches every other"


FAKE_LIBS = {
    "nvidia/nccl/lib/libnccl.so.2": "int ncclGetVersion(int *v) { *v = 22809; return 0; }",
    "nvidia/nvshmem/lib/libnvshmem_host.so.3":
        "void nvshmemx_vendor_get_version_info(int *a, int *b, int *c) { *a = 3; *b = 4; *c = 5; }",
    "nvidia/cu13/lib/libnvrtc.so.13": "int nvrtcVersion(int *a, int *b) { *a = 13; *b = 0; return 0; }",
}


def test_topology_finds_libraries_and_reports_no_driver(tmp_path):
    """Without a GPU: a clear no-driver answer that still follows the schema,
    with NCCL and NVSHMEM found (and their versions read) under a
    site-packages-like directory, as pip lays them out."""
    import shutil
    import subprocess

    import symm

    if shutil.which("cc") is None:
        pytest.fail("a C compiler is needed to build the fake libraries")
    for rel, src in FAKE_LIBS.items():
        out = tmp_path / rel
        out.parent.mkdir(parents=True)
        (tmp_path / "src.c").write_text(src)
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(out), str(tmp_path / "src.c")], check=True)
    t = symm.topology(lib_dirs=[str(tmp_path)])
    assert t["schema"] == 1
    assert set(t) == {"schema", "driver", "devices", "links", "libraries", "backends", "kernels"}
    # The fake NVRTC has a version and nothing to compile with: the kernels say so.
    assert t["kernels"]["nvrtc"] == "" and "undefined symbol: nvrtcCreateProgram" in t["kernels"]["error"], t["kernels"]
    libs = {lib["name"]: lib for lib in t["libraries"]}
    assert libs["nccl"]["found"] and libs["nccl"]["version"] == "2.28.9", libs["nccl"]
    assert libs["nvshmem"]["found"] and libs["nvshmem"]["version"] == "3.4.5", libs["nvshmem"]
    assert libs["nvrtc"]["found"] and libs["nvrtc"]["version"] == "13.0", libs["nvrtc"]
    assert libs["nccl"]["path"].startswith(str(tmp_path))
    backends = {b["name"]: b for b in t["backends"]}
    assert backends["host"]["available"]
    assert "3.4.5" in backends["nvshmem"]["reason"]
    if not t["driver"]["found"]:  # CI
        assert t["devices"] == [] and t["links"] == [] and t["kernels"]["devices"] == []
        assert t["driver"]["error"]
        assert not backends["cuda"]["available"] and backends["cuda"]["reason"] == "no NVIDIA driver found"


def test_store_round_trip_and_errors():
    import symm

    server = symm.Store.server()
    try:
        client = symm.Store.connect(server.address, timeout_ms=5000)
        client.set("k", b"v" * 5000)
        assert server.get("k", timeout_ms=1000) == b"v" * 5000
        assert client.add("n", 3) == 3 and server.add("n", -1) == 2
        with pytest.raises(symm.SymmError) as e:
            client.get("never", timeout_ms=50)
        assert e.value.code == 8 and "never" in str(e.value)
        client.close()
        with pytest.raises(symm.SymmError):
            client.set("k", b"x")  # closed handle
    finally:
        server.close()


def test_store_connect_refuses_a_malformed_address_at_once():
    import time

    import symm

    t0 = time.monotonic()
    with pytest.raises(symm.SymmError) as e:
        symm.Store.connect("not-an-address")  # the default timeout is a minute
    assert time.monotonic() - t0 < 5
    assert e.value.code == symm.ErrorCode.INVALID and "not-an-address" in str(e.value) and "host:port" in str(e.value)


def test_bad_symmetric_input():
    import symm

    with pytest.raises(symm.SymmError) as e:
        symm.symm_free(0xDEAD000)
    assert e.value.code == 4
    p = symm.symm_alloc(4096)
    try:
        st = symm.Store.server()
        with pytest.raises(symm.SymmError) as e:
            symm.rendezvous_ptr(p, st, "bad", 3, 2)  # rank >= world
        assert e.value.code == 1 and "rank" in str(e.value)
        st.close()
    finally:
        symm.symm_free(p)


NVSHMEM_CHILD = textwrap.dedent(
    """
    import json, sys, symm
    name = sys.argv[1] if len(sys.argv) > 1 else "nvshmem"
    out = {"available": symm.is_nvshmem_available() if name == "nvshmem" else symm.is_nccl_available()}
    try:
        symm.set_backend(name)
        out["backend"] = symm.get_backend()
        symm.symm_alloc(1 << 20)
        out["alloc"] = "succeeded"
    except symm.SymmError as e:
        out["alloc"] = [int(e.code), str(e)]
    try:
        symm.set_backend("tpu")
    except symm.SymmError as e:
        out["bad_name"] = [int(e.code), str(e)]
    print(json.dumps(out))
    """
)


def _nvshmem_child(tmp_path, lib_path, backend="nvshmem"):
    var = "SYMM_NVSHMEM_LIB" if backend == "nvshmem" else "SYMM_NCCL_LIB"
    env = child_env({var: str(lib_path)})
    env.pop("SYMM_DEVICE", None)  # these backends need GPUs: the error must be about the library, not the device
    proc = run_python(NVSHMEM_CHILD, backend, env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_nvshmem_missing_library_is_a_clear_error(tmp_path):
    r = _nvshmem_child(tmp_path, tmp_path / "nowhere" / "libnvshmem_host.so.3")
    assert r["available"] is False
    assert r["backend"] == "nvshmem"
    code, msg = r["alloc"]
    assert code == 3 and "libnvshmem_host.so.3 not found" in msg and "SYMM_NVSHMEM_LIB" in msg, msg
    assert r["bad_name"][0] == 1 and "tpu" in r["bad_name"][1]


@pytest.mark.parametrize("version,symbols,want", [
    ((2, 11, 0), True, "NVSHMEM 2.11.0 at"),
    ((3, 4, 5), False, "lacks nvshmemx_get_uniqueid"),
])
def test_nvshmem_unsupported_library_is_a_clear_error(tmp_path, version, symbols, want):
    import shutil
    import subprocess

    if shutil.which("cc") is None:
        pytest.fail("a C compiler is needed to build the fake library")
    src = ("void nvshmemx_vendor_get_version_info(int *a, int *b, int *c) { *a = %d; *b = %d; *c = %d; }\n" % version)
    if symbols:
        for fn in ["nvshmemx_get_uniqueid", "nvshmemx_set_attr_uniqueid_args", "nvshmemx_hostlib_init_attr",
                   "nvshmemx_hostlib_finalize", "nvshmemx_init_status", "nvshmem_my_pe", "nvshmem_n_pes",
                   "nvshmem_malloc", "nvshmem_align", "nvshmem_free", "nvshmem_ptr"]:
            src += "int %s(void) { return 0; }\n" % fn
    (tmp_path / "fake.c").write_text(src)
    lib = tmp_path / "libnvshmem_host.so.3"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    r = _nvshmem_child(tmp_path, lib)
    assert r["available"] is False
    code, msg = r["alloc"]
    assert code == 3 and want in msg, msg
    if version[0] != 3:
        assert "not supported" in msg and "3.x" in msg


def test_nccl_missing_library_is_a_clear_error(tmp_path):
    r = _nvshmem_child(tmp_path, tmp_path / "nowhere" / "libnccl.so.2", backend="nccl")
    assert r["available"] is False and r["backend"] == "nccl"
    code, msg = r["alloc"]
    assert code == 3 and "libnccl.so.2 not found" in msg and "SYMM_NCCL_LIB" in msg, msg


@pytest.mark.parametrize("code_,want", [
    (22600, "NCCL 2.26.0 at"),   # memory, no windows
    (2708, "NCCL 2.7.8 at"),     # the old version encoding
])
def test_nccl_too_old_is_a_clear_error(tmp_path, code_, want):
    import shutil
    import subprocess

    if shutil.which("cc") is None:
        pytest.fail("a C compiler is needed to build the fake library")
    (tmp_path / "fake.c").write_text("int ncclGetVersion(int *v) { *v = %d; return 0; }\n" % code_)
    lib = tmp_path / "libnccl.so.2"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "fake.c")], check=True)
    r = _nvshmem_child(tmp_path, lib, backend="nccl")
    assert r["available"] is False
    code, msg = r["alloc"]
    assert code == 3 and want in msg and "2.27 or later" in msg, msg


RECYCLE_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    out = {"rank": rank, "dirty": [], "clean": [], "barrier": []}
    for cycle in range(3):
        p = symm.symm_alloc(4096)
        h = symm.rendezvous_ptr(p, st, "recycle", rank, world)
        pads = [bytes((ctypes.c_uint8 * h.signal_pad_size).from_address(h.signal_pad_ptrs[r])) for r in range(world)]
        out["clean"].append(all(not any(b) for b in pads))
        st.set(f"read/{cycle}/{rank}", b"1")
        for r in range(world):
            st.get(f"read/{cycle}/{r}", timeout_ms=20000)  # nobody signals before everyone has looked
        try:
            h.barrier(timeout_ms=5000)
            out["barrier"].append(True)
        except symm.SymmError as e:
            out["barrier"].append(str(e))
        # Leave our pad dirty (42 in every slot), as the hanging sequence did.
        ctypes.memset(h.signal_pad_ptrs[rank], 42, h.signal_pad_size)
        out["dirty"].append(ctypes.c_uint8.from_address(h.signal_pad_ptrs[rank]).value)
        st.set(f"freed/{cycle}/{rank}", b"1")
        for r in range(world):
            st.get(f"freed/{cycle}/{r}", timeout_ms=20000)  # every rank has dirtied before anyone frees
        symm.symm_free(p)
    print(json.dumps(out))
    """
)


def test_recycled_block_has_a_zero_signal_pad(tmp_path):
    """A block freed with a dirty signal pad and allocated again starts with a
    zero pad on every rank before its rendezvous returns, and its barrier
    returns (the sequence that hung for ever before issue 12)."""
    import subprocess
    import sys

    import symm

    server = symm.Store.server()
    try:
        script = tmp_path / "recycle.py"
        script.write_text(RECYCLE_SCRIPT)
        env = child_env({"SYMM_TIMEOUT_MS": "20000"})
        procs = [subprocess.Popen([sys.executable, str(script), str(r), "2", server.address], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        server.close()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    for r in (json.loads(o.strip().splitlines()[-1]) for o, _ in outs):
        assert r["dirty"] == [42, 42, 42], r
        assert r["clean"] == [True, True, True], f"a recycled block's pad was not zero: {r}"
        assert r["barrier"] == [True, True, True], r


ALLREDUCE_SCRIPT = textwrap.dedent(
    """
    import array, ctypes, json, struct, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    n = 3000
    p = symm.symm_alloc(4 * n + 64)
    h = symm.rendezvous_ptr(p, st, "ar", rank, world)
    vals = array.array("f", [(i % 17) * 0.25 + rank for i in range(n)])
    ctypes.memmove(p, vals.buffer_info()[0], 4 * n)
    out = array.array("f", [0.0]) * n
    h.one_shot_all_reduce_ptr(0, n, "float32", out.buffer_info()[0], timeout_ms=20000)
    f32_ok = all(out[i] == sum((i % 17) * 0.25 + r for r in range(world)) for i in range(n))
    # bfloat16 from a local input: values k/8 for small k are exact in bf16.
    bf = array.array("H", [struct.unpack("<I", struct.pack("<f", (i % 9) / 8 + rank))[0] >> 16 for i in range(n)])
    out16 = array.array("H", [0]) * n
    h.one_shot_all_reduce_ptr(0, n, "bfloat16", out16.buffer_info()[0], local_input=bf.buffer_info()[0],
                              timeout_ms=20000)
    got = [struct.unpack("<f", struct.pack("<I", w << 16))[0] for w in out16]
    bf_ok = all(got[i] == sum((i % 9) / 8 + r for r in range(world)) for i in range(n))
    errors = {}
    for name, kw in {"dtype": dict(dtype="float64"), "op": dict(op="max")}.items():
        try:
            h.one_shot_all_reduce_ptr(0, 16, **{"dtype": "float32", "out": out.buffer_info()[0], **kw})
        except ValueError as e:
            errors[name] = str(e)
    try:
        h.one_shot_all_reduce_ptr(2, 16, "float32", out.buffer_info()[0])
    except symm.SymmError as e:
        errors["offset"] = [int(e.code), str(e)]
    ready = symm.kernels_ready(0)
    print(json.dumps({"f32": f32_ok, "bf16": bf_ok, "errors": errors, "ready": ready,
                      "why": symm.kernels_status(0)}))
    h.barrier(timeout_ms=20000)
    symm.symm_free(p)
    """
)


def test_one_shot_all_reduce_three_processes(tmp_path):
    for r in run_ranks(tmp_path, ALLREDUCE_SCRIPT, 3):
        assert r["f32"] and r["bf16"], r
        assert "dtype" in r["errors"]["dtype"] and "sum" in r["errors"]["op"], r
        assert r["errors"]["offset"][0] == 1 and "multiples of 4" in r["errors"]["offset"][1], r  # SYMM_ERR_INVALID
        assert r["ready"] is False and "host backend has no device kernels" in r["why"], r


def test_one_shot_all_reduce_refuses_out_shifted_against_local_input():
    """An out that overlaps local_input at a shift (one block of the kernel
    would overwrite input another has not copied yet) is SymmError(INVALID)
    naming the shift, and writes nothing; the same buffer (in place) works."""
    import array
    import ctypes

    import symm

    n = 16
    p = symm.symm_alloc(4096)
    st = symm.Store.server()
    try:
        h = symm.rendezvous_ptr(p, st, "ar-shift", 0, 1)
        ctypes.memset(p, 0, 4 * n)
        buf = array.array("f", [i * 0.5 for i in range(3 * n)])
        want = buf.tolist()
        base = buf.buffer_info()[0]
        cases = ((base + 4, base, "+4"), (base, base + 60, "-60"), (base + 4 * (2 * n - 1), base + 4 * n, "+60"))
        for out, local, shift in cases:
            with pytest.raises(symm.SymmError) as e:
                h.one_shot_all_reduce_ptr(0, n, "float32", out, local_input=local, timeout_ms=1000)
            assert e.value.code == symm.ErrorCode.INVALID, e.value
            says = f"the output {out:#x} overlaps local_input {local:#x} (64 bytes each) at a shift of {shift} bytes"
            assert says in str(e.value), e.value
            assert buf.tolist() == want, "nothing written"
            assert ctypes.string_at(p, 4 * n) == bytes(4 * n), "nothing copied in"
        h.one_shot_all_reduce_ptr(0, n, "float32", base + 4 * n, local_input=base + 4 * n, timeout_ms=1000)
        assert buf.tolist() == want, "in place: a world of one sums to its local input"
        assert ctypes.string_at(p, 4 * n) == bytes(buf[n:2 * n]), "local_input copied in"
        h.one_shot_all_reduce_ptr(0, n, "float32", base, local_input=base + 4 * n, timeout_ms=1000)
        assert buf[:n] == buf[n:2 * n], "disjoint neighbours"
    finally:
        st.close()
        symm.symm_free(p)


PUSH_SCRIPT = textwrap.dedent(
    """
    import array, json, struct, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    limit = 4096
    size = symm.push_all_reduce_workspace_size(world, limit)
    p = symm.symm_alloc(size)
    h = symm.rendezvous_ptr(p, st, "push", rank, world)
    at = lambda a: a.buffer_info()[0]
    res = {"size": size, "limit": h.push_max_bytes, "ready": symm.kernels_ready(0)}
    # float32, 50 calls of changing sizes and inputs (the halves alternate)
    ok = True
    for k in range(50):
        n = 1 + (k * 37) % 1024
        val = lambda r, i: ((i * 7 + k * 3 + r) % 23 - 11) / 4
        x = array.array("f", [val(rank, i) for i in range(n)])
        out = array.array("f", [0.0]) * n
        h.push_all_reduce_ptr(at(x), at(out), n, "float32", timeout_ms=20000)
        ok &= list(out) == [sum(val(r, i) for r in range(world)) for i in range(n)]
    res["f32"] = ok
    # bfloat16 in place, an odd count (2002 bytes: not a multiple of 4 or 8)
    n = 1001
    bf16 = lambda f: struct.unpack("<I", struct.pack("<f", f))[0] >> 16
    x = array.array("H", [bf16((i % 9) / 8 + rank) for i in range(n)])
    h.push_all_reduce_ptr(at(x), at(x), n, "bfloat16", timeout_ms=20000)
    got = [struct.unpack("<f", struct.pack("<I", w << 16))[0] for w in x]
    res["bf16"] = all(got[i] == sum((i % 9) / 8 + r for r in range(world)) for i in range(n))
    # float16, out one element into a larger array (2-byte aligned only)
    x = array.array("H", struct.unpack(f"<{n}H", struct.pack(f"<{n}e", *[(i % 5) / 4 - rank for i in range(n)])))
    out = array.array("H", [0]) * (n + 1)
    h.push_all_reduce_ptr(at(x), at(out) + 2, n, "float16", timeout_ms=20000)
    got = struct.unpack(f"<{n}e", out[1:].tobytes())
    res["f16"] = out[0] == 0 and all(got[i] == sum((i % 5) / 4 - r for r in range(world)) for i in range(n))
    errors = {}
    for name, kw in {"dtype": dict(dtype="float64"), "op": dict(op="max")}.items():
        try:
            h.push_all_reduce_ptr(at(x), at(out), 16, **{"dtype": "float32", **kw})
        except ValueError as e:
            errors[name] = str(e)
    big = array.array("f", [0.0]) * 1025
    for name, args in {"limit": (at(big), at(big), 1025, "float32"), "null": (0, at(out), 16, "float32"),
                       "aligned": (at(big) + 2, at(out), 16, "float32")}.items():
        try:
            h.push_all_reduce_ptr(*args)
        except symm.SymmError as e:
            errors[name] = [int(e.code), str(e)]
    try:
        symm.push_all_reduce_workspace_size(0, 8)
    except symm.SymmError as e:
        errors["size"] = [int(e.code), str(e)]
    res["errors"] = errors
    # A rank that stays away from a call: the others time out naming it.
    p2 = symm.symm_alloc(size)
    h2 = symm.rendezvous_ptr(p2, st, "push-late", rank, world)
    h2.push_all_reduce_ptr(at(big), at(big), 16, "float32", timeout_ms=20000)
    if rank != world - 1:
        try:
            h2.push_all_reduce_ptr(at(big), at(big), 16, "float32", timeout_ms=300)
        except symm.SymmError as e:
            res["timeout"] = [int(e.code), str(e)]
    h.barrier(channel=1, timeout_ms=20000)
    symm.symm_free(p)
    print(json.dumps(res))
    """
)


def test_push_all_reduce_three_processes(tmp_path):
    """The push all-reduce on the host backend from Python: exact sums of
    float32 (50 calls), bfloat16 in place at an odd size, float16 into a
    2-byte-aligned output; each bad argument a clear error (over the limit
    names it); a rank that stays away is named in the others' timeout."""
    for rank, r in enumerate(run_ranks(tmp_path, PUSH_SCRIPT, 3)):
        assert r["size"] == 3 * 4 * 4096 and r["limit"] == 4096 and r["ready"] is False, r
        assert r["f32"] and r["bf16"] and r["f16"], r
        e = r["errors"]
        assert "float16" in e["dtype"] and "sum" in e["op"], e
        assert e["limit"][0] == 1 and "4100 bytes (1025 float32) exceed the workspace's limit of 4096 bytes" in e["limit"][1], e
        assert e["null"][0] == 1 and "NULL" in e["null"][1], e
        assert e["aligned"][0] == 1 and "aligned to the 4-byte float32 element" in e["aligned"][1], e
        assert e["size"][0] == 1 and "workspace for 0 ranks" in e["size"][1], e
        if rank != 2:
            assert r["timeout"][0] == 8 and "rank 2's data for push all-reduce call" in r["timeout"][1], r


TWO_SHOT_SCRIPT = textwrap.dedent(
    """
    import array, ctypes, json, struct, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    n = 3001
    p = symm.symm_alloc(4 * n + 64)
    h = symm.rendezvous_ptr(p, st, "two", rank, world)
    vals = array.array("f", [(i % 17) * 0.25 + rank for i in range(n)])
    want = [sum((i % 17) * 0.25 + r for r in range(world)) for i in range(n)]
    # In place: the sum lands in every rank's buffer.
    ctypes.memmove(p, vals.buffer_info()[0], 4 * n)
    h.two_shot_all_reduce_ptr(0, n, "float32", timeout_ms=20000)
    mine = array.array("f", ctypes.string_at(p, 4 * n))
    in_place = list(mine) == want
    # Out of place, at an offset of 4 bytes (n - 1 elements): out and the buffer.
    ctypes.memmove(p, vals.buffer_info()[0], 4 * n)
    out = array.array("f", [0.0]) * n
    h.two_shot_all_reduce_ptr(4, n - 1, "float32", out.buffer_info()[0], timeout_ms=20000)
    mine = array.array("f", ctypes.string_at(p + 4, 4 * (n - 1)))
    out_ok = list(out[:n - 1]) == want[1:] and out[n - 1] == 0.0 and list(mine) == want[1:]
    # bfloat16 from a local input, out being the local input (in place there).
    bf = array.array("H", [struct.unpack("<I", struct.pack("<f", (i % 9) / 8 + rank))[0] >> 16 for i in range(n + 1)])
    h.two_shot_all_reduce_ptr(0, n + 1, "bfloat16", bf.buffer_info()[0], local_input=bf.buffer_info()[0],
                              timeout_ms=20000)
    got = [struct.unpack("<f", struct.pack("<I", w << 16))[0] for w in bf]
    bf_ok = all(got[i] == sum((i % 9) / 8 + r for r in range(world)) for i in range(n + 1))
    errors = {}
    for name, kw in {"dtype": dict(dtype="float64"), "op": dict(op="max")}.items():
        try:
            h.two_shot_all_reduce_ptr(0, 16, **{"dtype": "float32", **kw})
        except ValueError as e:
            errors[name] = str(e)
    for name, args in {"offset": (2, 16, "float32"), "overlap": (0, 16, "float32", p + 4)}.items():
        try:
            h.two_shot_all_reduce_ptr(*args)
        except symm.SymmError as e:
            errors[name] = [int(e.code), str(e)]
    print(json.dumps({"in_place": in_place, "out": out_ok, "bf16": bf_ok, "errors": errors}))
    h.barrier(timeout_ms=20000)
    symm.symm_free(p)
    """
)


def test_two_shot_all_reduce_three_processes(tmp_path):
    """The two-shot all-reduce over real processes on the host backend: in
    place (the sum in every rank's buffer), out of place at an offset (out
    and the buffer), bfloat16 from a local input in place; bad arguments
    refused."""
    for r in run_ranks(tmp_path, TWO_SHOT_SCRIPT, 3):
        assert r["in_place"] and r["out"] and r["bf16"], r
        assert "two_shot_all_reduce: dtype" in r["errors"]["dtype"] and "sum" in r["errors"]["op"], r
        assert r["errors"]["offset"][0] == 1 and "multiples of 4" in r["errors"]["offset"][1], r  # SYMM_ERR_INVALID
        assert r["errors"]["overlap"][0] == 1 and "overlaps this rank's buffer" in r["errors"]["overlap"][1], r


CHOICE_SCRIPT = textwrap.dedent(
    """
    import json, symm
    res = {}
    for world in (1, 2, 3, 4, 8):
        res[world] = {n: symm.all_reduce_algorithm(world, n) for n in (4096, 131072, 131076, 262144, 524288, 1048576, 4194304)}
    res["small_ws"] = symm.all_reduce_algorithm(2, 65536, push_max_bytes=32768)
    res["forced"] = [symm.all_reduce_algorithm(4, 4096, algorithm=a) for a in (None, "auto", "push", "two_shot", "one_shot")]
    errors = {}
    for name, kw in {"over": dict(nbytes=2 << 20, algorithm="push"), "world": dict(world_size=0),
                     "name": dict(algorithm="two-shot")}.items():
        try:
            symm.all_reduce_algorithm(**{"world_size": 4, "nbytes": 4096, **kw})
        except (symm.SymmError, ValueError) as e:
            errors[name] = [type(e).__name__, str(e)]
    res["errors"] = errors
    print(json.dumps(res))
    """
)


def test_all_reduce_algorithm():
    """The all-reduce's choice through the C library (symm_all_reduce_algorithm):
    the measured crossovers (push up to 1 MiB on 2 ranks, 256 KiB on 3,
    128 KiB on 4 and beyond), the workspace's limit, a forced algorithm,
    and each bad argument refused by name."""
    from conftest import run_json

    r = run_json(CHOICE_SCRIPT, env=child_env(unset=("SYMM_ALL_REDUCE",)))
    for world, cross in {"1": 1048576, "2": 1048576, "3": 262144, "4": 131072, "8": 131072}.items():
        for n, alg in r[world].items():
            assert alg == ("push" if int(n) <= cross else "two_shot"), (world, n, alg)
    assert r["small_ws"] == "two_shot"
    assert r["forced"] == ["push", "push", "push", "two_shot", "one_shot"]
    e = r["errors"]
    assert e["over"][0] == "SymmError" and "over the push workspace's limit of 1048576 bytes" in e["over"][1], e
    assert e["world"][0] == "SymmError" and "all-reduce over 0 ranks" in e["world"][1], e
    assert e["name"] == ["ValueError", "all_reduce: algorithm 'two-shot': want None, 'auto', 'push', 'two_shot' or "
                                       "'one_shot'"], e


def test_all_reduce_env():
    """SYMM_ALL_REDUCE forces the algorithm at every size (a caller's choice
    still wins); another word is refused, naming the variable."""
    code = ("import json, symm\n"
            "try:\n"
            "    print(json.dumps([symm.all_reduce_algorithm(4, n) for n in (4096, 4 << 20)]\n"
            "                     + [symm.all_reduce_algorithm(4, 4096, algorithm='push')]))\n"
            "except symm.SymmError as e:\n"
            "    print(json.dumps([int(e.code), str(e)]))\n")
    from conftest import run_json

    assert run_json(code, env=child_env({"SYMM_ALL_REDUCE": "two_shot"})) == ["two_shot", "two_shot", "push"]
    assert run_json(code, env=child_env({"SYMM_ALL_REDUCE": "auto"})) == ["push", "two_shot", "push"]
    code_, says = run_json(code, env=child_env({"SYMM_ALL_REDUCE": "fastest"}))
    assert code_ == 1 and 'SYMM_ALL_REDUCE="fastest": want auto, push, two_shot or one_shot' in says, says
    code_, says = run_json(code, env=child_env({"SYMM_ALL_REDUCE": "push", "SYMM_PUSH_MAX_BYTES": "65536"}))
    assert code_ == 1 and "(forced by SYMM_ALL_REDUCE=push) of 4194304 bytes: over the push workspace's limit of " \
        "65536 bytes" in says, says



def test_push_max_bytes_is_the_librarys():
    """SYMM_PUSH_MAX_BYTES is parsed by the library, at each call (a value
    set after it loaded is seen), rounded up to 8; a bad value is refused
    naming the variable, and the choice of algorithm uses the same limit."""
    code = ("import json, os, symm\n"
            "from symm._collectives import _push_max_bytes_setting as get\n"
            "out = [get()]\n"
            "os.environ['SYMM_PUSH_MAX_BYTES'] = '100'\n"
            "out += [get(), symm.all_reduce_algorithm(2, 104), symm.all_reduce_algorithm(2, 112)]\n"
            "os.environ['SYMM_PUSH_MAX_BYTES'] = '1M'\n"
            "try:\n"
            "    get()\n"
            "except symm.SymmError as e:\n"
            "    out.append([int(e.code), str(e)])\n"
            "print(json.dumps(out))\n")
    from conftest import run_json

    got = run_json(code, env=child_env(unset=("SYMM_PUSH_MAX_BYTES", "SYMM_ALL_REDUCE")))
    assert got[:4] == [1 << 20, 104, "push", "two_shot"], got
    assert got[4][0] == int(__import__("symm").ErrorCode.INVALID), got
    assert 'SYMM_PUSH_MAX_BYTES="1M": want a positive number of bytes' in got[4][1], got


RS_AG_SCRIPT = textwrap.dedent(
    """
    import array, ctypes, json, sys, symm
    rank, world, addr = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    st = symm.Store.connect(addr, timeout_ms=20000)
    n = 1001  # float32 per rank
    p = symm.symm_alloc(4 * world * n + 64)
    h = symm.rendezvous_ptr(p, st, "rsag", rank, world)
    val = lambda r, i: (i % 13) * 0.5 + r
    # All-gather in place: share rank is the input, every share comes back.
    mine = array.array("f", [val(rank, i) for i in range(n)])
    ctypes.memmove(p + 4 * rank * n, mine.buffer_info()[0], 4 * n)
    h.all_gather_ptr(0, n, "float32", timeout_ms=20000)
    got = array.array("f", ctypes.string_at(p, 4 * world * n))
    ag_ok = list(got) == [val(s, i) for s in range(world) for i in range(n)]
    # All-gather of float16 bits from a local input into out, at an offset.
    loc = array.array("H", [(rank << 8) | (i & 0xff) for i in range(2 * n)])
    out = array.array("H", [0]) * (2 * world * n + 2)
    h.all_gather_ptr(4, 2 * n, "float16", out.buffer_info()[0], local_input=loc.buffer_info()[0], timeout_ms=20000)
    f16_ok = list(out[:2 * world * n]) == [(s << 8) | (i & 0xff) for s in range(world) for i in range(2 * n)]
    f16_ok = f16_ok and out[2 * world * n] == 0
    # Reduce-scatter: share rank of the rank-order sum, in place and into out.
    full = array.array("f", [val(rank, i) for i in range(world * n)])
    want = [sum(val(r, rank * n + i) for r in range(world)) for i in range(n)]
    ctypes.memmove(p, full.buffer_info()[0], 4 * world * n)
    h.reduce_scatter_ptr(0, n, "float32", timeout_ms=20000)
    rs_in_place = list(array.array("f", ctypes.string_at(p + 4 * rank * n, 4 * n))) == want
    o = array.array("f", [0.0]) * (n + 1)
    h.reduce_scatter_ptr(0, n, "float32", o.buffer_info()[0], local_input=full.buffer_info()[0], timeout_ms=20000)
    rs_out = list(o[:n]) == want and o[n] == 0.0
    errors = {}
    for name, call in {"rs dtype": lambda: h.reduce_scatter_ptr(0, 16, "int8"),
                       "rs op": lambda: h.reduce_scatter_ptr(0, 16, "float32", op="max"),
                       "ag dtype": lambda: h.all_gather_ptr(0, 16, "int8")}.items():
        try:
            call()
        except ValueError as e:
            errors[name] = str(e)
    for name, call in {"size": lambda: h.all_gather_ptr(0, 3, "bfloat16", o.buffer_info()[0]),
                       "overlap": lambda: h.reduce_scatter_ptr(0, 16, "float32", p + 4)}.items():
        try:
            call()
        except symm.SymmError as e:
            errors[name] = [int(e.code), str(e)]
    print(json.dumps({"ag": ag_ok, "f16": f16_ok, "rs_in_place": rs_in_place, "rs_out": rs_out, "errors": errors}))
    h.barrier(timeout_ms=20000)
    symm.symm_free(p)
    """
)


def test_reduce_scatter_all_gather_three_processes(tmp_path):
    """Reduce-scatter and all-gather over real processes on the host backend:
    all-gather in place and from a local input into out (float16 bits, at an
    offset), reduce-scatter in place and from a local input into out; bad
    arguments refused."""
    for r in run_ranks(tmp_path, RS_AG_SCRIPT, 3):
        assert r["ag"] and r["f16"] and r["rs_in_place"] and r["rs_out"], r
        e = r["errors"]
        assert "reduce_scatter: dtype" in e["rs dtype"] and "sum" in e["rs op"] and "all_gather: dtype" in e["ag dtype"], r
        assert e["size"][0] == 1 and "multiples of 4" in e["size"][1], r  # SYMM_ERR_INVALID
        assert e["overlap"][0] == 1 and "overlaps this rank's buffer" in e["overlap"][1], r


def test_nccl_adopt_setting(monkeypatch):
    """SYMM_NCCL_ADOPT: unset and 1 adopt PyTorch's communicator, 0 does not,
    anything else is refused naming the variable (never read as 0)."""
    from symm import _backends
    from symm._errors import ErrorCode, SymmError

    monkeypatch.delenv("SYMM_NCCL_ADOPT", raising=False)
    assert _backends._nccl_adopt_wanted() is True
    for value, wanted in (("1", True), ("0", False)):
        monkeypatch.setenv("SYMM_NCCL_ADOPT", value)
        assert _backends._nccl_adopt_wanted() is wanted
    for value in ("yes", "true", " 1", "2"):
        monkeypatch.setenv("SYMM_NCCL_ADOPT", value)
        with pytest.raises(SymmError) as e:
            _backends._nccl_adopt_wanted()
        assert e.value.code == ErrorCode.INVALID
        assert f"SYMM_NCCL_ADOPT={value!r}: want 1 or 0" in str(e.value)
