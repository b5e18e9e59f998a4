"""Tracked text speaks of the project only: not of how, when or by whom it was worked on.

Docs, README, docstrings, comments, the Makefile, configs and benchmarks may not tell the
story of their making (work periods, "so far", "how far it got"). The tests' own text is
left out: there "session" is pytest's (a session fixture) and the browser's (a CDP session).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

NARRATIVE = re.compile(
    r"\bsessions?\b|\bso far\b|\bhow far it got\b|\bnot yet known\b|\bat the time of writing\b"
    r"|\bfor now\b|\bthis round\b|\bwork periods?\b|\bas of (today|now)\b", re.I)
"""Phrases that narrate the work instead of describing the project."""
TEXT = re.compile(r"\.(py|md|toml|txt|cfg|yml|yaml|ipynb)$|(^|/)(Makefile|run)$")
SKIP = re.compile(r"^tests/|^interp/bundled/.*\.jsonl$")


def tracked_text() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [f for f in out if TEXT.search(f) and not SKIP.search(f)]


def hits(text: str) -> list[tuple[int, str]]:
    """``(line number, phrase)`` of every narrating phrase in ``text``."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
            for m in NARRATIVE.finditer(line)]


def test_the_pattern_finds_narration_and_passes_description():
    assert hits("The sixth session of 2026-12-03 ran it.\nGA so far is 0.5.") == [
        (1, "session"), (2, "so far")]
    assert hits("## How far it got") == [(1, "How far it got")]
    assert hits("Each record is resumable; a killed run keeps its finished records.") == []


def _quoted_data(line: str) -> bool:
    """A line that quotes a bundled record's passage (a few-shot example): data, not narration."""
    text = line.strip().removeprefix("Context:").strip()
    return len(text) > 40 and any(text in p.read_text(encoding="utf-8")
                                  for p in (ROOT / "interp" / "bundled").rglob("*.jsonl"))


def test_no_tracked_text_narrates_its_making():
    found = []
    for f in tracked_text():
        lines = (ROOT / f).read_text(encoding="utf-8", errors="replace").splitlines()
        found += [f"{f}:{n}: {p!r}" for n, p in hits("\n".join(lines))
                  if not _quoted_data(lines[n - 1])]
    assert not found, "tracked text that narrates its making:\n" + "\n".join(found)
