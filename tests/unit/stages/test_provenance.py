"""Issue 12 items 4 and 8: runs record how they were computed; caches key on what made them.

Item 4: the manifest holds the runtime facts (attention kernel, device, dtype, versions, TF32
and determinism flags, threads); an asymmetry run or a stage that reuses work computed under
other result-relevant facts refuses with one line naming the setting and ``--overwrite``, and
with ``overwrite`` redoes it; the thread count alone changes nothing.

Item 8: after ``interp asymmetry --overwrite`` with another template (same record ids, new
prompts) the attention recordings and the probe features of the changed prompts are computed
again (and differ from the cached ones), those of unchanged prompts are reused.
"""

from __future__ import annotations

import contextlib
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open

from interp.core.errors import RunDirError, StageError
from interp.core.io import load_tensors
from interp.models.loading import CUDA_RESULT_FACTS, RESULT_FACTS, result_facts, runtime_facts
from interp.stages import attention as attention_stage
from interp.stages import patching as patching_stage
from interp.stages import probe as probe_stage
from interp.stages import transfer as transfer_stage
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry
from interp.stages.common import stage_facts
from interp.store.rundir import RunDir
from interp.testing import synthetic_probe_run

QUIET = {"log": lambda s: None}


@contextlib.contextmanager
def precision(value: str):
    """A result-relevant process setting changed for the body."""
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old)


@contextlib.contextmanager
def threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def test_result_facts_are_the_documented_subset(tiny):
    facts = runtime_facts(tiny)
    rf = result_facts(facts)
    assert list(rf) == list(RESULT_FACTS)  # on CPU: no CUDA-only flags
    assert rf["device"] == "cpu" and rf["attn_implementation"] == "sdpa"
    assert rf["dtype"] == "float32" and rf["torch"] == torch.__version__
    assert "num_threads" in facts and "num_threads" not in rf
    gpu = result_facts({**facts, "device": "cuda:1", "device_name": "NVIDIA H200",
                        "tf32_matmul": True})
    assert list(gpu) == list(RESULT_FACTS + CUDA_RESULT_FACTS)
    assert gpu["device"] == "cuda" and gpu["device_name"] == "NVIDIA H200"
    assert result_facts({**facts, "device": "cuda:0"}) == result_facts({**facts,
                                                                        "device": "cuda:1"})


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"),
                    reason="torch < 2.9 has no fp32_precision")
def test_fp32_precision_fact_is_the_override_in_effect(tiny):
    """Putting allow_tf32 back to False (which writes 'ieee') is no change; TF32 on is one."""
    matmul = torch.backends.cuda.matmul
    old_prec, old_global = matmul.fp32_precision, torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        matmul.fp32_precision = "none"
        unset = runtime_facts(tiny)["fp32_precision_matmul"]
        matmul.allow_tf32 = False
        assert matmul.fp32_precision == "ieee"
        assert unset == runtime_facts(tiny)["fp32_precision_matmul"] == "none"
        matmul.allow_tf32 = True     # TF32 on: a change (torch moves the global to "high")
        assert result_facts(runtime_facts(tiny)) != result_facts(runtime_facts(tiny) | {
            "float32_matmul_precision": "highest", "fp32_precision_matmul": "none"})
    finally:
        matmul.fp32_precision = old_prec
        torch.set_float32_matmul_precision(old_global)


def test_asymmetry_manifest_records_runtime_and_refuses_other_settings(tiny, tmp_path):
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=2, batch_size=2,
                          max_new_tokens=3, verdict_max_new_tokens=2, n_boot=20)
    run_asymmetry(tmp_path, tiny, cfg, **QUIET)
    m = RunDir(tmp_path).manifest()
    assert m["runtime"] == {**runtime_facts(tiny)}
    assert m["runtime"]["attn_implementation"] == "sdpa"
    assert m["runtime"]["num_threads"] == torch.get_num_threads()
    assert m["result_facts"] == result_facts(runtime_facts(tiny))
    with threads(torch.get_num_threads() + 1):  # threads alone: the run is reused
        run_asymmetry(tmp_path, tiny, cfg, **QUIET)
    assert len(RunDir(tmp_path).manifest()["invocations"]) == 2
    old = torch.get_float32_matmul_precision()
    with precision("medium"):
        with pytest.raises(RunDirError, match=rf"another config \(runtime.float32_matmul_"
                                              rf"precision: '{old}' -> 'medium'[;)].*"
                                              rf"--overwrite"):
            run_asymmetry(tmp_path, tiny, cfg, **QUIET)
        run_asymmetry(tmp_path, tiny, cfg, overwrite=True, **QUIET)
        m = RunDir(tmp_path).manifest()
    assert m["result_facts"]["float32_matmul_precision"] == "medium"
    assert m["runtime"]["float32_matmul_precision"] == "medium"
    assert len(m["invocations"]) == 1 and len(RunDir(tmp_path).read_records()) == 2


@pytest.fixture()
def run_copy(tiny, tmp_path):
    return synthetic_probe_run(tmp_path / "run", tiny, 2, 2)


def test_attention_stage_refuses_then_redoes_work_of_other_settings(tiny, run_copy):
    cfg = attention_stage.AttentionConfig(band="last2", n_boot=10, figures=False)
    assert attention_stage.record(run_copy, tiny, cfg, **QUIET) == 4
    entry = run_copy.manifest()["stages"]["attention"]
    assert entry["result_facts"] == result_facts(runtime_facts(tiny))
    assert entry["runtime"]["torch"] == torch.__version__ and entry["versions"]["torch"]
    with threads(torch.get_num_threads() + 1):
        assert attention_stage.record(run_copy, tiny, cfg, **QUIET) == 0
    old = torch.get_float32_matmul_precision()
    with precision("medium"):
        with pytest.raises(RunDirError, match=rf"the attention stage's stored work was computed "
                                              rf"with float32_matmul_precision='{old}', now "
                                              rf"'medium'; .*--overwrite"):
            attention_stage.record(run_copy, tiny, cfg, **QUIET)
        assert attention_stage.record(run_copy, tiny, cfg, overwrite=True, **QUIET) == 4
        assert attention_stage.record(run_copy, tiny, cfg, **QUIET) == 0
    assert run_copy.manifest()["stages"]["attention"]["result_facts"][
        "float32_matmul_precision"] == "medium"


@pytest.mark.parametrize("stage", ["probe", "patching"])
def test_probe_and_patching_refuse_before_any_work(tiny, run_copy, stage):
    stage_facts(run_copy, tiny, stage)
    with precision("medium"), pytest.raises(RunDirError, match=f"the {stage} stage's stored "
                                                              f"work.*--overwrite"):
        if stage == "probe":
            probe_stage.run(run_copy, tiny, probe_stage.ProbeConfig(folds=2), **QUIET)
        else:
            patching_stage.run(run_copy, tiny, patching_stage.PatchingConfig(band="last1"),
                               **QUIET)
    assert not (run_copy.path / ("probes" if stage == "probe" else "patching")).exists()


def test_patching_parts_are_keyed_on_runtime_facts(tiny, toy_records, tmp_path):
    from interp.judging.prompts import get_template
    from interp.methods.pairs import build_pairs

    pairs, _ = build_pairs(toy_records, "candidate-swap", get_template(), tiny.tokenizer,
                           limit=1, max_tokens=None, log=lambda s: None)
    cfg = patching_stage.PatchingConfig()
    rf = result_facts(runtime_facts(tiny))
    sig = patching_stage.part_signature(cfg, "resid", [0, 1], [1], tiny, pairs[0], rf)
    assert sig == patching_stage.part_signature(cfg, "resid", [0, 1], [1], tiny, pairs[0], dict(rf))
    for k, v in (("dtype", "bfloat16"), ("attn_implementation", "eager"), ("torch", "2.0")):
        assert sig != patching_stage.part_signature(cfg, "resid", [0, 1], [1], tiny, pairs[0],
                                                    {**rf, k: v})


def test_transfer_refuses_other_provenance_and_redoes_eval_for_new_eval_prompts(tmp_path):
    cfg = transfer_stage.TransferConfig()
    prov = {"model_sha256": "a" * 64, "runtime.dtype": "float32", "templates": "t1",
            "train_prompts": "p1", "eval_prompts": "e1"}
    transfer_stage.reconcile_config(tmp_path, cfg, False, prov)
    for sub in ("eval/base__squad_v2.jsonl", "table.json", "patching.json",
                "hard_negatives.jsonl"):
        (tmp_path / sub).parent.mkdir(exist_ok=True)
        (tmp_path / sub).write_text("{}\n")
    transfer_stage.reconcile_config(tmp_path, cfg, False, {**prov, "eval_prompts": "e2"})
    assert not (tmp_path / "table.json").exists() and not (tmp_path / "eval").exists()
    assert (tmp_path / "hard_negatives.jsonl").exists()
    with pytest.raises(StageError, match=r"provenance.runtime.dtype: 'float32' -> "
                                            r"'bfloat16'.*--overwrite"):
        transfer_stage.reconcile_config(tmp_path, cfg, False, {**prov, "eval_prompts": "e2",
                                                               "runtime.dtype": "bfloat16"})
    transfer_stage.reconcile_config(tmp_path, cfg, True, {**prov, "runtime.dtype": "bfloat16"})
    assert not (tmp_path / "hard_negatives.jsonl").exists()


# ---------------------------------------------------------------------------------------------
# Item 8: the case end to end
# ---------------------------------------------------------------------------------------------


def test_another_template_with_the_same_ids_redoes_recordings_and_features(tiny, tmp_path):
    # the stages' own freshness checks: the harness records nothing for them (one_pass off;
    # tests/unit/stages/test_one_pass.py covers what the one pass writes)
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=3, batch_size=3,
                          max_new_tokens=3, verdict_max_new_tokens=2, n_boot=20,
                          one_pass=False)
    run_asymmetry(tmp_path, tiny, cfg, **QUIET)
    run = RunDir(tmp_path)
    recs = run.read_records()
    acfg = attention_stage.AttentionConfig(band="all", n_boot=10, figures=False)
    assert attention_stage.record(run, tiny, acfg, **QUIET) == 3
    before_mass = {r["id"]: load_tensors(attention_stage.rows_path(run, r)) for r in recs}
    feats, info = {}, {}
    for task in ("eval", "gen"):
        feats[task], info[task] = probe_stage.cached_features(run, tiny, recs, task, **QUIET)
        assert info[task]["n_computed"] == 3

    # the case: same record ids, another template, --overwrite
    ref = AsymmetryConfig(**{**cfg.__dict__, "template": "reference"})
    run_asymmetry(tmp_path, tiny, ref, overwrite=True, **QUIET)
    new = run.read_records()
    assert [r["id"] for r in new] == [r["id"] for r in recs]
    assert all(r["template"] == "reference" for r in new)
    # tables built without a model refuse the recordings of the old prompts
    with pytest.raises(RunDirError, match="recorded from another version of record squad_v2/"):
        attention_stage.load_masses(run)
    # attention: every recording is redone; the gen prompt did not change, its masses are equal
    assert attention_stage.record(run, tiny, acfg, **QUIET) == 3
    for r in new:
        after = load_tensors(attention_stage.rows_path(run, r))
        gen, old_gen = after["mass.gen"], before_mass[r["id"]]["mass.gen"]
        n = old_gen.shape[-1]  # the new 'reference' span comes last; the gen prompt has none
        # (same rows; the span sums run over one more span column: float rounding only)
        assert torch.allclose(gen[..., :n], old_gen, rtol=0, atol=1e-6)
        assert float(gen[..., n:].abs().sum()) == 0.0
        assert not torch.equal(after["mass.eval"], before_mass[r["id"]]["mass.eval"])
        with safe_open(str(attention_stage.rows_path(run, r)), "pt") as f:
            assert f.metadata()["record"] == attention_stage.qa_record_signature(r)
    assert len(attention_stage.load_masses(run)[0]) == 3
    # probe features: the eval prompts changed and are extracted again; the gen ones are reused
    ev, ev_info = probe_stage.cached_features(run, tiny, new, "eval", **QUIET)
    assert ev_info["n_computed"] == 3 and ev_info["signature"] != info["eval"]["signature"]
    assert all(np.abs(ev[p] - feats["eval"][p]).max() > 1e-3 for p in ev)
    gen, gen_info = probe_stage.cached_features(run, tiny, new, "gen", **QUIET)
    assert gen_info["n_computed"] == 0 and gen_info["signature"] == info["gen"]["signature"]
    assert all(np.array_equal(gen[p], feats["gen"][p]) for p in gen)
    # and the fresh eval features equal features computed from scratch in another directory
    other = RunDir(tmp_path / "fresh")
    shutil.copytree(tmp_path, other.path, ignore=shutil.ignore_patterns("probes", "fresh"))
    scratch, _ = probe_stage.cached_features(other, tiny, new, "eval", **QUIET)
    assert all(np.array_equal(scratch[p], ev[p]) for p in ev)


def test_probe_rows_of_changed_records_are_replaced_the_others_kept(tiny, run_copy):
    from interp.judging.prompts import get_template, render

    recs = run_copy.read_records()
    before, info = probe_stage.cached_features(run_copy, tiny, recs, "eval", **QUIET)
    assert info["n_computed"] == 4
    # one record's answer changes (same id): only its row is recomputed
    r = recs[1]
    ep = render(tiny.tokenizer, get_template(), "eval", context=r["context"],
                question=r["question"], answer="banana", reference=r["answers"][0])
    changed = [*recs[:1], {**r, "answer": "banana", "prompts": {**r["prompts"],
                                                                "eval": ep.to_record()}},
               *recs[2:]]
    after, info = probe_stage.cached_features(run_copy, tiny, changed, "eval", **QUIET)
    assert info["n_computed"] == 1
    for p in after:
        assert np.array_equal(np.delete(after[p], 1, 0), np.delete(before[p], 1, 0))
    assert np.abs(after["candidate"][1] - before["candidate"][1]).max() > 1e-3


def test_asymmetry_redoes_records_whose_example_or_prompt_changed(tiny, tmp_path):
    """records.jsonl is a cache keyed by record id too: a changed source is not reused."""
    import json

    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=3, batch_size=3,
                          max_new_tokens=3, verdict_max_new_tokens=2, n_boot=20)
    run_asymmetry(tmp_path, tiny, cfg, **QUIET)
    run = RunDir(tmp_path)
    recs = run.read_records(status=None)
    assert run_asymmetry(tmp_path, tiny, cfg, **QUIET)["overall"]["n"] == 3  # reused
    # as if the data file now had another context for record 0, and record 2 had been
    # tokenized by another tokenizer (its stored generation prompt has another length)
    edited = [dict(recs[0], context="An older context."), recs[1],
              dict(recs[2], prompts={**recs[2]["prompts"],
                                     "gen": {**recs[2]["prompts"]["gen"], "n_tokens": 7}})]
    run.records_path.write_text("".join(json.dumps(r) + "\n" for r in edited))
    with pytest.raises(RunDirError, match=rf"2 finished record\(s\) of squad_v2 were made from "
                                          rf"another version .*first: squad_v2/{recs[0]['id']}: "
                                          rf"its context changed\); use --overwrite"):
        run_asymmetry(tmp_path, tiny, cfg, **QUIET)
    run_asymmetry(tmp_path, tiny, cfg, overwrite=True, **QUIET)
    redone = {r["id"]: r for r in run.read_records(status=None)}
    assert len(redone) == 3
    for r in recs:
        new = redone[r["id"]]
        assert new["context"] == r["context"] and new["prompts"] == r["prompts"]
        assert new["answer"] == r["answer"]  # greedy: the same model gives the same record
    assert run_asymmetry(tmp_path, tiny, cfg, **QUIET)["overall"]["n"] == 3


@pytest.fixture()
def local_ck(tmp_path):
    from interp.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path / "ck", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)


def _small_cfg(ck, limit=1):
    return AsymmetryConfig(model=str(ck), device="cpu", datasets=["squad_v2"], limit=limit,
                           batch_size=1, max_new_tokens=3, verdict_max_new_tokens=2, n_boot=20)


def test_records_and_manifest_name_the_scored_reply_tokens(local_ck, tmp_path):
    """Each record names the token ids of the two whole replies its score compares.

    The manifest names them with their strings; scoring those ids again gives the score.
    """
    from interp.judging.prompts import rerender
    from interp.judging.verdict import VerdictReplies, score_verdicts, verdict_replies
    from interp.models.loading import load_model

    out = tmp_path / "run"
    run_asymmetry(out, None, _small_cfg(local_ck, limit=2), **QUIET)
    h = load_model(str(local_ck), device="cpu")
    want = verdict_replies(h.tokenizer)
    manifest = RunDir(out).manifest()["model"]["verdict_replies"]
    assert {w: v["ids"] for w, v in manifest.items()} == want.id_lists()
    for word, v in manifest.items():
        assert h.tokenizer.convert_tokens_to_ids(v["tokens"]) == v["ids"]
        assert h.tokenizer.decode(v["ids"]).strip() == word
    recs = RunDir(out).read_records()
    assert len(recs) == 2
    for r in recs:
        ids = r["verdict_reply_ids"]
        assert ids == want.id_lists()
        replies = VerdictReplies(correct=tuple(ids["Correct"]),
                                 incorrect=tuple(ids["Incorrect"]), tokens=want.tokens)
        (row,) = score_verdicts(h, [rerender(r, "eval", h.tokenizer).input_ids],
                                replies=replies).rows()
        assert row["logprob_correct"] == pytest.approx(r["logprob_correct"], abs=1e-6)


@pytest.mark.parametrize("edit", ["config", "template", "weights"])
def test_resume_refuses_a_checkpoint_whose_config_or_template_changed(local_ck, tmp_path, edit):
    """The fingerprint covers config.json and the chat template, not only the weights."""
    import json

    out = tmp_path / "run"
    run_asymmetry(out, None, _small_cfg(local_ck), **QUIET)
    before = RunDir(out).manifest()["model"]["sha256"]
    if edit == "config":
        cfg = json.loads((local_ck / "config.json").read_text())
        cfg["rope_theta"] = 12345.0
        (local_ck / "config.json").write_text(json.dumps(cfg))
    elif edit == "template":
        jinja = local_ck / "chat_template.jinja"
        jinja.write_text(jinja.read_text().replace("<|im_end|>", "<|im_end|> "))
    else:
        from safetensors.torch import load_file, save_file

        w = load_file(local_ck / "model.safetensors")
        w["model.norm.weight"] = w["model.norm.weight"] * 2
        save_file(w, local_ck / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(RunDirError, match="sha256"):
        run_asymmetry(out, None, _small_cfg(local_ck, limit=2), **QUIET)
    assert RunDir(out).manifest()["model"]["sha256"] == before
    assert len(RunDir(out).read_records()) == 1                     # nothing lost
    # a README is not a result file: adding one changes nothing
    from interp.models.loading import checkpoint_sha256

    fp = checkpoint_sha256(local_ck)
    (local_ck / "README.md").write_text("notes")
    assert checkpoint_sha256(local_ck) == fp != before


def test_resumed_run_records_every_commit_that_wrote(local_ck, tmp_path, monkeypatch):
    import interp.store.rundir

    out = tmp_path / "run"
    monkeypatch.setattr(interp.store.rundir, "git_commit", lambda: "aaa111")
    run_asymmetry(out, None, _small_cfg(local_ck), **QUIET)
    monkeypatch.setattr(interp.store.rundir, "git_commit", lambda: "bbb222")
    run_asymmetry(out, None, _small_cfg(local_ck, limit=2), **QUIET)
    run_asymmetry(out, None, _small_cfg(local_ck, limit=2), **QUIET)      # same commit: once
    m = RunDir(out).manifest()
    assert m["git_commit"] == "aaa111" and m["git_commits"] == ["aaa111", "bbb222"]
