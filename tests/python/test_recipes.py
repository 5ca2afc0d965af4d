"""Every code block of the README and docs/ says what it is, and the ones a
user runs on a machine without a GPU run here, as printed (Go's Example
tests and Rust's doctests do the same for code).

Each fenced block is preceded by a marker line:

    <!-- recipe: host -->     run by this test (host backend, no GPU)
    <!-- recipe: gpu -->      needs a GPU: tests/device/recipes_gpu.py runs it
    <!-- recipe: ci -->       the CI commands themselves (.ci/run runs each line)
    <!-- recipe: script P --> run, in a fresh environment, by the test script P
    <!-- recipe: excerpt -->  part of a program, shown to read, not to run alone
    <!-- recipe: output -->   what a command prints

A host block runs from the repository root with SYMM_DEVICE=host, the built
library (SYMM_LIB, build/ on PATH) and python/ on PYTHONPATH: sh with bash
-euo pipefail, python with python3, c compiled against include/ and build/
in a temporary directory. It must leave nothing in the checkout outside
build/ (no ./a.out, no ./pool_example).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
KINDS = {"host", "gpu", "ci", "excerpt", "output", "script"}
MARKER = re.compile(r"^<!-- recipe: (\w+)(?: (\S+))? -->$")


def blocks(path: Path):
    """(kind or None, language, code, line) of each fenced block of path."""
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start = lines[i][3:].strip(), i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            m = MARKER.match(prev.strip())
            kind = (m.group(1) + (":" + m.group(2) if m.group(2) else "")) if m else None
            out.append((kind, lang, "\n".join(lines[i + 1:j]) + "\n", start + 1))
            i = j + 1
        else:
            i += 1
    return out


ALL = [(p, *b) for p in DOCS for b in blocks(p)]


def test_every_block_is_marked():
    bad = [f"{p.relative_to(ROOT)}:{line}: {kind or 'no marker'}" for p, kind, _, _, line in ALL
           if (kind or "").split(":")[0] not in KINDS]
    assert not bad, "blocks without a recipe marker (<!-- recipe: host|gpu|ci|excerpt|output -->):\n" + "\n".join(bad)


def test_script_recipes_have_their_script():
    for p, kind, _, _, line in ALL:
        if kind and kind.startswith("script:"):
            script = ROOT / kind.split(":", 1)[1]
            assert script.is_file(), f"{p.name}:{line}: {script} does not exist"


def test_ci_recipes_are_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for p, kind, _, code, line in ALL:
        if kind == "ci":
            for cmd in code.splitlines():
                cmd = cmd.split("#")[0].strip()
                assert not cmd or cmd in ci, f"{p.name}:{line}: .ci/run does not run {cmd!r}"


def checkout_files() -> set:
    """The checkout's untracked and ignored entries, as git status lists them
    (build/ is one entry: what a recipe writes there does not show), leaving
    out Python's byte-code caches."""
    got = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return {line[3:] for line in got.stdout.splitlines()
            if line[:3] in ("?? ", "!! ") and "__pycache__" not in line}


def host_env(tmp_path: Path) -> dict:
    env = dict(os.environ)
    lib = ROOT / "build" / "libsymm.so"
    env.update(SYMM_DEVICE="host", SYMM_LIB=str(lib), PYTHONPATH=str(ROOT / "python"),
               PATH=f"{ROOT / 'build'}:{env.get('PATH', '')}", HOME=str(tmp_path / "home"))
    (tmp_path / "home").mkdir(exist_ok=True)
    # Go's caches stay where they are (a make inside a recipe must not start over).
    for var in ("GOCACHE", "GOMODCACHE", "GOPATH"):
        if var not in env:
            got = subprocess.run(["go", "env", var], capture_output=True, text=True)
            if got.returncode == 0:
                env[var] = got.stdout.strip()
    return env


HOST = [pytest.param(p, lang, code, id=f"{p.name}:{line}") for p, kind, lang, code, line in ALL if kind == "host"]


@pytest.mark.parametrize("path,lang,code", HOST)
def test_host_recipe_runs(path, lang, code, tmp_path):
    env = host_env(tmp_path)
    if lang == "sh":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    elif lang == "python":
        cmd = [sys.executable, "-c", code]
    elif lang == "c":
        src = tmp_path / "recipe.c"
        src.write_text(code)
        exe = tmp_path / "recipe"
        cc = subprocess.run([os.environ.get("CC", "cc"), "-Wall", "-Werror", str(src), f"-I{ROOT / 'include'}",
                             f"-L{ROOT / 'build'}", f"-Wl,-rpath,{ROOT / 'build'}", "-lsymm", "-o", str(exe)],
                            capture_output=True, text=True)
        assert cc.returncode == 0, f"{path.name}: the C recipe does not compile:\n{cc.stderr}"
        cmd = [str(exe)]
    else:
        pytest.fail(f"{path.name}: no way to run a host recipe in {lang!r}")
    before = checkout_files()
    got = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, f"{path.name}: recipe failed ({got.returncode}):\n{code}\n--- stdout\n{got.stdout}\n--- stderr\n{got.stderr}"
    left = checkout_files() - before
    assert not left, f"{path.name}: the recipe left {sorted(left)} in the checkout (write into build/ or a temporary directory)"


def test_host_backend_is_never_a_fallback(tmp_path):
    """The host recipes need SYMM_DEVICE=host, as the README says: without it
    and without a driver, the Python recipe fails and names the variable."""
    env = host_env(tmp_path)
    del env["SYMM_DEVICE"]
    env["SYMM_CUDA_LIB"] = str(tmp_path / "no-libcuda.so.1")  # no driver, even on a GPU machine
    code = next(code for p, kind, lang, code, _ in ALL if p.name == "README.md" and kind == "host" and lang == "python")
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert got.returncode != 0, got.stdout
    assert "SymmError" in got.stderr and "set SYMM_DEVICE=host" in got.stderr, got.stderr
    readme = (ROOT / "README.md").read_text()
    assert "never in place of\na missing GPU" in readme


def gpu_recipes():
    """The GPU recipes, for tests/device/recipes_gpu.py: (where, language, code)."""
    return [(f"{p.relative_to(ROOT)}:{line}", lang, code) for p, kind, lang, code, line in ALL if kind == "gpu"]


REPLAYS = [pytest.param(p, code, id=f"{p.name}:{line}") for p, kind, lang, code, line in ALL
           if kind == "output" and code.startswith("$ symm replay ")]


def test_a_json_sample_is_among_the_checked_ones():
    """docs/REPLAY.md's `--json` sample is one of those compared whole."""
    assert any(code.split("\n", 1)[1].startswith("{") for p, code in
               ((param.values[0], param.values[1]) for param in REPLAYS) if p.name == "REPLAY.md")


@pytest.mark.parametrize("path,code", REPLAYS)
def test_replay_samples_are_what_the_tool_prints(path, code, tmp_path):
    """A sample of `symm replay` output is the tool's: every line shown (but
    "...") comes out, in order, when the command runs now; a JSON sample is
    the whole object the command prints, every field and value."""
    first, *shown = code.splitlines()
    args = first[len("$ symm "):].split()
    got = subprocess.run([str(ROOT / "build" / "symm"), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr
    if shown and shown[0].startswith("{"):
        assert json.loads("\n".join(shown)) == json.loads(got.stdout), \
            f"{path.name}: the JSON sample is not what `{first[2:]}` prints now:\n{got.stdout}"
        return
    out = got.stdout.splitlines()
    k = 0
    for want in (s for s in shown if s.strip() != "..."):
        while k < len(out) and out[k].split() != want.split():
            k += 1
        assert k < len(out), f"{path.name}: {want!r} is not what `{first[2:]}` prints now:\n{got.stdout}"
        k += 1
