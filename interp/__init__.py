"""interp: is an LLM a better judge than a generator, and what happens inside it when it judges?

A mechanistic-interpretability toolkit for the task asymmetry between generation and
self-evaluation on in-context QA (Bandyopadhyay 2026, arXiv 2606.28050): GA/EA harness,
last-token attention span mass, activation patching, steering, LoRA transfer and probes.

The package is laid out in rooms by role (docs/architecture.md); the names a user needs first
are re-exported here and load on first use, so ``import interp`` imports no torch::

    from interp import HookedModel, case, load_examples
    model = HookedModel.from_pretrained("smollm2-135m-instruct")
    logits, cache = model.run_with_cache(case(model.tokenizer, load_examples("squad_v2")[0]).gen)
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

API: dict[str, str] = {
    # data and prompts
    "load_examples": "interp.data",
    "QAExample": "interp.data",
    "get_template": "interp.judging.prompts",
    "render": "interp.judging.prompts",
    # models and their internals
    "HookedModel": "interp.hooks.model",
    "ActivationCache": "interp.hooks.cache",
    "case": "interp.judging.cases",
    "Case": "interp.judging.cases",
    "load_model": "interp.models.loading",
    "ModelHandle": "interp.models.loading",
    "record_rows": "interp.hooks.recorder",
    "parse_layers": "interp.core.layers",
    # judging and the studies' methods
    "RuleOracle": "interp.judging.grading",
    "evaluate_examples": "interp.methods.asymmetry",
    "group_metrics": "interp.methods.asymmetry",
    "span_mass": "interp.analysis.span_mass",
    "span_names": "interp.analysis.span_mass",
    "patch": "interp.methods.patching",
    "Patch": "interp.methods.patching",
    "Patcher": "interp.methods.patching",
    "align_positions": "interp.methods.pairs",
    "steer_judge": "interp.methods.steering",
    "steer_generator": "interp.methods.steering",
    "parse_heads": "interp.core.layers",
    # the run directory
    "RunDir": "interp.store",
    "Record": "interp.store",
    "load_activations": "interp.store",
    "load_cache": "interp.hooks.cache",
}
"""The public names importable from ``interp`` itself: name -> the module that defines it (its
one home, which docs/api-reference.md documents)."""

__all__ = ["API", "__version__", *API]


def __getattr__(name: str) -> Any:
    """Load a re-exported name (:data:`API`) from its home module on first use."""
    if name in API:
        value = getattr(importlib.import_module(API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'interp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API))
