"""What every stage that reads a finished run shares: record selection, runtime facts, the model.

A stage's facts (its name, command, config class, files, needs, parts) are its entry in
:data:`interp.core.contract.SPECS`, and nowhere else; its module reads them as ``SPEC =
stage_of(__name__)``. The module provides what :func:`interp.core.contract.check_module`
checks:

* ``run(run_dir, handle, cfg, *, overwrite=False, log=print) -> summary``: the study on a
  finished asymmetry run (resumable; fresh parts are reused, :func:`interp.core.io.is_fresh`);
  it first calls :func:`stage_facts`, which refuses to reuse work computed under other
  result-relevant runtime facts unless ``overwrite``, and puts those facts into every part's
  signature;
* ``format_summary(summary) -> str``: the summary as text for the terminal;
* its config class (``cfg``), a :class:`interp.core.options.StageConfig` dataclass whose
  ``from_mapping(table)`` refuses unknown keys.

:func:`load_run_model` is the ONE way to load the model of a run: the manifest's model spec,
device and dtype, and a check that the loaded weights are those the run was made with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

from interp.core import contract
from interp.core.capabilities import capabilities, is_served
from interp.core.contract import check_needs
from interp.core.errors import ConfigError, RunDirError
from interp.core.io import read_jsonl
from interp.data import passage_turns
from interp.judging.prompts import get_template
from interp.models.loading import ModelHandle, load_model, placement, result_facts, runtime_facts
from interp.stages.configs import check_against_shape
from interp.store.records import limit_per_dataset
from interp.store.rundir import RunDir

__all__ = ["check_against_shape", "check_run_model", "current_share", "fitting",
           "load_run_model",
           "ok_records", "own_share", "refuse_reasoning_judge", "check_capabilities", "run_judge",
           "share_of_records", "stage_facts", "stored_negatives"]


def stored_negatives(run_path: Any, records: Sequence[Mapping[str, Any]]
                     ) -> dict[tuple[str, str], str]:
    """The run's closed-book hard negatives: ``(dataset, id) -> answer`` graded Incorrect.

    The patching stage's store (``DIR/patching/hard_negatives.jsonl``, mined by
    :func:`interp.methods.transfer.mine_hard_negatives`) first, then the records' own
    ``hard_negative`` / ``hard_negatives`` fields. Read by the pairwise judge and the
    balanced judge set (:mod:`interp.methods.balanced`).
    """
    from pathlib import Path

    out: dict[tuple[str, str], str] = {}
    store = Path(run_path) / "patching" / "hard_negatives.jsonl"
    for row in read_jsonl(store) if store.is_file() else []:
        if row.get("hard_negative"):
            out[(row["dataset"], str(row["id"]))] = row["hard_negative"]
    for rec in records:
        hn = rec.get("hard_negative") or next(iter(rec.get("hard_negatives") or []), None)
        if hn:
            out.setdefault((rec["dataset"], str(rec["id"])), hn)
    return out

_SHARE: ContextVar[tuple[int, int] | None] = ContextVar("interp_share_of_records", default=None)
"""This process's share ``(index, count)`` of a stage's records, or None: all of them."""


@contextlib.contextmanager
def share_of_records(index: int, count: int) -> Iterator[None]:
    """Within the body, stages work on share ``index`` of ``count`` of their selected records.

    The parts phase of a stage under torchrun (:attr:`interp.core.contract.StageSpec.
    parts_only`, :func:`interp.run.pipeline.run_config`): :func:`ok_records` selects the records
    as an unsharded run does, then keeps this process's share (:func:`own_share`), and
    :func:`stage_facts` checks the stored facts without writing the manifest (rank 0 records
    them when it runs the stage after the barrier).

    Raises:
        ValueError: ``index`` outside ``0..count-1``.
    """
    if not 0 <= index < count:
        raise ValueError(f"share {index} of {count}: the index must be in 0..{count - 1}")
    token = _SHARE.set((index, count))
    try:
        yield
    finally:
        _SHARE.reset(token)


def current_share() -> tuple[int, int] | None:
    """This process's ``(index, count)`` within :func:`share_of_records`, else None."""
    return _SHARE.get()


def own_share(records: Sequence[Mapping[str, Any]], index: int, count: int) -> list[Any]:
    """The records of share ``index`` of ``count``: whole passages, dealt out in turn.

    The rule of Study 1's shards (:func:`interp.data.passage_turns`,
    :func:`interp.launch.assign`): passages in the order of their first record, passage ``k``
    to share ``k mod count``. Every record is in exactly one share.
    """
    turns = passage_turns(records, count)
    return [r for r, t in zip(records, turns, strict=True) if t == index]



def check_run_model(run: RunDir, handle: ModelHandle,
                    manifest: Mapping[str, Any] | None = None) -> None:
    """Refuse a model whose weights differ from those the run was made with.

    The check compares the sha256 in ``manifest.json`` with the loaded model's; it passes when
    either is unknown (a random test model, a hub model without a local cache listing).

    Raises:
        RunDirError: both digests are known and differ (the message names both models).
    """
    m = dict(manifest if manifest is not None else run.manifest()).get("model", {})
    want, got = m.get("sha256"), handle.info.get("sha256")
    if want and got and want != got:
        raise RunDirError(f"{run.path} was made with model {m.get('spec')!r} (sha256 "
                          f"{want[:12]}), not {handle.spec!r} (sha256 {got[:12]}): use the run's "
                          f"model")


def fitting(handle: ModelHandle, items: Sequence[Any], n_tokens: Callable[[Any], int], *,
            stage: str, what: str = "prompt", new_tokens: int = 0, new: str = "new tokens",
            log: Callable[[str], None] | None = None) -> tuple[list[Any], list[tuple[Any, str]]]:
    """The items whose prompts fit the model's positions, and those that do not, with why.

    Every stage that runs a model on prompts it builds (pairs, training prompts) applies this
    before its work starts: the one rule is :meth:`interp.models.loading.ModelHandle.overflow`
    (Study 1 skips a record by the same rule), and the printout counts what was left out.

    Args:
        handle: the model.
        items: what the stage would run (pairs, prompts).
        n_tokens: an item's longest prompt (tokens).
        stage: the stage's name, for the printout.
        what: the prompt's name (``pairwise prompt``), for the reason and the printout.
        new_tokens: tokens the stage adds after the prompt (a reply it scores or decodes).
        new: what those tokens are, for the reason.
        log: where the count goes (None: nowhere).

    Returns:
        ``(kept, [(item, reason), ...])``, both in the input's order.
    """
    kept, skipped = [], []
    for it in items:
        if reason := handle.overflow(n_tokens(it), new_tokens, what=what, new=new):
            skipped.append((it, reason))
        else:
            kept.append(it)
    if skipped and log is not None:
        log(f"[{stage}] {len(skipped)} of {len(items)} {what}s skipped: longer than the model's "
            f"{handle.max_positions} positions (first: {skipped[0][1]})")
    return kept, skipped


def ok_records(run: RunDir, handle: ModelHandle, limit: int | None, *, stage: str,
               per_label: bool = False, max_tokens: int | None = None
               ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run's manifest and its ok records (first ``limit`` per dataset), for ``handle``.

    Every stage that reads records reads the one-word judge's verdict position, so a run
    judged by a reasoning template is refused here (:func:`refuse_reasoning_judge`).
    ``per_label`` and ``max_tokens``: :func:`interp.store.records.limit_per_dataset`. Within
    :func:`share_of_records`, this process's share of that selection (possibly empty).

    Raises:
        RunDirError: no manifest, no ok record (or none within ``max_tokens``), or another
            model than the run's (:func:`check_run_model`).
        ConfigError: the run was judged by a reasoning template (names ``stage``).
    """
    manifest = run.manifest()
    check_run_model(run, handle, manifest)
    refuse_reasoning_judge(run, manifest, stage)
    records = limit_per_dataset(run.read_records(), limit, per_label=per_label,
                                max_tokens=max_tokens)
    if not records:
        within = f" with prompts of at most max_tokens = {max_tokens} tokens" \
            if max_tokens is not None else ""
        raise RunDirError(f"{run.path}/records.jsonl holds no ok record{within}: nothing to do")
    if (share := _SHARE.get()) is not None:  # selected as unsharded, then this share's
        records = own_share(records, *share)
    return manifest, records


def run_judge(manifest: Mapping[str, Any]) -> str:
    """The judge kind of a run's template: ``word`` or ``reasoning``.

    See :mod:`interp.judging.reasoning`.

    Raises:
        interp.core.errors.PromptError: the run's template is unknown.
    """
    cfg = manifest.get("config", {})
    return get_template(cfg.get("template") or "default", cfg.get("templates_path")).judge


def refuse_reasoning_judge(run: RunDir, manifest: Mapping[str, Any], stage: str) -> None:
    """Refuse a stage that reads the one-word judge's verdict position on a reasoning run.

    A reasoning judge's verdict position lies after its own reasoning
    (:mod:`interp.judging.reasoning`),
    which the stage's re-rendered prompts do not hold.

    Raises:
        ConfigError: the run was judged with a ``judge = "reasoning"`` template.
    """
    if run_judge(manifest) != "word":
        raise ConfigError(f"[{stage}] {run.path} was judged by a reasoning template, whose "
                          f"verdict position follows its reasoning: run the {stage} stage on a "
                          f"one-word judge's run (the reasoning stage compares the two)")


def stage_facts(run: RunDir, handle: ModelHandle, stage: str, *,
                overwrite: bool = False) -> dict[str, Any]:
    """The result-relevant runtime facts of a stage call, checked against its stored work.

    Reads :func:`interp.models.loading.runtime_facts` now, records them in the manifest under
    ``stages.<stage>`` (:meth:`interp.store.RunDir.check_stage`; within
    :func:`share_of_records` only checks them: the processes share one manifest) and returns
    :func:`interp.models.loading.result_facts`, which every stage puts into its parts' signatures
    (attention recordings, probe features, patching parts, transfer outputs): a part made under
    another attention kernel, device, dtype, torch / transformers version, TF32 or determinism
    setting is never reused.

    Raises:
        RunDirError: no manifest, or the stage's stored work was computed under other result
            facts and not ``overwrite`` (one line naming each setting and ``--overwrite``).
    """
    facts = runtime_facts(handle)
    rf = result_facts(facts)
    run.check_stage(stage, runtime=facts, result_facts=rf, overwrite=overwrite,
                    record=_SHARE.get() is None)
    return rf


def check_capabilities(stage: str | None, spec: str, *, where: str | None = None) -> None:
    """Refuse a stage whose model cannot do what the stage needs, before the model loads.

    The stage's needs are declared in its contract
    (:attr:`interp.core.contract.StageSpec.model_needs`); the model's capabilities follow from
    its spec (:func:`interp.core.capabilities.capabilities`): a model served behind an endpoint
    (``openai:MODEL``) gives its replies and log-probs, not attention, activations or weights.

    Args:
        stage: the stage's name (or command); None: a command that loads the weights.
        spec: the model spec.
        where: how the error names the stage (default: ``stage``).

    Raises:
        ConfigError: the model lacks a capability the stage needs (one line naming both).
    """
    needs = contract.spec(stage).model_needs if stage else frozenset({"weights"})
    if missing := sorted(needs - capabilities(spec)):
        served = " (served behind an endpoint: replies and log-probs only)" if is_served(
            spec) else ""
        raise ConfigError(f"{where or stage or 'this command'} needs the model's "
                          f"{', '.join(missing)}; {spec}{served} cannot give them: run it on "
                          f"a model loaded in this process (docs/endpoints.md)")


def load_run_model(run: RunDir, device: str | None = None,
                   dtype: str | None = None, *, stage: str | None = None,
                   config: Any = None, log: Callable[[str], None] = print) -> ModelHandle:
    """Load the model a run was made with (the manifest's model spec) and check its sha256.

    The run's big-model placement (``device_map``, ``max_memory``, ``offload_folder`` of its
    config, :func:`interp.models.loading.load_model`) is used again.

    Args:
        run: a run directory with ``manifest.json``.
        device: where to load it (default: the run's ``config.device``, else CUDA if available).
        dtype: precision (default: the run's ``config.dtype``, else by device).
        stage: the stage about to run: its declared needs are checked
            (:func:`interp.core.contract.check_needs`) and, with ``config``, its config
            against the model shape the manifest records (:func:`check_against_shape`), before
            the model loads.
        config: that stage's config.
        log: where the line of a default band adapted to a small model goes.

    Returns:
        The :class:`interp.models.loading.ModelHandle`.

    Raises:
        RunDirError: no manifest, a manifest without a model, or weights whose sha256 differs
            from the manifest's.
        ConfigError: the run's model cannot do what the stage needs
            (:func:`check_capabilities`).
        interp.core.errors.ModelSpecError: the spec cannot be loaded here.
        LayerSpecError: ``config`` selects layers outside the model (:func:`check_against_shape`).
        RunDirError: a file the stage needs is missing (:func:`interp.core.contract.check_needs`).
    """
    manifest = run.manifest()
    cfg = manifest.get("config", {})
    spec = manifest.get("model", {}).get("spec") or cfg.get("model")
    if not spec:
        raise RunDirError(f"{run.manifest_path} names no model (neither model.spec nor "
                          f"config.model)")
    check_capabilities(stage, spec)
    if config is not None and (n_layers := manifest.get("model", {}).get("n_layers")):
        for note in check_against_shape(stage or "stage", config, int(n_layers),
                                        manifest["model"].get("n_heads")):
            log(note)
    if stage is not None:
        check_needs(run.path, [(stage, config)])
    handle = load_model(spec, device=device or cfg.get("device"), dtype=dtype or cfg.get("dtype"),
                        **placement(cfg))
    check_run_model(run, handle, manifest)
    return handle
