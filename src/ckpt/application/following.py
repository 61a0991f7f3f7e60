"""``follow``: yield each entry of a store's publication log as it is published (docs/spec/operations.md).

Rules this module keeps:

1. One listing (``entries()``) per interval and nothing else, so a follower of an S3 root with nothing new
   costs one ``ListObjectsV2`` per interval (per 1000 entries). The interval runs from the start of one
   listing to the start of the next; time a consumer spends on a yielded entry counts towards it.
2. What is new in a listing, in which order, and which entry is the latest is decided by the pure
   :func:`ckpt.domain.follow.new_entries`: each entry once, in log order, marked when it is not the latest.
3. By default following starts from *now*, the moment ``follow`` is called: it lists the entries already
   published before it returns, and they are never yielded. With ``from_start`` they are yielded too.
4. Each listing is bounded by ``scan_timeout`` like a watcher's scan: it runs in a daemon worker thread, and
   a store that stops answering ends the follow with ``ScanTimeoutError`` instead of hanging it.
5. ``stop`` (a ``threading.Event``) ends the follow before its next listing: set during a wait, the
   generator returns at once; set during a listing, that listing's new entries are still yielded first.
6. The entries seen are remembered for the life of the generator (an entry removed by a prune and put back
   is not new): memory grows with the number of entries ever published, as one listing does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

from ckpt.application.bounded import call_within
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError
from ckpt.domain.follow import Followed, StopSignal, new_entries
from ckpt.domain.ports import Store

__all__ = ["DEFAULT_INTERVAL", "DEFAULT_SCAN_TIMEOUT", "Followed", "follow"]

DEFAULT_INTERVAL = 10.0
DEFAULT_SCAN_TIMEOUT = 120.0


def _seconds(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidError(f"{what} {value!r} is not a number of seconds")
    if not math.isfinite(value) or value <= 0:
        raise InvalidError(f"{what} {value!r} must be a finite number of seconds > 0")
    return float(value)


def _list_within(store: Store, timeout: float | None) -> list[Entry]:
    """``store.entries()``, given at most ``timeout`` seconds (rule 4)."""
    return call_within(
        store.entries, timeout, what=f"listing the entries of {store.root}", thread_name="ckpt-follow-listing"
    )


def follow(
    store: Store,
    *,
    interval: float = DEFAULT_INTERVAL,
    from_start: bool = False,
    scan_timeout: float | None = DEFAULT_SCAN_TIMEOUT,
    stop: StopSignal | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[Followed]:
    """Return a generator of each entry of ``store`` as it is published, once, as a :class:`Followed`.

    Unless ``from_start``, the entries already published are listed here, before this returns: they are the
    "now" the follow starts from (rule 3), and the next listing is one interval later. ``interval`` is the
    time between listings and ``scan_timeout`` (``None``: none) bounds each listing, in seconds; ``stop``
    ends the generator before its next listing (without one it runs until the consumer closes it). Errors of
    a listing propagate: ``MalformedError``, ``StorageError``, ``ScanTimeoutError``. Invalid arguments raise
    ``InvalidError`` at once.

    >>> import ckpt, tempfile, threading
    >>> store = ckpt.open_store(tempfile.mkdtemp())
    >>> stop = threading.Event()
    >>> stop.set()  # the listing of "now", and no other
    >>> list(follow(store, interval=1, stop=stop))
    []
    """
    wait = _seconds(interval, "interval")
    timeout = None if scan_timeout is None else _seconds(scan_timeout, "scan timeout")
    seen: set[Entry] = set()
    next_at = clock()
    if not from_start:
        seen.update(_list_within(store, timeout))
        next_at += wait
    return _follow(
        store,
        interval=wait,
        timeout=timeout,
        stop=stop or threading.Event(),
        clock=clock,
        seen=seen,
        next_at=next_at,
    )


def _follow(
    store: Store,
    *,
    interval: float,
    timeout: float | None,
    stop: StopSignal,
    clock: Callable[[], float],
    seen: set[Entry],
    next_at: float,
) -> Iterator[Followed]:
    while not stop.wait(max(0.0, next_at - clock())):
        next_at = clock() + interval
        listing = _list_within(store, timeout)
        found = new_entries(listing, seen)
        seen.update(listing)
        yield from found
