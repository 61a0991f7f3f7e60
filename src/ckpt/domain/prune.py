"""Overlap by path element, and the prune plan (docs/spec/operations.md §5).

Rules:

1. A folder overlaps an entry when the entry names the folder itself, a path inside it, or a path containing
   it. Paths compare by *element*: ``exec/a/ck-1`` neither contains nor is inside ``exec/a/ck-10``.
2. ``plan_prune`` keeps the ``keep`` greatest entries (``keep >= 1``) and removes the rest. The folders of
   removed entries are candidates for removal unless a kept entry overlaps them. A candidate inside another
   candidate is dropped: removing the outer folder removes it.
3. The plan is a value; the application carries it out. Folders an earlier, failed prune recorded in its
   journal join the plan unless a kept entry needs them (:func:`leftover_folders`).
4. After removing entries the application reads the entries again and re-checks every folder against them
   (:func:`recheck_folders`): a folder an entry now needs is not removed, and when it was planned by this
   prune it is reported skipped as "named by an entry published during the prune". A folder inside another
   folder being removed is left to that removal. Stores report the other skip reasons
   (:data:`SKIP_ALREADY_GONE`, and their own, such as a symbolic link on POSIX).
5. Paths compare as text, but one folder can have several spellings (a linked execution folder, a linked
   save, a bind mount). Where the store can tell a folder's physical identity, a candidate is also kept
   when it *physically* is, contains or lies inside a needed save (:class:`PhysicalOverlap`, over opaque
   identity chains: a path's own identity, then its parent's, up to the top), and is reported skipped as
   :data:`SKIP_ANOTHER_PATH`; :func:`recheck_folders` takes that judgement as ``also_needed``. The same
   needed chains also guard the removal itself: a folder met *inside* a candidate whose identity is in one
   of them (:attr:`PhysicalOverlap.identities`) is a needed save, or holds one, by another path (a bind
   mount), and the store never removes through it.

Cost: linear in the total number of path elements; no entry is compared with every folder.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence

import attrs

from ckpt.domain.arguments import require_int, require_items, require_str
from ckpt.domain.entries import Entry, sort_entries
from ckpt.domain.errors import InvalidError

__all__ = [
    "SKIP_ALREADY_GONE",
    "SKIP_ANOTHER_PATH",
    "SKIP_PUBLISHED_DURING_PRUNE",
    "FolderCheck",
    "Overlap",
    "PhysicalOverlap",
    "PrunePlan",
    "leftover_folders",
    "overlaps",
    "plan_prune",
    "recheck_folders",
]

#: The skip reason of a planned folder that an entry published while the prune ran names (rule 4).
SKIP_PUBLISHED_DURING_PRUNE = "named by an entry published during the prune"
#: The skip reason of a folder that no longer exists when prune comes to remove it.
SKIP_ALREADY_GONE = "already gone"
#: The skip reason of a candidate a needed save reaches by another spelling (rule 5).
SKIP_ANOTHER_PATH = "is the folder of a remaining entry by another path (never removed)"


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


class PhysicalOverlap:
    """Answers "is this folder physically one of these saves, inside one, or containing one?" (rule 5).

    A *chain* is a path's physical identity followed by each ancestor's, nearest first, up to the top (on
    POSIX the ``(st_dev, st_ino)`` of the resolved path and of each of its parents). Identities are opaque
    and only compared for equality. A folder overlaps when its own identity is in a needed save's chain (it
    is or contains the save) or any identity in its chain is a needed save's own (it lies inside the save).
    A path with no chain (it does not exist) overlaps nothing here; the lexical rules still apply.

    >>> needed = PhysicalOverlap([("ck-5", "real", "exec", "/")])
    >>> needed(("ck-5", "real", "exec", "/")), needed(("real", "exec", "/")), needed(("sub", "ck-5", "real"))
    (True, True, True)
    >>> needed(("ck-6", "real", "exec", "/")), needed(None)
    (False, False)
    >>> sorted(needed.identities)
    ['/', 'ck-5', 'exec', 'real']
    """

    __slots__ = ("_chained", "_own")

    def __init__(self, chains: Iterable[Sequence[Hashable] | None]) -> None:
        self._own: set[Hashable] = set()  # each needed save's own identity
        self._chained: set[Hashable] = set()  # every identity in every needed chain
        for chain in chains:
            if chain:
                self._own.add(chain[0])
                self._chained.update(chain)

    def __call__(self, chain: Sequence[Hashable] | None) -> bool:
        """Return True when the folder whose chain this is is, contains, or lies inside a needed save."""
        if not chain:
            return False
        return chain[0] in self._chained or any(identity in self._own for identity in chain)

    @property
    def identities(self) -> frozenset[Hashable]:
        """Every identity in a needed chain: each needed save's own and each of its ancestors'.

        What a removal must never enter: a folder (or a file, for a single-file save) found *inside* a
        candidate with one of these identities is, or holds, a needed save reached by another path, since
        a candidate that physically holds a needed save was kept by :meth:`__call__` (rule 5).
        """
        return frozenset(self._chained)


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


def leftover_folders(plan: PrunePlan, journal_folders: Iterable[str]) -> tuple[str, ...]:
    """Return the folders earlier prunes' journals list that this prune should finish (rule 3), sorted.

    A folder this plan already holds, or one a kept entry overlaps, is not a leftover.

    >>> plan = plan_prune([Entry(1, 1, "exec/a/ck-1"), Entry(1, 2, "exec/a/ck-2")], keep=1)
    >>> leftover_folders(plan, ["exec/a/ck-1", "exec/a/ck-0", "exec/a"])
    ('exec/a/ck-0',)
    """
    kept = Overlap(e.save for e in plan.keep)
    planned = set(plan.folders)
    return tuple(sorted({f for f in journal_folders if f not in planned and not kept(f)}))


@attrs.frozen
class FolderCheck:
    """The outcome of the re-check: folders to remove (sorted, none inside another) and planned folders
    skipped, each with its reason, as ``(folder, reason)``."""

    remove: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]


def recheck_folders(
    planned: Iterable[str],
    left: Iterable[str],
    saves: Iterable[str],
    also_needed: Callable[[str], bool] | None = None,
) -> FolderCheck:
    """Re-check the planned and leftover folders against the saves of the entries read again (rule 4).

    ``also_needed`` judges a folder no save names as text (rule 5): a folder it keeps, planned or
    leftover, is skipped as :data:`SKIP_ANOTHER_PATH`.

    >>> check = recheck_folders(["exec/a/ck-1", "exec/a/ck-2"], ["exec/b"], ["exec/a/ck-2"])
    >>> check.remove, [folder for folder, _ in check.skipped]
    (('exec/a/ck-1', 'exec/b'), ['exec/a/ck-2'])
    >>> recheck_folders(["exec/a/ck-1"], [], [], also_needed=lambda folder: True).skipped
    (('exec/a/ck-1', 'is the folder of a remaining entry by another path (never removed)'),)
    """
    needed = Overlap(saves)
    planned_set = set(planned)
    remove: list[str] = []
    skipped: list[tuple[str, str]] = []
    for folder in sorted({*planned_set, *left}):
        if not needed(folder):
            if also_needed is not None and also_needed(folder):
                skipped.append((folder, SKIP_ANOTHER_PATH))
            else:
                remove.append(folder)
        elif folder in planned_set:
            skipped.append((folder, SKIP_PUBLISHED_DURING_PRUNE))
        # else: a leftover an entry needs again is simply no longer a candidate
    chosen = set(remove)
    return FolderCheck(tuple(f for f in remove if not _has_ancestor_in(f, chosen)), tuple(skipped))
