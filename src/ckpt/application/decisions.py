"""Deciding a prune journal: the one step prune, a prune taking over, and a pinner share
(``ckpt.domain.journal`` rule 3; docs/spec/layout.md §5.10).

Rules this module keeps:

1. The decider has read the entries and then the pins, in that order, after the journal's entries were
   removed (or found absent); :func:`~ckpt.domain.journal.decide` turns them into the entries removed for
   good, and the decision is created exclusively.
2. When another decider created it first, its decision is read and followed: the journal then has exactly
   one decision, whoever wrote it.
3. A decider that created the decision checks that the journal is still there. If it is gone, another prune
   finished that journal (it drops a journal only after carrying out its decision): the caller acts on none
   of it, and the decision just created is an orphan the next prune drops.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from ckpt.domain.entries import Entry
from ckpt.domain.journal import DECISION_SUFFIX, Journal, decide, format_decision, read_control
from ckpt.domain.ports import PruneJournal

__all__ = ["settle"]


def settle(
    port: PruneJournal, journal: Journal, present: Collection[Entry], pinned: Collection[Entry]
) -> Journal | None:
    """Return ``journal`` with its decision (rules 1, 2), or ``None`` when it is gone (rule 3)."""
    if journal.removed is not None:
        return journal
    removed = decide(journal.content, present, pinned)
    if port.create_decision(journal.identifier, format_decision(removed)):
        if not port.journal_exists(journal.identifier):
            return None
        return attrs.evolve(journal, removed=removed, decision=journal.identifier + DECISION_SUFFIX)
    for found in read_control(port.read_journals())[0]:
        if found.identifier == journal.identifier:
            return found if found.removed is not None else None
    return None
