"""Retention tiers: which entries a prune keeps, and why (docs/spec/operations.md, "Prune").

Rules:

1. An entry is kept for every reason that applies, in this order: ``latest`` (one of the ``keep`` greatest
   entries, ``keep >= 1``), ``every`` (its step is a multiple of ``keep_every``, step 0 included, when
   ``keep_every`` is given, ``>= 1``), ``pinned`` (a pin names it). Every other entry is removed.
2. A folder is a candidate for removal when a removed entry names it and neither a kept entry nor a pin
   overlaps it (by path element, as :func:`ckpt.domain.prune.overlaps`). A pin protects its save's folder
   even when it names no entry any more. A candidate inside another candidate is dropped.
3. Without ``keep_every`` and pins, the plan is exactly ``plan_prune(entries, keep)``
   (:meth:`RetentionPlan.prune_plan`).

Pure: standard library and attrs only.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from ckpt.domain.entries import Entry, sort_entries
from ckpt.domain.errors import InvalidError
from ckpt.domain.prune import Overlap, PrunePlan

__all__ = ["SKIP_PINNED", "SKIP_PUBLISHED", "KeepReason", "Kept", "RetentionPlan", "plan_retention"]

#: Why a prune leaves a planned folder after reading the entries and pins again.
SKIP_PUBLISHED = "named by an entry published during the prune"
SKIP_PINNED = "named by a pin made during the prune"


class KeepReason(enum.Enum):
    """Why a prune keeps an entry (rule 1)."""

    LATEST = "latest"  # one of the ``keep`` greatest entries
    EVERY = "every"  # its step is a multiple of ``keep_every``
    PINNED = "pinned"  # a pin names it


@attrs.frozen
class Kept:
    """An entry a prune keeps, with every reason it is kept (never empty, in :class:`KeepReason` order)."""

    entry: Entry
    reasons: tuple[KeepReason, ...]


@attrs.frozen
class RetentionPlan:
    """What a prune keeps (each with its reasons), removes, and which folders it removes; all ascending."""

    kept: tuple[Kept, ...]
    remove: tuple[Entry, ...]
    folders: tuple[str, ...]

    @property
    def prune_plan(self) -> PrunePlan:
        """The same plan as a :class:`~ckpt.domain.prune.PrunePlan` (the reasons left out)."""
        return PrunePlan(keep=tuple(k.entry for k in self.kept), remove=self.remove, folders=self.folders)


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidError(f"{what} must be an integer >= 1, got {value!r}")
    return value


def _outermost(folders: set[str]) -> list[str]:
    """``folders`` without those inside another of them, sorted."""
    return sorted(f for f in folders if not any(f[:i] in folders for i in _slashes(f)))


def _slashes(path: str) -> Iterable[int]:
    return (i for i, char in enumerate(path) if char == "/")


def plan_retention(
    entries: Iterable[Entry],
    keep: int,
    *,
    keep_every: int | None = None,
    pinned: Iterable[Entry] = (),
) -> RetentionPlan:
    """Plan a prune that keeps the ``keep`` greatest entries, every ``keep_every`` steps, and the pinned.

    >>> plan = plan_retention(
    ...     [Entry(1, step, f"exec/a/ck-{step}") for step in (1000, 1500, 2000, 2500, 3000)],
    ...     keep=1,
    ...     keep_every=1000,
    ...     pinned=[Entry(1, 1500, "exec/a/ck-1500")],
    ... )
    >>> [(k.entry.step, [r.value for r in k.reasons]) for k in plan.kept]
    [(1000, ['every']), (1500, ['pinned']), (2000, ['every']), (3000, ['latest', 'every'])]
    >>> plan.folders
    ('exec/a/ck-2500',)
    """
    keep = _count(keep, "keep")
    every = None if keep_every is None else _count(keep_every, "keep_every")
    pins = set(pinned)
    ordered = sort_entries(entries)
    cut = max(len(ordered) - keep, 0)
    kept: list[Kept] = []
    remove: list[Entry] = []
    for index, entry in enumerate(ordered):
        reasons = tuple(
            reason
            for reason, applies in (
                (KeepReason.LATEST, index >= cut),
                (KeepReason.EVERY, every is not None and entry.step % every == 0),
                (KeepReason.PINNED, entry in pins),
            )
            if applies
        )
        if reasons:
            kept.append(Kept(entry, reasons))
        else:
            remove.append(entry)
    needed = Overlap([*(k.entry.save for k in kept), *(p.save for p in pins)])
    candidates = {e.save for e in remove if not needed(e.save)}
    return RetentionPlan(tuple(kept), tuple(remove), tuple(_outermost(candidates)))
