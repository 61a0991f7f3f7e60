"""Framework rules: which folders are saves, and when a save is complete (SPEC §5).

A *framework rule* answers two questions from facts the caller gathered; nothing here reads a file.

Rules:

1. ``hf`` (Hugging Face ``Trainer``): a save is a folder named ``checkpoint-<step>``. ``dcp`` (PyTorch
   Distributed Checkpoint, torchtitan layout): ``step-<step>``. ``<step>`` follows ``parse_step``: ASCII
   decimal digits whose value fits in 64 bits. Leading zeros are accepted (``checkpoint-05`` is step 5),
   because the Trainer's own ``get_last_checkpoint`` and checkpoint rotation accept them too; the save is
   still published under its real folder name, so ``checkpoint-5`` and ``checkpoint-05`` are two saves.
   Anything else (``tmp-checkpoint-5``, ``checkpoint-best``, ``runs``, ``checkpoint-``, ``checkpoint-+5``,
   a step past 2**64 - 1) is not a save and is ignored, never an error.
2. ``hf`` markers: ``trainer_state.json`` is present and parses (as Python's ``json`` reads it, which admits
   the ``NaN``/``Infinity`` the Trainer writes into ``log_history``) to a JSON *object*, and the
   ``checkpoint-is-incomplete.txt`` sentinel is absent. ``dcp`` marker: ``.metadata`` is present (DCP renames
   it into place once every rank has written).
3. Settle (the watcher only): with a settle time ``S > 0``, a save whose markers are complete is complete
   only once its listing of file names and sizes was identical on two looks at least ``S`` apart, measured
   from the *end* of the first look to the *start* of the second, with no change seen in between. The
   default is one interval for ``hf`` (the Trainer writes ``trainer_state.json`` from the main process while
   other ranks may still be writing) and 0 for ``dcp``; an explicit settle time applies to either. ``S == 0``
   means a save is complete on the first look at its markers.
4. Verified resolve uses the markers only (rule 2): settle is about a save still being written, and a
   published save was settled when it was published.

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable

import attrs

from ckpt.domain.arguments import require_str
from ckpt.domain.entries import parse_step
from ckpt.domain.errors import InvalidError
from ckpt.domain.ports import FileInfo

__all__ = [
    "INCOMPLETE_SENTINEL",
    "METADATA",
    "TRAINER_STATE",
    "Framework",
    "Listing",
    "Markers",
    "SaveFolder",
    "Verdict",
    "check_markers",
    "default_settle",
    "judge_save",
    "parse_framework",
    "save_folders",
    "save_step",
]

TRAINER_STATE = "trainer_state.json"
INCOMPLETE_SENTINEL = "checkpoint-is-incomplete.txt"
METADATA = ".metadata"


class Framework(enum.Enum):
    """A training framework whose saves the watcher recognises. ``str()`` gives the CLI name."""

    HF = "hf"
    DCP = "dcp"

    def __str__(self) -> str:
        return self.value

    @property
    def folder_prefix(self) -> str:
        """The folder-name prefix of a save, before the step: ``checkpoint-`` or ``step-``."""
        return "checkpoint-" if self is Framework.HF else "step-"

    @property
    def folder_pattern(self) -> str:
        """The folder-name shape, for messages: ``checkpoint-<step>`` or ``step-<step>``."""
        return f"{self.folder_prefix}<step>"


def parse_framework(text: str) -> Framework:
    """Parse a framework name, exactly ``hf`` or ``dcp``.

    >>> parse_framework("dcp")
    <Framework.DCP: 'dcp'>
    """
    require_str(text, "framework")
    for framework in Framework:
        if text == framework.value:
            return framework
    names = ", ".join(f.value for f in Framework)
    raise InvalidError(f"framework {text!r} is not one of {names}")


def default_settle(framework: Framework, interval: float) -> float:
    """The settle time when none is given: one interval for ``hf``, 0 for ``dcp`` (rule 3)."""
    return interval if framework is Framework.HF else 0.0


def save_step(framework: Framework, name: str) -> int | None:
    """Return the step of a save folder called ``name``, or ``None`` when it is not a save (rule 1).

    >>> save_step(Framework.HF, "checkpoint-500"), save_step(Framework.HF, "tmp-checkpoint-500")
    (500, None)
    """
    prefix = framework.folder_prefix
    if not name.startswith(prefix):
        return None
    try:
        return parse_step(name[len(prefix) :])
    except InvalidError:
        return None


@attrs.frozen
class SaveFolder:
    """A folder that is a save under a framework's rule: its name and the step the name carries."""

    step: int
    name: str


def save_folders(framework: Framework, names: Iterable[str]) -> list[SaveFolder]:
    """Return the names that are saves, in step order (ties by name), dropping everything else.

    >>> [f.name for f in save_folders(Framework.DCP, ["step-20", "runs", "step-3"])]
    ['step-3', 'step-20']
    """
    found = []
    for name in names:
        step = save_step(framework, name)
        if step is not None:
            found.append(SaveFolder(step, name))
    return sorted(found, key=lambda f: (f.step, f.name))


@attrs.frozen
class Markers:
    """The marker files of one save, as read from the store.

    ``trainer_state`` is the content of ``trainer_state.json`` (``None`` when absent); ``incomplete_sentinel``
    whether ``checkpoint-is-incomplete.txt`` is present; ``metadata`` whether ``.metadata`` is present. A rule
    looks only at its own fields.
    """

    trainer_state: bytes | None = None
    incomplete_sentinel: bool = False
    metadata: bool = False


def _is_json_object(data: bytes) -> bool:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return isinstance(value, dict)


def check_markers(framework: Framework, markers: Markers) -> str | None:
    """Return why the markers say the save is not complete, or ``None`` when they say it is (rule 2).

    >>> check_markers(Framework.HF, Markers(trainer_state=b'{"global_step": 5}'))
    >>> check_markers(Framework.HF, Markers(trainer_state=b'{"global_st'))
    'trainer_state.json is not a JSON object'
    """
    if framework is Framework.DCP:
        return None if markers.metadata else f"no {METADATA}"
    if markers.trainer_state is None:
        return f"no {TRAINER_STATE}"
    if not _is_json_object(markers.trainer_state):
        return f"{TRAINER_STATE} is not a JSON object"
    if markers.incomplete_sentinel:
        return f"incomplete: {INCOMPLETE_SENTINEL} is present"
    return None


@attrs.frozen
class Listing:
    """One look at a save's files (names and sizes) and the clock readings just before and after it."""

    files: tuple[FileInfo, ...]
    started: float
    finished: float


@attrs.frozen
class Verdict:
    """Whether a save is complete; if not, why, and (while settling) the look to compare the next one with.

    ``reason`` is ``None`` for a complete save. ``since`` is set when the markers are complete but the save
    has not settled yet: the earliest look since which its listing has not changed. The caller keeps it and
    passes it back on the next scan; a verdict without ``since`` means "forget what you kept".
    """

    reason: str | None
    since: Listing | None = None

    @property
    def complete(self) -> bool:
        """True when the save may be published."""
        return self.reason is None


def _check_settle(settle: float) -> float:
    if isinstance(settle, bool) or not isinstance(settle, int | float):
        raise InvalidError(f"settle time {settle!r} is not a number")
    if not math.isfinite(settle) or settle < 0:
        raise InvalidError(f"settle time {settle!r} must be a finite number of seconds >= 0")
    return float(settle)


def judge_save(
    framework: Framework,
    markers: Markers,
    *,
    settle: float,
    listing: Listing | None = None,
    since: Listing | None = None,
) -> Verdict:
    """Decide whether a save is complete for the watcher: markers (rule 2), then settle (rule 3).

    ``listing`` is this scan's look at the save's files; it is needed only when ``settle > 0`` and the
    markers are complete. ``since`` is what the previous verdict for this save kept.

    >>> state = Markers(trainer_state=b"{}")
    >>> first = Listing((FileInfo("trainer_state.json", 2),), started=0.0, finished=0.1)
    >>> judge_save(Framework.HF, state, settle=5, listing=first).reason
    'not settled: first look at its files'
    >>> later = Listing(first.files, started=5.2, finished=5.3)
    >>> judge_save(Framework.HF, state, settle=5, listing=later, since=first).complete
    True
    """
    settle = _check_settle(settle)
    reason = check_markers(framework, markers)
    if reason is not None:
        return Verdict(reason)
    if settle == 0:
        return Verdict(None)
    if listing is None:
        raise InvalidError("judging a settle needs this scan's listing of the save's files")
    if since is None:
        return Verdict("not settled: first look at its files", since=listing)
    if since.files != listing.files:
        return Verdict("not settled: its files changed since the last scan", since=listing)
    waited = listing.started - since.finished
    if waited >= settle:
        return Verdict(None)
    return Verdict(f"not settled: unchanged for {max(waited, 0.0):.3g}s of {settle:g}s", since=since)
