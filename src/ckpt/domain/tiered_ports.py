"""The ports of the tiered mode (spec/tiered.md): a tier's files, as replication and restore move them.

Both take *save paths* relative to their root (``exec/a/ck-1``) and file paths relative to the save
(slash-separated), as the small store ports do (``ckpt.domain.ports``); the publication logs stay the
stores' own (``Store.publish`` and ``Store.entries`` on each root).

* :class:`FastFiles` is the fast root (a local POSIX path): it digests a file while reading it, tells the
  local path a transfer reads from, and installs a file a transfer wrote to a temporary path.
* :class:`DurableFiles` is the durable root (S3 or POSIX): it stores a local file under a save (verified
  before it returns), fetches one into a local path, lists a save's files and reads and writes the manifest.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs

from ckpt.domain.errors import InvalidError
from ckpt.domain.manifest import Listed

__all__ = [
    "CHECKSUMS",
    "MAX_CONCURRENCY",
    "NEEDS_CRT",
    "DurableFiles",
    "FastFiles",
    "Stored",
    "TokenBucket",
    "TransferSettings",
    "parse_checksum",
    "parse_rate",
]


MAX_CONCURRENCY = 64
_RATE = re.compile(r"([0-9]+)(k|M|G|Ki|Mi|Gi)?", re.ASCII)
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def parse_rate(text: str, what: str) -> int:
    """Bytes per second from ``text``: a positive integer, optionally followed by ``k``, ``M``, ``G`` (powers
    of 1000) or ``Ki``, ``Mi``, ``Gi`` (powers of 1024): ``200M``, ``1Gi``. Else ``InvalidError`` naming
    ``what`` (spec/tiered.md §12.2).

    >>> parse_rate("200M", "--max-bandwidth"), parse_rate("1Ki", "--max-bandwidth")
    (200000000, 1024)
    """
    found = _RATE.fullmatch(text)
    if found is None or int(found[1]) == 0:
        raise InvalidError(
            f"{what} {text!r}: give bytes per second, a positive integer with an optional k, M, G, Ki, Mi or "
            "Gi (200M, 1Gi)"
        )
    return int(found[1]) * _UNITS[found[2] or ""]


CHECKSUMS = ("CRC32", "CRC32C", "CRC64NVME", "SHA256")  # S3's additional checksums a replicator may ask for
NEEDS_CRT = frozenset({"CRC32C", "CRC64NVME"})  # botocore computes these only with awscrt


def parse_checksum(text: str, what: str) -> str:
    """One of :data:`CHECKSUMS` (case as written there), else ``InvalidError`` naming ``what`` (§12.5)."""
    if text not in CHECKSUMS:
        raise InvalidError(f"{what} {text!r}: give one of {', '.join(CHECKSUMS)}")
    return text


@attrs.frozen
class TransferSettings:
    """How a replicator copies (spec/tiered.md §12): parallel transfers (per file, and in all on S3), bytes
    per second (``None``: no bound) over all of its uploads, the S3 additional checksum of every upload, and
    how many files of one save it copies at once."""

    concurrency: int = 8
    max_bandwidth: int | None = None
    checksum: str = "CRC32"
    files_in_flight: int = 4  # files of one save copied at once (§12.1)

    def __attrs_post_init__(self) -> None:
        concurrency, bandwidth = self.concurrency, self.max_bandwidth
        whole = isinstance(concurrency, int) and not isinstance(concurrency, bool)
        if not whole or not 1 <= concurrency <= MAX_CONCURRENCY:
            raise InvalidError(f"concurrency {concurrency!r}: give an integer from 1 to {MAX_CONCURRENCY}")
        if bandwidth is not None and (
            isinstance(bandwidth, bool) or not isinstance(bandwidth, int) or bandwidth <= 0
        ):
            raise InvalidError(f"max_bandwidth {bandwidth!r}: give a positive number of bytes per second")
        parse_checksum(self.checksum, "checksum")
        files = self.files_in_flight
        if isinstance(files, bool) or not isinstance(files, int) or not 1 <= files <= MAX_CONCURRENCY:
            raise InvalidError(f"files {files!r}: give an integer from 1 to {MAX_CONCURRENCY}")


class TokenBucket:
    """A bound on bytes per second, as a bucket holding at most one second's worth (spec/tiered.md §12.3).

    :meth:`take` returns how long to wait before sending ``n`` bytes; the caller waits (the clock and the
    sleep are the caller's, so this stays pure). Bursts never exceed one second's worth.

    >>> bucket = TokenBucket(1000, now=0.0)
    >>> bucket.take(1000, now=0.0), bucket.take(500, now=0.0), bucket.take(500, now=1.0)
    (0.0, 0.5, 0.0)
    """

    __slots__ = ("_at", "_rate", "_tokens")

    def __init__(self, rate: int, *, now: float) -> None:
        self._rate = float(rate)
        self._tokens = float(rate)
        self._at = now

    def take(self, n: int, *, now: float) -> float:
        """Spend ``n`` bytes at time ``now``; return the seconds to wait first (0.0: none)."""
        self._tokens = min(self._rate, self._tokens + (now - self._at) * self._rate)
        self._at = now
        self._tokens -= n
        if self._tokens >= 0:
            return 0.0
        wait = -self._tokens / self._rate
        self._tokens, self._at = 0.0, now + wait  # the wait pays the debt
        return wait


@attrs.frozen
class Stored:
    """A file as the durable root holds it: size, and the SHA-256 recorded with it (``None``: unknown)."""

    size: int
    sha256: str | None


@runtime_checkable
class FastFiles(Protocol):
    """The fast root's files (always a local POSIX root)."""

    def listing(self, save: str) -> list[Listed] | None:
        """Every regular file of the save, sizes only, sorted by path; ``None`` when the save is not there."""
        ...

    def digest(self, save: str, path: str) -> Listed:
        """Read the file once and return its size and SHA-256 (the manifest's digest, spec/tiered.md §3.3)."""
        ...

    def local_path(self, save: str, path: str) -> str:
        """The absolute path of a file of the save, for a transfer to read."""
        ...

    def install(self, save: str, path: str, write: Callable[[str], None], sha256: str) -> str | None:
        """Create the file durably from ``write(temp)``, which fills a temporary path beside it: the temp is
        fsynced, read back and hashed and, when its SHA-256 is ``sha256``, renamed into place and its folder
        fsynced (``None``). Otherwise the temp is removed and the reason returned (spec/tiered.md §4.3)."""
        ...

    def write_small(self, save: str, path: str, data: bytes) -> None:
        """Create a small file of the save durably (temporary name, fsync, rename, fsync of the folder)."""
        ...

    def sweep(self, save: str) -> int:
        """Remove the temporary files that installs killed midway left in the save (a restore killed while
        several files were in flight, spec/tiered.md §6.3); return how many. Nothing else is touched."""
        ...

    def begin_restore(self, save: str) -> None:
        """Create the save's folder and the mark ``RESTORING_NAME`` in it, durably, before a restore writes
        any file there (spec/tiered.md §6.3): until :meth:`end_restore`, no judge calls the save complete."""
        ...

    def end_restore(self, save: str) -> None:
        """Remove the restore's mark from the save, durably; a mark already gone is no error."""
        ...


@runtime_checkable
class DurableFiles(Protocol):
    """The durable root's files (S3 or POSIX)."""

    def stored(self, save: str, path: str) -> Stored | None:
        """The file as stored, or ``None`` when there is none."""
        ...

    def put(self, local_path: str, save: str, path: str, sha256: str, size: int) -> None:
        """Store the local file under the save; return only once the stored copy is whole and verified
        (its size, the transport checksum the storage checked, its SHA-256 recorded), else raise."""
        ...

    def fetch(self, save: str, path: str, local_path: str) -> None:
        """Write the stored file's bytes into ``local_path`` (created or truncated)."""
        ...

    def listing(self, save: str) -> list[Listed] | None:
        """Every file of the save, sizes (and a SHA-256 where the listing has one); ``None``: no save."""
        ...

    def digest(self, save: str, path: str) -> Listed:
        """Read the stored file whole and return its size and the SHA-256 of its bytes (``resolve --verify
        --digests``, spec/tiered.md §10)."""
        ...

    def read_small(self, save: str, path: str) -> bytes | None:
        """A small file of the save (the manifest), or ``None`` when there is none."""
        ...

    def write_small(self, save: str, path: str, data: bytes) -> None:
        """Store a small file of the save (the manifest) durably."""
        ...
