"""symm's collectives keep per-group state (the all-reduce plan, the handle
of a tensor's last rendezvous, the push workspace, the scratch buffer), and
none of it may reach a group that merely looks like an old one: a new group
at the address (id) of a dead one, or a new WORLD, named "0" again, after
destroy_process_group() and init_process_group(). destroy_process_group
drops the group's state and frees its buffers; two threads growing a
group's scratch buffer free the old one once and make one new one.

torch is not installed in CI: a stand-in torch.distributed (and torch.cuda)
runs in a fresh interpreter, with the real library on the host backend for
all_reduce_algorithm; allocation and rendezvous are recorded, not done."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = r'''
import sys, threading, time, types
dist = types.ModuleType("torch.distributed")
class PG:
    def __init__(self, name, world, backend="nccl"):
        self.group_name, self.world, self.backend = name, world, backend
dist.group = types.SimpleNamespace(WORLD=PG("0", 2))
dist.get_world_size = lambda pg: pg.world
dist.get_rank = lambda pg: 0
dist.get_backend = lambda pg: pg.backend
destroyed = []
def destroy_process_group(group=None):
    destroyed.append(group)
    if group is None or group is dist.group.WORLD:
        dist.group.WORLD = None
dist.destroy_process_group = destroy_process_group
torch = types.ModuleType("torch"); torch.distributed = dist
syncs = []
torch.cuda = types.SimpleNamespace(synchronize=lambda dev=None: syncs.append(dev) or time.sleep(SYNC_S))
SYNC_S = 0
sys.modules["torch"], sys.modules["torch.distributed"] = torch, dist
import symm
from symm import _collectives as c

# Allocation and rendezvous recorded: a handle names the group it was made in.
allocs, frees, rdv = [], [], []
class H:
    def __init__(self, group, world, ptr=0):
        self.group, self.world_size, self.rank, self.offset, self.ptr = group, world, 0, 0, ptr
        self.handle = len(rdv) + 1000
        self.buffer_ptrs = [ptr] * world
        self.push_max_bytes = 1 << 20
def fake_alloc(size, dev):
    allocs.append(size)
    return 0x10000 * len(allocs)
def fake_rendezvous_ptr(ptr, store, name, rank, world, dev):
    time.sleep(RDV_S)
    rdv.append(name)
    return H(name, world, ptr)
def fake_rendezvous(tensor, group):
    pg = dist.group.WORLD if group is None else group
    rdv.append(pg.group_name)
    return H(pg, pg.world)
RDV_S = 0
c.symm_alloc, c.symm_free, c.rendezvous_ptr, c.rendezvous = fake_alloc, frees.append, fake_rendezvous_ptr, fake_rendezvous
from symm import _group_state
_group_state.symm_free = frees.append  # the groups' buffers are freed there
c._group_store = lambda group: None
c._ensure_backend = lambda dev: None
c._cuda_device = lambda dev: DEV
DEV = types.SimpleNamespace(index=0, type="cuda")

class T:
    def __init__(self, ptr=0x1000, dtype="bf16"):
        self.ptr, self.dtype, self.device = ptr, dtype, DEV
    def data_ptr(self): return self.ptr
KiB = 1 << 10
'''

# A new group at a dead group's address, if one can land there (the old
# state may keep the old group alive): nothing of the old one reaches it.
REUSED_ID = r'''
a = PG("a", 2)
plan_a = c._all_reduce_plan(T(), a, 512 * KiB, None)
t = T()
ha = c._allreduce_handle(t, a)
old = id(a)
del a
b = None
keep = []
for _ in range(100000):
    g = PG("b", 4)
    if id(g) == old:
        b = g
        break
    keep.append(g)
if b is None:
    b = g  # the old group is still alive: no object can take its address
print("plan_a", plan_a)
print("plan_b", c._all_reduce_plan(T(), b, 512 * KiB, None))
hb = c._allreduce_handle(t, b)
print("handle_b_world", hb[3])
'''

# destroy_process_group() + init_process_group(): WORLD is "0" again.
NEW_WORLD = r'''
print("plan_old", c._all_reduce_plan(T(), None, 512 * KiB, None))
t = T()
h_old = c._allreduce_handle(t, None)
ws_old = c.push_workspace(None, DEV)
sc_old = c._all_reduce_scratch(None, DEV, 1 << 20)
dist.destroy_process_group()
try:
    c._all_reduce_plan(T(), None, 512 * KiB, None)
    print("between", "accepted")
except ValueError as e:
    print("between", "ValueError" if "initialized" in str(e) else repr(e))
dist.group.WORLD = PG("0", 4, "gloo")
print("plan_new", c._all_reduce_plan(T(), None, 512 * KiB, None))
print("handle_new_world", c._allreduce_handle(t, None)[3])
ws_new = c.push_workspace(None, DEV)
print("workspace_new", "old" if ws_new is ws_old else "new", ws_new.world_size)
sc_new = c._all_reduce_scratch(None, DEV, 1 << 20)
print("scratch_new", "old" if sc_new is sc_old else "new", sc_new.world_size)
print("freed_old", int(sorted(frees) == sorted([ws_old.ptr, sc_old.ptr])))
print("destroyed", len(destroyed))
'''

# Two threads grow one group's scratch buffer at once.
GROW_RACE = r'''
g = PG("g", 2)
c._all_reduce_scratch(g, DEV, 1 << 20)
SYNC_S = 0.3
errors = []
def grow():
    try:
        c._all_reduce_scratch(g, DEV, 4 << 20)
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=grow) for _ in range(2)]
ts[0].start(); time.sleep(0.1); ts[1].start()
for t in ts: t.join()
print("errors", len(errors))
print("allocs", len(allocs))
print("frees", len(frees))
print("double_free", int(len(frees) != len(set(frees))))
'''

# destroy_process_group closes libsymm's store of the group it destroys
# (symm_store_close: the group's link and handshake counts go with it) and
# frees its fused workspaces; every group's for WORLD.
STORES_GO = r'''
from symm import _groups as gr, _store as gs, _symmetric as s
dist.distributed_c10d = types.SimpleNamespace(_get_group_tag=lambda g: "tag-" + g.group_name)
a = PG("a", 2)
gs._stores["tag-a"] = gs.Store.server("127.0.0.1:0")
gs._stores["tag-0"] = gs.Store.server("127.0.0.1:0")
kept = gs._stores["tag-0"]
closed = gs._stores["tag-a"]
from symm import _fused as fu
s.symm_free = frees.append
fu._workspaces[("a", 0)] = fu._Workspace(0xa000, 1 << 20, None)
fu._workspaces[("0", 0)] = fu._Workspace(0xb000, 1 << 20, None)
gr.ensure_destroy_hook()
dist.destroy_process_group(a)
print("after_a", ",".join(sorted(gs._stores)))
print("fused_after_a", ",".join(k[0] for k in fu._workspaces) + " freed " + ",".join(hex(p) for p in frees))
def usable(st):
    try:
        st.set("k", b"v")
        return "open"
    except Exception:
        return "closed"
print("a_store", usable(closed))
print("world_store", usable(kept))
dist.destroy_process_group()
print("after_world", ",".join(sorted(gs._stores)) or "none")
print("world_store_after", usable(kept))
print("fused_after_world", len(fu._workspaces), len(frees))
'''


def run(script: str) -> dict:
    env = {"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin", "SYMM_DEVICE": "host",
           "SYMM_LIB": os.environ.get("SYMM_LIB", str(ROOT / "build" / "libsymm.so"))}
    r = subprocess.run([sys.executable, "-c", PRELUDE + script], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    return dict(line.split(" ", 1) for line in r.stdout.strip().splitlines())


def test_a_new_group_at_a_dead_groups_address_starts_afresh():
    got = run(REUSED_ID)
    # 512 KiB: the push on 2 ranks, the two-shot on 4 (all_reduce_algorithm's crossovers).
    assert got["plan_a"] == "push", got
    assert got["plan_b"] == "two_shot", got
    assert got["handle_b_world"] == "4", got


def test_a_new_world_after_destroy_starts_afresh_and_the_old_buffers_go():
    got = run(NEW_WORLD)
    assert got["plan_old"] == "push", got
    assert got["plan_new"] == "two_shot", got
    assert got["handle_new_world"] == "4", got
    assert got["workspace_new"] == "new 4", got
    assert got["scratch_new"] == "new 4", got
    assert got["freed_old"] == "1", got
    assert got["destroyed"] == "1", got  # the hook called torch's own destroy once
    assert got["between"] == "ValueError", got  # no WORLD between destroy and init


def test_two_threads_growing_the_scratch_buffer_free_the_old_one_once():
    got = run(GROW_RACE)
    assert got == {"errors": "0", "allocs": "2", "frees": "1", "double_free": "0"}, got


def test_destroy_closes_the_groups_store():
    got = run(STORES_GO)
    assert got == {"after_a": "tag-0", "a_store": "closed", "world_store": "open", "after_world": "none",
                   "world_store_after": "closed", "fused_after_a": "0 freed 0xa000", "fused_after_world": "0 2"}, got
