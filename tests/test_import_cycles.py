"""No module of ortgate imports, directly or through others, a module that imports it back: every import, at the
top, in a function or under TYPE_CHECKING, goes one way. (A package importing its own submodules, and
`from PACKAGE import SUBMODULE`, are edges to the submodule alone.)"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def _modules() -> dict[str, Path]:
    out = {}
    for path in (REPO / "ortgate").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = submodules if len(submodules) == len(node.names) else [node.module, *submodules]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            package_of_mine = [t for t in targets if t in modules and t != name
                               and not (t.startswith(name + ".") and modules[name].name == "__init__.py")]
            edges[name].update(package_of_mine)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[v] = min(low[v], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Circles known and still to remove, each named once: the test fails on any other, and on one of these that is gone
# (so the list only shrinks). None is left: op keys live in knowledge/op_keys.py, which imports nothing of ortgate.
KNOWN: list[list[str]] = []


def test_no_import_cycle_in_ortgate():
    assert _cycles(_edges(_modules())) == KNOWN
