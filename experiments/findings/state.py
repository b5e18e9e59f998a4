"""The saved state of a study: what ``make findings`` keeps in git so a study of hours resumes.

A study of hours is interrupted and resumed, and may resume on a fresh machine without
``runs/``. :func:`save_state` mirrors what is costly to make again of each run directory into a
state folder; :func:`restore_state` puts it back where the run directory is missing. In git the
state is one checksummed archive (``experiments/findings/state.tar.xz``, :func:`pack_state`,
:func:`unpack_state`). CLI: ``python -m experiments.findings --save-state RUNS STATE OUT ...`` and
``--restore-state STATE RUNS`` (:func:`experiments.findings.report.main`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from interp.core.names import CROSS_JUDGES

__all__ = ["ARCHIVE_SUFFIX", "SEED_FILES", "STATE_MARK", "STATE_MAX_PART_BYTES", "STATE_SKIP",
           "STATE_SUFFIXES", "UNPACKED",
           "STATE_WHOLE", "pack_state", "restore_state", "save_state", "seed_run", "unpack_state"]


STATE_SUFFIXES = (".json", ".jsonl")
"""What :func:`save_state` keeps of a run directory: its JSON files, which hold every costly
result (the records of Study 1, the parts of steering and patching, the permutations of a
probe null, the held-out and validation records of transfer, the reasoning replies)."""
STATE_MAX_PART_BYTES = 1 << 20
"""Besides its JSON, :func:`save_state` keeps every part a stage declares
(:data:`interp.core.contract.SPECS`) up to this size: the attention recordings (about 12 KB
a record, a forward each to make again); not the probe feature caches (tens of MB, one
forward per record to make again)."""
STATE_SKIP = ("figures", "record")
"""Folders :func:`save_state` leaves out, as a whole (so what is kept stays consistent): the
figures (redrawn) and the record stage's per-record folders (an index without its tensors). A
sharded run's shards are kept: a sharded rerun reads its records from them, not from the
merged run."""
STATE_WHOLE = ("checkpoints", "adapters")
"""Folders :func:`save_state` keeps whole, whatever their files' suffix and size, so a LoRA
training is never done twice across resumed runs: the last checkpoint of a training that has not
finished (:func:`interp.methods.lora.train_adapter` removes it once the adapter is saved; weights,
optimizer and RNG state, about 13 MB for Qwen2.5-0.5B at rank 8), which resumes at its step;
and the trained adapters (peft weights and ``interp_adapter.json``, written last; about 4 MB),
which a stage reads instead of training again: a learning-rate candidate between its training
and its held-out records, the chosen ones it copies. Once the stage has written its
``summary.json`` its records stand for its trainings (the transfer stage reads the chosen
adapters' metadata, ``select/chosen/``, instead of their weights) and these folders are left
out of the state. A checkpoint records what it trains; one
of another training is started again, never resumed; an adapter is checked against its base
model when loaded (:func:`interp.methods.lora.load_adapter`)."""


def _state_files(root: Path) -> list[Path]:
    """The files of a study's run folder that its saved state keeps (:func:`save_state`)."""
    import fnmatch

    from interp.core.contract import SPECS

    globs = [f"*/{p.glob}" for spec in SPECS for p in spec.parts]
    folders = {spec.folder for spec in SPECS if spec.folder}

    def unfinished(rel: Path) -> bool:  # its stage has not written its summary.json yet
        stage = next((i for i, part in enumerate(rel.parts[:-1]) if part in folders), None)
        return stage is None or not (root.joinpath(*rel.parts[:stage + 1])
                                     / "summary.json").exists()

    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if not p.is_file() or p.name.startswith(".") or set(rel.parts[:-1]) & set(STATE_SKIP):
            continue
        if p.suffix in STATE_SUFFIXES or (
                set(rel.parts[:-1]) & set(STATE_WHOLE) and unfinished(rel)) or (
                p.stat().st_size <= STATE_MAX_PART_BYTES
                and any(fnmatch.fnmatch(rel.as_posix(), g) for g in globs)):
            out.append(p)
    return sorted(out)


STATE_MARK = ".state"
"""The file :func:`restore_state` and :func:`save_state` leave in ``runs/<out>``: that folder
and the saved state are one (it names the state folder)."""


def save_state(runs: str | Path, dest: str | Path, outs: Sequence[str]) -> int:
    """Copy the resumable state of a study's run directories into a state folder.

    A study of many hours is resumed, maybe on a fresh machine without ``runs/``: what
    :data:`STATE_SUFFIXES`, :data:`STATE_MAX_PART_BYTES`, :data:`STATE_SKIP` and
    :data:`STATE_WHOLE` keep of ``runs/<out>/`` is mirrored to
    ``dest/<out>/`` (a file a stage removed as stale is removed there too), and
    :func:`restore_state` puts it back on a machine without ``runs/<out>``, so ``make
    findings`` (which restores first) resumes instead of starting again. Every stage checks
    what it reads back as always (signatures, the manifest's runtime facts): restored parts
    made under other settings are redone or refused, never mixed in.

    Only a run folder that is the state's (restored from it, or saved into it: its
    :data:`STATE_MARK` names ``dest/<out>``) may replace a saved state: a run started beside
    it on a fresh machine, or restored from another state, would otherwise erase the saved
    work. An ``out`` missing under ``runs`` is left as it is in ``dest``.

    Args:
        runs: the folder of the run directories (``runs``).
        dest: the state folder (``runs/.state``, unpacked from the archive).
        outs: the run folders to keep (``findings``, ``findings_matched``, ...).

    Returns:
        The number of files in the saved state of ``outs``.

    Raises:
        ValueError: ``runs/<out>`` is not the state's while ``dest/<out>`` holds a state
            (nothing is written for any ``out``).
    """
    runs, dest = Path(runs), Path(dest)
    todo = [o for o in outs if (runs / o).is_dir()]
    def ours(out: str) -> bool:
        mark = runs / out / STATE_MARK
        return mark.exists() and Path(mark.read_text().strip()).resolve() == (dest / out).resolve()

    for out in todo:
        if _state_files(dest / out) and not ours(out):
            raise ValueError(f"{runs / out} was not restored from {dest / out}, which holds a "
                             f"saved state: restore it first (python -m experiments.findings "
                             f"--restore-state {dest} {runs}, with {runs / out} moved away), "
                             f"or remove {dest / out} to replace it; nothing saved")
    n = 0
    for out in todo:
        src, dst = runs / out, dest / out
        keep = {p.relative_to(src) for p in _state_files(src)}
        for p in sorted(dst.rglob("*"), reverse=True) if dst.is_dir() else ():
            # every file the state no longer keeps (whatever made it a state file then), and
            # the folders that leaves empty
            if p.is_file() and p.relative_to(dst) not in keep:
                p.unlink()
            elif p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        for rel in sorted(keep):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src / rel, dst / rel)
        (src / STATE_MARK).write_text(f"{dst.resolve()}\n")
        n += len(keep)
    return n


def restore_state(src: str | Path, runs: str | Path,
                  log: Callable[[str], None] = print) -> int:
    """Put a saved state (:func:`save_state`) back where ``runs/<out>`` does not exist.

    A run folder that exists is never touched: on the machine that saved the state it is
    newer than the state (a stage may have removed a stale file since, which a restore must
    not bring back), and elsewhere it is someone's own run. Each ``runs/<out>`` is copied into
    a temporary folder beside it and renamed into place once whole, so a copy that fails
    (a full disk) leaves no half-restored run folder that a later restore would then keep.

    Returns:
        The number of files restored (0 when ``src`` does not exist).

    Raises:
        OSError: a copy failed (the temporary folder is removed; ``runs/<out>`` not made).
    """
    import os

    src, runs = Path(src), Path(runs)
    n = 0
    for out in sorted(p for p in src.iterdir() if p.is_dir()) if src.is_dir() else []:
        dst = runs / out.name
        if dst.exists():
            log(f"{dst} exists: kept as it is, nothing restored into it")
            continue
        tmp = runs / f".{out.name}.restoring"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            files = _state_files(out)
            for p in files:
                (tmp / p.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, tmp / p.relative_to(out))
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / STATE_MARK).write_text(f"{out.resolve()}\n")
            os.replace(tmp, dst)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        n += len(files)
    return n


SEED_FILES = ("manifest.json", "records.jsonl", "metrics.json", "patching/hard_negatives.jsonl")
"""What :func:`seed_run` copies of each model's run directory: Study 1 (its manifest, records
and metrics) and the patching stage's mined hard negatives (a closed-book sampling per record
to make again), the files another run of the same records reads instead of making them."""


def seed_run(src: str | Path, dst: str | Path, models: Sequence[str] = (),
             log: Callable[[str], None] = print) -> int:
    """Start a run folder from another's Study 1: a second config on the same records.

    A sensitivity run (``experiments/findings_gap.toml``: the candidate swap at another gap
    filter) needs the study's records, not a second Study 1 of an hour a model. For each model
    folder of ``src`` (``runs/findings/<model>``) whose ``dst/<model>`` has no records yet,
    :data:`SEED_FILES` are copied there (cross-judging runs, ``<judge>__judges__<source>`` of
    :func:`interp.run.cross_grid.cross_dir`, are not a model's Study 1 and stay out); the stages
    run on ``dst`` then check what they read as always (the manifest's config and runtime
    facts, each part's signature). A model folder that already has records is left as it is
    (it is its own run, maybe further on). ``models``: only these model folders (slugs; empty:
    every one).

    Returns:
        The number of files copied.

    Raises:
        FileNotFoundError: ``src`` holds no model folder with records, or lacks one of ``models``
            (one line naming it).
    """
    src, dst = Path(src), Path(dst)
    runs = sorted(p for p in src.iterdir() if (p / "records.jsonl").is_file()
                  and CROSS_JUDGES not in p.name) if src.is_dir() else []
    if missing := set(models) - {p.name for p in runs}:
        raise FileNotFoundError(f"{src} has no run directory with records.jsonl for "
                                f"{sorted(missing)}: run its Study 1 first (or restore its "
                                f"saved state)")
    if not runs:
        raise FileNotFoundError(f"{src} holds no run directory with records.jsonl: run its "
                                f"Study 1 first (or restore its saved state)")
    n = 0
    for m in runs:
        if models and m.name not in models:
            continue
        to = dst / m.name
        if (to / "records.jsonl").exists():
            log(f"{to} has records: kept as it is")
            continue
        for rel in SEED_FILES:
            if (m / rel).is_file():
                (to / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(m / rel, to / rel)
                n += 1
    return n


ARCHIVE_SUFFIX = ".tar.xz"
"""A saved state kept in git is one archive (:func:`pack_state`): a deterministic tar of the
state folder (names sorted, times, owners and modes fixed), xz-compressed, with its sha256 in
``<archive>.sha256`` beside it."""
UNPACKED = ".state"
"""The folder of ``runs/`` an archive is unpacked into (:func:`unpack_state`): the state folder
:func:`save_state` and :func:`restore_state` work on, which :func:`pack_state` packs again."""


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pack_state(folder: str | Path, archive: str | Path) -> str:
    """Pack a state folder into one checksummed archive, the same bytes for the same files.

    Every file of ``folder`` (hidden ones aside) goes in under its path relative to ``folder``,
    in sorted order, with mtime 0, owner 0 and mode 0644, so that an unchanged state packs to
    an unchanged archive (git stores it once). Written to a temporary file and renamed, then
    ``<archive>.sha256`` (``sha256sum`` format).

    Returns:
        The archive's sha256 (hex).
    """
    import lzma
    import os
    import tarfile

    folder, archive = Path(folder), Path(archive)
    tmp = archive.with_name(archive.name + ".tmp")
    archive.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(tmp, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w",
                                                             format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(q for q in folder.rglob("*") if q.is_file()
                        and not any(s.startswith(".") for s in q.relative_to(folder).parts)):
            info = tarfile.TarInfo(p.relative_to(folder).as_posix())
            info.size, info.mtime, info.mode = p.stat().st_size, 0, 0o644
            with open(p, "rb") as f:
                tar.addfile(info, f)
    os.replace(tmp, archive)
    digest = _sha256(archive)
    archive.with_name(archive.name + ".sha256").write_text(f"{digest}  {archive.name}\n")
    return digest


def unpack_state(archive: str | Path, folder: str | Path) -> int:
    """Unpack a checked archive (:func:`pack_state`) into ``folder``, replacing what was there.

    A folder already unpacked from the same archive bytes (its ``.sha256`` says so) is kept as
    it is: it may hold work :func:`save_state` put there since. Otherwise the archive is
    extracted into a temporary folder beside ``folder`` first, and ``folder`` is replaced only
    once the whole archive has extracted: an archive that does not (truncated, not xz, not a
    tar, a member outside the folder), even one whose ``.sha256`` was written for its damaged
    bytes, leaves ``folder`` as it was.

    Returns:
        The number of files unpacked (0 when the folder was kept).

    Raises:
        FileNotFoundError: the archive or its ``.sha256`` is missing.
        ValueError: the archive's sha256 is not the one recorded beside it, or the archive does
            not extract (nothing unpacked, ``folder`` untouched).
    """
    import lzma
    import os
    import tarfile

    archive, folder = Path(archive), Path(folder)
    sums = archive.with_name(archive.name + ".sha256")
    for p in (archive, sums):
        if not p.is_file():
            raise FileNotFoundError(f"{p} does not exist: a saved state is {archive.name} "
                                    f"and {sums.name} beside it")
    recorded = sums.read_text().split()
    want, got = (recorded[0] if recorded else ""), _sha256(archive)
    if want != got:
        raise ValueError(f"{archive} has sha256 {got[:12]}..., not {want[:12] or 'none'}... as "
                         f"{sums.name} records: a damaged or partly written archive; "
                         f"nothing unpacked")
    mark = folder / ".sha256"
    if mark.is_file() and mark.read_text().strip() == got:
        return 0
    tmp, old = (folder.with_name(f".{folder.name}.{what}") for what in ("unpacking", "replaced"))
    for p in (tmp, old):
        shutil.rmtree(p, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with tarfile.open(archive, "r:xz") as tar:
            members = tar.getmembers()
            tar.extractall(tmp, filter="data")
        (tmp / ".sha256").write_text(got + "\n")
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"{folder} kept as it was" if folder.exists() else "nothing unpacked"
        raise ValueError(f"{archive} does not extract ({type(e).__name__}: {e}) although its "
                         f"sha256 matches {sums.name}: a truncated or damaged archive was "
                         f"checksummed; {kept}. Take both files back from git "
                         f"(git checkout -- {archive} {sums})") from None
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return len(members)
