"""Reading a saves location on a POSIX filesystem for the framework rules
(``ckpt.application.inspection.TreeReader``).

Rules:

1. Nothing is read or listed through a symbolic link: names are opened with ``O_NOFOLLOW`` and walked
   with ``follow_symlinks=False``; a link is neither a folder nor a regular file here, so it is never a
   save, a marker or a shard. FIFOs and devices are not regular files either and are never read (opening
   is non-blocking and the type is checked on the open descriptor).
2. A head reads at most ``limit`` bytes; a tail at most ``size`` bytes with ``pread`` at the end of the
   file, so a 10 GiB shard costs one small read; a range (the zip check's second read) one ``pread``.
3. Missing things are answers, not errors: a missing location has no items, a missing folder no files, a
   missing file no head or tail; but when the root the location lies under is gone, listing the location
   is ``NotFoundError`` (the watcher must stop, not wait for saves that cannot come). Any other failure is
   ``StorageError`` naming the path.
"""

from __future__ import annotations

import errno
import os
import stat

from ckpt.domain.errors import NotFoundError, StorageError
from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import Item, Kind, Tail

__all__ = ["PosixSaves"]

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _error(action: str, path: str, exc: OSError) -> StorageError:
    return StorageError(f"cannot {action} {path}: {exc.strerror or exc}", location=path)


class PosixSaves:
    """The saves location ``base`` (an absolute path); every path asked for is relative to it.

    ``root``, when given, is the checkpoint root ``base`` lies under (rule 3).
    """

    # A restore fills fast saves on POSIX roots (spec/tiered.md §6.3): the judges look for its mark here.
    holds_restores = True

    def __init__(self, base: str, *, root: str | None = None) -> None:
        self.base = base.rstrip("/") or "/"
        self.root = root

    def __repr__(self) -> str:
        return f"PosixSaves({self.base!r})"

    def _path(self, path: str) -> str:
        return os.path.join(self.base, path) if path else self.base

    def items(self) -> list[Item]:
        """The folders and regular files directly inside the location (rule 1), in no particular order."""
        try:
            with os.scandir(self.base) as it:
                found = []
                for d in it:
                    if d.is_dir(follow_symlinks=False):
                        found.append(Item(d.name, Kind.FOLDER))
                    elif d.is_file(follow_symlinks=False):
                        found.append(Item(d.name, Kind.FILE))
                return found
        except OSError as exc:
            if exc.errno not in _ABSENT:
                raise _error("list", self.base, exc) from exc
            if self.root is not None and not os.path.isdir(self.root):
                raise NotFoundError(f"root {self.root} does not exist", location=self.root) from None
            return []

    def files(self, path: str) -> list[FileInfo]:
        """Every regular file under the folder ``path``, recursively, with its size, sorted by path."""
        top = self._path(path)
        found: list[FileInfo] = []
        pending = [("", top)]
        while pending:
            rel, folder = pending.pop()
            try:
                with os.scandir(folder) as it:
                    for d in it:
                        name = f"{rel}{d.name}"
                        if d.is_dir(follow_symlinks=False):
                            pending.append((f"{name}/", d.path))
                        elif d.is_file(follow_symlinks=False):
                            try:
                                found.append(FileInfo(name, d.stat(follow_symlinks=False).st_size))
                            except FileNotFoundError:
                                continue  # renamed or removed since the listing: not part of the save now
            except OSError as exc:
                if exc.errno in _ABSENT:
                    continue  # the folder (or a sub-folder) vanished while it was walked
                raise _error("list", folder, exc) from exc
        return sorted(found, key=lambda f: f.path)

    def is_file(self, path: str) -> bool:
        """Whether ``path`` is a regular file (not a link, folder, FIFO or device)."""
        try:
            return stat.S_ISREG(os.lstat(self._path(path)).st_mode)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return False
            raise _error("check", self._path(path), exc) from exc

    def _open(self, path: str) -> tuple[int, int] | None:
        """Open a regular file for reading: its descriptor and size, or ``None`` when there is none."""
        full = self._path(path)
        try:
            fd = os.open(full, _READ_FLAGS)
        except OSError as exc:
            if exc.errno in (*_ABSENT, errno.EISDIR, errno.ENXIO):
                return None
            raise _error("read", full, exc) from exc
        try:
            info = os.fstat(fd)
        except OSError as exc:
            os.close(fd)
            raise _error("read", full, exc) from exc
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return None
        return fd, info.st_size

    def head(self, path: str, limit: int) -> bytes | None:
        """The first ``limit`` bytes of the regular file ``path`` (fewer when shorter), or ``None``."""
        opened = self._open(path)
        if opened is None:
            return None
        fd, _ = opened
        chunks: list[bytes] = []
        left = limit
        try:
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
                chunks.append(chunk)
                left -= len(chunk)
        except OSError as exc:
            raise _error("read", self._path(path), exc) from exc
        finally:
            os.close(fd)
        return b"".join(chunks)

    def tail(self, path: str, size: int) -> Tail | None:
        """The last ``size`` bytes of the regular file ``path`` and its size, or ``None`` (rule 2)."""
        opened = self._open(path)
        if opened is None:
            return None
        fd, total = opened
        want = min(size, total)
        try:
            data = os.pread(fd, want, total - want) if want else b""
        except OSError as exc:
            raise _error("read", self._path(path), exc) from exc
        finally:
            os.close(fd)
        return Tail(total, data)

    def read_range(self, path: str, offset: int, length: int) -> bytes | None:
        """At most ``length`` bytes of the regular file ``path`` from ``offset`` (one ``pread``), or ``None``
        (rule 2)."""
        opened = self._open(path)
        if opened is None:
            return None
        fd, _ = opened
        try:
            return os.pread(fd, max(0, length), max(0, offset))
        except OSError as exc:
            raise _error("read", self._path(path), exc) from exc
        finally:
            os.close(fd)
