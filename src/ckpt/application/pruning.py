"""Carrying out a prune plan: the steps after the plan, written once over the store's ports
(docs/spec/operations.md §5.4 steps 2-6; the plan itself is ``CheckpointStore.prune``).

Rules this module keeps:

1. Before the plan (:meth:`PruneRun.inherit`), every journal earlier prunes left is settled
   (``ckpt.application.decisions``) against the entries and then the pins the plan reads: a journal whose
   prune died before deciding is decided now (taken over), and every entry a decision spares that is absent
   is created again, as ``publish`` creates one. The plan then counts those entries, so a killed prune's
   job is finished, not undone. A dry run settles nothing.
2. The journal lists the folders and the entries to remove and is durable before any entry is removed
   (layout.md §5.4); a prune with nothing to remove writes none.
3. After removing its entries, the prune reads the entries and then the pins (in that order) and settles its
   own journal; an entry its decision spares (a pin made meanwhile) is created again. When another decider
   was first, its decision is followed. On a store without a journal port, an entry this prune removed that a
   pin now names is put back at once.
4. The folders are re-checked against the entries read in rule 3, every spared entry and the pins
   (``recheck_folders``), then removed in one batch. Then every journal read and this prune's own are
   dropped, each before its decision, and the orphan decisions.
5. Any failure after the journal is written (or after anything was put back) is
   :class:`~ckpt.domain.errors.PruneIncompleteError`, which names the journal and lists what was already
   removed and put back. Before it, nothing has changed and the failure is raised as it is.
6. A prune whose own journal another prune finished meanwhile (two prunes at once, layout.md §5.8) puts
   back the entries it removed that a pin named when it read them, removes no folder, and fails saying so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import attrs

from ckpt.application.decisions import settle
from ckpt.application.pins import pinned_entries
from ckpt.domain.entries import Entry
from ckpt.domain.errors import MalformedError, PruneIncompleteError, StorageError
from ckpt.domain.journal import Journal, JournalContent, format_journal
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import SaveRemoval, SkippedFolder
from ckpt.domain.prune import Overlap, recheck_folders
from ckpt.domain.retention import SKIP_PINNED

if TYPE_CHECKING:
    from ckpt.application.checkpoint_store import CheckpointStore, PhysicallyNeeded
    from ckpt.domain.locator import Locator
    from ckpt.domain.ports import PruneJournal, PublicationLog, SaveTree

__all__ = ["PruneRun"]

_MAX_REFUSED_IN_MESSAGE = 10
#: Judges physical identity (``CheckpointStore._physically_needed``).
NeededBy = Callable[[Iterable[str], Iterable[Entry], Sequence[str]], "PhysicallyNeeded | None"]
#: Removes folders, sparing what that judgement found needed (``CheckpointStore._remove_folders``).
RemovesFolders = Callable[[Sequence[str], "PhysicallyNeeded | None"], "list[SaveRemoval]"]


class PruneRun:
    """One prune from its journal on (rules 1-5); ``CheckpointStore.prune`` makes the plan and reports."""

    def __init__(
        self, store: CheckpointStore, parts: tuple[PublicationLog, SaveTree, PruneJournal | None, Locator]
    ) -> None:
        self._store = store
        self._log, self._tree, self._port, self._locator = parts
        self._remove: tuple[Entry, ...] = ()
        self._planned: tuple[str, ...] = ()
        self._left: tuple[str, ...] = ()
        self._drop: list[str] = []
        self.journal: str | None = None
        self._removed_names: set[str] = set()
        self._spared: set[Entry] = set()  # the entries this prune's own decision spares
        #: The entries the journals read before the plan spare (rule 1): their folders are not inherited.
        self.inherited_spared: frozenset[Entry] = frozenset()
        self.restored: list[Entry] = []
        self.removed_folders: list[str] = []

    # -- reporting -------------------------------------------------------------------------------------

    def removed_entries(self) -> tuple[Entry, ...]:
        """The planned entries this prune removed and no decision spared, ascending."""
        return tuple(
            e for e in self._remove if format_entry_name(e) in self._removed_names and e not in self._spared
        )

    def _incomplete(self, error: CkptErrorLike, *, entries_known: bool = True) -> PruneIncompleteError:
        """``error`` as ``PruneIncompleteError``, saying what this prune left (rule 5)."""
        removed = self.removed_entries() if entries_known else self._absent_planned()
        done = (
            f"before it stopped, prune removed {len(removed)} entries and {len(self.removed_folders)} folders"
        )
        if self.restored:
            done += f" and put back {len(self.restored)} pinned entries"
        note = f"{error}; {done}"
        if self.journal is not None:
            note += (
                f"; the folders still to remove are listed in {self.journal}, and the next prune removes them"
            )
        again = PruneIncompleteError(
            note,
            location=getattr(error, "location", None),
            journal=self.journal,
            removed_entries=removed,
            removed_folders=tuple(self.removed_folders),
            restored=tuple(self.restored),
        )
        again.__cause__ = error
        return again

    def _absent_planned(self) -> tuple[Entry, ...]:
        """The planned entries no longer listed (after a failed removal: which of them went is not known)."""
        try:
            there = set(self._store.entries())
        except (StorageError, MalformedError):
            return ()
        return tuple(e for e in self._remove if e not in there)

    # -- the steps -------------------------------------------------------------------------------------

    def inherit(
        self, journals: Sequence[Journal], orphans: Sequence[str], entries: list[Entry], pins: list[Entry]
    ) -> list[Entry]:
        """Settle the journals read before the plan and put back what they spare (rule 1); return the
        entries as the plan must see them (``entries`` and those put back)."""
        port = self._port
        if port is None or not journals:
            self._drop = list(orphans)
            return entries
        there = set(entries)
        spared: set[Entry] = set()
        for journal in journals:
            settled = settle(port, journal, entries, pins)
            if settled is None:
                continue  # another prune finished it meanwhile
            spared.update(settled.spared)
            self._drop.extend(n for n in (settled.identifier, settled.decision) if n is not None)
        self._drop.extend(orphans)
        try:
            self._put_back(sorted(spared - there, key=lambda e: e.key))
        except StorageError as exc:
            raise self._incomplete(exc) from exc
        self.inherited_spared = frozenset(spared)
        return sorted({*entries, *self.restored}, key=lambda e: e.key)

    def _put_back(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if self._log.create(format_entry_name(entry)):
                self.restored.append(entry)

    def start(self, remove: tuple[Entry, ...], planned: tuple[str, ...], left: tuple[str, ...]) -> None:
        """Write the journal (rule 2), then remove the planned entries."""
        self._remove, self._planned, self._left = remove, planned, left
        if self._port is not None and (planned or left or remove):
            self.journal = self._port.write_journal(format_journal((*planned, *left), remove))
        try:
            self._removed_names = set(self._log.remove([format_entry_name(e) for e in remove]))
        except StorageError as exc:
            raise self._incomplete(exc, entries_known=False) from exc

    def finish(self, needed_by: NeededBy, remove_folders: RemovesFolders) -> list[SkippedFolder]:
        """Read again, decide, put back, re-check and remove the folders, drop the journals (rules 2-4);
        return the folders skipped."""
        try:
            return self._finish(needed_by, remove_folders)
        except (StorageError, MalformedError) as exc:
            if isinstance(exc, PruneIncompleteError):
                raise
            raise self._incomplete(exc) from exc

    def _finish(self, needed_by: NeededBy, remove_folders: RemovesFolders) -> list[SkippedFolder]:
        present = self._store.entries()
        pins = pinned_entries(self._store)
        planned, left = self._decide(present, pins)
        self._put_back(sorted(self._spared - set(present), key=lambda e: e.key))
        pinned_now = Overlap(p.save for p in pins)
        saves_now = [*(e.save for e in present), *(e.save for e in self._spared)]
        needed = needed_by(saves_now, pins, (*planned, *left))
        check = recheck_folders(planned, left, [*saves_now, *(p.save for p in pins)], needed)
        check = attrs.evolve(
            check,
            skipped=tuple((f, SKIP_PINNED if pinned_now(f) else why) for f, why in check.skipped),
        )
        outcomes = remove_folders(check.remove, needed)  # sparing what the re-check found needed
        skipped = [SkippedFolder(self._locator.location(f), why) for f, why in check.skipped]
        refused: list[tuple[str, str]] = []
        for outcome in outcomes:
            refused.extend(outcome.refused)
            if outcome.skipped is not None:
                skipped.append(SkippedFolder(self._locator.location(outcome.save), outcome.skipped))
            elif not outcome.refused:
                self.removed_folders.append(self._locator.location(outcome.save))
        if refused:
            raise StorageError(
                f"the storage refused to delete {len(refused)} objects: {_refused_text(refused)}",
                location=refused[0][0],
            )
        if self._port is not None and self._drop:
            self._port.drop_journals(self._drop)
        return skipped

    def _decide(self, present: list[Entry], pins: list[Entry]) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Settle this prune's own journal (rules 3, 6); return the planned and inherited folders to judge."""
        removed = {e for e in self._remove if format_entry_name(e) in self._removed_names}
        port = self._port
        if port is None:
            self._spared = removed & set(pins)
            return self._planned, self._left
        if self.journal is None:
            return self._planned, self._left
        own = settle(port, Journal(self.journal, JournalContent((), self._remove)), present, pins)
        if own is None:  # rule 6
            self._spared |= removed & set(pins)
            self._put_back(sorted(self._spared - set(present), key=lambda e: e.key))
            raise StorageError(
                f"another prune finished this prune's journal {self.journal} while it ran (run one prune at "
                "a time on a root); no folder was removed",
                location=self.journal,
            )
        self._spared.update(own.spared)
        self._drop[:0] = [n for n in (own.identifier, own.decision) if n is not None]
        return self._planned, self._left


CkptErrorLike = StorageError | MalformedError


def _refused_text(refused: Sequence[tuple[str, str]]) -> str:
    """Return "location (code), ..." for the first few refused objects, and how many more there are."""
    shown = ", ".join(f"{location} ({code})" for location, code in refused[:_MAX_REFUSED_IN_MESSAGE])
    more = len(refused) - _MAX_REFUSED_IN_MESSAGE
    return shown + (f", and {more} more" if more > 0 else "")
