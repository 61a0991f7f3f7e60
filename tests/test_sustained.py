"""A sustained run: four executions (two epochs) training and publishing into one root while a pruner runs.

Four simulated Hugging Face trainers write saves file by file (including saves that only settle late), each
watched by its own ``ckpt watch`` sidecar process; a pruner process runs ``ckpt prune --keep 4`` every two
seconds. After every prune, every remaining entry's folder must exist; at the end, every complete save was
published exactly once, ``resolve`` returns the newest save of the newest epoch, and every remaining entry's
folder exists with its files.

The run lasts ``CKPT_SUSTAINED_SECONDS`` seconds (default 120, "minutes"; set it lower for a quick
local run).

The same run on S3, against Ceph RGW (a real server: atomic exclusive create, signatures checked), writes the
saves object by object into one bucket, with the sidecars and the pruner on ``s3://BUCKET`` (from a config
file, keys from the ``env`` source). It lasts ``CKPT_SUSTAINED_S3_SECONDS`` (default 40): each of its
requests goes over HTTP, so a minute already holds thousands of them. It runs on RGW only: what it proves
is about the server under sustained concurrent load, which moto's server, with its lock around every
conditional put, would not show.
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
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.domain.entries import Entry
from support.rgw import RgwServer
from support.s3 import new_bucket_name, raw_client
from support.trainer import BucketSink, FolderSink, SaveSpec, Trainer
from support.trainer.sinks import Sink

DURATION = float(os.environ.get("CKPT_SUSTAINED_SECONDS", "120"))
S3_DURATION = float(os.environ.get("CKPT_SUSTAINED_S3_SECONDS", "40"))
EXECUTIONS = [("1.100.0", 1_000), ("1.100.1", 1_000), ("2.200.0", 2_000), ("2.200.1", 2_000)]
KINDS = ("plain", "sentinel", "late_rank", "staged")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}


class _Trainer(threading.Thread):
    """Writes saves at rising steps until told to stop; records each save once it is complete."""

    def __init__(self, sink: Sink, stop: threading.Event, chunk: int = 2048) -> None:
        super().__init__(daemon=True)
        self.completed: list[str] = []
        self._stop_event = stop
        self._trainer = Trainer(sink, pace=0.002, on_complete=self.completed.append, chunk=chunk)
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


def _stop(
    stop: threading.Event,
    trainers: list[_Trainer],
    watchers: list[subprocess.Popen[bytes]],
    logs: list[Path],
    *,
    settle: float,
    timeout: float,
) -> None:
    """Stop the trainers, let their last saves settle and be published, then SIGTERM every watcher, which
    must exit 0."""
    stop.set()
    for trainer in trainers:
        trainer.join(timeout=timeout)
        assert trainer.error is None, trainer.error
    time.sleep(settle)
    for watcher in watchers:
        watcher.send_signal(signal.SIGTERM)
    for watcher, log in zip(watchers, logs, strict=True):
        assert watcher.wait(timeout=timeout) == 0, log.read_text()[-2000:]


def _kill_left(stop: threading.Event, watchers: list[subprocess.Popen[bytes]]) -> None:
    stop.set()
    for watcher in watchers:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()


def _published(logs: list[Path]) -> list[str]:
    """Every location the watchers' JSON logs say they published, sorted."""
    return sorted(
        record["location"]
        for log in logs
        for record in map(json.loads, log.read_text().splitlines())
        if record.get("message") == "published"
    )


def _newest_completed(trainers: list[_Trainer]) -> Entry:
    """The greatest entry among the saves the trainers completed (epoch, then step)."""
    return max(
        Entry(epoch, int(name.removeprefix("checkpoint-")), f"exec/{attempt}/{name}")
        for (attempt, epoch), trainer in zip(EXECUTIONS, trainers, strict=True)
        for name in trainer.completed
    )


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
                trainer = _Trainer(FolderSink(str(saves)), stop)
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
            # The last saves settle (0.3 s) and are published on the next scans.
            _stop(stop, trainers, watchers, logs, settle=1.5, timeout=30)
        finally:
            _kill_left(stop, watchers)

        assert stranded == [], "an entry's folder was removed while the entry remained"
        assert prunes >= 5, "the pruner must have run throughout"
        completed = [
            str(root / "exec" / attempt / name)
            for (attempt, _), trainer in zip(EXECUTIONS, trainers, strict=True)
            for name in trainer.completed
        ]
        assert len(completed) > 40
        assert _published(logs) == sorted(completed), "every complete save exactly once, nothing else"

        newest = _newest_completed(trainers)
        store = PosixStore(str(root))
        assert store.resolve() == newest
        assert newest.epoch == 2_000
        assert _entries_have_folders(root) == []
        assert len(store.entries()) >= 4


def _s3_env(server: RgwServer, tmp: Path) -> dict[str, str]:
    """Our environment without AWS, ckpt or scheduler settings, plus the gateway's keys."""
    env = {k: v for k, v in _env().items() if not k.upper().startswith(("AWS_", "HTTP_PROXY", "HTTPS_PROXY"))}
    env.update(
        AWS_ACCESS_KEY_ID=server.access_key,
        AWS_SECRET_ACCESS_KEY=server.secret_key,
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
    )
    return env


def _stranded_in_bucket(store: S3Store, client: Any, bucket: str) -> list[str]:
    """The remaining entries whose save has no ``trainer_state.json`` object (empty when all is well)."""
    keys = {
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="exec/")
        for item in page.get("Contents", ())
    }
    return [e.save for e in store.entries() if f"{e.save}/trainer_state.json" not in keys]


@pytest.mark.slow
class TestSustainedRunOnS3:
    def test_four_watchers_two_epochs_and_a_pruner_on_rgw(
        self, rgw_server: RgwServer, tmp_path: Path
    ) -> None:
        """The same run on a bucket of Ceph RGW: nothing lost or duplicated, none stranded, newest wins."""
        client = raw_client(rgw_server.endpoint)
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        root = f"s3://{bucket}"
        config = tmp_path / "ckpt.toml"
        config.write_text(
            f'[s3]\nendpoint_url = "{rgw_server.endpoint}"\nregion = "us-east-1"\naddressing_style = "path"\n'
            'connect_timeout = 2\nread_timeout = 20\nmax_attempts = 3\n\n[[credentials]]\nsource = "env"\n'
        )
        env = _s3_env(rgw_server, tmp_path)
        ckpt = [sys.executable, "-m", "ckpt", "--config", str(config), "--root", root]
        stop = threading.Event()
        trainers, watchers = [], []
        logs = [tmp_path / f"watch-{attempt}.log" for attempt, _ in EXECUTIONS]
        try:
            for (attempt, epoch), log in zip(EXECUTIONS, logs, strict=True):
                # Each trainer its own client: a botocore client is shared by threads, but its own is plainer.
                sink = BucketSink(raw_client(rgw_server.endpoint), bucket, f"exec/{attempt}")
                trainers.append(_Trainer(sink, stop, chunk=16384))
                with log.open("w") as err:
                    watchers.append(
                        subprocess.Popen(
                            [*ckpt, "--log-format", "json", "watch", "--framework", "hf", "--attempt",
                             attempt, "--epoch", str(epoch), "--interval", "0.3", "--settle", "0.5"],
                            stdout=subprocess.DEVNULL, stderr=err, env=env,
                        )
                    )  # fmt: skip
            for trainer in trainers:
                trainer.start()
            store = S3Store(root, raw_client(rgw_server.endpoint))
            deadline = time.monotonic() + S3_DURATION
            prunes, stranded = 0, []
            while time.monotonic() < deadline:
                time.sleep(2.0)
                result = subprocess.run(
                    [*ckpt, "--json", "prune", "--keep", "4"],
                    capture_output=True, text=True, env=env, check=False, timeout=120,
                )  # fmt: skip
                assert result.returncode == 0, result.stderr
                prunes += 1
                stranded += _stranded_in_bucket(store, client, bucket)
            # The last saves settle (0.5 s) and are published on the next scans.
            _stop(stop, trainers, watchers, logs, settle=3.0, timeout=60)
        finally:
            _kill_left(stop, watchers)

        assert stranded == [], "an entry's save was removed while the entry remained"
        assert prunes >= 3, "the pruner must have run throughout"
        completed = [
            f"{root}/exec/{attempt}/{name}"
            for (attempt, _), trainer in zip(EXECUTIONS, trainers, strict=True)
            for name in trainer.completed
        ]
        assert len(completed) > 20
        assert _published(logs) == sorted(completed), "every complete save exactly once, nothing else"
        newest = _newest_completed(trainers)
        assert store.resolve() == newest
        assert newest.epoch == 2_000
        assert _stranded_in_bucket(store, client, bucket) == []
        assert len(store.entries()) >= 4
