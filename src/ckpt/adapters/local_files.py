"""Files inside saves on a POSIX root, read by path: the tail of a big file.

The publication log and the small files beside the saves (an execution's epoch record) are written by
``ckpt.adapters.posix``. :func:`read_tail` reads the last bytes of a file that may be gigabytes long (a
checkpoint whose zip end record says whether it is whole), never through a link.
"""

from __future__ import annotations

import errno
import os
import stat

from ckpt.domain.errors import StorageError

__all__ = ["read_tail"]


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
