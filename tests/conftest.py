"""Shared fixtures.

* ``tiny_tokenizer``: a small byte-level BPE tokenizer with a ChatML chat template, built in
  code (:func:`interp.testing.tiny_tokenizer`): unit tests load no file.
* ``tiny``: a tiny random GQA Llama (2 layers, 4 query / 2 key-value heads, d_model 64) built
  from a config with that tokenizer (:func:`interp.testing.tiny_llama`).
* ``bundled``: the bundled SmolLM2-135M-Instruct, float32 on CPU (integration tests).
* ``tokenizer``: the bundled model's tokenizer (integration tests only).
* ``quick_run``: a finished asymmetry run of the bundled model on a few real records
  (3 SQuAD 2.0 + 3 HotpotQA), shared by the integration tests of later stages. Tests must not
  modify it; copy it (``shutil.copytree``) to write into it.
* ``qwen``: the bundled Qwen2.5-Coder-0.5B-Instruct, float32 on CPU (integration tests).
* ``smol_tok`` / ``qwen_tok``: the two bundled models' tokenizers alone, no weights loaded.

The bundled models, their tokenizers and ``quick_run`` are session-scoped: loaded once per
test process and shared, so a test must not change their weights, hooks or files; a test that
must do so builds its own (and says so in its docstring).

Tiers: every test outside ``tests/unit`` is marked ``slow`` here, by folder (and with its
folder's name: ``equivalence``, ``integration``, ``golden``, ``rehearsal``), so
``pytest -m "not slow"`` is the unit tier of ``make check`` and ``pytest -m slow`` the rest of
``make test`` (docs/development.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from interp.testing import tiny_llama
from interp.testing import tiny_tokenizer as make_tiny_tokenizer

TESTS = Path(__file__).resolve().parent
SLOW_FOLDERS = ("equivalence", "integration", "golden", "rehearsal")


def _folder(item) -> str | None:
    try:
        return Path(str(item.fspath)).resolve().relative_to(TESTS).parts[0]
    except ValueError:                          # not under tests/ (the tutorial notebook)
        return None


def _notebook(item) -> bool:
    return str(item.fspath).endswith(".ipynb")


def pytest_collection_modifyitems(config, items):
    """Mark each test by its folder: ``slow`` and the folder's name outside ``tests/unit``.

    The docs' notebooks (collected with ``--nbmake``) are ``slow`` too, so ``make test`` runs
    them in the same worker pool as the other slow tests. The rehearsal's tests go first, then
    the notebooks: the rehearsal's module fixture (every stage of the paper config) is the
    longest single item and each notebook a long one, so with worker processes (``make
    test``: ``pytest -n``) they start while the other worker takes the rest, instead of
    running last, alone.
    """
    for item in items:
        if (folder := _folder(item)) in SLOW_FOLDERS:
            item.add_marker(pytest.mark.slow)
            item.add_marker(getattr(pytest.mark, folder))
        elif _notebook(item):
            item.add_marker(pytest.mark.slow)
    # stable: the order is kept otherwise
    items.sort(key=lambda item: (_folder(item) != "rehearsal", not _notebook(item)))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def bundled():
    from interp.models.loading import load_model

    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def qwen():
    from interp.models.loading import load_model

    return load_model("qwen2.5-coder-0.5b-instruct", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tokenizer(bundled):
    return bundled.tokenizer


# R2: tests/test_patching.py and tests/test_transfer.py feed the bundled tokenizer's ids to
# `tiny`; until R2 moves them onto `tiny_tokenizer` they get the tiny Llama built on it.
_BUNDLED_TOKENIZER_MODULES = {"test_patching", "test_transfer"}


@pytest.fixture(scope="module")
def tiny(request, tiny_tokenizer):
    tok = tiny_tokenizer
    if request.module.__name__.rsplit(".", 1)[-1] in _BUNDLED_TOKENIZER_MODULES:
        tok = request.getfixturevalue("tokenizer")
    return tiny_llama(tok, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=0)
# end R2


@pytest.fixture(scope="session")
def quick_run(bundled, tmp_path_factory):
    """Study 1 of the bundled model on 3 SQuAD 2.0 + 3 HotpotQA records, run once per test run.

    Under pytest-xdist every worker shares one copy: the first to ask runs it in the
    session's common temporary folder while holding a file lock, the others wait and reuse it
    (the pattern of pytest-xdist's documentation, "Making session-scoped fixtures execute
    only once"). Read-only for tests: copy it (``shutil.copytree``) to write into it.
    """
    from filelock import FileLock

    from interp.stages.asymmetry import AsymmetryConfig, run
    from interp.store.rundir import RunDir

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                      # common to every worker of this run
    out = root / "quick_run"
    with FileLock(str(root / "quick_run.lock")):
        if not (root / "quick_run.done").exists():
            cfg = AsymmetryConfig(datasets=["squad_v2", "hotpotqa"], limit=3, batch_size=3,
                                  n_boot=200)
            run(out, bundled, cfg, log=lambda s: None)
            (root / "quick_run.done").touch()
    return RunDir(out)


# R2 fixtures (patching, pairs, transfer, lora tests) ------------------------------------------

EIFFEL_CONTEXT = ("The Eiffel Tower is in Paris. It was built in 1889 by Gustave Eiffel's "
                  "company.")
EIFFEL_QUESTION = "Who built the Eiffel Tower?"


@pytest.fixture(scope="module")
def patch_prompts(tokenizer):
    """Eval prompts of one question with a right (clean) and a wrong (corrupt) candidate."""
    from interp.judging.prompts import get_template, render

    tpl = get_template()
    clean = render(tokenizer, tpl, "eval", context=EIFFEL_CONTEXT, question=EIFFEL_QUESTION,
                   answer="Paris")
    corrupt = render(tokenizer, tpl, "eval", context=EIFFEL_CONTEXT, question=EIFFEL_QUESTION,
                     answer="Lyon")
    return clean, corrupt


@pytest.fixture()
def toy_records():
    """Four ``ok`` records of one dataset sharing a passage.

    The model's own answers are wrong for r1 and r2, right for r3 and r4.
    """
    base = [("r1", "Gustave Eiffel's company", "Paris", False),
            ("r2", "1889", "1890", False),
            ("r3", "Paris", "Paris", True),
            ("r4", "France", "France", True)]
    qs = {"r1": EIFFEL_QUESTION, "r2": "When was the Eiffel Tower built?",
          "r3": "Where is the Eiffel Tower?", "r4": "In which country is the Eiffel Tower?"}
    return [{"id": rid, "dataset": "toy", "status": "ok", "context": EIFFEL_CONTEXT,
             "question": qs[rid], "answers": [gold], "answerable": True, "answer": own,
             "oracle_label": ok, "model": "tiny-llama", "template": "default"}
            for rid, gold, own, ok in base]


@pytest.fixture()
def qa_example():
    """Factory of training-split examples: ``qa_example(i, answer, context=...)``."""
    from interp.data import QAExample

    def make(i: int, ans: str, ctx: str = "Some context.") -> QAExample:
        return QAExample(id=f"r{i}", dataset="squad_v2", context=ctx, question=f"Question {i}?",
                         answers=(ans,), answerable=True, split="train")
    return make


@pytest.fixture()
def lora_cfg():
    """Factory of small, fast transfer configs: ``lora_cfg(**overrides)``."""
    from interp.stages.transfer import TransferConfig

    def make(**kw) -> TransferConfig:
        base = dict(rank=4, alpha=8, dropout=0.0, lr=1e-2, epochs=2, train_batch_size=2,
                    warmup_steps=1, checkpoint_every=1, max_length=256, seed=3)
        return TransferConfig(**{**base, **kw})
    return make


@pytest.fixture(scope="session")
def smol_tok():
    """The bundled SmolLM2 tokenizer alone (from the cached checkpoint; no weights loaded)."""
    from interp.models.loading import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_tok():
    """The bundled Qwen2.5-Coder-0.5B-Instruct tokenizer alone (no weights loaded)."""
    from interp.models.loading import load_tokenizer

    return load_tokenizer("qwen2.5-coder-0.5b-instruct")
