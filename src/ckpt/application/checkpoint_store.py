"""``CheckpointStore``: the public store API, every flow once over the small store ports
(docs/spec/operations.md).

A store technology provides a :class:`~ckpt.domain.ports.PublicationLog`, a
:class:`~ckpt.domain.ports.SaveTree`, a :class:`~ckpt.domain.locator.Locator` and, optionally, a
:class:`~ckpt.domain.ports.PruneJournal`; this class turns them into the ``WatchStore`` users get.

Rules this module keeps:

0. Every public method checks its arguments' types first (``ckpt.domain.arguments``): a wrong type is
   ``InvalidTypeError`` on every store.
1. Publish validates everything before touching storage: the location is under the root and names a valid
   save, the entry name fits. Then the save must be a folder (``ckpt.domain.saves.check_save_kind``:
   ``SaveNotFoundError`` when missing, ``InvalidError`` when it is something else), and the entry is
   created exclusively (``ExistsError`` carrying the entry when it is already there).
2. ``resolve`` is a pure read of the names: when the log offers its names in chunks
   (:class:`~ckpt.domain.ports.ScansNameChunks`) no whole listing is held (benchmarks/README.md); any
   oddity falls back to the plain listing, which reports it exactly as ``entries`` does.
3. Prune: plan from one listing; read earlier journals and add the folders they left; in a dry run stop
   there. Otherwise write a journal listing every folder about to go, remove the planned entries, read the
   entries again, re-check the folders against them (``recheck_folders``), remove what is still to go in
   one batch, report the skips, and drop the journals. A failure after the journal is written leaves it,
   and the next prune finishes the job (docs/adr/0004-prune-safety.md). Where the tree can tell a folder's
   physical identity (:class:`~ckpt.domain.ports.IdentifiesFolders`: POSIX), a candidate another spelling
   of a needed save reaches is kept, both before the journal and in the re-check (docs/adr/0019).
4. The watcher's reads take locations under the root only and file names that stay inside the save
   (``ckpt.domain.saves``); the markers are regular files, read with a size cap (``MAX_READ_BYTES``).
   ``sync_save`` checks the location and, when the tree can sync (:class:`~ckpt.domain.ports.SyncsSaves`:
   POSIX), makes the save durable; elsewhere an acknowledged write is durable already.
5. ``removing`` reads every prune journal (one listing, one read each) and says which saves a prune has
   begun removing (``ckpt.domain.removing``; docs/spec/layout.md §5.9): the watcher, catch-up and verified
   resolve ask it before they hand out a save they judged complete.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from typing import TYPE_CHECKING

from ckpt.domain.arguments import require_bool, require_instance, require_int
from ckpt.domain.entries import PUB_DIR_NAME, Entry
from ckpt.domain.errors import ExistsError, MalformedError, StorageError
from ckpt.domain.locator import Locator
from ckpt.domain.names import LatestEntryScan, format_entry_name, latest_entry_of_names, parse_entry_names
from ckpt.domain.ports import (
    FileInfo,
    Folder,
    IdentifiesFolders,
    PruneJournal,
    PruneResult,
    PublicationLog,
    SaveRemoval,
    SaveTree,
    ScansNameChunks,
    SkippedFolder,
    SyncsSaves,
)
from ckpt.domain.saves import MAX_READ_BYTES, check_save_kind, validate_file_name

if TYPE_CHECKING:
    from ckpt.domain.follow import Followed, StopSignal
    from ckpt.domain.journal import Journal
    from ckpt.domain.prune import PhysicalOverlap
    from ckpt.domain.removing import Removing

__all__ = ["CheckpointStore", "PhysicallyNeeded"]


class PhysicallyNeeded:
    """A judgement of physical identity (``_physically_needed``): called with a candidate, whether a needed
    save reaches it by another path; ``overlap.identities`` is what the removal must spare."""

    __slots__ = ("_chains", "overlap")

    def __init__(self, overlap: PhysicalOverlap, chains: Mapping[str, Sequence[Hashable] | None]) -> None:
        self.overlap = overlap
        self._chains = chains

    def __call__(self, folder: str) -> bool:
        return self.overlap(self._chains[folder])


class CheckpointStore:
    """A checkpoint root: the public ``WatchStore``, over one store's small ports."""

    __slots__ = ("_chunks", "_identifies", "_journal", "_locator", "_log", "_pins", "_syncs", "_tree")

    def __init__(
        self,
        log: PublicationLog,
        tree: SaveTree,
        locator: Locator,
        journal: PruneJournal | None = None,
        pins: PublicationLog | None = None,
    ) -> None:
        self._log = log
        self._pins = pins  # the names in pins/ (ckpt.application.pins); a store without it has no pins
        self._tree = tree
        self._locator = locator
        self._journal = journal
        # Decided once (an isinstance check on a runtime protocol is not free): rule 2 and rule 4.
        self._chunks = log if isinstance(log, ScansNameChunks) else None
        self._syncs = tree if isinstance(tree, SyncsSaves) else None
        self._identifies = tree if isinstance(tree, IdentifiesFolders) else None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    @property
    def root(self) -> str:
        """The root in its canonical form."""
        return self._locator.root

    # -- locations -------------------------------------------------------------------------------------

    def location(self, entry: Entry) -> str:
        """Return where the save ``entry`` names lives, in the store's own form."""
        return self._locator.location(require_instance(entry, Entry, "entry").save)

    def exec_dir(self, attempt: str) -> str:
        """Return the location of ``<root>/exec/<attempt>``; ``InvalidError`` for a bad attempt."""
        return self._locator.exec_dir(attempt)

    def save_of(self, location: str) -> str:
        """Return the save path of a location under the root, or raise ``InvalidError``."""
        return self._locator.save_of(location)

    # -- publish ---------------------------------------------------------------------------------------

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        """Publish the save at ``save_location`` as of ``epoch`` and ``step`` (rule 1)."""
        require_int(epoch, "epoch")
        require_int(step, "step")
        entry = Entry(epoch, step, self._locator.save_of(save_location))
        name = format_entry_name(entry)  # InvalidError for a save too long, before any request
        check_save_kind(self._tree.kind(entry.save), self._locator.location(entry.save))
        if not self._log.create(name):
            where = f"{self._locator.base}{PUB_DIR_NAME}/{name}"
            raise ExistsError(
                f"already published: epoch {epoch} step {step} save {entry.save} ({where})", entry=entry
            )
        return entry

    # -- reads -----------------------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        """Return every entry, ascending. A bad name in ``pub/`` raises ``MalformedError``."""
        return parse_entry_names(self._log.list_names())

    def resolve(self) -> Entry | None:
        """Return the greatest entry, or ``None``: a pure read of the names (rule 2)."""
        if self._chunks is not None:
            scan = LatestEntryScan()
            try:
                with closing(self._chunks.iter_name_chunks(LatestEntryScan.CHUNK)) as chunks:
                    for chunk in chunks:
                        scan.add(chunk)
                return scan.result()
            except MalformedError:
                pass  # the plain listing reports it precisely
        return latest_entry_of_names(self._log.list_names())

    def removing(self) -> Removing:
        """Return the saves the complete prune journals list: being removed (rule 5); none without a
        journal port, at no cost."""
        from ckpt.domain.removing import NEVER_REMOVING, Removing  # here: plain resolve imports no prune code

        if self._journal is None:
            return NEVER_REMOVING
        removing = Removing.of_journals(self._journal.read_journals())
        if self._identifies is not None and removing:
            return removing.by_identity(self._identifies.physical_chains)  # ckpt.domain.removing rule 4
        return removing

    # -- pins (the flows in ckpt.application.pins; docs/spec/operations.md §9), and prune ----------------

    def pin_names(self) -> list[str]:
        """Return the names in ``pins/`` (none when this store keeps no pins)."""
        return self._pins.list_names() if self._pins is not None else []

    def create_pin(self, name: str) -> bool:
        """Create the pin ``name`` exclusively and durably; False when it was there."""
        if self._pins is None:
            raise StorageError(f"{self.root} keeps no pins", location=self.root)
        return self._pins.create(name)

    def remove_pins(self, names: Sequence[str]) -> None:
        """Remove the pins ``names``; absent ones are fine."""
        if self._pins is not None and names:
            self._pins.remove(list(names))

    def pin(self, entry: Entry) -> bool:
        """Pin a published entry; True when this call pinned it (``ckpt.application.pins`` rule 2)."""
        from ckpt.application.pins import pin_entry

        return pin_entry(self, entry)

    def unpin(self, entry: Entry) -> bool:
        """Unpin an entry; True when it was pinned. Unpinning twice is not an error."""
        from ckpt.application.pins import unpin_entry

        return unpin_entry(self, entry)

    def pinned(self) -> list[Entry]:
        """Return the pinned entries, ascending; ``MalformedError`` for a bad name in ``pins/``."""
        from ckpt.application.pins import pinned_entries

        return pinned_entries(self)

    def follow(
        self,
        *,
        interval: float = 10.0,
        from_start: bool = False,
        scan_timeout: float | None = 120.0,
        stop: StopSignal | None = None,
    ) -> Iterator[Followed]:
        """Yield each entry as it is published, once, marked as the latest or not (``following``)."""
        from ckpt.application.following import follow

        return follow(self, interval=interval, from_start=from_start, scan_timeout=scan_timeout, stop=stop)

    def prune(self, keep: int, *, keep_every: int | None = None, dry_run: bool = False) -> PruneResult:
        """Remove the entries no retention tier keeps, then the folders only they named (rule 3).

        Pinned entries are kept, and every folder a pin names; after the removals the entries and then the
        pins are read again and the journals decided (``ckpt.application.decisions``): an entry pinned
        meanwhile is put back, by this prune or, if it fails, by the next one.
        """
        from ckpt.application.pins import pinned_entries
        from ckpt.domain.prune import SKIP_ANOTHER_PATH, Overlap, leftover_folders
        from ckpt.domain.retention import plan_retention

        require_int(keep, "keep")
        if keep_every is not None:
            require_int(keep_every, "keep_every")
        require_bool(dry_run, "dry_run")
        from ckpt.application.pruning import PruneRun

        entries = self.entries()
        pins = pinned_entries(self)
        journals, orphans = self._control()
        run = PruneRun(self, (self._log, self._tree, self._journal, self._locator))
        if not dry_run:
            entries = run.inherit(journals, orphans, entries, pins)
        retention = plan_retention(entries, keep, keep_every=keep_every, pinned=pins)
        plan = retention.prune_plan
        # A folder a pin or a spared entry names is not inherited (layout.md §5.6).
        spared = run.inherited_spared if not dry_run else {e for j in journals for e in j.spared}
        protected = Overlap([*(p.save for p in pins), *(e.save for e in spared)])
        left = tuple(
            f for f in leftover_folders(plan, (f for j in journals for f in j.folders)) if not protected(f)
        )
        # Before the journal, so that the journal, a dry run and the result agree (§5.11).
        needed = self._physically_needed((k.entry.save for k in retention.kept), pins, (*plan.folders, *left))
        aliased = {f for f in (*plan.folders, *left) if needed is not None and needed(f)}
        planned = tuple(f for f in plan.folders if f not in aliased)
        left = tuple(f for f in left if f not in aliased)
        early = [SkippedFolder(self._locator.location(f), SKIP_ANOTHER_PATH) for f in sorted(aliased)]
        if dry_run:
            folders = tuple(self._locator.location(f) for f in (*planned, *left))
            return PruneResult(plan.remove, folders, tuple(early), dry_run=True, kept=retention.kept)
        run.start(plan.remove, planned, left)
        skipped = run.finish(self._physically_needed, self._remove_folders)
        return PruneResult(
            run.removed_entries(),
            tuple(run.removed_folders),
            (*early, *skipped),
            kept=retention.kept,
            restored=tuple(sorted(run.restored, key=lambda e: e.key)),
        )

    def create_entry(self, name: str) -> bool:
        """Create the entry ``name`` exclusively and durably (a pin's put-back, ``ckpt.application.pins``)."""
        return self._log.create(name)

    def prune_journals(self) -> list[Journal]:
        """Return the prune journals left in the store, each with its decision (none without journals)."""
        return self._control()[0]

    def _control(self) -> tuple[list[Journal], list[str]]:
        """The journals earlier prunes left, each with its decision, and the orphan decisions."""
        from ckpt.domain.journal import read_control

        if self._journal is None:
            return [], []
        return read_control(self._journal.read_journals())

    def _physically_needed(
        self, saves: Iterable[str], pins: Iterable[Entry], folders: Sequence[str]
    ) -> PhysicallyNeeded | None:
        """Return whether a candidate among ``folders`` physically is, contains or lies inside one of
        ``saves`` or a pin's save (``ckpt.domain.prune`` rule 5); None when the tree cannot tell or there is
        no candidate."""
        from ckpt.domain.prune import PhysicalOverlap

        if self._identifies is None or not folders:
            return None
        needed = list(dict.fromkeys([*saves, *(p.save for p in pins)]))
        chains = self._identifies.physical_chains(list(dict.fromkeys([*needed, *folders])))
        return PhysicallyNeeded(PhysicalOverlap(chains[s] for s in needed), chains)

    def _remove_folders(self, folders: Sequence[str], needed: PhysicallyNeeded | None) -> list[SaveRemoval]:
        """Remove ``folders``; where the tree identifies folders (``needed`` then judged them), never through
        a folder that is, or holds, a needed save by another path (a bind mount inside a candidate; §5.11)."""
        if not folders:
            return []
        if self._identifies is None or needed is None:
            return self._tree.remove_saves(folders)
        return self._identifies.remove_saves_sparing(folders, needed.overlap.identities)

    # -- what the watcher needs ------------------------------------------------------------------------

    def folders(self, location: str) -> list[Folder]:
        """Return the folders directly inside ``location`` (the root or a location under it)."""
        path = self._locator.folder_of(location)
        names = self._tree.folders(path)
        base = self._locator.location(path) if path else self._locator.root
        base = base.rstrip("/")
        return [Folder(name, f"{base}/{name}") for name in names or ()]

    def _file_of(self, save_location: str, name: str) -> str:
        """Return the save path of ``save_location`` once ``name`` is known to be a clean path inside it."""
        save = self._locator.save_of(save_location)
        validate_file_name(name)
        return save

    def small_file_of(self, location: str, name: str, data: bytes) -> tuple[str, str, bytes]:
        """Return ``(save path, name, data)`` for a small file a store writes (``WritesSmallFiles``), once
        ``location`` is known to lie under the root, ``name`` to be a clean relative path, ``data`` bytes."""
        require_instance(data, bytes, "data")
        return self._file_of(location, name), name, data

    def read_file(self, save_location: str, name: str) -> bytes | None:
        """Return the content of the regular file ``name`` inside the save, or ``None`` when there is none."""
        return self._tree.read_file(self._file_of(save_location, name), name, MAX_READ_BYTES)

    def exists(self, save_location: str, name: str) -> bool:
        """Return True when ``name`` inside the save is a regular file."""
        return self._tree.is_file(self._file_of(save_location, name), name)

    def files(self, save_location: str) -> list[FileInfo]:
        """Return every file inside the save, recursively, sorted by path."""
        return self._tree.files(self._locator.save_of(save_location))

    def sync_save(self, save_location: str) -> None:
        """Make the save's content durable before it is published, where the storage needs that (rule 4)."""
        save = self._locator.save_of(save_location)
        if self._syncs is not None:
            self._syncs.sync_save(save)
