"""Rehearsal of the paper configuration: experiments/paper.toml end to end on a stand-in model.

``experiments/paper.toml`` runs as written except for its model and dataset sources
(:func:`interp.run.pipeline.swap_sources`): the model (and the LLM oracle, which the config points
at the same model) becomes a tiny random Llama-3.1-shaped checkpoint saved to a local directory
(:func:`interp.testing.llama31_checkpoint`: 32 layers, GQA 4:1, Llama 3.1 rope scaling,
Llama-3-style tokenizer and chat template, bfloat16), the four datasets become files of 3
bundled records each, their contexts cut to 80 characters (:func:`interp.testing.
rehearsal_datasets`: no code path depends on the length, and the transfer stage's patching
at every position costs less on shorter prompts). Every forward pass and every
``generate`` call of every stage is watched: a fresh sequence must hold exactly one
``<|begin_of_text|>``, first after any padding (Llama 3's tokenizer and chat template both add
one); a continuation over a cache none; every generation must stop at ``<|eot_id|>``, which is
not the checkpoint's EOS. A GPU user changes nothing but the config.
"""

from __future__ import annotations

import functools
import json
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaForCausalLM
from transformers.generation.utils import GenerationMixin

from interp.core.errors import StageError
from interp.judging import prefill
from interp.models.loading import PAPER_MODEL
from interp.run.pipeline import load_config, run_config, swap_sources
from interp.stages import steering as steering_stage
from interp.store.rundir import RunDir
from interp.testing import llama31_checkpoint, rehearsal_datasets

pytestmark = pytest.mark.rehearsal

PAPER = Path(__file__).resolve().parents[2] / "experiments" / "paper.toml"
SEEDS = range(2, 12)
"""Weights seeds of the stand-in, tried in order. Its LLM oracle is the same random model, so
its labels are coin flips fixed by the seed and by the CPU's bfloat16 kernels: seed 2 labelled
6 of the 12 records Correct and 6 Incorrect on one machine and 4/8 on another (an Intel Xeon
with AMX, where bfloat16 matmuls take other kernels). The probe stage's 5-fold
cross-validation needs >= 5 passages per class, so the fixture runs Study 1 for each seed in
turn and keeps the first whose labels the probe stage accepts
(:func:`interp.analysis.stats.make_folds`,
the stage's own check), then runs every stage on it, resuming those records. On the 2-core
AMD EPYC machine of docs/performance.md seed 2, the first tried, labels 7/5 with contexts cut
to 80 characters as with 200, so Study 1 runs once there. Also measured:
seed 1 labels 6/6 but for one record its oracle accepts every closed-book answer and every
other record's gold answer, so the transfer stage refuses ("no hard negative ... use more
training records"), as it should."""


def _first_balanced_seed(root: Path, data: dict[str, str], log) -> tuple[Path, dict]:
    """The stand-in checkpoint and swapped config of the first seed the probe stage accepts."""
    from interp.analysis.stats import make_folds, passage_groups

    paper, counts = load_config(PAPER), []
    for seed in SEEDS:
        ckpt = llama31_checkpoint(root / f"llama31_seed{seed}", seed=seed)
        cfg = swap_sources(PAPER, models={PAPER_MODEL: str(ckpt)}, datasets=data,
                           out=root / f"runs_seed{seed}")
        (spec, facts), = run_config(cfg, only=["asymmetry"], log=log).items()
        records = RunDir(facts["run_dir"]).read_records()
        y = [bool(r["oracle_label"]) for r in records]
        counts.append((seed, sum(y), len(y) - sum(y)))
        try:
            make_folds(y, paper["probe"]["folds"], 0, groups=passage_groups(records))
        except StageError:
            continue
        return ckpt, cfg
    pytest.fail(f"no stand-in seed in {SEEDS} labels >= 5 passages per class "
                f"(seed, Correct, Incorrect): {counts}")


class Watch:
    """Records what every forward and generate call of a LlamaForCausalLM was given.

    Also the stop ids of interp's own greedy decoder (:func:`interp.judging.prefill.eos_ids`, used
    by the harness, the oracle, the judge and steering); ``generate`` is still used for sampling
    (hard negatives).
    """

    def __init__(self):
        self.forwards: list[tuple[torch.Tensor, torch.Tensor | None, int, bool]] = []
        self.generate_eos: list[list[int]] = []
        self.in_generate = 0
        self.decode_stops: list[list[int]] = []

    @contextmanager
    def installed(self):
        fwd, gen = LlamaForCausalLM.forward, GenerationMixin.generate
        watch = self

        @functools.wraps(fwd)  # keeps the signature: generate() reads it (position_ids ...)
        def forward(model, input_ids=None, *args, **kw):
            cache = kw.get("past_key_values") or kw.get("cache")
            past = int(cache.get_seq_length()) if cache is not None else 0
            if input_ids is not None:
                mask = kw.get("attention_mask")
                watch.forwards.append((input_ids.detach().cpu(),
                                       None if mask is None else mask.detach().cpu(), past,
                                       watch.in_generate > 0))
            return fwd(model, input_ids, *args, **kw)

        @functools.wraps(gen)
        def generate(model, *args, **kw):
            eos = kw.get("eos_token_id", model.generation_config.eos_token_id)
            watch.generate_eos.append(list(eos) if isinstance(eos, list | tuple) else [eos])
            watch.in_generate += 1
            try:
                return gen(model, *args, **kw)
            finally:
                watch.in_generate -= 1

        stops = prefill.eos_ids

        def decoding(fn):  # interp's own greedy loops: their steps feed the model's tokens
            @functools.wraps(fn)
            def run(*args, **kw):
                watch.in_generate += 1
                try:
                    return fn(*args, **kw)
                finally:
                    watch.in_generate -= 1
            return run

        def eos_ids(handle):
            ids = stops(handle)
            watch.decode_stops.append(sorted(ids))
            return ids

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(LlamaForCausalLM, "forward", forward)
            mp.setattr(GenerationMixin, "generate", generate)
            mp.setattr(prefill, "eos_ids", eos_ids)
            mp.setattr(prefill, "_decode", decoding(prefill._decode))
            mp.setattr(steering_stage, "steer_generator",
                       decoding(steering_stage.steer_generator))
            yield self


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """The paper config, every stage, on the first balanced stand-in (:data:`SEEDS`).

    Built once per test run (module scope: only this module uses it); every forward and
    generate call of every attempt is watched.
    """
    root = tmp_path_factory.mktemp("rehearsal")
    data = rehearsal_datasets(root / "data", n=3, max_chars=80)
    lines: list[str] = []
    with Watch().installed() as watch:
        ckpt, cfg = _first_balanced_seed(root, data, lines.append)
        summary = run_config(cfg, log=lines.append)
    (spec,) = summary
    return SimpleNamespace(cfg=cfg, data=data, ckpt=ckpt, summary=summary, watch=watch,
                           run=RunDir(summary[spec]["run_dir"]), lines=lines, root=root)


def _diff(a, b, at=""):
    """Key paths where two parsed configs differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in sorted(set(a) | set(b))
                for p in _diff(a.get(k), b.get(k), f"{at}.{k}" if at else k)]
    return [] if a == b else [at]


def test_only_the_sources_are_swapped(rehearsal):
    paper = load_config(PAPER)
    assert _diff(paper, rehearsal.cfg) == [
        "asymmetry.datasets", "asymmetry.from_hub", "asymmetry.models", "asymmetry.oracle",
        "figures", "out", "transfer.datasets", "transfer.from_hub", "transfer.oracle"]
    assert paper["attention"]["band"] == rehearsal.cfg["attention"]["band"] == "24-31"
    assert rehearsal.cfg["asymmetry"]["oracle"] == f"model:{rehearsal.ckpt}"
    assert rehearsal.cfg["asymmetry"]["dtype"] == "bfloat16"
    assert set(paper) - {"name", "out", "figures", "publish", "asymmetry"} == {
        "attention", "patching", "probe", "transfer", "steering"}
    assert paper["steering"]["band"] == paper["patching"]["band"] == "24-31"


def test_every_stage_ran_on_the_llama31_shaped_model(rehearsal):
    run = rehearsal.run
    manifest = run.manifest()
    m = manifest["model"]
    assert (m["n_layers"], m["n_heads"], m["n_kv_heads"], m["dtype"]) == (32, 8, 2, "bfloat16")
    assert m["eot_tokens"][0] == "<|eot_id|>"
    assert set(manifest["stages"]) >= {"attention", "probe", "transfer", "patching"}
    records = run.read_records(status=None)
    assert len(records) == 12 and all(r["status"] == "ok" for r in records)
    assert {r["dataset"] for r in records} == {"squad_v2", "drop", "hotpotqa", "musique"}
    assert all(r["oracle"]["rule"].startswith("model:") for r in records)
    metrics = json.loads((run.path / "metrics.json").read_text())
    assert metrics["overall"]["n"] == 12
    att = json.loads((run.path / "attention" / "summary.json").read_text())
    assert (att["band"], att["layers_spec"], att["n_layers"]) == (list(range(24, 32)), "24-31",
                                                                  32)
    probes = json.loads((run.path / "probes" / "results.json").read_text())
    assert probes["n_layers"] == 32 and set(probes["tasks"]) == {"eval", "gen"}
    table = json.loads((run.path / "transfer" / "table.json").read_text())
    assert set(table["self"]) == {"base", "lora_gen", "lora_eval", "lora_both"}
    patching = sorted(p.name for p in (run.path / "patching").rglob("summary.json"))
    assert patching, "the patching stage wrote no summary"
    steering = json.loads((run.path / "steering" / "summary.json").read_text())
    assert steering["band"] == list(range(24, 32)) and steering["n_records"] == 12
    figures = {p.name for p in Path(rehearsal.cfg["figures"]).glob("*.png")}
    assert {"asymmetry.png", "attention_layerwise.png", "probes.png"} <= figures


def test_every_fresh_sequence_has_exactly_one_bos(rehearsal):
    """Every forward of every stage: one BOS first in a fresh sequence, none after a cache.

    A decoding step (``generate``, or interp's own greedy loops ``interp.judging.prefill._decode``
    and ``interp.methods.steering.steer_generator``) feeds the token the model just produced, which
    a random model may well pick as ``<|begin_of_text|>`` (it did: one step after 346 cached
    positions): those steps are not
    checked; the prompts they start from are.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rehearsal.ckpt)
    bos = tok.convert_tokens_to_ids("<|begin_of_text|>")
    fresh = cont = 0
    for ids, mask, past, decoding in rehearsal.watch.forwards:
        if past and decoding:
            continue
        for r in range(ids.shape[0]):
            real = ids[r] if mask is None else ids[r][mask[r, -ids.shape[1]:].bool()]
            n_bos = int((real == bos).sum())
            if past == 0:
                fresh += 1
                assert n_bos == 1 and int(real[0]) == bos, (n_bos, real[:4].tolist())
            else:
                cont += 1
                assert n_bos == 0, (past, real[:8].tolist())
    assert fresh > 100 and cont > 100, (fresh, cont)


def test_every_generation_stops_at_eot(rehearsal):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rehearsal.ckpt)
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert tok.eos_token_id != eot                      # the checkpoint's EOS is another token
    calls, decodes = rehearsal.watch.generate_eos, rehearsal.watch.decode_stops
    assert len(calls) >= 1 and all(eot in ids for ids in calls)          # sampling
    assert len(decodes) > 10 and all(eot in ids for ids in decodes)      # greedy decoding
