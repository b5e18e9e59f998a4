"""The transfer stage end to end on a tiny random model: files, table, resume, invalidation."""

from __future__ import annotations

import json
import re

import pytest
import torch

from interp.core.errors import LayerSpecError, StageError
from interp.stages.transfer import TransferConfig, run


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].clone()


def test_transfer_stage_on_tiny_model(tiny, tmp_path):
    cfg = TransferConfig(max_train_examples=4, eval_limit=2, train_batch_size=4,
                         hard_negative_attempts=2, hard_negative_max_new_tokens=4,
                         max_new_tokens=4, verdict_max_new_tokens=2, patch_examples=1,
                         patch_layers=[1], n_boot=50, rank=2, max_length=400)
    probe = tiny.tokenizer("Hello there")["input_ids"]
    before = _logits(tiny.model, probe)
    s = run(tmp_path, tiny, cfg, log=lambda x: None)
    assert torch.equal(_logits(tiny.model, probe), before)
    td = tmp_path / "transfer"
    table = json.loads((td / "table.json").read_text())
    assert set(table["self"]) == {"base", "lora_gen", "lora_eval", "lora_both"}
    assert set(table["judge_base_answers"]) == set(table["self"])
    for m in table["self"].values():
        g = m["squad_v2"]
        assert g["n"] == 2 and g["delta"] == pytest.approx(g["EA"] - g["GA"])
    base = [json.loads(x) for x in (td / "eval" / "base__squad_v2.jsonl").open()]
    judged = [json.loads(x) for x in
              (td / "eval" / "lora_gen__squad_v2__judge_base_answers.jsonl").open()]
    assert [r["answer"] for r in judged] == [r["answer"] for r in base]
    hn = [json.loads(x) for x in (td / "hard_negatives.jsonl").open()]
    assert len(hn) == 4 and s["pool"] == 4
    assert s["hard_negative_fallback_rate"] == sum(r["fallback"] for r in hn) / 4
    patching = json.loads((td / "patching.json").read_text())
    assert patching["adapters"]["lora_eval"]["layers"] == [1]
    assert len(patching["adapters"]["lora_eval"]["patched_a_to_b"]) == patching["n_prompts"]
    sets = {n: [json.loads(x) for x in (td / "train_sets" / f"{n}.jsonl").open()]
            for n in ("lora_gen", "lora_eval", "lora_both")}
    assert {n: len(v) for n, v in sets.items()} == {n: 4 for n in sets}
    meta = json.loads((td / "adapters" / "lora_eval" / "interp_adapter.json").read_text())
    assert meta["config"]["rank"] == 2 and meta["config"]["datasets"] == ["squad_v2"]
    for f in ("transfer_matrix.png", "transfer_acceptance.png", "transfer_patching.png"):
        assert (tmp_path / "figures" / f).exists()
    # a second call with a changed evaluation setting redoes the evaluation, not the training
    cfg.eval_limit = 1
    u = run(tmp_path, tiny, cfg, log=lambda x: None)
    assert u["train_seconds"] == s["train_seconds"] and u["headline"]["base"]["squad_v2"]["n"] == 1
    # a changed training setting without overwrite is refused
    cfg.rank = 4
    with pytest.raises(StageError, match="another transfer config.*rank: 2 -> 4"):
        run(tmp_path, tiny, cfg, log=lambda x: None)


def test_bad_patch_layers_fail_before_training(tiny, tmp_path):
    cfg = TransferConfig(patch_layers="0-7")
    with pytest.raises(LayerSpecError, match="0-1"):
        run(tmp_path, tiny, cfg, log=lambda x: None)
    assert not (tmp_path / "transfer" / "hard_negatives.jsonl").exists()


def test_lr_grid_chooses_on_held_out_train_records(tiny, tmp_path):
    """Each candidate rate trains without the held-out records and is scored on them.

    The chosen candidate is the adapter evaluated; validation records are never used.
    """
    import shutil

    cfg = TransferConfig(max_train_examples=6, select_holdout=2, lr_grid=[1e-3, 1e-4],
                         eval_limit=1, train_batch_size=2, hard_negative_attempts=1,
                         hard_negative_max_new_tokens=4, max_new_tokens=4,
                         verdict_max_new_tokens=2, patch_examples=0, n_boot=20, rank=2,
                         max_length=400)
    run(tmp_path, tiny, cfg, log=lambda x: None)
    td = tmp_path / "transfer"
    sel = json.loads((td / "select.json").read_text())
    hn = [json.loads(x) for x in (td / "hard_negatives.jsonl").open()]
    assert sel["holdout_ids"] == [hn[1]["id"], hn[4]["id"]] and sel["n_train"] == 4
    val = [json.loads(x)["id"] for x in (td / "eval" / "base__squad_v2.jsonl").open()]
    assert not set(val) & set(sel["holdout_ids"])
    assert set(sel["candidates"]) == {"0.0001", "0.001"}
    sub = td / "select" / "lr_0.001" / "heldout"
    # every judge is scored on the same answers: each held-out gold answer, then its negative
    judged = [json.loads(x) for x in (sub / "lora_eval__judge.jsonl").open()]
    assert [r["id"] for r in judged] == sel["holdout_ids"] * 2
    assert [r["answer"] for r in judged[2:]] == [hn[1]["hard_negative"], hn[4]["hard_negative"]]
    assert [r["oracle_label"] for r in judged] == [True, True, False, False]
    assert sorted(p.name for p in sub.iterdir()) == [
        "lora_both.jsonl", "lora_both__judge.jsonl", "lora_eval__judge.jsonl", "lora_gen.jsonl"]
    for name in ("lora_gen", "lora_eval", "lora_both"):
        # trained on the 4 records left, never on a held-out one
        items = [json.loads(x) for x in (td / "train_sets" / f"{name}.jsonl").open()]
        assert not {it["id"] for it in items} & set(sel["holdout_ids"])
        lr = sel["chosen"][name]
        assert sel["chosen_by"][name] == "held-out score"
        best = max(c[name]["score"] for c in sel["candidates"].values())
        assert sel["candidates"][f"{lr:g}"][name]["score"] == best
        # the adapter evaluated is the chosen candidate, with its rate in its metadata
        meta = json.loads((td / "adapters" / name / "interp_adapter.json").read_text())
        src = json.loads((td / "select" / f"lr_{lr:g}" / "adapters" / name /
                          "interp_adapter.json").read_text())
        assert meta == src and meta["config"]["lr"] == lr
    table = json.loads((td / "table.json").read_text())
    assert table["lr"] == sel["chosen"] and table["lr_selection"]["chosen"] == sel["chosen"]
    assert len(table["lr_selection"]["train_seconds"]) == 6

    def stamps():
        return {p: p.stat().st_mtime_ns for p in (td / "select").rglob("*.jsonl")
                if "heldout" in str(p)}
    before = stamps()
    assert len(before) == 2 + 2 * 4  # the base's two, and 4 per rate
    # a fresh machine's resume (candidates' weights and checkpoints not kept): nothing is
    # trained or evaluated again; the chosen adapters are kept
    for p in (td / "select").glob("lr_*/*"):
        if p.name in ("adapters", "checkpoints"):
            shutil.rmtree(p)
    run(tmp_path, tiny, cfg, log=lambda x: None)
    assert stamps() == before and not list((td / "select").glob("lr_*/adapters"))
    # the saved state keeps no adapter at all: with every validation record stored, the
    # chosen adapters' kept metadata stands for them and nothing is trained again
    shutil.rmtree(td / "adapters")
    for name in ("lora_gen", "lora_eval", "lora_both"):
        assert json.loads((td / "select" / "chosen" / f"{name}.json").read_text())[
            "config"]["lr"] == sel["chosen"][name]
    run(tmp_path, tiny, cfg, log=lambda x: None)
    assert not (td / "adapters").exists() and not list((td / "select").glob("lr_*/adapters"))
    table = json.loads((td / "table.json").read_text())
    assert table["lr"] == sel["chosen"] and len(table["lr_selection"]["train_seconds"]) == 6
    # a validation record missing: the chosen adapter it needs is trained again
    (td / "eval" / "lora_gen__squad_v2.jsonl").unlink()
    run(tmp_path, tiny, cfg, log=lambda x: None)
    assert (td / "adapters" / "lora_gen" / "adapter_model.safetensors").exists()
    assert not (td / "adapters" / "lora_eval").exists()
    # a new decoding setting redoes the held-out records (and so the choice)
    cfg.verdict_max_new_tokens = 3
    run(tmp_path, tiny, cfg, log=lambda x: None)
    after = stamps()
    assert set(after) == set(before) and all(after[p] != before[p] for p in before)


def test_paired_vs_base_pairs_records_and_judges_the_same_answers():
    from interp.stages.transfer.table import paired_vs_base

    def r(i, y, v, ld=0.0, ctx="c"):
        return {"dataset": "squad_v2", "id": str(i), "status": "ok", "context": f"{ctx}{i % 3}",
                "oracle_label": y, "verdict": v, "logit_diff": ld}
    base = [r(0, True, True, 1.0), r(1, False, True, 0.5), r(2, False, False, -1.0),
            r(3, True, None, 0.0)]
    gen = [r(0, True, True, 2.0), r(1, True, True, 1.0), r(2, False, True, 0.0),
           {"dataset": "squad_v2", "id": "3", "status": "error"}]
    evals = {"self": {"base": base, "lora_gen": gen},
             "judge_base_answers": {"base": base, "lora_gen": gen}}
    v = paired_vs_base(evals, n_boot=200, seed=0)["lora_gen"]
    sq = v["squad_v2"]
    # 3 records ok in both: GA 1,1,0 vs 1,0,0 -> +1/3; EA right 1,1,0 vs 1,0,1 -> 0
    assert sq["GA"]["mean"] == pytest.approx(1 / 3) and sq["GA"]["n"] == 3
    assert sq["EA"]["mean"] == pytest.approx(0.0)
    # acceptance: 1,1,1 vs 1,1,0 -> +1/3; logit_diff +1, +0.5, +1 -> 2.5/3
    assert sq["accept_base_answers"]["mean"] == pytest.approx(1 / 3)
    assert sq["logit_diff_base_answers"]["mean"] == pytest.approx(2.5 / 3)
    # over-accepting: the base's wrong answers only (ids 1, 2): 1,1 vs 1,0 -> +0.5
    assert sq["accept_wrong_base_answers"]["mean"] == pytest.approx(0.5)
    assert sq["accept_wrong_base_answers"]["n"] == 2
    assert sq["accept_right_base_answers"]["mean"] == pytest.approx(0.0)
    assert sq["GA"]["n_passages"] == 3 and len(sq["GA"]["ci"]) == 2
    assert v["overall"]["GA"] == sq["GA"]


def test_shares_of_the_training_then_the_stage_equal_one_process(tiny, tmp_path):
    """Shares of the training, then the stage, choose as one process does.

    Under torchrun each process makes its share of the training (the contract's
    ``parts_only``: learning-rate candidates dealt out in turn), then rank 0's ``run`` finds
    them made: nothing trained or evaluated twice.
    """
    from interp.stages.common import share_of_records
    from interp.stages.transfer import make_parts, selection_candidates

    cfg = TransferConfig(max_train_examples=6, select_holdout=2, lr_grid=[1e-3, 1e-4],
                         eval_limit=1, train_batch_size=2, hard_negative_attempts=1,
                         hard_negative_max_new_tokens=4, max_new_tokens=4,
                         verdict_max_new_tokens=2, patch_examples=0, n_boot=20, rank=2,
                         max_length=400)
    assert selection_candidates(cfg) == [(None, "base")] + [
        (lr, n) for lr in (1e-4, 1e-3) for n in ("lora_gen", "lora_eval", "lora_both")]
    run(tmp_path / "one", tiny, cfg, log=lambda x: None)
    one = json.loads((tmp_path / "one" / "transfer" / "select.json").read_text())
    td = tmp_path / "split" / "transfer"

    def heldout():
        return {str(p.relative_to(td)): p.stat().st_mtime_ns
                for p in (td / "select").rglob("*.jsonl") if "heldout" in str(p)}
    made, seen = [], {}
    for i in (0, 1):
        with share_of_records(i, 2):
            made.append(make_parts(tmp_path / "split", tiny, cfg, log=lambda x: None))
        now = heldout()
        assert {k: now[k] for k in seen} == seen  # share 1 left share 0's candidates alone
        seen = now
    assert made == [4, 3] and not (td / "select.json").exists()
    # share 0: the base, LoRA-Eval at 1e-4, LoRA-Gen and LoRA-Both at 1e-3; share 1 the rest
    assert sorted(p.parent.name + "/" + p.name for p in td.glob("select/lr_*/adapters/*")) == [
        "adapters/lora_both", "adapters/lora_both", "adapters/lora_eval", "adapters/lora_eval",
        "adapters/lora_gen", "adapters/lora_gen"]
    assert len(seen) == 2 + 2 * 4
    run(tmp_path / "split", tiny, cfg, log=lambda x: None)
    assert heldout() == seen  # rank 0 trained and evaluated no candidate again
    split = json.loads((td / "select.json").read_text())
    assert split["candidates"] == one["candidates"] and split["chosen"] == one["chosen"]
    assert split["base"] == one["base"] and split["holdout_ids"] == one["holdout_ids"]
    # without lr_grid the three adapters are dealt out the same way
    cfg.lr_grid = None
    with share_of_records(1, 2):
        assert make_parts(tmp_path / "plain", tiny, cfg, log=lambda x: None) == 1
    assert [p.name for p in (tmp_path / "plain/transfer/adapters").iterdir()] == ["lora_eval"]


# --- adapters: a subset of the three --------------------------------------------------------

def _tiny_cfg(**kw):
    return TransferConfig(**{**dict(
        max_train_examples=4, eval_limit=2, train_batch_size=2, hard_negative_attempts=1,
        hard_negative_max_new_tokens=4, max_new_tokens=4, verdict_max_new_tokens=2,
        patch_examples=1, patch_layers=[1], n_boot=30, rank=2, max_length=400), **kw})


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


def _stamps(td, names):
    return {str(p.relative_to(td)): p.stat().st_mtime_ns for n in names
            for p in [td / "adapters" / n / "adapter_model.safetensors",
                      td / "eval" / f"{n}__squad_v2.jsonl",
                      td / "eval" / f"{n}__squad_v2__judge_base_answers.jsonl"]}


def test_a_subset_of_adapters_trains_only_those_and_equals_the_full_run(tiny, tmp_path):
    """``adapters = ["lora_eval"]``: only LoRA-Eval exists, with the full run's numbers.

    Each adapter's training set is built with the other two from one seeded rng and each
    training seeds itself, so LoRA-Eval trained alone has the full run's weights, records,
    table row, paired differences and patching. Adding LoRA-Gen later trains only LoRA-Gen;
    going back to LoRA-Eval alone trains and evaluates nothing and keeps LoRA-Gen's work.
    """
    full = run(tmp_path / "full", tiny, _tiny_cfg(), log=lambda x: None)
    fd, sd = tmp_path / "full" / "transfer", tmp_path / "sub" / "transfer"
    s = run(tmp_path / "sub", tiny, _tiny_cfg(adapters=["lora_eval"]), log=lambda x: None)
    assert sorted(p.name for p in (sd / "adapters").iterdir()) == ["lora_eval"]
    assert sorted(p.name for p in (sd / "train_sets").iterdir()) == ["lora_eval.jsonl"]
    assert sorted(p.name for p in (sd / "eval").iterdir()) == [
        "base__squad_v2.jsonl", "lora_eval__squad_v2.jsonl",
        "lora_eval__squad_v2__judge_base_answers.jsonl"]
    table, ftable = (json.loads((d / "table.json").read_text()) for d in (sd, fd))
    assert list(table["self"]) == ["base", "lora_eval"]
    assert list(table["judge_base_answers"]) == ["base", "lora_eval"]
    assert list(table["vs_base"]) == list(table["train_seconds"]) == list(table["lr"]) == [
        "lora_eval"]
    assert list(s["headline"]) == ["base", "lora_eval"] and s["train_items"] == {"lora_eval": 4}
    patching, fpatching = (json.loads((d / "patching.json").read_text()) for d in (sd, fd))
    assert list(patching["adapters"]) == ["lora_eval"]
    for f in ("transfer_matrix.png", "transfer_acceptance.png", "transfer_patching.png"):
        assert (tmp_path / "sub" / "figures" / f).stat().st_size > 10_000
    # the shared adapter: the same weights, records, table rows and patching
    w, fw = _weights(sd / "adapters" / "lora_eval"), _weights(fd / "adapters" / "lora_eval")
    assert w.keys() == fw.keys() and all(torch.equal(w[k], fw[k]) for k in w)
    bw = _weights(fd / "adapters" / "lora_both")  # trained on other items: other weights
    assert not all(torch.equal(w[k], bw[k]) for k in w)
    assert (sd / "train_sets" / "lora_eval.jsonl").read_text() == (
        fd / "train_sets" / "lora_eval.jsonl").read_text()
    for f in ("lora_eval__squad_v2.jsonl", "lora_eval__squad_v2__judge_base_answers.jsonl",
              "base__squad_v2.jsonl"):
        assert (sd / "eval" / f).read_text() == (fd / "eval" / f).read_text()
    for kind in ("self", "judge_base_answers"):
        assert table[kind]["lora_eval"] == ftable[kind]["lora_eval"]
        assert table[kind]["base"] == ftable[kind]["base"]
    assert table["vs_base"]["lora_eval"] == ftable["vs_base"]["lora_eval"]
    assert patching["adapters"]["lora_eval"] == fpatching["adapters"]["lora_eval"]
    assert s["headline"]["lora_eval"] == full["headline"]["lora_eval"]

    # adding LoRA-Gen trains, evaluates and patches LoRA-Gen only
    kept = _stamps(sd, ["lora_eval"])
    u = run(tmp_path / "sub", tiny, _tiny_cfg(adapters=["lora_gen", "lora_eval"]),
            log=lambda x: None)
    assert _stamps(sd, ["lora_eval"]) == kept
    assert sorted(p.name for p in (sd / "adapters").iterdir()) == ["lora_eval", "lora_gen"]
    assert u["train_seconds"]["lora_eval"] == s["train_seconds"]["lora_eval"]
    table = json.loads((sd / "table.json").read_text())
    assert list(table["self"]) == ["base", "lora_gen", "lora_eval"]
    assert table["self"]["lora_gen"] == ftable["self"]["lora_gen"]
    patching = json.loads((sd / "patching.json").read_text())
    assert list(patching["adapters"]) == ["lora_gen", "lora_eval"]
    assert patching["adapters"]["lora_gen"] == fpatching["adapters"]["lora_gen"]
    # back to LoRA-Eval alone: nothing trained, evaluated or patched; LoRA-Gen's work is kept
    kept = _stamps(sd, ["lora_gen", "lora_eval"])
    patched = (sd / "patching.json").stat().st_mtime_ns
    v = run(tmp_path / "sub", tiny, _tiny_cfg(adapters=["lora_eval"]), log=lambda x: None)
    assert _stamps(sd, ["lora_gen", "lora_eval"]) == kept
    assert (sd / "patching.json").stat().st_mtime_ns == patched
    assert list(v["headline"]) == ["base", "lora_eval"]
    assert list(json.loads((sd / "table.json").read_text())["self"]) == ["base", "lora_eval"]
    # a training setting changed with another subset is still refused as before
    with pytest.raises(StageError, match="another transfer config.*rank: 2 -> 4"):
        run(tmp_path / "sub", tiny, _tiny_cfg(adapters=["lora_both"], rank=4),
            log=lambda x: None)
    assert not (sd / "adapters" / "lora_both").exists()


def test_a_subset_with_lr_grid_chooses_as_the_full_selection(tiny, tmp_path):
    """With ``lr_grid``, LoRA-Both alone is scored and chosen as among all three.

    Its score is the mean of its own GA and its own judge's balanced accuracy, so it needs no
    other adapter; the shares of the training deal out only its candidates.
    """
    from interp.stages.common import share_of_records
    from interp.stages.transfer import make_parts, selection_candidates

    kw = dict(max_train_examples=6, select_holdout=2, lr_grid=[1e-3, 1e-4], eval_limit=1,
              patch_examples=0)
    cfg = _tiny_cfg(adapters=["lora_both"], **kw)
    assert selection_candidates(cfg) == [(None, "base"), (1e-4, "lora_both"),
                                         (1e-3, "lora_both")]
    with share_of_records(1, 2):  # the second of two processes: LoRA-Both at 1e-4
        assert make_parts(tmp_path / "sub", tiny, cfg, log=lambda x: None) == 1
    sd = tmp_path / "sub" / "transfer"
    assert sorted(str(p.relative_to(sd)) for p in sd.glob("select/lr_*/adapters/*")) == [
        "select/lr_0.0001/adapters/lora_both"]
    run(tmp_path / "sub", tiny, cfg, log=lambda x: None)
    run(tmp_path / "full", tiny, _tiny_cfg(**kw), log=lambda x: None)
    sel, fsel = (json.loads((d / "transfer" / "select.json").read_text())
                 for d in (tmp_path / "sub", tmp_path / "full"))
    assert all(list(c) == ["lora_both"] for c in sel["candidates"].values())
    assert sel["chosen"] == {"lora_both": fsel["chosen"]["lora_both"]}
    assert list(sel["all_collapsed"]) == ["lora_both"]
    assert sel["base"] == fsel["base"] and sel["holdout_ids"] == fsel["holdout_ids"]
    for lr, per in sel["candidates"].items():
        assert per["lora_both"] == fsel["candidates"][lr]["lora_both"]
    assert sorted(p.name for p in (sd / "select" / "lr_0.001" / "heldout").iterdir()) == [
        "lora_both.jsonl", "lora_both__judge.jsonl"]
    assert sorted(p.name for p in (sd / "adapters").iterdir()) == ["lora_both"]
    table = json.loads((sd / "table.json").read_text())
    assert list(table["self"]) == ["base", "lora_both"]
    assert table["lr"] == sel["chosen"] and table["lr_selection"]["chosen"] == sel["chosen"]
    # without lr_grid the chosen adapters alone are dealt out
    cfg = _tiny_cfg(adapters=["lora_gen", "lora_both"])
    with share_of_records(1, 2):
        assert make_parts(tmp_path / "plain", tiny, cfg, log=lambda x: None) == 1
    assert [p.name for p in (tmp_path / "plain/transfer/adapters").iterdir()] == ["lora_both"]


@pytest.mark.parametrize(("adapters", "said"), [
    ("lora_evl", "unknown adapter 'lora_evl' (did you mean 'lora_eval'?); known: lora_gen, "
                 "lora_eval, lora_both"),
    ([], "adapters is empty; name at least one of lora_gen, lora_eval, lora_both"),
    ("lora_eval,lora_gen,lora_eval", "adapters lists lora_eval more than once"),
])
def test_a_bad_choice_of_adapters_is_refused_before_any_work(adapters, said, tiny, tmp_path):
    with pytest.raises(StageError, match=re.escape(said)):
        TransferConfig.from_mapping({"adapters": adapters})
    cfg = _tiny_cfg()
    cfg.adapters = adapters  # set after the checks: run checks it again before any work
    with pytest.raises(StageError, match=re.escape(said)):
        run(tmp_path, tiny, cfg, log=lambda x: None)
    assert not (tmp_path / "transfer").exists()


def test_adapters_from_a_toml_table_in_the_order_of_the_paper(tmp_path):
    from interp.stages.transfer import load_config_file

    p = tmp_path / "t.toml"
    p.write_text('[transfer]\nadapters = ["lora_both", "lora_eval"]\n')
    assert TransferConfig.from_mapping(load_config_file(p)).adapters == ["lora_eval",
                                                                         "lora_both"]
    assert TransferConfig.from_mapping({"adapters": "lora_eval"}).adapters == ["lora_eval"]
    assert TransferConfig().adapters == ["lora_gen", "lora_eval", "lora_both"]


def test_the_adapters_option_is_a_comma_list_that_may_be_repeated(monkeypatch):
    from typer.testing import CliRunner

    from interp import cli
    from interp.core.options import given

    seen: dict = {}
    monkeypatch.setattr(cli, "_run_stage", lambda s, cls, kw: seen.update(kw))
    for args, want in ((["--adapters", "lora_eval"], ["lora_eval"]),
                       (["--adapters", "lora_both,lora_gen"], ["lora_gen", "lora_both"]),
                       (["--adapters", "lora_eval", "--adapters", "lora_gen"],
                        ["lora_gen", "lora_eval"]),
                       ([], ["lora_gen", "lora_eval", "lora_both"])):
        seen.clear()
        res = CliRunner().invoke(cli.app, ["transfer", *args])
        assert res.exit_code == 0, res.output
        assert TransferConfig.from_mapping(given(TransferConfig, seen)).adapters == want
