"""The set-up both endpoint benchmarks share: their arguments, the in-process run, a server.

``benchmarks/endpoint_study1.py`` and ``benchmarks/endpoint_oracle.py`` take the same options
(``--n`` records of ``--dataset``, ``--threads`` of the llama.cpp server, ``--out``), start from
the same in-process Study 1 run (:func:`inprocess_run`: the bundled SmolLM2, float32 on CPU,
rule oracle, into ``OUT/inprocess``; it resumes) and serve a bundled GGUF on 127.0.0.1 with one
slot, or ``parallel`` slots (:func:`serve`, :func:`endpoint_table`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from interp.endpoints.local import LocalServer  # noqa: E402
from interp.models.loading import bundled_gguf  # noqa: E402
from interp.stages.asymmetry import AsymmetryConfig  # noqa: E402
from interp.stages.asymmetry import run as run_asymmetry  # noqa: E402

SMOLLM2 = "smollm2-135m-instruct"


def parse_args(doc: str | None) -> argparse.Namespace:
    """Both benchmarks' options.

    ``--n`` (30), ``--dataset`` (squad_v2), ``--threads`` (1), ``--parallel`` (4),
    ``--reverse``, ``--out``.
    """
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=4,
                    help="slots of the parallel server and requests in flight to it "
                         "(benchmarks/endpoint_study1.py)")
    ap.add_argument("--dataset", default="squad_v2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reverse", action="store_true",
                    help="the runs in reverse order (the in-process run last), so a drifting "
                         "machine load is seen from the other side (benchmarks/endpoint_study1.py)")
    ap.add_argument("--out", default="/tmp/interp-bench-endpoints")
    return ap.parse_args()


def base_config(a: argparse.Namespace) -> dict[str, Any]:
    """The fields of :class:`AsymmetryConfig` both runs of a comparison share."""
    return dict(datasets=[a.dataset], limit=a.n, device="cpu", n_boot=1000)


def inprocess_run(a: argparse.Namespace) -> tuple[Path, dict[str, Any], float]:
    """The in-process SmolLM2 run into ``OUT/inprocess``: (its path, metrics, wall seconds).

    The seconds are the run's, the model loaded before the clock starts (a served run's
    clock starts with its server up, too).
    """
    from interp.models.loading import load_model

    path = Path(a.out) / "inprocess"
    handle = load_model(SMOLLM2, device="cpu", dtype="float32")
    t0 = time.perf_counter()
    metrics = run_asymmetry(path, handle, AsymmetryConfig(model=SMOLLM2, dtype="float32",
                                                          **base_config(a)),
                            log=lambda s: None)
    return path, metrics, time.perf_counter() - t0


def serve(name: str, alias: str, a: argparse.Namespace, parallel: int = 1) -> LocalServer:
    """The bundled GGUF ``name`` served by llama.cpp as ``alias`` (``--threads``).

    ``parallel`` slots share the context (4,096 tokens per slot).
    """
    return LocalServer(bundled_gguf(name), alias, threads=a.threads, parallel=parallel,
                       n_ctx=4096 * parallel)


def endpoint_table(srv: LocalServer) -> dict[str, Any]:
    """The endpoint table of a local server: as many requests in flight as it has slots.

    Each request may take 10 minutes.
    """
    return {"base_url": srv.base_url, "concurrency": srv.parallel, "timeout_s": 600}
