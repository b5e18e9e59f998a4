"""Progress a person can read: a tqdm bar on a terminal, whole lines in a log.

A tqdm bar redraws itself with carriage returns; written into a redirected stderr (CI logs,
``nohup``, SLURM output files) that becomes one enormous line of frames. :func:`tqdm` is the
one factory every long loop of the package uses: when stderr is a terminal it returns
``tqdm.auto.tqdm`` unchanged; otherwise a :class:`LineProgress`, which writes one plain line
(description, count, elapsed time, ETA and rate) when the loop starts, at most every
:data:`LINE_INTERVAL_S` seconds while it runs, and when it ends. The same call also silences
the download and weight-loading bars of transformers and huggingface_hub in a log
(:func:`quiet_library_bars`). ``INTERP_PROGRESS=lines`` or ``=bar`` forces either form.

The ETA of both forms is steady (:func:`steady_seconds_per_item`): the remaining items times
the mean time of the items timed, weighed against a prior (``prior_s``: a measured
cost per item, :func:`interp.core.costs.wall_prior_s`) worth :data:`PRIOR_WEIGHT` items,
instead of tqdm's exponential moving average of the last updates, which swings with each
batch's length (a batch that decodes long answers, then one that stops at once).

See https://tqdm.github.io/docs/tqdm/ (``mininterval``, ``bar_format``, ``smoothing``).
"""

from __future__ import annotations

import contextvars
import os
import sys
from typing import Any

from tqdm import tqdm as _std_tqdm

__all__ = ["LINE_INTERVAL_S", "PRIOR_WEIGHT", "LineProgress", "Share", "advance", "is_terminal",
           "quiet_library_bars", "resumed", "steady_seconds_per_item", "tqdm"]

_SHARE: contextvars.ContextVar[Any] = contextvars.ContextVar("interp_progress_share",
                                                          default=None)

LINE_INTERVAL_S = 30.0
"""Least seconds between two progress lines of one loop in a log."""

LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} [{elapsed} elapsed, ETA {remaining}, {rate_fmt}]"


PRIOR_WEIGHT = 2.0
"""How many timed items the prior cost per item is worth in :func:`steady_seconds_per_item`."""


def steady_seconds_per_item(elapsed: float, done: float, prior_s: float | None = None,
                            weight: float = PRIOR_WEIGHT) -> float | None:
    """Seconds per item for the ETA: the running mean, pulled toward a prior while few are timed.

    ``(prior_s * weight + elapsed) / (weight + done)``: a posterior mean in which the prior
    counts as ``weight`` items of ``prior_s`` seconds each (without a prior, ``elapsed /
    done``). Each new item moves it by at most about ``1 / (weight + done)`` of the
    difference, so the ETA does not jump with one slow or fast batch as tqdm's exponential
    moving average does.

    Args:
        elapsed: seconds since the loop started (items read back as finished excluded:
            :func:`resumed`).
        done: items computed in that time.
        prior_s: the expected seconds per item (None: no prior).
        weight: items the prior is worth.

    Returns:
        Seconds per item, or None when there is nothing to go on (no prior, nothing done).
    """
    if prior_s is not None and prior_s > 0:
        return (prior_s * weight + max(elapsed, 0.0)) / (weight + max(done, 0.0))
    return elapsed / done if done > 0 and elapsed > 0 else None


class _Steady:
    """A tqdm whose rate (and so ETA) is :func:`steady_seconds_per_item`'s, not the EMA's."""

    def __init__(self, *args: Any, prior_s: float | None = None, **kwargs: Any):
        self.prior_s = prior_s
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self) -> dict[str, Any]:  # type: ignore[override]
        d = super().format_dict  # type: ignore[misc]
        if self.disable or d.get("elapsed") is None:  # type: ignore[attr-defined]
            return d
        per = steady_seconds_per_item(d["elapsed"], d["n"] - d.get("initial", 0), self.prior_s)
        d["rate"] = 1.0 / per if per else None
        return d


def is_terminal() -> bool:
    """Whether progress is drawn as a bar: stderr is a terminal (``INTERP_PROGRESS`` wins)."""
    forced = os.environ.get("INTERP_PROGRESS", "").lower()
    if forced in ("lines", "bar"):
        return forced == "bar"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class LineProgress(_Steady, _std_tqdm):
    """A tqdm that writes whole lines, never carriage returns (module docstring).

    Accepts every tqdm argument; ``mininterval`` defaults to :data:`LINE_INTERVAL_S`, the
    format to :data:`LINE_FORMAT` (no bar). The last line is written when the loop closes,
    also for ``leave=False`` bars, with the count reached.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("mininterval", LINE_INTERVAL_S)
        kwargs.setdefault("maxinterval", max(LINE_INTERVAL_S, 60.0))
        kwargs.setdefault("bar_format", LINE_FORMAT)
        kwargs["dynamic_ncols"] = False
        kwargs.setdefault("file", sys.stderr)
        self._last_line: str | None = None
        self._last_refresh_t = 0.0
        super().__init__(*args, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Write the current state as one line, unless it is the line written last."""
        if self.disable:
            return True
        line = self.format_meter(**self.format_dict)
        if line != self._last_line:
            self.fp.write(line + "\n")
            self.fp.flush()
            self._last_line = line
        return True

    def close(self) -> None:
        """Write the last line (the count reached), then release the bar without a redraw."""
        if getattr(self, "disable", True):
            return
        self.prior_s = None  # the overall rate, as tqdm's own final line
        self.display()
        self.disable = True
        self._decr_instances(self)

    def clear(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to clear: lines are never redrawn."""

    def refresh(self, *args: Any, **kwargs: Any) -> None:
        """Write a line through :meth:`display`, at most one per ``mininterval`` seconds.

        :func:`resumed` refreshes once per part read back; a resumed loop of 100 finished
        records then writes one line, not 100.
        """
        if self.disable:
            return
        now = self._time()
        if self._last_line is None or now - self._last_refresh_t >= self.mininterval:
            self._last_refresh_t = now
            self.display()


def quiet_library_bars() -> None:
    """Turn off transformers' and huggingface_hub's own bars when stderr is not a terminal."""
    if is_terminal():
        return
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def resumed(bar: Any, k: int = 1) -> None:
    """Count ``k`` items found finished (read back from a run) on ``bar``, outside its rate.

    A resumed loop reads its stored parts back in a fraction of a second each; counted with
    ``update`` they would enter the rate and the ETA would promise the remaining items at
    that speed. Here the count moves on and the rate (and so the ETA) keeps measuring only
    the items computed now, as tqdm's ``initial``.
    """
    if getattr(bar, "disable", True):
        return
    bar.n += k
    bar.initial += k
    bar.last_print_n += k
    bar.refresh()


def tqdm(*args: Any, prior_s: float | None = None, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(*args, **kwargs)`` on a terminal, else :class:`LineProgress`.

    Either form's ETA is steady (module docstring).

    Args:
        *args: as tqdm (an iterable).
        prior_s: expected seconds per item before any is timed (None: none), e.g.
            :func:`interp.core.costs.wall_prior_s`.
        **kwargs: as tqdm (``total``, ``desc``, ``unit``, ``leave``, ``disable``, ...).

    Returns:
        A tqdm instance (iterate it, or call ``update`` and ``close``).
    """
    if is_terminal():
        from tqdm.auto import tqdm as auto

        return type("SteadyBar", (_Steady, auto), {})(*args, prior_s=prior_s, **kwargs)
    quiet_library_bars()
    return LineProgress(*args, prior_s=prior_s, **kwargs)


class Share:
    """The part of a bar one chunk of work may advance, in small steps from deep inside it.

    A stage's bar counts examples; the forwards that make them (each prompt's prefill and
    every decoding step, :func:`interp.judging.prefill.run_prompts`) report fractions through
    :func:`advance`, so the bar moves within seconds instead of once per chunk of batches.
    The chunk's own update then sets the bar to its exact count (:meth:`done`), and
    :func:`advance` never passes the chunk's end.

    Args:
        bar: the bar (a :func:`tqdm`), or None (nothing is shown).
        n: examples in the chunk.
        prompts_per_example: prompts each example runs (generation and judge: 2).
    """

    def __init__(self, bar: Any, n: int, prompts_per_example: int = 2):
        self.bar, self.start, self.n = bar, float(getattr(bar, "n", 0) or 0), n
        self.per_prompt = 1.0 / prompts_per_example
        self._acc = 0.0
        self._token: Any = None

    def advance(self, examples: float) -> None:
        """Add ``examples`` (fractional); the bar shows the whole examples, short of the end."""
        if self.bar is None or examples <= 0:
            return
        self._acc = min(self._acc + examples, self.n - 1)
        if (step := int(self.start + self._acc) - int(self.bar.n)) > 0:
            self.bar.update(step)

    def done(self) -> None:
        """Set the bar to the chunk's end exactly."""
        if self.bar is not None:
            self.bar.update(int(self.start) + self.n - int(self.bar.n))

    def __enter__(self) -> Share:
        self._token = _SHARE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _SHARE.reset(self._token)


def advance(prompts: float) -> None:
    """Report ``prompts`` (fractional) finished to the enclosing :class:`Share`, if any."""
    if (share := _SHARE.get()) is not None:
        share.advance(prompts * share.per_prompt)
