"""symm's PyTorch custom operators (torch.ops.symm.*): `import symm` after
torch registers them, and never fails because of them. torch is not
installed in CI: a stand-in module shows what `import symm` does with a
torch that cannot register them. The operators themselves run on the GPU
(tests/device/symm_compile.py, tests/device/symm_fused.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(ROOT / "python"), "PATH": "/usr/bin:/bin"})


def test_import_after_a_torch_that_cannot_register():
    r = _run("import sys, types\n"
             "sys.modules['torch'] = types.ModuleType('torch')  # no torch.library\n"
             "import symm\n"
             "try:\n"
             "    symm.register_torch_ops()\n"
             "except AttributeError as e:\n"
             "    print('explicit:', e)\n")
    assert r.returncode == 0, r.stderr
    assert "explicit:" in r.stdout and "library" in r.stdout


def test_register_asks_torch_for_the_operator():
    # A stand-in torch.library that records what is registered.
    r = _run("import sys, types\n"
             "torch = types.ModuleType('torch'); torch.Tensor = type('Tensor', (), {})\n"
             "seen = []\n"
             "class Op:\n"
             "    def __init__(self, fn): self.fn = fn\n"
             "    def register_fake(self, f): seen.append(('fake', f.__name__)); return f\n"
             "def custom_op(name, mutates_args):\n"
             "    def wrap(fn):\n"
             "        seen.append((name, tuple(mutates_args), fn.__annotations__['tensor'] is torch.Tensor))\n"
             "        return Op(fn)\n"
             "    return wrap\n"
             "class Library:\n"
             "    def __init__(self, ns, kind): seen.append(('library', ns, kind))\n"
             "    def define(self, schema, tags=()): seen.append(('define', schema.split('(')[0], tags))\n"
             "    def impl(self, name, fn, key): seen.append(('impl', name, fn.__name__, key))\n"
             "def register_fake(name, fn, lib=None): seen.append(('fake', name, fn.__name__, lib is not None))\n"
             "torch.library = types.SimpleNamespace(custom_op=custom_op, Library=Library, register_fake=register_fake)\n"
             "torch._C = types.SimpleNamespace(Tag=types.SimpleNamespace(needs_fixed_stride_order='fixed'))\n"
             "sys.modules['torch'] = torch\n"
             "import symm\n"
             "symm.register_torch_ops(); symm.register_torch_ops()\n"
             "for x in seen: print(x)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines() == [
        "('symm::push_all_reduce', (), True)", "('fake', '_')",
        "('symm::all_reduce', (), True)", "('fake', '_')",
        "('symm::reduce_scatter', (), True)", "('fake', '_')",
        "('symm::all_gather', (), True)", "('fake', '_')",
        "('library', 'symm', 'FRAGMENT')",
        "('define', 'fused_all_gather_matmul', ('fixed',))",
        "('impl', 'fused_all_gather_matmul', 'fused_all_gather_matmul', 'CUDA')",
        "('fake', 'symm::fused_all_gather_matmul', '_fused_all_gather_matmul_fake', True)",
        "('define', 'fused_matmul_reduce_scatter', ('fixed',))",
        "('impl', 'fused_matmul_reduce_scatter', 'fused_matmul_reduce_scatter', 'CUDA')",
        "('fake', 'symm::fused_matmul_reduce_scatter', '_fused_matmul_reduce_scatter_fake', True)",
    ], r.stdout


def test_a_failed_fused_registration_is_retried_without_redefining_the_others():
    # A torch whose Library fails once (at `import symm`, which swallows
    # the failure): the custom_op operators are defined once, the fused ones
    # on the next call.
    r = _run("import sys, types\n"
             "torch = types.ModuleType('torch'); torch.Tensor = type('Tensor', (), {})\n"
             "seen = []\n"
             "class Op:\n"
             "    def __init__(self, fn): pass\n"
             "    def register_fake(self, f): return f\n"
             "def custom_op(name, mutates_args):\n"
             "    def wrap(fn):\n"
             "        seen.append(name)\n"
             "        return Op(fn)\n"
             "    return wrap\n"
             "fails = [1]\n"
             "class Library:\n"
             "    def __init__(self, ns, kind):\n"
             "        if fails: fails.pop(); raise RuntimeError('no library today')\n"
             "    def define(self, schema, tags=()): seen.append(schema.split('(')[0])\n"
             "    def impl(self, name, fn, key): pass\n"
             "torch.library = types.SimpleNamespace(custom_op=custom_op, Library=Library)  # no register_fake\n"
             "torch._C = types.SimpleNamespace(Tag=types.SimpleNamespace())  # no needs_fixed_stride_order\n"
             "sys.modules['torch'] = torch\n"
             "import symm\n"
             "print(fails)\n"
             "symm.register_torch_ops(); symm.register_torch_ops()\n"
             "print(seen)\n")
    assert r.returncode == 0, r.stderr
    failed_once, names = r.stdout.strip().splitlines()
    assert failed_once == "[]"
    assert names == str(["symm::push_all_reduce", "symm::all_reduce", "symm::reduce_scatter", "symm::all_gather",
                         "fused_all_gather_matmul", "fused_matmul_reduce_scatter"])
