"""One error hierarchy for the whole toolkit.

Every error that ``interp`` raises on purpose (bad input, a run directory that lacks what a
command needs, a model the toolkit cannot handle) is an :class:`InterpError`. Its message is one
line that says what to fix. The command line catches :class:`InterpError` once, prints
``error: <message>`` and exits with status 2 (the traceback only with ``--debug``); anything
else is a bug and keeps its traceback.

:class:`InterpError` derives from :class:`ValueError` because nearly all of these are invalid
values given by the user (a layer out of range, an unknown dataset, a malformed file).

A stage has no error class of its own: bad input to a study, its methods or its stage is a
:class:`StageError` that names the stage (``err.stage``), so a new stage adds nothing here.

:class:`Interrupted` is no error: it is the ``KeyboardInterrupt`` of a Ctrl-C (or of a SIGTERM,
which the command line turns into one) carrying the work a batched loop finished before it, so
that each caller on the way out can keep that work before passing the interrupt on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = [
    "BackendError",
    "ConfigError",
    "DataError",
    "EndpointError",
    "GradingError",
    "HookError",
    "InterpError",
    "Interrupted",
    "LayerSpecError",
    "ModelSpecError",
    "PairError",
    "PromptError",
    "RunDirError",
    "ShardError",
    "StageError",
]


class InterpError(ValueError):
    """Base of every error ``interp`` raises on purpose; the CLI prints it as one line."""

    def reworded(self, message: str) -> InterpError:
        """The same error (class and attributes) with another message (a prefix added)."""
        return type(self)(message)


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C (or SIGTERM) that arrived during a batched loop, with what that loop finished.

    A loop over batches catches the ``KeyboardInterrupt`` and raises this instead, with the
    results of its finished batches in :attr:`done`; each caller on the way out turns ``done``
    into its own finished units (a judged prompt, a record) and raises a new ``Interrupted``
    with those, until the stage appends them to its run directory and lets it pass. Anything
    that catches ``KeyboardInterrupt`` catches it too.

    Attributes:
        done: the finished work, in the raising function's own form (its docstring says
            which).
    """

    def __init__(self, done: object) -> None:
        super().__init__()
        self.done = done


class ConfigError(InterpError):
    """A config table or option with an unknown key or an invalid value."""


class DataError(InterpError):
    """A data source is missing, unknown or malformed (names the file and record).

    Attributes:
        field: The missing or bad field, when the error is about one field.
        location: Where the problem is (``path:line`` for JSONL files, ``path`` plus a record
            index for whole-file JSON), when known.
    """

    def __init__(self, message: str, *, field: str | None = None, location: str | None = None):
        self.message = message
        self.field = field
        self.location = location
        super().__init__(f"{location}: {message}" if location else message)

    def at(self, location: str) -> DataError:
        """Return a copy of this error with ``location`` filled in (if it had none)."""
        if self.location:
            return self
        return DataError(self.message, field=self.field, location=location)


class ModelSpecError(InterpError):
    """A model spec that names no loadable model, or a model file that fails verification."""


class PromptError(InterpError):
    """A template or a rendered prompt whose spans cannot be located."""


class RunDirError(InterpError):
    """A run directory missing what a command needs, or made with another config."""


class LayerSpecError(InterpError):
    """A layer selection that cannot be parsed or lies outside the model."""


class HookError(InterpError):
    """A hook point that does not exist on this model, or a hook request that is invalid."""


class BackendError(InterpError):
    """A backend (hf, transformer_lens, nnsight) that cannot wrap or run this model."""


class GradingError(InterpError):
    """An oracle or grading request that cannot be carried out (unknown dataset, oracle)."""


class StageError(InterpError):
    """Bad input to one study, its methods or its stage: the one error class of every stage.

    A span that does not match the prompt (``attention``), a pair kind or hook point the
    patching engine does not know (``patching``), alpha <= 0 (``steering``), too few records
    of a class for a probe (``probe``), an adapter trained on another base model
    (``transfer``), ... The message says what to fix; ``stage`` names the stage of the
    contract (:data:`interp.core.contract.SPECS`) whose input it is, for code that tells them
    apart (``err.stage == "probe"``). A stage needs no class of its own.

    Attributes:
        stage: the stage's name (``steering``, ``probe``, ...).
    """

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage

    @classmethod
    def of(cls, stage: str) -> Callable[[str], StageError]:
        """A one-argument factory of this stage's error, for code that takes an error class.

        ``StageError.of("steering")("alpha must be > 0")`` is
        ``StageError("steering", "alpha must be > 0")``.
        """
        return functools.partial(cls, stage)

    def reworded(self, message: str) -> StageError:
        """The same stage's error with another message."""
        return type(self)(self.stage, message)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.stage, str(self))  # across processes (probe n_jobs)


class PairError(StageError):
    """A clean/corrupt pair that cannot be built or aligned (names the first difference).

    A patching-stage error (``stage`` is ``patching``) with a reason the stage counts.

    Attributes:
        reason: a short code of why (``no_gold``, ``no_incorrect_answer``, ``too_long``, ...),
            by which the patching stage counts skipped pairs; the message has the details.
    """

    def __init__(self, message: str, reason: str = "other"):
        super().__init__("patching", message)
        self.reason = reason

    def reworded(self, message: str) -> PairError:
        """The same pair error (and reason) with another message."""
        return type(self)(message, self.reason)

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (str(self), self.reason)


class ShardError(InterpError):
    """A shard setting that cannot be used, or shards that cannot become one run."""


class EndpointError(InterpError):
    """A model endpoint that cannot be used: unreachable, wrong model or key, too many failures.

    The message never holds the API key (docs/endpoints.md).
    """
