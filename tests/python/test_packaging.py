"""Packaging rules that CI enforces: no tracked build output (the check must
catch one), and one version number."""

from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import ROOT


def test_check_no_binaries_catches_a_tracked_executable(tmp_path):
    git = shutil.which("git")
    if git is None:
        import pytest

        pytest.skip("git is not installed")
    subprocess.run([git, "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "notes.txt").write_text("text\n")
    shutil.copy(sys.executable, tmp_path / "tool")  # an ELF executable
    subprocess.run([git, "-C", str(tmp_path), "add", "notes.txt", "tool"], check=True)
    bad = subprocess.run(["bash", str(ROOT / "tests" / "check_no_binaries.sh"), str(tmp_path)],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "tool" in bad.stdout, bad.stdout + bad.stderr
    subprocess.run([git, "-C", str(tmp_path), "rm", "-q", "--cached", "tool"], check=True)
    good = subprocess.run(["bash", str(ROOT / "tests" / "check_no_binaries.sh"), str(tmp_path)],
                          capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr


def test_python_package_version_comes_from_the_one_file():
    import symm

    want = (ROOT / "internal" / "version" / "VERSION").read_text().strip()
    assert symm.__version__ == want
    assert (ROOT / "python" / "VERSION").is_symlink()


def test_go_version_is_go_mod_s():
    """The Go a build needs, as go.mod says it, is what the README and the
    source install's refusal name."""
    import re

    m = re.search(r"^go (\d+)\.(\d+)", (ROOT / "go.mod").read_text(), re.M)
    assert m, "go.mod has no go line"
    want = f"{m.group(1)}.{m.group(2)}"
    readme = (ROOT / "README.md").read_text()
    assert set(re.findall(r"Go ≥ (\d+\.\d+)", readme)) == {want}, re.findall(r"Go ≥ (\d+\.\d+)", readme)
    setup = (ROOT / "python" / "setup.py").read_text()
    assert re.findall(r"Go (\d+\.\d+)", setup) == [want], re.findall(r"Go (\d+\.\d+)", setup)
