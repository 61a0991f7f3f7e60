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

import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from ckpt.domain.arguments import require_bool, require_instance, require_int, require_str
from ckpt.domain.entries import Entry, exec_save_prefix, validate_save
from ckpt.domain.errors import CredentialsError, ExistsError, InvalidError, MalformedError
from ckpt.domain.names import format_entry_name, latest_entry_name, parse_entry_names
from ckpt.domain.ports import FileInfo, Folder, PruneResult, SkippedFolder
from ckpt.domain.prune import Overlap
from ckpt.domain.retention import SKIP_PINNED, SKIP_PUBLISHED, plan_retention
from ckpt.domain.saves import MAX_READ_BYTES, SaveKind, check_save_kind, too_large, validate_file_name
from ckpt.pins import pin_entry, pinned_entries, unpin_entry

if TYPE_CHECKING:
    from ckpt.creds.model import Credentials
    from ckpt.domain.follow import Followed, StopSignal

__all__ = ["InMemoryStore", "StaticCredentialSource"]


class InMemoryStore:
    """A checkpoint root held in memory. Locations look like ``memory://<name>/<save>``."""

    def __init__(self, name: str = "root") -> None:
        if not require_str(name, "in-memory root name") or "/" in name:
            raise InvalidError(f"in-memory root name {name!r} must be one non-empty path element")
        self._root = f"memory://{name}"
        self._lock = threading.RLock()
        self._pub: dict[str, bytes] = {}  # entry name -> content (always empty for real entries)
        self._pub_dirs: set[str] = set()  # names in pub/ that are folders (malformed, for tests)
        self._files: dict[str, bytes] = {}  # save-relative file path -> content
        self._dirs: set[str] = set()  # save-relative folder paths
        self._pins: set[str] = set()  # names in pins/
        self._pin_dirs: set[str] = set()  # names in pins/ that are folders (malformed, for tests)

    def __repr__(self) -> str:
        return f"InMemoryStore({self._root!r})"

    @property
    def root(self) -> str:
        """The root, ``memory://<name>``."""
        return self._root

    # -- building trees in tests -----------------------------------------------------------------------

    def _rel(self, location: str) -> str:
        """Return the save path of ``location``; ``InvalidError`` unless it is a clean path under the root.

        One trailing ``/`` is allowed, as on the real stores.
        """
        require_str(location, "save location")
        prefix = self._root + "/"
        candidate = location[:-1] if location.endswith("/") else location
        if not candidate.startswith(prefix):
            raise InvalidError(f"save location {location!r} is not under the root {self._root}")
        try:
            return validate_save(candidate[len(prefix) :])
        except InvalidError as exc:
            raise InvalidError(f"save location {location!r}: {exc}") from None

    def _place(self, location: str) -> str:
        """Return ``""`` for the root itself (with or without a trailing ``/``), else :meth:`_rel`."""
        if isinstance(location, str) and location.rstrip("/") == self._root:
            return ""
        return self._rel(location)

    def make_dir(self, location: str) -> None:
        """Create a folder (and its parents) at ``location``."""
        rel = self._rel(location)
        with self._lock:
            parts = rel.split("/")
            for i in range(1, len(parts) + 1):
                self._dirs.add("/".join(parts[:i]))

    def write_file(self, location: str, name: str, data: bytes) -> None:
        """Write file ``name`` (may contain ``/``) inside the folder at ``location``, creating folders."""
        path = f"{self._rel(location)}/{name}"
        with self._lock:
            self.make_dir(f"{self._root}/{path.rsplit('/', 1)[0]}")
            self._files[path] = bytes(data)

    def remove_tree(self, location: str) -> None:
        """Delete the folder at ``location`` and everything in it (as a framework's retention would)."""
        rel = self._rel(location)
        with self._lock:
            self._drop(rel)

    def put_raw_entry(self, name: str, *, folder: bool = False) -> None:
        """Put any name into ``pub/``, bypassing validation (to test how malformed names are refused)."""
        with self._lock:
            if folder:
                self._pub_dirs.add(name)
            else:
                self._pub[name] = b""

    def _drop(self, rel: str) -> None:
        inside = rel + "/"
        self._dirs = {d for d in self._dirs if d != rel and not d.startswith(inside)}
        self._files = {f: v for f, v in self._files.items() if not f.startswith(inside)}

    # -- the Store port --------------------------------------------------------------------------------

    def location(self, entry: Entry) -> str:
        """Return ``memory://<name>/<save>``."""
        return f"{self._root}/{require_instance(entry, Entry, 'entry').save}"

    def exec_dir(self, attempt: str) -> str:
        """Return ``memory://<name>/exec/<attempt>``."""
        return f"{self._root}/{exec_save_prefix(attempt)}"

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        """Publish the save at ``save_location`` exclusively."""
        entry = Entry(require_int(epoch, "epoch"), require_int(step, "step"), self._rel(save_location))
        save = entry.save
        name = format_entry_name(entry)
        with self._lock:
            kind = (
                SaveKind.FOLDER
                if save in self._dirs
                else SaveKind.FILE
                if save in self._files
                else SaveKind.MISSING
            )
            check_save_kind(kind, self.location(entry))
            if name in self._pub or name in self._pub_dirs:
                raise ExistsError(f"already published: epoch {epoch} step {step} save {save}", entry=entry)
            self._pub[name] = b""
        return entry

    def _names(self) -> list[str]:
        with self._lock:
            if self._pub_dirs:
                name = min(self._pub_dirs)
                raise MalformedError(f"malformed entry {name!r} in pub/: a folder", value=name)
            return list(self._pub)

    def entries(self) -> list[Entry]:
        """Return every entry, ascending."""
        return parse_entry_names(self._names())

    def resolve(self) -> Entry | None:
        """Return the greatest entry, or ``None``."""
        return latest_entry_name(self._names())

    def put_raw_pin(self, name: str, *, folder: bool = False) -> None:
        """Put any name into ``pins/``, bypassing validation (to test how malformed pins are refused)."""
        with self._lock:
            (self._pin_dirs if folder else self._pins).add(name)

    # -- pins (ckpt.pins) ------------------------------------------------------------------------------

    def pin_names(self) -> list[str]:
        """Return the names in ``pins/``; a folder there is ``MalformedError``."""
        with self._lock:
            if self._pin_dirs:
                name = min(self._pin_dirs)
                raise MalformedError(f"malformed pin {name!r} in pins/: a folder", value=name)
            return list(self._pins)

    def create_pin(self, name: str) -> bool:
        """Create the pin ``name`` exclusively; False when it was there."""
        with self._lock:
            if name in self._pins:
                return False
            self._pins.add(name)
            return True

    def remove_pins(self, names: Sequence[str]) -> None:
        """Remove the pins ``names``; absent ones are fine."""
        with self._lock:
            self._pins.difference_update(names)

    def pin(self, entry: Entry) -> bool:
        """Pin a published entry; True when this call pinned it (see ``ckpt.pins``)."""
        return pin_entry(self, entry)

    def unpin(self, entry: Entry) -> bool:
        """Unpin an entry; True when it was pinned. Unpinning twice is not an error."""
        return unpin_entry(self, entry)

    def pinned(self) -> list[Entry]:
        """Return the pinned entries, ascending."""
        return pinned_entries(self)

    def follow(
        self,
        *,
        interval: float = 10.0,
        from_start: bool = False,
        scan_timeout: float | None = 120.0,
        stop: StopSignal | None = None,
    ) -> Iterator[Followed]:
        """Yield each entry as it is published, once, marked as the latest or not (``ckpt.following``)."""
        from ckpt.following import follow

        return follow(self, interval=interval, from_start=from_start, scan_timeout=scan_timeout, stop=stop)

    def prune(self, keep: int, *, keep_every: int | None = None, dry_run: bool = False) -> PruneResult:
        """Remove the entries no retention tier keeps, then the folders only they named; pins protect."""
        require_int(keep, "keep")
        if keep_every is not None:
            require_int(keep_every, "keep_every")
        require_bool(dry_run, "dry_run")
        retention = plan_retention(self.entries(), keep, keep_every=keep_every, pinned=pinned_entries(self))
        plan = retention.prune_plan
        folders = tuple(f"{self._root}/{f}" for f in plan.folders)
        if dry_run:
            return PruneResult(plan.remove, folders, (), dry_run=True, kept=retention.kept)
        with self._lock:
            removed = [e for e in plan.remove if self._pub.pop(format_entry_name(e), None) is not None]
        pins = pinned_entries(self)
        with self._lock:  # put back an entry pinned meanwhile (ckpt.pins rule 2)
            restored = set(removed) & set(pins)
            for entry in restored:
                self._pub.setdefault(format_entry_name(entry), b"")
        removed = [e for e in removed if e not in restored]
        needed = Overlap(e.save for e in self.entries())
        pinned_now = Overlap(p.save for p in pins)
        removed_folders, skipped = [], []
        for folder, location in zip(plan.folders, folders, strict=True):
            with self._lock:
                if pinned_now(folder):
                    skipped.append(SkippedFolder(location, SKIP_PINNED))
                elif needed(folder):
                    skipped.append(SkippedFolder(location, SKIP_PUBLISHED))
                elif folder not in self._dirs:
                    skipped.append(SkippedFolder(location, "already gone"))
                else:
                    self._drop(folder)
                    removed_folders.append(location)
        return PruneResult(tuple(removed), tuple(removed_folders), tuple(skipped), kept=retention.kept)

    # -- the WatchStore port ---------------------------------------------------------------------------

    def folders(self, location: str) -> list[Folder]:
        """Return the folders directly inside ``location`` (the root, or a location under it)."""
        rel = self._place(location)
        inside = rel + "/" if rel else ""
        base = f"{self._root}/{inside}"
        with self._lock:
            names = sorted(d[len(inside) :] for d in self._dirs if d.startswith(inside))
            if not rel and self._pub_dirs | self._pub.keys():
                names.append("pub")  # pub/ is a folder of the root as soon as it holds a name
        return [Folder(n, base + n) for n in names if "/" not in n]

    def _file_key(self, save_location: str, name: str) -> str:
        return f"{self._rel(save_location)}/{validate_file_name(name)}"

    def read_file(self, save_location: str, name: str) -> bytes | None:
        """Return the content of ``name`` inside the save, or ``None``; at most 64 MiB."""
        key = self._file_key(save_location, name)
        with self._lock:
            data = self._files.get(key)
        if data is not None and len(data) > MAX_READ_BYTES:
            raise too_large(f"{self._root}/{key}", len(data))
        return data

    def exists(self, save_location: str, name: str) -> bool:
        """Return True when file ``name`` exists inside the save."""
        key = self._file_key(save_location, name)
        with self._lock:
            return key in self._files

    def sync_save(self, save_location: str) -> None:
        """Check the location; memory needs no sync (the WatchStore port)."""
        self._rel(save_location)

    def files(self, save_location: str) -> list[FileInfo]:
        """Return every file inside the save with its size, sorted by path."""
        inside = self._rel(save_location) + "/"
        with self._lock:
            return sorted(
                (FileInfo(p[len(inside) :], len(v)) for p, v in self._files.items() if p.startswith(inside)),
                key=lambda f: f.path,
            )


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
