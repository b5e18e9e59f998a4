"""Moved to :mod:`interp.hooks.backends` (issue 10).

Temporary re-export so that branches written against the old path (R1's attention code, the
attention benchmark) keep working until the merge; the lead deletes this file then.
"""

from interp.hooks.backends import attn_implementation, to_nnsight, to_tlens

__all__ = ["attn_implementation", "to_nnsight", "to_tlens"]
