"""Resume with catch-up: the public name of :mod:`ckpt.application.catchup`.

The flow (record this execution's epoch, publish what earlier executions completed, resolve verified) lives
in the application layer over the store ports; the integrations, ``ckpt resume`` and embedders import it from
here.
"""

from __future__ import annotations

from ckpt.application.catchup import (
    DEFAULT_SCAN_TIMEOUT,
    DEFAULT_SETTLE,
    CaughtUp,
    Resumed,
    catch_up,
    is_vanished_save,
    read_epoch_record,
    record_epoch,
    record_world_size,
    resume,
)
from ckpt.application.world_size_record import read_world_size_record

__all__ = [
    "DEFAULT_SCAN_TIMEOUT",
    "DEFAULT_SETTLE",
    "CaughtUp",
    "Resumed",
    "catch_up",
    "is_vanished_save",
    "read_epoch_record",
    "read_world_size_record",
    "record_epoch",
    "record_world_size",
    "resume",
]
