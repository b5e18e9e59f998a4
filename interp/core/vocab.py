"""The values options may take, known before any model or heavy library loads.

Each name has its home here and is re-exported by the module whose method it names (e.g.
:data:`interp.hooks.recorder.BACKENDS`), so a config is checked, and a bad value refused in
one line, without importing torch or transformers.
"""

from __future__ import annotations

__all__ = ["ALPHAS", "ATTENTION_BACKENDS", "DEFAULT_MODEL", "DETECTOR_FEATURES", "EXACT_MODES",
           "MAX_REASONING_TOKENS", "MIN_GAP", "PAIR_KINDS", "POOLS", "PROBES", "VERDICT_WORDS"]

DEFAULT_MODEL = "smollm2-135m-instruct"
"""The model a command uses when none is named (the bundled SmolLM2-135M-Instruct)."""
ATTENTION_BACKENDS = ("hf", "eager", "transformer_lens", "nnsight")
"""Recorder backends: ``hf`` (exact rows inside the attention function) and the check paths."""
POOLS = ("last", "candidate", "mean", "max", "min")
"""The pools of :func:`interp.judging.residual_features.pool_resid`."""
MAX_REASONING_TOKENS = 192
"""Default token budget of a reasoning reply (:mod:`interp.judging.reasoning`, step 1)."""
ALPHAS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
"""The default grid of attention factors (docs/stages.md, steer)."""
PAIR_KINDS = ("candidate-swap", "gen-to-eval", "eval-to-gen", "system-prompt-control")
"""Clean/corrupt pair kinds of activation patching (:mod:`interp.methods.pairs`)."""
EXACT_MODES = ("topk", "all")
"""``topk``: AtP* (attribution, then exact top-k); ``all``: every unit exactly."""
PROBES = ("logreg", "svm", "mlp")
"""Probe kinds of :mod:`interp.methods.probing`."""
DETECTOR_FEATURES = ("lookback_ratio", "context", "candidate")
"""Per-head features the audit's detector may use (the band is not applied: ``detector_layers``)."""

MIN_GAP = 1.0
"""Pairs whose ``|LD_clean - LD_corrupt|`` is under this many nats are left out of patching
summaries (``interp patch --min-gap``) and get no normalised effect from
:func:`interp.methods.patching.patch`."""
VERDICT_WORDS = ("Correct", "Incorrect")
"""The two replies the eval prompt asks for, in the order of every score array
(:mod:`interp.judging.verdict`)."""
