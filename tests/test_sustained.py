"""A sustained run: four executions (two epochs) training and publishing into one root while a pruner runs.

Four simulated Hugging Face trainers write saves file by file (including saves that only settle late), each
watched by its own ``ckpt watch`` sidecar process; a pruner process runs ``ckpt prune --keep 4`` every two
seconds. After every prune, every remaining entry's folder must exist; at the end, every complete save was
published exactly once, ``resolve`` returns the newest save of the newest epoch, and every remaining entry's
folder exists with its files.

The run lasts ``CKPT_SUSTAINED_SECONDS`` seconds (default 180, "several minutes"; set it lower for a quick
local run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry
from support.trainer import FolderSink, SaveSpec, Trainer

DURATION = float(os.environ.get("CKPT_SUSTAINED_SECONDS", "180"))
EXECUTIONS = [("1.100.0", 1_000), ("1.100.1", 1_000), ("2.200.0", 2_000), ("2.200.1", 2_000)]
KINDS = ("plain", "sentinel", "late_rank", "staged")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}


class _Trainer(threading.Thread):
    """Writes saves at rising steps until told to stop; records each save once it is complete."""

    def __init__(self, saves_dir: str, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.completed: list[str] = []
        self._stop_event = stop
        self._trainer = Trainer(
            FolderSink(saves_dir), pace=0.002, on_complete=self.completed.append, chunk=2048
        )
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            index = 0
            while not self._stop_event.is_set():
                index += 1
                self._trainer.write(index, SaveSpec("hf", KINDS[index % len(KINDS)], 10 * index))
                time.sleep(0.05)
        except BaseException as exc:  # reported by the test
            self.error = exc


def _entries_have_folders(root: Path) -> list[str]:
    """Return the remaining entries whose folder is missing (empty when all is well)."""
    store = PosixStore(str(root))
    return [e.save for e in store.entries() if not (root / e.save / "trainer_state.json").is_file()]


@pytest.mark.slow
class TestSustainedRun:
    def test_four_watchers_two_epochs_and_a_pruner(self, tmp_path: Path) -> None:
        """Under minutes of load, nothing is lost or duplicated, prune never strands an entry, newest wins."""
        root = tmp_path / "root"
        root.mkdir()
        stop = threading.Event()
        trainers, watchers = [], []
        logs = [tmp_path / f"watch-{attempt}.log" for attempt, _ in EXECUTIONS]
        try:
            for (attempt, epoch), log in zip(EXECUTIONS, logs, strict=True):
                saves = root / "exec" / attempt
                saves.mkdir(parents=True)
                trainer = _Trainer(str(saves), stop)
                trainers.append(trainer)
                # Log to a file: a pipe nobody reads fills up, blocks the watcher's logging, and its scan
                # then (rightly) times out.
                with log.open("w") as err:
                    watchers.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "ckpt", "--root", str(root), "--log-format", "json",
                             "watch", "--framework", "hf", "--attempt", attempt, "--epoch", str(epoch),
                             "--interval", "0.2", "--settle", "0.3"],
                            stdout=subprocess.DEVNULL, stderr=err, env=_env(),
                        )
                    )  # fmt: skip
            for trainer in trainers:
                trainer.start()
            deadline = time.monotonic() + DURATION
            prunes, stranded = 0, []
            while time.monotonic() < deadline:
                time.sleep(2.0)
                result = subprocess.run(
                    [sys.executable, "-m", "ckpt", "--root", str(root), "--json", "prune", "--keep", "4"],
                    capture_output=True, text=True, env=_env(), check=False, timeout=60,
                )  # fmt: skip
                assert result.returncode == 0, result.stderr
                prunes += 1
                stranded += _entries_have_folders(root)
            stop.set()
            for trainer in trainers:
                trainer.join(timeout=30)
                assert trainer.error is None, trainer.error
            time.sleep(1.5)  # the last saves settle (0.3 s) and are published on the next scans
            for watcher in watchers:
                watcher.send_signal(signal.SIGTERM)
            for watcher, log in zip(watchers, logs, strict=True):
                assert watcher.wait(timeout=30) == 0, log.read_text()[-2000:]
        finally:
            stop.set()
            for watcher in watchers:
                if watcher.poll() is None:
                    watcher.kill()
                    watcher.wait()

        assert stranded == [], "an entry's folder was removed while the entry remained"
        assert prunes >= 5, "the pruner must have run throughout"
        published: list[str] = []
        for log in logs:
            for line in log.read_text().splitlines():
                record = json.loads(line)
                if record.get("message") == "published":
                    published.append(record["location"])
        completed = [
            str(root / "exec" / attempt / name)
            for (attempt, _), trainer in zip(EXECUTIONS, trainers, strict=True)
            for name in trainer.completed
        ]
        assert len(completed) > 40
        assert sorted(published) == sorted(completed), "every complete save exactly once, nothing else"

        newest = max(
            Entry(epoch, int(name.removeprefix("checkpoint-")), f"exec/{attempt}/{name}")
            for (attempt, epoch), trainer in zip(EXECUTIONS, trainers, strict=True)
            for name in trainer.completed
        )
        store = PosixStore(str(root))
        assert store.resolve() == newest
        assert newest.epoch == 2_000
        assert _entries_have_folders(root) == []
        assert len(store.entries()) >= 4
