"""Working fakes for embedders' tests: an in-memory store that keeps every rule of the real ones.

``InMemoryStore`` passes the same store contract suite as the POSIX and S3 stores, so code written against the
``Store``/``WatchStore`` ports can be tested without a filesystem or a bucket::

    store = InMemoryStore()
    save = store.exec_dir("1.4101.0") + "/checkpoint-500"
    store.write_file(save, "trainer_state.json", b"{}")
    store.publish(1, 500, save)
    assert store.resolve().step == 500

``StaticCredentialSource`` is a credential source (the ``ckpt.creds.Source`` port) with fixed answers, for
testing code that builds a credential chain.

Every instance has its own state (no class-level sharing); a lock makes it safe across threads.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckpt.application.checkpoint_store import CheckpointStore
from ckpt.application.inspection import StoreSaves
from ckpt.domain.arguments import require_str
from ckpt.domain.entries import PUB_DIR_NAME
from ckpt.domain.errors import CredentialsError, InvalidError, MalformedError
from ckpt.domain.journal import DECISION_SUFFIX, JOURNAL_PREFIX
from ckpt.domain.locator import Locator
from ckpt.domain.ports import FileInfo, SaveRemoval
from ckpt.domain.prune import SKIP_ALREADY_GONE
from ckpt.domain.rules import Item, Kind
from ckpt.domain.saves import SaveKind, too_large

if TYPE_CHECKING:
    from ckpt.creds.model import Credentials

__all__ = ["InMemoryStore", "StaticCredentialSource"]


class _MemoryTree:
    """The two store ports in memory: the names in ``pub/`` and the saves' folders and files.

    Paths are relative to the root; ``blobs`` maps a file's path to its content.
    """

    def __init__(self, root: str) -> None:
        self.root = root  # for messages
        self.lock = threading.RLock()
        self.pub: set[str] = set()
        self.pub_dirs: set[str] = set()  # names in pub/ that are folders (malformed; for tests)
        self.dirs: set[str] = set()
        self.blobs: dict[str, bytes] = {}

    # -- PublicationLog ----------------------------------------------------------------------------------

    def list_names(self) -> list[str]:
        with self.lock:
            if self.pub_dirs:
                name = min(self.pub_dirs)
                raise MalformedError(f"malformed entry {name!r} in pub/: a folder", value=name)
            return list(self.pub)

    def create(self, name: str) -> bool:
        with self.lock:
            if name in self.pub or name in self.pub_dirs:
                return False
            self.pub.add(name)
            return True

    def remove(self, names: Sequence[str]) -> list[str]:
        with self.lock:
            removed = [name for name in names if name in self.pub]
            self.pub.difference_update(removed)
            return removed

    # -- SaveTree ----------------------------------------------------------------------------------------

    def kind(self, save: str) -> SaveKind:
        with self.lock:
            if save in self.dirs:
                return SaveKind.FOLDER
            return SaveKind.FILE if save in self.blobs else SaveKind.MISSING

    def folders(self, path: str) -> list[str] | None:
        inside = path + "/" if path else ""
        with self.lock:
            if path == PUB_DIR_NAME:
                return sorted(self.pub_dirs)
            if path and path not in self.dirs:
                return None
            names = {d[len(inside) :] for d in self.dirs if d.startswith(inside)}
            if not path and (self.pub or self.pub_dirs):
                names.add(PUB_DIR_NAME)  # pub/ is a folder of the root, as on the real stores
        return sorted(name for name in names if "/" not in name)

    def read_file(self, save: str, name: str, limit: int) -> bytes | None:
        with self.lock:
            data = self.blobs.get(f"{save}/{name}")
        if data is not None and len(data) > limit:
            raise too_large(f"{self.root}/{save}/{name}", len(data))
        return data

    def is_file(self, save: str, name: str) -> bool:
        with self.lock:
            return f"{save}/{name}" in self.blobs

    def files(self, save: str) -> list[FileInfo]:
        inside = save + "/"
        with self.lock:
            found = [(p[len(inside) :], len(v)) for p, v in self.blobs.items() if p.startswith(inside)]
        return [FileInfo(path, size) for path, size in sorted(found)]

    def remove_saves(self, saves: Sequence[str]) -> list[SaveRemoval]:
        outcomes = []
        with self.lock:
            for save in saves:
                if save in self.blobs and save not in self.dirs:  # a single-file save
                    del self.blobs[save]
                    outcomes.append(SaveRemoval(save))
                    continue
                if save not in self.dirs:
                    outcomes.append(SaveRemoval(save, SKIP_ALREADY_GONE))
                    continue
                self.drop(save)
                outcomes.append(SaveRemoval(save))
        return outcomes

    def drop(self, path: str) -> None:
        inside = path + "/"
        self.dirs = {d for d in self.dirs if d != path and not d.startswith(inside)}
        self.blobs = {f: v for f, v in self.blobs.items() if not f.startswith(inside)}


class _MemoryPins:
    """The pins in memory: the names in ``pins/`` (a ``PublicationLog``, as ``pub/`` is)."""

    def __init__(self, lock: threading.RLock) -> None:
        self.lock = lock
        self.names: set[str] = set()
        self.dirs: set[str] = set()  # names in pins/ that are folders (malformed; for tests)

    def list_names(self) -> list[str]:
        with self.lock:
            if self.dirs:
                name = min(self.dirs)
                raise MalformedError(f"malformed pin {name!r} in pins/: a folder", value=name)
            return list(self.names)

    def create(self, name: str) -> bool:
        with self.lock:
            if name in self.names or name in self.dirs:
                return False
            self.names.add(name)
            return True

    def remove(self, names: Sequence[str]) -> list[str]:
        with self.lock:
            removed = [name for name in names if name in self.names]
            self.names.difference_update(removed)
            return removed


class _MemoryJournal:
    """The prune journals and their decisions in memory (the ``PruneJournal`` port), so that prune and pin
    take the same steps here as on POSIX and S3 (docs/spec/layout.md §5)."""

    def __init__(self, lock: threading.RLock, root: str) -> None:
        self.lock = lock
        self.root = root
        self.objects: dict[str, bytes] = {}

    def write_journal(self, data: bytes) -> str:
        with self.lock:
            name = f"{self.root}/{JOURNAL_PREFIX}{secrets.token_hex(8)}"
            self.objects[name] = bytes(data)
            return name

    def read_journals(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return sorted(self.objects.items())

    def create_decision(self, journal: str, data: bytes) -> bool:
        with self.lock:
            name = journal + DECISION_SUFFIX
            if name in self.objects:
                return False
            self.objects[name] = bytes(data)
            return True

    def journal_exists(self, identifier: str) -> bool:
        with self.lock:
            return identifier in self.objects

    def drop_journals(self, identifiers: Sequence[str]) -> None:
        with self.lock:
            for identifier in identifiers:
                self.objects.pop(identifier, None)


class InMemoryStore(CheckpointStore):
    """A checkpoint root held in memory. Locations look like ``memory://<name>/<save>``."""

    __slots__ = ("_memory", "_memory_pins")

    def __init__(self, name: str = "root") -> None:
        if not require_str(name, "in-memory root name") or "/" in name:
            raise InvalidError(f"in-memory root name {name!r} must be one non-empty path element")
        self._memory = _MemoryTree(f"memory://{name}")
        locator = Locator(self._memory.root, scheme="memory://", form="a memory:// location")
        self._memory_pins = _MemoryPins(self._memory.lock)
        journal = _MemoryJournal(self._memory.lock, self._memory.root)
        super().__init__(self._memory, self._memory, locator, journal, pins=self._memory_pins)

    # -- building trees in tests -----------------------------------------------------------------------

    def make_dir(self, location: str) -> None:
        """Create a folder (and its parents) at ``location``."""
        parts = self._locator.save_of(location).split("/")
        with self._memory.lock:
            self._memory.dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))

    def write_file(self, location: str, name: str, data: bytes) -> None:
        """Write file ``name`` (may contain ``/``) inside the folder at ``location``, creating folders."""
        path = f"{self._locator.save_of(location)}/{name}"
        with self._memory.lock:
            self.make_dir(self._locator.location(path.rsplit("/", 1)[0]))
            self._memory.blobs[path] = bytes(data)

    def remove_tree(self, location: str) -> None:
        """Delete the folder at ``location`` and everything in it (as a framework's retention would)."""
        with self._memory.lock:
            self._memory.drop(self._locator.save_of(location))

    def saves_reader(self, location: str) -> _MemorySaves:
        """The reader the rules judge the saves location ``location`` through (``ReadsSaves``): its folders
        and, unlike a reader over the ``WatchStore`` port alone, its files, so single-file saves (Lightning's
        ``.ckpt``, a configured ``kind = "file"`` rule) are judged here as on POSIX and S3."""
        return _MemorySaves(self, self._memory, location, self._locator.save_of(location))

    def put_raw_entry(self, name: str, *, folder: bool = False) -> None:
        """Put any name into ``pub/``, bypassing validation (to test how malformed names are refused)."""
        with self._memory.lock:
            (self._memory.pub_dirs if folder else self._memory.pub).add(name)

    def put_raw_pin(self, name: str, *, folder: bool = False) -> None:
        """Put any name into ``pins/``, bypassing validation (to test how malformed pins are refused)."""
        with self._memory.lock:
            (self._memory_pins.dirs if folder else self._memory_pins.names).add(name)

    def raw_names(self) -> list[str]:
        """Return the names in ``pub/``, sorted, without parsing them."""
        with self._memory.lock:
            return sorted(self._memory.pub | self._memory.pub_dirs)


class _MemorySaves(StoreSaves):
    """A saves location of an :class:`InMemoryStore`: :class:`StoreSaves`, plus the files it holds."""

    def __init__(self, store: InMemoryStore, memory: _MemoryTree, location: str, path: str) -> None:
        super().__init__(store, location)
        self._memory = memory
        self._inside = f"{path}/" if path else ""

    def items(self) -> list[Item]:
        found = super().items()
        with self._memory.lock:
            names = [p[len(self._inside) :] for p in self._memory.blobs if p.startswith(self._inside)]
        return found + [Item(name, Kind.FILE) for name in sorted(names) if "/" not in name]

    def is_file(self, path: str) -> bool:
        with self._memory.lock:
            return f"{self._inside}{path}" in self._memory.blobs


class StaticCredentialSource:
    """A credential source with a fixed answer: keys, absent (``None``), or broken (``broken=True``).

    ``calls`` counts fetches, so a test can check how often a chain asked. Change ``credentials`` to
    simulate a rotated secret.
    """

    def __init__(
        self, credentials: Credentials | None, *, name: str = "static", broken: bool = False
    ) -> None:
        self.credentials = credentials
        self.broken = broken
        self.calls = 0
        self._name = name

    def __repr__(self) -> str:
        return f"StaticCredentialSource(name={self._name!r})"

    @property
    def name(self) -> str:
        """The source's name in messages."""
        return self._name

    def fetch(self) -> Credentials | None:
        """Return the fixed credentials, ``None`` when absent, or raise ``CredentialsError`` when broken."""
        self.calls += 1
        if self.broken:
            raise CredentialsError(
                f"credential source {self._name} is broken (StaticCredentialSource)", source=self._name
            )
        return self.credentials
