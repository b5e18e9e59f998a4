"""Token strings for people: each character once, on the token where it completes.

Byte-level BPE (GPT-2, Llama 3, SmolLM2, Qwen2.5) splits a character of several UTF-8 bytes
(emoji, CJK) over several tokens. Decoding each token alone, as TransformerLens'
``to_str_tokens`` does, turns every such byte piece into U+FFFD, and the joined strings no
longer equal the text. :func:`token_strings` decodes incrementally instead (the streaming
detokenisation of Hugging Face's text-generation-inference, ``decode_token``): a token whose
bytes end inside a character gets ``""`` (a byte piece, :data:`PIECE`), and the token that
completes the character gets the whole character. The joined strings then equal
``tokenizer.decode(ids)`` for byte-level tokenizers.

Every place that shows token strings to a person (the attention viewer, the record stage's
tables, the patching tables and figures) uses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["PIECE", "token_strings"]

PIECE = ""
"""The string of a token that holds only leading bytes of a character (the character is shown
on the token that completes it)."""

_REPLACEMENT = "\ufffd"


def token_strings(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One display string per token id (module docstring).

    Algorithm: keep the ids since the last completed character (``pending``); decode
    ``pending + [id]``; if that text ends in U+FFFD and more ids follow, the character is not
    complete yet: the token's string is :data:`PIECE` and it joins ``pending``; otherwise the
    token's string is the whole decoded text and ``pending`` is emptied. A U+FFFD that the
    text really holds is shown where its bytes end (the joined strings are unchanged).

    Args:
        tokenizer: a Hugging Face tokenizer.
        ids: token ids ``[pos]``.

    Returns:
        ``[pos]`` strings; ``"".join(...)`` equals ``tokenizer.decode(ids)`` for byte-level
        BPE tokenizers (for SentencePiece tokenizers each completed group is decoded alone,
        as before).
    """
    out: list[str] = []
    pending: list[int] = []
    for k, i in enumerate(ids):
        pending.append(int(i))
        text = tokenizer.decode(pending)
        if text.endswith(_REPLACEMENT) and k + 1 < len(ids) and len(pending) < 4:
            out.append(PIECE)  # a UTF-8 character has at most 4 bytes
            continue
        out.append(text)
        pending = []
    return out
