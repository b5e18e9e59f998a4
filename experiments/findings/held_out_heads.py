r"""The top head of the candidate swap, chosen on half the pairs and tested on the other half.

The head tests (experiments/findings/head_test.py) patch the heads the sweep ranked first, on the
same pairs the sweep ranked them on: a description of those pairs, not a test. Here the pairs
are split by passage into two halves (a seeded hash of the passage id, so no passage is on
both sides); on each half the sweep's exact per-pair rows (the ``heads`` parts of the
patching stage, ``exact = "topk"``) choose the head with the largest restored share among the
heads verified on at least half of that half's pairs, and the head test's per-pair patched
runs give that head's share on the OTHER half, a ratio of sums with a passage-cluster
bootstrap 95% CI (:func:`interp.analysis.stats.cluster_bootstrap_ratio`). A head the head
test did not patch has no held-out number (``held_out`` None, and the reason)::

    python -m experiments.findings.held_out_heads runs/findings_gap/MODEL \\
        figures/findings/gap/MODEL__head_test.json figures/findings/gap/MODEL__heads_held_out.json
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from interp.analysis.stats import cluster_bootstrap_ratio
from interp.core.io import write_json

__all__ = ["choose", "halves", "held_out", "main"]


def halves(passages: Sequence[str], seed: int = 0) -> tuple[set[str], set[str]]:
    """Two disjoint halves of the passages: sorted by a seeded sha1, then dealt alternately."""
    order = sorted(set(passages), key=lambda p: hashlib.sha1(f"{seed}:{p}".encode()).hexdigest())
    return set(order[0::2]), set(order[1::2])


def choose(parts: Sequence[Mapping[str, Any]], keep: set[str]) -> dict[str, Any]:
    """The head with the largest restored share on the pairs of the passages ``keep``.

    A head counts where the sweep verified it exactly; it must be verified on at least half of
    those pairs (the sweep's own rule for its top units).

    Returns:
        ``{"head": "L{layer}.H{head}", "ratio", "n_pairs", "n_selection_pairs"}``.

    Raises:
        ValueError: no head is verified on half of the pairs.
    """
    sums: dict[str, list[float]] = {}
    pairs = [p for p in parts if p["meta"]["passage"] in keep]
    for p in pairs:
        m = p["meta"]
        gap = m["clean_ld"] - m["corrupt_ld"]
        for r in p["rows"]:
            if r.get("verified") and r.get("ld") is not None:
                s = sums.setdefault(f"L{r['layer']}.H{r['head']}", [0.0, 0.0, 0])
                s[0] += float(np.sign(gap) * (r["ld"] - m["corrupt_ld"]))
                s[1] += abs(gap)
                s[2] += 1
    ok = {h: s for h, s in sums.items() if s[2] >= len(pairs) / 2 and s[1] > 0}
    if not ok:
        raise ValueError(f"no head is verified on half of the {len(pairs)} selection pairs")
    head = max(ok, key=lambda h: ok[h][0] / ok[h][1])
    return {"head": head, "ratio": ok[head][0] / ok[head][1], "n_pairs": ok[head][2],
            "n_selection_pairs": len(pairs)}


def held_out(test: Mapping[str, Any], head: str, keep: set[str], n_boot: int = 2000,
             seed: int = 0) -> dict[str, Any] | None:
    """``head``'s denoising share on the head test's pairs of the passages ``keep``.

    Returns:
        ``{"value", "ci", "n", "n_clusters"}`` (:func:`cluster_bootstrap_ratio`), or None when
        the head test did not patch ``head``.
    """
    pairs = [p for p in test["pairs"] if p["passage"] in keep]
    if not pairs or head not in pairs[0]["heads"]:
        return None
    gap = np.array([p["clean_ld"] - p["corrupt_ld"] for p in pairs])
    num = np.sign(gap) * np.array([p["heads"][head]["denoised_ld"] - p["corrupt_ld"]
                                   for p in pairs])
    return cluster_bootstrap_ratio(num, np.abs(gap), [p["passage"] for p in pairs],
                                   np.random.default_rng(seed), n_boot)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Choose on each half, test on the other, write the JSON (module docstring)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3:
        raise SystemExit("usage: python -m experiments.findings.held_out_heads RUN_DIR "
                         "HEAD_TEST_JSON OUT_JSON")
    run, test_path, out = (Path(a) for a in args)
    folder = run / "patching" / "candidate-swap" / "heads" / "parts"
    for p in (folder, test_path):
        if not p.exists():
            raise SystemExit(f"error: {p} does not exist (run the patching stage of "
                             f"experiments/findings_gap.toml and "
                             f"experiments/findings/head_test.py)")
    parts = [json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))]
    test = json.loads(test_path.read_text())
    a, b = halves([p["meta"]["passage"] for p in parts])
    rows = []
    for name, sel, other in (("A", a, b), ("B", b, a)):
        chosen = choose(parts, sel)
        result = held_out(test, chosen["head"], other)
        rows.append({"select_on": name, "n_selection_passages": len(sel),
                     "chosen": chosen, "n_test_passages": len(other), "held_out": result,
                     "note": None if result else (f"{chosen['head']} is not among the head "
                                                  f"test's heads {sorted(test['head_sets'])}")})
    report = {"model": test.get("model"), "run": str(run), "pair": "candidate-swap",
              "split": "passages by seeded sha1 (seed 0), dealt alternately",
              "measure": "denoising share, ratio of sums, passage-cluster bootstrap 95% CI",
              "halves": rows}
    write_json(out, report)
    print(json.dumps(rows, indent=1))
    return report


if __name__ == "__main__":
    main()
