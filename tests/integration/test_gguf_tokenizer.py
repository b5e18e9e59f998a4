"""GGUF tokenizer fidelity (issue 12 item 5).

The tokenizer built from a GGUF file is the one the file declares (``tokenizer.ggml.pre``),
checked against the file and against an independent llama.cpp-style encoder; files whose
pre-tokenizer cannot be reproduced are refused.
"""

from __future__ import annotations

import functools
import unicodedata

import pytest

from interp.core.errors import ModelSpecError
from interp.data import load_examples
from interp.models.gguf import (
    CACHE_VERSION,
    GGUFTokenizerMeta,
    apply_declared_pretokenizer,
    cached_checkpoint,
    read_tokenizer_meta,
    verify_tokenizer,
)
from interp.models.loading import bundled_gguf, load_model

pytestmark = pytest.mark.integration  # these tests read the bundled model files

SMOL = "smollm2-135m-instruct"
QWEN = "qwen2.5-coder-0.5b-instruct"


def _toks(tok, text):
    return tok.convert_ids_to_tokens(tok(text, add_special_tokens=False)["input_ids"])


def test_newlines_before_digits_smollm(smol_tok):
    """`smollm`: digits one by one, the newlines before them one token."""
    assert _toks(smol_tok, "\n\n2024") == ["ĊĊ", "2", "0", "2", "4"]
    assert _toks(smol_tok, "in 1066.\n\n12 men") == ["in", "Ġ", "1", "0", "6", "6", ".", "ĊĊ",
                                                 "1", "2", "Ġmen"]


def test_newlines_before_digits_qwen2(qwen_tok):
    """`qwen2`: the same for this string; NFC applied first (e + combining acute = é)."""
    assert _toks(qwen_tok, "\n\n2024") == ["ĊĊ", "2", "0", "2", "4"]
    assert qwen_tok("e\u0301t\u00e9", add_special_tokens=False)["input_ids"] == qwen_tok(
        "\u00e9t\u00e9", add_special_tokens=False)["input_ids"]


def test_special_ids_and_template_from_the_file(smol_tok, qwen_tok):
    """Special token ids and chat templates are the files'.

    Special token ids are the files' (SmolLM2: bos <|im_start|> 1, eos/pad <|im_end|> 2,
    unk <|endoftext|> 0; Qwen2.5: eos <|im_end|> 151645, bos/pad <|endoftext|> 151643).
    """
    s = smol_tok
    assert (s.bos_token_id, s.eos_token_id, s.pad_token_id, s.unk_token_id) == (1, 2, 2, 0)
    assert (smol_tok.bos_token, smol_tok.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (qwen_tok.bos_token_id, qwen_tok.eos_token_id, qwen_tok.pad_token_id) == (
        151643, 151645, 151643)
    assert qwen_tok.convert_ids_to_tokens([151644, 151645]) == ["<|im_start|>", "<|im_end|>"]
    assert "You are Qwen, created by Alibaba Cloud." in qwen_tok.chat_template
    assert "You are a helpful AI assistant named SmolLM" in smol_tok.chat_template


def test_cache_key_carries_the_version():
    """A change of what is cached (the declared pre-tokenizer: version 2) changes the key."""
    assert CACHE_VERSION == 2
    assert cached_checkpoint("ab" * 32, SMOL).name == f"{SMOL}-{'ab' * 6}-v2"


def _tiny_gguf(path, pre="smollm", merges=("a b", "ab c", "Ċ Ċ")):
    """A GGUF file with only a byte-level tokenizer (no weights)."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    tokens = ["a", "b", "c", "ab", "abc", "Ġ", "Ċ", "ĊĊ", "1", "2", "<|end|>", "<|endoftext|>"]
    w.add_token_list(tokens)
    w.add_token_types([1] * 10 + [3, 3])
    w.add_token_merges(list(merges))
    w.add_eos_token_id(10)
    w.add_bos_token_id(11)
    w.add_unk_token_id(11)
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_pretokenizer_refused_before_dequantising(tmp_path, monkeypatch):
    """An unknown pre-tokenizer is refused before any work.

    A GGUF whose pre-tokenizer interp cannot reproduce: one-line error naming it, and
    nothing written to the cache.
    """
    monkeypatch.setenv("INTERP_CACHE", str(tmp_path / "cache"))
    path = _tiny_gguf(tmp_path / "odd.gguf", pre="falcon")
    with pytest.raises(ModelSpecError, match=r"odd.gguf declares tokenizer 'gpt2' with "
                                             r"pre-tokenizer 'falcon'.*known: gpt2/smollm, "
                                             r"gpt2/qwen2") as err:
        load_model(str(path), device="cpu")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "cache" / "models").exists()


def test_apply_refuses_unknown_pair(smol_tok):
    with pytest.raises(ModelSpecError, match="'llama' with pre-tokenizer 'default'"):
        apply_declared_pretokenizer(smol_tok, "llama", "default")


def test_verify_catches_each_disagreement(tmp_path):
    """Each disagreement with the file is reported by name.

    The tiny file's rebuilt tokenizer passes; a changed token, merge order, special id or
    template in the metadata is reported by name.
    """
    from transformers import AutoTokenizer

    path = _tiny_gguf(tmp_path / "tiny.gguf")
    meta = read_tokenizer_meta(path)
    tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    apply_declared_pretokenizer(tok, meta.model, meta.pre)
    verify_tokenizer(tok, meta, "tiny.gguf")
    assert _toks(tok, "\n\n12abc") == ["ĊĊ", "1", "2", "abc"]

    def changed(**kw) -> GGUFTokenizerMeta:
        return GGUFTokenizerMeta(**{**meta.__dict__, **kw})

    cases = [(changed(tokens=meta.tokens[:4] + ["ba"] + meta.tokens[5:]), "token 4 is 'abc'"),
             (changed(merges=["ab c", "a b", "Ċ Ċ"]), "merge 0 is 'a b', the file says 'ab c'"),
             (changed(merges=meta.merges + ["b c"]), "merge 3 is None, the file says 'b c'"),
             (changed(special_ids={"eos": 9}), "eos_token_id is 10, the file says 9"),
             (changed(chat_template="x"), "chat template differs")]
    for bad, message in cases:
        with pytest.raises(ModelSpecError, match=message):
            verify_tokenizer(tok, bad, "tiny.gguf")


# --- an independent encoder: llama.cpp's split rules + byte-level BPE by merge rank --------

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA_CPP_SPLITS = {"smollm": [r"\p{N}", _GPT2], "qwen2": [_QWEN2]}  # llama-vocab.cpp


class ReferenceEncoder:
    """An encoder written from llama.cpp's rules, independent of `tokenizers`.

    Encode as llama.cpp does: split with each regex in turn (kept and unmatched pieces
    both stay), map bytes to GPT-2's unicode alphabet, merge by rank from the file's merges;
    NFC first for qwen2 (Qwen's own tokenizer).
    """

    def __init__(self, meta: GGUFTokenizerMeta):
        import regex

        self.regexes = [regex.compile(r) for r in _LLAMA_CPP_SPLITS[meta.pre]]
        self.nfc = meta.pre == "qwen2"
        self.vocab = {t: i for i, t in enumerate(meta.tokens)}
        self.ranks = {tuple(m.split(" ")): i for i, m in enumerate(meta.merges)}
        printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
        extra = iter(range(256, 512))
        self.byte_char = {b: chr(b if b in printable else next(extra)) for b in range(256)}

    def _split(self, text: str) -> list[str]:
        pieces = [text]
        for rx in self.regexes:
            out = []
            for p in pieces:
                pos = 0
                for m in rx.finditer(p):
                    out += [p[pos:m.start()]] if m.start() > pos else []
                    out.append(m.group())
                    pos = m.end()
                out += [p[pos:]] if pos < len(p) else []
            pieces = out
        return pieces

    @functools.lru_cache(maxsize=None)  # noqa: B019 - one encoder per test module
    def _bpe(self, word: str) -> tuple[int, ...]:
        parts = list(word)
        while len(parts) > 1:
            rank, i = min((self.ranks.get(pair, 1 << 30), i)
                          for i, pair in enumerate(zip(parts, parts[1:])))
            if rank == 1 << 30:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return tuple(self.vocab[p] for p in parts)

    def encode(self, text: str) -> list[int]:
        if self.nfc:
            text = unicodedata.normalize("NFC", text)
        return [i for piece in self._split(text)
                for i in self._bpe("".join(self.byte_char[b] for b in piece.encode()))]


@pytest.fixture(scope="module")
def smol_meta():
    return read_tokenizer_meta(bundled_gguf(SMOL))


@pytest.fixture(scope="module")
def qwen_meta():
    return read_tokenizer_meta(bundled_gguf(QWEN))


def _texts(dataset):
    examples = load_examples(dataset, include_unanswerable=True)
    return list(dict.fromkeys(e.context for e in examples)), [e.question for e in examples]


def test_bundled_tokenizers_match_their_files(smol_tok, qwen_tok, smol_meta, qwen_meta):
    """Vocabulary, merges, special ids, control tokens and chat template equal the files'."""
    assert (smol_meta.model, smol_meta.pre, qwen_meta.model, qwen_meta.pre) == (
        "gpt2", "smollm", "gpt2", "qwen2")
    assert (len(smol_meta.tokens), len(smol_meta.merges)) == (49152, 48900)
    assert (len(qwen_meta.tokens), len(qwen_meta.merges)) == (151936, 151387)
    verify_tokenizer(smol_tok, smol_meta, SMOL)
    verify_tokenizer(qwen_tok, qwen_meta, QWEN)


def test_smollm_matches_llama_cpp_on_bundled_texts(smol_tok, smol_meta):
    """SmolLM2 encodes bundled texts as llama.cpp's `smollm` rules do.

    Every HotpotQA / MuSiQue validation context and question encodes as llama.cpp's
    `smollm` rules do; GPT-2 splitting alone (what transformers built before) differs on
    107 of 585 HotpotQA and 34 of 150 MuSiQue contexts.
    """
    from copy import deepcopy

    from tokenizers import pre_tokenizers

    ref = ReferenceEncoder(smol_meta)
    plain = deepcopy(smol_tok)
    plain.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for dataset, n_ctx, n_changed in (("hotpotqa", 585, 107), ("musique", 150, 34)):
        contexts, questions = _texts(dataset)
        assert len(contexts) == n_ctx
        ours = smol_tok(contexts + questions, add_special_tokens=False)["input_ids"]
        assert [i for i, t in enumerate(contexts + questions) if ours[i] != ref.encode(t)] == []
        before = plain(contexts, add_special_tokens=False)["input_ids"]
        assert sum(a != b for a, b in zip(before, ours)) == n_changed


def test_qwen2_matches_llama_cpp_on_bundled_texts(qwen_tok, qwen_meta):
    """Qwen2.5 encodes bundled texts as llama.cpp's `qwen2` rules do.

    Every HotpotQA and MuSiQue validation context and question (transformers' own GGUF
    tokenizer agreed here too: the bundled texts are already NFC).
    """
    ref = ReferenceEncoder(qwen_meta)
    for dataset, n in (("musique", None), ("hotpotqa", None)):
        contexts, questions = _texts(dataset)
        texts = contexts[:n] + questions[:n]
        ours = qwen_tok(texts, add_special_tokens=False)["input_ids"]
        assert [i for i, t in enumerate(texts) if ours[i] != ref.encode(t)] == []
