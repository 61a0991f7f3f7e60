"""Catch-up on resume: which earlier executions to publish, at which epoch (docs/adr/0011).

When an execution dies, the saves it completed in its last interval (plus the settle time) were never
published: its sidecar, or its in-process publisher, died with it. Before a new execution resolves where to
resume from, it publishes those saves *under the epoch of the execution that wrote them*. This module decides,
from facts the caller gathered, which execution folders are looked at and at which epoch; nothing here reads
a file.

Rules:

1. An execution's epoch comes from its *epoch record*, the file ``exec/<attempt>/.ckpt-epoch`` holding the
   epoch in decimal and a newline, which ``ckpt resume`` and the in-process integrations write when an
   execution starts; failing that, from the entries already published for saves inside its folder (the
   greatest of their epochs: the epoch its publisher last published at). An execution whose epoch is known
   neither way is passed over: publishing it at a guessed epoch could rank its saves above a newer one's.
2. The current execution's folder is looked at too (a restarted process of the same execution), at the
   lower of the current epoch and what its folder already records.
3. An execution with an epoch greater than the current one is newer than this one and alive or dead, it is
   its own publisher's business: passed over.
4. An execution with an epoch lower than the greatest published epoch is passed over: nothing it holds
   could rank above what is already published, so publishing it cannot change where a job resumes.
5. Targets come back in ascending epoch, ties by attempt, so the result does not depend on listing order.
6. A folder too long for the rule's longest save name (``ckpt.domain.room``) is passed over, whatever its
   epoch: every entry point now refuses to start in such a folder, so only an older release (or a trainer
   run without ``ckpt``) leaves one behind, and publishing its saves fails, which would end every later
   catch-up with it.
7. Saves may lie in a *sub-folder* of every execution folder (``exec/<attempt>/<sub-folder>``, torchtitan's
   ``checkpoint.folder``): the same sub-folder of each one, since every execution runs the same job. The
   catch-up then looks into ``exec/<attempt>/<sub-folder>`` of each target, and rule 6 measures that folder.
   A sub-folder is given either as itself (:func:`parse_sub_folder`) or as the current execution's saves
   folder, the very value ``ckpt watch --saves`` takes (:func:`sub_folder_of`); :func:`execution_saves` is
   the folder it names for an attempt, and :func:`attempt_of_saves` the execution whose folder a saves
   folder lies in (whose epoch a sidecar watching it records).
8. An execution's *world size* (how many processes wrote its saves) comes from its *world-size record*,
   ``exec/<attempt>/.ckpt-world-size``, the size in decimal and a newline, written beside the epoch record
   by the writers that know it (``ckpt watch`` with a world size, the in-process publishers). A target
   carries it, so its saves are judged by the size of the run that wrote them, not the size of the run
   catching up; without a record (an older release, a writer that did not know it) it is unknown. Only the
   targets' records are read: a folder passed over costs nothing more.

Why it is safe: a caught-up save is published at its own execution's epoch, which is at most the current
epoch (rule 3), so once the current execution publishes anything, that wins; and an older epoch can never
rank above the current one however high its step. Whether a save is complete is still the framework rule's
decision, with the settle time applied because the writer may be a zombie still writing (the caller's job).

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from ckpt.domain.entries import EXEC_DIR_NAME, Entry, attempt_error, parse_epoch, save_error
from ckpt.domain.errors import InvalidError, MalformedError
from ckpt.domain.frameworks import validate_world_size
from ckpt.domain.room import SHORTEST_NAME, room_problem

__all__ = [
    "EPOCH_RECORD",
    "WORLD_SIZE_RECORD",
    "CatchUpPlan",
    "CatchUpTarget",
    "PassedExecution",
    "attempt_of_saves",
    "execution_saves",
    "format_epoch_record",
    "format_world_size_record",
    "parse_epoch_record",
    "parse_sub_folder",
    "parse_world_size_record",
    "plan_catch_up",
    "sub_folder_of",
]

EPOCH_RECORD = ".ckpt-epoch"
WORLD_SIZE_RECORD = ".ckpt-world-size"


def format_epoch_record(epoch: int) -> bytes:
    """The content of an epoch record: the epoch in decimal and a newline.

    >>> format_epoch_record(2000000)
    b'2000000\\n'
    """
    return f"{parse_epoch(str(epoch))}\n".encode()


def parse_epoch_record(data: bytes) -> int:
    """Parse an epoch record; ``MalformedError`` unless it is exactly what :func:`format_epoch_record` writes.

    >>> parse_epoch_record(b"2000000\\n")
    2000000
    """
    text = data.decode("ascii", errors="replace")
    try:
        epoch = parse_epoch(text[:-1] if text.endswith("\n") else "no newline")
    except InvalidError as exc:
        raise MalformedError(
            f"epoch record {data[:40]!r} is not a decimal epoch and a newline", value=repr(data[:40])
        ) from exc
    if format_epoch_record(epoch) != data:
        raise MalformedError(f"epoch record {data[:40]!r} is not in canonical form", value=repr(data[:40]))
    return epoch


def format_world_size_record(world_size: int) -> bytes:
    """The content of a world-size record (rule 8): the world size in decimal and a newline.

    >>> format_world_size_record(2)
    b'2\\n'
    """
    return f"{validate_world_size(world_size)}\n".encode()


def parse_world_size_record(data: bytes) -> int:
    """Parse a world-size record; ``MalformedError`` unless it is exactly what
    :func:`format_world_size_record` writes (1 to 2**31 - 1, no sign, no leading zero, one newline).

    >>> parse_world_size_record(b"2\\n")
    2
    """
    shown = repr(data[:40])
    text = data[:-1] if data.endswith(b"\n") else b""
    if not text or len(text) > 10 or not text.isdigit():  # ASCII digits only (bytes); 2**31 - 1 has 10
        raise MalformedError(
            f"world-size record {shown} is not a decimal world size and a newline", value=shown
        )
    try:
        world_size = validate_world_size(int(text))
    except InvalidError as exc:
        raise MalformedError(f"world-size record {shown}: {exc}", value=shown) from exc
    if format_world_size_record(world_size) != data:
        raise MalformedError(f"world-size record {shown} is not in canonical form", value=shown)
    return world_size


def parse_sub_folder(text: str) -> str:
    """A saves sub-folder (rule 7): ``""`` (the execution folder itself) or a clean relative path.

    ``InvalidError`` for anything that is not a valid save path once inside an execution folder (absolute,
    ``.`` or ``..``, ``//``, a control character); a trailing ``/`` is dropped.

    >>> parse_sub_folder("checkpoint/")
    'checkpoint'
    >>> parse_sub_folder("")
    ''
    """
    if not isinstance(text, str):
        raise InvalidError(f"saves sub-folder {text!r} is not a string")
    sub = text[:-1] if text.endswith("/") else text
    # Checked as the tail of a save path: its first element may be any name (pub/ is special at the root).
    if sub.startswith("/"):
        reason: str | None = "is absolute (it is a path inside each execution's folder)"
    else:
        reason = None if sub == "" else save_error(f"{EXEC_DIR_NAME}/{sub}")
    if reason is not None:
        raise InvalidError(f"saves sub-folder {text!r} {reason}")
    return sub


def execution_saves(attempt: str, sub_folder: str = "") -> str:
    """The save path of the folder an execution's saves lie in (rule 7): ``exec/<attempt>[/<sub-folder>]``.

    >>> execution_saves("2.4102.0", "checkpoint")
    'exec/2.4102.0/checkpoint'
    >>> execution_saves("2.4102.0")
    'exec/2.4102.0'
    """
    reason = attempt_error(attempt)
    if reason is not None:
        raise InvalidError(f"attempt {attempt!r} {reason}")
    sub = parse_sub_folder(sub_folder)
    return f"{EXEC_DIR_NAME}/{attempt}/{sub}" if sub else f"{EXEC_DIR_NAME}/{attempt}"


def attempt_of_saves(saves: str) -> str | None:
    """The attempt whose execution folder holds the saves folder ``saves`` (a save path), else ``None``.

    >>> attempt_of_saves("exec/2.4102.0/checkpoint")
    '2.4102.0'
    >>> attempt_of_saves("shared/checkpoints") is None
    True
    """
    head, slash, rest = saves.partition("/")
    if head != EXEC_DIR_NAME or not slash:
        return None
    attempt = rest.partition("/")[0]
    return attempt if attempt_error(attempt) is None else None


def sub_folder_of(saves: str, attempt: str) -> str:
    """The sub-folder (rule 7) that the saves folder ``saves`` (a save path) is of ``exec/<attempt>``.

    ``InvalidError`` unless ``saves`` lies in that execution's folder: the catch-up finds the saves of every
    execution by their place inside its own folder, so a folder elsewhere gives it nothing to go by.

    >>> sub_folder_of("exec/2.4102.0/checkpoint", "2.4102.0")
    'checkpoint'
    >>> sub_folder_of("exec/2.4102.0", "2.4102.0")
    ''
    """
    own = execution_saves(attempt)
    if saves == own:
        return ""
    if not saves.startswith(own + "/"):
        raise InvalidError(
            f"saves folder {saves!r} is not inside this execution's folder {own!r}: catch-up looks for saves "
            f"in the same place inside every execution's folder"
        )
    return parse_sub_folder(saves[len(own) + 1 :])


@attrs.frozen
class CatchUpTarget:
    """An execution folder to publish the complete saves of, the epoch to publish them at, and the world
    size of the run that wrote them (``None``: unknown, rule 8)."""

    attempt: str
    epoch: int
    world_size: int | None = None


@attrs.frozen
class PassedExecution:
    """An execution folder the catch-up does not look into, and why."""

    attempt: str
    reason: str


@attrs.frozen
class CatchUpPlan:
    """What a catch-up does: the folders it looks into (ascending epoch) and those it passes over."""

    targets: tuple[CatchUpTarget, ...]
    passed: tuple[PassedExecution, ...]

    def sized(self, world_sizes: Mapping[str, int | None]) -> CatchUpPlan:
        """This plan with each target's world size from ``world_sizes`` (attempt -> record; rule 8).

        >>> plan = CatchUpPlan((CatchUpTarget("a", 1), CatchUpTarget("b", 2)), ())
        >>> [t.world_size for t in plan.sized({"a": 2}).targets]
        [2, None]
        """
        targets = tuple(attrs.evolve(t, world_size=world_sizes.get(t.attempt)) for t in self.targets)
        return attrs.evolve(self, targets=targets)


def _entry_epochs(entries: Iterable[Entry]) -> tuple[dict[str, int], int | None]:
    """The greatest entry epoch per execution folder, and the greatest epoch of all entries."""
    own: dict[str, int] = {}
    greatest: int | None = None
    prefix = EXEC_DIR_NAME + "/"
    for entry in entries:
        greatest = entry.epoch if greatest is None else max(greatest, entry.epoch)
        if not entry.save.startswith(prefix):
            continue
        attempt, slash, _ = entry.save[len(prefix) :].partition("/")
        if slash:
            own[attempt] = max(own.get(attempt, entry.epoch), entry.epoch)
    return own, greatest


def plan_catch_up(
    attempt: str,
    epoch: int,
    records: Mapping[str, int | None],
    entries: Iterable[Entry],
    *,
    longest_name: str = SHORTEST_NAME,
    sub_folder: str = "",
) -> CatchUpPlan:
    """Decide which execution folders a catch-up looks into, at which epoch (rules 1-7).

    ``attempt`` and ``epoch`` are the current execution's; ``records`` maps every execution folder under
    ``exec/`` to the epoch its record holds (``None``: no readable record); ``entries`` are those published;
    ``longest_name`` is the rule's longest save name (rule 6), measured inside ``sub_folder`` (rule 7).
    Targets come back with no world size: the caller reads the records of the targets only (rule 8) and
    fills them in (:meth:`CatchUpPlan.sized`).

    >>> plan = plan_catch_up("c", 3, {"a": 1, "b": 2, "c": 3, "d": None}, [])
    >>> [(t.attempt, t.epoch) for t in plan.targets]
    [('a', 1), ('b', 2), ('c', 3)]
    >>> [p.attempt for p in plan.passed]
    ['d']
    """
    sub = parse_sub_folder(sub_folder)
    from_entries, greatest = _entry_epochs(entries)
    targets: list[CatchUpTarget] = []
    passed: list[PassedExecution] = []
    for name in sorted({*records, attempt}):
        recorded = records.get(name)
        known = [recorded] if recorded is not None else []
        if not known and name in from_entries:
            known = [from_entries[name]]
        problem = room_problem(execution_saves(name, sub), longest_name)
        if problem is not None:
            passed.append(PassedExecution(name, f"too long for its saves' longest name: {problem}"))
            continue
        if name == attempt:
            targets.append(CatchUpTarget(name, min([epoch, *known])))
            continue
        if not known:
            passed.append(
                PassedExecution(name, f"its epoch is unknown (no {EPOCH_RECORD}, nothing published)")
            )
            continue
        own = min(known)
        if own > epoch:
            passed.append(
                PassedExecution(name, f"a newer execution (epoch {own} > {epoch}) publishes its own")
            )
        elif greatest is not None and own < greatest:
            passed.append(
                PassedExecution(name, f"older (epoch {own}) than the newest published epoch {greatest}")
            )
        else:
            targets.append(CatchUpTarget(name, own))
    targets.sort(key=lambda t: (t.epoch, t.attempt))
    return CatchUpPlan(tuple(targets), tuple(passed))
