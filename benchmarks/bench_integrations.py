"""Integration rows: the time an in-process integration adds to one save, beyond the fsyncs the entry needs.

A framework save ends, then the integration publishes it (ckpt/integrations/core.py rule 2): one barrier
(none here: one process), the fsync of the save's files and folders (the frameworks do not make their writes
durable, and an entry must never outlive its save), and one entry created with ``O_CREAT|O_EXCL`` and fsynced
with ``pub/`` and the root. The baseline is exactly those fsyncs and that create done by hand, on a save of
the same shape, interleaved round by round; the difference is what the integration itself costs (target:
under 5 ms). Each round publishes a fresh save (an entry can be created once), shaped like a small Trainer
save: six files of a few kilobytes in ``checkpoint-<step>/``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

from ckpt.integrations.core import Publisher, open_job
from run import CLOCKS, Context, Row, benchmark, interleaved, median, ms

FILES = {
    "model.safetensors": 8192,
    "optimizer.pt": 16384,
    "scheduler.pt": 1024,
    "rng_state.pth": 14469,
    "training_args.bin": 5265,
    "trainer_state.json": 750,
}
TARGET_SECONDS = 0.005


def _make_saves(folder: Path, count: int) -> list[Path]:
    saves = []
    for i in range(count):
        save = folder / f"checkpoint-{i + 1}"
        save.mkdir(parents=True)
        for name, size in FILES.items():
            (save / name).write_bytes(b"x" * size)
        saves.append(save)
    return saves


def _fsync_path(path: Path, flags: int = os.O_RDONLY) -> None:
    fd = os.open(path, flags | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _bare_publish(root: Path, save: Path) -> None:
    """The floor: fsync the save's files, the save and its parent; create one entry; fsync it, pub/, root."""
    for child in sorted(save.iterdir()):
        _fsync_path(child)
    _fsync_path(save, os.O_DIRECTORY)
    _fsync_path(save.parent, os.O_DIRECTORY)
    pub = root / "bare-pub"
    pub.mkdir(exist_ok=True)
    fd = os.open(pub / save.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_path(pub, os.O_DIRECTORY)
    _fsync_path(root, os.O_DIRECTORY)


def _step(save: Path) -> int:
    return int(save.name.split("-")[1])


def _pair(
    call: Callable[[Publisher, Path], object],
    publisher: Publisher,
    root: Path,
    saves: list[Path],
    bare: list[Path],
) -> list[Callable[[], object]]:
    """The integration and its floor, each taking the next fresh save on every call."""
    ours, floor = iter(saves), iter(bare)
    return [lambda: call(publisher, next(ours)), lambda: _bare_publish(root, next(floor))]


def _rounds(ctx: Context) -> int:
    return 5 if ctx.quick else 25


@benchmark("integrations")
def bench_integrations(ctx: Context) -> list[Row]:
    """One row per integration entry point that runs without its framework's trainer."""
    rounds = _rounds(ctx)
    clock = CLOCKS[ctx.clock]
    rows = []
    callers: dict[str, Callable[[Publisher, Path], object]] = {
        "Publisher.publish (core; every integration)": lambda p, s: p.publish(_step(s), str(s)),
    }
    try:
        from ckpt.integrations.hf import CkptCallback
    except ImportError:
        CkptCallback = None  # noqa: N806 - a class, or its absence
    if CkptCallback is not None:

        def hf_on_save(publisher: Publisher, save: Path) -> object:
            callback = CkptCallback(job=publisher.job)
            callback.publisher = publisher
            state = SimpleNamespace(global_step=_step(save), is_world_process_zero=True)
            callback.on_save(None, state, None)
            return None

        callers["hf CkptCallback.on_save"] = hf_on_save
    for label, call in callers.items():
        root = ctx.scratch / f"integrations-{len(rows)}"
        (root / "exec" / "a").mkdir(parents=True)
        saves = _make_saves(root / "exec" / "a", rounds + 1)
        bare = _make_saves(root / "bare", rounds + 1)
        publisher = Publisher(open_job(root=str(root), epoch=1, attempt="a", environ={}), is_main=True)
        times = interleaved(_pair(call, publisher, root, saves, bare), rounds, clock)
        added = median(times[0]) - median(times[1])
        rows.append(
            Row(
                "integrations",
                "1 save, 6 files",
                ms(median(times[0])),
                baseline=f"{ms(median(times[1]))} (the fsyncs and create alone)",
                ratio=f"+{ms(max(added, 0.0))}",
                target="< 5 ms added",
                passed=added < TARGET_SECONDS,
                note=f"{label}; median of {rounds}",
            )
        )
    return rows
