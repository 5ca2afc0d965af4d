"""The symm package's modules import each other as a DAG: no circle, not
even through an import inside a function or under TYPE_CHECKING (a
function-level import that closes a circle works until someone moves it to
the top, and hides which module owns what). Shared pieces live in the lower
module (symm._groups: process groups and the destroy hook every module
registers its step with; symm._store: Store and each group's store). The
package's __init__ (which imports everything to export it) and __main__ are
left out."""

from __future__ import annotations

import ast

from conftest import PYTHON_DIR

PKG = PYTHON_DIR / "symm"


def module_name(path) -> str:
    return ".".join(path.relative_to(PKG).with_suffix("").parts)


def imports(path) -> set[str]:
    """The package's modules path imports, anywhere in it."""
    here = module_name(path)
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module and node.module.startswith("symm."):
                    out.add(node.module[len("symm."):])
                continue
            base = here.split(".")[: -node.level]
            if node.module:
                out.add(".".join(base + node.module.split(".")))
            else:  # from . import a, b
                out.update(".".join(base + [a.name]) for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name[len("symm."):] for a in node.names if a.name.startswith("symm."))
    return {m for m in out if m and m != here}


def graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in PKG.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    return {m: {d for d in imports(p) if d in mods} for m, p in mods.items()}


def test_the_modules_form_a_dag():
    g = graph()
    assert {"_groups", "_store", "_backends", "_symmetric", "_collectives"} <= set(g), sorted(g)
    done, path = set(), []

    def visit(m):
        if m in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(m):] + [m]))
        if m in done:
            return
        path.append(m)
        for d in sorted(g[m]):
            visit(d)
        path.pop()
        done.add(m)

    for m in sorted(g):
        visit(m)


def test_the_shared_pieces_are_below_their_users():
    g = graph()
    assert g["_groups"] == set(), g["_groups"]
    assert "_store" in g["_backends"] and "_store" in g["_symmetric"]
    assert not g["_store"] & {"_backends", "_symmetric", "_collectives", "_fused"}, g["_store"]
