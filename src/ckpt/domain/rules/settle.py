"""Settle: a complete-looking save is published only once its listing has stopped changing.

Rules:

1. With a settle time ``S > 0``, a save its rule finds complete is complete for the watcher only once its
   listing (every file's path and size; for a single-file save, its name and size) was identical on two
   looks at least ``S`` apart, measured from the *end* of the earlier look to the *start* of the later
   one, with no different listing seen in between. A changed listing restarts the wait from the new look.
2. ``S == 0`` means complete on the first look at a complete save.
3. Settle state (the look since which a save has not changed) is kept by the caller, between scans; a
   verdict without ``since`` means "forget what you kept".

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

import attrs

from ckpt.domain.ports import FileInfo

__all__ = ["Look", "Settled", "settle_verdict"]


@attrs.frozen
class Look:
    """One look at a save's files (paths and sizes) and the clock readings just before and after it."""

    files: tuple[FileInfo, ...]
    started: float
    finished: float


@attrs.frozen
class Settled:
    """Whether a save may be published; if not, why, and (while settling) the look to compare with."""

    reason: str | None
    since: Look | None = None

    @property
    def complete(self) -> bool:
        """True when the save may be published."""
        return self.reason is None


def settle_verdict(reason: str | None, *, settle: float, look: Look | None, since: Look | None) -> Settled:
    """Combine a rule's verdict (``reason``; ``None`` for complete) with settle (rules 1-3).

    ``look`` is this scan's look at the save, needed only when ``settle > 0`` and ``reason`` is ``None``.

    >>> first = Look((FileInfo("a", 1),), started=0.0, finished=0.1)
    >>> settle_verdict(None, settle=5, look=first, since=None).reason
    'not settled: first look at its files'
    >>> settle_verdict(None, settle=5, look=Look(first.files, 5.2, 5.3), since=first).complete
    True
    """
    if reason is not None:
        return Settled(reason)
    if settle <= 0:
        return Settled(None)
    if look is None:
        raise ValueError("judging a settle needs this scan's look at the save")
    if since is None:
        return Settled("not settled: first look at its files", since=look)
    if since.files != look.files:
        return Settled("not settled: its files changed since the last scan", since=look)
    waited = look.started - since.finished
    if waited >= settle:
        return Settled(None)
    return Settled(f"not settled: unchanged for {max(waited, 0.0):.3g}s of {settle:g}s", since=since)
