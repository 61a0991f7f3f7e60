"""The publication log on a POSIX filesystem (SPEC §4).

Rules this adapter keeps:

1. Every system call goes through one :class:`Syscalls` object (by default, the ``os`` functions). Tests give
   the store one that fails chosen calls (``tests/support/faulty_syscalls.py``); nothing else differs.
2. ``pub/`` is only ever opened with ``O_NOFOLLOW|O_DIRECTORY``, and entries are created, listed and removed
   relative to that descriptor: a ``pub/`` that is a symbolic link is refused (reading or writing through it
   would touch files outside the root), and one swapped for a link mid-operation is never followed.
3. Publish creates ``pub/<name>`` with ``O_CREAT|O_EXCL|O_NOFOLLOW``, fsyncs the new file, ``pub/`` and the
   root, and only then returns: a returned entry survives a power loss. If a step after the create fails,
   the entry is removed again and the failure is raised; docs/adr/0003-publish-durability.md says exactly
   when a failed publish can still leave its entry.
4. Reads trust nothing about listing order and never ``stat`` or ``open`` an entry: one listing of ``pub/``,
   whose ``d_type`` tells a sub-folder or a FIFO (malformed) from a file.
5. Prune never removes through a symbolic link and never leaves the file system a folder is on: each folder
   is reached by opening every path element with ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's
   descriptor, and removed one level at a time without recursion (deep trees are fine) and without following
   any link inside it. Before removing entries, prune records the folders it plans to remove in a journal
   (``<root>/.ckpt-prune-*``); a later prune finishes what a failed one left (docs/adr/0004-prune-safety.md).
6. Closing a descriptor that was only read (a folder, a file opened to fsync it) cannot lose data, and Linux
   releases it even when ``close`` reports an error, so such errors are ignored. A failed ``close`` of a file
   we wrote is an error.
7. Every ``OSError`` becomes a ``StorageError`` (or ``NotFoundError``) naming the path and the reason.
8. The root is taken as the kernel resolves it: an absolute path with no ``.`` or ``..`` element (refused,
   never normalised as text, which would name another folder when an element before ``..`` is a link).
9. What the watcher reads (``read_file``, ``exists``, ``folders``) is reached from the root by opening every
   path element with ``O_NOFOLLOW|O_DIRECTORY``, as prune does: never through a link, never outside the
   root. Only a regular file is a file (``ckpt.domain.saves``); it is ``lstat``-ed before it is opened, so a
   FIFO or a device is never opened, and read up to the cap. Only "no such file" (``ENOENT``, ``ENOTDIR``
   where an element is a file) and "is a link" (``ELOOP`` under ``O_NOFOLLOW``) mean absent; any other
   error is a ``StorageError``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, suppress
from itertools import islice
from typing import TYPE_CHECKING, NoReturn

from ckpt.domain.arguments import require_bool, require_instance, require_int, require_str
from ckpt.domain.entries import PUB_DIR_NAME, Entry, exec_save_prefix, validate_save
from ckpt.domain.errors import (
    ExistsError,
    InvalidError,
    MalformedError,
    NotFoundError,
    StorageError,
)
from ckpt.domain.names import LatestEntryScan, format_entry_name, latest_entry_name, parse_entry_names
from ckpt.domain.ports import FileInfo, Folder, PruneResult, SkippedFolder
from ckpt.domain.prune import Overlap
from ckpt.domain.redaction import redact_url
from ckpt.domain.saves import MAX_READ_BYTES, SaveKind, check_save_kind, too_large, validate_file_name

if TYPE_CHECKING:
    from ckpt.adapters.posix_pins import PosixPins
    from ckpt.domain.follow import Followed, StopSignal

__all__ = ["PosixStore", "Syscalls"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR_FLAGS = _DIR_FLAGS | os.O_NOFOLLOW
# O_NONBLOCK: opening a FIFO someone left in a save must not wait for a writer.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

# The prune journal (docs/adr/0004-prune-safety.md): "<header>\n" + one folder per line + "<footer>\n".
JOURNAL_PREFIX = ".ckpt-prune-"
_JOURNAL_HEADER = "ckpt prune journal 1"
_JOURNAL_FOOTER = "end"


class Syscalls:
    """The system calls :class:`PosixStore` makes, each a thin method over the ``os`` function of its name.

    Subclass it to observe or fail chosen calls in tests. ``scandir`` must return what ``os.scandir`` returns
    (a context manager iterating ``os.DirEntry``); the store also reads each entry's ``d_type`` through it.
    """

    __slots__ = ()

    def open(self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        """``os.open``."""
        return os.open(path, flags, mode, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        """``os.close``."""
        os.close(fd)

    def fsync(self, fd: int) -> None:
        """``os.fsync``."""
        os.fsync(fd)

    def read(self, fd: int, size: int) -> bytes:
        """``os.read``."""
        return os.read(fd, size)

    def write(self, fd: int, data: bytes) -> int:
        """``os.write``."""
        return os.write(fd, data)

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        """``os.mkdir``."""
        os.mkdir(path, mode)

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        """``os.unlink``."""
        os.unlink(path, dir_fd=dir_fd)

    def rmdir(self, path: str, *, dir_fd: int | None = None) -> None:
        """``os.rmdir``."""
        os.rmdir(path, dir_fd=dir_fd)

    def scandir(self, path: str | int) -> AbstractContextManager[Iterator[os.DirEntry[str]]]:
        """``os.scandir`` of a path or of a folder descriptor."""
        return os.scandir(path)

    def stat(self, path: str) -> os.stat_result:
        """``os.stat`` (follows links)."""
        return os.stat(path)

    def lstat(self, path: str, *, dir_fd: int | None = None) -> os.stat_result:
        """``os.lstat``."""
        return os.lstat(path, dir_fd=dir_fd)

    def fstat(self, fd: int) -> os.stat_result:
        """``os.fstat``."""
        return os.fstat(fd)


def _storage_error(action: str, path: str, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc)
    cls = NotFoundError if exc.errno == errno.ENOENT else StorageError
    return cls(f"cannot {action} {path}: {reason}", location=path)


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


class PosixStore:
    """A checkpoint root on a POSIX filesystem: an absolute path to a directory that already exists."""

    __slots__ = ("_pins", "_pub", "_root", "_sys")

    def __init__(self, root: str, *, syscalls: Syscalls | None = None) -> None:
        if not require_str(root, "root").startswith("/"):
            raise InvalidError(f"root {root!r} is not an absolute path")
        if "\x00" in root:
            raise InvalidError(f"root {root!r} contains NUL")
        elements = [element for element in root.split("/") if element]
        if "." in elements or ".." in elements:
            # Rule 8: "/a/link/../root" is not "/a/root" when link is a symbolic link.
            raise InvalidError(
                f"root {root!r} has a '.' or '..' path element: give the folder's own path, as the kernel "
                "would resolve it differently from the text"
            )
        normalized = "/" + "/".join(elements)  # only repeated and trailing slashes go: they change nothing
        self._root = normalized
        self._pub = os.path.join(normalized, PUB_DIR_NAME)
        self._sys = syscalls if syscalls is not None else Syscalls()
        self._pins: PosixPins | None = None  # made on first use: resolve never needs it

    def __repr__(self) -> str:
        return f"PosixStore({self._root!r})"

    @property
    def root(self) -> str:
        """The root directory (absolute, normalized)."""
        return self._root

    # -- locations -------------------------------------------------------------------------------------

    def location(self, entry: Entry) -> str:
        """Return the absolute path of the save ``entry`` names."""
        return self._path(require_instance(entry, Entry, "entry").save)

    def exec_dir(self, attempt: str) -> str:
        """Return ``<root>/exec/<attempt>``."""
        return self._path(exec_save_prefix(attempt))

    def _path(self, save: str) -> str:
        return self._root + "/" + save if self._root != "/" else "/" + save

    def save_of(self, location: str) -> str:
        """Return the save path (relative to the root) of an absolute location, or raise InvalidError.

        The location must be lexically under the root and clean; one trailing ``/`` is allowed.
        """
        shown = redact_url(require_str(location, "save location"), keep_user=False)
        if not location.startswith("/"):
            raise InvalidError(f"save location {shown!r} is not an absolute path")
        prefix = self._root.rstrip("/") + "/"
        candidate = location[:-1] if location.endswith("/") and location != "/" else location
        if not candidate.startswith(prefix):
            raise InvalidError(f"save location {location!r} is not under the root {self._root}")
        rel = candidate[len(prefix) :]
        try:
            return validate_save(rel)
        except InvalidError as exc:
            raise InvalidError(f"save location {location!r}: {exc}") from None

    # -- descriptors -----------------------------------------------------------------------------------

    def _close_quietly(self, fd: int) -> None:
        # Rule 6: a descriptor we only read from; nothing can be lost by a failed close.
        with suppress(OSError):
            self._sys.close(fd)

    def _sync_dir(self, path: str) -> None:
        """fsync the folder at ``path`` (following links: the root may be one)."""
        fd = self._sys.open(path, _DIR_FLAGS)
        try:
            self._sys.fsync(fd)
        finally:
            self._close_quietly(fd)

    def _root_error(self) -> StorageError | None:
        """Return the error to raise when the root is missing or not a folder, else ``None``."""
        try:
            mode = self._sys.stat(self._root).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return NotFoundError(f"root {self._root} does not exist", location=self._root)
        except OSError as exc:
            return _storage_error("inspect the root", self._root, exc)
        if not stat.S_ISDIR(mode):
            return StorageError(f"root {self._root} is not a directory", location=self._root)
        return None

    def _open_pub(self, *, create: bool) -> int | None:
        """Open ``pub/`` without following a link (rule 2); ``None`` when it is missing and not ``create``."""
        try:
            return self._sys.open(self._pub, _NOFOLLOW_DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                error = self._root_error()
                if error is not None:
                    raise error from None
                return None
        except OSError as exc:
            raise self._pub_error(exc) from exc
        self._make_pub()
        try:
            return self._sys.open(self._pub, _NOFOLLOW_DIR_FLAGS)
        except OSError as exc:
            raise self._pub_error(exc) from exc

    def _pub_error(self, exc: OSError) -> StorageError:
        """Explain why ``pub/`` could not be opened: a link, not a folder, a root that is not a folder."""
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                mode = self._sys.lstat(self._pub).st_mode
            except NotADirectoryError:
                return StorageError(f"root {self._root} is not a directory", location=self._root)
            except OSError:
                mode = None
            if mode is not None and stat.S_ISLNK(mode):
                return StorageError(
                    f"{self._pub} is a symbolic link: refusing to read or write entries through it, "
                    f"as that would touch files outside the root {self._root}",
                    location=self._pub,
                )
            if mode is not None:
                return StorageError(f"{self._pub} is not a directory", location=self._pub)
        return _storage_error("open", self._pub, exc)

    def _make_pub(self) -> None:
        try:
            self._sys.mkdir(self._pub, 0o755)
        except FileExistsError:
            return  # another publisher made it; opening it checks what it is
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise NotFoundError(f"root {self._root} does not exist", location=self._root) from None
            raise _storage_error("create", self._pub, exc) from exc
        try:
            self._sync_dir(self._root)
        except OSError as exc:
            raise _storage_error("sync the root after creating pub/ in", self._root, exc) from exc

    # -- publish ---------------------------------------------------------------------------------------

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        """Publish the save directory at ``save_location`` (see the Store port)."""
        entry = Entry(require_int(epoch, "epoch"), require_int(step, "step"), self.save_of(save_location))
        name = format_entry_name(entry)
        save_path = self._path(entry.save)
        try:
            st = self._sys.stat(save_path)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise _storage_error("inspect the save", save_path, exc) from exc
            root_error = self._root_error()
            if root_error is not None:
                raise root_error from None
            kind = SaveKind.MISSING
        else:
            mode = st.st_mode
            kind = (
                SaveKind.FOLDER
                if stat.S_ISDIR(mode)
                else SaveKind.FILE
                if stat.S_ISREG(mode)
                else SaveKind.OTHER
            )
        check_save_kind(kind, save_path)
        pub_fd = self._open_pub(create=True)
        assert pub_fd is not None  # create=True never answers "missing"
        path = self._pub + "/" + name
        try:
            try:
                fd = self._sys.open(name, _CREATE_FLAGS, 0o644, dir_fd=pub_fd)
            except FileExistsError:
                raise ExistsError(
                    f"already published: epoch {epoch} step {step} save {entry.save} ({path})", entry=entry
                ) from None
            except OSError as exc:
                raise _storage_error("create the entry", path, exc) from exc
            failed = self._make_durable(fd, pub_fd, path)
            if failed is not None:
                raise self._undo_create(pub_fd, name, path, save_path, failed) from failed[1]
        finally:
            self._close_quietly(pub_fd)
        return entry

    def _make_durable(self, fd: int, pub_fd: int, path: str) -> tuple[str, OSError] | None:
        """fsync and close the new entry, fsync ``pub/`` and the root; return the failed step, if any."""
        try:
            self._sys.fsync(fd)
        except OSError as exc:
            self._close_quietly(fd)  # the fsync's error is the one to report
            return f"fsync of {path}", exc
        try:
            self._sys.close(fd)
        except OSError as exc:
            return f"close of {path}", exc
        try:
            self._sys.fsync(pub_fd)
        except OSError as exc:
            return f"sync of {self._pub}", exc
        try:
            self._sync_dir(self._root)
        except OSError as exc:
            return f"sync of {self._root}", exc
        return None

    def _undo_create(
        self, pub_fd: int, name: str, path: str, save_path: str, failed: tuple[str, OSError]
    ) -> StorageError:
        """Remove the entry we just created (it is ours: created exclusively); return the error to raise."""
        what, exc = failed
        message = f"cannot make the entry {path} durable: {what} failed: {_reason(exc)}"
        try:
            self._sys.unlink(name, dir_fd=pub_fd)
        except FileNotFoundError:
            pass  # a pruner took it meanwhile: it is gone either way
        except OSError as undo_exc:
            # Case 1 of the failed publishes that leave their entry (ADR 0003): say so, plainly.
            return StorageError(
                f"{message}; removing the entry again failed too ({_reason(undo_exc)}), so it may remain "
                f"published: it names the complete save {save_path}, and publishing it again raises "
                "ExistsError if it does",
                location=path,
            )
        else:
            with suppress(OSError):  # the removal stands; only its durability is unknown (ADR 0003)
                self._sys.fsync(pub_fd)
        return StorageError(f"{message}; the entry was removed again", location=path)

    # -- reads -----------------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        """Return the names in ``pub/``; ``MalformedError`` for anything that is not a plain file."""
        fd = self._open_pub(create=False)
        if fd is None:
            return []
        try:
            with self._sys.scandir(fd) as it:
                # d_type answers is_file without a stat; anything else is marked "" (no name is empty).
                # Keeping no DirEntry alive past its turn keeps this close to a bare scandir.
                names = [d.name if d.is_file(follow_symlinks=False) else "" for d in it]
            if all(names):
                return names
            # Something in pub/ is not a regular file: list again to name the first such entry.
            with self._sys.scandir(fd) as again:
                odd = [d for d in again if not d.is_file(follow_symlinks=False)]
        except OSError as exc:
            raise _storage_error("list", self._pub, exc) from exc
        finally:
            self._close_quietly(fd)
        if not odd:
            return self._names()  # gone meanwhile
        d = min(odd, key=lambda x: x.name)
        kind = "a folder" if d.is_dir(follow_symlinks=False) else "not a regular file"
        raise MalformedError(f"malformed entry {self._pub + '/' + d.name!r} in pub/: {kind}", value=d.name)

    def entries(self) -> list[Entry]:
        """Return every entry, ascending (see the Store port)."""
        return parse_entry_names(self._names())

    def resolve(self) -> Entry | None:
        """Return the greatest entry, or ``None`` (see the Store port)."""
        # The common case reads pub/ a chunk at a time and holds no name past its chunk, which keeps resolve
        # close to a bare scandir (benchmarks/README.md). Anything unusual (an entry that is not a plain file,
        # a bad name) goes to the plain path, which reports it as entries() does.
        fd = self._open_pub(create=False)
        if fd is None:
            return None
        scan = LatestEntryScan()
        try:
            with self._sys.scandir(fd) as it:
                size = LatestEntryScan.CHUNK
                while chunk := [d.name if d.is_file(follow_symlinks=False) else "" for d in islice(it, size)]:
                    if not all(chunk):
                        break
                    scan.add(chunk)
                else:
                    return scan.result()
        except MalformedError:
            pass
        except OSError as exc:
            raise _storage_error("list", self._pub, exc) from exc
        finally:
            self._close_quietly(fd)
        return latest_entry_name(self._names())

    # -- prune -----------------------------------------------------------------------------------------

    # -- pins (ckpt.pins) ------------------------------------------------------------------------------

    def _pin_dir(self) -> PosixPins:
        if self._pins is None:
            from ckpt.adapters.posix_pins import PosixPins

            self._pins = PosixPins(self._root, self._sys)
        return self._pins

    def pin_names(self) -> list[str]:
        """Return the names in ``pins/`` (the PinLog port of ``ckpt.pins``)."""
        return self._pin_dir().names()

    def create_pin(self, name: str) -> bool:
        """Create the pin ``name`` exclusively and durably; False when it was there."""
        return self._pin_dir().create(name)

    def remove_pins(self, names: Sequence[str]) -> None:
        """Remove the pins ``names``; absent ones are fine."""
        self._pin_dir().remove(names)

    def pin(self, entry: Entry) -> bool:
        """Pin a published entry; True when this call pinned it (see ``ckpt.pins``)."""
        from ckpt.pins import pin_entry

        return pin_entry(self, entry)

    def unpin(self, entry: Entry) -> bool:
        """Unpin an entry; True when it was pinned. Unpinning twice is not an error."""
        from ckpt.pins import unpin_entry

        return unpin_entry(self, entry)

    def pinned(self) -> list[Entry]:
        """Return the pinned entries, ascending."""
        from ckpt.pins import pinned_entries

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

    def _restore_entries(self, entries: Sequence[Entry]) -> None:
        """Create the entries again (pinned during a prune that removed them), as durably as publish."""
        if not entries:
            return
        pub_fd = self._open_pub(create=True)
        assert pub_fd is not None  # create=True never answers "missing"
        try:
            for entry in entries:
                name = format_entry_name(entry)
                path = self._pub + "/" + name
                try:
                    fd = self._sys.open(name, _CREATE_FLAGS, 0o644, dir_fd=pub_fd)
                except FileExistsError:
                    continue
                except OSError as exc:
                    raise _storage_error("put back the pinned entry", path, exc) from exc
                failed = self._make_durable(fd, pub_fd, path)
                if failed is not None:
                    raise _storage_error(f"put back the pinned entry ({failed[0]})", path, failed[1])
        finally:
            self._close_quietly(pub_fd)

    def prune(self, keep: int, *, keep_every: int | None = None, dry_run: bool = False) -> PruneResult:
        """Remove the entries no retention tier keeps, then the folders only they named.

        Pinned entries are kept, and so is every folder a pin names. Folders that an earlier prune planned
        but did not remove (it failed, or was killed) are removed too, unless an entry or a pin needs them
        now: see docs/adr/0004-prune-safety.md.
        """
        from ckpt.domain.retention import plan_retention  # not at import: resolve never needs it
        from ckpt.pins import pinned_entries

        require_int(keep, "keep")
        if keep_every is not None:
            require_int(keep_every, "keep_every")
        require_bool(dry_run, "dry_run")
        entries = self.entries()
        pins = pinned_entries(self)
        retention = plan_retention(entries, keep, keep_every=keep_every, pinned=pins)
        plan = retention.prune_plan
        try:
            root_fd = self._sys.open(self._root, _DIR_FLAGS)
        except OSError as exc:
            raise _storage_error("open the root", self._root, exc) from exc
        try:
            journals, left = self._read_journals(root_fd)
            kept = Overlap([*(e.save for e in plan.keep), *(p.save for p in pins)])
            planned = set(plan.folders)
            left = [f for f in left if f not in planned and not kept(f)]
            if dry_run:
                folders = tuple(self._path(f) for f in (*plan.folders, *left))
                return PruneResult(plan.remove, folders, (), dry_run=True, kept=retention.kept)
            journal = self._write_journal(root_fd, (*plan.folders, *left)) if plan.folders or left else None
            removed = self._remove_entries(plan.remove)
            # Read again: an entry published or pinned since the plan was made still protects its folder,
            # and an entry pinned meanwhile is put back (ckpt.pins rule 2).
            pins = pinned_entries(self)
            restored = set(removed) & set(pins)
            self._restore_entries(sorted(restored, key=lambda e: e.key))
            removed = [e for e in removed if e not in restored]
            needed = Overlap(e.save for e in self.entries())
            pinned_now = Overlap(p.save for p in pins)
            removed_folders: list[str] = []
            skipped: list[SkippedFolder] = []
            gone: set[str] = set()
            for folder in sorted({*plan.folders, *left}):  # a folder sorts before those inside it
                if _inside_any(folder, gone):
                    continue  # removing the folder around it took it along
                location = self._path(folder)
                why = _still_needed(folder, needed, pinned_now)
                if why is not None:
                    if folder in planned:
                        skipped.append(SkippedFolder(location, why))
                    continue  # a folder an earlier prune left is simply no longer a candidate
                reason = self._remove_folder(root_fd, folder, journal)
                if reason is None:
                    removed_folders.append(location)
                    gone.add(folder)
                else:
                    skipped.append(SkippedFolder(location, reason))
            self._drop_journals(root_fd, [*journals, *([journal] if journal else [])])
        finally:
            self._close_quietly(root_fd)
        return PruneResult(tuple(removed), tuple(removed_folders), tuple(skipped), kept=retention.kept)

    def _remove_entries(self, entries: tuple[Entry, ...]) -> list[Entry]:
        if not entries:
            return []
        pub_fd = self._open_pub(create=False)
        if pub_fd is None:
            return []  # pub/ vanished: every entry is gone
        removed: list[Entry] = []
        try:
            for entry in entries:
                name = format_entry_name(entry)
                try:
                    self._sys.unlink(name, dir_fd=pub_fd)
                except FileNotFoundError:
                    continue  # another pruner took it; it is gone either way
                except OSError as exc:
                    raise _storage_error("remove the entry", self._pub + "/" + name, exc) from exc
                removed.append(entry)
            if removed:
                try:
                    self._sys.fsync(pub_fd)
                except OSError as exc:
                    raise _storage_error("sync", self._pub, exc) from exc
        finally:
            self._close_quietly(pub_fd)
        return removed

    # -- the prune journal -----------------------------------------------------------------------------

    def _read_journals(self, root_fd: int) -> tuple[list[str], list[str]]:
        """Return the journals earlier prunes left in the root, and the folders they list (sorted, unique).

        A journal without its footer was being written when its prune stopped, before that prune removed
        anything: it lists nothing and is dropped with the others.
        """
        try:
            with self._sys.scandir(root_fd) as it:
                names = sorted(
                    d.name
                    for d in it
                    if d.name.startswith(JOURNAL_PREFIX) and d.is_file(follow_symlinks=False)
                )
        except OSError as exc:
            raise _storage_error("list", self._root, exc) from exc
        folders: set[str] = set()
        for name in names:
            folders.update(self._read_journal(root_fd, name))
        return names, sorted(folders)

    def _read_journal(self, root_fd: int, name: str) -> list[str]:
        path = self._root + "/" + name
        try:
            fd = self._sys.open(name, _READ_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            return []  # another prune finished it
        except OSError as exc:
            raise _storage_error("read the prune journal", path, exc) from exc
        chunks = []
        try:
            while chunk := self._sys.read(fd, 1 << 16):
                chunks.append(chunk)
        except OSError as exc:
            raise _storage_error("read the prune journal", path, exc) from exc
        finally:
            self._close_quietly(fd)
        lines = b"".join(chunks).decode("utf-8", "replace").split("\n")
        if len(lines) < 3 or lines[-2:] != [_JOURNAL_FOOTER, ""]:
            return []  # never finished: its prune stopped before removing anything
        if lines[0] != _JOURNAL_HEADER:
            raise MalformedError(
                f"prune journal {path!r} does not start with {_JOURNAL_HEADER!r}", value=name
            )
        folders = lines[1:-2]
        for folder in folders:
            try:
                validate_save(folder)
            except InvalidError as exc:
                raise MalformedError(
                    f"prune journal {path!r} lists a bad folder: {exc}", value=name
                ) from None
        return folders

    def _write_journal(self, root_fd: int, folders: tuple[str, ...]) -> str:
        """Create a journal listing ``folders`` and make it durable before anything is removed."""
        name = JOURNAL_PREFIX + os.urandom(8).hex()
        path = self._root + "/" + name
        data = "\n".join((_JOURNAL_HEADER, *folders, _JOURNAL_FOOTER, "")).encode()
        try:
            fd = self._sys.open(name, _CREATE_FLAGS, 0o644, dir_fd=root_fd)
        except OSError as exc:
            raise _storage_error("create the prune journal", path, exc) from exc
        try:
            written = 0
            while written < len(data):
                written += self._sys.write(fd, data[written:])
            self._sys.fsync(fd)
        except OSError as exc:
            self._close_quietly(fd)
            raise _storage_error("write the prune journal", path, exc) from exc
        try:
            self._sys.close(fd)
            self._sys.fsync(root_fd)
        except OSError as exc:
            raise _storage_error("write the prune journal", path, exc) from exc
        return name

    def _drop_journals(self, root_fd: int, names: list[str]) -> None:
        """Remove the journals whose folders are now all handled."""
        if not names:
            return
        for name in names:
            try:
                self._sys.unlink(name, dir_fd=root_fd)
            except FileNotFoundError:
                continue  # another prune finished it
            except OSError as exc:
                raise _storage_error("remove the prune journal", self._root + "/" + name, exc) from exc
        try:
            self._sys.fsync(root_fd)
        except OSError as exc:
            raise _storage_error("sync", self._root, exc) from exc

    # -- removing folders ------------------------------------------------------------------------------

    def _remove_folder(self, root_fd: int, folder: str, journal: str | None) -> str | None:
        """Remove ``<root>/<folder>`` without following any link; return a skip reason, or None if removed."""
        location = self._path(folder)
        *parents, last = folder.split("/")
        fds: list[int] = []
        try:
            parent_fd = root_fd
            for element in parents:
                try:
                    parent_fd = self._sys.open(element, _NOFOLLOW_DIR_FLAGS, dir_fd=parent_fd)
                except FileNotFoundError:
                    return "already gone"
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    if stat.S_ISLNK(self._sys.lstat(element, dir_fd=parent_fd).st_mode):
                        return "is reached through a symbolic link (never removed)"
                    return "already gone"  # an ancestor is a file: the folder cannot exist
                fds.append(parent_fd)
            try:
                st = self._sys.lstat(last, dir_fd=parent_fd)
            except FileNotFoundError:
                return "already gone"
            if stat.S_ISLNK(st.st_mode):
                return "is a symbolic link (never removed, nor what it points to)"
            if not stat.S_ISDIR(st.st_mode):
                return "is not a directory"
            self._check_same_device(parent_fd, st, location)
            try:
                self._remove_tree(parent_fd, last, location)
            except FileNotFoundError:
                return "already gone"
            self._sys.fsync(parent_fd)
        except _RemovalError as exc:
            where = "" if exc.where == location else f" (at {exc.where})"
            raise StorageError(
                f"cannot remove the folder {location}: {_reason(exc.error)}{where}"
                + _journal_note(journal, self._root),
                location=location,
            ) from exc.error
        except OSError as exc:
            raise StorageError(
                f"cannot remove the folder {location}: {_reason(exc)}" + _journal_note(journal, self._root),
                location=location,
            ) from exc
        finally:
            for fd in reversed(fds):
                self._close_quietly(fd)
        return None

    def _remove_tree(self, parent_fd: int, name: str, location: str) -> None:
        """Remove the folder ``name`` in ``parent_fd`` (at ``location``) and everything in it.

        One level at a time, holding one descriptor below ``parent_fd``, so a tree of any depth is fine. Links
        are removed as names and never followed; a sub-folder on another file system (a mount point) stops
        the removal; climbing back up through ``..`` checks that each parent is the folder it left.
        Raises ``FileNotFoundError`` when the folder is already gone, ``_RemovalError`` for anything else.
        """
        fd = self._sys.open(name, _NOFOLLOW_DIR_FLAGS, dir_fd=parent_fd)
        # One frame per open level: (name in its parent, (device, inode), sub-folders still to remove).
        levels: list[tuple[str, tuple[int, int], list[str]]] = []
        try:
            top = self._sys.fstat(fd)
            levels.append((name, (top.st_dev, top.st_ino), self._remove_non_folders(fd)))
            while True:
                current, _, pending = levels[-1]
                if pending:
                    sub = pending.pop()
                    try:
                        child = self._sys.open(sub, _NOFOLLOW_DIR_FLAGS, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    self._close_quietly(fd)
                    fd = child
                    st = self._sys.fstat(fd)
                    levels.append((sub, (st.st_dev, st.st_ino), []))
                    if st.st_dev != top.st_dev:
                        _fail(errno.EXDEV, _MOUNT_POINT)
                    levels[-1][2].extend(self._remove_non_folders(fd))
                    continue
                if len(levels) == 1:
                    break
                up = self._sys.open("..", _NOFOLLOW_DIR_FLAGS, dir_fd=fd)
                self._close_quietly(fd)
                fd = up
                st = self._sys.fstat(fd)
                levels.pop()
                if (st.st_dev, st.st_ino) != levels[-1][1]:
                    _fail(errno.ESTALE, "it was moved while it was being removed")
                self._sys.rmdir(current, dir_fd=fd)
        except OSError as exc:
            inside = "/".join([location, *(level[0] for level in levels[1:])])
            if isinstance(exc.filename, str) and exc.filename != "..":
                inside += "/" + exc.filename  # the name inside the folder being emptied
            raise _RemovalError(inside, exc) from exc
        finally:
            self._close_quietly(fd)
        try:
            self._sys.rmdir(name, dir_fd=parent_fd)
        except FileNotFoundError:
            pass  # removed by someone else meanwhile
        except OSError as exc:
            raise _RemovalError(location, exc) from exc

    def _check_same_device(self, parent_fd: int, st: os.stat_result, location: str) -> None:
        """Raise ``_RemovalError`` when the folder ``st`` describes is a mount point (rule 5)."""
        if st.st_dev != self._sys.fstat(parent_fd).st_dev:
            raise _RemovalError(location, OSError(errno.EXDEV, _MOUNT_POINT))

    def _remove_non_folders(self, fd: int) -> list[str]:
        """Remove everything but sub-folders from the folder ``fd``; return the sub-folders' names."""
        with self._sys.scandir(fd) as it:
            listing = [(d.name, d.is_dir(follow_symlinks=False)) for d in it]
        folders = []
        for entry_name, is_dir in sorted(listing):  # sorted: the same tree is removed in the same order
            if is_dir:
                folders.append(entry_name)
                continue
            try:
                self._sys.unlink(entry_name, dir_fd=fd)
            except FileNotFoundError:
                continue
        return folders

    # -- what the watcher needs ------------------------------------------------------------------------

    def _place(self, location: str) -> str:
        """Return ``""`` for the root itself (trailing ``/`` allowed), else the save path of ``location``."""
        if isinstance(location, str) and location.rstrip("/") == self._root.rstrip("/"):
            return ""
        return self.save_of(location)

    def _open_inside(self, elements: list[str], where: str) -> int | None:
        """Open ``<root>/<elements...>`` as a folder, every element with ``O_NOFOLLOW`` (rule 9).

        Returns ``None`` when an element is missing, a file or a link; ``NotFoundError`` when the root is
        missing, ``StorageError`` for any other failure, naming ``where``.
        """
        try:
            fd = self._sys.open(self._root, _DIR_FLAGS)
        except OSError as exc:
            raise self._root_error() or _storage_error("open the root", self._root, exc) from None
        for element in elements:
            try:
                child = self._sys.open(element, _NOFOLLOW_DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                self._close_quietly(fd)
                if exc.errno in _ABSENT:
                    return None
                raise _storage_error("open", where, exc) from exc
            self._close_quietly(fd)
            fd = child
        return fd

    def folders(self, location: str) -> list[Folder]:
        """Return the folders directly inside ``location`` (the root, or a location under it; rule 9)."""
        rel = self._place(location)
        base = self._path(rel) if rel else self._root
        fd = self._open_inside(rel.split("/") if rel else [], base)
        if fd is None:
            return []
        prefix = base.rstrip("/") + "/"
        try:
            with self._sys.scandir(fd) as it:
                return [Folder(d.name, prefix + d.name) for d in it if d.is_dir(follow_symlinks=False)]
        except OSError as exc:
            raise _storage_error("list", base, exc) from exc
        finally:
            self._close_quietly(fd)

    def _open_file(self, save_location: str, name: str) -> tuple[int, str] | None:
        """Open the regular file ``name`` inside the save to read it (rule 9); ``None`` when there is none."""
        save = self.save_of(save_location)
        *folders, last = f"{save}/{validate_file_name(name)}".split("/")
        path = self._path(f"{save}/{name}")
        parent = self._open_inside(folders, path)
        if parent is None:
            return None
        try:
            try:
                if not stat.S_ISREG(self._sys.lstat(last, dir_fd=parent).st_mode):
                    return None  # a folder, a link, a FIFO, a device: not a file (never opened)
                fd = self._sys.open(last, _READ_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno in _ABSENT:
                    return None
                raise _storage_error("read", path, exc) from exc
        finally:
            self._close_quietly(parent)
        return fd, path

    def read_file(self, save_location: str, name: str) -> bytes | None:
        """Return the content of the regular file ``name`` inside the save, or ``None`` when there is none.

        Never through a link, never a FIFO or a device (rule 9); at most 64 MiB, else ``StorageError``.
        """
        opened = self._open_file(save_location, name)
        if opened is None:
            return None
        fd, path = opened
        chunks = []
        total = 0
        try:
            st = self._sys.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None  # swapped for something else between the lstat and the open
            if st.st_size > MAX_READ_BYTES:
                raise too_large(path, st.st_size)
            while chunk := self._sys.read(fd, min(1 << 20, MAX_READ_BYTES + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > MAX_READ_BYTES:  # it grew while we read
                    raise too_large(path)
        except StorageError:
            raise  # ours already (too large): an OSError too, so it must not be wrapped again
        except OSError as exc:
            raise _storage_error("read", path, exc) from exc
        finally:
            self._close_quietly(fd)
        return b"".join(chunks)

    def exists(self, save_location: str, name: str) -> bool:
        """Return True when ``name`` is a regular file inside the save (rule 9: a link or a folder is not)."""
        save = self.save_of(save_location)
        *folders, last = f"{save}/{validate_file_name(name)}".split("/")
        path = self._path(f"{save}/{name}")
        parent = self._open_inside(folders, path)
        if parent is None:
            return False
        try:
            mode = self._sys.lstat(last, dir_fd=parent).st_mode
        except OSError as exc:
            if exc.errno in _ABSENT:
                return False
            raise _storage_error("check", path, exc) from exc
        finally:
            self._close_quietly(parent)
        return stat.S_ISREG(mode)

    def _walk(self, top: str) -> list[tuple[str, list[os.DirEntry[str]]]]:
        """List the tree at ``top``: (folder, its entries that are not folders), every folder after its own.

        Links are entries like files: never followed, so a link loop or a link out of the save is harmless.
        """
        found: list[tuple[str, list[os.DirEntry[str]]]] = []
        pending = [top]
        while pending:
            path = pending.pop()
            others = []
            try:
                listing = self._sys.scandir(path)
            except FileNotFoundError:
                if path == top:
                    raise
                continue  # a sub-folder vanished while we walked (renamed into place): it is not there now
            with listing as it:
                for d in it:
                    if d.is_dir(follow_symlinks=False):
                        pending.append(d.path)
                    else:
                        others.append(d)
            found.append((path, others))
        found.reverse()
        return found

    def files(self, save_location: str) -> list[FileInfo]:
        """Return every entry inside the save that is not a folder, recursively, with its size, by path.

        A link is listed with its own size; nothing is ever read through it.
        """
        out: list[FileInfo] = []
        base = self._path(self.save_of(save_location))
        try:
            for dirpath, others in self._walk(base):
                rel = dirpath[len(base) + 1 :]
                for d in others:
                    try:
                        size = self._sys.lstat(d.path).st_size
                    except FileNotFoundError:
                        # Renamed or removed since the listing: it is not part of the save now. Returning an
                        # empty listing here instead would make two looks at a changing save compare equal.
                        continue
                    out.append(FileInfo(f"{rel}/{d.name}" if rel else d.name, size))
        except FileNotFoundError:
            return []  # the save itself is gone
        except OSError as exc:
            raise _storage_error("list", base, exc) from exc
        return sorted(out, key=lambda f: f.path)

    def sync_save(self, save_location: str) -> None:
        """fsync every regular file and folder of a save, deepest first, so its content outlives a power loss.

        The watcher calls this before publishing: frameworks rename files into place without syncing. Links,
        FIFOs, sockets and devices are neither opened nor followed. A save that is not there is left to
        publish to report.
        """
        base = self._path(self.save_of(save_location))
        try:
            try:
                walked = self._walk(base)
            except FileNotFoundError:
                return
            for dirpath, others in walked:
                for d in others:
                    if not d.is_file(follow_symlinks=False):
                        continue
                    fd = self._sys.open(d.path, _READ_FLAGS)
                    try:
                        self._sys.fsync(fd)
                    finally:
                        self._close_quietly(fd)
                self._sync_dir(dirpath)
            parent = os.path.dirname(base)
            if parent:
                self._sync_dir(parent)
        except OSError as exc:
            raise _storage_error("sync the save", base, exc) from exc


# What an O_NOFOLLOW walk reads as "nothing there": no such name, an element that is a file, a link.
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})

_MOUNT_POINT = "a mount point of another file system (prune never removes files on one)"


class _RemovalError(Exception):
    """Removing a folder failed at ``where`` (an absolute path inside it, or the folder itself)."""

    def __init__(self, where: str, error: OSError) -> None:
        super().__init__(where, error)
        self.where = where
        self.error = error


def _fail(code: int, reason: str) -> NoReturn:
    raise OSError(code, reason)


def _journal_note(journal: str | None, root: str) -> str:
    if journal is None:
        return ""
    return f"; the folders still to remove are listed in {root}/{journal}, and the next prune removes them"


def _still_needed(folder: str, entries: Overlap, pins: Overlap) -> str | None:
    """Why a folder planned for removal must stay after the re-read, or ``None`` when nothing needs it."""
    from ckpt.domain.retention import SKIP_PINNED, SKIP_PUBLISHED

    if pins(folder):
        return SKIP_PINNED
    if entries(folder):
        return SKIP_PUBLISHED
    return None


def _inside_any(folder: str, folders: set[str]) -> bool:
    """Return True when a proper ancestor of ``folder`` is in ``folders``."""
    end = folder.rfind("/")
    while end > 0:
        if folder[:end] in folders:
            return True
        end = folder.rfind("/", 0, end)
    return False


def probe_exclusive_create(store: PosixStore) -> tuple[bool, str]:
    """Create a probe file twice with ``O_EXCL`` beside ``pub/``; the second create must fail with EEXIST.

    Also proves the root is writable and that fsync works on it. The probe is removed afterwards.
    """
    calls = store._sys  # the probe belongs to this adapter
    path = os.path.join(store.root, f".ckpt-doctor-{os.getpid()}-{os.urandom(4).hex()}")
    try:
        calls.close(calls.open(path, _CREATE_FLAGS, 0o600))
    except OSError as exc:
        return False, f"cannot create a file in {store.root}: {exc.strerror}"
    try:
        try:
            calls.close(calls.open(path, _CREATE_FLAGS, 0o600))
        except FileExistsError:
            pass
        else:
            return False, f"a second O_EXCL create of {path} succeeded: exclusive create is not honoured"
        try:
            store._sync_dir(store.root)
        except OSError as exc:
            return False, f"fsync of {store.root} failed: {exc.strerror}"
        return True, f"O_EXCL honoured and fsync works in {store.root}"
    finally:
        with suppress(OSError):
            calls.unlink(path)
