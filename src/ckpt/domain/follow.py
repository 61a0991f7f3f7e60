"""Following the publication log: which entries of a listing are new, and which of them is the latest
(docs/spec/operations.md, "Follow").

Rules:

1. Each entry is shown once: an entry already seen (in any earlier listing) is not new, even when it vanished
   from a listing in between (a prune removed it and put it back).
2. The new entries of a listing come in log order, ascending by ``(epoch, step, save)``.
3. A new entry is *the latest* when it is the greatest entry of the listing it first appeared in. Any other
   new entry is marked as not the latest: a zombie's late publication at an older epoch, or a save that was
   published and overtaken between two listings.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import attrs

from ckpt.domain.entries import Entry, latest, sort_entries

__all__ = ["Followed", "StopSignal", "new_entries"]


class StopSignal(Protocol):
    """What ends a follow: ``threading.Event`` is one."""

    def is_set(self) -> bool:
        """True once the follow should end."""
        ...

    def wait(self, timeout: float | None = None) -> bool:
        """Wait at most ``timeout`` seconds for the signal; return whether it is set."""
        ...


@attrs.frozen
class Followed:
    """One entry as a follower first sees it: the entry, and whether it was then the latest (rule 3)."""

    entry: Entry
    latest: bool


def new_entries(listing: Iterable[Entry], seen: Iterable[Entry]) -> tuple[Followed, ...]:
    """Return the entries of ``listing`` not in ``seen``, ascending, each marked as the latest or not.

    >>> old, new = Entry(2, 100, "exec/b/ck-100"), Entry(2, 200, "exec/b/ck-200")
    >>> zombie = Entry(1, 900, "exec/a/ck-900")
    >>> [(f.entry.step, f.latest) for f in new_entries([old, zombie, new], seen=[old])]
    [(900, False), (200, True)]
    """
    ordered: Sequence[Entry] = sort_entries(listing)
    greatest = latest(ordered)
    known = set(seen)
    return tuple(Followed(e, e == greatest) for e in ordered if e not in known)
