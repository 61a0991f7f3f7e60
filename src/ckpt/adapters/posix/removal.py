"""Removing a save's folder on POSIX without following any link (docs/spec/operations.md §5.5).

Rules:

1. Never remove through a symbolic link and never leave the file system a folder is on: each folder is
   reached by opening every path element with ``O_NOFOLLOW|O_DIRECTORY`` relative to its parent's descriptor,
   and removed one level at a time without recursion (deep trees are fine), links inside removed as names.
2. Climbing back up through ``..`` checks that each parent is the folder it left; a sub-folder on another
   device (a mount point) stops the removal.
3. A folder that is missing is "already gone"; one that is a link, reached through a link, or not a folder
   is left and the reason returned. Any other failure is a ``StorageError`` naming the folder and, when it
   happened deeper, the path where.
4. Nothing whose ``(st_dev, st_ino)`` is *spared* is entered or unlinked: a folder met inside the save with
   such an identity is a needed save, or holds one, by another path (a bind mount on the same file system,
   which rule 2 cannot see), and stops the removal with ``StorageError`` naming it (docs/spec/operations.md
   §5.11). Folders are compared after the ``fstat`` the walk makes of each anyway; files (a hard link to a
   single-file save) by the inode number the listing already carries and the folder's device. No extra
   system call.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Hashable
from collections.abc import Set as AbstractSet
from typing import NoReturn

from ckpt.adapters.posix.syscalls import NOFOLLOW_DIR_FLAGS, PosixRoot, reason
from ckpt.domain.errors import StorageError
from ckpt.domain.prune import SKIP_ALREADY_GONE

__all__ = ["remove_folder"]

_MOUNT_POINT = "a mount point of another file system (prune never removes files on one)"
_SPARED_FOLDER = (
    "is, or holds, the folder of a remaining entry by another path (a bind mount?); "
    "prune never removes through it"
)
_SPARED_FILE = "is the file of a remaining entry by another path (a hard link); prune never removes it"
_NOTHING_SPARED: frozenset[Hashable] = frozenset()


class _SparedError(OSError):
    """The walk met a folder or file whose identity is spared (rule 4)."""


class _RemovalError(Exception):
    """Removing a folder failed at ``where`` (an absolute path inside it, or the folder itself)."""

    def __init__(self, where: str, error: OSError) -> None:
        super().__init__(where, error)
        self.where = where
        self.error = error


def _check_same_device(at: PosixRoot, parent_fd: int, st: os.stat_result, location: str) -> None:
    """Raise ``_RemovalError`` when the folder ``st`` describes is a mount point (rule 2)."""
    if st.st_dev != at.sys.fstat(parent_fd).st_dev:
        raise _RemovalError(location, OSError(errno.EXDEV, _MOUNT_POINT))


def _check_not_spared(st: os.stat_result, spared: AbstractSet[Hashable], location: str) -> None:
    """Raise ``_RemovalError`` when the single-file save ``st`` describes is spared (rule 4)."""
    if (st.st_dev, st.st_ino) in spared:
        raise _RemovalError(location, _SparedError(errno.EBUSY, _SPARED_FILE))


def _fail(code: int, why: str) -> NoReturn:
    raise OSError(code, why)


def _spared(why: str, name: str | None = None) -> NoReturn:
    raise _SparedError(errno.EBUSY, why, name)


def remove_folder(
    at: PosixRoot, root_fd: int, folder: str, spared: AbstractSet[Hashable] = _NOTHING_SPARED
) -> str | None:
    """Remove ``<root>/<folder>`` without following any link nor entering anything ``spared`` (rule 4);
    return a skip reason, or None if removed."""
    location = at.path(folder)
    *parents, last = folder.split("/")
    fds: list[int] = []
    try:
        parent_fd = root_fd
        for element in parents:
            try:
                parent_fd = at.sys.open(element, NOFOLLOW_DIR_FLAGS, dir_fd=parent_fd)
            except FileNotFoundError:
                return SKIP_ALREADY_GONE
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                if stat.S_ISLNK(at.sys.lstat(element, dir_fd=parent_fd).st_mode):
                    return "is reached through a symbolic link (never removed)"
                return SKIP_ALREADY_GONE  # an ancestor is a file: the folder cannot exist
            fds.append(parent_fd)
        try:
            st = at.sys.lstat(last, dir_fd=parent_fd)
        except FileNotFoundError:
            return SKIP_ALREADY_GONE
        if stat.S_ISLNK(st.st_mode):
            return "is a symbolic link (never removed, nor what it points to)"
        if stat.S_ISREG(st.st_mode):  # a single-file save (ckpt.domain.saves rule 1)
            _check_not_spared(st, spared, location)
            try:
                at.sys.unlink(last, dir_fd=parent_fd)
            except FileNotFoundError:
                return SKIP_ALREADY_GONE
            at.sys.fsync(parent_fd)
            return None
        if not stat.S_ISDIR(st.st_mode):
            return "is neither a folder nor a regular file"
        _check_same_device(at, parent_fd, st, location)
        try:
            _remove_tree(at, parent_fd, last, location, spared)
        except FileNotFoundError:
            return SKIP_ALREADY_GONE
        at.sys.fsync(parent_fd)
    except _RemovalError as exc:
        if isinstance(exc.error, _SparedError):
            raise StorageError(
                f"cannot remove the folder {location}: {exc.where} {reason(exc.error)}", location=location
            ) from exc.error
        where = "" if exc.where == location else f" (at {exc.where})"
        raise StorageError(
            f"cannot remove the folder {location}: {reason(exc.error)}{where}", location=location
        ) from exc.error
    except OSError as exc:
        raise StorageError(f"cannot remove the folder {location}: {reason(exc)}", location=location) from exc
    finally:
        for fd in reversed(fds):
            at.close_quietly(fd)
    return None


def _remove_tree(
    at: PosixRoot, parent_fd: int, name: str, location: str, spared: AbstractSet[Hashable]
) -> None:
    """Remove the folder ``name`` in ``parent_fd`` (at ``location``) and everything in it.

    One level at a time, holding one descriptor below ``parent_fd``, so a tree of any depth is fine. Links
    are removed as names and never followed; a sub-folder on another file system (a mount point) or with
    a spared identity (rule 4) stops the removal before anything in it is removed; climbing back up
    through ``..`` checks that each parent is the folder it left.
    Raises ``FileNotFoundError`` when the folder is already gone, ``_RemovalError`` for anything else.
    """
    fd = at.sys.open(name, NOFOLLOW_DIR_FLAGS, dir_fd=parent_fd)
    # One frame per open level: (name in its parent, (device, inode), sub-folders still to remove).
    levels: list[tuple[str, tuple[int, int], list[str]]] = []
    try:
        top = at.sys.fstat(fd)
        levels.append((name, (top.st_dev, top.st_ino), []))
        if levels[0][1] in spared:
            _spared(_SPARED_FOLDER)
        levels[0][2].extend(_remove_non_folders(at, fd, top.st_dev, spared))
        while True:
            current, _, pending = levels[-1]
            if pending:
                sub = pending.pop()
                try:
                    child = at.sys.open(sub, NOFOLLOW_DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    continue
                at.close_quietly(fd)
                fd = child
                st = at.sys.fstat(fd)
                levels.append((sub, (st.st_dev, st.st_ino), []))
                if st.st_dev != top.st_dev:
                    _fail(errno.EXDEV, _MOUNT_POINT)
                if levels[-1][1] in spared:
                    _spared(_SPARED_FOLDER)
                levels[-1][2].extend(_remove_non_folders(at, fd, st.st_dev, spared))
                continue
            if len(levels) == 1:
                break
            up = at.sys.open("..", NOFOLLOW_DIR_FLAGS, dir_fd=fd)
            at.close_quietly(fd)
            fd = up
            st = at.sys.fstat(fd)
            levels.pop()
            if (st.st_dev, st.st_ino) != levels[-1][1]:
                _fail(errno.ESTALE, "it was moved while it was being removed")
            at.sys.rmdir(current, dir_fd=fd)
    except OSError as exc:
        inside = "/".join([location, *(level[0] for level in levels[1:])])
        if isinstance(exc.filename, str) and exc.filename != "..":
            inside += "/" + exc.filename  # the name inside the folder being emptied
        raise _RemovalError(inside, exc) from exc
    finally:
        at.close_quietly(fd)
    try:
        at.sys.rmdir(name, dir_fd=parent_fd)
    except FileNotFoundError:
        pass  # removed by someone else meanwhile
    except OSError as exc:
        raise _RemovalError(location, exc) from exc


def _remove_non_folders(at: PosixRoot, fd: int, device: int, spared: AbstractSet[Hashable]) -> list[str]:
    """Remove everything but sub-folders from the folder ``fd`` (on ``device``); return the sub-folders'
    names. A file whose identity is spared stops it (rule 4): ``d_ino`` comes with the listing, no call."""
    with at.sys.scandir(fd) as it:
        listing = [(d.name, d.is_dir(follow_symlinks=False), d.inode()) for d in it]
    folders = []
    for entry_name, is_dir, inode in sorted(listing):  # sorted: the same tree is removed in the same order
        if is_dir:
            folders.append(entry_name)
            continue
        if (device, inode) in spared:
            _spared(_SPARED_FILE, entry_name)
        try:
            at.sys.unlink(entry_name, dir_fd=fd)
        except FileNotFoundError:
            continue
    return folders
