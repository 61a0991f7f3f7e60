"""Resume: record this execution's epoch, publish what earlier executions completed, then resolve.

This is the one step a job runs when it starts (``ckpt resume``, ``ckpt.resume_location``, and every
integration's resume helper), built on the public ``WatchStore`` port, the framework rules and the watcher;
it does no I/O of its own, so it runs the same on every store:

1. :func:`record_epoch` writes ``exec/<attempt>/.ckpt-epoch`` (``ckpt.domain.catchup`` rule 1), so that a
   later execution knows this one's epoch even if it dies before publishing anything. A folder that already
   records a lower epoch keeps it (the lower epoch is the safe one to publish its saves at). The record is
   written through the store's :class:`~ckpt.domain.ports.WritesSmallFiles` capability (POSIX: an atomic,
   fsynced rename; S3: one ``PutObject``; the in-memory fake); a store without it keeps no record, and
   catch-up there learns an execution's epoch from its published entries only. With this run's size known
   (``run_world_size``), :func:`record_world_size` writes ``exec/<attempt>/.ckpt-world-size`` beside it
   (``ckpt.application.world_size_record``).
2. :func:`catch_up` lists ``exec/``, reads each folder's record, plans with
   :func:`~ckpt.domain.catchup.plan_catch_up`, and runs one :class:`~ckpt.application.watcher.Watcher`
   per target at the target's epoch, judging with the world size the target's folder records, as
   ``ckpt watch --once`` does: one scan, then at most the settle time for saves whose
   markers are complete to settle (the writer may be a zombie still writing). The watchers run side by side,
   so a catch-up takes at most one settle time however many folders it looks into. With a saves
   ``sub_folder`` (``ckpt.domain.catchup`` rule 7) each watcher watches ``exec/<attempt>/<sub_folder>``.
3. :func:`resume` then resolves, verified against the framework's rule. Before anything else it refuses an
   attempt whose folder is too long for the rule's longest save name (``ckpt.domain.room``).

docs/adr/0011-catch-up-on-resume.md says why, and why publishing an older execution's saves is safe.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import attrs

from ckpt.application.bounded import call_within
from ckpt.application.rulebook import as_rule, with_recorded_world_size
from ckpt.application.verify import resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.application.world_size_record import record_world_size, recorded_world_size
from ckpt.domain.catchup import (
    EPOCH_RECORD,
    CatchUpPlan,
    PassedExecution,
    execution_saves,
    format_epoch_record,
    parse_epoch_record,
    plan_catch_up,
)
from ckpt.domain.entries import Entry, validate_attempt
from ckpt.domain.errors import CkptError, InvalidError, MalformedError
from ckpt.domain.frameworks import Framework
from ckpt.domain.ports import WatchStore, WritesSmallFiles
from ckpt.domain.room import longest_save_name, require_rule_room
from ckpt.domain.rules import Rule

__all__ = [
    "DEFAULT_SETTLE",
    "CaughtUp",
    "Resumed",
    "catch_up",
    "is_vanished_save",
    "read_epoch_record",
    "record_epoch",
    "record_world_size",
    "resume",
]

_log = logging.getLogger("ckpt.catchup")

DEFAULT_SETTLE = 10.0  # the sidecar's default interval, hence its default hf settle time
DEFAULT_SCAN_TIMEOUT = 120.0


def is_vanished_save(exc: BaseException, location: str) -> bool:
    """True when ``exc``, raised publishing the save at ``location``, says that save does not exist.

    A missing save is a ``FileNotFoundError`` of ours: an ``InvalidError`` (the caller's mistake,
    spec/operations.md) or a ``NotFoundError`` naming the save itself; a ``NotFoundError`` naming the root is
    an outage instead.
    """
    # By the class's MRO: an InvalidError that is also a FileNotFoundError exists where spec/operations.md's
    # missing-save error does (SaveNotFoundError), and a type checker that does not know it would call the
    # test impossible.
    if not isinstance(exc, CkptError) or FileNotFoundError not in type(exc).__mro__:
        return False
    if isinstance(exc, InvalidError):
        return True
    where = getattr(exc, "location", None)
    return isinstance(where, str) and where.rstrip("/") == location.rstrip("/")


def _exec_parent(store: WatchStore, attempt: str) -> str:
    return store.exec_dir(attempt).rstrip("/").rpartition("/")[0]


def read_epoch_record(store: WatchStore, attempt: str) -> int | None:
    """The epoch ``exec/<attempt>`` records, or ``None`` without one; ``MalformedError`` if unreadable."""
    data = store.read_file(store.exec_dir(attempt), EPOCH_RECORD)
    return None if data is None else parse_epoch_record(data)


def _write_record(store: WatchStore, folder: str, data: bytes) -> bool:
    if not isinstance(store, WritesSmallFiles):
        return False
    store.write_file(folder, EPOCH_RECORD, data)
    return True


def record_epoch(store: WatchStore, attempt: str, epoch: int) -> int | None:
    """Record that execution ``attempt`` runs at ``epoch``; return the epoch its folder records afterwards.

    A record holding a lower epoch is kept; a malformed one is replaced. Returns ``None`` when the store
    cannot hold a record (no :class:`~ckpt.domain.ports.WritesSmallFiles`: catch-up there learns an
    execution's epoch from its entries).
    """
    data = format_epoch_record(epoch)
    folder = store.exec_dir(attempt)
    try:
        existing = read_epoch_record(store, attempt)
    except MalformedError as exc:
        _log.warning("replacing a malformed epoch record in %s: %s", folder, exc)
        existing = None
    if existing is not None and existing <= epoch:
        if existing < epoch:
            _log.warning(
                "%s already records epoch %d; keeping it (this execution runs at %d)", folder, existing, epoch
            )
        return existing
    if not _write_record(store, folder, data):
        _log.info("cannot write an epoch record on %s; catch-up will rely on published entries", store.root)
        return None
    return epoch


@attrs.frozen
class CaughtUp:
    """What a catch-up did: the entries it created (ascending) and the execution folders it passed over."""

    published: tuple[Entry, ...]
    passed: tuple[PassedExecution, ...]
    plan: CatchUpPlan


def _records(store: WatchStore, attempt: str) -> dict[str, int | None]:
    records: dict[str, int | None] = {}
    for folder in store.folders(_exec_parent(store, attempt)):
        try:
            validate_attempt(folder.name)
        except InvalidError:
            continue  # not a folder an execution could have made; no save in it can be published anyway
        try:
            records[folder.name] = read_epoch_record(store, folder.name)
        except MalformedError as exc:
            _log.warning("%s: %s", folder.location, exc)
            records[folder.name] = None
    return records


def catch_up(
    store: WatchStore,
    framework: Framework | Rule,
    *,
    attempt: str,
    epoch: int,
    settle: float | None = None,
    scan_timeout: float | None = DEFAULT_SCAN_TIMEOUT,
    world_size: int | None = None,
    sub_folder: str = "",
) -> CaughtUp:
    """Publish every complete, unpublished save of the execution folders the plan names, at their epochs.

    ``framework`` is a :class:`Framework` or any rule (``ckpt.application.rulebook.find_rule``: built-in,
    configured or a plugin's). ``settle`` (default: the rule's settle time for the sidecar's default interval,
    :data:`DEFAULT_SETTLE`; 10 s for ``hf``, 0 for ``dcp``) is how long a save's listing must stay unchanged
    before it is published; the whole catch-up waits at most that long after its first scan.

    Each target's saves are judged with the world size its folder records (``.ckpt-world-size``, read for
    the targets only and only when the rule has a world size); ``world_size`` is for folders that record
    none, and one that records another is ``InvalidError`` (``ckpt.application.rulebook`` rule 6).
    ``sub_folder`` is where the saves lie inside every execution's folder (``ckpt.domain.catchup`` rule 7;
    ``""``: the folder itself). Store errors propagate.
    """
    validate_attempt(attempt)
    rule = as_rule(framework, world_size)
    settle = rule.settle_time(DEFAULT_SETTLE, settle)
    plan = plan_catch_up(
        attempt,
        epoch,
        _records(store, attempt),
        store.entries(),
        longest_name=longest_save_name(rule),
        sub_folder=sub_folder,
    )
    if hasattr(rule, "world_size"):
        plan = plan.sized({t.attempt: recorded_world_size(store, t.attempt) for t in plan.targets})
    watchers = [
        Watcher(
            store,
            with_recorded_world_size(rule, target.world_size, store.exec_dir(target.attempt)),
            store.location(Entry(0, 0, execution_saves(target.attempt, sub_folder))),
            target.epoch,
            interval=settle or 1.0,
            settle=settle,
            scan_timeout=scan_timeout,
        )
        for target in plan.targets
    ]
    stopped = threading.Event()
    stopped.set()  # each watcher makes one scan, then drains for at most the settle time
    published: list[Entry] = []
    if watchers:
        with ThreadPoolExecutor(
            max_workers=min(8, len(watchers)), thread_name_prefix="ckpt-catch-up"
        ) as pool:
            runs = [pool.submit(w.watch, stopped) for w in watchers]
            for run in runs:
                published += run.result()
    for passed in plan.passed:
        _log.info("catch-up passes over %s: %s", store.exec_dir(passed.attempt), passed.reason)
    for entry in sorted(published):
        _log.info("caught up: epoch %d step %d %s", entry.epoch, entry.step, store.location(entry))
    return CaughtUp(tuple(sorted(published)), plan.passed, plan)


def _what(attempt: str, sub_folder: str) -> str:
    """How a room error names the folder: the attempt, and the sub-folder when there is one."""
    return f"attempt {attempt!r}" + (f" with saves sub-folder {sub_folder!r}" if sub_folder else "")


@attrs.frozen
class Resumed:
    """Where to resume from (``entry``/``location`` are ``None`` on a first run) and how it was found.

    ``skipped`` lists the greater entries the verified resolve passed over, with reasons; ``caught_up`` is
    the catch-up's outcome (``None`` when it was not run).
    """

    entry: Entry | None
    location: str | None
    skipped: tuple[tuple[Entry, str], ...]
    caught_up: CaughtUp | None


def resume(
    store: WatchStore,
    framework: Framework | Rule,
    *,
    attempt: str,
    epoch: int,
    settle: float | None = None,
    catch_up_first: bool = True,
    scan_timeout: float | None = DEFAULT_SCAN_TIMEOUT,
    world_size: int | None = None,
    sub_folder: str = "",
    run_world_size: int | None = None,
) -> Resumed:
    """Record this execution's epoch, catch up earlier executions, and resolve (verified).

    ``world_size`` is the size of the run that wrote the saves, for folders that record none (an explicit
    one that conflicts with a folder's record is ``InvalidError``); ``run_world_size`` is this run's own
    size, recorded beside the epoch when known (``ckpt.application.world_size_record`` rule 1: the
    integrations know it, ``ckpt resume`` does not).

    ``catch_up_first=False`` skips the catch-up (and the records) and is a plain verified resolve. The
    records, like every scan of the catch-up, are bounded by ``scan_timeout`` (``ScanTimeoutError``).
    ``sub_folder`` is where the saves lie inside every execution's folder (``ckpt.domain.catchup`` rule 7);
    the records stay in ``exec/<attempt>`` itself.

    First of all, an attempt whose saves folder is too long for the rule's longest save name is
    ``InvalidError`` (``ckpt.domain.room``): this execution could publish none of the saves it is about to
    make.
    """
    rule = as_rule(framework, world_size)
    require_rule_room(execution_saves(attempt, sub_folder), rule, what=_what(attempt, sub_folder))
    caught: CaughtUp | None = None
    if catch_up_first:
        call_within(
            lambda: record_epoch(store, attempt, epoch),
            scan_timeout,
            what=f"recording the epoch in {store.exec_dir(attempt)}",
            thread_name="ckpt-epoch-record",
        )
        if run_world_size is not None:
            size = run_world_size
            call_within(
                lambda: record_world_size(store, attempt, size),
                scan_timeout,
                what=f"recording the world size in {store.exec_dir(attempt)}",
                thread_name="ckpt-world-size-record",
            )
        caught = catch_up(
            store,
            rule,
            attempt=attempt,
            epoch=epoch,
            settle=settle,
            scan_timeout=scan_timeout,
            sub_folder=sub_folder,
        )
    verified = resolve_verified(store, rule)
    location = None if verified.entry is None else store.location(verified.entry)
    return Resumed(verified.entry, location, verified.skipped, caught)
