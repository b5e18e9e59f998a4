"""Shared fixtures.

* ``tokenizer``: the bundled SmolLM2 tokenizer (chat template included).
* ``tiny``: a tiny random GQA Llama built from a config with that tokenizer (unit tests).
* ``bundled``: the bundled SmolLM2-135M-Instruct, float32 on CPU (integration tests).
* ``quick_run``: a finished asymmetry run of the bundled model on a few real records
  (3 SQuAD 2.0 + 3 HotpotQA), shared by the integration tests of later stages. Tests must not
  modify it; copy it (``shutil.copytree``) to write into it.
* ``smol_tok`` / ``qwen_tok``: the two bundled models' tokenizers alone, no weights loaded.
"""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(max(1, torch.get_num_threads()))


@pytest.fixture(scope="session")
def bundled():
    from interp.models import load_model

    return load_model("smollm2-135m-instruct", device="cpu", dtype="float32")


@pytest.fixture(scope="session")
def tokenizer(bundled):
    return bundled.tokenizer


@pytest.fixture(scope="session")
def tiny(tokenizer):
    from interp.models import tiny_llama

    return tiny_llama(tokenizer, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, seed=0)


@pytest.fixture(scope="session")
def quick_run(bundled, tmp_path_factory):
    from interp.asymmetry import AsymmetryConfig, run_asymmetry
    from interp.store import RunDir

    out = tmp_path_factory.mktemp("quick_run")
    cfg = AsymmetryConfig(datasets=["squad_v2", "hotpotqa"], limit=3, batch_size=3, n_boot=200)
    run_asymmetry(cfg, out, handle=bundled, log=lambda s: None)
    return RunDir(out)


@pytest.fixture(scope="session")
def smol_tok():
    """The bundled SmolLM2 tokenizer alone (from the cached checkpoint; no weights loaded)."""
    from interp.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_tok():
    """The bundled Qwen2.5-Coder-0.5B-Instruct tokenizer alone (no weights loaded)."""
    from interp.models import load_tokenizer

    return load_tokenizer("qwen2.5-coder-0.5b-instruct")
