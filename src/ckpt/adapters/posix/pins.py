"""The pins of a POSIX root, ``<root>/pins/<entry name>`` (docs/spec/layout.md "Pins").

Rules, the same as the publication log's (``ckpt.adapters.posix``):

1. ``pins/`` is only opened with ``O_NOFOLLOW|O_DIRECTORY``; pins are created, listed and removed relative
   to that descriptor, so a ``pins/`` that is a symbolic link is refused.
2. A pin is created with ``O_CREAT|O_EXCL|O_NOFOLLOW``; the new file, ``pins/`` and the root are fsynced
   before ``create`` returns True. When a step after the create fails, the pin is removed again and the
   failure raised. A removal fsyncs ``pins/`` before it returns.
3. One listing, no ``stat``: anything in ``pins/`` that is not a regular file is ``MalformedError``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from contextlib import suppress
from typing import TYPE_CHECKING

from ckpt.domain.entries import PINS_DIR_NAME
from ckpt.domain.errors import MalformedError, NotFoundError, StorageError

if TYPE_CHECKING:
    from ckpt.adapters.posix.syscalls import Syscalls

__all__ = ["PosixPins"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR_FLAGS = _DIR_FLAGS | os.O_NOFOLLOW
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _error(action: str, path: str, exc: OSError) -> StorageError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return StorageError(
            f"cannot {action} {path}: it is a symbolic link or not a directory (refused)", location=path
        )
    return StorageError(f"cannot {action} {path}: {exc.strerror or exc}", location=path)


class PosixPins:
    """Lists, creates and removes the pins of one POSIX root, through the store's :class:`Syscalls`."""

    __slots__ = ("_dir", "_root", "_sys")

    def __init__(self, root: str, syscalls: Syscalls) -> None:
        self._root = root
        self._dir = root.rstrip("/") + "/" + PINS_DIR_NAME
        self._sys = syscalls

    def _close_quietly(self, fd: int) -> None:
        with suppress(OSError):
            self._sys.close(fd)

    def _sync(self, path: str) -> None:
        fd = self._sys.open(path, _DIR_FLAGS)
        try:
            self._sys.fsync(fd)
        finally:
            self._close_quietly(fd)

    def _open(self) -> int | None:
        """Open ``pins/`` (rule 1); ``None`` when it is missing (``NotFoundError`` when the root is)."""
        try:
            return self._sys.open(self._dir, _NOFOLLOW_DIR_FLAGS)
        except FileNotFoundError:
            if not os.path.isdir(self._root):
                raise NotFoundError(f"root {self._root} does not exist", location=self._root) from None
            return None
        except OSError as exc:
            raise _error("open", self._dir, exc) from exc

    def list_names(self) -> list[str]:
        """Return every name in ``pins/`` (rule 3); none when there is no ``pins/``."""
        fd = self._open()
        if fd is None:
            return []
        try:
            with self._sys.scandir(fd) as it:
                found = [(d.name, d.is_file(follow_symlinks=False)) for d in it]
        except OSError as exc:
            raise _error("list", self._dir, exc) from exc
        finally:
            self._close_quietly(fd)
        odd = sorted(name for name, is_file in found if not is_file)
        if odd:
            raise MalformedError(
                f"malformed pin {self._dir + '/' + odd[0]!r} in {PINS_DIR_NAME}/: not a regular file",
                value=odd[0],
            )
        return [name for name, _ in found]

    def create(self, name: str) -> bool:
        """Create the pin ``name`` exclusively and durably (rule 2); False when it was already there."""
        fd = self._open()
        if fd is None:
            try:
                self._sys.mkdir(self._dir, 0o755)
            except FileExistsError:
                pass  # another pinner made it
            except OSError as exc:
                raise _error("create", self._dir, exc) from exc
            else:
                try:
                    self._sync(self._root)
                except OSError as exc:
                    raise _error("sync the root after creating pins/ in", self._root, exc) from exc
            fd = self._open()
            if fd is None:
                raise StorageError(f"{self._dir} vanished while a pin was created", location=self._dir)
        path = self._dir + "/" + name
        try:
            try:
                pin_fd = self._sys.open(name, _CREATE_FLAGS, 0o644, dir_fd=fd)
            except FileExistsError:
                return False
            except OSError as exc:
                raise _error("create the pin", path, exc) from exc
            try:
                try:
                    self._sys.fsync(pin_fd)
                finally:
                    self._sys.close(pin_fd)
                self._sys.fsync(fd)
                self._sync(self._root)
            except OSError as exc:
                with suppress(OSError):
                    self._sys.unlink(name, dir_fd=fd)
                raise StorageError(
                    f"cannot make the pin {path} durable: {exc.strerror or exc}; the pin was removed again",
                    location=path,
                ) from exc
        finally:
            self._close_quietly(fd)
        return True

    def remove(self, names: Sequence[str]) -> list[str]:
        """Remove the pins ``names`` (absent ones are fine) and fsync ``pins/`` (rule 2); return them."""
        if not names:
            return []
        fd = self._open()
        if fd is None:
            return list(names)
        try:
            for name in names:
                try:
                    self._sys.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise _error("remove the pin", self._dir + "/" + name, exc) from exc
            try:
                self._sys.fsync(fd)
            except OSError as exc:
                raise _error("sync", self._dir, exc) from exc
        finally:
            self._close_quietly(fd)
        return list(names)
