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
"""

from __future__ import annotations

import pytest
import torch

from interp.testing import tiny_llama
from interp.testing import tiny_tokenizer as make_tiny_tokenizer

torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return make_tiny_tokenizer()


@pytest.fixture(scope="session")
def bundled():
    from interp.models import load_model

    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32")


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
    from interp.stages.asymmetry import AsymmetryConfig, run
    from interp.store import RunDir

    out = tmp_path_factory.mktemp("quick_run")
    cfg = AsymmetryConfig(datasets=["squad_v2", "hotpotqa"], limit=3, batch_size=3, n_boot=200)
    run(cfg, out, handle=bundled, log=lambda s: None)
    return RunDir(out)
