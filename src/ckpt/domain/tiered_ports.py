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

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs

from ckpt.domain.manifest import Listed

__all__ = ["DurableFiles", "FastFiles", "Stored"]


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
