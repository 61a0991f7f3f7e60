"""Verified resolve: the newest published save that is still there and complete (SPEC §5).

Plain ``resolve`` is a pure read of ``pub/`` and never looks at a save. A framework's own retention (the
Trainer's ``save_total_limit``, a torchtitan ``keep_latest_k``) may delete a folder after it was published,
and an operator may remove one by hand; a training script that is about to resume wants the newest save it
can actually load. :func:`resolve_verified` walks the entries from the greatest down and returns the first
whose save still exists and passes the framework's marker check (settle does not apply), recording each entry
it passed over and why.

This module also holds :func:`read_markers`, the one place that reads a save's marker files from a store;
the watcher uses it too.
"""

from __future__ import annotations

import attrs

from ckpt.domain.arguments import require_instance
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import (
    INCOMPLETE_SENTINEL,
    METADATA,
    TRAINER_STATE,
    Framework,
    Markers,
    check_markers,
    save_step,
)
from ckpt.domain.ports import SaveReader, Store, WatchStore

__all__ = ["MISSING_FOLDER", "Verified", "read_markers", "resolve_verified"]

MISSING_FOLDER = "save folder is missing"


@attrs.frozen
class Verified:
    """The outcome of a verified resolve.

    ``entry`` is the newest entry whose save is complete, or ``None``; ``skipped`` lists every greater entry
    that was passed over, greatest first, each with the reason.
    """

    entry: Entry | None
    skipped: tuple[tuple[Entry, str], ...] = ()


def read_markers(store: WatchStore, framework: Framework, location: str) -> Markers:
    """Read the marker files ``framework``'s rule looks at from the save at ``location``.

    ``hf`` costs one read and one existence check, ``dcp`` one existence check.
    """
    require_instance(store, SaveReader, "store")
    require_instance(framework, Framework, "framework")
    if framework is Framework.DCP:
        return Markers(metadata=store.exists(location, METADATA))
    state = store.read_file(location, TRAINER_STATE)
    if state is None:
        return Markers()  # the sentinel cannot change the verdict; spare the request
    return Markers(trainer_state=state, incomplete_sentinel=store.exists(location, INCOMPLETE_SENTINEL))


def _folder_exists(store: WatchStore, location: str) -> bool:
    parent, _, name = location.rstrip("/").rpartition("/")
    return any(folder.name == name for folder in store.folders(parent))


def _why_not(store: WatchStore, framework: Framework, entry: Entry) -> str | None:
    """Return why ``entry``'s save is not a complete save under ``framework``, or ``None`` if it is."""
    name = entry.save.rpartition("/")[2]
    if save_step(framework, name) is None:
        return f"not a {framework} save folder name ({framework.folder_pattern}): {name!r}"
    location = store.location(entry)
    reason = check_markers(framework, read_markers(store, framework, location))
    if reason is not None and not _folder_exists(store, location):
        # Only now pay for a listing of the parent: a missing folder is the likelier story, and the
        # better reason to print.
        return MISSING_FOLDER
    return reason


def resolve_verified(store: WatchStore, framework: Framework) -> Verified:
    """Return the newest entry whose save still exists and is complete under ``framework``'s markers.

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
    reason = _why_not(store, framework, newest)
    if reason is None:
        return Verified(newest, ())
    skipped: list[tuple[Entry, str]] = [(newest, reason)]
    for entry in reversed(store.entries()):
        if entry == newest:
            continue
        reason = _why_not(store, framework, entry)
        if reason is None:
            return Verified(entry, tuple(skipped))
        skipped.append((entry, reason))
    return Verified(None, tuple(skipped))
