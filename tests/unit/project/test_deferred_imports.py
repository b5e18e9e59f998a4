"""An ``interp`` import inside a function only where a heavy library hides behind it.

A function-level import keeps ``import interp`` and the command line's argument checks light;
where the imported module loads nothing heavy, it only hides the module's neighbours from its
reader. Each function-level ``import``/``from ... import`` of an ``interp`` module is run, as
written (relative imports made absolute), in a fresh interpreter forked from one that has
imported nothing of ``interp``; it must ask for one of :data:`HEAVY`. The same holds for the
names a package serves lazily through a module ``__getattr__``, except the top package
``interp`` (its ``__init__`` runs on every import of any room, so it imports none of them).

All statements are checked in one subprocess: it forks once per statement, and a child stops
at the first heavy library asked for, so nothing heavy is ever imported.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.unit.project.test_import_graph import ROOT, _modules

HEAVY = ("torch", "transformers", "numpy", "scipy", "pandas", "sklearn", "joblib", "matplotlib",
         "safetensors", "peft", "accelerate", "nnsight", "transformer_lens", "datasets", "gguf",
         "tokenizers", "huggingface_hub", "openai", "httpx", "xllamacpp")
"""Libraries worth deferring: each costs about 0.1 s or more to import (numpy 0.18 s, httpx
0.09 s, openai 0.6 s, torch 1.3 s), or loads a model runtime, a native server or the hub."""

PROBE = """
import importlib.abc, json, os, sys
heavy, statements = set(json.loads(sys.argv[1])), json.loads(sys.argv[2])

class Stop(importlib.abc.MetaPathFinder):
    def __init__(self, fd):
        self.fd = fd

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in heavy:
            os.write(self.fd, json.dumps(name.partition(".")[0]).encode())
            os._exit(0)

out = {}
for s in statements:
    r, w = os.pipe()
    if (pid := os.fork()) == 0:
        os.close(r)
        sys.meta_path.insert(0, Stop(w))
        try:
            exec(s, {})
            os.write(w, b"null")
        except BaseException as e:
            os.write(w, json.dumps(f"fails: {type(e).__name__}: {e}").encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out[s] = json.loads(data or b'"fails: no answer"')
print(json.dumps(out))
"""


def heavy_asked(statements: list[str]) -> dict[str, str | None]:
    """Statement -> the first heavy library it asks for (None: none; ``"fails: ..."``)."""
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(statements)],
                         capture_output=True, text=True, timeout=600, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def deferred_imports(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """Every function-level import of an ``interp`` module: ``(module, line, statement)``.

    The statement is absolute (``from .x import y`` in ``interp.a.b`` is ``from interp.a.x
    import y``), as a fresh interpreter can run it.
    """
    out = []
    for name, (path, package) in _modules(root).items():
        here = name if package else name.rpartition(".")[0]
        seen: set[int] = set()
        for fn in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if id(node) in seen:  # an import in a nested function: counted once
                    continue
                if isinstance(node, ast.ImportFrom):
                    module = node.module or ""
                    if node.level:
                        base = here.split(".")[:len(here.split(".")) - node.level + 1]
                        module = ".".join(base + ([module] if module else []))
                    if module.split(".")[0] != "interp":
                        continue
                    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "")
                                      for a in node.names)
                    statement = f"from {module} import {names}"
                elif isinstance(node, ast.Import) and any(
                        a.name.split(".")[0] == "interp" for a in node.names):
                    statement = ast.unparse(node)
                else:
                    continue
                seen.add(id(node))
                out.append((name, node.lineno, statement))
    return sorted(out)


def lazy_names() -> list[tuple[str, str]]:
    """Each ``(package, name)`` that a package's ``__getattr__`` serves.

    The names of its ``__all__`` that importing it does not bind; the top package ``interp``
    is left out (module docstring).
    """
    code = """
import importlib, json, sys
out = []
for name in json.loads(sys.argv[1]):
    mod = importlib.import_module(name)
    out += [(name, n) for n in getattr(mod, "__all__", ()) if n not in vars(mod)]
print(json.dumps(out))
"""
    packages = [n for n, (p, _) in _modules().items() if n != "interp"
                and any(isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
                        for f in ast.parse(p.read_text(encoding="utf-8")).body)]
    out = subprocess.run([sys.executable, "-c", code, json.dumps(packages)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    return [tuple(x) for x in json.loads(out.stdout)]


def test_every_function_level_interp_import_hides_a_heavy_library():
    found = deferred_imports()
    asked = heavy_asked(sorted({s for _, _, s in found}))
    light = [f"{m}:{line}: {s} ({asked[s] or 'nothing heavy'})" for m, line, s in found
             if asked[s] is None or asked[s].startswith("fails")]
    assert not light, ("import these at module level (nothing heavy behind them):\n"
                       + "\n".join(light))


def test_every_lazily_served_name_hides_a_heavy_library():
    names = lazy_names()
    assert ("interp.store", "load_activations") in names  # the rule sees __getattr__ names
    statements = {f"from {pkg} import {n}": (pkg, n) for pkg, n in names}
    asked = heavy_asked(sorted(statements))
    light = [f"{s} ({asked[s] or 'nothing heavy'})" for s in statements
             if asked[s] is None or asked[s].startswith("fails")]
    assert not light, "import these with the package (nothing heavy behind them):\n" + "\n".join(
        light)


def test_the_rule_sees_function_level_and_relative_imports(tmp_path):
    pkg = tmp_path / "interp"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text(
        "from interp.core import errors\n"
        "def f():\n    from .b import x as y\n    import os\n"
        "    def g():\n        import interp.core.io\n")
    assert deferred_imports(pkg) == [("interp.sub.a", 3, "from interp.sub.b import x as y"),
                                     ("interp.sub.a", 6, "import interp.core.io")]


def test_the_probe_tells_a_heavy_import_from_a_light_one():
    asked = heavy_asked(["from interp.core.errors import ConfigError",
                         "from interp.models.loading import load_model",
                         "from interp.stages import STAGES",  # a lazy name: all the stages
                         "from interp.no_such_module import x"])
    assert asked["from interp.core.errors import ConfigError"] is None
    assert asked["from interp.models.loading import load_model"] in HEAVY
    assert asked["from interp.stages import STAGES"] in HEAVY
    assert asked["from interp.no_such_module import x"].startswith("fails: ModuleNotFoundError")
