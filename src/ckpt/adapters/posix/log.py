"""The publication log on a POSIX filesystem: the names in ``<root>/pub/`` (docs/spec/layout.md §2-§3).

Rules:

1. ``pub/`` is only ever opened with ``O_NOFOLLOW|O_DIRECTORY``, and entries are created, listed and removed
   relative to that descriptor: a ``pub/`` that is a symbolic link is refused (reading or writing through it
   would touch files outside the root), and one swapped for a link mid-operation is never followed.
2. ``create`` makes ``pub/<name>`` with ``O_CREAT|O_EXCL|O_NOFOLLOW``, fsyncs the new file, ``pub/`` and the
   root, and only then returns: a created entry survives a power loss. If a step after the create fails,
   the entry is removed again and the failure is raised; docs/adr/0003-publish-durability.md says exactly
   when a failed publish can still leave its entry.
3. Reads trust nothing about listing order and never ``stat`` or ``open`` an entry: one listing of ``pub/``,
   whose ``d_type`` tells a sub-folder or a FIFO (malformed) from a file.
"""

from __future__ import annotations

import errno
import stat
from collections.abc import Generator, Sequence
from contextlib import suppress
from itertools import islice

from ckpt.adapters.posix.syscalls import CREATE_FLAGS, NOFOLLOW_DIR_FLAGS, PosixRoot, reason, storage_error
from ckpt.domain.errors import MalformedError, NotFoundError, StorageError
from ckpt.domain.names import parse_entry_name

__all__ = ["PosixLog"]


class PosixLog:
    """The ``PublicationLog`` port (and ``ScansNameChunks``) over ``<root>/pub/``."""

    __slots__ = ("_at",)

    def __init__(self, at: PosixRoot) -> None:
        self._at = at

    # -- opening pub/ ------------------------------------------------------------------------------------

    def _open_pub(self, *, create: bool) -> int | None:
        """Open ``pub/`` without following a link (rule 1); ``None`` when it is missing and not ``create``."""
        at = self._at
        try:
            return at.sys.open(at.pub, NOFOLLOW_DIR_FLAGS)
        except FileNotFoundError:
            if not create:
                error = at.root_error()
                if error is not None:
                    raise error from None
                return None
        except OSError as exc:
            raise self._pub_error(exc) from exc
        self._make_pub()
        try:
            return at.sys.open(at.pub, NOFOLLOW_DIR_FLAGS)
        except OSError as exc:
            raise self._pub_error(exc) from exc

    def _pub_error(self, exc: OSError) -> StorageError:
        """Explain why ``pub/`` could not be opened: a link, not a folder, a root that is not a folder."""
        at = self._at
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                mode = at.sys.lstat(at.pub).st_mode
            except NotADirectoryError:
                return StorageError(f"root {at.root} is not a directory", location=at.root)
            except OSError:
                mode = None
            if mode is not None and stat.S_ISLNK(mode):
                return StorageError(
                    f"{at.pub} is a symbolic link: refusing to read or write entries through it, "
                    f"as that would touch files outside the root {at.root}",
                    location=at.pub,
                )
            if mode is not None:
                return StorageError(f"{at.pub} is not a directory", location=at.pub)
        return storage_error("open", at.pub, exc)

    def _make_pub(self) -> None:
        at = self._at
        try:
            at.sys.mkdir(at.pub, 0o755)
        except FileExistsError:
            return  # another publisher made it; opening it checks what it is
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise NotFoundError(f"root {at.root} does not exist", location=at.root) from None
            raise storage_error("create", at.pub, exc) from exc
        try:
            at.sync_dir(at.root)
        except OSError as exc:
            raise storage_error("sync the root after creating pub/ in", at.root, exc) from exc

    # -- create ------------------------------------------------------------------------------------------

    def create(self, name: str) -> bool:
        """Create ``pub/<name>`` exclusively and durably (rule 2); False when it was already there."""
        at = self._at
        pub_fd = self._open_pub(create=True)
        assert pub_fd is not None  # create=True never answers "missing"
        path = at.pub + "/" + name
        try:
            try:
                fd = at.sys.open(name, CREATE_FLAGS, 0o644, dir_fd=pub_fd)
            except FileExistsError:
                return False
            except OSError as exc:
                raise storage_error("create the entry", path, exc) from exc
            failed = self._make_durable(fd, pub_fd, path)
            if failed is not None:
                raise self._undo_create(pub_fd, name, path, failed) from failed[1]
        finally:
            at.close_quietly(pub_fd)
        return True

    def _make_durable(self, fd: int, pub_fd: int, path: str) -> tuple[str, OSError] | None:
        """fsync and close the new entry, fsync ``pub/`` and the root; return the failed step, if any."""
        at = self._at
        try:
            at.sys.fsync(fd)
        except OSError as exc:
            at.close_quietly(fd)  # the fsync's error is the one to report
            return f"fsync of {path}", exc
        try:
            at.sys.close(fd)
        except OSError as exc:
            return f"close of {path}", exc
        try:
            at.sys.fsync(pub_fd)
        except OSError as exc:
            return f"sync of {at.pub}", exc
        try:
            at.sync_dir(at.root)
        except OSError as exc:
            return f"sync of {at.root}", exc
        return None

    def _undo_create(self, pub_fd: int, name: str, path: str, failed: tuple[str, OSError]) -> StorageError:
        """Remove the entry we just created (it is ours: created exclusively); return the error to raise."""
        at = self._at
        what, exc = failed
        message = f"cannot make the entry {path} durable: {what} failed: {reason(exc)}"
        try:
            at.sys.unlink(name, dir_fd=pub_fd)
        except FileNotFoundError:
            pass  # a pruner took it meanwhile: it is gone either way
        except OSError as undo_exc:
            # Case 1 of the failed publishes that leave their entry (ADR 0003): say so, plainly.
            save_path = at.path(parse_entry_name(name).save)
            return StorageError(
                f"{message}; removing the entry again failed too ({reason(undo_exc)}), so it may remain "
                f"published: it names the complete save {save_path}, and publishing it again raises "
                "ExistsError if it does",
                location=path,
            )
        else:
            with suppress(OSError):  # the removal stands; only its durability is unknown (ADR 0003)
                at.sys.fsync(pub_fd)
        return StorageError(f"{message}; the entry was removed again", location=path)

    # -- reads -------------------------------------------------------------------------------------------

    def list_names(self) -> list[str]:
        """Return the names in ``pub/``; ``MalformedError`` for anything that is not a plain file (rule 3)."""
        at = self._at
        fd = self._open_pub(create=False)
        if fd is None:
            return []
        try:
            with at.sys.scandir(fd) as it:
                # d_type answers is_file without a stat; anything else is marked "" (no name is empty).
                # Keeping no DirEntry alive past its turn keeps this close to a bare scandir.
                names = [d.name if d.is_file(follow_symlinks=False) else "" for d in it]
            if all(names):
                return names
            # Something in pub/ is not a regular file: list again to name the first such entry.
            with at.sys.scandir(fd) as again:
                odd = [d for d in again if not d.is_file(follow_symlinks=False)]
        except OSError as exc:
            raise storage_error("list", at.pub, exc) from exc
        finally:
            at.close_quietly(fd)
        if not odd:
            return self.list_names()  # gone meanwhile
        d = min(odd, key=lambda x: x.name)
        kind = "a folder" if d.is_dir(follow_symlinks=False) else "not a regular file"
        raise MalformedError(f"malformed entry {at.pub + '/' + d.name!r} in pub/: {kind}", value=d.name)

    def iter_name_chunks(self, size: int) -> Generator[list[str], None, None]:
        """Yield the names in ``pub/`` a chunk at a time, holding no name past its chunk (the fast resolve).

        Anything that is not a plain file raises ``MalformedError`` without detail: ``list_names`` says more.
        """
        at = self._at
        fd = self._open_pub(create=False)
        if fd is None:
            return
        try:
            with at.sys.scandir(fd) as it:
                while chunk := [d.name if d.is_file(follow_symlinks=False) else "" for d in islice(it, size)]:
                    if not all(chunk):
                        raise MalformedError("pub/ holds something that is not an entry file")
                    yield chunk
        except OSError as exc:
            raise storage_error("list", at.pub, exc) from exc
        finally:
            at.close_quietly(fd)

    # -- remove ------------------------------------------------------------------------------------------

    def remove(self, names: Sequence[str]) -> list[str]:
        """Unlink each name relative to ``pub/``, then fsync ``pub/``; return the names that were there."""
        if not names:
            return []
        at = self._at
        pub_fd = self._open_pub(create=False)
        if pub_fd is None:
            return []  # pub/ vanished: every entry is gone
        removed: list[str] = []
        try:
            for name in names:
                try:
                    at.sys.unlink(name, dir_fd=pub_fd)
                except FileNotFoundError:
                    continue  # another pruner took it; it is gone either way
                except OSError as exc:
                    raise storage_error("remove the entry", at.pub + "/" + name, exc) from exc
                removed.append(name)
            if removed:
                try:
                    at.sys.fsync(pub_fd)
                except OSError as exc:
                    raise storage_error("sync", at.pub, exc) from exc
        finally:
            at.close_quietly(pub_fd)
        return removed
