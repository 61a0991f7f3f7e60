"""The prune journal on POSIX: ``<root>/.ckpt-prune-<16 hex>`` files and their decisions
``<root>/.ckpt-prune-<16 hex>.decided`` (format: ``ckpt.domain.journal``).

Rules:

1. A journal is created with ``O_EXCL``, written, fsynced, closed, and the root fsynced before prune removes
   anything: a journal that exists after a crash is complete or visibly unfinished (no last line).
2. Journals are found by one listing of the root and read without following links; only regular files whose
   name starts with the prefix count.
3. Dropping a journal unlinks it and fsyncs the root; one another prune dropped first is not an error.
4. A decision is created whole and exclusively: written to ``<journal>.decided.tmp-<16 hex>`` (``O_EXCL``),
   fsynced and closed, then hard-linked to its name (``link`` fails with ``EEXIST`` when another decider
   was first: atomic on local file systems and on NFS alike), the temporary name unlinked and the root
   fsynced. A reader never sees a part of a decision. A temporary name a kill (or a failed unlink) leaves is
   an orphan the next prune drops (``ckpt.domain.journal`` rule 4).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import suppress

from ckpt.adapters.posix.syscalls import CREATE_FLAGS, READ_FLAGS, PosixRoot, storage_error
from ckpt.domain.journal import DECISION_SUFFIX, JOURNAL_PREFIX, TEMPORARY_MARK

__all__ = ["PosixJournal"]


class PosixJournal:
    """The ``PruneJournal`` port over files in the root. Identifiers are the journals' paths."""

    __slots__ = ("_at",)

    def __init__(self, at: PosixRoot) -> None:
        self._at = at

    def _name(self, identifier: str) -> str:
        return identifier.rpartition("/")[2]

    def _path(self, name: str) -> str:
        return self._at.path(name)

    def read_journals(self) -> list[tuple[str, bytes]]:
        """Return every journal in the root as ``(path, content)``, sorted (rule 2)."""
        at = self._at
        root_fd = at.open_root()
        try:
            try:
                with at.sys.scandir(root_fd) as it:
                    names = sorted(
                        d.name
                        for d in it
                        if d.name.startswith(JOURNAL_PREFIX) and d.is_file(follow_symlinks=False)
                    )
            except OSError as exc:
                raise storage_error("list", at.root, exc) from exc
            found = []
            for name in names:
                data = self._read(root_fd, name)
                if data is not None:
                    found.append((self._path(name), data))
            return found
        finally:
            at.close_quietly(root_fd)

    def _read(self, root_fd: int, name: str) -> bytes | None:
        at = self._at
        path = self._path(name)
        try:
            fd = at.sys.open(name, READ_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            return None  # another prune finished it
        except OSError as exc:
            raise storage_error("read the prune journal", path, exc) from exc
        chunks = []
        try:
            while chunk := at.sys.read(fd, 1 << 16):
                chunks.append(chunk)
        except OSError as exc:
            raise storage_error("read the prune journal", path, exc) from exc
        finally:
            at.close_quietly(fd)
        return b"".join(chunks)

    def write_journal(self, data: bytes) -> str:
        """Create a journal holding ``data`` and make it durable (rule 1); return its path."""
        at = self._at
        name = JOURNAL_PREFIX + os.urandom(8).hex()
        path = self._path(name)
        root_fd = at.open_root()
        try:
            self._write_new(root_fd, name, data, "journal", path)
            try:
                at.sys.fsync(root_fd)
            except OSError as exc:
                raise storage_error("write the prune journal", path, exc) from exc
        finally:
            at.close_quietly(root_fd)
        return path

    def create_decision(self, journal: str, data: bytes) -> bool:
        """Create the decision of ``journal`` whole and exclusively (rule 4); False when one was there."""
        at = self._at
        name = self._name(journal) + DECISION_SUFFIX
        path = self._path(name)
        tmp = name + TEMPORARY_MARK + os.urandom(8).hex()
        root_fd = at.open_root()
        try:
            self._write_new(root_fd, tmp, data, "decision", path)
            try:
                at.sys.link(tmp, name, dir_fd=root_fd)
                created = True
            except FileExistsError:
                created = False
            except OSError as exc:
                raise storage_error("create the prune decision", path, exc) from exc
            finally:
                with suppress(OSError):  # a temporary name left is dropped by the next prune (rule 4)
                    at.sys.unlink(tmp, dir_fd=root_fd)
            try:
                at.sys.fsync(root_fd)
            except OSError as exc:
                raise storage_error("sync", at.root, exc) from exc
            return created
        finally:
            at.close_quietly(root_fd)

    def _write_new(self, root_fd: int, name: str, data: bytes, kind: str, path: str) -> None:
        """Create ``name`` in the root exclusively, write ``data``, fsync and close it (``kind``: what it is,
        for messages naming ``path``)."""
        at = self._at
        action = f"write the prune {kind}"
        try:
            fd = at.sys.open(name, CREATE_FLAGS, 0o644, dir_fd=root_fd)
        except OSError as exc:
            raise storage_error(f"create the prune {kind}", path, exc) from exc
        try:
            written = 0
            while written < len(data):
                written += at.sys.write(fd, data[written:])
            at.sys.fsync(fd)
        except OSError as exc:
            at.close_quietly(fd)
            raise storage_error(action, path, exc) from exc
        try:
            at.sys.close(fd)
        except OSError as exc:
            raise storage_error(action, path, exc) from exc

    def journal_exists(self, identifier: str) -> bool:
        """Return True when the journal is still a file in the root (not following a link)."""
        at = self._at
        name = self._name(identifier)
        root_fd = at.open_root()
        try:
            at.sys.lstat(name, dir_fd=root_fd)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error("check the prune journal", self._path(name), exc) from exc
        finally:
            at.close_quietly(root_fd)
        return True

    def drop_journals(self, identifiers: Sequence[str]) -> None:
        """Unlink the journals and fsync the root (rule 3)."""
        if not identifiers:
            return
        at = self._at
        root_fd = at.open_root()
        try:
            for identifier in identifiers:
                name = self._name(identifier)
                try:
                    at.sys.unlink(name, dir_fd=root_fd)
                except FileNotFoundError:
                    continue  # another prune finished it
                except OSError as exc:
                    raise storage_error("remove the prune journal", self._path(name), exc) from exc
            try:
                at.sys.fsync(root_fd)
            except OSError as exc:
                raise storage_error("sync", at.root, exc) from exc
        finally:
            at.close_quietly(root_fd)
