"""Writing one small file next to the saves on POSIX (the ``WritesSmallFiles`` capability): an epoch record.

Rules:

1. The folders on the way are reached from the root as the tree reads them, every element opened with
   ``O_NOFOLLOW|O_DIRECTORY``: nothing is written through a link or outside the root. A link or a file where
   a folder is expected is a ``StorageError``; the root itself must exist (``NotFoundError``), so a mistyped
   root is never created.
2. A missing folder is created (``mkdir`` relative to its parent's descriptor) and the parent fsynced, so
   the new folder outlives a power loss with the file in it; one created meanwhile by another process is
   simply opened.
3. The file is written as a fresh temporary file in its folder (``O_EXCL``, a random name starting with
   ``.``), fsynced, closed, renamed over ``name``, and the folder fsynced: a reader sees the old content or
   the new one, never a mix, and the new one is durable when the call returns. The temporary file is
   removed again when anything fails.
"""

from __future__ import annotations

import errno
import os
from contextlib import suppress

from ckpt.adapters.posix.syscalls import CREATE_FLAGS, NOFOLLOW_DIR_FLAGS, PosixRoot, storage_error
from ckpt.domain.errors import StorageError

__all__ = ["write_small_file"]


def _open_or_make(at: PosixRoot, parent: int, element: str, path: str) -> int:
    """Open the folder ``element`` inside ``parent``, creating it (and syncing ``parent``) when missing."""
    for _ in range(2):
        try:
            return at.sys.open(element, NOFOLLOW_DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                reason = "it is not a folder (or is a link)"
                raise StorageError(f"cannot write into {path}: {reason}", location=path) from exc
            raise storage_error("open", path, exc) from exc
        try:
            at.sys.mkdir(element, 0o755, dir_fd=parent)
            at.sys.fsync(parent)  # rule 2: the new folder's name is durable
        except FileExistsError:
            continue  # created meanwhile: open it
        except OSError as exc:
            raise storage_error("create the folder", path, exc) from exc
    raise StorageError(f"cannot create the folder {path}: it keeps changing", location=path)


def _write_in(at: PosixRoot, folder: int, name: str, data: bytes, path: str) -> None:
    """Write ``data`` as ``name`` in the open ``folder`` through a temporary file (rule 3)."""
    temporary = f".{name}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        fd = at.sys.open(temporary, CREATE_FLAGS, 0o644, dir_fd=folder)
    except OSError as exc:
        raise storage_error("write", path, exc) from exc
    try:
        try:
            written = 0
            while written < len(data):
                written += at.sys.write(fd, data[written:])
            at.sys.fsync(fd)
        finally:
            at.sys.close(fd)  # a failed close of a file we wrote is an error (syscalls rule 2)
        at.sys.rename(temporary, name, dir_fd=folder)
        at.sys.fsync(folder)
    except OSError as exc:
        with suppress(OSError):  # already renamed, or never written: nothing to clean
            at.sys.unlink(temporary, dir_fd=folder)
        raise storage_error("write", path, exc) from exc


def write_small_file(at: PosixRoot, save: str, name: str, data: bytes) -> None:
    """Write ``data`` as file ``name`` (a clean relative path) inside the folder at save path ``save``."""
    *folders, last = [element for element in f"{save}/{name}".split("/") if element]
    path = at.path(f"{save}/{name}".strip("/"))
    error = at.root_error()
    if error is not None:
        raise error  # rule 1: never create the root
    fd = at.open_root()
    try:
        for element in folders:
            child = _open_or_make(at, fd, element, path)
            at.close_quietly(fd)
            fd = child
        _write_in(at, fd, last, data, path)
    finally:
        at.close_quietly(fd)
