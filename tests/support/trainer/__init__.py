"""The simulated trainer, one for every suite that must see saves while they are being written.

It writes a plan of saves (:mod:`support.trainer.plan`: kinds per framework, each spelled as operations,
with its exact manifest) through a sink (:mod:`support.trainer.sinks`: a folder, file by file, or a bucket,
object by object), pacing every step so that a watcher can catch a save half-way, and records one event
format (:mod:`support.trainer.writer`). In-process::

    Trainer(FolderSink(saves), pace=0.003).run(mixed_plan("hf", 1))

or as a process that can be killed and started again (:mod:`support.trainer.__main__`)::

    python -m support.trainer folder --framework hf --saves DIR --events FILE --plan endless

The watcher, watch-command, sustained and POSIX/S3 crash suites use it. The framework saves of
:mod:`support.trainer.frameworks` (DeepSpeed, Megatron, Lightning, NeMo, Orbax, DCP variants) are written with
the same steps and played state by state instead, for the rules to judge each state. Saves that only need to
exist, whole, are arranged with :mod:`support.saves`.
"""

from __future__ import annotations

from support.trainer.plan import (
    CHUNK,
    KINDS,
    Op,
    SaveSpec,
    complete_folders,
    endless_plan,
    manifest,
    mixed_plan,
    operations,
    spec_at,
)
from support.trainer.sinks import BucketSink, FolderSink, Sink
from support.trainer.writer import Trainer, next_index

__all__ = [
    "CHUNK",
    "KINDS",
    "BucketSink",
    "FolderSink",
    "Op",
    "SaveSpec",
    "Sink",
    "Trainer",
    "complete_folders",
    "endless_plan",
    "manifest",
    "mixed_plan",
    "next_index",
    "operations",
    "spec_at",
]
