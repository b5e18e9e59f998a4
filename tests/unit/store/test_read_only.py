"""A finished run on a read-only file system: read it, never die on it, refuse a write in one line.

The fault is reproduced for real: the run directory is bind-mounted read-only (in a user and
mount namespace, ``unshare -rm``, so no privilege is needed) and the commands run inside it.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from interp.testing import synthetic_probe_run

ROOT = Path(__file__).resolve().parents[3]


def _read_only(src: Path, mnt: Path, command: str) -> subprocess.CompletedProcess:
    """Run ``command`` (with ``{RUN}`` for the mount) where ``mnt`` shows ``src`` read-only."""
    mnt.mkdir(exist_ok=True)
    script = (f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(mnt))} && "
              f"mount -o remount,ro,bind {shlex.quote(str(mnt))} && "
              + command.replace("{RUN}", shlex.quote(str(mnt))))
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


@pytest.fixture
def finished_run(tmp_path, tiny):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to make a read-only mount")
    probe = _read_only(tmp_path, tmp_path / "m", "touch {RUN}/x")
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"a read-only bind mount is not permitted here: {probe.stderr.strip()}")
    run = synthetic_probe_run(tmp_path / "run", tiny)
    from interp.stages.asymmetry import AsymmetryConfig
    from interp.stages.run_metrics import write_metrics

    cfg = AsymmetryConfig.from_mapping(run.manifest()["config"])
    write_metrics(run, cfg)
    return run.path


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_metrics_are_read_from_a_read_only_run_and_nothing_is_written(finished_run, tmp_path):
    before = _files(finished_run)
    py = shlex.quote(sys.executable)
    r = _read_only(finished_run, tmp_path / "ro", f"{py} -m interp metrics --run {{RUN}}")
    assert r.returncode == 0, r.stderr
    assert "GA" in r.stdout and "cannot be written (Read-only file system)" in r.stdout
    assert _files(finished_run) == before


def test_a_write_into_a_read_only_run_is_refused_in_one_line(finished_run, tmp_path):
    before = _files(finished_run)
    py = shlex.quote(sys.executable)
    r = _read_only(finished_run, tmp_path / "ro", f"{py} -m interp attention --run {{RUN}}")
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert "cannot be written (Read-only file system): interp attention needs a writable" \
        in errors[0]
    assert "Traceback" not in r.stderr
    code = ("import sys; from interp.store.rundir import RunDir; from interp.core.errors "
            "import RunDirError\ntry:\n    RunDir(sys.argv[1]).writer().__enter__()\n"
            "except RunDirError as e:\n    print(e)")
    r = _read_only(finished_run, tmp_path / "ro2", f"{py} -c {shlex.quote(code)} {{RUN}}")
    assert "cannot be written (Read-only file system): writing this run" in r.stdout, r.stderr
    assert _files(finished_run) == before
