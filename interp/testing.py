"""Tiny random models and tiny tokenizers built in code, for unit tests, rehearsals and benchmarks.

Nothing here reads a file or the network: :func:`tiny_tokenizer` trains a small byte-level BPE
with the ``tokenizers`` library on a fixed in-code corpus and gives it a chat template of one of
two families (:data:`FAMILIES`): ChatML (the turn markers of SmolLM2 and Qwen2.5:
``<|im_start|>``, ``<|im_end|>``) or Llama 3.1 (``<|begin_of_text|>``, ``<|start_header_id|>``,
``<|end_header_id|>``, ``<|eot_id|>``, and the system header with the knowledge-cutoff and date
lines that Llama 3.1's template injects into every prompt). :func:`tiny_llama` builds a random
GQA ``LlamaForCausalLM`` (or, with ``arch="qwen2"``, a ``Qwen2ForCausalLM``: biases on q/k/v)
from a config sized to any tokenizer, and :func:`llama31_checkpoint` saves a Llama-3.1-shaped
random checkpoint (32 layers, GQA 4:1, Llama 3.1's rope scaling) as a local directory, the model
of the paper-configuration rehearsal (``tests/rehearsal``) and of ``benchmarks/gpu_check.sh``.
All are deterministic (same vocabulary, same weights for a seed), so tests that use them run
anywhere in seconds and need no model package (tuned-lens builds its test models the same way).

Algorithm of :func:`tiny_tokenizer`:

1. A byte-level pre-tokenizer (every byte is in the initial alphabet, so any text encodes and
   decodes back exactly) and a BPE model with the family's special tokens.
2. BPE merges learned from :data:`CORPUS` (template words, verdict words, a few facts) up to
   ``vocab_size`` entries, so prompts are a few times shorter than their byte count. Llama 3:
   the corpus also holds the bundled prompt templates' texts, so their words are single
   tokens as in Llama 3's 128k vocabulary (prompts about half as long: the 32-layer
   rehearsal runs correspondingly faster).
3. Llama 3 only: a post-processor that prepends ``<|begin_of_text|>`` when special tokens are
   added, as the real Llama 3 tokenizer does; its chat template ALSO starts with BOS, so code
   that tokenizes a rendered chat prompt with ``add_special_tokens=True`` gets two BOS tokens
   (the family-specific fault the rehearsal checks for).
4. Wrapped in ``transformers.PreTrainedTokenizerFast`` (offsets mapping, ``apply_chat_template``,
   ``save_pretrained``). ChatML: BOS ``<|im_start|>``, EOS and pad ``<|im_end|>``, UNK
   ``<|endoftext|>``. Llama 3: BOS ``<|begin_of_text|>``, EOS ``<|end_of_text|>`` (as Llama 3's
   base tokenizer: the end of turn ``<|eot_id|>`` is NOT the EOS token, so stopping at it must
   come from the chat template, :func:`interp.models.loading.end_of_turn_ids`), pad ``<|eot_id|>``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from interp.data import DATASETS, load_examples
from interp.data.loading import save_examples
from interp.judging.prompts import get_template, load_templates, render
from interp.models.loading import ModelHandle
from interp.store.rundir import RunDir

__all__ = ["CHAT_TEMPLATE", "CORPUS", "FAMILIES", "LLAMA3_CHAT_TEMPLATE", "LLAMA31_8B",
           "LLAMA31_ROPE_SCALING", "llama31_checkpoint", "llama31_standin", "mmap_large_blocks",
           "peak_rss_rise", "rehearsal_datasets", "synthetic_probe_run", "tiny_checkpoint",
           "tiny_llama", "tiny_tokenizer"]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, as SmolLM2's template but without its default system prompt."""

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\n\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\n' }}"
    "{{- 'Today Date: ' + date_string + '\n\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content']"
    " | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}"
)
"""Llama 3.1 Instruct's chat template without its tool-calling branches: BOS, a system header
that always carries the knowledge-cutoff and date lines (text the template injects, labelled
``template``), every message's content trimmed, ``<|eot_id|>`` after each turn."""

FAMILIES: dict[str, dict[str, Any]] = {
    "chatml": {"specials": ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
               "bos": "<|im_start|>", "eos": "<|im_end|>", "pad": "<|im_end|>",
               "unk": "<|endoftext|>", "template": CHAT_TEMPLATE, "add_bos": False},
    "llama3": {"specials": ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                            "<|end_header_id|>", "<|eot_id|>"),
               "bos": "<|begin_of_text|>", "eos": "<|end_of_text|>", "pad": "<|eot_id|>",
               "unk": None, "template": LLAMA3_CHAT_TEMPLATE, "add_bos": True},
}
"""Chat-template families of :func:`tiny_tokenizer`: special tokens, BOS/EOS/pad/UNK, the chat
template, and whether encoding with special tokens prepends BOS (module docstring, step 3)."""

LLAMA31_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""``rope_scaling`` of Llama-3.1-8B-Instruct's config.json (with ``rope_theta`` 500000)."""

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


def _template_texts() -> list[str]:
    """The bundled prompt templates' texts (every variant's system and user messages)."""
    return [" ".join((t.gen_system, t.gen_user, t.eval_system, t.eval_user))
            for t in load_templates().values()]


@functools.lru_cache(maxsize=8)
def _tokenizer_json(vocab_size: int, family: str = "chatml") -> str:
    fam = FAMILIES[family]
    corpus = list(CORPUS) + (_template_texts() * 4 if family == "llama3" else [])
    unk = fam["unk"]
    tok = Tokenizer(models.BPE(unk_token=unk) if unk else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(fam["specials"]),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    if fam["add_bos"]:
        bos = fam["bos"]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tok.token_to_id(bos))])
    return tok.to_str()


def tiny_tokenizer(vocab_size: int = 512, template: str = "chatml") -> Any:
    """A small byte-level BPE tokenizer with a chat template (module docstring).

    Args:
        vocab_size: target vocabulary size (256 bytes + the special tokens + merges; the corpus
            may support fewer merges, then the vocabulary is smaller).
        template: the chat-template family, a key of :data:`FAMILIES` (``chatml`` or
            ``llama3``).

    Returns:
        A ``transformers.PreTrainedTokenizerFast``; a new object on every call (callers may set
        attributes such as ``padding_side``), built from a cached definition.

    Raises:
        ValueError: an unknown template family.
    """
    if template not in FAMILIES:
        raise ValueError(f"unknown template family {template!r}; known: {sorted(FAMILIES)}")
    fam = FAMILIES[template]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_tokenizer_json(vocab_size, template)),
        bos_token=fam["bos"], eos_token=fam["eos"], pad_token=fam["pad"],
        **({"unk_token": fam["unk"]} if fam["unk"] else {}))
    tok.chat_template = fam["template"]
    return tok


def _config(tokenizer: Any, arch: str, **kw: Any) -> Any:
    """The transformers config of :func:`tiny_llama` (``kw``: shape and init settings)."""
    common = dict(
        vocab_size=kw.get("vocab_size") or len(tokenizer), hidden_size=kw["d_model"],
        intermediate_size=kw.get("intermediate_size") or 2 * kw["d_model"],
        num_hidden_layers=kw["n_layers"],
        num_attention_heads=kw["n_heads"], num_key_value_heads=kw["n_kv_heads"],
        max_position_embeddings=kw["max_positions"], rope_theta=kw["rope_theta"],
        initializer_range=kw["init_std"], tie_word_embeddings=kw.get("tied", False),
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, attn_implementation=kw["attn_implementation"],
        attention_dropout=kw["attention_dropout"])
    if kw["rope_scaling"]:
        common["rope_scaling"] = dict(kw["rope_scaling"])
    if kw.get("head_dim"):
        common["head_dim"] = kw["head_dim"]
    if arch == "llama":
        return LlamaConfig(**common), LlamaForCausalLM
    if arch == "qwen2":
        return Qwen2Config(**common), Qwen2ForCausalLM
    raise ValueError(f"unknown arch {arch!r}; use 'llama' or 'qwen2'")


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
    arch: str = "llama",
    rope_scaling: dict[str, Any] | None = None,
    rope_theta: float = 10000.0,
    max_positions: int = 4096,
    tied: bool = False,
    vocab_size: int | None = None,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> ModelHandle:
    """A tiny random GQA causal LM (``LlamaForCausalLM`` by default) built from a config.

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
        arch: ``llama`` or ``qwen2`` (Qwen2: biases on the q/k/v projections).
        rope_scaling: the config's ``rope_scaling`` (e.g. :data:`LLAMA31_ROPE_SCALING`).
        rope_theta: RoPE base.
        max_positions: ``max_position_embeddings``.
        tied: tie the unembedding to the embedding (``tie_word_embeddings``, as SmolLM2 does).
        vocab_size: rows of the embedding and unembedding (None: ``len(tokenizer)``); a
            larger one gives a model the memory of a big vocabulary whose extra tokens the
            tokenizer never produces.
        head_dim: width of one head (None: ``d_model // n_heads``).
        intermediate_size: MLP width (None: ``2 * d_model``).
        dtype: the weights' dtype, drawn in it (a bfloat16 model never holds a float32 copy).

    Returns:
        A :class:`interp.models.loading.ModelHandle` (spec ``"tiny-llama"`` or ``"tiny-qwen2"``,
        sha256 None, float32, CPU).

    Raises:
        ValueError: an unknown ``arch``.
    """
    cfg, cls = _config(tokenizer, arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, init_std=init_std,
                       attn_implementation=attn_implementation,
                       attention_dropout=attention_dropout, rope_scaling=rope_scaling,
                       rope_theta=rope_theta, max_positions=max_positions, tied=tied,
                       vocab_size=vocab_size, head_dim=head_dim,
                       intermediate_size=intermediate_size)
    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = cls(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    model.requires_grad_(False)
    spec = f"tiny-{arch}"
    info = {"spec": spec, "source": "random", "sha256": None, "revision": None,
            "n_layers": n_layers, "n_heads": n_heads, "n_kv_heads": n_kv_heads,
            "head_dim": head_dim or d_model // n_heads, "d_model": d_model,
            "dtype": str(dtype).removeprefix("torch."), "device": "cpu",
            "max_positions": max_positions}
    return ModelHandle(model=model, tokenizer=tokenizer, spec=spec, info=info)


def llama31_checkpoint(
    path: str | Path,
    *,
    n_layers: int = 32,
    d_model: int = 64,
    n_heads: int = 8,
    n_kv_heads: int = 2,
    seed: int = 0,
    vocab_size: int = 512,
    dtype: str = "bfloat16",
) -> Path:
    """Save a tiny random Llama-3.1-shaped checkpoint as a local directory (for rehearsals).

    The shape facts the paper's code paths depend on are Llama-3.1-8B-Instruct's: 32 decoder
    blocks (so the band ``24-31`` is the last eight), grouped-query attention 4:1 (8 query and
    2 key/value heads here, 32 and 8 there), ``rope_theta`` 500000 with
    :data:`LLAMA31_ROPE_SCALING`, ``max_position_embeddings`` 131072, untied embeddings, weights
    stored in bfloat16, and a Llama-3-style tokenizer and chat template (:func:`tiny_tokenizer`
    with ``template="llama3"``: ``<|begin_of_text|>`` added by both the template and the
    tokenizer's post-processor, ``<|eot_id|>`` ending each turn, EOS ``<|end_of_text|>``). Only
    the width and the vocabulary are tiny, and the weights are random
    (:func:`tiny_llama`, ``seed``). Used by ``tests/rehearsal`` and ``benchmarks/gpu_check.sh``
    (the GPU machine cannot receive the bundled GGUFs, so it builds this instead).

    Args:
        path: the directory to write (created; files in it are overwritten).
        n_layers: decoder blocks (32, as Llama-3.1-8B).
        d_model: residual width (tiny).
        n_heads: query heads per layer (8: GQA 4:1 with ``n_kv_heads`` 2).
        n_kv_heads: key/value heads per layer.
        seed: seed of the random weights.
        vocab_size: target vocabulary of the tiny BPE.
        dtype: ``torch_dtype`` of the saved weights (``bfloat16`` as Llama 3.1's, or
            ``float32``).

    Returns:
        ``path`` as a :class:`pathlib.Path`; ``interp.models.loading.load_model(str(path))`` loads
        it.
    """
    return tiny_checkpoint(path, template="llama3", arch="llama", n_layers=n_layers,
                           d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, seed=seed,
                           vocab_size=vocab_size, dtype=dtype, rope_scaling=LLAMA31_ROPE_SCALING,
                           rope_theta=500000.0, max_positions=131072)


LLAMA31_8B = {"d_model": 4096, "n_heads": 32, "n_kv_heads": 8, "head_dim": 128,
              "intermediate_size": 14336, "vocab_size": 128256, "rope_theta": 500000.0,
              "rope_scaling": LLAMA31_ROPE_SCALING, "max_positions": 131072, "tied": False}
"""Llama-3.1-8B(-Instruct)'s config.json in :func:`tiny_llama`'s terms (32 layers there)."""


def llama31_standin(n_layers: int = 4, *, narrow: int | None = None, seed: int = 0,
                    dtype: torch.dtype = torch.bfloat16) -> ModelHandle:
    """A random model with Llama-3.1-8B's configuration except the number of layers.

    :data:`LLAMA31_8B`: hidden 4,096, 32 query / 8 key-value heads of width 128, MLP 14,336,
    vocabulary 128,256 (untied), ``rope_theta`` 500,000 with :data:`LLAMA31_ROPE_SCALING`;
    Llama 3's chat template and special tokens through :func:`tiny_tokenizer`
    (``template="llama3"``, whose small BPE never produces the ids above its own 512). Weights
    are drawn in ``dtype`` with ``initializer_range`` 0.02 (Llama's), so a 4-layer bfloat16
    stand-in holds 3.6 GB of weights and never a float32 copy. The paper-shaped memory and
    time model of docs/performance.md is measured on it (``benchmarks/standin.py``).

    Args:
        n_layers: decoder blocks (32 in the real model).
        narrow: a smaller hidden and MLP width (``narrow`` and ``2 * narrow``) that keeps the
            vocabulary, the head layout (32 / 8 heads of width 128) and the rope scaling: the
            reduced stand-in of the memory-bound tests.
        seed: seed of the random weights.
        dtype: the weights' dtype (bfloat16, as Llama 3.1's checkpoint).

    Returns:
        A :class:`interp.models.loading.ModelHandle` on the CPU.
    """
    shape = dict(LLAMA31_8B)
    if narrow:
        shape.update(d_model=int(narrow), intermediate_size=2 * int(narrow))
    return tiny_llama(tiny_tokenizer(template="llama3"), n_layers=n_layers, seed=seed,
                      init_std=0.02, dtype=dtype, **shape)


def mmap_large_blocks(threshold: int = 2**20) -> bool:
    """Make glibc serve every allocation of ``threshold`` bytes or more by ``mmap``.

    Such a block goes back to the system when it is freed, so the resident set size follows
    the live tensors; by default glibc raises its threshold up to 32 MiB as blocks are freed,
    and a later tensor below it reuses freed heap memory without raising the RSS. Process-wide
    and lasting; used by :func:`peak_rss_rise`'s callers (memory tests, benchmarks).

    Returns:
        Whether the setting took (False where the C library is not glibc).
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(-3, int(threshold)))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


def peak_rss_rise(fn: Callable[[], Any], every_s: float = 0.002) -> tuple[Any, float]:
    """Call ``fn`` and measure its peak resident memory above the memory before it.

    A thread reads ``VmRSS`` from ``/proc/self/status`` every ``every_s`` seconds while
    ``fn`` runs (torch releases the GIL in its kernels). A peak shorter than the interval can
    be missed, so the result is a lower bound of the true peak: good for asserting that
    memory grew at least so much, and, after :func:`mmap_large_blocks` (freed tensors go back
    to the system, later ones cannot hide in them), for asserting it stayed within a budget.

    Returns:
        ``(fn's result, peak rise in MiB)``.

    Raises:
        OSError: no ``/proc/self/status`` (Linux only).
    """
    def rss() -> float:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise OSError("no VmRSS in /proc/self/status")

    base = rss()
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(every_s)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out = fn()
        peak[0] = max(peak[0], rss())
    finally:
        done.set()
        t.join()
    return out, peak[0] - base


def tiny_checkpoint(path: str | Path, *, template: str = "chatml", arch: str = "llama",
                    vocab_size: int = 512, dtype: str = "float32", **shape: Any) -> Path:
    """Save a tiny random model and its tokenizer as a local checkpoint directory.

    :func:`tiny_tokenizer` (``vocab_size``, ``template``) and :func:`tiny_llama` (``arch`` and
    ``shape``: ``n_layers``, ``d_model``, ``n_heads``, ``n_kv_heads``, ``seed``,
    ``rope_scaling``, ``rope_theta``, ``max_positions``, ...), written with
    ``save_pretrained``; :func:`interp.models.loading.load_model` loads it as a local directory.

    Args:
        path: the directory (created; files in it are overwritten).
        template: chat-template family (:data:`FAMILIES`).
        arch: ``llama`` or ``qwen2``.
        vocab_size: target vocabulary of the tiny BPE.
        dtype: ``torch_dtype`` of the saved weights (``float32`` or ``bfloat16``).
        **shape: keyword arguments of :func:`tiny_llama`.

    Returns:
        ``path`` as a :class:`pathlib.Path`.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer(vocab_size, template=template)
    handle = tiny_llama(tok, arch=arch, **shape)
    model = handle.model.to({"bfloat16": torch.bfloat16, "float32": torch.float32}[dtype])
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def rehearsal_datasets(out_dir: str | Path, n: int = 3, max_chars: int | None = 200,
                       names: tuple[str, ...] | None = None) -> dict[str, str]:
    """Write ``n`` bundled validation records of each dataset as JSONL files (rehearsal data).

    The records are the first ``n`` of :func:`interp.data.load_examples` (one per passage),
    with each context cut to its first ``max_chars`` characters (at a word boundary), so a
    32-layer rehearsal of every stage runs in about a minute on a CPU; the code paths do not
    depend on the length, and the ids, questions, answers and extras are the records' own.
    Each file keeps its dataset's name in its records, so the runs group them as usual.

    Args:
        out_dir: folder for ``<name>.jsonl`` (created).
        n: records per dataset.
        max_chars: longest context kept (None: whole contexts).
        names: datasets (default: all of :data:`interp.data.DATASETS`).

    Returns:
        ``{dataset name: path}``, the ``datasets`` argument of
        :func:`interp.run.pipeline.swap_sources`.
    """
    from dataclasses import replace

    out = {}
    for name in names or DATASETS:
        exs = []
        for ex in load_examples(name, limit=n):
            ctx = ex.context
            if max_chars and len(ctx) > max_chars:
                ctx = ctx[:max_chars].rsplit(" ", 1)[0]
            exs.append(replace(ex, context=ctx))
        out[name] = str(save_examples(exs, Path(out_dir) / f"{name}.jsonl"))
    return out


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
