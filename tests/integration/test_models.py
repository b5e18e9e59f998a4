"""The bundled model's provenance."""

from __future__ import annotations

import json

import pytest

from interp.models import bundled_gguf, sha256_file

pytestmark = pytest.mark.integration


def test_bundled_provenance(bundled):
    """The bundled model's manifest facts: GGUF sha256, GQA shape from DESIGN.md."""
    info = bundled.info
    assert info["sha256"] == sha256_file(bundled_gguf())
    assert (info["n_layers"], info["n_heads"], info["n_kv_heads"], info["head_dim"]) == (
        30, 9, 3, 64)
    json.dumps(info)  # JSON-safe for the manifest
