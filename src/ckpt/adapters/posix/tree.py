"""The saves on a POSIX filesystem: folders, markers, listings, syncs, removal (docs/spec/layout.md §4).

Rules:

1. Nothing inside a save is followed through a link: listings report links as files with their own size;
   what the watcher reads (``folders``, ``read_file``, ``is_file``) is reached from the root by opening
   every path element with ``O_NOFOLLOW|O_DIRECTORY``, as removal does (:mod:`ckpt.adapters.posix.removal`),
   so never through a link and never outside the root. Only a regular file is a file
   (``ckpt.domain.saves``): it is ``lstat``-ed before it is opened, so a FIFO or a device is never opened,
   and it is read up to the cap.
2. A missing save or folder is an answer (``MISSING``, ``None``, ``[]``), not an error, unless the root
   itself is missing (``NotFoundError``). Only "no such file" (ENOENT, ENOTDIR where an element is a file)
   and, under ``O_NOFOLLOW``, "is a link" (ELOOP) mean absent; any other failure is a ``StorageError``
   naming the path.
3. ``sync_save`` fsyncs every regular file and folder of a save, deepest first, then the save's parent:
   frameworks rename files into place without syncing, and an entry must never outlive its save's content.
4. ``physical_chains`` (``IdentifiesFolders``) resolves each path (``realpath``) and ``stat``-s the result
   and each of its ancestors up to ``/``, once per call for an ancestor many paths share: prune's judge of
   two spellings of one folder (docs/spec/operations.md §5.11). Never a walk of a save's files.
   ``remove_saves_sparing`` removes as ``remove_saves`` does, never entering nor unlinking anything whose
   identity is spared (:mod:`ckpt.adapters.posix.removal` rule 4), at no extra system call.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Hashable, Sequence
from collections.abc import Set as AbstractSet

from ckpt.adapters.posix.syscalls import (
    DIR_FLAGS,
    NOFOLLOW_DIR_FLAGS,
    READ_FLAGS,
    PosixRoot,
    reason,
    storage_error,
)
from ckpt.domain.errors import StorageError
from ckpt.domain.ports import FileInfo, SaveRemoval
from ckpt.domain.saves import SaveKind, too_large

__all__ = ["PosixTree"]

_MISSING = (FileNotFoundError, NotADirectoryError)
# What an O_NOFOLLOW walk reads as "nothing there": no such name, an element that is a file, a link.
_ABSENT = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


class PosixTree:
    """The ``SaveTree`` port (and ``SyncsSaves``, ``IdentifiesFolders``) over the folders under the root."""

    __slots__ = ("_at",)

    def __init__(self, at: PosixRoot) -> None:
        self._at = at

    def kind(self, save: str) -> SaveKind:
        """Return what the save path holds (following a link to the save itself, as a user's path would)."""
        at = self._at
        path = at.path(save)
        try:
            mode = at.sys.stat(path).st_mode
        except _MISSING:
            error = at.root_error()
            if error is not None:
                raise error from None
            return SaveKind.MISSING
        except OSError as exc:
            raise storage_error("inspect the save", path, exc) from exc
        if stat.S_ISDIR(mode):
            return SaveKind.FOLDER
        return SaveKind.FILE if stat.S_ISREG(mode) else SaveKind.OTHER

    def _open_inside(self, elements: list[str], where: str) -> int | None:
        """Open ``<root>/<elements...>`` as a folder, every element with ``O_NOFOLLOW`` (rule 1).

        ``None`` when an element is missing, a file or a link; ``NotFoundError`` when the root is missing,
        ``StorageError`` for any other failure, naming ``where``.
        """
        at = self._at
        try:
            fd = at.sys.open(at.root, DIR_FLAGS)
        except OSError as exc:
            raise at.root_error() or storage_error("open the root", at.root, exc) from None
        for element in elements:
            try:
                child = at.sys.open(element, NOFOLLOW_DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                at.close_quietly(fd)
                if exc.errno in _ABSENT:
                    return None
                raise storage_error("open", where, exc) from exc
            at.close_quietly(fd)
            fd = child
        return fd

    def folders(self, path: str) -> list[str] | None:
        """Return the names of the folders directly inside ``path`` (links are not folders; rule 1)."""
        at = self._at
        base = at.path(path)
        fd = self._open_inside(path.split("/") if path else [], base)
        if fd is None:
            return None
        try:
            with at.sys.scandir(fd) as it:
                return [d.name for d in it if d.is_dir(follow_symlinks=False)]
        except OSError as exc:
            raise storage_error("list", base, exc) from exc
        finally:
            at.close_quietly(fd)

    def _parent_of(self, save: str, name: str) -> tuple[int, str, str] | None:
        """Open the folder holding file ``name`` of the save; return it, the file's last element and path."""
        *folders, last = f"{save}/{name}".split("/")
        path = self._at.path(f"{save}/{name}")
        parent = self._open_inside(folders, path)
        return None if parent is None else (parent, last, path)

    def read_file(self, save: str, name: str, limit: int) -> bytes | None:
        """Return the content of the regular file ``name`` in the save, at most ``limit`` bytes (rule 1)."""
        at = self._at
        found = self._parent_of(save, name)
        if found is None:
            return None
        parent, last, path = found
        try:
            try:
                if not stat.S_ISREG(at.sys.lstat(last, dir_fd=parent).st_mode):
                    return None  # a folder, a link, a FIFO, a device: not a file (never opened)
                fd = at.sys.open(last, READ_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno in _ABSENT:
                    return None
                raise storage_error("read", path, exc) from exc
        finally:
            at.close_quietly(parent)
        chunks = []
        total = 0
        try:
            st = at.sys.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return None  # swapped for something else between the lstat and the open
            if st.st_size > limit:
                raise too_large(path, st.st_size)
            while chunk := at.sys.read(fd, min(1 << 20, limit + 1 - total)):
                chunks.append(chunk)
                total += len(chunk)
                if total > limit:  # it grew while we read
                    raise too_large(path)
        except StorageError:
            raise  # ours already (too large): an OSError too, so it must not be wrapped again
        except OSError as exc:
            raise storage_error("read", path, exc) from exc
        finally:
            at.close_quietly(fd)
        return b"".join(chunks)

    def is_file(self, save: str, name: str) -> bool:
        """Return True when ``name`` inside the save is a regular file (a link or a folder is not; rule 1)."""
        at = self._at
        found = self._parent_of(save, name)
        if found is None:
            return False
        parent, last, path = found
        try:
            mode = at.sys.lstat(last, dir_fd=parent).st_mode
        except OSError as exc:
            if exc.errno in _ABSENT:
                return False
            raise storage_error("check", path, exc) from exc
        finally:
            at.close_quietly(parent)
        return stat.S_ISREG(mode)

    def _walk(self, top: str) -> list[tuple[str, list[os.DirEntry[str]]]]:
        """List the tree at ``top``: (folder, its entries that are not folders), every folder after its own.

        Links are entries like files: never followed, so a link loop or a link out of the save is harmless.
        """
        found: list[tuple[str, list[os.DirEntry[str]]]] = []
        pending = [top]
        while pending:
            path = pending.pop()
            others = []
            try:
                listing = self._at.sys.scandir(path)
            except FileNotFoundError:
                if path == top:
                    raise
                continue  # a sub-folder vanished while we walked (renamed into place): it is not there now
            with listing as it:
                for d in it:
                    if d.is_dir(follow_symlinks=False):
                        pending.append(d.path)
                    else:
                        others.append(d)
            found.append((path, others))
        found.reverse()
        return found

    def files(self, save: str) -> list[FileInfo]:
        """Return every entry inside the save that is not a folder, recursively, with its size, by path."""
        out: list[FileInfo] = []
        base = self._at.path(save)
        try:
            for dirpath, others in self._walk(base):
                rel = dirpath[len(base) + 1 :]
                for d in others:
                    try:
                        size = self._at.sys.lstat(d.path).st_size
                    except FileNotFoundError:
                        # Renamed or removed since the listing: it is not part of the save now. Returning an
                        # empty listing here instead would make two looks at a changing save compare equal.
                        continue
                    out.append(FileInfo(f"{rel}/{d.name}" if rel else d.name, size))
        except FileNotFoundError:
            return []  # the save itself is gone
        except OSError as exc:
            raise storage_error("list", base, exc) from exc
        return sorted(out, key=lambda f: f.path)

    def sync_save(self, save: str) -> None:
        """fsync every regular file and folder of the save, deepest first, then its parent (rule 3).

        Links, FIFOs, sockets and devices are neither opened nor followed. A save that is not there is left
        to publish to report.
        """
        at = self._at
        base = at.path(save)
        try:
            try:
                if stat.S_ISREG(at.sys.lstat(base).st_mode):  # a single-file save: the file, then its folder
                    fd = at.sys.open(base, READ_FLAGS)
                    try:
                        at.sys.fsync(fd)
                    finally:
                        at.close_quietly(fd)
                    at.sync_dir(os.path.dirname(base))
                    return
                walked = self._walk(base)
            except FileNotFoundError:
                return  # nothing there: publish reports it
            for dirpath, others in walked:
                for d in others:
                    if not d.is_file(follow_symlinks=False):
                        continue
                    fd = at.sys.open(d.path, READ_FLAGS)
                    try:
                        at.sys.fsync(fd)
                    finally:
                        at.close_quietly(fd)
                at.sync_dir(dirpath)
            parent = os.path.dirname(base)
            if parent:
                at.sync_dir(parent)
        except OSError as exc:
            raise storage_error("sync the save", base, exc) from exc

    def physical_chains(self, saves: Sequence[str]) -> dict[str, tuple[Hashable, ...] | None]:
        """Return each save path's ``(st_dev, st_ino)`` chain: its resolved path's, then each ancestor's up
        to ``/``; ``None`` when the path does not resolve (rule 4)."""
        at = self._at
        known: dict[str, tuple[int, int] | None] = {}  # resolved path -> identity, for this call only
        chains: dict[str, tuple[Hashable, ...] | None] = {}
        for save in saves:
            path = at.path(save)
            try:
                current = at.sys.realpath(path)
            except OSError as exc:
                if exc.errno not in _ABSENT:
                    raise StorageError(
                        f"cannot identify the folder {path}: {reason(exc)}", location=path
                    ) from exc
                error = at.root_error()
                if error is not None:
                    raise error from None
                chains[save] = None
                continue
            chain: list[tuple[int, int]] | None = []
            while chain is not None:
                if current not in known:
                    known[current] = self._identity(current, path)
                identity = known[current]
                if identity is None:
                    chain = None  # it vanished meanwhile: it does not exist now
                    break
                chain.append(identity)
                parent = os.path.dirname(current)
                if parent == current:
                    break
                current = parent
            chains[save] = None if chain is None else tuple(chain)
        return chains

    def _identity(self, resolved: str, path: str) -> tuple[int, int] | None:
        """``(st_dev, st_ino)`` of ``resolved`` (an ancestor of what ``path`` resolves to); None if gone."""
        try:
            st = self._at.sys.stat(resolved)
        except OSError as exc:
            if exc.errno in _ABSENT:
                return None
            where = "" if resolved == path else f" (at {resolved})"
            raise StorageError(
                f"cannot identify the folder {path}: {reason(exc)}{where}", location=path
            ) from exc
        return (st.st_dev, st.st_ino)

    def remove_saves(self, saves: Sequence[str]) -> list[SaveRemoval]:
        """Remove each save's folder relative to one descriptor of the root, never through a link."""
        return self.remove_saves_sparing(saves, frozenset())

    def remove_saves_sparing(self, saves: Sequence[str], spared: AbstractSet[Hashable]) -> list[SaveRemoval]:
        """Remove each save's folder as ``remove_saves`` does, never entering nor unlinking what has a
        ``(st_dev, st_ino)`` in ``spared`` (rule 4)."""
        from ckpt.adapters.posix.removal import remove_folder  # only a prune removes: not at start-up

        at = self._at
        root_fd = at.open_root()
        try:
            return [SaveRemoval(save, remove_folder(at, root_fd, save, spared)) for save in saves]
        finally:
            at.close_quietly(root_fd)
