"""docs/endpoints.md's "A local server from a bundled model" block, run as a reader would.

The commands are read from the page (the ``pip install`` line aside: the test environment has
the ``[serve]`` extra through ``[test]``), on a free port instead of 8080, in a shell.
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


def _block() -> str:
    text = (ROOT / "docs/endpoints.md").read_text()
    section = text.split("## A local server from a bundled model", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


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
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    run = tmp_path / "runs/served"
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["overall"]["n"] == 4
    assert len((run / "records.jsonl").read_text().splitlines()) == 4
    assert (run / "requests.jsonl").exists()
