"""The ports: what users get from a store, what a store must provide, and the values they exchange.

Two kinds of port live here:

* The public ones, :class:`Store`, :class:`SaveReader` and :class:`WatchStore`: the API users program
  against. One class implements them, ``ckpt.application.CheckpointStore``, by running every flow (publish,
  entries, resolve, prune, the watcher's reads) once.
* The small store ports a storage technology implements: :class:`PublicationLog` (the names in ``pub/``),
  :class:`SaveTree` (the saves' folders and files) and, optionally, :class:`PruneJournal` (the prune's control
  objects), plus optional capabilities (:class:`SyncsSaves`, :class:`ScansNameChunks`,
  :class:`ProbesExclusiveCreate`, :class:`IdentifiesFolders`), checked with ``isinstance`` on these
  runtime-checkable protocols.
  docs/adding-a-store.md walks through them.

A *location* is a save's address in the store's own form: an absolute POSIX path, an ``s3://`` or a
``memory://`` URL (``ckpt.domain.locator``). The small ports never see locations: they take *save paths*
relative to the root (``exec/a/ck-1``; ``""`` is the root itself where a folder is meant) and entry names.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from ckpt.domain.entries import Entry
from ckpt.domain.saves import SaveKind

if TYPE_CHECKING:
    from ckpt.domain.follow import Followed, StopSignal
    from ckpt.domain.removing import Removing
    from ckpt.domain.retention import Kept

__all__ = [
    "ExclusiveCreateProbe",
    "FileInfo",
    "Folder",
    "IdentifiesFolders",
    "KnowsRemovals",
    "ProbesExclusiveCreate",
    "PruneJournal",
    "PruneResult",
    "PublicationLog",
    "SaveReader",
    "SaveRemoval",
    "SaveTree",
    "ScansNameChunks",
    "SkippedFolder",
    "Store",
    "SyncsSaves",
    "WatchStore",
    "WritesSmallFiles",
]


@attrs.frozen
class SkippedFolder:
    """A folder prune would have removed but left in place, and why."""

    location: str
    reason: str


@attrs.frozen
class PruneResult:
    """What a prune removed (or, in a dry run, would remove), and the folders it left and why."""

    removed_entries: tuple[Entry, ...]
    removed_folders: tuple[str, ...]
    skipped: tuple[SkippedFolder, ...]
    dry_run: bool = False
    kept: tuple[Kept, ...] = ()  # every entry kept, with why (latest, every, pinned), ascending
    restored: tuple[Entry, ...] = ()  # entries a pin spared, created again by this prune, ascending


@attrs.frozen
class Folder:
    """One folder directly inside a store location: its name and its location."""

    name: str
    location: str


@attrs.frozen
class FileInfo:
    """One file inside a save: its path relative to the save (slash-separated) and its size in bytes."""

    path: str
    size: int


@runtime_checkable
class Store(Protocol):
    """One checkpoint root's publication log."""

    @property
    def root(self) -> str:
        """The root, as given: an absolute path or an ``s3://`` URL."""
        ...

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        """Publish the save at ``save_location`` (a location under the root) as of ``epoch`` and ``step``.

        The save must exist and be a folder (``ckpt.domain.saves``). Creates the entry exclusively; when this
        returns, the entry is durable. Raises ``ExistsError`` (carrying the entry, untouched) when it is
        already published, ``InvalidError`` for a location outside the root, an invalid save or one that is
        not a folder, ``SaveNotFoundError`` (an ``InvalidError``) when the save does not exist,
        ``NotFoundError`` when the root does not, ``StorageError`` when the storage fails.
        """
        ...

    def entries(self) -> list[Entry]:
        """Return every entry, ascending. A bad name or a sub-folder in ``pub/`` raises ``MalformedError``.

        A missing ``pub/`` has no entries; a missing root raises ``NotFoundError``.
        """
        ...

    def resolve(self) -> Entry | None:
        """Return the greatest entry, or ``None``. A pure read: no lock, no write, no check of the save."""
        ...

    def prune(self, keep: int, *, keep_every: int | None = None, dry_run: bool = False) -> PruneResult:
        """Remove the entries no retention tier keeps, then the folders only removed entries named.

        Kept: the ``keep`` greatest entries, every entry whose step is a multiple of ``keep_every`` (when
        given), and every pinned entry; no folder a kept entry or a pin needs is removed
        (``ckpt.domain.retention``). Entries and pins are read again after the removals and before any
        folder is removed; an entry pinned meanwhile is put back. ``keep < 1`` or ``keep_every < 1`` raises
        ``InvalidError``. With ``dry_run`` nothing is changed and the result says what would be removed.
        """
        ...

    def pin(self, entry: Entry) -> bool:
        """Pin the published ``entry`` so that no prune removes it or its folder (``ckpt.application.pins``).

        Returns True when this call pinned it, False when it was already pinned. ``NotFoundError`` when
        the entry is not published (or a prune removed it while it was being pinned).
        """
        ...

    def unpin(self, entry: Entry) -> bool:
        """Remove the pin of ``entry``; True when there was one. Unpinning twice is not an error."""
        ...

    def pinned(self) -> list[Entry]:
        """Return the pinned entries, ascending; ``MalformedError`` for a bad name in ``pins/``."""
        ...

    def follow(
        self,
        *,
        interval: float = 10.0,
        from_start: bool = False,
        scan_timeout: float | None = 120.0,
        stop: StopSignal | None = None,
    ) -> Iterator[Followed]:
        """Yield each entry once as it is published, in log order, marked when it is not the latest.

        Starts from the moment of the call unless ``from_start``; one listing per ``interval`` seconds,
        each bounded by ``scan_timeout``; ``stop`` ends it before its next listing
        (``ckpt.application.following``).
        """
        ...

    def location(self, entry: Entry) -> str:
        """Return where the save ``entry`` names lives, in the store's own form."""
        ...

    def exec_dir(self, attempt: str) -> str:
        """Return the location of ``<root>/exec/<attempt>``; ``InvalidError`` for a bad attempt."""
        ...


@runtime_checkable
class SaveReader(Protocol):
    """Reads the files inside a save, so one framework rule runs on every store.

    ``save_location`` must lie under the root and ``name`` be a clean path inside the save, else
    ``InvalidError``. A file here is a regular file (``ckpt.domain.saves`` rule 3): a folder, a link or a
    FIFO of that name is no file.
    """

    def read_file(self, save_location: str, name: str) -> bytes | None:
        """Return the content of file ``name`` inside the save, or ``None`` when there is none.

        At most ``ckpt.domain.saves.MAX_READ_BYTES`` (64 MiB) are read; a larger file is a ``StorageError``.
        """
        ...

    def exists(self, save_location: str, name: str) -> bool:
        """Return True when file ``name`` is present inside the save (only "no such file" is absence)."""
        ...

    def files(self, save_location: str) -> list[FileInfo]:
        """Return every file inside the save, recursively, sorted by path (what "settled" compares)."""
        ...


@runtime_checkable
class WatchStore(Store, SaveReader, Protocol):
    """A store the watcher can look into for saves."""

    def folders(self, location: str) -> list[Folder]:
        """Return the folders directly inside ``location``, in no particular order.

        ``location`` is the root or a location under it (a trailing ``/`` changes nothing), else
        ``InvalidError``. None when ``location`` does not exist; ``NotFoundError`` when the root does not.
        """
        ...

    def save_of(self, location: str) -> str:
        """Return the save path ``location`` names, checked exactly as ``publish`` checks it
        (docs/spec/operations.md §1.2): ``InvalidError`` for a location outside the root, one with ``..``
        or any other invalid save path. No storage is read."""
        ...

    def sync_save(self, save_location: str) -> None:
        """Make the save's content durable before it is published, where the storage needs that.

        POSIX fsyncs the save's files and folders; on S3 and in memory an acknowledged write is durable
        already, so only the location is checked. A location with nothing there is not an error (publish
        says so); one outside the root is ``InvalidError``.
        """
        ...


# -- the small store ports ---------------------------------------------------------------------------------


@attrs.frozen
class SaveRemoval:
    """What :meth:`SaveTree.remove_saves` did with one save.

    ``skipped`` is ``None`` when the save's folder was removed, else why it was left (``"already gone"``,
    ``"is a symbolic link (never removed, nor what it points to)"``, ...). ``refused`` lists objects the
    storage refused to delete, as ``(location, code)``: the folder is then partly removed and not
    reported as either.
    """

    save: str
    skipped: str | None = None
    refused: tuple[tuple[str, str], ...] = ()


@runtime_checkable
class PublicationLog(Protocol):
    """The names in ``pub/``: list them, create one exclusively, remove some. Names are never parsed here."""

    def list_names(self) -> list[str]:
        """Return every name in ``pub/``, in no particular order.

        Anything in ``pub/`` that is not an entry object (a sub-folder, a FIFO) is ``MalformedError``
        naming it; a missing ``pub/`` has no names; a missing root is ``NotFoundError``; any other failure
        is ``StorageError``.
        """
        ...

    def create(self, name: str) -> bool:
        """Create the empty entry ``name`` exclusively: True when this call created it, False when it was
        already there (then it is untouched). When True is returned the entry is durable; when creating
        fails after the entry appeared, the entry is removed again before ``StorageError`` is raised.
        """
        ...

    def remove(self, names: Sequence[str]) -> list[str]:
        """Remove ``names``; return those actually removed (a store that cannot tell returns them all).

        An absent name is not an error. Durable when it returns; ``StorageError`` on failure, after which
        some names may be removed.
        """
        ...


@runtime_checkable
class ScansNameChunks(Protocol):
    """Optional capability of a log: its names a chunk at a time, so ``resolve`` holds no whole listing."""

    def iter_name_chunks(self, size: int) -> Generator[list[str], None, None]:
        """Yield the names in ``pub/`` in chunks of at most ``size``, in no particular order.

        Raises ``MalformedError`` (possibly without detail) on anything that is not an entry object; the
        caller then lists again with :meth:`PublicationLog.list_names` for the precise error. Other errors
        as :meth:`PublicationLog.list_names`. Closing the generator early releases what it holds.
        """
        ...


@runtime_checkable
class SaveTree(Protocol):
    """The saves' folders and files, addressed by save path (``""`` is the root where a folder is meant)."""

    def kind(self, save: str) -> SaveKind:
        """Return what is at ``save``: a folder, a regular file (S3: an object at exactly its key), anything
        else (a FIFO, a device), or nothing. ``ckpt.domain.saves.check_save_kind`` decides what publish
        accepts.

        A missing root is ``NotFoundError``; any other failure ``StorageError``.
        """
        ...

    def folders(self, path: str) -> list[str] | None:
        """Return the names of the folders directly inside ``path`` (never through a link), any order.

        ``None`` when ``path`` does not exist (or is not a folder); ``NotFoundError`` when the root does not.
        """
        ...

    def read_file(self, save: str, name: str, limit: int) -> bytes | None:
        """Return the content of the regular file ``name`` (a clean slash-separated path) inside the save.

        ``None`` when there is no regular file there; nothing is read through a link, a FIFO or device is
        never opened. A file larger than ``limit`` bytes is ``ckpt.domain.saves.too_large``.
        """
        ...

    def is_file(self, save: str, name: str) -> bool:
        """Return True when ``name`` inside the save is a regular file (a marker); False otherwise."""
        ...

    def files(self, save: str) -> list[FileInfo]:
        """Return every file inside the save, recursively, with its size, sorted by path.

        Links count as files (with their own size) and are never followed; ``[]`` when the save is gone.
        """
        ...

    def remove_saves(self, saves: Sequence[str]) -> list[SaveRemoval]:
        """Remove each save's folder and everything in it, in the order given; return one outcome per save.

        Never removes through or across a symbolic link or a mount point, never follows a link inside a
        folder. A save that is missing is skipped as ``"already gone"``. A failure that stops the removal
        raises ``StorageError`` naming the folder; objects the storage refuses to delete are reported in
        the outcome instead, and the other saves are still removed.
        """
        ...


@runtime_checkable
class WritesSmallFiles(Protocol):
    """Optional capability of a store: write one small file next to the saves.

    Catch-up uses it for an execution's epoch record (docs/adr/0011-catch-up-on-resume.md). The POSIX
    store, the S3 store and the in-memory fake have it.
    """

    def write_file(self, location: str, name: str, data: bytes) -> None:
        """Write ``name`` inside the folder at ``location`` (creating folders), replacing any old content.

        A reader sees the old content or the new, never a mix, and the file is durable when this returns
        (POSIX: a fsynced temporary file renamed into place; S3: one ``PutObject``). ``location`` must lie
        under the root and ``name`` be a clean path, else ``InvalidError``; a missing root is
        ``NotFoundError`` (it is never created); other failures are ``StorageError``.
        """
        ...


@runtime_checkable
class SyncsSaves(Protocol):
    """Optional capability of a tree: make a save's content durable before it is published (POSIX)."""

    def sync_save(self, save: str) -> None:
        """fsync every regular file and folder of the save, deepest first, then its parent folder.

        A save that is not there is not an error (publish reports it)."""
        ...


@runtime_checkable
class IdentifiesFolders(Protocol):
    """Optional capability of a tree whose folders can have several spellings (POSIX: links, bind mounts).

    Prune keeps a candidate that physically is, contains or lies inside a needed save
    (``ckpt.domain.prune.PhysicalOverlap``), and removes the others without entering a folder that is, or
    holds, a needed save by another path (a bind mount inside a candidate). S3 and the in-memory store
    have no such capability: a key has one spelling.
    """

    def physical_chains(self, saves: Sequence[str]) -> dict[str, tuple[Hashable, ...] | None]:
        """Return, for each save path, its physical identity chain: the identity of what the path resolves
        to, then of each ancestor of that resolved path, up to the top (POSIX: ``(st_dev, st_ino)`` of the
        ``realpath`` and of its parents, up to ``/``); ``None`` for a path that does not resolve (missing,
        a link loop, an element that is a file). Never walks a save's files.

        A missing root is ``NotFoundError``; any other failure is ``StorageError`` naming the path.
        """
        ...

    def remove_saves_sparing(self, saves: Sequence[str], spared: AbstractSet[Hashable]) -> list[SaveRemoval]:
        """:meth:`SaveTree.remove_saves`, never entering nor removing what has an identity in ``spared``.

        ``spared`` holds identities as :meth:`physical_chains` returns them (prune passes every identity
        of the needed saves' chains, ``ckpt.domain.prune.PhysicalOverlap.identities``). A folder, or a
        file, met while removing a save whose identity is spared stops that save's removal with
        ``StorageError`` naming the save's folder and the path where: nothing of the spared folder is
        removed, and what was removed of the save before it stays removed. Comparing identities costs no
        call beyond those the removal makes anyway (POSIX: the ``fstat`` of each folder entered, and the
        inode number each listing already carries).
        """
        ...


@runtime_checkable
class PruneJournal(Protocol):
    """The prune's control objects beside the log (``ckpt.domain.journal`` holds their format).

    Identifiers are the journals' locations (a path or URL), usable in messages.
    """

    def write_journal(self, data: bytes) -> str:
        """Store a new journal holding ``data`` under a fresh random name; durable when it returns."""
        ...

    def read_journals(self) -> list[tuple[str, bytes]]:
        """Return every journal and every decision as ``(identifier, content)``, sorted by identifier.

        One listing of the names that start with ``JOURNAL_PREFIX`` and one read each; a decision's
        identifier is its journal's followed by ``DECISION_SUFFIX`` (``ckpt.domain.journal``).
        """
        ...

    def create_decision(self, journal: str, data: bytes) -> bool:
        """Create the decision of ``journal`` holding ``data``, exclusively and whole: True when this call
        created it, False when one was there already (it is left as it is). Durable when it returns True;
        a reader never sees a part of it."""
        ...

    def journal_exists(self, identifier: str) -> bool:
        """Return True when the journal ``identifier`` is still there (POSIX one ``lstat``, S3 one
        ``HeadObject``)."""
        ...

    def drop_journals(self, identifiers: Sequence[str]) -> None:
        """Remove these journals and decisions, in the order given (a journal before its decision); one
        already gone is not an error. Durable when it returns."""
        ...


@runtime_checkable
class KnowsRemovals(Protocol):
    """Optional capability of a public store: which saves a prune has begun removing (layout.md §5.9).

    ``CheckpointStore`` has it; the watcher, catch-up and verified resolve ask it (when the store has it)
    after they judged a save complete and before they hand it out (watcher.md §4.6).
    """

    def removing(self) -> Removing:
        """Read every prune journal now and return the saves they list (``ckpt.domain.removing``).

        A store without journals answers "nothing" without any I/O. ``MalformedError`` for a complete
        journal that is not well formed (layout.md §5.5), ``StorageError`` when the storage fails.
        """
        ...

    def save_of(self, location: str) -> str:
        """Return the save path of a location under the root, or raise ``InvalidError``."""
        ...


@attrs.frozen
class ExclusiveCreateProbe:
    """What a store's exclusive-create probe found (``ckpt doctor``): honoured or not, where, and why; for
    a concurrent probe (S3) also how many creates were sent at once, and how many were created and refused."""

    honoured: bool
    location: str
    detail: str
    writers: int = 0
    created: int = 0
    refused: int = 0


@runtime_checkable
class ProbesExclusiveCreate(Protocol):
    """Optional capability of a store: check that its storage honours exclusive create (``ckpt doctor``)."""

    def probe_exclusive_create(self) -> ExclusiveCreateProbe:
        """Create a fresh probe object outside ``pub/`` and ``exec/`` twice; the second create must be
        refused. The probe is removed afterwards. Failures to reach the storage raise as usual."""
        ...
