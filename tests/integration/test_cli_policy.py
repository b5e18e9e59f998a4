"""The command line as a user meets it (issue 17): errors, refusals, Ctrl-C, committed figures.

Every test runs ``python -m interp.cli`` in a subprocess, as a user would, on a tiny random
Llama saved to disk (:func:`interp.testing.tiny_llama`) and a four-line JSONL file, so no
bundled model is needed; the cost is mostly the interpreter start (torch, transformers).
Asserted: a bad input prints exactly one line, ``error: ...``, on stderr and exits 2, before
any model loads (a missing model would fail first otherwise) and without leaving a directory;
``--only`` with a typo lists the valid stages; ``--limit 0`` is refused and an existing summary
stays byte for byte; the published figures folder is written only by a complete
``publish = true`` run; Ctrl-C exits 130 with one line naming the kept records and the command
that resumes, and that command finishes the run with every record exactly once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from interp.testing import synthetic_probe_run, tiny_llama, tiny_tokenizer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FACTS = [("When was the Eiffel Tower finished?", "The Eiffel Tower is in Paris. It was "
          "finished in 1889.", "1889"),
         ("Who founded Normandy?", "Rollo founded Normandy in 911.", "Rollo"),
         ("What is the capital of France?", "The city of Paris is the capital of France.",
          "Paris"),
         ("At what temperature does water boil?", "Water boils at 100 degrees Celsius at sea "
          "level.", "100 degrees Celsius")]
N_MANY = 300
"""Records of the Ctrl-C run: the tiny model writes about eight a second on a 2-core machine
(after about 10 s of start-up), so the interrupt, sent after the second record, lands long
before its end."""
TINY = ["--model", "{model}", "--device", "cpu", "--dtype", "float32", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A workspace: the tiny model on disk, a JSONL dataset, an empty model cache."""
    root = tmp_path_factory.mktemp("cli")
    handle = tiny_llama(tiny_tokenizer(), n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)
    handle.model.save_pretrained(root / "model")
    handle.tokenizer.save_pretrained(root / "model")
    lines = [json.dumps({"id": f"q{k}", "dataset": "toy", "question": q, "context": c,
                         "answers": [a]}) for k, (q, c, a) in enumerate(FACTS)]
    (root / "toy.jsonl").write_text("\n".join(lines) + "\n")
    (root / "cache").mkdir()
    return root


def _env(ws: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "INTERP_CACHE": str(ws / "cache")}


def cli(ws: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    args = tuple(a.replace("{model}", str(ws / "model")) for a in args)
    return subprocess.run([sys.executable, "-m", "interp.cli", *args], cwd=ws, env=_env(ws),
                          capture_output=True, text=True, timeout=timeout)


def one_error(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused command (exit 2, no traceback, nothing else)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize(("args", "expect"), [
    (["--dataset", "nosuch"], "unknown dataset 'nosuch'; known datasets: squad_v2"),
    (["--dataset", "empty.jsonl"], "empty.jsonl: file is empty"),
    (["--dataset", "nofield.jsonl"], "nofield.jsonl:1: missing required field 'answers'"),
    (["--dataset", "toy.jsonl", "--limit", "0"],
     "--limit ([asymmetry] limit) must be a whole number >= 1 (leave it out to use every "
     "record), not 0"),
    (["--dataset", "toy.jsonl", "--limit", "-3"], "must be a whole number >= 1"),
    (["--dataset", "toy.jsonl", "--oracle", "llm"], "unknown oracle 'llm'"),
    (["--dataset", "toy.jsonl", "--limit", "abc"], "Invalid value for '--limit'"),
])
def test_asymmetry_refuses_bad_input_before_the_model_loads(ws, args, expect):
    (ws / "empty.jsonl").write_text("")
    (ws / "nofield.jsonl").write_text('{"id": "1", "question": "q", "context": "c"}\n')
    out = ws / "refused"
    # a hub id that passes the spec check offline but cannot load: had it been loaded first,
    # its error would be the one shown
    proc = cli(ws, "asymmetry", "--model", "no-such-org/no-such-model", "--out", str(out),
               *args)
    assert expect in one_error(proc)
    assert not out.exists()


def test_failure_after_the_model_loaded_leaves_no_directory(ws):
    out = ws / "bad_oracle"
    proc = cli(ws, "asymmetry", *TINY, "--dataset", "toy.jsonl", "--out", str(out),
               "--oracle", "model:no-such-org/no-such-oracle")  # fails at its load
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    assert not out.exists()  # the manifest written before the oracle failed went with it


def test_config_errors_are_one_line(ws):
    assert "config file missing.toml does not exist" in one_error(cli(ws, "run", "missing.toml"))
    (ws / "broken.toml").write_text('name = "x"\n[asymmetry\n')
    assert "broken.toml is not valid TOML" in one_error(cli(ws, "run", "broken.toml"))
    assert "metrics.json" not in os.listdir(ws)


def _config(ws: Path, name: str, *, publish: bool) -> Path:
    path = ws / f"{name}.toml"
    path.write_text(f'name = "{name}"\nout = "runs/{name}"\nfigures = "figs_{name}"\n'
                    f"publish = {str(publish).lower()}\n[asymmetry]\n"
                    f'models = ["{ws / "model"}"]\ndatasets = ["toy.jsonl"]\nlimit = 4\n'
                    f'device = "cpu"\ndtype = "float32"\nmax_new_tokens = 4\nbatch_size = 2\n'
                    f"n_boot = 50\n[steering]\nlimit = 1\nband = \"all\"\nalphas = [0.5, 1]\n"
                    f"max_new_tokens = 4\nn_boot = 50\n")
    return path


def test_published_figures_only_from_a_complete_run(ws):
    cfg = _config(ws, "study", publish=True)
    figs = ws / "figs_study"
    proc = cli(ws, "run", str(cfg), "--only", "steerin")
    assert one_error(proc) == ("error: --only: unknown: steerin (did you mean 'steering'?); "
                               "valid stages here: asymmetry, "
                               "steering")
    assert "transfer" in one_error(cli(ws, "run", str(cfg), "--only", "transfer"))
    assert not figs.exists() and not (ws / "runs" / "study").exists()

    proc = cli(ws, "run", str(cfg), "--only", "asymmetry")  # part of the study
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "figs_study/ not updated: --only ran part of the study" in proc.stdout
    assert not figs.exists()
    run_dir = ws / "runs" / "study" / "model"
    assert len((run_dir / "records.jsonl").read_text().splitlines()) == 4

    proc = cli(ws, "run", str(cfg))  # the whole study: asymmetry (resumed) and steering
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "published figures and tables to figs_study/" in proc.stdout
    assert (figs / "asymmetry.png").exists() and (figs / "asymmetry_metrics.json").exists()
    assert json.loads((figs / "asymmetry_metrics.json").read_text())["overall"]["n"] == 4
    before = {p.name: p.read_bytes() for p in figs.iterdir()}

    proc = cli(ws, "run", str(cfg), "--only", "asymmetry")
    assert proc.returncode == 0 and "not updated" in proc.stdout
    assert {p.name: p.read_bytes() for p in figs.iterdir()} == before

    draft = _config(ws, "draft", publish=False)
    proc = cli(ws, "run", str(draft), "--only", "asymmetry")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not updated (the config does not say publish = true)" in proc.stdout
    assert not (ws / "figs_draft").exists()


def test_limit_zero_keeps_an_existing_summary(ws):
    handle = tiny_llama(tiny_tokenizer(), n_layers=2, d_model=64, n_heads=4, n_kv_heads=2)
    run = synthetic_probe_run(ws / "synth", handle, n_good=2, n_bad=2)
    summary = run.sub("patching") / "summary.json"
    summary.write_text('{"candidate-swap/resid": {"n_pairs": 5}}\n')
    for cmd, opt in (("patch", "--limit"), ("steer", "--limit"), ("attention", "--limit"),
                     ("probe", "--limit")):
        err = one_error(cli(ws, cmd, "--run", str(run.path), opt, "0"))
        assert "must be a whole number >= 1" in err and "not 0" in err
    assert summary.read_text() == '{"candidate-swap/resid": {"n_pairs": 5}}\n'


def test_ctrl_c_says_what_is_kept_and_resumes(ws):
    data = ws / "many.jsonl"
    data.write_text("".join(json.dumps({"id": f"m{k}", "dataset": "toy", "question": q,
                                        "context": f"{c} ({k})", "answers": [a]}) + "\n"
                            for k in range(N_MANY) for q, c, a in FACTS[k % 4:k % 4 + 1]))
    out = ws / "interrupted"
    args = ["asymmetry", *TINY, "--dataset", str(data), "--out", str(out), "--batch-size", "1",
            "--max-new-tokens", "24", "--limit", str(N_MANY)]
    args = [a.replace("{model}", str(ws / "model")) for a in args]
    # Ctrl-C as in a terminal: SIGINT at its default in the child. A test runner started in
    # the background (`nohup ... &`) ignores SIGINT, a child inherits that, and Python does not
    # turn an ignored SIGINT into KeyboardInterrupt: the run would go on to its end.
    proc = subprocess.Popen([sys.executable, "-m", "interp.cli", *args], cwd=ws, env=_env(ws),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    records = out / "records.jsonl"
    deadline = time.monotonic() + 300
    while not (records.exists() and records.read_text().count("\n") >= 2):  # then at once
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1]
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    kept = len(records.read_text().splitlines())
    assert 2 <= kept < N_MANY
    last = err.strip().splitlines()[-1]
    # the harness's one pass also keeps one attention recording per record (written just
    # before its chunk's records, so at most one chunk more) and the probe features of every
    # kept record in one cache file per task (gen, eval)
    m = re.fullmatch(rf"interrupted: kept {kept} records, (\d+) attention recordings, (\d+) "
                     rf"probe feature caches in {re.escape(str(out))}; resume with: "
                     + re.escape("interp " + " ".join(args)), last)
    assert m, last
    assert kept <= int(m.group(1)) <= kept + 1 and int(m.group(2)) == 2, last

    proc2 = cli(ws, *args)
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    ids = [json.loads(line)["id"] for line in records.read_text().splitlines()]
    assert sorted(ids) == sorted(f"m{k}" for k in range(N_MANY))  # each exactly once
