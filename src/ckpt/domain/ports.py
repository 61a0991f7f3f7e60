"""The ports: what the core needs from storage, as small Protocols, and the values they return.

Adapters (``ckpt.adapters.posix``, ``ckpt.adapters.s3``) and the fake (``ckpt.testing.InMemoryStore``)
satisfy these structurally; the store contract suite in ``tests/`` runs against every one of them.

A *location* is a save's address in the store's own form: an absolute POSIX path, or an ``s3://`` URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from ckpt.domain.entries import Entry

if TYPE_CHECKING:
    from ckpt.domain.follow import Followed, StopSignal
    from ckpt.domain.retention import Kept

__all__ = [
    "FileInfo",
    "Folder",
    "PruneResult",
    "SaveReader",
    "SkippedFolder",
    "Store",
    "WatchStore",
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
        """Pin the published ``entry`` so that no prune removes it or its folder (``ckpt.pins``).

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
        each bounded by ``scan_timeout``; ``stop`` ends it before its next listing (``ckpt.following``).
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

    def sync_save(self, save_location: str) -> None:
        """Make the save's content durable before it is published, where the storage needs that.

        POSIX fsyncs the save's files and folders; on S3 and in memory an acknowledged write is durable
        already, so only the location is checked. A location with nothing there is not an error (publish
        says so); one outside the root is ``InvalidError``.
        """
        ...
