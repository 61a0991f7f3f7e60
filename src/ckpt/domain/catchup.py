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
7. An execution's *world size* (how many processes wrote its saves) comes from its *world-size record*,
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

from ckpt.domain.entries import EXEC_DIR_NAME, Entry, parse_epoch
from ckpt.domain.errors import InvalidError, MalformedError
from ckpt.domain.frameworks import validate_world_size
from ckpt.domain.room import SHORTEST_NAME, room_problem

__all__ = [
    "EPOCH_RECORD",
    "WORLD_SIZE_RECORD",
    "CatchUpPlan",
    "CatchUpTarget",
    "PassedExecution",
    "format_epoch_record",
    "format_world_size_record",
    "parse_epoch_record",
    "parse_world_size_record",
    "plan_catch_up",
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
    """The content of a world-size record (rule 7): the world size in decimal and a newline.

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


@attrs.frozen
class CatchUpTarget:
    """An execution folder to publish the complete saves of, the epoch to publish them at, and the world
    size of the run that wrote them (``None``: unknown, rule 7)."""

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
        """This plan with each target's world size from ``world_sizes`` (attempt -> record; rule 7).

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
) -> CatchUpPlan:
    """Decide which execution folders a catch-up looks into, at which epoch (rules 1-7).

    ``attempt`` and ``epoch`` are the current execution's; ``records`` maps every execution folder under
    ``exec/`` to the epoch its record holds (``None``: no readable record); ``entries`` are those published;
    ``longest_name`` is the rule's longest save name (rule 6). Targets come back with no world size: the
    caller reads the records of the targets only (rule 7) and fills them in (:meth:`CatchUpPlan.sized`).

    >>> plan = plan_catch_up("c", 3, {"a": 1, "b": 2, "c": 3, "d": None}, [])
    >>> [(t.attempt, t.epoch) for t in plan.targets]
    [('a', 1), ('b', 2), ('c', 3)]
    >>> [p.attempt for p in plan.passed]
    ['d']
    """
    from_entries, greatest = _entry_epochs(entries)
    targets: list[CatchUpTarget] = []
    passed: list[PassedExecution] = []
    for name in sorted({*records, attempt}):
        recorded = records.get(name)
        known = [recorded] if recorded is not None else []
        if not known and name in from_entries:
            known = [from_entries[name]]
        problem = room_problem(f"{EXEC_DIR_NAME}/{name}", longest_name)
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
