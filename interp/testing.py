"""Tiny random models and a tiny tokenizer built in code, for unit tests and benchmarks.

Nothing here reads a file or the network: :func:`tiny_tokenizer` trains a small byte-level BPE
with the ``tokenizers`` library on a fixed in-code corpus and gives it a ChatML chat template
(the same turn markers as SmolLM2: ``<|im_start|>``, ``<|im_end|>``); :func:`tiny_llama` builds a
random GQA ``LlamaForCausalLM`` from a config sized to any tokenizer. Both are deterministic
(same vocabulary, same weights for a seed), so tests that use them run anywhere in seconds and
need no model package (tuned-lens builds its test models the same way).

Algorithm of :func:`tiny_tokenizer`:

1. A byte-level pre-tokenizer (every byte is in the initial alphabet, so any text encodes and
   decodes back exactly) and a BPE model with ``<|endoftext|>``, ``<|im_start|>`` and
   ``<|im_end|>`` as special tokens.
2. BPE merges learned from :data:`CORPUS` (template words, verdict words, a few facts) up to
   ``vocab_size`` entries, so prompts are a few times shorter than their byte count.
3. Wrapped in ``transformers.PreTrainedTokenizerFast`` (offsets mapping, ``apply_chat_template``,
   ``save_pretrained``): BOS ``<|im_start|>``, EOS and pad ``<|im_end|>``, UNK ``<|endoftext|>``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from interp.models import ModelHandle
from interp.prompts import get_template, render
from interp.store import RunDir

__all__ = ["CHAT_TEMPLATE", "CORPUS", "synthetic_probe_run", "tiny_llama", "tiny_tokenizer"]

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, as SmolLM2's template but without its default system prompt."""

CORPUS = (
    "You answer questions about a context. Reply with only the answer: a short phrase copied "
    "from the context, not a sentence.",
    "Context: Question: Answer using only the context. Respond concisely, with just the answer.",
    "You are a grader. You reply with exactly one word: Correct or Incorrect.",
    "Proposed answer: Reference answer: Judge whether the proposed answer is correct given the "
    'context. Reply with exactly "Correct" or "Incorrect".',
    "Correct. Incorrect. The answer is correct. The answer is incorrect.",
    "The Eiffel Tower is in Paris. It was finished in 1889. When was the Eiffel Tower finished?",
    "The city of Paris is the capital of France. Rome, Berlin, Madrid and Lyon are cities too.",
    "Rollo founded Normandy in 911. The Normans were a people in Normandy. Who founded it?",
    "Water boils at 100 degrees Celsius at sea level. 3.5 million people live there.",
    "Who, what, when, where, which, how many, how much? The first, second and third.",
    "Gustave Eiffel's company built it in 1889, not 1890. Paris, Lyon, Rome: France.",
)
"""The text the tiny BPE learns its merges from (fixed: the vocabulary never changes)."""


@functools.lru_cache(maxsize=4)
def _tokenizer_json(vocab_size: int) -> str:
    tok = Tokenizer(models.BPE(unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(CORPUS), trainer=trainer)
    return tok.to_str()


def tiny_tokenizer(vocab_size: int = 512) -> Any:
    """A small byte-level BPE tokenizer with a ChatML chat template (module docstring).

    Args:
        vocab_size: target vocabulary size (256 bytes + 3 special tokens + merges; the corpus
            may support fewer merges, then the vocabulary is smaller).

    Returns:
        A ``transformers.PreTrainedTokenizerFast``; a new object on every call (callers may set
        attributes such as ``padding_side``), built from a cached definition.
    """
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size)),
        bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
        unk_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama(
    tokenizer: Any,
    *,
    n_layers: int = 2,
    d_model: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    seed: int = 0,
    init_std: float = 0.2,
    attn_implementation: str = "sdpa",
    attention_dropout: float = 0.0,
) -> ModelHandle:
    """A tiny random ``LlamaForCausalLM`` (GQA) built from a config, for unit tests.

    ``init_std`` is large by default so that logits are peaked and greedy decoding is not
    decided by float noise between equal candidates.

    Args:
        tokenizer: any Hugging Face tokenizer; the vocabulary is ``len(tokenizer)``.
        n_layers: decoder blocks.
        d_model: residual width (``d_model % n_heads == 0``).
        n_heads: query heads per layer.
        n_kv_heads: key/value heads per layer (GQA; ``n_heads % n_kv_heads == 0``).
        seed: ``torch.manual_seed`` before the weights are drawn.
        init_std: ``initializer_range`` of the config.
        attn_implementation: the model's attention kernel.
        attention_dropout: dropout on the attention weights in training mode (tests of the
            eval-mode guard, :func:`interp.hooks.guard.inference_guard`).

    Returns:
        A :class:`interp.models.ModelHandle` (spec ``"tiny-llama"``, sha256 None, float32, CPU).
    """
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=d_model, intermediate_size=2 * d_model,
        num_hidden_layers=n_layers, num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
        max_position_embeddings=4096, rope_theta=10000.0, initializer_range=init_std,
        tie_word_embeddings=False, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        attn_implementation=attn_implementation, attention_dropout=attention_dropout,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    model.requires_grad_(False)
    info = {"spec": "tiny-llama", "source": "random", "sha256": None, "revision": None,
            "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv_heads,
            "head_dim": d_model // n_heads, "d_model": d_model, "dtype": "float32",
            "device": "cpu", "max_positions": 4096}
    return ModelHandle(model=model, tokenizer=tokenizer, spec="tiny-llama", info=info)


GOOD = ("Paris", "Rome", "Berlin", "Madrid")
BAD = ("banana", "seven", "blue sky", "a dog")


def synthetic_probe_run(path: str | Path, handle: ModelHandle, n_good: int = 9,
                        n_bad: int = 15) -> RunDir:
    """A run directory whose y* is decided by the candidate word (a signal a probe can find).

    Record ``k`` (``n_good`` correct ones first) asks about a made-up fact; its candidate is a
    city from :data:`GOOD` (y* Correct) or a word from :data:`BAD` (y* Incorrect); datasets
    alternate between ``hotpotqa`` and ``squad_v2``; the verdicts come from an acquiescent judge
    (Correct with probability 0.8, record 3 unparseable) and ``p_correct`` is uniform noise (the
    whole-reply verdict score fields are consistent with it, at ``verdict_coverage`` 0.5).
    The prompts' spans are rendered with ``handle.tokenizer``, so the run re-renders exactly.

    Args:
        path: the run directory to create.
        handle: the model the run claims (its spec and tokenizer).
        n_good: records with y* Correct.
        n_bad: records with y* Incorrect.

    Returns:
        The :class:`interp.store.RunDir` (manifest and records written).
    """
    tpl = get_template("default")
    run = RunDir(path)
    run.init_manifest({"model": handle.spec, "templates_path": None}, model_info=handle.info)
    rng = np.random.default_rng(0)
    recs = []
    for k in range(n_good + n_bad):
        good = k < n_good
        ans = (GOOD if good else BAD)[k % 4]
        ctx = f"Fact {k}: the city of {GOOD[k % 4]} is large." + " It rains." * int(k % 3)
        q = f"Which city is in fact {k}?"
        gp = render(handle.tokenizer, tpl, "gen", context=ctx, question=q, reference=ans)
        ep = render(handle.tokenizer, tpl, "eval", context=ctx, question=q, answer=ans,
                    reference=ans)
        verdict = bool(rng.random() < 0.8)
        p = float(rng.random())
        recs.append({"id": f"ex{k}", "dataset": "squad_v2" if k % 2 else "hotpotqa",
                     "question": q, "context": ctx, "answers": [ans], "answerable": True,
                     "status": "ok", "model": handle.spec, "template": "default",
                     "generation": ans, "answer": ans, "oracle_label": good,
                     "verdict": verdict if k != 3 else None,
                     "verdict_source": "word" if k != 3 else "none",
                     "verdict_text": ("Correct" if verdict else "Incorrect") if k != 3 else "",
                     "logprob_correct": float(np.log(0.5 * p)),
                     "logprob_incorrect": float(np.log(0.5 * (1 - p))),
                     "logit_diff": float(np.log(p / (1 - p))), "p_correct": p,
                     "verdict_coverage": 0.5,
                     "prompts": {"gen": gp.to_record(), "eval": ep.to_record()}})
    run.append_records(recs)
    return run
