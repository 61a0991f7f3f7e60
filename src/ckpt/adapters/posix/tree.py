"""The saves on a POSIX filesystem: folders, markers, listings, syncs, removal (docs/spec/layout.md §4).

Rules:

1. Nothing inside a save is followed through a link: listings report links as files with their own size,
   marker reads open with ``O_NOFOLLOW|O_NONBLOCK`` (a link is no file; a FIFO reads as empty instead of
   blocking), and removal goes through :mod:`ckpt.adapters.posix.removal`.
2. A missing save or folder is an answer (``MISSING``, ``None``, ``[]``), not an error, unless the root
   itself is missing (``NotFoundError``). Only ENOENT and ENOTDIR mean "missing"; any other failure is a
   ``StorageError`` naming the path.
3. ``sync_save`` fsyncs every regular file and folder of a save, deepest first, then the save's parent:
   frameworks rename files into place without syncing, and an entry must never outlive its save's content.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

from ckpt.adapters.posix.removal import remove_folder
from ckpt.adapters.posix.syscalls import READ_FLAGS, PosixRoot, storage_error
from ckpt.domain.errors import StorageError
from ckpt.domain.ports import FileInfo, SaveKind, SaveRemoval

__all__ = ["PosixTree"]

_MISSING = (FileNotFoundError, NotADirectoryError)


class PosixTree:
    """The ``SaveTree`` port (and ``SyncsSaves``) over the folders under the root."""

    __slots__ = ("_at",)

    def __init__(self, at: PosixRoot) -> None:
        self._at = at

    def kind(self, save: str) -> SaveKind:
        """Return what the save path holds (following a link to the save itself, as a user's path would)."""
        at = self._at
        path = at.path(save)
        try:
            mode = at.sys.stat(path).st_mode
        except _MISSING:
            error = at.root_error()
            if error is not None:
                raise error from None
            return SaveKind.MISSING
        except OSError as exc:
            raise storage_error("inspect the save", path, exc) from exc
        return SaveKind.FOLDER if stat.S_ISDIR(mode) else SaveKind.FILE

    def folders(self, path: str) -> list[str] | None:
        """Return the names of the folders directly inside ``path`` (links are not folders)."""
        at = self._at
        base = at.path(path)
        try:
            with at.sys.scandir(base) as it:
                return [d.name for d in it if d.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            error = at.root_error()
            if error is not None:
                raise error from None
            return None
        except NotADirectoryError:
            return None
        except OSError as exc:
            raise storage_error("list", base, exc) from exc

    def read_file(self, save: str, name: str, limit: int) -> bytes | None:
        """Return the content of the regular file ``name`` in the save, at most ``limit`` bytes (rule 1)."""
        at = self._at
        path = f"{at.path(save)}/{name}"
        try:
            fd = at.sys.open(path, READ_FLAGS)
        except (*_MISSING, IsADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return None  # a link: a marker is a regular file, and nothing is read through a link
            raise storage_error("read", path, exc) from exc
        chunks = []
        try:
            size = 0
            while chunk := at.sys.read(fd, 1 << 16):
                size += len(chunk)
                if size > limit:
                    raise StorageError(
                        f"cannot read {path}: it is larger than {limit} bytes, more than a marker file holds",
                        location=path,
                    )
                chunks.append(chunk)
        except IsADirectoryError:
            return None
        except OSError as exc:
            raise storage_error("read", path, exc) from exc
        finally:
            at.close_quietly(fd)
        return b"".join(chunks)

    def is_file(self, save: str, name: str) -> bool:
        """Return True when ``name`` inside the save is a regular file (a link is not)."""
        at = self._at
        path = f"{at.path(save)}/{name}"
        try:
            mode = at.sys.lstat(path).st_mode
        except _MISSING:
            return False
        except OSError as exc:
            raise storage_error("inspect", path, exc) from exc
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
                listing = self._at.sys.scandir(path)
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

    def files(self, save: str) -> list[FileInfo]:
        """Return every entry inside the save that is not a folder, recursively, with its size, by path."""
        out: list[FileInfo] = []
        base = self._at.path(save)
        try:
            for dirpath, others in self._walk(base):
                rel = dirpath[len(base) + 1 :]
                for d in others:
                    try:
                        size = self._at.sys.lstat(d.path).st_size
                    except FileNotFoundError:
                        # Renamed or removed since the listing: it is not part of the save now. Returning an
                        # empty listing here instead would make two looks at a changing save compare equal.
                        continue
                    out.append(FileInfo(f"{rel}/{d.name}" if rel else d.name, size))
        except FileNotFoundError:
            return []  # the save itself is gone
        except OSError as exc:
            raise storage_error("list", base, exc) from exc
        return sorted(out, key=lambda f: f.path)

    def sync_save(self, save: str) -> None:
        """fsync every regular file and folder of the save, deepest first, then its parent (rule 3).

        Links, FIFOs, sockets and devices are neither opened nor followed.
        """
        at = self._at
        base = at.path(save)
        try:
            for dirpath, others in self._walk(base):
                for d in others:
                    if not d.is_file(follow_symlinks=False):
                        continue
                    fd = at.sys.open(d.path, READ_FLAGS)
                    try:
                        at.sys.fsync(fd)
                    finally:
                        at.close_quietly(fd)
                at.sync_dir(dirpath)
            parent = os.path.dirname(base)
            if parent:
                at.sync_dir(parent)
        except OSError as exc:
            raise storage_error("sync the save", base, exc) from exc

    def remove_saves(self, saves: Sequence[str]) -> list[SaveRemoval]:
        """Remove each save's folder relative to one descriptor of the root, never through a link."""
        at = self._at
        root_fd = at.open_root()
        try:
            return [SaveRemoval(save, remove_folder(at, root_fd, save)) for save in saves]
        finally:
            at.close_quietly(root_fd)
