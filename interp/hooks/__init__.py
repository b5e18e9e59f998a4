"""Reading, editing and recording activations at hook points, and the backends that run them.

* :mod:`interp.hooks.capture`: residual-stream / per-head output capture and in-place edits
  (activation patching) through PyTorch hooks, removed in a ``finally`` whatever raises.
* :mod:`interp.hooks.recorder`: the exact last-row attention recorder (an ``AttentionInterface``
  function).
* :mod:`interp.hooks.steering`: the attention intervention (``log(alpha)`` on a span's keys in
  the last query row, an ``AttentionInterface`` function beside the recorder's; and the same
  through TransformerLens's ``hook_attn_scores``).
* :mod:`interp.hooks.backends`: hf / transformer_lens / nnsight behind one protocol.

The hook-point names themselves (TransformerLens style, the only place module paths are
written) are a fact of the architecture: :mod:`interp.models.points`.
"""
