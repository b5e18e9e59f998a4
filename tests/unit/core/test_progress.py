"""Progress in a log file: whole lines with an ETA, never carriage-return frames."""

from __future__ import annotations

import re

import pytest

from interp.core import progress
from interp.stages.asymmetry import AsymmetryConfig
from interp.stages.asymmetry import run as run_asymmetry


def test_lines_not_frames_when_stderr_is_not_a_terminal(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("INTERP_PROGRESS", raising=False)
    cfg = AsymmetryConfig(model="tiny-llama", datasets=["squad_v2"], limit=3, batch_size=1,
                          chunk_batches=1, max_new_tokens=3, verdict_max_new_tokens=2,
                          n_boot=20)
    run_asymmetry(tmp_path / "run", tiny, cfg, log=lambda s: None)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [x for x in err.splitlines() if x.startswith("squad_v2:")]
    assert lines[0].startswith("squad_v2: 0/3 ex [00:00 elapsed, ETA ?")
    assert re.match(r"squad_v2: 3/3 ex \[\d\d:\d\d elapsed, ETA 00:00, .*ex/s\]", lines[-1])
    assert len(lines) <= 3                    # start, end, at most one line per 30 s between


def test_line_interval_and_forced_forms(capsys, monkeypatch):
    monkeypatch.delenv("INTERP_PROGRESS", raising=False)
    import tqdm.std

    clock = iter(range(0, 10000, 10))          # every reading of the clock is 10 s later
    monkeypatch.setattr(tqdm.std, "time", lambda: next(clock))
    bar = progress.tqdm(total=12, desc="steps", unit="step", leave=False)
    assert isinstance(bar, progress.LineProgress)
    for _ in range(12):
        bar.update(1)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("steps: 0/12") and lines[-1].startswith("steps: 12/12")
    assert 3 <= len(lines) <= 8                # ~ one line per 30 s, not one per step
    monkeypatch.setenv("INTERP_PROGRESS", "bar")
    assert not isinstance(progress.tqdm(total=1, disable=True), progress.LineProgress)
    monkeypatch.setenv("INTERP_PROGRESS", "lines")
    assert isinstance(progress.tqdm(total=1, disable=True), progress.LineProgress)


def test_model_loading_writes_no_library_bar_into_a_log(tmp_path, capsys, monkeypatch):
    from interp.models.loading import load_model
    from interp.testing import tiny_checkpoint

    monkeypatch.delenv("INTERP_PROGRESS", raising=False)
    ck = tiny_checkpoint(tmp_path / "ck", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)
    capsys.readouterr()
    load_model(str(ck), device="cpu")
    assert "\r" not in capsys.readouterr().err


@pytest.fixture(autouse=True)
def _bars_back_on():
    yield
    from huggingface_hub.utils import enable_progress_bars
    from transformers.utils import logging as hf_logging

    enable_progress_bars()
    hf_logging.enable_progress_bar()


def test_resumed_items_move_the_count_but_not_the_rate(capsys, monkeypatch):
    """10 parts read back at once, then 2 computed at 60 s each: the ETA says 8 x 60 s."""
    monkeypatch.delenv("INTERP_PROGRESS", raising=False)
    import tqdm.std

    now = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    bar = progress.tqdm(total=20, desc="steer", unit="record", smoothing=0)
    for _ in range(10):
        progress.resumed(bar)
    for _ in range(2):
        now[0] += 60.0
        bar.update(1)
    assert bar.n == 12
    assert bar.format_dict["n"] - bar.format_dict["initial"] == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith("steer: 12/20 record [02:00 elapsed, ETA 08:00"), last
    bar.close()
    progress.resumed(progress.tqdm(total=3, disable=True))   # a silent bar: nothing to count

    # a loop that finds all 100 records done writes one line for them, not one each
    capsys.readouterr()
    bar = progress.tqdm(total=100, desc="steer", unit="record")
    for _ in range(100):
        progress.resumed(bar)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) <= 3 and lines[-1].startswith("steer: 100/100"), lines


def test_a_stage_bar_moves_inside_a_batch_and_ends_exact(tiny):
    """The harness's bar advances on each prefill and decoding step, not once per chunk."""
    from interp.core.progress import Share
    from interp.judging.prefill import run_prompts

    class Bar:
        def __init__(self):
            self.n, self.steps = 0, []

        def update(self, k):
            self.n += k
            self.steps.append(self.n)

    bar = Bar()
    prompts = [[1, 5, 6, 7]] * 4
    with Share(bar, 2, prompts_per_example=2) as share:  # 2 examples x 2 prompts
        run_prompts(tiny, prompts, max_new_tokens=12, batch_size=4, stop_strings=())
        assert 0 < bar.n < 2  # moved within the chunk, never to its end before it is done
        share.done()
    assert bar.n == 2 and bar.steps == sorted(bar.steps)
    run_prompts(tiny, prompts, max_new_tokens=2)  # no share: nothing to report to


def _predicted_totals(make, times, monkeypatch):
    """Elapsed + ETA after each one-item update, the items taking ``times`` seconds."""
    import tqdm.std

    now = [0.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    bar, out = make(), []
    for t in times:
        now[0] += t
        bar.update(1)
        d = bar.format_dict
        rate = d["rate"] or d["n"] / d["elapsed"]
        out.append(d["elapsed"] + (d["total"] - d["n"]) / rate)
    bar.close()
    return out


def test_the_eta_is_steady_where_the_moving_average_swings(monkeypatch):
    """Items in bursts (3 quick, 1 slow: a batch's prefills, then its long decoding), 560 s.

    tqdm's moving average predicts totals from 306 to 810 s after the second burst; the
    steady estimate stays within 1.35x from there, and with a prior it has an ETA from the
    first item.
    """
    import io

    import tqdm.std

    monkeypatch.setenv("INTERP_PROGRESS", "lines")
    times = [2.0, 2.0, 2.0, 50.0] * 10
    sink = io.StringIO()
    ema = _predicted_totals(lambda: tqdm.std.tqdm(total=40, file=sink, mininterval=0,
                                                  miniters=1), times, monkeypatch)
    steady = _predicted_totals(lambda: progress.tqdm(total=40, file=sink), times, monkeypatch)
    prior = _predicted_totals(lambda: progress.tqdm(total=40, file=sink, prior_s=14.0), times,
                              monkeypatch)
    assert steady[-1] == pytest.approx(560) and prior[-1] == pytest.approx(560)
    late = slice(7, None)  # from the second burst on
    assert max(ema[late]) / min(ema[late]) > 2.0
    assert max(steady[late]) / min(steady[late]) < 1.35
    assert max(prior[late]) / min(prior[late]) < 1.35
    # before the first slow item: without a prior 80 s (a 7x underestimate), with one >= 250 s
    assert max(steady[:3]) < 100 and min(prior[:3]) > 250


def test_steady_seconds_per_item_weighs_the_prior_as_items():
    assert progress.steady_seconds_per_item(0.0, 0) is None
    assert progress.steady_seconds_per_item(30.0, 3) == 10.0
    assert progress.steady_seconds_per_item(0.0, 0, prior_s=8.0) == 8.0
    # the prior counts as PRIOR_WEIGHT (2) items: (2 * 8 + 30) / (2 + 3)
    assert progress.steady_seconds_per_item(30.0, 3, prior_s=8.0) == pytest.approx(46 / 5)
