"""Verified resolve: the newest published save that is still there and complete (docs/spec/watcher.md).

Plain ``resolve`` is a pure read of ``pub/`` and never looks at a save. A framework's own retention (the
Trainer's ``save_total_limit``, a torchtitan ``keep_latest_k``) may delete a folder after it was published,
and an operator may remove one by hand; a training script that is about to resume wants the newest save it
can actually load. :func:`resolve_verified` walks the entries from the greatest down and returns the first
whose save still exists and passes the framework's rule (``ckpt.domain.rules``: built in, configured or a
plugin; settle does not apply), recording each entry it passed over and why. A save may be a folder or, for
rules that take files (Lightning), a single file. A save that passes the rule but that a prune has begun
removing (its files may be half deleted: ``ckpt.domain.removing``) is passed over too; the journals are
read once, and only when some save passed the rule (docs/spec/watcher.md §6.6).

This module also keeps :func:`read_markers` and :func:`read_rank_states`, the ``hf``/``dcp`` marker readers
over the ``WatchStore`` port, for embedders that used them; the watcher and :func:`resolve_verified` now
read through ``ckpt.application.inspection``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from ckpt.application.inspection import judge, saves_reader
from ckpt.application.rulebook import as_rule, with_recorded_world_size
from ckpt.application.world_size_record import recorded_world_size
from ckpt.domain.arguments import require_instance
from ckpt.domain.catchup import attempt_of_saves
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import (
    INCOMPLETE_SENTINEL,
    METADATA,
    RNG_STATE_MAX_BYTES,
    TRAINER_STATE,
    FileTail,
    Framework,
    Markers,
    check_zip_tail,
    markers_problem,
    rank_files,
    validate_world_size,
)
from ckpt.domain.ports import FileInfo, KnowsRemovals, SaveReader, Store, WatchStore
from ckpt.domain.removing import NEVER_REMOVING, Removing, being_removed_reason
from ckpt.domain.rules import Item, Kind, Rule

__all__ = [
    "MISSING_FOLDER",
    "Verified",
    "read_markers",
    "read_rank_states",
    "resolve_verified",
    "why_incomplete",
]

MISSING_FOLDER = "save folder is missing"


@attrs.frozen
class Verified:
    """The outcome of a verified resolve.

    ``entry`` is the newest entry whose save is complete, or ``None``; ``skipped`` lists every greater entry
    that was passed over, greatest first, each with the reason.
    """

    entry: Entry | None
    skipped: tuple[tuple[Entry, str], ...] = ()


def read_markers(
    store: WatchStore,
    framework: Framework,
    location: str,
    *,
    world_size: int | None = None,
    files: Iterable[FileInfo] | None = None,
) -> Markers:
    """Read the marker files ``framework``'s rule looks at from the save at ``location``.

    ``hf`` costs one read and one existence check, ``dcp`` one existence check. With a world size above 1,
    an ``hf`` save whose other markers pass also has its ranks' files read (:func:`read_rank_states`;
    ``files`` is a listing of the save the caller already has).
    """
    require_instance(store, SaveReader, "store")
    require_instance(framework, Framework, "framework")
    if framework is Framework.DCP:
        return Markers(metadata=store.exists(location, METADATA))
    state = store.read_file(location, TRAINER_STATE)
    if state is None:
        return Markers()  # the sentinel cannot change the verdict; spare the request
    markers = Markers(trainer_state=state, incomplete_sentinel=store.exists(location, INCOMPLETE_SENTINEL))
    names = rank_files(framework, world_size)
    if names and markers_problem(framework, markers) is None:
        markers = attrs.evolve(markers, rank_states=read_rank_states(store, location, names, files))
    return markers


def read_rank_states(
    store: WatchStore, location: str, names: Iterable[str], files: Iterable[FileInfo] | None = None
) -> tuple[FileTail | None, ...]:
    """Read the per-rank files ``names`` of the save at ``location``, in order, for the zip check.

    Which files are there, and how big, comes from ``files`` (a listing of the save) or else one
    ``files`` call. A file is read only when listed at no more than ``RNG_STATE_MAX_BYTES``, and kept whole
    (a few kilobytes), so the zip check (spec/watcher.md §2.4) needs no second read. Reading stops at the
    first file that is missing, too large or not a complete zip, so a save with a dead rank costs at most
    one read per rank before it.
    """
    sizes = {f.path: f.size for f in (store.files(location) if files is None else files)}
    states: list[FileTail | None] = []
    for name in names:
        size = sizes.get(name)
        if size is None:
            states.append(None)
            break
        if size > RNG_STATE_MAX_BYTES:
            states.append(FileTail(size, b""))
            break
        data = store.read_file(location, name)
        state = None if data is None else FileTail(len(data), data)
        states.append(state)
        if state is None or check_zip_tail(state) is not None:
            break
    return tuple(states)


def _why_not(store: WatchStore, rule: Rule, entry: Entry) -> str | None:
    """Return why ``entry``'s save is not a complete save under ``rule``, or ``None`` if it is.

    The save is judged as a folder, or as a file when the rule takes only that; only when it fails is its
    parent listed (one request), to tell a missing save from an incomplete one and a file from a folder.
    """
    name = entry.save.rpartition("/")[2]
    saves = rule.saves([Item(name, Kind.FOLDER)]) or rule.saves([Item(name, Kind.FILE)])
    if not saves:
        return f"not a {rule.name} save folder name ({rule.pattern}): {name!r}"
    parent = store.location(entry).rstrip("/").rpartition("/")[0]
    reader = saves_reader(store, parent)
    reason = judge(rule, saves[0], (), reader)
    if reason is None:
        return None
    # Only now pay for a listing of the parent: a missing save is the likelier story, and the better reason
    # to print; and a save of the other kind than guessed is judged again as what it is.
    found = [item for item in reader.items() if item.name == name]
    if not found:
        return MISSING_FOLDER
    for item in found:
        if item.kind is not saves[0].kind:
            again = rule.saves([item])
            if again:
                return judge(rule, again[0], (), reader)
    return reason


def why_incomplete(store: WatchStore, rule: Rule, entry: Entry) -> str | None:
    """Why ``entry``'s save is not complete under ``rule`` (spec/watcher.md §6.3 reasons), or ``None``."""
    return _why_not(store, rule, entry)


def resolve_verified(
    store: WatchStore,
    framework: Framework | Rule,
    *,
    world_size: int | None = None,
    also: Callable[[Entry], str | None] | None = None,
) -> Verified:
    """Return the newest entry whose save still exists and is complete under ``framework``'s rule.

    ``framework`` is a rule (``ckpt.application.rulebook.find_rule`` finds one by name) or a
    :class:`Framework`; ``world_size`` goes to the built-in rule of a :class:`Framework`.

    ``world_size`` is the number of processes that *wrote* the saves (``None``: unknown, no per-rank check);
    for ``hf`` above 1 every ``rng_state_<i>.pth`` must be present and complete, as the watcher requires.
    A save inside ``exec/<attempt>/`` is judged with the world size that folder records
    (``.ckpt-world-size``, read once per folder judged, only for rules with a world size); ``world_size``
    then serves the folders that record none, and a folder recording another is ``InvalidError``
    (``ckpt.application.rulebook`` rule 6).

    The usual case costs one ``resolve``, the newest save's markers and one reading of the prune journals
    (one listing on S3 when there are none): when the greatest entry passes, the log is not read again. An
    entry whose save passes the rule but that a prune has begun removing is passed over with the reason
    ``being removed by a prune (<journal>)``. Otherwise entries are read once (``MalformedError`` for a bad
    name in ``pub/``, as ``entries`` does) and, from the greatest down, each save is checked until one
    passes. The entries passed over come back in ``skipped`` with their reasons, for the caller to report
    (``ckpt: skipped <location>: <reason>``). ``also`` is one more check of a save that passed the rule and
    is not being removed (``resolve --verify``: its manifest): a reason it returns passes the entry over.
    """
    # A store needs no sync_save to be verified: check only what this reads.
    require_instance(store, Store, "store")
    require_instance(store, SaveReader, "store")
    rule = as_rule(framework, None if world_size is None else validate_world_size(world_size))
    newest = store.resolve()
    if newest is None:
        return Verified(None, ())
    removing: list[Removing] = []  # read once, when the first save passes the rule
    rules: dict[str, Rule] = {}  # the rule for each execution folder judged, with its recorded world size

    def rule_for(entry: Entry) -> Rule:
        attempt = attempt_of_saves(entry.save)
        if attempt is None or not hasattr(rule, "world_size"):
            return rule
        if attempt not in rules:
            recorded = recorded_world_size(store, attempt)
            rules[attempt] = with_recorded_world_size(rule, recorded, store.exec_dir(attempt))
        return rules[attempt]

    def why_not(entry: Entry) -> str | None:
        reason = _why_not(store, rule_for(entry), entry)
        if reason is not None:
            return reason
        if not removing:
            removing.append(store.removing() if isinstance(store, KnowsRemovals) else NEVER_REMOVING)
        journal = removing[0].journal_of(entry.save)
        if journal is not None:
            return being_removed_reason(journal)
        return None if also is None else also(entry)

    reason = why_not(newest)
    if reason is None:
        return Verified(newest, ())
    skipped: list[tuple[Entry, str]] = [(newest, reason)]
    for entry in reversed(store.entries()):
        if entry == newest:
            continue
        reason = why_not(entry)
        if reason is None:
            return Verified(entry, tuple(skipped))
        skipped.append((entry, reason))
    return Verified(None, tuple(skipped))
