"""Verified resolve: the newest published save that is still there and complete (docs/spec/watcher.md).

Plain ``resolve`` is a pure read of ``pub/`` and never looks at a save. A framework's own retention (the
Trainer's ``save_total_limit``, a torchtitan ``keep_latest_k``) may delete a folder after it was published,
and an operator may remove one by hand; a training script that is about to resume wants the newest save it
can actually load. :func:`resolve_verified` walks the entries from the greatest down and returns the first
whose save still exists and passes the framework's marker check (settle does not apply; with a world size
``N > 1`` for ``hf``, every rank's ``rng_state_<i>.pth`` must be there and complete), recording each entry it
passed over and why.

This module also holds :func:`read_markers`, the one place that reads a save's marker files from a store;
the watcher uses it too.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from ckpt.domain.arguments import require_instance
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import (
    INCOMPLETE_SENTINEL,
    METADATA,
    RNG_STATE_MAX_BYTES,
    TRAINER_STATE,
    ZIP_TAIL_BYTES,
    FileTail,
    Framework,
    Markers,
    check_markers,
    check_zip_tail,
    rank_files,
    save_step,
)
from ckpt.domain.ports import FileInfo, SaveReader, Store, WatchStore

__all__ = ["MISSING_FOLDER", "Verified", "read_markers", "read_rank_states", "resolve_verified"]

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
    if names and check_markers(framework, markers) is None:
        markers = attrs.evolve(markers, rank_states=read_rank_states(store, location, names, files))
    return markers


def read_rank_states(
    store: WatchStore, location: str, names: Iterable[str], files: Iterable[FileInfo] | None = None
) -> tuple[FileTail | None, ...]:
    """Read the per-rank files ``names`` of the save at ``location``, in order, for the zip check.

    Which files are there, and how big, comes from ``files`` (a listing of the save) or else one
    ``files`` call. A file is read only when listed at no more than ``RNG_STATE_MAX_BYTES``; only its last
    ``ZIP_TAIL_BYTES`` are kept. Reading stops at the first file that is missing, too large or not a
    complete zip, so a save with a dead rank costs at most one read per rank before it.
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
        state = None if data is None else FileTail(len(data), data[-ZIP_TAIL_BYTES:])
        states.append(state)
        if state is None or check_zip_tail(state) is not None:
            break
    return tuple(states)


def _folder_exists(store: WatchStore, location: str) -> bool:
    parent, _, name = location.rstrip("/").rpartition("/")
    return any(folder.name == name for folder in store.folders(parent))


def _why_not(store: WatchStore, framework: Framework, entry: Entry, world_size: int | None) -> str | None:
    """Return why ``entry``'s save is not a complete save under ``framework``, or ``None`` if it is."""
    name = entry.save.rpartition("/")[2]
    if save_step(framework, name) is None:
        return f"not a {framework} save folder name ({framework.folder_pattern}): {name!r}"
    location = store.location(entry)
    markers = read_markers(store, framework, location, world_size=world_size)
    reason = check_markers(framework, markers, world_size=world_size)
    if reason is not None and not _folder_exists(store, location):
        # Only now pay for a listing of the parent: a missing folder is the likelier story, and the
        # better reason to print.
        return MISSING_FOLDER
    return reason


def resolve_verified(store: WatchStore, framework: Framework, *, world_size: int | None = None) -> Verified:
    """Return the newest entry whose save still exists and is complete under ``framework``'s markers.

    ``world_size`` is the number of processes that *wrote* the saves (``None``: unknown, no per-rank check);
    for ``hf`` above 1 every ``rng_state_<i>.pth`` must be present and complete, as the watcher requires.

    The usual case costs one ``resolve`` and the newest save's markers: when the greatest entry passes, the
    log is not read again. Otherwise entries are read once (``MalformedError`` for a bad name in ``pub/``,
    as ``entries`` does) and, from the greatest down, each save is checked until one passes. The entries
    passed over come back in ``skipped`` with their reasons, for the caller to report
    (``ckpt: skipped <location>: <reason>``).
    """
    # A store needs no sync_save to be verified: check only what this reads.
    require_instance(store, Store, "store")
    require_instance(store, SaveReader, "store")
    require_instance(framework, Framework, "framework")
    newest = store.resolve()
    if newest is None:
        return Verified(None, ())
    reason = _why_not(store, framework, newest, world_size)
    if reason is None:
        return Verified(newest, ())
    skipped: list[tuple[Entry, str]] = [(newest, reason)]
    for entry in reversed(store.entries()):
        if entry == newest:
            continue
        reason = _why_not(store, framework, entry, world_size)
        if reason is None:
            return Verified(entry, tuple(skipped))
        skipped.append((entry, reason))
    return Verified(None, tuple(skipped))
