"""The saved state of a study: what ``make findings`` keeps in git so a study of hours resumes.

A study of hours is interrupted and resumed, and may resume on a fresh machine without
``runs/``. :func:`save_state` mirrors what is costly to make again of each run directory into a
state folder; :func:`restore_state` puts it back where the run directory is missing. In git the
state is a folder of checksummed part archives (``experiments/findings/state.parts``: one per
stage and model, :func:`pack_state`, :func:`unpack_state`), so a save adds to a clone only the
parts that changed. CLI: ``python -m experiments.findings --save-state RUNS STATE OUT ...`` and
``--restore-state STATE RUNS`` (:func:`experiments.findings.report.main`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

from interp.core.names import CROSS_JUDGES

__all__ = ["ARCHIVE_SUFFIX", "INPUTS", "PART_DEPTH", "SEED_FILES", "STATE_MARK",
           "STATE_MAX_PART_BYTES", "STATE_SKIP", "STATE_SUFFIXES", "STATE_WHOLE", "SUMS",
           "UNPACKED", "pack_state", "part_of", "restore_state", "save_state", "seed_run",
           "unpack_state"]


STATE_SUFFIXES = (".json", ".jsonl")
"""What :func:`save_state` keeps of a run directory: its JSON files, which hold every costly
result (the records of Study 1, the parts of steering and patching, the permutations of a
probe null, the held-out and validation records of transfer, the reasoning replies)."""
STATE_MAX_PART_BYTES = 1 << 20
"""Besides its JSON, :func:`save_state` keeps every part a stage declares
(:data:`interp.core.contract.SPECS`) and marks ``saved`` up to this size a file: the attention
recordings (about 12 KB a record, a forward each to make again). Parts marked not ``saved``
are left out whatever their files' size: the probe feature caches (tens of MB, one forward per
record to make again) and the calibration's direction states (every layer's residual stream
at two positions, about 250 KB a record, 150 of them 39 MB, 5 s a record to make again)."""
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

    globs = [f"*/{p.glob}" for spec in SPECS for p in spec.parts if p.saved]
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


ARCHIVE_SUFFIX = ".parts"
"""A saved state kept in git is a folder of part archives named ``*.parts``
(:func:`pack_state`): one deterministic xz-compressed tar per part (:func:`part_of`) and the
parts' sha256 in :data:`SUMS`. A save rewrites only the parts whose files changed, so git keeps
every unchanged part's blob and a clone grows by what changed, not by the whole state."""
UNPACKED = ".state"
"""The folder of ``runs/`` a packed state is unpacked into (:func:`unpack_state`): the state
folder :func:`save_state` and :func:`restore_state` work on, which :func:`pack_state` packs
again."""
SUMS = "SHA256SUMS"
"""The packed state's list of its parts with their sha256 (``sha256sum`` format), written last."""
INPUTS = "INPUTS"
"""The packed state's digest of each part's input files (their paths and bytes), beside
:data:`SUMS`: :func:`pack_state` compresses again only the parts whose files changed."""
PART_DEPTH = 3
"""A part holds the files of one folder ``<out>/<model>/<stage>`` (with all below it), or the
files directly in ``<out>/<model>`` or ``<out>``: a stage's work is one part, a model's Study 1
another (:func:`part_of`)."""


def part_of(rel: str | Path) -> str:
    """The part (:data:`PART_DEPTH`) a state file belongs to, from its path in the state folder.

    ``findings/m/steering/parts/a.json`` -> ``findings/m/steering``;
    ``findings/m/records.jsonl`` -> ``findings/m``; ``findings/summary.json`` -> ``findings``.
    A file directly in the state folder belongs to the part ``_``.
    """
    parent = Path(rel).parent.parts[:PART_DEPTH]
    return "/".join(parent) if parent else "_"


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _inputs_digest(folder: Path, files: Sequence[Path]) -> str:
    """The sha256 of ``files`` (under ``folder``): each one's path and bytes, in sorted order."""
    import hashlib

    h = hashlib.sha256(b"interp-state-part-1\0")
    for p in sorted(files):
        h.update(p.relative_to(folder).as_posix().encode() + b"\0")
        h.update(bytes.fromhex(_sha256(p)))
    return h.hexdigest()


def _listing(path: Path) -> dict[str, str]:
    """A ``sha256sum``-format file as ``{name: hex}`` (empty when it does not exist)."""
    if not path.is_file():
        return {}
    return {name: digest for digest, _, name in (
        line.partition("  ") for line in path.read_text().splitlines() if line.strip())}


def _tar_xz(folder: Path, files: Sequence[Path]) -> bytes:
    """``files`` (under ``folder``) as one xz-compressed tar, the same bytes for the same files.

    Names sorted, mtime 0, owner 0, mode 0644.
    """
    import io
    import lzma
    import tarfile

    buf = io.BytesIO()
    with lzma.open(buf, "wb", preset=6) as xz, tarfile.open(fileobj=xz, mode="w",
                                                             format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(files):
            info = tarfile.TarInfo(p.relative_to(folder).as_posix())
            info.size, info.mtime, info.mode = p.stat().st_size, 0, 0o644
            with open(p, "rb") as f:
                tar.addfile(info, f)
    return buf.getvalue()


def pack_state(folder: str | Path, packed: str | Path) -> str:
    """Pack a state folder into a folder of checksummed part archives (:data:`ARCHIVE_SUFFIX`).

    Every file of ``folder`` (hidden ones aside) goes into the archive of its part
    (:func:`part_of`), ``<packed>/<part>.tar.xz``, with its path relative to ``folder``, in
    sorted order, mtime 0, owner 0 and mode 0644: the same files pack to the same bytes, and a
    part whose bytes are unchanged is not written again (git keeps its blob; a clone grows by
    the parts that changed). A part whose input files have the digest :data:`INPUTS` records
    from the last pack, and whose bytes still have the sha256 :data:`SUMS` records, is not
    compressed again. Each part is written to a temporary file and renamed; parts of
    files no longer in the state are removed; :data:`SUMS` is written last, so a pack cut short
    is refused by :func:`unpack_state` (its sums do not match) and packing again completes it.

    Returns:
        The packed state's digest: the sha256 of its :data:`SUMS` file (hex).
    """
    import hashlib
    import os

    folder, packed = Path(folder), Path(packed)
    parts: dict[str, list[Path]] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and not any(s.startswith(".") for s in rel.parts):
            parts.setdefault(part_of(rel), []).append(p)
    packed.mkdir(parents=True, exist_ok=True)
    sums, inputs = _listing(packed / SUMS), _listing(packed / INPUTS)
    lines, input_lines = [], []
    for part, files in sorted(parts.items()):
        name = f"{part}.tar.xz"
        dst = packed / name
        digest = _inputs_digest(folder, files)
        # the same input files as the last pack, and the part's bytes still the ones its sums
        # record: nothing to compress (a pack cut short leaves a part whose sum differs)
        if inputs.get(name) == digest and dst.is_file() and sums.get(name) == _sha256(dst):
            sha = sums[name]
        else:
            data = _tar_xz(folder, files)
            sha = hashlib.sha256(data).hexdigest()
            if not (dst.is_file() and dst.read_bytes() == data):
                dst.parent.mkdir(parents=True, exist_ok=True)
                tmp = dst.with_name(dst.name + ".tmp")
                tmp.write_bytes(data)
                os.replace(tmp, dst)
        lines.append(f"{sha}  {name}\n")
        input_lines.append(f"{digest}  {name}\n")
    keep = {f"{part}.tar.xz" for part in parts}
    for p in sorted(packed.rglob("*"), reverse=True):  # stale parts, then the folders left empty
        rel = p.relative_to(packed).as_posix()
        if p.is_file() and rel not in (SUMS, INPUTS) and rel not in keep:
            p.unlink()
        elif p.is_dir() and not any(p.iterdir()):
            p.rmdir()
    (packed / INPUTS).write_text("".join(input_lines))
    text = "".join(lines)
    (packed / SUMS).write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()


def unpack_state(packed: str | Path, folder: str | Path) -> int:
    """Unpack a checked packed state (:func:`pack_state`) into ``folder``, replacing what was there.

    Every part is checked against :data:`SUMS` before anything is unpacked. A folder already
    unpacked from the same packed state (its ``.sha256`` holds the sums' digest) is kept as it
    is: it may hold work :func:`save_state` put there since. Otherwise the parts are extracted
    into a temporary folder beside ``folder`` first, and ``folder`` is replaced only once all
    have extracted: a part that does not (truncated, not xz, not a tar, a member outside the
    folder), even one whose sum was written for its damaged bytes, leaves ``folder`` as it was.

    Returns:
        The number of files unpacked (0 when the folder was kept).

    Raises:
        FileNotFoundError: the packed state, its :data:`SUMS` or a part it lists is missing.
        ValueError: a part's sha256 is not the one :data:`SUMS` records, or a part does not
            extract (nothing unpacked, ``folder`` untouched).
    """
    import hashlib
    import lzma
    import os
    import tarfile

    packed, folder = Path(packed), Path(folder)
    sums = packed / SUMS
    if not sums.is_file():
        raise FileNotFoundError(f"{sums} does not exist: a saved state is a folder of part "
                                f"archives with their {SUMS}")
    text = sums.read_text()
    listed = [line.split(None, 1) for line in text.splitlines() if line.strip()]
    for want, name in listed:
        part = packed / name.strip()
        if not part.is_file():
            raise FileNotFoundError(f"{part} does not exist although {SUMS} lists it: take the "
                                    f"saved state back from git (git checkout -- {packed})")
        if (got := _sha256(part)) != want:
            raise ValueError(f"{part} has sha256 {got[:12]}..., not {want[:12]}... as {SUMS} "
                             f"records: a damaged or partly written state; nothing unpacked")
    digest = hashlib.sha256(text.encode()).hexdigest()
    mark = folder / ".sha256"
    if mark.is_file() and mark.read_text().strip() == digest:
        return 0
    tmp, old = (folder.with_name(f".{folder.name}.{what}") for what in ("unpacking", "replaced"))
    for p in (tmp, old):
        shutil.rmtree(p, ignore_errors=True)
    tmp.mkdir(parents=True)
    n = 0
    try:
        for _, name in listed:
            with tarfile.open(packed / name.strip(), "r:xz") as tar:
                n += len(tar.getmembers())
                tar.extractall(tmp, filter="data")
        (tmp / ".sha256").write_text(digest + "\n")
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"{folder} kept as it was" if folder.exists() else "nothing unpacked"
        raise ValueError(f"{packed / name.strip()} does not extract ({type(e).__name__}: {e}) "
                         f"although its sha256 matches {SUMS}: a truncated or damaged part was "
                         f"checksummed; {kept}. Take the saved state back from git "
                         f"(git checkout -- {packed})") from None
    if folder.exists():
        os.replace(folder, old)
    os.replace(tmp, folder)
    shutil.rmtree(old, ignore_errors=True)
    return n
