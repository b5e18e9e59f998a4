"""errors, layers, hooks.points and the store's atomic writers / freshness signatures."""

from __future__ import annotations

import json
import re

import pytest

from interp.core.errors import ConfigError, HookError, InterpError, LayerSpecError
from interp.core.io import atomic_path, is_fresh, read_jsonl, signature, write_json, write_jsonl
from interp.core.layers import check_layer_syntax, parse_layers
from interp.models.points import HOOK_POINTS, decoder_layers, hook_name, parse_hook, resolve
from interp.store.records import limit_per_dataset


@pytest.mark.parametrize("spec,n,want", [
    ("all", 4, [0, 1, 2, 3]),
    ("last8", 30, list(range(22, 30))),
    ("last8", 32, list(range(24, 32))),
    ("24-31", 32, list(range(24, 32))),
    ("-8--1", 32, list(range(24, 32))),
    ("0,4,-1", 30, [0, 4, 29]),
    ("0-2, 10", 12, [0, 1, 2, 10]),
    (" LAST2 ", 5, [3, 4]),
    ([3, -1, 3], 5, [3, 4]),
    (2, 5, [2]),
    (None, 32, list(range(24, 32))),
])
def test_parse_layers_grammar(spec, n, want):
    assert parse_layers(spec, n) == want


@pytest.mark.parametrize("spec", ["24-31", "31", "last31", "last0", "3-1", "x", "", "1,,2", []])
def test_parse_layers_refuses_with_the_valid_range(spec):
    with pytest.raises(LayerSpecError) as err:
        parse_layers(spec, 30)
    assert isinstance(err.value, InterpError)
    assert "0-29" in str(err.value) or "cannot parse" in str(err.value)


@pytest.mark.parametrize("spec", ["all", "last8", " LAST40 ", "24-31", "-8--1", "3--1",
                                  "0,4,-1", "99", 5, [3, -1], None])
def test_layer_syntax_accepts_the_grammar_without_the_model(spec):
    check_layer_syntax(spec)  # a layer outside a model is parse_layers' to refuse


@pytest.mark.parametrize(("spec", "said"), [
    ("lats8", "cannot parse 'lats8'"), ("last0", "lastK needs K >= 1"), ("", "empty"),
    ("1,,2", "cannot parse ''"), ("3-1", "range 3-1 is empty"), ("-1--3", "range -1--3"),
    ("3-x", "cannot parse '3-x'"), ([], "not a layer selection"), (True, "not a layer"),
    (["1"], "not a layer selection"), (1.5, "not a layer selection")])
def test_layer_syntax_refuses_what_no_model_could_parse(spec, said):
    with pytest.raises(LayerSpecError, match=re.escape(said)):
        check_layer_syntax(spec)
    if isinstance(spec, str):  # the model-aware parser refuses it too
        with pytest.raises(LayerSpecError):
            parse_layers(spec, 30)


def test_model_spec_check_needs_no_torch_and_names_the_nearest_alias(tmp_path, monkeypatch):
    from interp.core.errors import ModelSpecError
    from interp.models.files import check_model_spec

    assert check_model_spec("SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert check_model_spec("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m-instruct"
    assert check_model_spec("meta-llama/Llama-3.1-8B-Instruct@main") == (
        "meta-llama/Llama-3.1-8B-Instruct@main")  # a hub id: no network asked
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text("{}")
    assert check_model_spec(str(tmp_path / "ck")) == str(tmp_path / "ck")
    for spec, said in (("smollm2-135m-instrct", "unknown model spec 'smollm2-135m-instrct' "
                                                "(did you mean 'smollm2-135m-instruct'?)"),
                       ("zzz", "unknown model spec 'zzz': use a bundled alias"),
                       (str(tmp_path), "is a directory without config.json"),
                       (str(tmp_path / "gone"), "does not exist: a model path"),
                       ("a/b/c", "a/b/c does not exist"),
                       (str(tmp_path / "m.gguf"), "m.gguf does not exist")):
        with pytest.raises(ModelSpecError, match=re.escape(said)):
            check_model_spec(spec)


def test_hook_points_resolve_on_tiny_llama(tiny):
    m = tiny.model
    assert len(decoder_layers(m)) == tiny.n_layers
    mod, site = resolve(m, "blocks.-1.attn.hook_z")
    assert mod is m.model.layers[tiny.n_layers - 1].self_attn.o_proj
    assert (site.layer, site.io) == (tiny.n_layers - 1, "input")
    mod, site = resolve(m, "blocks.0.hook_resid_post")
    assert mod is m.model.layers[0] and site.io == "output"
    assert parse_hook(hook_name(1, "hook_mlp_out"), 2) == (1, "hook_mlp_out")
    orders = [resolve(m, f"blocks.0.{p}")[1].order for p in HOOK_POINTS]
    assert orders == sorted(orders)
    for bad in ("blocks.2.hook_resid_pre", "blocks.0.hook_nope", "layers.0.hook_resid_pre"):
        with pytest.raises(HookError):
            resolve(m, bad)


def test_atomic_path_keeps_old_file_on_error(tmp_path):
    p = tmp_path / "a.json"
    write_json(p, {"x": 1})
    with pytest.raises(RuntimeError), atomic_path(p) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed")
    assert json.loads(p.read_text()) == {"x": 1}
    assert [q.name for q in tmp_path.iterdir()] == ["a.json"]


def test_signature_and_freshness(tmp_path):
    sig = signature({"model": "m", "layers": [1, 2], "x": float("nan")})
    assert sig == signature({"layers": [1, 2], "x": None, "model": "m"})
    assert sig != signature({"model": "m", "layers": [1, 3]})
    p = tmp_path / "part.json"
    assert not is_fresh(p, sig)
    write_json(p, {"meta": {"signature": sig}, "rows": []})
    assert is_fresh(p, sig) and not is_fresh(p, "0" * 16)
    write_jsonl(tmp_path / "r.jsonl", [{"a": 1}, {"a": float("nan")}])
    assert read_jsonl(tmp_path / "r.jsonl") == [{"a": 1}, {"a": None}]


def test_limit_per_dataset():
    recs = [{"dataset": d, "id": i} for i, d in enumerate("aabab")]
    assert [r["id"] for r in limit_per_dataset(recs, 1)] == [0, 2]
    assert limit_per_dataset(recs, None) == recs
    with pytest.raises(ConfigError):
        limit_per_dataset(recs, 0)


def test_hooked_reads_edits_and_always_removes_hooks(tiny):
    import torch

    from interp.hooks.capture import hooked

    m = tiny.model
    ids = torch.tensor([[1, 5, 9, 3, 7]])
    base = m(input_ids=ids).logits
    names = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.-1.attn.hook_z"]
    with hooked(m, cache=names) as acts:
        again = m(input_ids=ids, output_hidden_states=True)
    assert torch.equal(again.logits, base)
    hs = again.hidden_states
    assert torch.allclose(acts["blocks.0.hook_resid_pre"], hs[0])
    assert torch.allclose(acts["blocks.0.hook_resid_post"], hs[1])
    assert acts["blocks.-1.attn.hook_z"].shape == (1, 5, tiny.n_heads, 64 // tiny.n_heads)
    # an edit that zeroes the last layer's heads changes the logits; a bad name registers nothing
    with hooked(m, edits={"blocks.-1.attn.hook_z": torch.zeros_like}):
        assert not torch.allclose(m(input_ids=ids).logits, base)
    counts = [len(mod._forward_hooks) + len(mod._forward_pre_hooks) for mod in m.modules()]
    with pytest.raises(HookError), hooked(m, cache=["blocks.0.hook_resid_pre", "blocks.9.x"]):
        pass
    with pytest.raises(RuntimeError), hooked(m, cache=["blocks.0.hook_resid_pre"]):
        raise RuntimeError("killed mid-run")
    assert [len(mod._forward_hooks) + len(mod._forward_pre_hooks) for mod in m.modules()] \
        == counts
    assert torch.equal(m(input_ids=ids).logits, base)


def test_limit_per_dataset_per_label_and_max_tokens():
    """``per_label`` counts per (dataset, y*); ``max_tokens`` drops long records before counting."""
    def rec(i, d, lab, n):
        return {"id": i, "dataset": d, "oracle_label": lab,
                "prompts": {"gen": {"n_tokens": n - 5}, "eval": {"n_tokens": n}}}

    recs = [rec(0, "a", False, 100), rec(1, "a", False, 100), rec(2, "a", True, 900),
            rec(3, "a", True, 200), rec(4, "b", False, 50)]
    assert [r["id"] for r in limit_per_dataset(recs, 1)] == [0, 4]
    assert [r["id"] for r in limit_per_dataset(recs, 1, per_label=True)] == [0, 2, 4]
    assert [r["id"] for r in limit_per_dataset(recs, 1, per_label=True, max_tokens=500)
            ] == [0, 3, 4]
    assert [r["id"] for r in limit_per_dataset(recs, None, max_tokens=100)] == [0, 1, 4]
    with pytest.raises(ConfigError, match="max_tokens"):
        limit_per_dataset(recs, 1, max_tokens=0)


def test_atomic_writers_leave_files_with_the_modes_a_plain_open_gives(tmp_path):
    """The safetensors library creates its file 0600; results are shared like the rest."""
    import os

    import torch

    from interp.core.io import save_tensors, write_json
    from interp.methods.lens import TunedLens

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    want = plain.stat().st_mode & 0o777
    save_tensors(tmp_path / "t.safetensors", {"x": torch.zeros(2)})
    write_json(tmp_path / "s.json", {"a": 1})
    TunedLens(2, 4).save(tmp_path / "lens.safetensors", {"signature": "s"})
    for name in ("t.safetensors", "s.json", "lens.safetensors"):
        assert os.stat(tmp_path / name).st_mode & 0o777 == want, name
    assert TunedLens.load(tmp_path / "lens.safetensors").weight.shape[0] == 2
