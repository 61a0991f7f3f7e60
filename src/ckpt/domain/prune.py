"""Overlap by path element, and the prune plan (SPEC §4).

Rules:

1. A folder overlaps an entry when the entry names the folder itself, a path inside it, or a path containing
   it. Paths compare by *element*: ``exec/a/ck-1`` neither contains nor is inside ``exec/a/ck-10``.
2. ``plan_prune`` keeps the ``keep`` greatest entries (``keep >= 1``) and removes the rest. The folders of
   removed entries are candidates for removal unless a kept entry overlaps them. A candidate inside another
   candidate is dropped: removing the outer folder removes it.
3. The plan is a value; adapters carry it out, and must re-check candidates against the entries they read
   again after removing entries (:class:`Overlap` makes that check cheap).

Cost: linear in the total number of path elements; no entry is compared with every folder.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ckpt.domain.arguments import require_int, require_items, require_str
from ckpt.domain.entries import Entry, sort_entries
from ckpt.domain.errors import InvalidError

__all__ = ["Overlap", "PrunePlan", "overlaps", "plan_prune"]


def _ancestors(path: str) -> Iterable[str]:
    """Yield the proper ancestors of a slash-separated path, nearest first: a/b/c -> a/b, a."""
    end = path.rfind("/")
    while end > 0:
        yield path[:end]
        end = path.rfind("/", 0, end)


def _has_ancestor_in(path: str, paths: set[str]) -> bool:
    """Return True when a proper ancestor of ``path`` is in ``paths`` (a loop: prune calls this per entry)."""
    end = path.rfind("/")
    while end > 0:
        if path[:end] in paths:
            return True
        end = path.rfind("/", 0, end)
    return False


class Overlap:
    """Answers "does any of these saves overlap this folder?" in time linear in the folder's depth."""

    __slots__ = ("_containing", "_saves")

    def __init__(self, saves: Iterable[str]) -> None:
        self._saves: set[str] = set()
        self._containing: set[str] = set()  # every proper ancestor of every save
        for save in saves:
            if save in self._saves:
                continue
            self._saves.add(save)
            for ancestor in _ancestors(save):
                if ancestor in self._containing:
                    break  # its own ancestors were added with it
                self._containing.add(ancestor)

    def __call__(self, folder: str) -> bool:
        """Return True when a save names ``folder``, a path inside it, or a path containing it."""
        if folder in self._saves or folder in self._containing:
            return True
        return _has_ancestor_in(folder, self._saves)


def overlaps(folder: str, entries: Iterable[Entry]) -> bool:
    """Return True when any entry names ``folder``, a path inside it, or a path containing it.

    >>> overlaps("exec/a/ck-1", [Entry(1, 10, "exec/a/ck-10")])
    False
    >>> overlaps("exec/a", [Entry(1, 10, "exec/a/ck-10")])
    True
    """
    require_str(folder, "folder")
    return Overlap(e.save for e in require_items(entries, Entry, "entries"))(folder)


@attrs.frozen
class PrunePlan:
    """What a prune removes: entries first, then candidate folders, each a save path."""

    keep: tuple[Entry, ...]
    remove: tuple[Entry, ...]
    folders: tuple[str, ...]


def plan_prune(entries: Iterable[Entry], keep: int) -> PrunePlan:
    """Plan a prune that keeps the ``keep`` greatest entries.

    >>> p = plan_prune([Entry(1, 1, "exec/a/ck-1"), Entry(1, 2, "exec/a/ck-2")], keep=1)
    >>> [e.step for e in p.remove], p.folders
    ([1], ('exec/a/ck-1',))
    """
    if require_int(keep, "keep") < 1:
        raise InvalidError(f"keep must be an integer >= 1, got {keep!r}")
    ordered = sort_entries(entries)
    cut = max(len(ordered) - keep, 0)
    remove, kept = ordered[:cut], ordered[cut:]
    needed = Overlap(e.save for e in kept)
    candidates = {save for save in {e.save for e in remove} if not needed(save)}
    # Drop a candidate whose ancestor is also a candidate: the outer removal takes it along.
    folders = sorted(c for c in candidates if not _has_ancestor_in(c, candidates))
    return PrunePlan(keep=tuple(kept), remove=tuple(remove), folders=tuple(folders))
