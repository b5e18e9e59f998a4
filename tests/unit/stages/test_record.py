"""``interp record``: the stream writer, span-to-span attention, the stage and its loader."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from interp.analysis.span_mass import LAST, span_to_span
from interp.core.errors import ConfigError, LayerSpecError, RunDirError, StageError
from interp.core.io import is_tmp_path
from interp.hooks.cache import load_cache
from interp.hooks.recorder import record_stream
from interp.judging.prompts import get_template, render
from interp.stages import record as stage
from interp.store.recordings import load_activations, recording_index_path
from interp.store.shards import TensorStreamWriter, nbytes, plan_shards
from interp.testing import synthetic_probe_run, tiny_llama

# -- the stream writer ------------------------------------------------------------------------


def test_stream_writer_writes_slices_in_any_order_into_a_standard_file(tmp_path):
    a = torch.arange(60, dtype=torch.float32).reshape(5, 3, 4)
    b = torch.linspace(-3, 3, 7).to(torch.bfloat16)
    c = torch.tensor(2.5, dtype=torch.float16)
    path = tmp_path / "x.safetensors"
    with TensorStreamWriter(path, [("a", a.shape, a.dtype), ("b", b.shape, b.dtype),
                                   ("c", (), c.dtype)], {"signature": "s1"}) as w:
        w.write("b", b)
        w.write("a", a[3:], 3)
        assert not path.exists()  # nothing visible before close
        w.write("a", a[:3])
        w.write("c", c)
    got = load_file(str(path))
    assert torch.equal(got["a"], a) and torch.equal(got["b"], b) and got["c"].item() == 2.5
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"signature": "s1"}
    assert path.stat().st_size == w.nbytes
    assert [p.name for p in tmp_path.iterdir()] == ["x.safetensors"]


def test_stream_writer_refuses_bad_slices_and_leaves_nothing_behind(tmp_path):
    path = tmp_path / "y.safetensors"
    w = TensorStreamWriter(path, [("a", (4, 2), torch.float32)])
    with pytest.raises(RunDirError, match="expects"):
        w.write("a", torch.zeros(2, 3))
    with pytest.raises(RunDirError, match="expects"):
        w.write("a", torch.zeros(2, 2, dtype=torch.float16))
    w.write("a", torch.zeros(2, 2))
    with pytest.raises(RunDirError, match="twice"):
        w.write("a", torch.zeros(1, 2), 1)
    with pytest.raises(RunDirError, match="not fully written"):
        w.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KeyError):
        with TensorStreamWriter(path, [("a", (1,), torch.float32)]) as w2:
            w2.write("a", torch.zeros(1))
            raise KeyError("boom")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RunDirError, match="repeated name"):
        TensorStreamWriter(path, [("a", (1,), torch.float32), ("a", (1,), torch.float32)])


def test_plan_shards_bounds_each_shard_and_never_splits_a_tensor():
    specs = [(f"t{i}", (10, 10), torch.float32) for i in range(5)]  # 400 bytes each
    specs.insert(2, ("big", (100, 10), torch.float32))  # 4000 bytes
    shards = plan_shards(specs, 1000)
    assert [[n for n, _, _ in s] for s in shards] == [["t0", "t1"], ["big"], ["t2", "t3"],
                                                      ["t4"]]
    assert all(sum(nbytes(s, d) for _, s, d in sh) <= 1000 for sh in shards if len(sh) > 1)
    assert nbytes((3, 5), torch.bfloat16) == 30


def test_tmp_names_are_recognised():
    assert is_tmp_path(".eval-00001-of-00002.safetensors.123.ab12cd34.tmp.safetensors")
    assert not is_tmp_path("eval-00001-of-00002.safetensors")


# -- span-to-span -----------------------------------------------------------------------------


def test_span_to_span_by_hand():
    labels = ["template", "context", "context", "question", "template"]
    p = torch.tensor([[1.0, 0, 0, 0, 0],
                      [0.5, 0.5, 0, 0, 0],
                      [0.2, 0.2, 0.6, 0, 0],
                      [0.1, 0.3, 0.2, 0.4, 0],
                      [0.1, 0.1, 0.1, 0.3, 0.4]])
    s = span_to_span(p[None], labels)[0]  # query spans: context question candidate template last
    spans = ["context", "question", "candidate", "template"]
    want = torch.tensor([[(0.5 + 0.8) / 2, 0, 0, (0.5 + 0.2) / 2],  # context rows 1, 2
                         [0.5, 0.4, 0, 0.1],  # question row 3
                         [math.nan] * 4,  # no candidate in this prompt
                         [0, 0, 0, 1.0],  # template: row 0 only (the last row is 'last')
                         [0.2, 0.3, 0, 0.5]])  # last row 4
    assert s.shape == (len(spans) + 1, len(spans))
    torch.testing.assert_close(s, want, equal_nan=True)
    torch.testing.assert_close(s[[0, 1, 3, 4]].sum(-1), torch.ones(4))
    with pytest.raises(StageError, match="span_to_span needs"):
        span_to_span(p[:, :4], labels)
    assert LAST == "last"


# -- the stage on a tiny run ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny3(tiny_tokenizer):
    return tiny_llama(tiny_tokenizer, n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, seed=1)


@pytest.fixture()
def run3(tiny3, tmp_path):
    return synthetic_probe_run(tmp_path / "run", tiny3, n_good=2, n_bad=1)


def _cfg(**kw):
    return stage.RecordConfig(**{"dtype": "float32", "band": "all", "figures": False, **kw})


def test_config_refuses_bad_values_before_any_work():
    for kw, msg in (({"what": "attention,mlp"}, "what"), ({"what": []}, "what"),
                    ({"positions": "first"}, "positions"), ({"dtype": "int8"}, "dtype"),
                    ({"shard_mb": 0}, "shard_mb")):
        with pytest.raises(ConfigError, match=msg):
            stage.RecordConfig(**kw)
    with pytest.raises(ConfigError, match="unknown config keys"):
        stage.RecordConfig.from_mapping({"layer": "all"})
    assert stage.RecordConfig(what="z, resid").what == ["z", "resid"]


def test_query_positions():
    labels = ["template", "context", "context", "template", "question", "template"]
    assert stage.query_positions(labels, "all") == [0, 1, 2, 3, 4, 5]
    assert stage.query_positions(labels, "last") == [5]
    assert stage.query_positions(labels, "spans") == [1, 2, 4, 5]


def test_record_stream_sends_layer_after_layer(tiny3, tiny_tokenizer):
    p = render(tiny_tokenizer, get_template(), "eval", context="Paris is in France.",
               question="Where is Paris?", answer="France")
    seen = []
    record_stream(tiny3, p.input_ids, lambda n, s, v: seen.append((n, s, tuple(v.shape))),
                  layers=[0, 2])
    n, h = len(p), tiny3.n_heads
    assert seen == [(f"blocks.{x}.{pt}", 0, shape) for x in (0, 2) for pt, shape in (
        ("hook_resid_pre", (n, 64)), ("attn.hook_pattern", (h, n, n)),
        ("attn.hook_z", (n, h, 16)), ("hook_resid_post", (n, 64)))]
    with pytest.raises(StageError, match="cannot send"):
        record_stream(tiny3, p.input_ids, lambda *a: None, layers=[0], points=["hook_mlp_out"])


def test_stage_writes_shards_index_and_loads_by_hook_name(tiny3, run3):
    summary = stage.run(run3, tiny3, _cfg(shard_mb=0.02), log=lambda s: None)
    rec = run3.read_records()[0]
    part_path = recording_index_path(run3, rec["dataset"], rec["id"])
    folder = part_path.parent
    shards = sorted(p.name for p in folder.glob("eval-*.safetensors"))
    assert len(shards) > 1 and shards[-1].endswith(f"-of-{len(shards):05d}.safetensors")
    a = load_activations(run3, rec["id"], "eval", "blocks.-1.attn.hook_pattern")
    n = rec["prompts"]["eval"]["n_tokens"]
    assert a.tensor.shape == (4, n, n) and a.tensor.dtype == torch.float32
    assert a.layers == [2] and len(a.tokens) == len(a.labels) == n == len(a.positions)
    assert a.labels.count("candidate") > 0 and a.tokens[0] == "<|im_start|>"
    torch.testing.assert_close(a.tensor.sum(-1), torch.ones(4, n))
    stacked = load_activations(run3, rec["id"], "gen", "hook_resid_post")
    assert stacked.tensor.shape == (3, rec["prompts"]["gen"]["n_tokens"], 64)
    cache = load_cache(run3, rec["id"], "eval", ["blocks.0.attn.hook_z", "attn.hook_pattern"])
    assert cache["blocks.0.attn.hook_z"].shape == (1, n, 4, 16)
    # the same cache type and keys as run_with_cache, shorthand and span mass included
    assert cache["z", 0] is cache["blocks.0.attn.hook_z"] and cache.n_layers == 3
    assert sorted(cache) == ["blocks.0.attn.hook_pattern", "blocks.0.attn.hook_z",
                             "blocks.1.attn.hook_pattern", "blocks.2.attn.hook_pattern"]
    torch.testing.assert_close(cache["pattern", -1][0], a.tensor)
    ctx = [i for i, lab in enumerate(a.labels) if lab == "context"]
    want = float(a.tensor[:, -1, ctx].sum(-1).double().mean())
    assert cache.span_mass("context", [2]) == pytest.approx(want, abs=1e-7)
    # span-to-span stored at recording time = span_to_span of the stored full pattern
    s2s = load_file(str(folder / "span_to_span.safetensors"))["eval"]
    torch.testing.assert_close(s2s[2], span_to_span(a.tensor, a.labels), equal_nan=True)
    s = summary["span_to_span"]
    assert s["query_spans"][-1] == "last" and s["overall"]["n"] == 3
    assert s["overall"]["gen"]["mean"][s["query_spans"].index("candidate")] == [None] * 4
    # the gen prompt has no candidate: its key column is n/a too, not a measured 0.00
    ci = s["key_spans"].index("candidate")
    assert [row[ci] for row in s["overall"]["gen"]["mean"]] == [None] * len(s["query_spans"])
    assert all(row[ci] is not None for row in s["overall"]["eval"]["mean"])
    assert all(v is not None for i, row in enumerate(s["overall"]["gen"]["mean"])
               if i != s["query_spans"].index("candidate") for j, v in enumerate(row) if j != ci)
    assert summary["bytes_per_record"] > 3 * 4 * n * n * 4  # at least the eval patterns
    idx = __import__("pandas").read_parquet(run3.path / "record" / "index.parquet")
    assert len(idx) == 3 * 2 * 3 * 4  # records x tasks x layers x hooks
    with pytest.raises(RunDirError, match="was not recorded"):
        load_activations(run3, rec["id"], "eval", "blocks.0.hook_mlp_out")
    with pytest.raises(RunDirError, match="has no ok record .nope."):
        load_activations(run3, "nope", "eval", "blocks.0.hook_resid_pre")


def test_positions_and_dtypes_select_the_same_numbers(tiny3, run3, tmp_path):
    stage.record(run3, tiny3, _cfg(), log=lambda s: None)
    rec = run3.read_records()[1]
    full = {h: load_activations(run3, rec["id"], "eval", h).tensor
            for h in ("blocks.1.attn.hook_pattern", "blocks.1.hook_resid_pre")}
    for positions in ("last", "spans"):
        stage.record(run3, tiny3, _cfg(positions=positions, layers="1"), log=lambda s: None)
        a = load_activations(run3, rec["id"], "eval", "blocks.1.attn.hook_pattern")
        torch.testing.assert_close(a.tensor, full["blocks.1.attn.hook_pattern"][:, a.positions])
        r = load_activations(run3, rec["id"], "eval", "blocks.1.hook_resid_pre")
        torch.testing.assert_close(r.tensor, full["blocks.1.hook_resid_pre"][a.positions])
        assert a.positions[-1] == len(a.labels) - 1
    assert len(a.positions) == sum(lab != "template" for lab in a.labels) + 1
    for dtype, tol in (("float16", 1e-3), ("bfloat16", 1e-2)):
        stage.record(run3, tiny3, _cfg(dtype=dtype, what="attention"), log=lambda s: None)
        got = load_activations(run3, rec["id"], "eval", "blocks.1.attn.hook_pattern").tensor
        assert got.dtype == stage.DTYPES[dtype]
        torch.testing.assert_close(got.float(), full["blocks.1.attn.hook_pattern"], atol=tol,
                                   rtol=0)


def test_resume_keeps_fresh_records_and_redo_leaves_no_stale_shards(tiny3, run3):
    cfg = _cfg(shard_mb=0.02)
    assert stage.record(run3, tiny3, cfg, log=lambda s: None) == 3
    assert stage.record(run3, tiny3, cfg, log=lambda s: None) == 0
    rec = run3.read_records()[0]
    folder = recording_index_path(run3, rec["dataset"], rec["id"]).parent
    before = len(list(folder.glob("*.safetensors")))
    (folder / "stray.safetensors.1.ab.tmp.safetensors").write_bytes(b"x")
    assert stage.record(run3, tiny3, _cfg(shard_mb=10), log=lambda s: None) == 3
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["eval-00001-of-00001.safetensors", "gen-00001-of-00001.safetensors",
                     "index.json", "span_to_span.safetensors"]
    assert before > len(files)
    # a missing shard makes the record stale again
    (folder / "gen-00001-of-00001.safetensors").unlink()
    assert stage.record(run3, tiny3, _cfg(shard_mb=10), log=lambda s: None) == 1


def test_float16_overflow_is_refused(tiny3, run3):
    big = tiny_llama(tiny3.tokenizer, n_layers=3, d_model=64, n_heads=4, n_kv_heads=2, seed=1)
    big.model.model.embed_tokens.weight.data *= 1e6
    with pytest.raises(RunDirError, match="overflows"):
        stage.record(run3, big, stage.RecordConfig(what="resid", band="all"),
                     log=lambda s: None)
    leftovers = [p for p in (run3.path / "record").rglob("*") if p.is_file()]
    assert leftovers == []


def test_bad_layers_fail_before_recording(tiny3, run3):
    with pytest.raises(LayerSpecError):
        stage.record(run3, tiny3, _cfg(layers="0-7"), log=lambda s: None)
    with pytest.raises(LayerSpecError):
        stage.record(run3, tiny3, stage.RecordConfig(layers="last4"), log=lambda s: None)
    assert not (run3.path / "record").exists()


def test_record_table_of_an_experiment_config_and_cli_errors(tmp_path):
    from typer.testing import CliRunner

    from interp import cli
    from interp.run import pipeline
    got = pipeline._check({"record": {"what": ["attention"], "layers": "last2",
                                      "positions": "last"}}, "x.toml", None)
    assert got["record"] == stage.RecordConfig(what=["attention"], layers="last2",
                                               positions="last")
    with pytest.raises(ConfigError, match=r"\[record\]: unknown config keys"):
        pipeline._check({"record": {"dtypes": "float32"}}, "x.toml", None)
    res = CliRunner().invoke(cli.app, ["record", "--run", str(tmp_path), "--what", "mlp"])
    assert res.exit_code == 2 and "what must be a non-empty subset" in res.output
    res = CliRunner().invoke(cli.app, ["record", "--run", str(tmp_path)])
    assert res.exit_code == 2 and "has no manifest.json" in res.output
    res = CliRunner().invoke(cli.app, ["view", "--run", str(tmp_path), "--id", "x"])
    assert res.exit_code == 2 and "has no manifest.json" in res.output  # not a run at all
