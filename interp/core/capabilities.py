"""What a model can do: the one interface stages ask before they run on it.

A model is either loaded in this process (:class:`interp.models.loading.ModelHandle`: weights,
every hook point) or served behind an OpenAI-compatible endpoint
(:class:`interp.endpoints.client.Endpoint`, spec ``openai:MODEL``: replies and log-probs
only). Both answer :func:`capabilities`; each stage declares what it needs
(:attr:`interp.core.contract.StageSpec.model_needs`), and
:func:`interp.stages.common.check_capabilities` refuses a stage whose model lacks one, in one
line, before any model loads. The spec prefix is tested here and nowhere else.

======================  =====================================================  ========  ======
capability              what it gives                                          process   served
======================  =====================================================  ========  ======
``generate``            greedy answers to the generation prompt                yes       yes
``judge``               a verdict reply to the evaluation prompt               yes       yes
``forced_choice``       log-probabilities of both whole verdict replies        yes       yes [1]
``attention``           attention patterns at every layer and head             yes       no
``activations``         the residual stream and head outputs (hook points)     yes       no
``weights``             parameters to train (LoRA) or patch between models     yes       no
======================  =====================================================  ========  ======

[1] when the server returns log-probabilities (checked at preflight; a run records
``forced_choice`` as unavailable with its reason otherwise).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CAPABILITIES", "IN_PROCESS", "SERVED", "SERVED_PREFIX", "capabilities", "is_served"]

CAPABILITIES = ("generate", "judge", "forced_choice", "attention", "activations", "weights")
"""Every capability a stage may need, in the order of the table above."""
IN_PROCESS = frozenset(CAPABILITIES)
"""What a model loaded in this process can do: everything."""
SERVED = frozenset({"generate", "judge", "forced_choice"})
"""What a served model can do: its replies and their log-probabilities."""
SERVED_PREFIX = "openai:"
"""The spec prefix of a served model: ``openai:MODEL``."""


def is_served(spec: Any) -> bool:
    """Whether ``spec`` names a model served behind an endpoint (``openai:MODEL``)."""
    return isinstance(spec, str) and spec.startswith(SERVED_PREFIX)


def capabilities(spec: Any) -> frozenset[str]:
    """What the model ``spec`` names can do (:data:`SERVED` or :data:`IN_PROCESS`).

    Decided from the spec alone, so a config is checked before any model loads or any request
    is sent.
    """
    return SERVED if is_served(spec) else IN_PROCESS
