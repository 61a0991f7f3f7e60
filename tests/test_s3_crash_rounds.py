"""Crash rounds on S3: ``ckpt watch`` and a simulated trainer killed with SIGKILL at random moments.

A trainer (``support.trainer bucket``) writes saves into a bucket object by object (on moto's server, then on
Ceph RGW), every kind of hf or dcp save, complete ones and ones that never complete. Meanwhile, round after
round, a ``ckpt watch`` process is started on the same execution (``--root s3://BUCKET --config FILE``, its
``[s3]`` table pointing at the server, its ``[proxy]`` table at a recording proxy, keys from the ``env``
credential source) and killed with SIGKILL after a random time: while starting, while learning the published
entries, between requests, with a put in flight (every fifth one lives until it has put an entry, so that even
a slow machine sees publications between kills). Every few rounds the trainer is killed too, leaving its
current save as it was, and restarted at the next save of its plan. At the end the trainer finishes (or is
killed one last time) and one last ``watch --once`` runs.

Then every save that is complete (judged here from the objects themselves, by the framework's rule:
``trainer_state.json`` is a JSON object and no sentinel, or ``.metadata`` present) is published exactly
once, at the watcher's epoch and the folder's step, and nothing else is published. And no save was published
before it was complete: the first put of each entry reached the proxy after the trainer began the request
that completed the save (for the saves the trainer was not killed in).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from ckpt.adapters.s3 import S3Store
from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name
from support.forward_proxy import ForwardProxy
from support.s3 import new_bucket_name, raw_client

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
CKPT = [sys.executable, "-m", "ckpt"]
TRAINER = [sys.executable, "-m", "support.trainer", "bucket"]
# One label, which only the proxy resolves (moto's server reads a dotted host's first label as a bucket).
PROXIED_HOST = "s3-only-via-proxy"
ATTEMPT = "2.4102.0"
EPOCH = 2_000_000
ROUNDS = 50
TRAINER_KILL_CHANCE = 0.2  # per round
PROGRESS_EVERY = 5  # every fifth watcher lives until it has put an entry (at most PROGRESS_LIMIT seconds)
PROGRESS_LIMIT = 8.0


@pytest.fixture(scope="module")
def proxy(s3_server: str) -> Iterator[ForwardProxy]:
    """A recording proxy to moto: it sees, and timestamps, every request the watchers send."""
    port = int(s3_server.rsplit(":", 1)[1])
    with ForwardProxy(resolve={PROXIED_HOST: ("127.0.0.1", port)}) as forward_proxy:
        yield forward_proxy


def wait_for_a_put(proxy: ForwardProxy, bucket: str, *, since: float, limit: float) -> None:
    """Wait until a put into ``pub/`` of ``bucket`` that arrived after ``since`` has been answered."""
    deadline = time.monotonic() + limit
    prefix = f"/{bucket}/pub/"
    while time.monotonic() < deadline:
        recorded = proxy.requests
        if any(r.method == "PUT" and r.path.startswith(prefix) and r.received_at >= since for r in recorded):
            return
        time.sleep(0.05)


def environment(tmp: Path, **extra: str) -> dict[str, str]:
    """Our environment without any AWS, ckpt or scheduler setting, plus fake keys and ``extra``."""
    prefixes = ("AWS_", "CKPT_", "DISPATCH_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(prefixes)}
    env.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_CONFIG_FILE=str(tmp / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-aws-credentials"),
        AWS_EC2_METADATA_DISABLED="true",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


@dataclass
class Execution:
    """One execution's world: the bucket, the config file the watchers read, their arguments and logs."""

    framework: str
    bucket: str
    config: Path
    tmp: Path
    log: IO[bytes]
    endpoint: str

    @property
    def watch_args(self) -> list[str]:
        settle = "0.5" if self.framework == "hf" else "0"
        return [
            *CKPT,
            "--root",
            f"s3://{self.bucket}",
            "--config",
            str(self.config),
            "watch",
            "--framework",
            self.framework,
            "--attempt",
            ATTEMPT,
            "--epoch",
            str(EPOCH),
            "--interval",
            "0.05",
            "--settle",
            settle,
            "--scan-timeout",
            "30",
        ]

    def start_watcher(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.watch_args, stdout=subprocess.DEVNULL, stderr=self.log, env=environment(self.tmp)
        )


@dataclass(frozen=True)
class Pace:
    """How fast things go for one framework: the trainer's plan and gaps, and how long a watcher lives.

    An hf watcher needs two scans a settle time apart before it publishes, and on S3 a scan costs a few
    requests per save not yet published, so hf watchers live longer and the hf trainer saves less often.
    """

    trainer_rounds: int
    gap: float
    lifetime: tuple[float, float]


PACES = {"hf": Pace(trainer_rounds=3, gap=1.6, lifetime=(0.3, 2.0)), "dcp": Pace(12, 0.8, (0.2, 1.4))}


@dataclass
class Trainer:
    """The simulated trainer, restarted after each kill at the plan item after the one it was writing."""

    execution: Execution
    pace: Pace
    events: Path
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0
    starts: list[int] = field(default_factory=list)

    def start(self, at: int) -> None:
        self.starts.append(at)
        self.process = subprocess.Popen(
            [
                *TRAINER,
                *("--endpoint", self.execution.endpoint, "--bucket", self.execution.bucket),
                *("--saves", f"exec/{ATTEMPT}", "--framework", self.execution.framework),
                *("--events", str(self.events), "--start", str(at)),
                *("--rounds", str(self.pace.trainer_rounds), "--pace", "0.02", "--gap", str(self.pace.gap)),
            ],
            cwd=TESTS,
            stdout=subprocess.DEVNULL,
            stderr=self.execution.log,
            env=environment(self.execution.tmp),
        )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=20)
        self.kills += 1

    def restart(self) -> None:
        """Start again after the last plan item begun (its save is left as the kill left it)."""
        events = read_events(self.events)
        if not events.finished:
            self.start(max(events.started, default=-1) + 1)


@dataclass
class Events:
    """What the trainer reported: per plan item, its folder and when it started, completed, was written."""

    folders: dict[int, str] = field(default_factory=dict)
    started: dict[int, float] = field(default_factory=dict)
    completing: dict[int, float] = field(default_factory=dict)
    written: dict[int, bool] = field(default_factory=dict)  # item -> whether it is a complete kind
    finished: bool = False


def read_events(path: Path) -> Events:
    events = Events()
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        document = json.loads(line)  # whole lines only: each event is one write
        index = document.get("index")
        if document.get("finished"):
            events.finished = True
        elif "started" in document:
            events.folders[index] = document["save"]
            events.started[index] = document["started"]
        elif "completing_at" in document:
            events.completing[index] = document["completing_at"]
        elif "written" in document:
            events.written[index] = document["complete"]
    return events


def complete_saves(client: Any, bucket: str, framework: str) -> dict[str, int]:
    """Judge, from the objects alone, which save folders are complete; return folder -> step."""
    prefix = f"exec/{ATTEMPT}/"
    keys: set[str] = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys.update(obj["Key"][len(prefix) :] for obj in page.get("Contents", ()))
    complete: dict[str, int] = {}
    for folder in {key.split("/", 1)[0] for key in keys}:
        if framework == "hf":
            match = re.fullmatch(r"checkpoint-([0-9]+)", folder)
            if not match or f"{folder}/checkpoint-is-incomplete.txt" in keys:
                continue
            if f"{folder}/trainer_state.json" not in keys:
                continue
            body = client.get_object(Bucket=bucket, Key=f"{prefix}{folder}/trainer_state.json")["Body"].read()
            try:
                if not isinstance(json.loads(body), dict):
                    continue
            except ValueError:
                continue
        else:
            match = re.fullmatch(r"step-([0-9]+)", folder)
            if not match or f"{folder}/.metadata" not in keys:
                continue
        complete[folder] = int(match.group(1))
    return complete


@pytest.fixture
def execution(
    s3_server: str, proxy: ForwardProxy, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Execution]:
    """A fresh bucket and the config file pointing the watchers at it through the proxy."""
    framework: str = request.param
    bucket = new_bucket_name()
    raw_client(s3_server).create_bucket(Bucket=bucket)
    config = tmp_path / "ckpt.toml"
    config.write_text(
        f'[s3]\nendpoint_url = "http://{PROXIED_HOST}"\nregion = "us-east-1"\naddressing_style = "path"\n'
        "connect_timeout = 2\nread_timeout = 10\nmax_attempts = 3\n\n"
        f'[proxy]\nhttp_proxy = "{proxy.url}"\n\n[[credentials]]\nsource = "env"\n'
    )
    with (tmp_path / "processes.log").open("ab") as log:
        yield Execution(framework, bucket, config, tmp_path, log, s3_server)


class TestKillAndRestartOnS3:
    # Both kinds on moto; on RGW the dcp one, whose watcher publishes most often (the server's exclusive
    # create and listings are what RGW adds; the hf rounds prove the rule's settle, the same on both).
    @pytest.mark.parametrize(
        ("s3_server", "execution"), [("moto", "hf"), ("moto", "dcp"), ("rgw", "dcp")], indirect=True
    )
    def test_every_complete_save_is_published_exactly_once(
        self, execution: Execution, proxy: ForwardProxy, s3_server: str
    ) -> None:
        """Watchers and the trainer killed at random: every complete save once, nothing else, never early."""
        rng = random.Random(f"s3-crash-rounds-{execution.framework}")
        pace = PACES[execution.framework]
        trainer = Trainer(execution, pace, execution.tmp / "events.jsonl")
        trainer.start(0)
        watcher: subprocess.Popen[bytes] | None = None
        client = raw_client(s3_server)
        store = S3Store(f"s3://{execution.bucket}", client)
        try:
            for number in range(ROUNDS):
                born, born_at = time.monotonic(), time.time()
                watcher = execution.start_watcher()
                lifetime = rng.uniform(*pace.lifetime)
                if rng.random() < TRAINER_KILL_CHANCE and trainer.running():
                    time.sleep(rng.uniform(0.0, lifetime))
                    trainer.kill()
                    trainer.restart()
                time.sleep(max(0.0, born + lifetime - time.monotonic()))
                if number % PROGRESS_EVERY == PROGRESS_EVERY - 1 and trainer.running():
                    # A slow machine may kill every watcher before its second scan: while saves keep coming,
                    # this one lives until it has put an entry (or long enough to), then a moment more.
                    wait_for_a_put(proxy, execution.bucket, since=born_at, limit=PROGRESS_LIMIT)
                    time.sleep(rng.uniform(0.0, 0.3))
                watcher.kill()
                watcher.wait(timeout=20)
                watcher = None
            published_while_killing = len(store.entries())
            assert trainer.process is not None
            try:
                trainer.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                trainer.kill()  # one last crash: its last save stays as it was
        finally:
            for process in (watcher, trainer.process):
                if process is not None and process.poll() is None:
                    process.kill()
                    process.wait()
        final = subprocess.run(
            [*execution.watch_args, "--once"],
            capture_output=True,
            env=environment(execution.tmp),
            timeout=120,
            check=False,
        )
        assert final.returncode == 0, final.stderr.decode()[-2000:]

        events = read_events(trainer.events)
        complete = complete_saves(client, execution.bucket, execution.framework)
        expected = sorted(Entry(EPOCH, step, f"exec/{ATTEMPT}/{folder}") for folder, step in complete.items())
        entries = store.entries()
        assert entries == expected  # every complete save, each once, at our epoch; nothing else
        assert published_while_killing > 0, "no round got as far as publishing; the test proves nothing"
        assert trainer.kills > 0, "the trainer was never killed"

        # Saves the trainer wrote without being killed end as their kind says they do.
        folders = {index: folder for index, folder in events.folders.items() if index in events.written}
        assert {f for i, f in folders.items() if events.written[i]} <= set(complete)
        assert not {f for i, f in folders.items() if not events.written[i]} & set(complete)
        assert len(folders) > ROUNDS // 5, "the trainer hardly wrote anything"

        # Never early: the first put of each entry reached the proxy after the completing request began.
        first_put: dict[str, float] = {}
        for recorded in proxy.requests:
            if recorded.method == "PUT" and recorded.path.startswith(f"/{execution.bucket}/pub/"):
                name = recorded.path.rsplit("/", 1)[1]
                first_put[name] = min(first_put.get(name, recorded.received_at), recorded.received_at)
        checked = 0
        for index, completing_at in events.completing.items():
            folder = events.folders[index]
            if index in events.written and folder in complete:
                entry = Entry(EPOCH, complete[folder], f"exec/{ATTEMPT}/{folder}")
                assert first_put[format_entry_name(entry)] >= completing_at, folder
                checked += 1
        assert checked >= len(expected) // 2, (checked, len(expected))  # most saves were not interrupted
