"""Which saves a prune has begun removing: a complete prune journal is a tombstone (docs/spec/layout.md §5.9).

A prune makes its journal durable before it removes any entry (layout.md §5.4) and drops it only once every
folder it lists is removed or skipped (§5.7). So a save that a complete journal's folder names, contains, or
lies inside is *being removed*: its entry may be gone and its files half deleted, yet what is left can still
look complete to a rule (NeMo's marker is an absence; ``hf``'s ``trainer_state.json`` goes late in name
order). The watcher, catch-up and verified resolve ask :class:`Removing` before they hand such a save out.

Rules:

1. The folders of a journal are read by ``ckpt.domain.journal.read_control``: an unfinished journal lists
   nothing, so it makes no tombstone (its prune removed nothing yet). A folder that an entry the journal's
   decision spares overlaps is no tombstone either: that entry is (or is about to be again) published, and
   no prune removes its folder (layout.md §5.10).
2. "Being removed" is overlap by path element (``ckpt.domain.prune.Overlap``): the save equals a listed
   folder, lies inside one, or contains one. ``exec/a/ck-1`` is not touched by a journal listing
   ``exec/a/ck-10``.
3. When several journals list a save, the first in identifier order names it (journals are read sorted).
4. Where the store can tell physical identity (POSIX), a save is also being removed when it physically is,
   lies inside or contains a listed folder, whatever path each names it by (a watcher scanning a linked
   execution folder meets the half-removed save under another spelling): :meth:`Removing.by_identity`
   takes the store's identity chains (``PhysicalOverlap``, operations.md §5.11), once for the journals'
   folders and once per save asked about, only after the lexical rule found no journal.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence

from ckpt.domain.journal import Journal, read_control
from ckpt.domain.prune import Overlap, PhysicalOverlap

__all__ = ["NEVER_REMOVING", "Removing", "being_removed_reason"]


#: What gives the identity chains of save paths (``IdentifiesFolders.physical_chains``).
ChainsOf = Callable[[Sequence[str]], Mapping[str, Sequence[Hashable] | None]]


class Removing:
    """Answers "is this save being removed, and by which journal?" (rules 2 and 3).

    >>> journal = b"ckpt prune journal 1\\nexec/a/ck-1\\nend\\n"
    >>> removing = Removing.of_journals([("/r/.ckpt-prune-0a", journal)])
    >>> [removing.journal_of(save) for save in ("exec/a/ck-1", "exec/a/ck-10", "exec/a")]
    ['/r/.ckpt-prune-0a', None, '/r/.ckpt-prune-0a']
    """

    __slots__ = ("_chain_of", "_folders", "_journals", "_physical")

    def __init__(self, journals: Iterable[tuple[str, Iterable[str]]] = ()) -> None:
        listed = sorted(((name, tuple(folders)) for name, folders in journals), key=lambda j: j[0])
        self._folders = tuple((name, folders) for name, folders in listed if folders)
        self._journals: tuple[tuple[str, Overlap], ...] = tuple(
            (name, Overlap(folders)) for name, folders in self._folders
        )
        self._physical: tuple[tuple[str, PhysicalOverlap], ...] = ()
        self._chain_of: Callable[[str], Sequence[Hashable] | None] | None = None

    def by_identity(self, chains_of: ChainsOf) -> Removing:
        """Return these tombstones judged by physical identity too (rule 4); ``chains_of`` gives the
        identity chains of save paths (``IdentifiesFolders.physical_chains``), and is asked now for every
        listed folder, later for each save asked about."""
        judged = Removing()
        judged._folders, judged._journals = self._folders, self._journals
        if not self._folders:
            return judged
        chains = chains_of(list(dict.fromkeys(f for _, folders in self._folders for f in folders)))
        judged._physical = tuple(
            (name, PhysicalOverlap(chains[f] for f in folders)) for name, folders in self._folders
        )
        judged._chain_of = lambda save: chains_of([save])[save]
        return judged

    @classmethod
    def of_journals(cls, journals: Sequence[tuple[str, bytes]]) -> Removing:
        """Return the tombstones of journals and decisions read as ``(identifier, content)`` (rule 1:
        ``MalformedError`` for a complete journal or a decision that is not well formed, as prune reports
        it)."""
        return cls((j.identifier, _tombstones(j)) for j in read_control(journals)[0])

    def __bool__(self) -> bool:
        """True when some journal lists a folder: only then can any save be being removed."""
        return bool(self._journals)

    def __repr__(self) -> str:
        return f"Removing({[name for name, _ in self._journals]!r})"

    def journal_of(self, save: str) -> str | None:
        """Return the identifier of the first journal whose folders overlap ``save``, else ``None``."""
        for name, overlap in self._journals:
            if overlap(save):
                return name
        if self._chain_of is not None:
            chain = self._chain_of(save)
            for name, physical in self._physical:
                if physical(chain):
                    return name
        return None


def _tombstones(journal: Journal) -> list[str]:
    """The journal's folders that no entry its decision spares overlaps (rule 1)."""
    spared = Overlap(e.save for e in journal.spared)
    return [f for f in journal.folders if not spared(f)]


#: The answer of a store without journals (the in-memory one): nothing is ever being removed.
NEVER_REMOVING = Removing()


def being_removed_reason(journal: str) -> str:
    """Return the reason a save the journal ``journal`` lists is passed over (watcher.md §6.3).

    >>> being_removed_reason("/r/.ckpt-prune-0a")
    'being removed by a prune (/r/.ckpt-prune-0a)'
    """
    return f"being removed by a prune ({journal})"
