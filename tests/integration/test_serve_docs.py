"""Every command block of docs/endpoints.md, run as a reader would, against a real server.

The commands are read from the page and run in a shell, each ``interp`` command in a fresh
process (so no import made earlier in the test session can hide a kind the command line does
not know). What the test changes, and only that: a free port instead of 8080; the ``pip
install`` line left out (the test environment has the ``[serve]`` extra through ``[test]``);
in the first block and the config, the placeholder model names (``my-70b``, ``my-model``) become
the one bundled model the local server answers to, and ``--dataset squad_v2 --limit 2``
(``datasets = ["squad_v2"]``, ``limit = 2``) keeps the run short (a served request is several
seconds on a busy 2-core machine); the config's ``base_url`` becomes the local server's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from interp.endpoints.local import free_port

pytestmark = [pytest.mark.integration, pytest.mark.served]

ROOT = Path(__file__).resolve().parents[2]


PAGE = ROOT / "docs/endpoints.md"
SERVED = "smollm2-135m-instruct"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", PAGE.read_text(), re.S)


def _block() -> str:
    section = PAGE.read_text().split("## A local server from a bundled model", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


def _env() -> dict[str, str]:
    bin_dir = Path(sys.executable).parent
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def server():
    pytest.importorskip("xllamacpp")
    from interp.endpoints.local import LocalServer
    from interp.models.loading import bundled_gguf

    srv = LocalServer(bundled_gguf(SERVED), SERVED, threads=1, n_ctx=4096).start(timeout_s=120)
    yield srv
    srv.stop()


def test_the_page_has_the_blocks_these_tests_run():
    bash, toml = _blocks("bash"), _blocks("toml")
    assert len(bash) == 2 and len(toml) == 1
    assert "--oracle openai:my-70b" in bash[0] and "--model openai:my-model" in bash[0]
    assert bash[1] == _block()


def test_the_first_block_of_the_endpoints_page_runs_as_written(tmp_path, server):
    """An in-process model graded by a served oracle, their agreement, a served model."""
    block = _blocks("bash")[0]
    script = (block.replace("http://127.0.0.1:8080/v1", server.base_url)
              .replace("my-70b", SERVED).replace("my-model", SERVED)
              .replace("interp asymmetry ", "interp asymmetry --dataset squad_v2 --limit 2 "))
    assert script.count("--limit 2") == 2
    r = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    graded = [json.loads(x) for x in (tmp_path / "runs/a/records.jsonl").read_text().splitlines()]
    assert len(graded) == 2
    assert {g["oracle"]["name"] for g in graded} == {f"openai:{SERVED}"}, graded[0]
    agreement = json.loads((tmp_path / "runs/a/oracle_agreement.json").read_text())
    assert (agreement["n"], agreement["oracle_b"]) == (2, f"openai:{SERVED}")
    served = json.loads((tmp_path / "runs/served/metrics.json").read_text())
    assert served["overall"]["n"] == 2


def test_the_config_block_of_the_endpoints_page_runs(tmp_path, server):
    """The page's ``[asymmetry]`` table in an ``interp run`` config, with the local server."""
    (toml,) = _blocks("toml")
    table = (re.sub(r'base_url = "[^"]*"', f'base_url = "{server.base_url}"', toml)
             .replace("my-70b", SERVED).replace("my-model", SERVED))
    assert table.startswith("[asymmetry]\n")
    table = table.replace("[asymmetry]\n", '[asymmetry]\ndatasets = ["squad_v2"]\nlimit = 2\n', 1)
    (tmp_path / "c.toml").write_text(f'name = "served"\nout = "runs/served"\n{table}')
    r = subprocess.run(["interp", "run", "c.toml", "--only", "asymmetry"], cwd=tmp_path,
                       env={**_env(), "MY_KEY": "sk-not-needed-by-a-local-server"},
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    (metrics,) = (tmp_path / "runs/served").rglob("metrics.json")
    assert json.loads(metrics.read_text())["overall"]["n"] == 2


def test_the_serve_block_of_the_endpoints_page_runs_as_written(tmp_path):
    pytest.importorskip("xllamacpp")
    block = _block()
    assert "interp serve smollm2-135m-instruct --port 8080 &" in block
    port = str(free_port())
    lines = [line for line in block.splitlines() if not line.startswith("pip install")]
    wait = (f"{sys.executable} -c 'import httpx, time\n"
            f"for _ in range(600):\n"
            f"    try:\n"
            f"        httpx.get(\"http://127.0.0.1:{port}/v1/models\").raise_for_status(); break\n"
            f"    except Exception: time.sleep(0.5)'")
    script = "\n".join(line.replace("8080", port) for line in lines)
    script = script.replace(f"--port {port} &", f"--port {port} &\n{wait}")
    r = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run = tmp_path / "runs/served"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["overall"]["n"] == 2
    assert len((run / "records.jsonl").read_text().splitlines()) == 2
    assert (run / "requests.jsonl").exists()
