"""The system calls the POSIX store makes, behind one injectable object, and what every module shares.

Rules:

1. Every system call goes through one :class:`Syscalls` object (by default, the ``os`` functions). Tests give
   the store one that fails chosen calls (``tests/support/faulty_syscalls.py``); nothing else differs.
2. Closing a descriptor that was only read (a folder, a file opened to fsync it) cannot lose data, and Linux
   releases it even when ``close`` reports an error, so such errors are ignored. A failed ``close`` of a file
   we wrote is an error.
3. Every ``OSError`` becomes a ``StorageError`` (or ``NotFoundError``) naming the path and the reason.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import AbstractContextManager, suppress

from ckpt.domain.entries import PUB_DIR_NAME
from ckpt.domain.errors import NotFoundError, StorageError

__all__ = ["CREATE_FLAGS", "DIR_FLAGS", "NOFOLLOW_DIR_FLAGS", "READ_FLAGS", "PosixRoot", "Syscalls"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
NOFOLLOW_DIR_FLAGS = DIR_FLAGS | os.O_NOFOLLOW
# O_NONBLOCK: opening a FIFO someone left in a save must not wait for a writer.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class Syscalls:
    """The system calls the POSIX store makes, each a thin method over the ``os`` function of its name.

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

    def mkdir(self, path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        """``os.mkdir``."""
        os.mkdir(path, mode, dir_fd=dir_fd)

    def rename(self, src: str, dst: str, *, dir_fd: int | None = None) -> None:
        """``os.rename`` of two names in the same folder (``dir_fd`` for both)."""
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)

    def link(self, src: str, dst: str, *, dir_fd: int | None = None) -> None:
        """``os.link`` of two names in the same folder (``dir_fd`` for both), never following ``src``."""
        os.link(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)

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

    def realpath(self, path: str) -> str:
        """``os.path.realpath(path, strict=True)``: the path with every link resolved, or ``OSError``."""
        return os.path.realpath(path, strict=True)


def reason(exc: OSError) -> str:
    """The operator-facing reason of an ``OSError``: its ``strerror``."""
    return exc.strerror or str(exc)


def storage_error(action: str, path: str, exc: OSError) -> StorageError:
    """Return ``NotFoundError`` for ENOENT, else ``StorageError``: "cannot <action> <path>: <reason>"."""
    cls = NotFoundError if exc.errno == errno.ENOENT else StorageError
    return cls(f"cannot {action} {path}: {reason(exc)}", location=path)


class PosixRoot:
    """One root directory and the system calls that reach it: what the log, tree and journal share."""

    __slots__ = ("pub", "root", "sys")

    def __init__(self, root: str, syscalls: Syscalls) -> None:
        self.root = root
        self.pub = os.path.join(root, PUB_DIR_NAME)
        self.sys = syscalls

    def path(self, save: str) -> str:
        """The absolute path of a save path (``""`` is the root)."""
        if not save:
            return self.root
        return self.root + "/" + save if self.root != "/" else "/" + save

    def close_quietly(self, fd: int) -> None:
        """Close a descriptor that was only read (rule 2)."""
        with suppress(OSError):
            self.sys.close(fd)

    def sync_dir(self, path: str) -> None:
        """fsync the folder at ``path`` (following links: the root may be one)."""
        fd = self.sys.open(path, DIR_FLAGS)
        try:
            self.sys.fsync(fd)
        finally:
            self.close_quietly(fd)

    def root_error(self) -> StorageError | None:
        """Return the error to raise when the root is missing or not a folder, else ``None``."""
        try:
            mode = self.sys.stat(self.root).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return NotFoundError(f"root {self.root} does not exist", location=self.root)
        except OSError as exc:
            return storage_error("inspect the root", self.root, exc)
        if not stat.S_ISDIR(mode):
            return StorageError(f"root {self.root} is not a directory", location=self.root)
        return None

    def open_root(self) -> int:
        """Open the root folder (following a link: the root may be one)."""
        try:
            return self.sys.open(self.root, DIR_FLAGS)
        except OSError as exc:
            raise storage_error("open the root", self.root, exc) from exc
