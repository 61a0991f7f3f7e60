"""Small files written next to the saves on a POSIX root: the epoch record of an execution folder.

The publication log itself is written by ``ckpt.adapters.posix``; this module only writes a whole small file
so that a reader sees the old content or the new one, never a mix: a temporary file in the same folder,
fsynced, renamed into place, and the folder fsynced, so the file outlives a power loss once this returns.
"""

from __future__ import annotations

import contextlib
import os

from ckpt.domain.errors import StorageError

__all__ = ["write_file_atomically"]


def write_file_atomically(folder: str, name: str, data: bytes) -> None:
    """Write ``data`` as ``folder/name`` (creating ``folder`` and its parents), durably and atomically.

    Raises ``StorageError`` naming the path when the filesystem refuses.
    """
    path = os.path.join(folder, name)
    temporary = os.path.join(folder, f".{name}.tmp-{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):  # never created, or already renamed: nothing to clean
            os.unlink(temporary)
        raise StorageError(f"cannot write {path}: {exc.strerror or exc}", location=path) from exc
