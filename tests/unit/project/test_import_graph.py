"""The package's import graph, built from the source: no cycle (the rooms: test_layout.py).

Every ``import`` and ``from ... import`` counts, at module level or inside a function, absolute
(``from interp.x import y``, ``from interp import x``) or relative (``from . import x``). An
edge goes to the deepest module of ``interp`` the statement names: ``from interp import x``
is an edge to ``interp.x`` when that is a module, else to ``interp``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import interp

ROOT = Path(interp.__file__).resolve().parent


def _modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package ``__init__``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ["interp", *path.relative_to(root).with_suffix("").parts]
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the ``interp`` modules it imports (itself excluded)."""
    modules = _modules(root)

    def deepest(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        here = name if package else name.rpartition(".")[0]
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                deps.update(deepest(a.name) for a in node.names if a.name.split(".")[0] == "interp")
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[:len(here.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "interp":
                    continue
                for a in node.names:
                    full = f"{target}.{a.name}"
                    deps.add(full if full in modules else deepest(target))
        graph[name] = {d for d in deps if d is not None and d != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_every_kind_of_import(tmp_path):
    """Imports inside functions, ``from interp import x`` and relative imports all count."""
    pkg = tmp_path / "interp"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from interp import b\n")
    (pkg / "b.py").write_text("from .sub import c\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("import interp.a\nfrom ..b import x\n")
    graph = import_graph(pkg)
    assert graph["interp.a"] == {"interp.b"}
    assert graph["interp.b"] == {"interp.sub.c"}
    assert graph["interp.sub.c"] == {"interp.a", "interp.b"}
    assert find_cycle(graph) == ["interp.a", "interp.b", "interp.sub.c", "interp.a"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])
