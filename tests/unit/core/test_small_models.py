"""A new user's small checkpoint: the default band adapts, and empty answers are named.

Study 1 on a 4-layer checkpoint succeeded, then ``interp attention`` refused the default band
``last8``; a model that generated nothing had its empty answer judged as ``ok`` with an
empty candidate span. Both through the command line, on checkpoints written to disk.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from interp import cli
from interp.core.errors import LayerSpecError
from interp.core.layers import band_note, parse_layers
from interp.testing import tiny_checkpoint, tiny_llama, tiny_tokenizer

STUDY1 = ["asymmetry", "--limit", "3", "--n-boot", "20", "--device", "cpu",
          "--batch-size", "3"]


def _records(run):
    return [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines() if x]


def test_the_default_band_adapts_to_a_model_with_fewer_layers_and_says_so():
    assert parse_layers("last8", 4) == [0, 1, 2, 3] and parse_layers(None, 4) == [0, 1, 2, 3]
    assert parse_layers("last8", 30) == list(range(22, 30))
    assert band_note("last8", 4) == ("the default band last8 is layers 0-3: the model has "
                                     "only 4 layers")
    assert band_note("last8", 8) is None and band_note("0-3", 4) is None
    with pytest.raises(LayerSpecError, match="cannot take the last 9"):  # a chosen K: strict
        parse_layers("last9", 4)


def test_study1_then_attention_on_a_4_layer_checkpoint(tmp_path):
    ck = tiny_checkpoint(tmp_path / "ck4", n_layers=4)
    run = tmp_path / "run"
    r = CliRunner().invoke(cli.app, [*STUDY1, "--model", str(ck), "--out", str(run)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli.app, ["attention", "--run", str(run), "--device", "cpu",
                                     "--n-boot", "20"])
    assert r.exit_code == 0, r.output
    assert "[attention] band: the default band last8 is layers 0-3" in r.output
    summary = json.loads((run / "attention" / "summary.json").read_text())
    assert summary["band"] == [0, 1, 2, 3] and summary["layers_spec"] == "last8"
    # a band the user chose is still checked, in one line, before the model loads
    r = CliRunner().invoke(cli.app, ["attention", "--run", str(run), "--band", "last9"])
    assert r.exit_code == 2 and "cannot take the last 9" in r.output


def test_a_model_that_generates_nothing_has_its_empty_answers_named_not_judged(tmp_path):
    """A model that generates nothing: its records say so, and the printout counts them.

    Every logit is equal: greedy decoding picks token 0, a special token, so every generation
    decodes to nothing.
    """
    tok = tiny_tokenizer()
    h = tiny_llama(tok, n_layers=2)
    with torch.no_grad():
        h.model.lm_head.weight.zero_()
    assert tok.convert_ids_to_tokens(0) in tok.all_special_tokens
    ck = tmp_path / "mute"
    h.model.save_pretrained(ck)
    tok.save_pretrained(ck)
    run = tmp_path / "run"
    r = CliRunner().invoke(cli.app, [*STUDY1, "--model", str(ck), "--out", str(run)])
    assert r.exit_code == 0, r.output
    recs = _records(run)
    assert len(recs) == 3 and {x["status"] for x in recs} == {"no_answer"}
    assert all(x["generation"].strip() == "" and "verdict" not in x and "prompts" not in x
               and x["reason"].startswith("the model generated no answer") for x in recs)
    m = json.loads((run / "metrics.json").read_text())
    assert m["no_answer"] == {"squad_v2": 3} and m["skipped"] == {"squad_v2": 3}
    assert m["per_dataset"]["squad_v2"]["n"] == 0
    assert "squad_v2: 3 of 3 records have no answer (the model generated nothing)" in r.output
    made = [x for x in r.output.splitlines() if x.startswith("[squad_v2] no answer ")]
    assert len(made) == 3    # one line per record as it is made
