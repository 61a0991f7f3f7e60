"""Files next to the saves on a POSIX root: the epoch record of an execution folder, the tail of a big file.

The publication log itself is written by ``ckpt.adapters.posix``. :func:`write_file_atomically` writes a
whole small file so that a reader sees the old content or the new one, never a mix: a temporary file in the
same folder, fsynced, renamed into place, and the folder fsynced, so the file outlives a power loss once it
returns. :func:`read_tail` reads the last bytes of a file that may be gigabytes long (a checkpoint whose zip
end record says whether it is whole), never through a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ckpt.domain.errors import StorageError

__all__ = ["read_tail", "write_file_atomically"]


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


def read_tail(folder: str, name: str, size: int) -> bytes | None:
    """The last ``size`` bytes of the regular file ``folder/name``, or ``None`` when there is no such file.

    A link, a folder or a FIFO of that name is no file. Raises ``StorageError`` when the filesystem refuses.
    """
    path = os.path.join(folder, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None  # a link
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}", location=path) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        start = max(0, st.st_size - size)
        return os.pread(fd, st.st_size - start, start)
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}", location=path) from exc
    finally:
        os.close(fd)
