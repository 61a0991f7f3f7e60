"""The trainer: writes a plan of saves through a sink, step by step, and records what it did.

Every event is one JSON line appended to the events file with a single ``write`` (a kill never leaves half a
line); times are ``time.time()``:

* ``{"index": i, "save": folder, "kind": kind, "started": t}`` before the first step of plan item ``i``;
* ``{"index": i, "completing_at": t}`` just before the step that completes the save (a kind that completes
  only): it was not complete before ``t``;
* ``{"index": i, "save": folder, "written": t, "complete": bool}`` after its last step;
* ``{"finished": true}`` once the plan (or ``count`` items of it) is written.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable

from support.trainer.plan import CHUNK, Op, SaveSpec, operations
from support.trainer.sinks import Sink

__all__ = ["Trainer", "append_event", "next_index"]


def append_event(events: str | os.PathLike[str], document: dict[str, object]) -> None:
    """Append ``document`` to the events file as one JSON line, in a single ``write``."""
    fd = os.open(events, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (json.dumps(document) + "\n").encode())  # one write: a kill cannot leave half a line
    finally:
        os.close(fd)


def next_index(events: str | os.PathLike[str]) -> int:
    """The plan item after the last one begun (0 for a fresh start): a killed save is never resumed."""
    try:
        with open(events) as f:
            started = [json.loads(line)["index"] for line in f if '"started"' in line]
    except FileNotFoundError:
        return 0
    return max(started, default=-1) + 1


class Trainer:
    """Writes saves through ``sink``: ``pace`` seconds after every step, ``gap`` seconds between saves, files
    growing ``chunk`` bytes a write. ``on_complete`` hears the folder of each save that completed."""

    def __init__(
        self,
        sink: Sink,
        *,
        pace: float = 0.005,
        gap: float = 0.0,
        chunk: int = CHUNK,
        events: str | os.PathLike[str] | None = None,
        on_complete: Callable[[str], None] | None = None,
    ) -> None:
        self.sink = sink
        self.pace = pace
        self.gap = gap
        self.chunk = chunk
        self.events = events
        self.on_complete = on_complete

    def _event(self, **document: object) -> None:
        if self.events is not None:
            append_event(self.events, document)

    def _tick(self, paces: int = 1) -> None:
        time.sleep(self.pace * paces)

    def _do(self, op: Op) -> None:
        """Carry out one step, then wait a pace (a ``write`` waits after each of its pieces)."""
        if op.action == "write":
            size = max(1, -(-len(op.data) // op.pieces))
            for offset in range(0, max(1, len(op.data)), size):
                self.sink.append(op.path, op.data[offset : offset + size])
                self._tick()
            return
        if op.action == "pause":
            self._tick(op.pieces)
            return
        if op.action == "put":
            self.sink.put(op.path, op.data)
        elif op.action == "rename":
            self.sink.rename(op.path, op.to)
        elif op.action == "remove":
            self.sink.remove(op.path)
        elif op.action == "mkdir":
            self.sink.mkdir(op.path)
        else:
            raise ValueError(f"unknown operation {op.action!r}")
        self._tick()

    def write(self, index: int, spec: SaveSpec) -> None:
        """Write plan item ``index``, recording when it starts, is completing and is written."""
        ops = operations(spec, self.chunk)
        self._event(index=index, save=spec.folder, kind=spec.kind, started=time.time())
        for position, op in enumerate(ops):
            if spec.completes and position == len(ops) - 1:
                self._event(index=index, completing_at=time.time())
            self._do(op)
        self._event(index=index, save=spec.folder, written=time.time(), complete=spec.completes)
        if spec.completes and self.on_complete is not None:
            self.on_complete(spec.folder)

    def run(self, plan: Iterable[SaveSpec], *, start: int = 0, count: int | None = None) -> None:
        """Write plan items from ``start`` to before ``count`` (default: all), ``gap`` seconds apart, then
        record ``finished``."""
        for index, spec in itertools.islice(enumerate(plan), start, count):
            self.write(index, spec)
            time.sleep(self.gap)
        self._event(finished=True)
