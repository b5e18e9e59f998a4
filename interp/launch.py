"""Runs split over processes by the standard launchers: which records a process owns.

``interp`` has no scheduler of its own: torchrun (or ``accelerate launch``), a SLURM job array,
Ray or a shell loop starts the processes; each process learns its shard here and works on its
records only, into an ordinary resumable run directory of its own; :mod:`interp.stages.merge` turns
the finished shards into one run.

Algorithm:

1. **Identity** (:func:`current_shard`): an explicit ``--shard I/N`` (``I`` from 0) wins; else
   torchrun / ``accelerate launch`` (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); else a SLURM
   array (``SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN`` of ``SLURM_ARRAY_TASK_COUNT``). One
   shard in all (``N = 1``) is no sharding.
2. **Records** (:func:`assign`): the examples are selected globally first, exactly as an
   unsharded run selects them (same ``limit``, order and seed,
   :func:`interp.stages.asymmetry.check_inputs`); then whole passages are dealt out: the
   passages (:func:`interp.data.passage_turns`, the bootstrap's cluster) in the order of their
   first question, passage ``k`` to shard ``k mod N``. A passage's questions stay together, the
   assignment needs no model, and a larger ``limit`` keeps every earlier record in its shard
   (the selection grows at its end).
3. **Device** (:meth:`Shard.device`): ``cuda:LOCAL_RANK`` when CUDA is present, else the CPU.
4. **Where** (:meth:`Shard.dir`): shard ``I`` of ``N`` writes ``OUT/shards/I-of-N/``, an
   ordinary run directory (resumable: a killed shard reruns the same command). Its manifest
   holds ``shard``: index, count, launcher, the global position of every record it owns and
   the fingerprint of the global selection's content (:func:`selection_sha256`), which is
   what :mod:`interp.stages.merge` checks. Shards of another ``N`` under the same ``OUT``
   are refused (:func:`check_count`): the records would be dealt out differently.
5. **Together** (:func:`barrier`): under torchrun every process waits for the others with a
   ``torch.distributed`` (gloo) barrier; rank 0 merges. That is all the process group is used
   for.
6. **Alive** (:func:`heartbeat`, :func:`dead_ranks`): from the start of its work each joined
   process refreshes ``OUT/shards/heartbeats/I-of-N.json`` (pid, host, launch identity,
   barriers passed) every :data:`HEARTBEAT_S` seconds. A process waiting at a barrier looks at
   the others' every second: one whose process is gone (same host), whose heartbeat is older
   than :func:`stale_after` (default :data:`STALE_S`), or which has written none that long,
   is dead; the waiter then stops in one line naming it (records on disk are kept) instead
   of waiting for the barrier's timeout.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from interp.core.errors import ShardError
from interp.core.io import write_json
from interp.data import QAExample, passage_turns

__all__ = ["HEARTBEAT_S", "SHARDS_DIR", "STALE_S", "Shard", "assign", "barrier", "check_count",
           "current_shard", "dead_ranks", "finish", "heartbeat", "parse_shard", "shard_dirs",
           "stale_after"]

SHARDS_DIR = "shards"
"""Folder of a run directory that holds its shards (``OUT/shards/I-of-N/``)."""
_NAME = re.compile(r"(\d+)-of-(\d+)")


@dataclass(frozen=True)
class Shard:
    """One process's share of a run.

    Attributes:
        index: the shard, ``0 <= index < count``.
        count: shards in all (``N``).
        launcher: who said so: ``torchrun`` (also ``accelerate launch``), ``slurm`` or
            ``--shard``.
        local_rank: the process's index on its machine (torchrun's ``LOCAL_RANK``), for the
            device; None: ``index``.
    """

    index: int
    count: int
    launcher: str = "--shard"
    local_rank: int | None = None

    @property
    def name(self) -> str:
        """``I-of-N``."""
        return f"{self.index}-of-{self.count}"

    @property
    def joined(self) -> bool:
        """Whether the processes form a torch.distributed group (torchrun): rank 0 merges."""
        return self.launcher == "torchrun"

    def dir(self, out: str | Path) -> Path:
        """The shard's run directory ``OUT/shards/I-of-N``."""
        return Path(out) / SHARDS_DIR / self.name

    def device(self, asked: str | None = None) -> str | None:
        """The device this shard runs on: ``cuda:LOCAL_RANK`` with CUDA, else the CPU.

        ``asked`` (a config's ``device``) wins unless it is None or a bare ``cuda``; without
        CUDA it is returned as it is (None: the CPU, as unsharded).
        """
        import torch

        if asked not in (None, "cuda"):
            return asked
        if torch.cuda.is_available():
            rank = self.index if self.local_rank is None else self.local_rank
            return f"cuda:{rank % torch.cuda.device_count()}"
        return asked

    def provenance(self, keys: Sequence[str], positions: Sequence[int], total: int,
                   data_sha256: str | None = None) -> dict[str, Any]:
        """The manifest's ``shard`` entry (step 4): ``keys`` ``"dataset/id"`` owned, in order.

        ``data_sha256`` is :func:`selection_sha256` of the global selection (every shard's
        examples, not only this one's): shards of one run must share it.
        """
        return {"index": self.index, "count": self.count, "launcher": self.launcher,
                "name": self.name, "keys": list(keys), "positions": list(positions),
                "total": total, "data_sha256": data_sha256}


def selection_sha256(loaded: Mapping[str, Sequence[QAExample]]) -> str:
    """sha256 of the selected examples' content, in selection order (step 4).

    Every field a record is made from enters (dataset, id, question, context, gold answers,
    answerable, the dataset's extras), so two copies of a data file with the same path, ids
    and count but an edited gold answer give different fingerprints; a path does not enter.
    """
    h = hashlib.sha256()
    for exs in loaded.values():
        for ex in exs:
            h.update(json.dumps([ex.dataset, ex.id, ex.question, ex.context,
                                 list(ex.answers), ex.answerable, ex.extras],
                                sort_keys=True, default=str).encode())
            h.update(b"\n")
    return h.hexdigest()


def parse_shard(spec: str) -> Shard:
    """``"I/N"`` as a :class:`Shard` (``I`` counted from 0).

    Raises:
        ShardError: not two whole numbers, ``N < 1`` or ``I`` outside ``0..N-1``.
    """
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if not m:
        raise ShardError(f"--shard {spec!r}: use I/N with I counted from 0, e.g. --shard 0/4")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise ShardError(f"--shard {spec}: I must be in 0..N-1 and N >= 1 (shards are counted "
                         f"from 0: 0/{max(n, 1)} ... {max(n, 1) - 1}/{max(n, 1)})")
    return Shard(i, n, "--shard")


TORCHRUN_VARS = ("RANK", "MASTER_ADDR", "MASTER_PORT")
"""What a process of a torchrun group needs besides ``WORLD_SIZE``: its rank, and where the
rendezvous of :func:`barrier` is (``env://``). Without ``RANK`` every process would claim
shard 0; without the address it would work on its records, then die at the barrier."""


def _whole(env: Mapping[str, str], name: str, default: int) -> int:
    raw = str(env.get(name, "") or "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ShardError(f"{name}={raw!r} is not a whole number; a launcher sets it "
                         f"(torchrun, accelerate launch, SLURM)") from None


def current_shard(spec: str | None = None, env: Mapping[str, str] | None = None
                  ) -> Shard | None:
    """This process's shard (step 1), or None when the run is not split.

    Args:
        spec: ``--shard I/N`` (wins over the environment).
        env: the environment (default ``os.environ``).

    Raises:
        ShardError: a malformed ``--shard``; ``WORLD_SIZE > 1`` without one of
            :data:`TORCHRUN_VARS` (named); a launcher variable that is not a whole number; or
            variables that contradict each other (``RANK >= WORLD_SIZE``).
    """
    env = os.environ if env is None else env
    if spec:
        shard = parse_shard(spec)
    elif (n := _whole(env, "WORLD_SIZE", 1)) > 1:
        if missing := [k for k in TORCHRUN_VARS if not str(env.get(k, "")).strip()]:
            names = ", ".join(missing[:-1]) + " and " * (len(missing) > 1) + missing[-1]
            raise ShardError(
                f"WORLD_SIZE={n} is set but {names} {'is' if len(missing) == 1 else 'are'} "
                f"not: start the processes with torchrun or accelerate launch (they set "
                f"{', '.join(TORCHRUN_VARS)}), or give each process --shard I/{n}")
        i = _whole(env, "RANK", 0)
        if not 0 <= i < n:
            raise ShardError(f"RANK={i} is outside WORLD_SIZE={n}: not a torchrun environment")
        local = env.get("LOCAL_RANK")
        shard = Shard(i, n, "torchrun", _whole(env, "LOCAL_RANK", 0) if local else None)
    elif (n := _whole(env, "SLURM_ARRAY_TASK_COUNT", 1)) > 1:
        i = _whole(env, "SLURM_ARRAY_TASK_ID", 0) - _whole(env, "SLURM_ARRAY_TASK_MIN", 0)
        if not 0 <= i < n:
            raise ShardError(f"SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN = {i} is outside "
                             f"0..{n - 1}: use a contiguous array (--array=0-{n - 1})")
        shard = Shard(i, n, "slurm")
    else:
        return None
    return shard if shard.count > 1 else None


def assign(loaded: Mapping[str, Sequence[QAExample]], shard: Shard
           ) -> tuple[dict[str, list[QAExample]], list[int], int]:
    """The examples a shard owns (step 2).

    Args:
        loaded: ``{dataset: examples}`` as the unsharded run selects them, in config order.
        shard: the shard.

    Returns:
        ``(owned, positions, total)``: ``{dataset: its owned examples, in order}``, the global
        position (in the concatenation of ``loaded``) of each owned example, and the number of
        examples in all.
    """
    flat = [(ds, ex) for ds, examples in loaded.items() for ex in examples]
    turns = passage_turns((ex for _, ex in flat), shard.count)
    owned: dict[str, list[QAExample]] = {ds: [] for ds in loaded}
    positions: list[int] = []
    for pos, ((ds, ex), turn) in enumerate(zip(flat, turns, strict=True)):
        if turn == shard.index:
            owned[ds].append(ex)
            positions.append(pos)
    return owned, positions, len(flat)


def shard_dirs(out: str | Path) -> list[Path]:
    """The shard run directories under ``OUT/shards/`` (those with a manifest), sorted."""
    root = Path(out) / SHARDS_DIR
    found = [p for p in root.iterdir() if _NAME.fullmatch(p.name) and
             (p / "manifest.json").exists()] if root.is_dir() else []
    return sorted(found, key=lambda p: tuple(int(x) for x in _NAME.fullmatch(p.name).groups()))


def check_count(out: str | Path, shard: Shard) -> None:
    """Refuse to shard ``OUT`` into ``N`` shards when it holds shards of another count.

    Records are dealt out by ``N`` (step 2): shards of two counts would own overlapping
    records. Rerun with the count the existing shards have, or remove ``OUT/shards``.

    Raises:
        ShardError: one line naming the existing count and both ways out.
    """
    other = sorted({int(_NAME.fullmatch(p.name).group(2)) for p in shard_dirs(out)} -
                   {shard.count})
    if other:
        raise ShardError(f"{Path(out) / SHARDS_DIR} holds shards of {other[0]} (not "
                         f"{shard.count}): rerun with --shard I/{other[0]} (or the same "
                         f"launcher size), or remove {Path(out) / SHARDS_DIR} to start over")


_GROUP: list[bool] = []


BARRIER_TIMEOUT_S = 6 * 3600.0
"""Longest wait at a barrier, seconds (``INTERP_BARRIER_TIMEOUT_S`` overrides): a process
waits there for the slowest one to finish its share, so it is long, but bounded: a rank that
died (under a launcher without torchrun's agent, which would stop the group) does not keep
the others waiting for days."""


def barrier_timeout(env: Mapping[str, str] | None = None) -> float:
    """The barrier's timeout in seconds (:data:`BARRIER_TIMEOUT_S`, or the environment's).

    Raises:
        ShardError: ``INTERP_BARRIER_TIMEOUT_S`` is not a number of seconds > 0.
    """
    raw = str((os.environ if env is None else env).get("INTERP_BARRIER_TIMEOUT_S", "")).strip()
    if not raw:
        return BARRIER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ShardError(f"INTERP_BARRIER_TIMEOUT_S={raw!r}: give the longest wait at a "
                         f"barrier in seconds, a number > 0 (default {BARRIER_TIMEOUT_S:.0f})")
    return value


HEARTBEAT_S = 5.0
"""Seconds between two refreshes of a joined process's heartbeat file (step 6)."""
STALE_S = 90.0
"""A heartbeat older than this many seconds (``INTERP_HEARTBEAT_STALE_S`` overrides) is a
dead rank's, as is none at all after waiting that long (step 6)."""
HEARTBEATS_DIR = "heartbeats"
"""Folder of ``OUT/shards/`` that holds the heartbeat files (no shard's name: the merge skips
it)."""


def stale_after(env: Mapping[str, str] | None = None) -> float:
    """The age in seconds at which a heartbeat is a dead rank's.

    :data:`STALE_S`, or the environment's ``INTERP_HEARTBEAT_STALE_S``.

    Raises:
        ShardError: ``INTERP_HEARTBEAT_STALE_S`` is not a number of seconds, at least three
            heartbeats (:data:`HEARTBEAT_S`).
    """
    raw = str((os.environ if env is None else env).get("INTERP_HEARTBEAT_STALE_S", "")).strip()
    if not raw:
        return STALE_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 3 * HEARTBEAT_S:
        raise ShardError(f"INTERP_HEARTBEAT_STALE_S={raw!r}: give the age of a dead rank's "
                         f"heartbeat in seconds, at least {3 * HEARTBEAT_S:g} (three beats; "
                         f"default {STALE_S:.0f})")
    return value


def _launch_id() -> str:
    """This launch's identity (heartbeats an earlier launch left are not this one's)."""
    e = os.environ
    return ":".join(e.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"))


class _Beat:
    """This process's heartbeat: a file rewritten by a daemon thread (step 6)."""

    def __init__(self, path: Path, shard: Shard) -> None:
        self.path, self.shard, self.passed = path, shard, 0
        self.stop = threading.Event()
        self.write()
        self.thread = threading.Thread(target=self.run, name="interp-heartbeat", daemon=True)
        self.thread.start()

    def write(self) -> None:
        write_json(self.path, {"rank": self.shard.index, "count": self.shard.count,
                               "pid": os.getpid(), "host": socket.gethostname(),
                               "launch": _launch_id(), "passed": self.passed,
                               "time": time.time()})

    def run(self) -> None:
        while not self.stop.wait(HEARTBEAT_S):
            try:
                self.write()
            except OSError:   # a full or vanished disk: the others see the beat go stale
                pass


_BEAT: list[_Beat] = []


def heartbeat(out: str | Path, shard: Shard | None) -> None:
    """Start (or move) this process's heartbeat under ``OUT/shards/heartbeats/`` (step 6).

    Only joined processes (torchrun) have one: they are the ones that wait for each other.

    Args:
        out: the run directory the shards belong to.
        shard: this process's shard (None, or not ``joined``: nothing to do).
    """
    if shard is None or not shard.joined:
        return
    path = Path(out) / SHARDS_DIR / HEARTBEATS_DIR / f"{shard.name}.json"
    if _BEAT and _BEAT[0].path == path:
        return
    _stop_beat()
    path.parent.mkdir(parents=True, exist_ok=True)
    _BEAT.append(_Beat(path, shard))


def _stop_beat() -> None:
    if _BEAT:
        beat = _BEAT.pop()
        beat.stop.set()
        beat.thread.join(timeout=2 * HEARTBEAT_S)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` of this machine runs (a zombie, dead but unreaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process of that id: alive
        return True
    try:   # Linux: the state after the command name in /proc/PID/stat
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def dead_ranks(folder: str | Path, shard: Shard, *, waited: float, passed: int = 0,
               stale: float | None = None) -> list[str]:
    """The other ranks that are dead, each as ``"I-of-N (why)"`` (step 6).

    Args:
        folder: ``OUT/shards/heartbeats``.
        shard: this process's shard.
        waited: seconds this process has waited at the barrier until now.
        passed: barriers this process has passed (a rank that passed more is not waited for).
        stale: the age of a dead rank's heartbeat (default :func:`stale_after`).

    Returns:
        The dead ranks, by index (empty: none known dead).
    """
    stale = stale_after() if stale is None else stale
    host, launch, now = socket.gethostname(), _launch_id(), time.time()
    out = []
    for i in range(shard.count):
        if i == shard.index:
            continue
        name = f"{i}-of-{shard.count}"
        path = Path(folder) / f"{name}.json"
        try:
            beat = json.loads(path.read_text())
            age = now - path.stat().st_mtime
        except (OSError, ValueError):
            beat, age = None, 0.0
        if beat is None or beat.get("launch") != launch:
            if waited > stale:
                out.append(f"{name} (no heartbeat in {waited:.0f} s at the barrier: it never "
                           f"started, or died before its work)")
            continue
        if int(beat.get("passed", 0)) > passed:
            continue   # it passed this barrier: the barrier is complete
        if beat.get("host") == host and not _alive(int(beat.get("pid", -1))):
            out.append(f"{name} (its process {beat.get('pid')} on {host} is gone)")
        elif age > stale:
            out.append(f"{name} (its last heartbeat is {age:.0f} s old, on "
                       f"{beat.get('host')})")
    return out


def barrier(shard: Shard | None, what: str = "") -> None:
    """Wait until every process of a torchrun group gets here (step 5); no-op otherwise.

    The gloo process group is made on the first call (``env://``: torchrun's
    ``MASTER_ADDR``/``MASTER_PORT``) with :func:`barrier_timeout`; joining the group and each
    barrier wait at most that long. While this process waits, the others' heartbeats are
    read every second (step 6, when this process has one, :func:`heartbeat`): a dead rank
    ends the wait at once.

    Args:
        shard: this process's shard (None, or not ``joined``: nothing to wait for).
        what: what this process has finished, for the message.

    Raises:
        ShardError: a rank died (one line naming it), or the other processes did not arrive
            within the timeout (one line); what this process finished is on disk and kept.
    """
    if shard is None or not shard.joined:
        return
    timeout = barrier_timeout()
    beat = _BEAT[0] if _BEAT else None
    kept = (f"kept on disk: {what or 'its finished work'}; rerun the missing shards with "
            f"--shard I/{shard.count}, then interp merge")
    done: list[BaseException | None] = []

    def wait() -> None:
        import torch.distributed as dist

        try:
            if not dist.is_initialized():
                dist.init_process_group("gloo", rank=shard.index, world_size=shard.count,
                                        timeout=timedelta(seconds=timeout))
                _GROUP.append(True)
            dist.barrier()
            done.append(None)
        except BaseException as err:   # noqa: BLE001 (handed to the waiting thread)
            done.append(err)

    # the group's join and barrier block in C++; a thread waits on them, this one watches
    thread = threading.Thread(target=wait, name="interp-barrier", daemon=True)
    t0 = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(1.0)
        if thread.is_alive() and beat is not None and (dead := dead_ranks(
                beat.path.parent, shard, waited=time.monotonic() - t0, passed=beat.passed)):
            raise ShardError(f"shard {shard.name}: rank {dead[0]} died while this process "
                             f"waited at the barrier; {kept}")
    err = done[0] if done else RuntimeError("the barrier thread ended without a result")
    if err is not None:
        if not isinstance(err, RuntimeError | TimeoutError):   # DistBackendError etc. are
            raise err                                          # RuntimeErrors
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err)
        raise ShardError(
            f"shard {shard.name}: the other processes did not reach the barrier within "
            f"{timeout:g} s (INTERP_BARRIER_TIMEOUT_S; {reason}); {kept}") from None
    if beat is not None:
        beat.passed += 1
        beat.write()


def finish() -> None:
    """Leave the process group :func:`barrier` made and stop the heartbeat (end of a command).

    The heartbeat file stays, with the barriers this process passed: a rank still waiting
    at one this process passed is not told it died.
    """
    _stop_beat()
    if _GROUP:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        _GROUP.clear()
