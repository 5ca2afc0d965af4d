"""symm.fused_all_gather_matmul and symm.fused_matmul_reduce_scatter without
torch or a GPU: the shape plans (PyTorch's results and layouts), the order in
which a rank serves its peers, the workspace's sizes, and every argument
check with its message, the tensor checks over stand-in tensors. The
operators themselves run on GPUs (tests/device/symm_fused.py)."""

from __future__ import annotations

import importlib.util
import types

import pytest

from symm import _fused, _torch_ops
from symm._fused import (
    all_gather_matmul_plan,
    check_all_gather_matmul_args,
    check_dim,
    check_group_name,
    check_int,
    check_matmul_reduce_scatter_args,
    matmul_reduce_scatter_plan,
    peer_order,
    workspace_bytes,
)

AG = "fused_all_gather_matmul"
RS = "fused_matmul_reduce_scatter"


# ---- peers and workspace ---------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_peer_order_serves_every_peer_once_and_no_two_ranks_meet_one_peer(world):
    orders = [peer_order(r, world) for r in range(world)]
    for r, order in enumerate(orders):
        assert sorted(order) == [p for p in range(world) if p != r]
        assert order[:1] == ([(r + 1) % world] if world > 1 else [])
    for step in range(world - 1):  # at each step the ranks' peers are a permutation
        assert sorted(o[step] for o in orders) == list(range(world))


def test_peer_order_examples():
    assert peer_order(0, 4) == [1, 2, 3]
    assert peer_order(2, 4) == [3, 0, 1]
    assert peer_order(0, 1) == []


@pytest.mark.parametrize("nbytes,want", [(0, 1 << 20), (1, 1 << 20), (1 << 20, 1 << 20), ((1 << 20) + 1, 2 << 20),
                                         (48 << 20, 64 << 20), (64 << 20, 64 << 20)])
def test_workspace_bytes_is_a_power_of_two_of_at_least_one_mib(nbytes, want):
    assert workspace_bytes(nbytes) == want


# ---- all-gather-matmul plans -------------------------------------------------------


def test_plan_gather_dim_0_of_a_matrix():
    p = all_gather_matmul_plan((256, 64), [(64, 32), (64, 8)], 0, 4)
    assert (p.gather_dim, p.last, p.rows, p.cols) == (0, False, 256, 64)
    assert p.A_shape == (1024, 64)
    assert p.out_shapes == ((1024, 32), (1024, 8))
    assert p.shard_numel == 256 * 64


def test_plan_gather_dim_1_of_a_matrix_shards_k():
    # Gathering along A's last dim: A_shard holds K/world columns and B all K rows.
    p = all_gather_matmul_plan((100, 16), [(64, 24)], 1, 4)
    assert (p.last, p.rows, p.cols) == (True, 100, 16)
    assert p.A_shape == (100, 64)
    assert p.out_shapes == ((100, 24),)


@pytest.mark.parametrize("g,shard,A", [(0, (2, 64, 32), (8, 64, 32)), (1, (8, 16, 32), (8, 64, 32)),
                                       (2, (8, 64, 8), (8, 64, 32))])
def test_plan_batched_shards_as_pytorch_tests_them(g, shard, A):
    # PyTorch's test: BATCH=8, M=64, K=32, N=16, the gather dim divided by the world.
    p = all_gather_matmul_plan(shard, [(32, 16)] * 3, g, 4)
    assert p.A_shape == A
    assert p.out_shapes == (A[:-1] + (16,),) * 3
    assert p.last == (g == 2)


def test_plan_no_bs():
    p = all_gather_matmul_plan((3, 5), [], 0, 2)
    assert p.out_shapes == () and p.A_shape == (6, 5)


def test_plan_world_1():
    assert all_gather_matmul_plan((7, 5), [(5, 3)], 1, 1).out_shapes == ((7, 3),)


@pytest.mark.parametrize("shard,bs,g,world,exc,words", [
    ((64,), [(64, 8)], 0, 2, ValueError, "A_shard must have at least 2 dims"),
    ((4, 8), [(8, 2)], 2, 2, ValueError, "gather_dim=2 is not a dimension of A_shard of shape [4, 8]: want 0 .. 1"),
    ((4, 8), [(8, 2)], -1, 2, ValueError, "negative dims are refused"),
    ((4, 8), [(8, 2)], True, 2, TypeError, "gather_dim must be an int, not bool"),
    ((4, 8), [(8, 2)], 0.0, 2, TypeError, "gather_dim must be an int, not float"),
    ((4, 8), [(8, 2)], "0", 2, TypeError, "gather_dim must be an int, not str"),
    ((4, 8), [(8, 2), (8, 2, 1)], 0, 2, ValueError, "Bs[1] must be a matrix (2 dims), got shape [8, 2, 1]"),
    ((4, 8), [(9, 2)], 0, 2, ValueError, "Bs[0] has 9 rows and A_shard's last dim is 8"),
    ((4, 8), [(8, 2)], 1, 2, ValueError, "gives A 16 columns, so A @ Bs[0] needs 16 rows"),
    ((4, 8), [(8, 2)], 0, 0, ValueError, "the group has 0 ranks"),
])
def test_plan_refusals_name_the_argument(shard, bs, g, world, exc, words):
    with pytest.raises(exc) as e:
        all_gather_matmul_plan(shard, bs, g, world)
    assert str(e.value).startswith(AG + ": ")
    assert words in str(e.value)


# ---- matmul-reduce-scatter plans ---------------------------------------------------


def test_rs_plan_scatter_dim_0():
    p = matmul_reduce_scatter_plan((1024, 64), (64, 48), "sum", 0, 4)
    assert (p.scatter_dim, p.last, p.chunk, p.out_shape) == (0, False, (256, 48), (256, 48))


def test_rs_plan_scatter_last_dim_splits_columns():
    p = matmul_reduce_scatter_plan((100, 64), (64, 48), "avg", 1, 4)
    assert (p.last, p.chunk, p.out_shape) == (True, (100, 12), (100, 12))


@pytest.mark.parametrize("s,out,chunk", [(0, (2, 64, 16), (128, 16)), (1, (8, 16, 16), (128, 16)),
                                         (2, (8, 64, 4), (512, 4))])
def test_rs_plan_batched_as_pytorch_tests_it(s, out, chunk):
    # PyTorch's test: A (8, 64, 1024) @ B (1024, 16), scatter_dim 0, 1, 2.
    p = matmul_reduce_scatter_plan((8, 64, 1024), (1024, 16), "avg", s, 4)
    assert p.out_shape == out and p.chunk == chunk


@pytest.mark.parametrize("a,b,op,s,world,exc,words", [
    ((8,), (8, 2), "sum", 0, 2, ValueError, "A must have at least 2 dims"),
    ((4, 8), (8,), "sum", 0, 2, ValueError, "B must be a matrix (2 dims), got shape [8]"),
    ((4, 8), (8, 2), "max", 0, 2, ValueError, "reduce_op 'max': want 'sum' or 'avg'"),
    ((4, 8), (8, 2), None, 0, 2, TypeError, "reduce_op must be a str"),
    ((4, 8), (8, 2), "sum", 2, 2, ValueError, "scatter_dim=2 is not a dimension of A of shape [4, 8]"),
    ((4, 8), (8, 2), "sum", -2, 2, ValueError, "negative dims are refused"),
    ((4, 8), (8, 2), "sum", False, 2, TypeError, "scatter_dim must be an int, not bool"),
    ((4, 8), (7, 2), "sum", 0, 2, ValueError, "B has 7 rows and A's last dim is 8"),
    ((6, 8), (8, 2), "sum", 0, 4, ValueError, "dim 0 of A @ B (shape [6, 2]) has 6 elements, which do not split "
                                              "evenly over 4 ranks"),
    ((4, 8), (8, 6), "sum", 1, 4, ValueError, "dim 1 of A @ B (shape [4, 6]) has 6 elements"),
])
def test_rs_plan_refusals_name_the_argument(a, b, op, s, world, exc, words):
    with pytest.raises(exc) as e:
        matmul_reduce_scatter_plan(a, b, op, s, world)
    assert str(e.value).startswith(RS + ": ")
    assert words in str(e.value)


# ---- small checks ----------------------------------------------------------------


def test_check_int_and_dim():
    assert check_int("f", "x", 3) == 3
    assert check_dim("f", "d", 1, 2, "t") == 1

    class Index:
        def __index__(self):
            return 1

    assert check_int("f", "x", Index()) == 1
    with pytest.raises(TypeError, match="f: x must be an int, not NoneType"):
        check_int("f", "x", None)


def test_check_group_name():
    assert check_group_name("f", "0") == "0"
    assert check_group_name("f", types.SimpleNamespace(group_name="7")) == "7"  # a ProcessGroup
    with pytest.raises(TypeError, match="f: group_name must be a process group's name"):
        check_group_name("f", 0)
    with pytest.raises(ValueError, match="f: group_name is empty"):
        check_group_name("f", "")


# ---- tensor checks over stand-in tensors -------------------------------------------


class _Dtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name

    def __eq__(self, other):
        return isinstance(other, _Dtype) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


class _Device:
    def __init__(self, type_, index=None):
        self.type, self.index = type_, index

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __eq__(self, other):
        return isinstance(other, _Device) and (other.type, other.index) == (self.type, self.index)


class _Tensor:
    def __init__(self, dtype="bfloat16", device=("cuda", 0)):
        self.dtype = _Dtype(dtype)
        self.device = _Device(*device)


TORCH = types.SimpleNamespace(Tensor=_Tensor)


def test_tensor_checks_pass_good_arguments():
    a, b = _Tensor(), _Tensor()
    assert check_all_gather_matmul_args(AG, TORCH, a, [b, b], "0", True) == ("0", [b, b])
    assert check_all_gather_matmul_args(AG, TORCH, a, (), "0", False) == ("0", [])
    assert check_matmul_reduce_scatter_args(RS, TORCH, a, b, types.SimpleNamespace(group_name="3")) == "3"


@pytest.mark.parametrize("args,exc,words", [
    ((None, [_Tensor()], "0", True), TypeError, "A_shard must be a torch.Tensor, not NoneType"),
    ((_Tensor(), _Tensor(), "0", True), TypeError, "Bs must be a list of tensors, not a Tensor (pass [B])"),
    ((_Tensor(), 3, "0", True), TypeError, "Bs must be a list of tensors, not int"),
    ((_Tensor(), [_Tensor(), 3], "0", True), TypeError, "Bs[1] must be a torch.Tensor, not int"),
    ((_Tensor(), [_Tensor()], 0, True), TypeError, "group_name must be a process group's name"),
    ((_Tensor(), [_Tensor()], "0", 1), TypeError, "return_A must be a bool, not int"),
    ((_Tensor(device=("cpu",)), [_Tensor()], "0", True), ValueError, "A_shard is on cpu: the fused operators take "
                                                                   "CUDA tensors"),
    ((_Tensor(), [_Tensor(device=("cuda", 1))], "0", True), ValueError, "Bs[0] is on cuda:1 and A_shard on cuda:0"),
    ((_Tensor("int32"), [], "0", True), ValueError, "A_shard is torch.int32: want torch.float16, torch.bfloat16"),
    ((_Tensor(), [_Tensor("float32")], "0", True), ValueError, "Bs[0] is torch.float32 and A_shard torch.bfloat16: "
                                                               "want one dtype"),
])
def test_all_gather_matmul_tensor_refusals(args, exc, words):
    with pytest.raises(exc) as e:
        check_all_gather_matmul_args(AG, TORCH, *args)
    assert str(e.value).startswith(AG + ": ") and words in str(e.value)


@pytest.mark.parametrize("a,b,exc,words", [
    ([], _Tensor(), TypeError, "A must be a torch.Tensor, not list"),
    (_Tensor(), None, TypeError, "B must be a torch.Tensor, not NoneType"),
    (_Tensor("float8_e4m3fn"), _Tensor("float8_e4m3fn"), ValueError, "A is torch.float8_e4m3fn: want"),
    (_Tensor("float16"), _Tensor("float32"), ValueError, "B is torch.float32 and A torch.float16: want one dtype"),
    (_Tensor(), _Tensor(device=("cpu",)), ValueError, "B is on cpu"),
])
def test_matmul_reduce_scatter_tensor_refusals(a, b, exc, words):
    with pytest.raises(exc) as e:
        check_matmul_reduce_scatter_args(RS, TORCH, a, b, "0")
    assert str(e.value).startswith(RS + ": ") and words in str(e.value)


# ---- torch.ops.symm.reduce_scatter / all_gather shapes -------------------------------


def test_collective_op_shapes():
    rs, ag = _torch_ops.reduce_scatter_shape, _torch_ops.all_gather_shape
    assert rs("f", (8, 3), 4) == (2, 3)
    assert rs("f", (4,), 4) == (1,)
    assert ag("f", (2, 3), 4) == (8, 3)
    assert ag("f", (), 4) == (4,)
    with pytest.raises(ValueError, match=r"f: dim 0 of the tensor \(shape \[6, 3\]\) has 6 elements, which do not "
                                         r"split evenly over 4 ranks"):
        rs("f", (6, 3), 4)
    with pytest.raises(ValueError, match="f: the tensor has no dims"):
        rs("f", (), 2)


@pytest.mark.parametrize("n,elem,want", [(1, 2, 2), (2, 2, 2), (3, 2, 4), (1, 4, 1), (5, 4, 5), (0, 2, 0)])
def test_shares_padded_to_four_bytes(n, elem, want):
    assert _torch_ops._padded_count(n, elem) == want


def test_fused_schemas_are_pytorchs():
    # torch.ops.symm_mem's schemas, the argument names included.
    assert _torch_ops.FUSED_SCHEMAS["fused_all_gather_matmul"].endswith(
        "(Tensor A_shard, Tensor[] Bs, int gather_dim, str group_name, *, bool return_A=True) -> (Tensor?, Tensor[])")
    assert _torch_ops.FUSED_SCHEMAS["fused_matmul_reduce_scatter"].endswith(
        "(Tensor A, Tensor B, str reduce_op, int scatter_dim, str group_name) -> Tensor")


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_without_torch_the_fused_functions_say_they_need_it():
    import symm

    for call in (lambda: symm.fused_all_gather_matmul(None, [], 0, "0"),
                 lambda: symm.fused_matmul_reduce_scatter(None, None, "sum", 0, "0")):
        with pytest.raises(ImportError, match="needs PyTorch"):
            call()


def test_exported():
    import symm

    assert symm.fused_all_gather_matmul is _fused.fused_all_gather_matmul
    assert symm.fused_matmul_reduce_scatter is _fused.fused_matmul_reduce_scatter
    assert {"fused_all_gather_matmul", "fused_matmul_reduce_scatter"} <= set(symm.__all__)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch (CPU is enough)")
def test_the_protocol_on_cpu_threads():
    # fused_sim.py: threads as ranks, CPU tensors as workspaces, results and
    # strides against PyTorch's reference layout, a burst of mixed calls.
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("fused_sim.py")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout[-2000:] + r.stderr[-4000:]
