"""The watcher: publishes one execution's complete saves as a framework writes them (docs/spec/watcher.md).

Rules this module keeps (docs/adr/0008-watcher.md says why):

1. A scan lists the saves location once (its folders and files, through
   ``ckpt.application.inspection.saves_reader``), keeps the names that are saves under the framework's rule
   (``ckpt.domain.rules``: built in, configured or a plugin), and looks, in step order, at those this watcher
   has not published yet. A complete save is synced (``sync_save``, found through the ``SyncsSaves`` protocol:
   POSIX fsyncs it, our other stores only check the location, an embedder's store may have none) and then
   published; an incomplete one is passed over and looked at again next scan.
2. Published saves are never read again. The watcher keeps their locations in memory; a new watcher learns
   them by reading ``entries()`` once, in its first scan, keeping the entries of its own epoch. So a scan
   over any number of already-published saves with nothing new costs one listing of the saves location
   (one S3 request per 1,000 names). An ``ExistsError`` (another watcher got there first) also counts as
   published.
3. Exactly once under kill and restart follows from (2) and the store's exclusive create: an entry either
   exists, and the restarted watcher reads it, or it does not, and the save is published again once.
4. Settle state (the first look since which a save's listing has not changed) lives in memory only; a
   restarted watcher starts settling afresh, which costs time, never correctness. Settle applies to ``hf``
   only: a ``dcp`` save is published on the first scan that sees its ``.metadata``.
5. ``watch`` runs each scan in a daemon worker thread and waits for it at most the scan timeout, so a store
   that accepts a connection and never answers ends the watch with ``ScanTimeoutError`` instead of hanging
   it, and the stuck thread does not keep the process alive. A watcher whose scan timed out is spent: it
   publishes nothing more, and a later ``scan`` raises ``ScanTimeoutError`` while the old one is stuck.
6. On stop, ``watch`` scans once more, then keeps scanning, for at most the settle time after that scan,
   while some save is on its way (settling, or waiting for the marker of a rule that never settles); then
   it returns.
7. The first scan that sees names that look like saves of another rule but are no save of this one (a
   ``checkpoint-5`` folder under ``dcp``) says so once, at warning level, naming one and the rule that would
   take it: otherwise a user whose framework name is wrong sees "published 0 saves" and nothing else.
8. Every scan that ends, or fails, or times out is reported to the ``observer`` (a :class:`WatchObserver`,
   such as the metrics of ``ckpt watch --metrics-port``) as one :class:`ScanReport`, after the scan and
   from the thread that ran it; a timed-out scan is reported by the waiting thread. The watcher knows
   nothing of how reports are exported; an observer must not raise (what it raises ends the scan's caller).
9. A save a prune has begun removing is never published again (docs/spec/watcher.md §4.6). After a save is
   judged complete and before it is published, the scan asks the store which saves the prune journals
   list (``KnowsRemovals.removing``; once per scan, and only in a scan that has something to publish, so
   a scan with nothing new still costs one listing). Such a save is passed over with one warning and never
   looked at again by this watcher: its prune removes it, or it was published meanwhile by someone else.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import attrs

from ckpt.application.bounded import call_within
from ckpt.application.inspection import TreeReader, judge_for_watch, saves_reader
from ckpt.application.rulebook import as_rule
from ckpt.domain.arguments import require_instance
from ckpt.domain.entries import MAX_U64, Entry
from ckpt.domain.errors import ExistsError, InvalidError, NotFoundError, SaveNotFoundError, ScanTimeoutError
from ckpt.domain.frameworks import Framework, validate_world_size
from ckpt.domain.ports import KnowsRemovals, Store, SyncsSaves, WatchStore
from ckpt.domain.removing import Removing
from ckpt.domain.rules import BUILTIN, Item, Rule, Save, builtin_rule, unclaimed_save
from ckpt.domain.rules.settle import Look

__all__ = ["ScanReport", "WatchObserver", "Watcher"]

_log = logging.getLogger("ckpt.watcher")


def _seconds(value: float, what: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidError(f"{what} {value!r} is not a number of seconds")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidError(f"{what} {value!r} must be a finite number of seconds {bound}")
    return float(value)


def _key(location: str) -> str:
    return location.rstrip("/")


@attrs.frozen
class ScanReport:
    """What one scan did (rule 8).

    ``duration`` is the scan's time in seconds on the watcher's clock; ``created`` the entries it published,
    in step order; ``waiting`` how many save folders it found that are still not published (settling,
    incomplete, or without ``.metadata``); ``error`` the type name of the error that ended it (for a timeout
    ``ScanTimeoutError``), ``None`` when it succeeded. A failed scan may still have published entries first.
    """

    duration: float
    created: tuple[Entry, ...] = ()
    waiting: int = 0
    error: str | None = None

    @property
    def succeeded(self) -> bool:
        return self.error is None


@runtime_checkable
class WatchObserver(Protocol):
    """Receives a :class:`ScanReport` for every scan of a :class:`Watcher` (rule 8)."""

    def scanned(self, report: ScanReport) -> None:
        """Take note of one scan; called from the thread that ran it, so it must be thread-safe."""
        ...


class Watcher:
    """Publishes the complete saves a framework writes into ``saves_location``, at ``epoch``.

    ``store`` is any :class:`~ckpt.domain.ports.WatchStore`; ``framework`` a rule
    (``ckpt.application.rulebook.find_rule`` finds one by name) or a :class:`Framework`; ``saves_location``
    the folder the framework saves into, in the store's own form (normally ``store.exec_dir(attempt)``).
    ``interval`` is the time between scans in :meth:`watch`; ``settle`` (default: the rule's, e.g. one
    interval for ``hf``, 0 for ``dcp``) how long a save's listing must stay unchanged (a rule may ignore it:
    ``dcp`` does) and how long the drain after a stop may last; ``world_size`` (``None``: unknown) builds the
    rule of a :class:`Framework` (a rule object already carries its own); ``scan_timeout`` (``None``: none)
    bounds each scan in :meth:`watch`; ``on_published`` is called with each entry a scan creates, in step
    order, from the thread that runs the scan; ``observer`` receives a :class:`ScanReport` after every scan
    (rule 8). ``clock`` is a monotonic clock in seconds (tests pass a fake one to :meth:`scan`).
    """

    def __init__(
        self,
        store: WatchStore,
        framework: Framework | Rule,
        saves_location: str,
        epoch: int,
        interval: float,
        *,
        settle: float | None = None,
        scan_timeout: float | None = None,
        world_size: int | None = None,
        on_published: Callable[[Entry], None] | None = None,
        observer: WatchObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        require_instance(store, Store, "store")
        self.world_size = None if world_size is None else validate_world_size(world_size)
        rule = as_rule(framework, self.world_size)
        if observer is not None:
            require_instance(observer, WatchObserver, "observer")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_U64:
            raise InvalidError(f"epoch {epoch!r} is not an unsigned 64-bit integer")
        if not isinstance(saves_location, str) or not saves_location:
            raise InvalidError(f"saves location {saves_location!r} must be a non-empty location")
        self.store = store
        self.rule = rule
        self.framework = rule.name
        self.saves_location = saves_location
        self.epoch = epoch
        self.interval = _seconds(interval, "interval", allow_zero=False)
        given = None if settle is None else _seconds(settle, "settle time", allow_zero=True)
        #: How long a complete-looking save must stay unchanged (the rule may ignore a given time).
        self.judge_settle = _seconds(rule.settle_time(self.interval, given), "settle time", allow_zero=True)
        #: How long the drain after a stop may last: the given time, else the rule's own.
        self.settle = self.judge_settle if given is None else given
        self.scan_timeout = (
            None if scan_timeout is None else _seconds(scan_timeout, "scan timeout", allow_zero=False)
        )
        self.on_published = on_published
        self.observer = observer
        self.clock = clock
        self._published: set[str] | None = None  # locations published at our epoch; None until learned
        self._settling: dict[str, Look] = {}  # location -> first look since which nothing changed
        self._outstanding: set[str] = set()  # saves seen incomplete in the last scan (rule 6)
        self._hinted = False  # the "looks like another framework's saves" warning was given (rule 7)
        self._waiting = 0  # saves the last complete scan found unpublished (rule 8)
        self._scan_lock = threading.Lock()
        self._spent = False  # a scan timed out: publish nothing more (rule 5)
        self._removing: Removing | None = None  # this scan's reading of the prune journals (rule 9)
        self._passed_over: set[str] = set()  # saves found being removed by a prune, never looked at again

    def __repr__(self) -> str:
        return (
            f"Watcher({self.store!r}, {self.framework}, {self.saves_location!r}, epoch={self.epoch}, "
            f"interval={self.interval:g}, settle={self.settle:g}, scan_timeout={self.scan_timeout}, "
            f"world_size={self.world_size})"
        )

    # -- one scan ----------------------------------------------------------------------------------------

    def scan(self) -> list[Entry]:
        """Publish, in step order, every complete save not yet published here; return the entries created.

        An entry that already exists counts as published; an incomplete save is passed over. Store errors
        propagate (the settle state and what was published before the error are kept). A save that vanishes
        between its check and its publication (a framework's retention) is passed over with a warning.
        """
        if not self._scan_lock.acquire(blocking=False):
            raise ScanTimeoutError("a previous scan of this watcher is still running (it timed out)")
        try:
            if self._spent:
                raise ScanTimeoutError("this watcher's scan timed out before; start a new watcher")
            started = self.clock()
            created: list[Entry] = []
            try:
                self._scan(created)
            except Exception as exc:
                self._report(started, created, error=type(exc).__name__)
                raise
            self._report(started, created, error=None)
            return created
        finally:
            self._scan_lock.release()

    def _report(self, started: float, created: list[Entry], *, error: str | None) -> None:
        if self.observer is not None:
            duration = max(0.0, self.clock() - started)
            self.observer.scanned(ScanReport(duration, tuple(created), self._waiting, error))

    def _learn_published(self) -> set[str]:
        if self._published is None:
            self._published = {
                _key(self.store.location(entry))
                for entry in self.store.entries()
                if entry.epoch == self.epoch
            }
        return self._published

    def _scan(self, created: list[Entry]) -> None:
        """Scan once, appending each entry created to ``created`` as it is created."""
        published = self._learn_published()
        base = _key(self.saves_location)
        reader = saves_reader(self.store, base)
        items = reader.items()
        seen: set[str] = set()
        self._outstanding = set()
        self._removing = None  # read again, if needed, by this scan (rule 9)
        for save in self.rule.saves(items):
            location = f"{base}/{save.name}"
            if location in published or location in self._passed_over:
                continue
            seen.add(location)
            complete = self._is_complete(save, location, items, reader)
            if complete and self._publish(save.step, location, created):
                published.add(location)
        if not self._hinted:  # after the publications: building the other rules must not delay them
            self._hint(items)
        # Forget the settle state of saves that are gone or were published.
        self._settling = {
            loc: look for loc, look in self._settling.items() if loc in seen and loc not in published
        }
        self._waiting = len(seen - published - self._passed_over)

    def _hint(self, items: list[Item]) -> None:
        """Warn once about names another rule would take (rule 7)."""
        others = [r for name in BUILTIN if (r := builtin_rule(name)) is not None]
        hint = unclaimed_save(self.rule, others, items)
        if hint is not None:
            self._hinted = True
            _log.warning("%s: %s", self.saves_location, hint.message(self.rule))

    def _is_complete(self, save: Save, location: str, items: list[Item], reader: TreeReader) -> bool:
        verdict = judge_for_watch(
            self.rule,
            save,
            items,
            reader,
            settle=self.judge_settle,
            since=self._settling.get(location),
            clock=self.clock,
        )
        if verdict.since is None:
            self._settling.pop(location, None)
        else:
            self._settling[location] = verdict.since
        if not verdict.complete and verdict.since is None and self.judge_settle == 0:
            # A rule whose markers alone decide (dcp, megatron, orbax, ...): the save is on its way until its
            # marker comes; the drain waits for it at most the settle time (rule 6), 0 unless one was given.
            self._outstanding.add(location)
        if not verdict.complete:
            _log.debug("not yet: %s: %s", location, verdict.reason)
        return verdict.complete

    def _being_removed(self, location: str) -> bool:
        """True when a prune has begun removing the save at ``location`` (rule 9); warns once, and the save
        is never looked at again. The journals are read at most once per scan, after the save was judged."""
        store = self.store
        if not isinstance(store, KnowsRemovals):  # every store of ours; an embedder's may not know
            return False
        if self._removing is None:
            self._removing = store.removing()
        if not self._removing:
            return False
        journal = self._removing.journal_of(store.save_of(location))
        if journal is None:
            return False
        self._passed_over.add(location)
        self._settling.pop(location, None)
        self._outstanding.discard(location)
        _log.warning("not publishing %s: a prune has begun removing it (%s)", location, journal)
        return True

    def _publish(self, step: int, location: str, created: list[Entry]) -> bool:
        """Sync and publish one complete save; return True when it is now published (by us or before).

        A save a prune has begun removing is passed over (rule 9). The journals are read after the save was
        judged complete: a prune writes its journal before it removes the entry and drops it only once the
        folder is gone, so finding none means either that prune's entry removal and re-read come later (an
        entry created now protects the folder) or the folder is gone (``publish`` finds no save).
        """
        if self._spent:
            raise ScanTimeoutError("this watcher's scan timed out; it publishes nothing more")
        if self._being_removed(location):
            return False
        try:
            if isinstance(self.store, SyncsSaves):  # every store of ours; an embedder's may have none
                self.store.sync_save(location)
            entry = self.store.publish(self.epoch, step, location)
        except ExistsError:
            return True
        except (NotFoundError, SaveNotFoundError):
            # Deleted between the check and now (e.g. the Trainer's save_total_limit). If the root itself
            # is gone, the next listing says so and ends the watch.
            _log.warning("save vanished before it could be published: %s", location)
            return False
        created.append(entry)
        if self.on_published is not None:
            self.on_published(entry)
        return True

    # -- watching ----------------------------------------------------------------------------------------

    def _timed_scan(self) -> list[Entry]:
        """Run one scan, bounded by the scan timeout when there is one (rule 5)."""
        started = self.clock()

        def given_up() -> None:
            self._spent = True
            self._report(started, [], error=ScanTimeoutError.__name__)

        return call_within(
            self.scan,
            self.scan_timeout,
            what=f"a scan of {self.saves_location}",
            thread_name="ckpt-watcher-scan",
            on_timeout=given_up,
        )

    def _earliest_settled(self) -> float | None:
        """When the soonest save on its way could next be found complete, or ``None`` when none is.

        A save that is not complete yet (no marker, a shard still written) could complete at any time:
        ``inf`` here, so the drain looks again after one interval, within the drain's bound.
        """
        if not self._settling:
            return math.inf if self._outstanding else None
        return min(look.finished for look in self._settling.values()) + self.judge_settle

    def watch(self, stop: threading.Event) -> list[Entry]:
        """Scan every interval until ``stop`` is set, then drain; return every entry created, in order.

        A scan error ends the watch with that error, a scan over the timeout with ``ScanTimeoutError``.
        Once ``stop`` is set, the watcher scans once more, then, while some save is on its way, keeps
        scanning for at most the settle time after that scan (rule 6). A ``stop`` that is
        already set when ``watch`` starts makes it one scan plus that drain: ``ckpt watch --once``.
        """
        created: list[Entry] = []
        while True:
            stopping = stop.is_set()
            started = self.clock()
            created += self._timed_scan()
            if stopping:
                break  # that scan began after the stop: it is the drain's first scan
            stop.wait(max(0.0, started + self.interval - self.clock()))
        deadline = self.clock() + self.settle
        pause = threading.Event()  # never set: a sleep that a signal handler can interrupt and resume
        # Drain: while some save is settling, scan again; stop after a scan that *started* at or after the
        # deadline. Stopping on the clock after the scan instead would drop a save that a slow scan looked at
        # just before its settle point (the look is what decides, not when the scan ended).
        while started < deadline:
            soonest = self._earliest_settled()
            if soonest is None:
                break
            now = self.clock()
            pause.wait(max(0.0, min(deadline, now + self.interval, soonest) - now))
            started = self.clock()
            created += self._timed_scan()
        return created
