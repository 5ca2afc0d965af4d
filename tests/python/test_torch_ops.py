"""symm's PyTorch custom operators (torch.ops.symm.*): `import symm` after
torch registers them, and never fails because of them. torch is not
installed in CI: a stand-in module shows what `import symm` does with a
torch that cannot register them. The operators themselves run on the GPU
(tests/device/symm_compile.py)."""

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
             "torch.library = types.SimpleNamespace(custom_op=custom_op)\n"
             "sys.modules['torch'] = torch\n"
             "import symm\n"
             "symm.register_torch_ops(); symm.register_torch_ops()\n"
             "print(seen)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("[('symm::push_all_reduce', (), True), ('fake', '_'), "
                                "('symm::all_reduce', (), True), ('fake', '_')]"), r.stdout
