"""The package's rooms: each imports only rooms below it, and docs/architecture.md names them all.

:data:`ROOMS` is the one declaration of the room order, bottom first. A room is a sub-package
or a single module of ``interp``; ``interp/__init__.py`` (the lazy re-exports) and
``interp/__main__.py`` stand above every room. Every import counts, at module level or inside
a function (tests/unit/project/test_import_graph.py builds the graph).
"""

from __future__ import annotations

import re

import pytest

from tests.unit.project.test_import_graph import ROOT, _modules, find_cycle, import_graph

ROOMS = ("core", "data", "launch", "store", "analysis", "models", "hooks", "judging", "methods",
         "endpoints", "plots", "stages", "run", "testing", "cli")
"""Bottom first: a module of room ``ROOMS[i]`` may import rooms ``ROOMS[:i + 1]`` only."""

DOC = ROOT.parent / "docs" / "architecture.md"


def room(module: str) -> str | None:
    """The room of a dotted ``interp`` module (None for ``interp`` and ``interp.__main__``)."""
    parts = module.split(".")
    return None if len(parts) == 1 or parts[1] == "__main__" else parts[1]


def violations(graph: dict[str, set[str]], rooms=ROOMS) -> list[str]:
    """Every import of a room above the importer's, as ``a (room) -> b (room)``."""
    rank = {r: i for i, r in enumerate(rooms)}
    out = []
    for mod, deps in sorted(graph.items()):
        if (r := room(mod)) is None:
            continue
        out += [f"{mod} ({r}) -> {d} ({room(d)})" for d in sorted(deps)
                if room(d) is None or rank[room(d)] > rank[r]]
    return out


def test_every_module_is_in_a_declared_room():
    assert {room(m) for m in _modules()} - {None} == set(ROOMS)


def test_each_room_imports_only_rooms_below_it():
    bad = violations(import_graph())
    assert not bad, "imports of a higher room:\n" + "\n".join(bad)


def test_the_rule_catches_an_upward_import():
    graph = {"interp.core.errors": {"interp.models.loading"}, "interp.models.loading":
             {"interp.core.errors"}, "interp.cli": {"interp"}}
    assert violations(graph) == [
        "interp.cli (cli) -> interp (None)",
        "interp.core.errors (core) -> interp.models.loading (models)"]


def test_no_cycle_between_rooms():
    graph = import_graph()
    rooms: dict[str, set[str]] = {}
    for mod, deps in graph.items():
        if (r := room(mod)) is not None:
            rooms.setdefault(r, set()).update(room(d) for d in deps if room(d) not in (None, r))
    assert find_cycle(rooms) is None


def test_architecture_names_every_module_and_the_room_order():
    text = DOC.read_text()
    missing = [str(p.relative_to(ROOT.parent)) for p, _ in _modules().values()
               if f"`{p.relative_to(ROOT.parent).as_posix()}`" not in text]
    assert not missing, f"docs/architecture.md does not name: {missing}"
    order = re.search(r"^rooms, bottom first: (.+)$", text, re.M)
    assert order, "docs/architecture.md has no 'rooms, bottom first: ...' line"
    assert tuple(re.findall(r"`(\w+)`", order.group(1))) == ROOMS


@pytest.mark.parametrize("name", __import__("interp").API)
def test_the_public_api_is_importable_from_interp(name):
    import importlib

    import interp

    home = importlib.import_module(interp.API[name])
    assert getattr(interp, name) is getattr(home, name)


def _import_side_effects(tree) -> list[str]:
    """Module-level statements that write into a name the module imported.

    A table filled when the module is imported: ``TABLE["kind"] = ...``, ``TABLE.update(...)``,
    and a function of ``interp`` called, or used as a decorator, at module level
    (``register("kind", f)``, ``@register("kind")``): a registration by import.
    """
    import ast

    imported = {(a.asname or a.name).split(".")[0] for n in tree.body
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    from_interp = {(a.asname or a.name).split(".")[0] for n in tree.body
                   if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("interp")
                   or isinstance(n, ast.Import) and n.names[0].name.startswith("interp")
                   for a in n.names}

    def root(node):
        while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
            node = node.func if isinstance(node, ast.Call) else node.value
        return node.id if isinstance(node, ast.Name) else None

    out = []
    for n in tree.body:
        targets = (n.targets if isinstance(n, ast.Assign) else [n.target]
                   if isinstance(n, (ast.AugAssign, ast.AnnAssign)) else [])
        if any(isinstance(t, (ast.Subscript, ast.Attribute)) and root(t) in imported
               for t in targets):
            out.append(ast.unparse(n))
        elif (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
              and isinstance(n.value.func, ast.Attribute)
              and n.value.func.attr in {"update", "setdefault", "append", "extend", "add",
                                        "register", "__setitem__"}
              and root(n.value.func.value) in imported):
            out.append(ast.unparse(n))
        elif isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and root(
                n.value.func) in from_interp:
            out.append(ast.unparse(n))
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out += [f"@{ast.unparse(d)}" for d in n.decorator_list if root(d) in from_interp]
    return out


def test_no_module_fills_another_modules_table_when_imported():
    """A registry is declared where it lives (a higher room's entry lazily, "module:object").

    A kind that exists only once some module happens to be imported is refused by every check
    that runs before that import.
    """
    import ast

    found = {name: bad for name, (path, _) in _modules().items() if name != "interp.__main__"
             and (bad := _import_side_effects(ast.parse(path.read_text(encoding="utf-8"))))}
    assert not found, found
    caught = _import_side_effects(ast.parse(
        "from interp.judging.grading import ORACLE_KINDS\nimport x\n"
        "from interp.x import register\nimport functools\n"
        "ORACLE_KINDS['openai'] = (True, f)\nx.TABLE.update(a=1)\nlocal = {}\nlocal['k'] = 1\n"
        "register('k', f)\n@register('j')\ndef g(): pass\n@functools.cache\ndef h(): pass\n"))
    assert caught == ["ORACLE_KINDS['openai'] = (True, f)", "x.TABLE.update(a=1)",
                      "register('k', f)", "@register('j')"]


def test_importing_interp_imports_no_torch():
    import subprocess
    import sys

    code = "import interp, interp.core.errors, interp.cli, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
