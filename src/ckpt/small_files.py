"""Reading a small file a user points ``ckpt`` at: the configuration file, a secret, a JWT, an AppRole id.

Rules (``read_small_file``; the configuration loader and ``ckpt.creds.files.read_secret_file`` both use it):

- Open non-blocking, so a FIFO with no writer cannot hang us, then decide on what was opened: ``fstat`` of
  the descriptor describes the file after every link was resolved, with no window between check and read.
- Refuse anything but a regular file: ``/dev/zero`` would be read forever, a FIFO or ``/dev/stdin`` may
  never end.
- Read at most ``limit`` bytes and refuse a file that holds more, so a wrong path cannot eat the memory.
- A regular file under a lease being broken makes a non-blocking open fail with ``EWOULDBLOCK``; that only
  happens to regular files, so the open is repeated blocking, exactly as a plain ``open()`` would wait.
- Refusals go through the caller's ``refuse(reason)``, so each caller raises its own error (a configuration
  error, a refused secret) with its own wording; other ``OSError``\\ s (missing file, permission) propagate
  for the caller to translate.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import NoReturn

__all__ = ["read_small_file"]

_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY


def _open(path: str | os.PathLike[str]) -> int:
    try:
        return os.open(path, _FLAGS | os.O_NONBLOCK)
    except BlockingIOError:
        # Only a lease on a regular file refuses a non-blocking open for reading (module rules).
        return os.open(path, _FLAGS)


def read_small_file(
    path: str | os.PathLike[str],
    *,
    limit: int,
    refuse: Callable[[str], Exception],
    inspect: Callable[[os.stat_result], None] | None = None,
) -> bytes:
    """Return the bytes of the regular file at ``path``, at most ``limit`` of them (module rules).

    ``refuse(reason)`` builds the exception raised for a file that is not a regular file or is larger than
    ``limit``; ``inspect`` may look at the opened file's ``fstat`` (its mode, say) and raise before anything
    is read. ``FileNotFoundError`` and other ``OSError``\\ s of the open or the read propagate.
    """

    def fail(reason: str) -> NoReturn:
        raise refuse(reason)

    fd = _open(path)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            fail("it is not a regular file (after resolving links)")
        if inspect is not None:
            inspect(info)
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(65536, limit + 1 - size)):
            size += len(chunk)
            if size > limit:
                fail(f"it is larger than {limit} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
