"""Issue 14 items 1, 2 and 6: one prefill per prompt, what it records, and kills.

* The harness's one pass writes the attention stage's recordings and the probe stage's
  features, equal to what those stages write with their own forwards (exactly with one prompt
  per forward; in padded batches to float32 rounding), and the stages then run no forward.
* The prefill loop decodes exactly what transformers' ``generate`` decodes, scores verdicts as
  :func:`interp.judging.verdict.score_verdicts` does, and computes logits only at the last position.
* A harness killed with SIGKILL and run again holds every record exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

from interp.core.io import read_jsonl
from interp.data import load_examples
from interp.judging.generation import generate
from interp.judging.prefill import eos_ids, run_prompts
from interp.judging.verdict import score_verdicts, verdict_replies
from interp.models.kv_cache import left_pad
from interp.models.loading import result_facts, runtime_facts
from interp.stages import attention as attention_stage
from interp.stages import probe as probe_stage
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry
from interp.store.rundir import RunDir

QUIET = {"log": lambda s: None}


def _cfg(batch_size: int, **kw) -> AsymmetryConfig:
    return AsymmetryConfig(model="tiny-llama", datasets=["squad_v2", "drop"], limit=3,
                           batch_size=batch_size, max_new_tokens=4, verdict_max_new_tokens=3,
                           n_boot=20, **kw)


class _Forwards:
    """Counts forwards of a model (a hook on the decoder's first layer)."""

    def __init__(self, handle):
        self.n = 0
        layer = handle.model.model.layers[0]
        self.h = layer.register_forward_hook(lambda *a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.h.remove()


def _one_pass_vs_stages(tiny, path: Path, batch_size: int):
    """(harness masses, stage masses, harness features, stage features) of one run."""
    run_asymmetry(path, tiny, _cfg(batch_size), **QUIET)
    run = RunDir(path)
    recs = run.read_records()
    facts = result_facts(runtime_facts(tiny))
    acfg = attention_stage.AttentionConfig(band="all", figures=False, n_boot=10)
    with _Forwards(tiny) as fw:  # everything is fresh: no forward
        assert attention_stage.record(run, tiny, acfg, **QUIET) == 0
        mine = attention_stage.load_masses(run)[1]
        feats = {t: probe_stage.cached_features(run, tiny, recs, t, facts=facts, **QUIET)
                 for t in ("eval", "gen")}
        assert fw.n == 0
    assert all(info["n_computed"] == 0 for _, info in feats.values())
    acfg.recompute = True
    assert attention_stage.record(run, tiny, acfg, **QUIET) == len(recs)
    theirs = attention_stage.load_masses(run)[1]
    again = {t: probe_stage.cached_features(run, tiny, recs, t, facts=facts, recompute=True,
                                            batch_size=1, **QUIET)[0] for t in ("eval", "gen")}
    return mine, theirs, {t: f for t, (f, _) in feats.items()}, again


def test_one_pass_equals_the_stages_one_prompt_per_forward(tiny, tmp_path):
    """Batch 1: the harness's recordings and features equal the stages' to 1e-6."""
    mine, theirs, feats, again = _one_pass_vs_stages(tiny, tmp_path, batch_size=1)
    for t in ("gen", "eval"):
        assert mine[t].shape == theirs[t].shape == (6, 2, 4, 4)
        np.testing.assert_allclose(mine[t], theirs[t], atol=1e-6, rtol=0)
        np.testing.assert_allclose(mine[t].sum(-1), 1.0, atol=1e-5)
    assert set(feats["eval"]) == {"last", "candidate", "mean", "max", "min"}
    assert set(feats["gen"]) == {"last", "mean", "max", "min"}
    for t in ("gen", "eval"):
        for p, x in feats[t].items():
            assert x.shape == (6, 2, 64)
            np.testing.assert_allclose(x, again[t][p], atol=1e-6, rtol=0)


def test_one_pass_in_padded_batches_equals_the_stages_to_rounding(tiny, tmp_path):
    """Batch 2 (left padding): equal to float32 rounding of the largest value."""
    mine, theirs, feats, again = _one_pass_vs_stages(tiny, tmp_path, batch_size=2)
    for t in ("gen", "eval"):
        np.testing.assert_allclose(mine[t], theirs[t], atol=1e-6, rtol=0)
        for p, x in feats[t].items():
            scale = np.abs(again[t][p]).max()
            assert np.abs(x - again[t][p]).max() <= 4e-6 * scale, (t, p)


def test_one_pass_off_writes_nothing_for_the_stages(tiny, tmp_path):
    run_asymmetry(tmp_path, tiny, _cfg(2, one_pass=False), **QUIET)
    assert not (tmp_path / "attention").exists() and not (tmp_path / "probes").exists()


def test_another_backend_records_again(tiny, tmp_path):
    run_asymmetry(tmp_path, tiny, _cfg(2), **QUIET)
    cfg = attention_stage.AttentionConfig(band="all", backend="eager", figures=False)
    assert attention_stage.record(RunDir(tmp_path), tiny, cfg, **QUIET) == 6
    assert attention_stage.record(RunDir(tmp_path), tiny, cfg, **QUIET) == 0


# ---------------------------------------------------------------------------------------------
# The prefill loop (item 2)
# ---------------------------------------------------------------------------------------------


def _prompts(tiny) -> list[list[int]]:
    tok = tiny.tokenizer
    texts = ["The Eiffel Tower is in Paris.", "Who built it?", "a b c d e f g h i j k l m n o",
             "Normans in Normandy, France, in the 10th century."]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def test_prefill_decode_equals_transformers_generate(tiny):
    """Same tokens and first logits as ``model.generate(do_sample=False)`` on the same batch."""
    prompts = _prompts(tiny)
    order = sorted(range(4), key=lambda i: len(prompts[i]))
    got = run_prompts(tiny, prompts, max_new_tokens=7, batch_size=4, stop_strings=(),
                      keep_first_logits=True)
    pad, eos = tiny.tokenizer.pad_token_id, eos_ids(tiny)
    ids, mask = left_pad([prompts[i] for i in order], pad)
    res = tiny.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                              max_new_tokens=7, pad_token_id=pad, eos_token_id=sorted(eos),
                              return_dict_in_generate=True, output_logits=True,
                              temperature=None, top_p=None, top_k=None)
    new = res.sequences[:, ids.shape[1]:]
    for row, i in enumerate(order):
        want = new[row].tolist()
        cut = next((k for k, t in enumerate(want) if t in eos), None)
        assert got[i].token_ids == want[:cut]
        assert got[i].stop == ("max_new_tokens" if cut is None else "eos")
        torch.testing.assert_close(got[i].first_logits, res.logits[0][row].float(), atol=0,
                                   rtol=0)


def test_prefill_scores_verdicts_as_score_verdicts(tiny):
    prompts = _prompts(tiny)
    replies = verdict_replies(tiny.tokenizer)
    got = run_prompts(tiny, prompts, max_new_tokens=3, batch_size=3, continuations=replies.ids)
    want = score_verdicts(tiny, prompts, batch_size=3, replies=replies)
    lp = torch.stack([g.logprobs for g in got])
    torch.testing.assert_close(lp[:, 0], want.logprob_correct, atol=0, rtol=0)
    torch.testing.assert_close(lp[:, 1], want.logprob_incorrect, atol=0, rtol=0)
    # the continuation forwards crop the cache back: decoding after them = decoding alone
    alone = generate(tiny, prompts, max_new_tokens=3, batch_size=3)
    assert [g.token_ids for g in got] == [g.token_ids for g in alone]


def test_logits_only_at_the_last_prompt_position(tiny):
    """The prefill's output head sees one position per prompt, not the whole prompt."""
    seen = []
    h = tiny.model.lm_head.register_forward_hook(lambda m, a, o: seen.append(a[0].shape[1]))
    try:
        run_prompts(tiny, _prompts(tiny), max_new_tokens=2, batch_size=4, stop_strings=())
    finally:
        h.remove()
    assert seen == [1, 1]  # the prefill and one decoding step


def test_batches_are_formed_by_length(tiny):
    """Prompts are sorted by length before batching: the two short ones share a batch."""
    widths = []
    h = tiny.model.model.layers[0].register_forward_pre_hook(
        lambda m, a, kw: widths.append((a[0] if a else kw["hidden_states"]).shape[:2]),
        with_kwargs=True)
    prompts = [[5] * 30, [6] * 3, [7] * 31, [8] * 4]
    try:
        run_prompts(tiny, prompts, max_new_tokens=0, batch_size=2)
    finally:
        h.remove()
    assert [tuple(w) for w in widths] == [(2, 4), (2, 31)]


# ---------------------------------------------------------------------------------------------
# Item 6: SIGKILL during the harness, then the same command
# ---------------------------------------------------------------------------------------------

_KILLED = textwrap.dedent("""
    import sys, time
    import interp.stages.asymmetry as stage
    from interp.testing import tiny_llama, tiny_tokenizer
    handle = tiny_llama(tiny_tokenizer(), n_layers=2, d_model=64, n_heads=4, n_kv_heads=2,
                        seed=0)
    slow = float(sys.argv[2])
    real = stage.evaluate_examples
    def evaluate(*a, **kw):  # slow chunks, so that the kill lands inside the stage
        time.sleep(slow)
        return real(*a, **kw)
    stage.evaluate_examples = evaluate
    cfg = stage.AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=8,
                                batch_size=1, max_new_tokens=3, verdict_max_new_tokens=2,
                                n_boot=10)
    stage.run(sys.argv[1], handle, cfg, chunk=2, log=lambda s: None)
""")


def test_sigkill_during_the_harness_then_rerun_keeps_every_record_once(tmp_path):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(out), "0.5"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = out / "records.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if records.exists() and len(records.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the harness finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    n_killed = len(read_jsonl(records))
    assert 2 <= n_killed < 8
    done = subprocess.run([sys.executable, "-c", _KILLED, str(out), "0"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ids = [r["id"] for r in read_jsonl(records)]
    want = [ex.id for ex in load_examples("squad_v2", limit=8)]
    assert sorted(ids) == sorted(want) and len(ids) == 8
    # the one pass's outputs hold every record once too
    for task in ("eval", "gen"):
        from safetensors import safe_open

        with safe_open(str(out / "probes" / f"features_{task}.safetensors"), "pt") as f:
            keys = json.loads(f.metadata()["keys"])
        assert sorted(keys) == sorted(f"squad_v2/{i}" for i in want)
    assert len(list((out / "attention" / "records").rglob("*.safetensors"))) == 8
