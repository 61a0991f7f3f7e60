"""The publication log on a POSIX filesystem (SPEC §4).

Rules this adapter keeps:

1. Publish creates ``pub/<name>`` with ``O_CREAT|O_EXCL|O_NOFOLLOW``, fsyncs the new file, ``pub/`` and the
   root, and only then returns: a returned entry survives a power loss. If a sync after the create fails, the
   entry is removed again (best effort) and the failure is raised, so a publish reported as failed does not
   normally leave an entry behind (docs/adr/0003-publish-durability.md says when it still can).
2. Reads trust nothing about listing order and never ``stat`` or ``open`` an entry: one ``scandir`` of
   ``pub/``, whose ``d_type`` tells a sub-folder (malformed) from a file.
3. Prune never removes through a symbolic link: every folder is reached by opening each path element with
   ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's descriptor, and removed with ``shutil.rmtree(...,
   dir_fd=...)``, which does not follow links inside the tree. A folder that is a link, or is reached through
   one, is skipped and reported; so is one already gone.
4. Every ``OSError`` becomes a ``StorageError`` (or ``NotFoundError``) naming the path.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from itertools import islice

from ckpt.domain.entries import PUB_DIR_NAME, Entry, exec_save_prefix, validate_save
from ckpt.domain.errors import ExistsError, InvalidError, MalformedError, NotFoundError, StorageError
from ckpt.domain.names import LatestEntryScan, format_entry_name, latest_entry_name, parse_entry_names
from ckpt.domain.ports import FileInfo, Folder, PruneResult, SkippedFolder
from ckpt.domain.prune import Overlap, plan_prune

__all__ = ["PosixStore"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR_FLAGS = _DIR_FLAGS | os.O_NOFOLLOW


def _storage_error(action: str, path: str, exc: OSError) -> StorageError:
    reason = exc.strerror or str(exc)
    cls = NotFoundError if exc.errno == errno.ENOENT else StorageError
    return cls(f"cannot {action} {path}: {reason}", location=path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PosixStore:
    """A checkpoint root on a POSIX filesystem: an absolute path to a directory that already exists."""

    __slots__ = ("_pub", "_root")

    def __init__(self, root: str) -> None:
        if not isinstance(root, str) or not root.startswith("/"):
            raise InvalidError(f"root {root!r} is not an absolute path")
        if "\x00" in root:
            raise InvalidError(f"root {root!r} contains NUL")
        normalized = os.path.normpath(root)
        if normalized.startswith("//"):
            normalized = "/" + normalized.lstrip("/")
        self._root = normalized
        self._pub = os.path.join(normalized, PUB_DIR_NAME)

    def __repr__(self) -> str:
        return f"PosixStore({self._root!r})"

    @property
    def root(self) -> str:
        """The root directory (absolute, normalized)."""
        return self._root

    # -- locations -------------------------------------------------------------------------------------

    def location(self, entry: Entry) -> str:
        """Return the absolute path of the save ``entry`` names."""
        return self._path(entry.save)

    def exec_dir(self, attempt: str) -> str:
        """Return ``<root>/exec/<attempt>``."""
        return self._path(exec_save_prefix(attempt))

    def _path(self, save: str) -> str:
        return self._root + "/" + save if self._root != "/" else "/" + save

    def save_of(self, location: str) -> str:
        """Return the save path (relative to the root) of an absolute location, or raise InvalidError.

        The location must be lexically under the root and clean; one trailing ``/`` is allowed.
        """
        if not isinstance(location, str) or not location.startswith("/"):
            raise InvalidError(f"save location {location!r} is not an absolute path")
        prefix = self._root.rstrip("/") + "/"
        candidate = location[:-1] if location.endswith("/") and location != "/" else location
        if not candidate.startswith(prefix):
            raise InvalidError(f"save location {location!r} is not under the root {self._root}")
        rel = candidate[len(prefix) :]
        try:
            return validate_save(rel)
        except InvalidError as exc:
            raise InvalidError(f"save location {location!r}: {exc}") from None

    # -- publish ---------------------------------------------------------------------------------------

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        """Publish the save directory at ``save_location`` (see the Store port)."""
        entry = Entry(epoch, step, self.save_of(save_location))
        name = format_entry_name(entry)
        save_path = self._path(entry.save)
        try:
            st = os.stat(save_path)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                raise NotFoundError(f"save {save_path} does not exist", location=save_path) from None
            raise _storage_error("inspect the save", save_path, exc) from exc
        if not stat.S_ISDIR(st.st_mode):
            raise InvalidError(f"save {save_path} is not a directory")
        self._ensure_pub()
        path = os.path.join(self._pub, name)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            raise ExistsError(
                f"already published: epoch {epoch} step {step} save {entry.save} ({path})", entry=entry
            ) from None
        except OSError as exc:
            raise _storage_error("create the entry", path, exc) from exc
        try:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self._pub)
            _fsync_dir(self._root)
        except OSError as exc:
            self._undo_create(path)
            raise _storage_error("make the entry durable", path, exc) from exc
        return entry

    def _undo_create(self, path: str) -> None:
        # We created this name exclusively, so it is ours to remove. If the removal fails too, the entry
        # may survive; the ADR on publish durability documents that window.
        with contextlib.suppress(OSError):
            os.unlink(path)
            _fsync_dir(self._pub)

    def _ensure_pub(self) -> None:
        try:
            os.mkdir(self._pub, 0o755)
        except FileExistsError:
            return
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise NotFoundError(f"root {self._root} does not exist", location=self._root) from None
            raise _storage_error("create", self._pub, exc) from exc
        try:
            _fsync_dir(self._root)
        except OSError as exc:
            raise _storage_error("sync the root after creating pub/ in", self._root, exc) from exc

    # -- reads -----------------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        """Return the names in ``pub/``; ``MalformedError`` for anything that is not a plain file."""
        try:
            it = os.scandir(self._pub)
        except FileNotFoundError:
            if not os.path.isdir(self._root):
                raise NotFoundError(f"root {self._root} does not exist", location=self._root) from None
            return []
        except OSError as exc:
            raise _storage_error("list", self._pub, exc) from exc
        try:
            with it:
                # d_type answers is_file without a stat; anything else is marked "" (no name is empty).
                # Keeping no DirEntry alive past its turn keeps this close to a bare scandir.
                names = [d.name if d.is_file(follow_symlinks=False) else "" for d in it]
        except OSError as exc:
            raise _storage_error("list", self._pub, exc) from exc
        if not all(names):
            # Something in pub/ is not a regular file: list again to name the first such entry.
            try:
                with os.scandir(self._pub) as again:
                    odd = [d for d in again if not d.is_file(follow_symlinks=False)]
            except OSError as exc:
                raise _storage_error("list", self._pub, exc) from exc
            if not odd:
                return self._names()  # gone meanwhile
            d = min(odd, key=lambda x: x.name)
            kind = "a folder" if d.is_dir(follow_symlinks=False) else "not a regular file"
            raise MalformedError(
                f"malformed entry {os.path.join(self._pub, d.name)!r} in pub/: {kind}", value=d.name
            )
        return names

    def entries(self) -> list[Entry]:
        """Return every entry, ascending (see the Store port)."""
        return parse_entry_names(self._names())

    def resolve(self) -> Entry | None:
        """Return the greatest entry, or ``None`` (see the Store port)."""
        # The common case reads pub/ a chunk at a time and holds no name past its chunk, which keeps resolve
        # close to a bare scandir (benchmarks/README.md). Anything unusual (no pub/, an entry that is not a
        # plain file, a bad name) goes to the plain path, which reports it as entries() does.
        scan = LatestEntryScan()
        try:
            with os.scandir(self._pub) as it:
                size = LatestEntryScan.CHUNK
                while chunk := [d.name if d.is_file(follow_symlinks=False) else "" for d in islice(it, size)]:
                    if not all(chunk):
                        break
                    scan.add(chunk)
                else:
                    return scan.result()
        except (FileNotFoundError, MalformedError):
            pass
        except OSError as exc:
            raise _storage_error("list", self._pub, exc) from exc
        return latest_entry_name(self._names())

    # -- prune -----------------------------------------------------------------------------------------

    def prune(self, keep: int, *, dry_run: bool = False) -> PruneResult:
        """Remove all but the ``keep`` greatest entries, then the folders only they named."""
        plan = plan_prune(self.entries(), keep)
        if dry_run:
            return PruneResult(plan.remove, tuple(self._path(f) for f in plan.folders), (), dry_run=True)
        removed: list[Entry] = []
        for entry in plan.remove:
            path = os.path.join(self._pub, format_entry_name(entry))
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue  # another pruner took it; it is gone either way
            except OSError as exc:
                raise _storage_error("remove the entry", path, exc) from exc
            removed.append(entry)
        if removed:
            try:
                _fsync_dir(self._pub)
            except OSError as exc:
                raise _storage_error("sync", self._pub, exc) from exc
        # Read again: an entry published since the plan was made still protects its folder.
        needed = Overlap(e.save for e in self.entries())
        removed_folders: list[str] = []
        skipped: list[SkippedFolder] = []
        for folder in plan.folders:
            location = self._path(folder)
            if needed(folder):
                skipped.append(SkippedFolder(location, "named by an entry published during the prune"))
                continue
            reason = self._remove_folder(folder)
            if reason is None:
                removed_folders.append(location)
            else:
                skipped.append(SkippedFolder(location, reason))
        return PruneResult(tuple(removed), tuple(removed_folders), tuple(skipped))

    def _remove_folder(self, folder: str) -> str | None:
        """Remove ``<root>/<folder>`` without following any link; return a skip reason, or None if removed."""
        *parents, last = folder.split("/")
        try:
            with self._open_parents(parents) as parent_fd:
                if parent_fd is None:
                    return "already gone"
                try:
                    st = os.lstat(last, dir_fd=parent_fd)
                except FileNotFoundError:
                    return "already gone"
                if stat.S_ISLNK(st.st_mode):
                    return "is a symbolic link (never removed, nor what it points to)"
                if not stat.S_ISDIR(st.st_mode):
                    return "is not a directory"
                try:
                    import shutil  # only prune needs it; it costs start-up time (bz2, lzma)

                    shutil.rmtree(last, dir_fd=parent_fd)
                except FileNotFoundError:
                    return "already gone"
                os.fsync(parent_fd)
        except _ThroughLinkError:
            return "is reached through a symbolic link (never removed)"
        except OSError as exc:
            raise _storage_error("remove the folder", self._path(folder), exc) from exc
        return None

    @contextlib.contextmanager
    def _open_parents(self, parents: list[str]) -> Iterator[int | None]:
        """Open the root, then each parent element with O_NOFOLLOW; yield the last descriptor.

        Yields ``None`` when an element is missing; raises ``_ThroughLinkError`` when one is a link.
        """
        fds = [os.open(self._root, _DIR_FLAGS)]
        try:
            for element in parents:
                try:
                    fds.append(os.open(element, _NOFOLLOW_DIR_FLAGS, dir_fd=fds[-1]))
                except FileNotFoundError:
                    yield None
                    return
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _ThroughLinkError from None
                    raise
            yield fds[-1]
        finally:
            for fd in fds:
                os.close(fd)

    # -- what the watcher needs ------------------------------------------------------------------------

    def folders(self, location: str) -> list[Folder]:
        """Return the folders directly inside ``location`` (a location under the root)."""
        base = location.rstrip("/") or "/"
        try:
            with os.scandir(base) as it:
                return [
                    Folder(d.name, os.path.join(base, d.name)) for d in it if d.is_dir(follow_symlinks=False)
                ]
        except FileNotFoundError:
            if not os.path.isdir(self._root):
                raise NotFoundError(f"root {self._root} does not exist", location=self._root) from None
            return []
        except NotADirectoryError:
            return []
        except OSError as exc:
            raise _storage_error("list", base, exc) from exc

    def read_file(self, save_location: str, name: str) -> bytes | None:
        """Return the content of ``name`` inside the save, or ``None`` when it is missing."""
        path = os.path.join(save_location, name)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise _storage_error("read", path, exc) from exc

    def exists(self, save_location: str, name: str) -> bool:
        """Return True when ``name`` exists inside the save."""
        return os.path.lexists(os.path.join(save_location, name))

    def files(self, save_location: str) -> list[FileInfo]:
        """Return every regular file inside the save, recursively, with its size, sorted by path."""
        out: list[FileInfo] = []
        base = save_location.rstrip("/")
        try:
            for dirpath, dirnames, filenames in os.walk(base, onerror=_raise):
                dirnames.sort()
                rel = os.path.relpath(dirpath, base)
                for fname in filenames:
                    st = os.lstat(os.path.join(dirpath, fname))
                    path = fname if rel == "." else f"{rel}/{fname}"
                    out.append(FileInfo(path, st.st_size))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _storage_error("list", base, exc) from exc
        return sorted(out, key=lambda f: f.path)

    def sync_save(self, save_location: str) -> None:
        """fsync every file and folder of a save, deepest first, so its content outlives a power loss.

        The watcher calls this before publishing: frameworks rename files into place without syncing.
        """
        base = save_location.rstrip("/")
        try:
            for dirpath, _dirnames, filenames in os.walk(base, topdown=False, onerror=_raise):
                for fname in filenames:
                    path = os.path.join(dirpath, fname)
                    if os.path.islink(path):
                        continue  # a link's target is not part of the save; never follow it
                    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
                _fsync_dir(dirpath)
            parent = os.path.dirname(base)
            if parent:
                _fsync_dir(parent)
        except OSError as exc:
            raise _storage_error("sync the save", base, exc) from exc


class _ThroughLinkError(Exception):
    """A path element between the root and a folder is a symbolic link."""


def _raise(exc: OSError) -> None:
    raise exc


def probe_exclusive_create(store: PosixStore) -> tuple[bool, str]:
    """Create a probe file twice with ``O_EXCL`` beside ``pub/``; the second create must fail with EEXIST.

    Also proves the root is writable and that fsync works on it. The probe is removed afterwards.
    """
    path = os.path.join(store.root, f".ckpt-doctor-{os.getpid()}-{os.urandom(4).hex()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        os.close(os.open(path, flags, 0o600))
    except OSError as exc:
        return False, f"cannot create a file in {store.root}: {exc.strerror}"
    try:
        try:
            os.close(os.open(path, flags, 0o600))
        except FileExistsError:
            pass
        else:
            return False, f"a second O_EXCL create of {path} succeeded: exclusive create is not honoured"
        try:
            _fsync_dir(store.root)
        except OSError as exc:
            return False, f"fsync of {store.root} failed: {exc.strerror}"
        return True, f"O_EXCL honoured and fsync works in {store.root}"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
