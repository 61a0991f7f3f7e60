"""``FaultySyscalls``: the POSIX store's real system calls, recorded, with chosen calls failing.

The fault tests give a :class:`~ckpt.adapters.posix.PosixStore` this object instead of the default
:class:`~ckpt.adapters.posix.Syscalls`. Every call still goes to the real ``os`` function on real files,
except the ones chosen with :meth:`FaultySyscalls.fail`, which raise ``OSError`` with the chosen errno (and,
for a call given a path, that path as its ``filename``), as the real call would. Every call is recorded as
``(operation, target)``, the target written relative to a base folder (the root under test), so a test can
name each step of an operation and prove it has covered them all.

It lives with the tests rather than in ``ckpt.testing``: it fails the adapter's own system calls, which only
the adapter's tests know the order of. Embedders testing how their code reacts to a failing store want a
store-level fake (``ckpt.testing.InMemoryStore``), not this.
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import NamedTuple

from ckpt.adapters.posix import Syscalls

__all__ = ["OPERATIONS", "Call", "FaultySyscalls"]

# Every operation that can be failed: the Syscalls methods, and "readdir", reading a listing's entries
# (counted once per listing, when its first entry is asked for).
OPERATIONS = frozenset(
    {"open", "close", "fsync", "read", "write", "mkdir", "rename", "link", "unlink", "rmdir"}
    | {"scandir", "readdir", "stat", "lstat", "fstat", "realpath"}
)


class Call(NamedTuple):
    """One recorded system call: the operation and what it acted on, relative to the base folder."""

    operation: str
    target: str


class _Fault(NamedTuple):
    error: int
    after: bool


class FaultySyscalls(Syscalls):
    """Real system calls, recorded; the calls chosen with :meth:`fail` raise ``OSError`` instead."""

    __slots__ = ("_base", "_counts", "_faults", "_targets", "calls")

    def __init__(self, base: str) -> None:
        self._base = base
        self.calls: list[Call] = []
        self._counts: Counter[str] = Counter()
        self._faults: dict[tuple[str, int], _Fault] = {}
        self._targets: dict[int, str] = {}  # open descriptor -> what it was opened as

    def fail(self, operation: str, nth: int = 1, error: int = errno.EIO, *, after: bool = False) -> None:
        """Make the ``nth`` call (counting from 1) of ``operation`` raise ``OSError(error)``.

        The call is not made, unless ``after``: then it is made and its success reported as a failure (as an
        NFS reply lost after the server acted, or a security module refusing the open of a file it just let
        be created). ``close`` always closes first: Linux releases a descriptor even when close fails.
        """
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; known: {sorted(OPERATIONS)}")
        self._faults[(operation, nth)] = _Fault(error, after or operation == "close")

    def count(self, operation: str) -> int:
        """Return how many calls of ``operation`` were made so far."""
        return self._counts[operation]

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _label(self, path: str | int, dir_fd: int | None = None) -> str:
        if isinstance(path, int):
            return self._targets.get(path, f"<fd {path}>")
        if dir_fd is not None:
            return os.path.normpath(os.path.join(self._targets.get(dir_fd, f"<fd {dir_fd}>"), path))
        return os.path.relpath(path, self._base) if os.path.isabs(path) else path

    def _enter(self, operation: str, target: str, path: str | int) -> _Fault | None:
        """Record the call; raise now if it is to fail before being made, else return a fault for after."""
        self.calls.append(Call(operation, target))
        self._counts[operation] += 1
        fault = self._faults.get((operation, self._counts[operation]))
        if fault is not None and not fault.after:
            self._leave(fault, path)
        return fault

    @staticmethod
    def _leave(fault: _Fault | None, path: str | int) -> None:
        if fault is not None:
            if isinstance(path, str):
                raise OSError(fault.error, os.strerror(fault.error), path)
            raise OSError(fault.error, os.strerror(fault.error))

    # -- the system calls -----------------------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        """``os.open``, recorded; remembers what the descriptor names."""
        target = self._label(path, dir_fd)
        fault = self._enter("open", target, path)
        fd = os.open(path, flags, mode, dir_fd=dir_fd)
        if fault is not None:
            os.close(fd)
        self._leave(fault, path)
        self._targets[fd] = target
        return fd

    def close(self, fd: int) -> None:
        """``os.close``, recorded (a failure is reported after the descriptor is released)."""
        target = self._targets.pop(fd, f"<fd {fd}>")
        fault = self._enter("close", target, fd)
        os.close(fd)
        self._leave(fault, fd)

    def fsync(self, fd: int) -> None:
        """``os.fsync``, recorded."""
        target = self._label(fd)
        fault = self._enter("fsync", target, fd)
        os.fsync(fd)
        self._leave(fault, fd)

    def read(self, fd: int, size: int) -> bytes:
        """``os.read``, recorded."""
        target = self._label(fd)
        fault = self._enter("read", target, fd)
        data = os.read(fd, size)
        self._leave(fault, fd)
        return data

    def write(self, fd: int, data: bytes) -> int:
        """``os.write``, recorded."""
        target = self._label(fd)
        fault = self._enter("write", target, fd)
        written = os.write(fd, data)
        self._leave(fault, fd)
        return written

    def mkdir(self, path: str, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        """``os.mkdir``, recorded."""
        target = self._label(path, dir_fd)
        fault = self._enter("mkdir", target, path)
        os.mkdir(path, mode, dir_fd=dir_fd)
        self._leave(fault, path)

    def rename(self, src: str, dst: str, *, dir_fd: int | None = None) -> None:
        """``os.rename`` within one folder, recorded (the target is the new name)."""
        target = self._label(dst, dir_fd)
        fault = self._enter("rename", target, dst)
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        self._leave(fault, dst)

    def link(self, src: str, dst: str, *, dir_fd: int | None = None) -> None:
        """``os.link`` within one folder, recorded (the target is the new name)."""
        target = self._label(dst, dir_fd)
        fault = self._enter("link", target, dst)
        os.link(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        self._leave(fault, dst)

    def unlink(self, path: str, *, dir_fd: int | None = None) -> None:
        """``os.unlink``, recorded."""
        target = self._label(path, dir_fd)
        fault = self._enter("unlink", target, path)
        os.unlink(path, dir_fd=dir_fd)
        self._leave(fault, path)

    def rmdir(self, path: str, *, dir_fd: int | None = None) -> None:
        """``os.rmdir``, recorded."""
        target = self._label(path, dir_fd)
        fault = self._enter("rmdir", target, path)
        os.rmdir(path, dir_fd=dir_fd)
        self._leave(fault, path)

    def scandir(self, path: str | int) -> AbstractContextManager[Iterator[os.DirEntry[str]]]:
        """``os.scandir``, recorded; reading the listing is the separate operation ``readdir``."""
        target = self._label(path)
        fault = self._enter("scandir", target, path)
        listing = os.scandir(path)
        if fault is not None:
            listing.close()
        self._leave(fault, path)
        return _Listing(self, listing, target)

    def stat(self, path: str) -> os.stat_result:
        """``os.stat``, recorded."""
        target = self._label(path)
        fault = self._enter("stat", target, path)
        result = os.stat(path)
        self._leave(fault, path)
        return result

    def lstat(self, path: str, *, dir_fd: int | None = None) -> os.stat_result:
        """``os.lstat``, recorded."""
        target = self._label(path, dir_fd)
        fault = self._enter("lstat", target, path)
        result = os.lstat(path, dir_fd=dir_fd)
        self._leave(fault, path)
        return result

    def fstat(self, fd: int) -> os.stat_result:
        """``os.fstat``, recorded."""
        target = self._label(fd)
        fault = self._enter("fstat", target, fd)
        result = os.fstat(fd)
        self._leave(fault, fd)
        return result

    def realpath(self, path: str) -> str:
        """``os.path.realpath(path, strict=True)``, recorded as one call (the lstat and readlink calls it
        makes inside are not the store's own)."""
        target = self._label(path)
        fault = self._enter("realpath", target, path)
        result = os.path.realpath(path, strict=True)
        self._leave(fault, path)
        return result


class _Listing:
    """A real ``scandir`` listing whose reading is recorded (and can fail) as ``readdir``."""

    def __init__(self, owner: FaultySyscalls, listing: Iterator[os.DirEntry[str]], target: str) -> None:
        self._owner = owner
        self._listing = listing
        self._target = target
        self._started = False

    def __enter__(self) -> _Listing:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __iter__(self) -> _Listing:
        return self

    def __next__(self) -> os.DirEntry[str]:
        if not self._started:
            self._started = True
            fault = self._owner._enter("readdir", self._target, -1)
            self._owner._leave(fault, -1)
        return next(self._listing)

    def close(self) -> None:
        close = getattr(self._listing, "close", None)
        if close is not None:
            close()
