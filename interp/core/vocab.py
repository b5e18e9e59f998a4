"""The values options may take, known before any model or heavy library loads.

Each name has its home here and is re-exported by the module whose method it names (e.g.
:data:`interp.hooks.backends.BACKENDS`), so a config is checked, and a bad value refused in
one line, without importing torch or transformers.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ALPHAS", "BACKENDS", "BACKEND_OFFERS", "BACKEND_SPELLINGS", "DEFAULT_MODEL",
           "DETECTOR_FEATURES", "EXACT_MODES", "MAX_REASONING_TOKENS", "MIN_GAP", "PAIR_KINDS",
           "POOLS", "PROBES", "VERDICT_WORDS", "attention_backend", "check_backend"]

DEFAULT_MODEL = "smollm2-135m-instruct"
"""The model a command uses when none is named (the bundled SmolLM2-135M-Instruct)."""
BACKEND_OFFERS: dict[str, tuple[str, ...]] = {
    "hf": ("attn", "exact_rows", "gradients", "steering"),
    "transformer_lens": ("steering",),
    "nnsight": (),
}
"""The backends of :mod:`interp.hooks.backends`, each with what it offers beyond the protocol
they all answer (a patched forward of full prompts, its verdict score, full patterns):
``attn`` another attention kernel (``eager``: ``output_attentions``, the exact recorder's
check path), ``exact_rows`` the exact last-row recorder and the activations recorded with it
(:mod:`interp.hooks.recorder`), ``gradients`` gradients and key/value prefixes (attribution
patching, the patching sweeps), ``steering`` attention steering of the verdict position
(:mod:`interp.methods.steering`)."""
BACKENDS = tuple(BACKEND_OFFERS)
"""The backend names, one per backend, used by every command and API (``hf`` the reference)."""
BACKEND_SPELLINGS = {"eager": ("hf", "eager")}
"""Other values ``[attention] backend`` (``interp attention --backend``) accepts -> ``(backend,
attn)``: ``eager`` is the ``hf`` backend under eager attention, a check of the exact recorder."""
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


def check_backend(backend: str, error: Callable[[str], Exception], *, attn: str | None = None,
                  needs: str | None = None, what: str = "") -> None:
    """Refuse a backend name, an ``attn`` or a need the backend does not offer, in one line.

    Args:
        backend: a name of :data:`BACKENDS`.
        error: what raises, called with the message: an error class (``BackendError``) or a
            stage's factory (``StageError.of("steering")``).
        attn: an attention kernel asked for (``hf`` only).
        needs: a feature of :data:`BACKEND_OFFERS` the caller needs.
        what: what needs it, for the message (default: the feature's name).

    Raises:
        error: an unknown name (lists the valid ones; for a spelling of
            :data:`BACKEND_SPELLINGS`, what to write instead), or a backend without ``attn`` /
            ``needs`` (names the backends that offer it).
    """
    if backend not in BACKEND_OFFERS:
        hint = ""
        if backend in BACKEND_SPELLINGS:
            b, a = BACKEND_SPELLINGS[backend]
            hint = f" (for {backend!r} write backend={b!r}, attn={a!r})"
        raise error(f"unknown backend {backend!r}; valid: {list(BACKENDS)}{hint}")
    wanted = [("attn", f"attn={attn!r}")] if attn is not None else []
    wanted += [(needs, what or needs)] if needs else []
    for feature, label in wanted:
        if feature not in BACKEND_OFFERS[backend]:
            offer = " or ".join(repr(b) for b, f in BACKEND_OFFERS.items() if feature in f)
            raise error(f"{label}: the {offer} backend only, not {backend!r}")


def attention_backend(value: str, error: Callable[[str], Exception]) -> tuple[str, str | None]:
    """The ``(backend, attn)`` of a value of ``[attention] backend`` (:data:`BACKEND_SPELLINGS`).

    Raises:
        error: neither a name of :data:`BACKENDS` nor of :data:`BACKEND_SPELLINGS` (lists both).
    """
    if value in BACKEND_SPELLINGS:
        return BACKEND_SPELLINGS[value]
    if value not in BACKEND_OFFERS:
        raise error(f"unknown backend {value!r}; use one of "
                    f"{list(BACKENDS) + list(BACKEND_SPELLINGS)}")
    return value, None
