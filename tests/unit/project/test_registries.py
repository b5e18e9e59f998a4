"""Every registry is declared where it lives and complete in a fresh interpreter.

A table that some other module fills when it is imported is complete only after that import,
so a check made before it refuses a valid name (``--oracle openai:M`` once did). Each case
imports the registry's home alone, in a fresh interpreter, looks up every declared entry, and
reports which heavy or higher modules the lookup imported; an entry that lives in a higher
room is declared by name (``"module:object"``, ``StageSpec.module``) and resolved on first use.
tests/unit/project/test_layout.py refuses a module-level write into another module's table.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys

CASES = {
    "oracle kinds": """
from interp.judging.grading import ORACLE_KINDS, oracle_builder, parse_oracle_spec
forms = {k: f"{k}:x" if takes else k for k, (takes, _) in ORACLE_KINDS.items()}
out["parsed"] = sorted(str(parse_oracle_spec(f)) for f in forms.values())
out["loaded_by_parsing"] = loaded()
out["builders"] = sorted(k for k in ORACLE_KINDS if callable(oracle_builder(k)))
""",
    "prompt templates": """
from interp.judging.prompts import get_pairwise_template, get_template, load_templates
names = sorted(load_templates())
out["templates"] = [get_template(n).name for n in names] == names and len(names) > 1
out["pairwise"] = get_pairwise_template().name
out["loaded_by_parsing"] = loaded()
""",
    "stages": """
from interp.core.contract import SPECS, check_module
shared = [s for s in SPECS if s.config_module == "interp.stages.configs"]
out["configs"] = [s.name for s in shared if isinstance(s.config_class, type)]
out["loaded_by_parsing"] = loaded()
out["configs"] = sorted(out["configs"] + [s.name for s in SPECS if s not in shared
                                          and isinstance(s.config_class, type)])
out["loaded_by_other_configs"] = loaded()
import interp.stages as stages
out["listed"] = sorted(set(stages.__all__) & {s.name for s in SPECS})
for s in SPECS:
    check_module(s)  # imports the stage's module: run, format_summary, its config
out["modules"] = sorted(s.name for s in SPECS if s.module in sys.modules)
""",
    "hook points": """
from interp.models.points import HEAD_POINTS, HOOK_POINTS, hook_name, parse_hook
out["points"] = [parse_hook(hook_name(1, p), 2)[1] for p in HOOK_POINTS] == list(HOOK_POINTS)
out["head_points"] = set(HEAD_POINTS) <= set(HOOK_POINTS)
out["loaded_by_parsing"] = loaded()
""",
    "public API": """
import interp
out["loaded_by_parsing"] = loaded()
out["resolved"] = sorted(n for n, home in interp.API.items()
                         if getattr(interp, n) is getattr(sys.modules[home], n))
""",
}

PROBE = """
import json, sys
WATCH = ("torch", "transformers", "numpy", "httpx", "interp.endpoints.oracle",
         "interp.stages.asymmetry", "interp.methods", "interp.hooks")
def loaded():
    return sorted(w for w in WATCH if w in sys.modules)
out = {}
exec(sys.argv[1])
print(json.dumps(out))
"""


@functools.lru_cache(maxsize=None)
def _fresh(case: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, CASES[case]], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _stage_names() -> list[str]:
    from interp.core.contract import SPECS

    return sorted(s.name for s in SPECS)


def test_oracle_kinds_are_complete_in_a_fresh_interpreter():
    """``parse_oracle_spec("openai:x")`` with nothing imported but the registry's home."""
    got = _fresh("oracle kinds")
    assert got == {"parsed": ["model:x", "openai:x", "rule"], "loaded_by_parsing": [],
                   "builders": ["model", "openai", "rule"]}


def test_prompt_templates_are_complete_in_a_fresh_interpreter():
    assert _fresh("prompt templates") == {"templates": True, "pairwise": "pairwise",
                                          "loaded_by_parsing": []}


def test_stages_are_complete_in_a_fresh_interpreter():
    """Each stage's config without its module; each module, declared by name, on first use."""
    got = dict(_fresh("stages"))
    names = _stage_names()
    assert got == {"configs": names, "loaded_by_parsing": [], "loaded_by_other_configs": [],
                   "listed": names, "modules": names}


def test_every_stage_config_loads_without_torch():
    """``interp transfer --bad-option`` refuses before torch loads, like every stage."""
    assert _fresh("stages")["loaded_by_other_configs"] == []


def test_hook_points_are_complete_in_a_fresh_interpreter():
    assert _fresh("hook points") == {"points": True, "head_points": True,
                                     "loaded_by_parsing": []}


def test_the_public_api_is_complete_in_a_fresh_interpreter():
    import interp

    got = _fresh("public API")
    assert got == {"loaded_by_parsing": [], "resolved": sorted(interp.API)}


def test_the_run_directory_layout_names_every_stage_folder():
    import re

    import interp.store
    from interp.core.contract import SPECS

    listed = set(re.findall(r"DIR/(\w+)/", interp.store.__doc__))
    assert {s.folder for s in SPECS if s.folder} <= listed
