"""The world-size record of an execution: how many processes wrote the saves in ``exec/<attempt>``.

Rules (spec/layout.md §8.5-§8.8, spec/watcher.md §2.5b, §6.7, §7.10):

1. The record is the file ``exec/<attempt>/.ckpt-world-size`` (``ckpt.domain.catchup`` rule 8), written
   beside the epoch record by the writers that know the size of the run: ``ckpt watch`` of an attempt with a
   world size (``--world-size`` or ``WORLD_SIZE``), and the in-process publishers (``torch.distributed``'s
   world size, or the job's ``world_size``). ``ckpt resume`` writes none: its ``--world-size`` is the size
   of the run that wrote the saves it resumes from, not necessarily this run's.
2. A writer first reads the record: one holding a size greater than or equal to its own is kept (a greater
   size is the stricter judge: it may pass over a whole save of fewer processes, never accept a torn save of
   more); otherwise (none, malformed, smaller) it writes its own. A store without
   :class:`~ckpt.domain.ports.WritesSmallFiles` keeps no record.
3. A reader treats a malformed record as no record (a warning): the world size is then unknown, as for an
   execution of an older release that wrote none.
4. Catch-up judges a target's saves, and verified resolve an entry's save, with the record of the execution
   folder the save lies in, through :func:`ckpt.application.rulebook.with_recorded_world_size`.

It does no I/O of its own: everything goes through the store ports, so it runs the same on every store.
"""

from __future__ import annotations

import logging

from ckpt.domain.catchup import WORLD_SIZE_RECORD, format_world_size_record, parse_world_size_record
from ckpt.domain.errors import MalformedError
from ckpt.domain.frameworks import validate_world_size
from ckpt.domain.ports import WatchStore, WritesSmallFiles

__all__ = ["read_world_size_record", "record_world_size", "recorded_world_size"]

_log = logging.getLogger("ckpt.catchup")


def read_world_size_record(store: WatchStore, attempt: str) -> int | None:
    """The world size ``exec/<attempt>`` records, ``None`` without one; ``MalformedError`` if unreadable."""
    data = store.read_file(store.exec_dir(attempt), WORLD_SIZE_RECORD)
    return None if data is None else parse_world_size_record(data)


def recorded_world_size(store: WatchStore, attempt: str) -> int | None:
    """The world size ``exec/<attempt>`` records; ``None`` if it records none or a malformed one (rule 3)."""
    try:
        return read_world_size_record(store, attempt)
    except MalformedError as exc:
        _log.warning("%s: %s (its world size is unknown)", store.exec_dir(attempt), exc)
        return None


def record_world_size(store: WatchStore, attempt: str, world_size: int) -> int | None:
    """Record that execution ``attempt`` runs ``world_size`` processes; return what its folder records after.

    A record holding a size greater than or equal to ``world_size`` is kept; a malformed or smaller one is
    replaced (rule 2). ``None`` when the store cannot hold a record.
    """
    data = format_world_size_record(validate_world_size(world_size))
    folder = store.exec_dir(attempt)
    try:
        existing = read_world_size_record(store, attempt)
    except MalformedError as exc:
        _log.warning("replacing a malformed world-size record in %s: %s", folder, exc)
        existing = None
    if existing is not None and existing >= world_size:
        if existing > world_size:
            _log.warning(
                "%s already records a world size of %d; keeping it (this run has %d processes)",
                folder,
                existing,
                world_size,
            )
        return existing
    if not isinstance(store, WritesSmallFiles):
        _log.info("cannot write a world-size record on %s; its world size stays unknown", store.root)
        return None
    store.write_file(folder, WORLD_SIZE_RECORD, data)
    return world_size
