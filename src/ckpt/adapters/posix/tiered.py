"""A POSIX root's files for the tiered mode: the fast root always, the durable root when it is a path.

Rules (docs/spec/tiered.md §4.2-§4.3):

1. A file is created under a temporary name beside its final one (``.<name>.ckpt-tmp-<16 hex>``; an S3
   download first writes ``.<name>.ckpt-tmp-<16 hex>.<8 hex>``, boto3's own, and renames it), fsynced,
   read back and hashed, and only when that SHA-256 is the expected one renamed into place, its folder then
   fsynced; folders created on the way are fsynced in their parents. A temporary file that does not verify
   is removed; one a killed process left stays (a durable root's goes with its save's prune, §4.2).
2. Listings are of regular files (``lstat``: no link is followed), sorted by path; temporary files are no
   part of a save and are left out. A missing save lists as ``None`` (fast) or nothing (durable). A folder
   of the save that cannot be listed fails the listing (rule 4): a save without it is never listed.
3. The SHA-256 a POSIX durable root records for a file is the one read back from it.
4. A failing system call is a ``StorageError`` naming the file and what the system said.
5. With ``max_bandwidth`` (bytes per second) the copies into this root (``put``: replication) are read
   and written in 1 MiB chunks, each waiting as one ``TokenBucket`` shared by every copy says
   (spec/tiered.md §12.3); restores out of it (``fetch``) are never slowed.
6. ``sweep`` removes the temporary files of rule 1 that a killed restore left in a fast save, before the
   save is restored into again (spec/tiered.md §6.3).
7. Nothing is written through a link: every folder between the root and a file written is a real folder
   (``lstat``), or the write is a ``StorageError`` naming the link; the root's own path may hold links.
8. ``begin_restore`` creates the save's folder and the mark ``RESTORING_NAME`` in it, each durably, before
   a restore writes any file there; ``end_restore`` removes the mark, durably (spec/tiered.md §6.3).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ckpt.domain.errors import StorageError, VerificationError
from ckpt.domain.manifest import RESTORING_NAME, Listed
from ckpt.domain.tiered_ports import Stored, TokenBucket

__all__ = ["PosixTierFiles", "make_dirs", "sha256_of"]

_CHUNK = 8 << 20
_MiB = 1 << 20
# rule 1's temporary name, and the one boto3's download writes first and renames to it (8 more hex digits)
_TEMP = re.compile(r"\..+\.ckpt-tmp-[0-9a-f]{16}(\.[0-9A-Fa-f]{8})?")


@contextmanager
def _storage(action: str, path: str) -> Iterator[None]:
    """Rule 4: an ``OSError`` inside becomes a ``StorageError`` naming ``path``."""
    try:
        yield
    except StorageError:
        raise  # already names its path (a StorageError is an OSError too)
    except OSError as exc:
        raise StorageError(f"cannot {action} {path!r}: {exc.strerror or exc}", location=path) from None


def sha256_of(path: str) -> str:
    """The SHA-256 of the file at ``path``, read in 8 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _raise(exc: OSError) -> None:
    """``os.walk``'s error handler: a folder that cannot be listed is an error, never a save without it."""
    where = os.fsdecode(exc.filename) if exc.filename is not None else "a folder of the save"
    raise StorageError(f"cannot list {where!r}: {exc.strerror or exc}", location=where) from None


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: str, *, within: str | None = None) -> None:
    """Create ``path`` and its missing parents, each fsynced in its parent (rule 1).

    With ``within`` (a folder ``path`` lies under), every folder below it must be a real one, not a link
    (rule 7): ``StorageError`` names the first that is not.
    """
    if within is not None:
        _no_link_below(within, path)
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        path = os.path.dirname(path)
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise
        _fsync_dir(os.path.dirname(folder))


def _no_link_below(top: str, path: str) -> None:
    """Rule 7: each existing folder from below ``top`` down to ``path`` is a real folder."""
    relative = os.path.relpath(path, top)
    if relative == os.curdir:
        return
    if relative.startswith(os.pardir):
        raise StorageError(f"cannot write {path!r}: it is not under {top!r}", location=path)
    here = top
    for part in relative.split(os.sep):
        here = os.path.join(here, part)
        try:
            info = os.lstat(here)
        except FileNotFoundError:
            return  # the rest is created here, as folders
        if not stat.S_ISDIR(info.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a folder"
            raise StorageError(
                f"cannot write under {here!r}: it is {kind}, and nothing is written through one",
                location=here,
            )


class PosixTierFiles:
    """The ``FastFiles`` and ``DurableFiles`` ports over one POSIX root (an absolute path)."""

    __slots__ = ("_bucket", "_clock", "_sleep", "root")

    def __init__(
        self,
        root: str,
        *,
        max_bandwidth: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.root = root.rstrip("/") or "/"
        self._clock, self._sleep = clock, sleep
        self._bucket = None if max_bandwidth is None else TokenBucket(max_bandwidth, now=clock())

    def _throttled_copy(self, source: str, target: str) -> None:
        """Rule 5: copy in 1 MiB chunks, each after the wait the shared bucket asks for."""
        assert self._bucket is not None
        with open(source, "rb") as src, open(target, "wb") as dst:
            while chunk := src.read(_MiB):
                wait = self._bucket.take(len(chunk), now=self._clock())
                if wait > 0:
                    self._sleep(wait)
                dst.write(chunk)

    def _path(self, save: str, path: str = "") -> str:
        return os.path.join(self.root, save, path) if path else os.path.join(self.root, save)

    # -- both ports ---------------------------------------------------------------------------------------

    def _walk(self, save: str) -> list[Listed] | None:
        top = self._path(save)
        with _storage("list", top):
            try:
                if not stat.S_ISDIR(os.lstat(top).st_mode):
                    return None
            except (FileNotFoundError, NotADirectoryError):
                return None
            return self._files(top)

    @staticmethod
    def _files(top: str) -> list[Listed]:
        found: list[Listed] = []
        for folder, dirs, names in os.walk(top, onerror=_raise):  # a folder it cannot read fails the listing
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
            for name in names:
                full = os.path.join(folder, name)
                info = os.lstat(full)
                if stat.S_ISREG(info.st_mode) and not _TEMP.fullmatch(name):
                    found.append(Listed(os.path.relpath(full, top).replace(os.sep, "/"), info.st_size))
        return sorted(found, key=lambda item: item.path)

    def install(self, save: str, path: str, write: Callable[[str], None], sha256: str) -> str | None:
        """Rule 1: write a temporary file, verify its read-back digest, rename it into place."""
        final = self._path(save, path)
        with _storage("write", final):
            return self._install(final, path, write, sha256)

    def _install(self, final: str, path: str, write: Callable[[str], None], sha256: str) -> str | None:
        folder, name = os.path.split(final)
        make_dirs(folder, within=self.root)
        temp = os.path.join(folder, f".{name}.ckpt-tmp-{os.urandom(8).hex()}")
        try:
            write(temp)
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            got = sha256_of(temp)
            if got != sha256:
                os.unlink(temp)
                return f"file {path!r} has sha256 {got}, the manifest says {sha256}"
            os.replace(temp, final)
        except BaseException:
            if os.path.lexists(temp):
                os.unlink(temp)
            raise
        _fsync_dir(folder)
        return None

    def write_small(self, save: str, path: str, data: bytes) -> None:
        def fill(temp: str) -> None:
            with open(temp, "wb") as f:
                f.write(data)

        problem = self.install(save, path, fill, hashlib.sha256(data).hexdigest())
        if problem is not None:
            raise StorageError(f"cannot write {self._path(save, path)!r}: {problem}")

    # -- FastFiles ----------------------------------------------------------------------------------------

    def listing(self, save: str) -> list[Listed] | None:
        """Rule 2 (both ports): ``None`` when the save is not there."""
        return self._walk(save)

    def digest(self, save: str, path: str) -> Listed:
        full = self._path(save, path)
        with _storage("read", full):
            return Listed(path, os.lstat(full).st_size, sha256_of(full))

    def local_path(self, save: str, path: str) -> str:
        return self._path(save, path)

    def sweep(self, save: str) -> int:
        """Rule 6: unlink the temporary files of rule 1 under the save (no link followed), then fsync each
        folder that lost one."""
        top, removed = self._path(save), 0
        with _storage("clean", top):
            for folder, dirs, names in os.walk(top):
                dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
                temps = [n for n in names if _TEMP.fullmatch(n)]
                for name in temps:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(folder, name))
                        removed += 1
                if temps:
                    _fsync_dir(folder)
        return removed

    def begin_restore(self, save: str) -> None:
        """Rule 8: the save's folder (and its parents) and the mark in it, each fsynced."""
        top = self._path(save)
        with _storage("mark", top):
            make_dirs(top, within=self.root)
        self.write_small(save, RESTORING_NAME, b"")

    def end_restore(self, save: str) -> None:
        """Rule 8: remove the mark, fsynced (a mark already gone: another restore of the save ended first)."""
        top = self._path(save)
        with _storage("unmark", top):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(top, RESTORING_NAME))
            _fsync_dir(top)

    # -- DurableFiles -------------------------------------------------------------------------------------

    def stored(self, save: str, path: str) -> Stored | None:
        full = self._path(save, path)
        with _storage("read", full):
            try:
                info = os.lstat(full)
            except (FileNotFoundError, NotADirectoryError):
                return None
            if not stat.S_ISREG(info.st_mode):
                return None
            return Stored(info.st_size, sha256_of(full))  # rule 3

    def put(self, local_path: str, save: str, path: str, sha256: str, size: int) -> None:
        def copy(temp: str) -> None:
            if self._bucket is None:
                shutil.copyfile(local_path, temp)
            else:
                self._throttled_copy(local_path, temp)

        problem = self.install(save, path, copy, sha256)
        if problem is not None:
            raise VerificationError(f"cannot copy {local_path!r} to {self._path(save, path)!r}: {problem}")
        if os.lstat(self._path(save, path)).st_size != size:  # the digest already says so; belt and braces
            raise VerificationError(f"cannot copy {local_path!r}: the copy has not {size} bytes")

    def fetch(self, save: str, path: str, local_path: str) -> None:
        with _storage("read", self._path(save, path)):
            shutil.copyfile(self._path(save, path), local_path)

    def read_small(self, save: str, path: str) -> bytes | None:
        with _storage("read", self._path(save, path)):
            try:
                with open(self._path(save, path), "rb") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None
