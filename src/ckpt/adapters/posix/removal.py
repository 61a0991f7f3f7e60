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
"""

from __future__ import annotations

import errno
import os
import stat
from typing import NoReturn

from ckpt.adapters.posix.syscalls import NOFOLLOW_DIR_FLAGS, PosixRoot, reason
from ckpt.domain.errors import StorageError
from ckpt.domain.prune import SKIP_ALREADY_GONE

__all__ = ["remove_folder"]

_MOUNT_POINT = "a mount point of another file system (prune never removes files on one)"


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


def _fail(code: int, why: str) -> NoReturn:
    raise OSError(code, why)


def remove_folder(at: PosixRoot, root_fd: int, folder: str) -> str | None:
    """Remove ``<root>/<folder>`` without following any link; return a skip reason, or None if removed."""
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
            _remove_tree(at, parent_fd, last, location)
        except FileNotFoundError:
            return SKIP_ALREADY_GONE
        at.sys.fsync(parent_fd)
    except _RemovalError as exc:
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


def _remove_tree(at: PosixRoot, parent_fd: int, name: str, location: str) -> None:
    """Remove the folder ``name`` in ``parent_fd`` (at ``location``) and everything in it.

    One level at a time, holding one descriptor below ``parent_fd``, so a tree of any depth is fine. Links
    are removed as names and never followed; a sub-folder on another file system (a mount point) stops
    the removal; climbing back up through ``..`` checks that each parent is the folder it left.
    Raises ``FileNotFoundError`` when the folder is already gone, ``_RemovalError`` for anything else.
    """
    fd = at.sys.open(name, NOFOLLOW_DIR_FLAGS, dir_fd=parent_fd)
    # One frame per open level: (name in its parent, (device, inode), sub-folders still to remove).
    levels: list[tuple[str, tuple[int, int], list[str]]] = []
    try:
        top = at.sys.fstat(fd)
        levels.append((name, (top.st_dev, top.st_ino), _remove_non_folders(at, fd)))
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
                levels[-1][2].extend(_remove_non_folders(at, fd))
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



def _remove_non_folders(at: PosixRoot, fd: int) -> list[str]:
    """Remove everything but sub-folders from the folder ``fd``; return the sub-folders' names."""
    with at.sys.scandir(fd) as it:
        listing = [(d.name, d.is_dir(follow_symlinks=False)) for d in it]
    folders = []
    for entry_name, is_dir in sorted(listing):  # sorted: the same tree is removed in the same order
        if is_dir:
            folders.append(entry_name)
            continue
        try:
            at.sys.unlink(entry_name, dir_fd=fd)
        except FileNotFoundError:
            continue
    return folders
