"""Crash rounds on POSIX: ``ckpt watch`` and a simulated trainer, both killed with SIGKILL at random moments.

A trainer process (``support.trainer folder --plan endless``) writes tiny saves file by file into one
execution's folder; a ``ckpt watch`` process publishes them. Round after round, at a random moment (mostly
while the watcher scans and publishes, sometimes while it starts), the watcher, the trainer or both are killed
with SIGKILL, and whatever was killed is started again: the watcher from scratch, the trainer with the save
after the one it was killed in, which stays half-written forever (``hf`` 140 rounds, ``dcp`` 60). At the end
the trainer is killed one last time, and one last watcher runs until it has published the rest and is stopped
with SIGTERM, as the end of a job stops it.

Then, judged from the files themselves: every complete save (exactly the files and bytes its kind ends with)
is published exactly once, at the watcher's epoch and the folder's step, and nothing else is. Nothing was
published before it was complete, checked three ways: a thread in this process looks at each save's files as
soon as its entry appears (a save published early would still be missing bytes); the entry's file time is
not before the trainer's ``completing_at`` event; and the watchers' ``--log-format json`` publication lines
(never two for one entry) are not before it either.

The kill schedule comes from a seed: a fixed one in the test command (ADR 0013: the same schedule on every
clone), printed (pytest shows it when a test fails); set ``CKPT_CRASH_SEED`` to replay or to explore another.
"""

from __future__ import annotations

import calendar
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name, parse_entry_name
from support.saves import read_files
from support.trainer import manifest, spec_at

TESTS = Path(__file__).parent
CKPT = [sys.executable, "-m", "ckpt"]
TRAINER = [sys.executable, "-m", "support.trainer", "folder", "--plan", "endless"]
ATTEMPT = "2.4102.0"
EPOCH = 2_000_000
ROUNDS = {"hf": 140, "dcp": 60}
# A round's kill comes a random time after the watcher logged that it is watching (so that kills land in
# scans and publications however slow start-up is on a loaded host), or, in one round of five, a random time
# after the round began (so that some land in start-up too).
DELAY_AFTER_WATCHING = (0.0, 0.3)
DELAY_FROM_START = (0.0, 0.3)
STARTUP_KILL_CHANCE = 0.2
# Who dies in a round, and how likely: the watcher alone, the trainer alone, or both at once.
VICTIMS = (("watcher",), ("trainer",), ("watcher", "trainer"))
VICTIM_WEIGHTS = (0.4, 0.3, 0.3)
SETTLE = {"hf": "0.1", "dcp": "0"}
# File times come from the kernel's coarse clock, a tick behind time.time(); 20 ms covers any tick length.
FILE_TIME_SLACK = 0.02


# The kill schedule of the test command; a run under CKPT_CRASH_SEED explores another.
DEFAULT_SEED = 20261201


@pytest.fixture
def seed() -> int:
    """This run's kill schedule: ``CKPT_CRASH_SEED``, else ``DEFAULT_SEED`` (printed either way)."""
    chosen = int(os.environ.get("CKPT_CRASH_SEED") or DEFAULT_SEED)
    print(f"crash rounds seed: CKPT_CRASH_SEED={chosen}")
    return chosen


def environment() -> dict[str, str]:
    """Our environment without ckpt's, the scheduler's or AWS's variables, unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def watch_args(root: Path, framework: str, *options: str) -> list[str]:
    """``ckpt [OPTIONS] watch`` on the execution's folder, logging JSON lines, scanning every 40 ms."""
    return [
        *CKPT,
        *("--root", str(root), "--log-format", "json", *options),
        *("watch", "--framework", framework, "--attempt", ATTEMPT, "--epoch", str(EPOCH)),
        *("--interval", "0.04", "--settle", SETTLE[framework], "--scan-timeout", "30"),
    ]


def pub_names(root: Path) -> set[str]:
    """The names in ``pub/`` (none before the first publication)."""
    try:
        return set(os.listdir(root / "pub"))
    except FileNotFoundError:
        return set()


class PublicationObserver(threading.Thread):
    """Looks at each save's files the moment its entry first appears in ``pub/``, and keeps what it saw.

    The trainer never changes a save once it is complete, so a save seen incomplete after its entry exists
    was published before it was complete.
    """

    def __init__(self, root: Path, framework: str) -> None:
        super().__init__(name="publication-observer", daemon=True)
        self.root = root
        self.framework = framework
        self.seen: dict[str, bool] = {}  # entry name -> its save was complete when first seen
        self.early: list[str] = []
        self._stop_requested = threading.Event()

    def run(self) -> None:
        while not self._stop_requested.is_set():
            self.look()
            self._stop_requested.wait(0.005)
        self.look()

    def look(self) -> None:
        try:
            names = os.listdir(self.root / "pub")
        except FileNotFoundError:
            return
        for name in names:
            if name in self.seen:
                continue
            entry = parse_entry_name(name)
            index = entry.step // 10 - 1
            files = read_files(self.root / entry.save)
            complete = entry.step % 10 == 0 and files == manifest(spec_at(self.framework, index))
            self.seen[name] = complete
            if not complete:
                self.early.append(f"{entry.save} published while it held {sorted(files)}")

    def stop(self) -> None:
        self._stop_requested.set()
        self.join(10)


@dataclass
class Events:
    """What the trainer reported, by plan index."""

    started: dict[int, float] = field(default_factory=dict)
    completing: dict[int, float] = field(default_factory=dict)
    complete: dict[int, float] = field(default_factory=dict)


def read_events(path: Path) -> Events:
    events = Events()
    for line in path.read_text().splitlines():
        document = json.loads(line)  # each event is one write: a kill never leaves half a line
        if "started" in document:
            events.started[document["index"]] = document["started"]
        elif "completing_at" in document:
            events.completing[document["index"]] = document["completing_at"]
        elif document.get("complete"):
            events.complete[document["index"]] = document["written"]
    return events


@dataclass
class Publication:
    """One ``published`` line of a watcher's JSON log: the entry and the record's time (ms, rounded down)."""

    entry: str
    at: float
    log: str


def read_watch_logs(logs: list[Path]) -> tuple[list[Publication], list[str]]:
    """The ``published`` lines of every watcher's log, and every line that is not an info record.

    A watcher killed mid-line may end its log with part of a line; only a log's last line may be cut.
    """
    publications: list[Publication] = []
    odd: list[str] = []
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        for number, line in enumerate(lines):
            try:
                record = json.loads(line)
            except ValueError:
                if number != len(lines) - 1:
                    odd.append(f"{log.name}: {line}")
                continue
            if record.get("level") != "info":
                odd.append(f"{log.name}: {line}")
            elif record.get("message") == "published":
                stamp, millis = record["time"].rstrip("Z").split(".")
                at = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000
                publications.append(Publication(record["entry"], at, log.name))
    return publications, odd


def wait_until_watching(watcher: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    """Return once ``watcher`` has logged that it is watching (its signal handlers are then in place).

    Also returns if it exits or takes longer than ``timeout``: the caller's checks then report it.
    """
    deadline = time.monotonic() + timeout
    while b'"message": "watching ' not in log.read_bytes():
        if watcher.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.005)


@dataclass
class Crew:
    """The watcher and the trainer of one execution, each restarted after every kill."""

    root: Path
    framework: str
    tmp: Path
    trainer_log: IO[bytes]
    watcher: subprocess.Popen[bytes] | None = None
    trainer: subprocess.Popen[bytes] | None = None
    watcher_logs: list[Path] = field(default_factory=list)
    kills: dict[str, int] = field(default_factory=lambda: {"watcher": 0, "trainer": 0})
    exited_on_their_own: list[str] = field(default_factory=list)

    @property
    def events(self) -> Path:
        return self.tmp / "events.jsonl"

    def start_missing(self) -> None:
        """Start the watcher and the trainer, whichever is not running."""
        self._notice_exits()
        if self.watcher is None:
            log = self.tmp / "logs" / f"watch-{len(self.watcher_logs):03d}.log"
            self.watcher_logs.append(log)
            with log.open("wb") as stderr:
                self.watcher = subprocess.Popen(
                    watch_args(self.root, self.framework),
                    stdout=subprocess.DEVNULL,
                    stderr=stderr,
                    env=environment(),
                )
        if self.trainer is None:
            self.trainer = subprocess.Popen(
                [
                    *TRAINER,
                    *("--framework", self.framework, "--saves", str(self.root / "exec" / ATTEMPT)),
                    *("--events", str(self.events), "--pace", "0.004", "--gap", "0.03"),
                ],
                cwd=TESTS,
                stdout=self.trainer_log,
                stderr=self.trainer_log,
                env=environment(),
            )

    def wait_until_watching(self) -> None:
        """Return once the current watcher has logged that it is watching."""
        assert self.watcher is not None
        wait_until_watching(self.watcher, self.watcher_logs[-1])

    def _notice_exits(self) -> None:
        for who, process in (("watcher", self.watcher), ("trainer", self.trainer)):
            if process is not None and process.poll() is not None:
                self.exited_on_their_own.append(f"{who} exited with {process.returncode}")
                setattr(self, who, None)

    def kill(self, victims: tuple[str, ...]) -> None:
        """SIGKILL the victims that are running; they are started again by the next ``start_missing``."""
        self._notice_exits()
        for who in victims:
            process: subprocess.Popen[bytes] | None = getattr(self, who)
            if process is not None:
                process.kill()
                process.wait(timeout=20)
                self.kills[who] += 1
                setattr(self, who, None)

    def kill_all(self) -> None:
        self.kill(("watcher", "trainer"))


@pytest.mark.slow
class TestCrashRounds:
    @pytest.mark.parametrize("framework", ["hf", "dcp"])
    def test_every_complete_save_is_published_once_and_nothing_early_or_incomplete(
        self, tmp_path: Path, framework: str, seed: int
    ) -> None:
        """Watcher and trainer SIGKILLed at random: each complete save is published once, never early."""
        rng = random.Random(f"{seed}-{framework}")
        root = tmp_path / "root"
        (root / "exec" / ATTEMPT).mkdir(parents=True)
        (tmp_path / "logs").mkdir()
        context = f"(framework {framework}, CKPT_CRASH_SEED={seed}, logs in {tmp_path})"
        observer = PublicationObserver(root, framework)
        observer.start()
        final: subprocess.Popen[bytes] | None = None
        try:
            with (tmp_path / "trainer.log").open("ab") as trainer_log:
                crew = Crew(root, framework, tmp_path, trainer_log)
                try:
                    for _ in range(ROUNDS[framework]):
                        crew.start_missing()
                        if rng.random() < STARTUP_KILL_CHANCE:
                            time.sleep(rng.uniform(*DELAY_FROM_START))
                        else:
                            crew.wait_until_watching()
                            time.sleep(rng.uniform(*DELAY_AFTER_WATCHING))
                        crew.kill(rng.choices(VICTIMS, VICTIM_WEIGHTS)[0])
                    crew.kill_all()  # the trainer's last save stays as it was
                finally:
                    crew.kill_all()
            published_while_killing = len(pub_names(root))
            events = read_events(crew.events)
            saves = root / "exec" / ATTEMPT
            complete = {
                i
                for i in events.started
                if read_files(saves / spec_at(framework, i).folder) == manifest(spec_at(framework, i))
            }
            specs = [spec_at(framework, i) for i in complete]
            expected = sorted(Entry(EPOCH, s.step, f"exec/{ATTEMPT}/{s.folder}") for s in specs)
            # One last watcher, left to run until it has published what it will, then stopped as a job's end
            # stops it (SIGTERM). Exactly once means it publishes the rest and nothing else. (Not ``watch
            # --once``: its drain can end before a candidate listed late in a slow scan has had its second
            # look, which on a loaded host leaves complete saves unpublished; a defect of its own.)
            final_log = tmp_path / "logs" / "watch-final.log"
            with final_log.open("wb") as stderr:
                final = subprocess.Popen(
                    watch_args(root, framework, "--json"),
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    env=environment(),
                )
            wait_until_watching(final, final_log)
            wanted = {format_entry_name(e) for e in expected}
            give_up = time.monotonic() + 60
            while not wanted <= pub_names(root) and time.monotonic() < give_up:
                time.sleep(0.05)
            time.sleep(0.2)  # and a few more scans, in which it must publish nothing
            final.send_signal(signal.SIGTERM)
            final_out, _ = final.communicate(timeout=60)
        finally:
            observer.stop()
            if final is not None and final.poll() is None:
                final.kill()
                final.communicate()
        assert final.returncode == 0, f"final watch: {final_log.read_text()[-2000:]} {context}"

        # Nothing was published before it was complete, nor incomplete: seen as its entry appeared.
        assert observer.early == [], f"published before complete {context}"
        half_written = set(events.started) - complete
        entries = PosixStore(str(root)).entries()
        missing = sorted(set(expected) - set(entries))
        unexpected = sorted(set(entries) - set(expected))
        assert (missing, unexpected) == ([], []), f"entries: (missing, unexpected) {context}"
        assert len(entries) == len(expected), context
        # Every save the trainer recorded as complete is complete on disk.
        assert set(events.complete) <= complete, f"{sorted(set(events.complete) - complete)} {context}"
        # Only the save a trainer was killed in is ever half-written: one per trainer kill at most.
        assert len(half_written) <= crew.kills["trainer"], f"{sorted(half_written)} {context}"

        # Nothing was published before it was complete: the entry's file time, the watchers' log lines.
        assert set(observer.seen) == {format_entry_name(e) for e in entries}, context
        too_early = []
        for entry in entries:
            index = entry.step // 10 - 1
            created = os.stat(root / "pub" / format_entry_name(entry)).st_mtime
            if created < events.completing[index] - FILE_TIME_SLACK:
                too_early.append((entry.save, created, events.completing[index]))
        assert too_early == [], (
            f"entry file older than the save's completion (save, entry, completing) {context}"
        )

        publications, odd = read_watch_logs([*crew.watcher_logs, final_log])
        assert odd == [], f"watcher log lines other than info records {context}"
        by_entry: dict[str, list[str]] = {}
        for publication in publications:
            by_entry.setdefault(publication.entry, []).append(publication.log)
        assert {n: logs for n, logs in by_entry.items() if len(logs) > 1} == {}, f"published twice {context}"
        assert set(by_entry) <= {format_entry_name(e) for e in entries}, context
        logged_early = [
            (p.entry, p.at, events.completing[parse_entry_name(p.entry).step // 10 - 1])
            for p in publications
            if p.at < events.completing[parse_entry_name(p.entry).step // 10 - 1] - 0.001
        ]
        assert logged_early == [], (
            f"logged before the save's completion (entry, logged, completing) {context}"
        )
        final_document = json.loads(final_out)
        assert len(final_document["published"]) == len(entries) - published_while_killing, context

        # The rounds proved something: kills landed, saves were left half-written, watchers published.
        assert crew.exited_on_their_own == [], context
        # (The schedule kills the watcher in 70% of rounds, the trainer in 60%: these bounds are far below.)
        assert crew.kills["watcher"] >= ROUNDS[framework] * 2 // 5, f"{crew.kills} {context}"
        assert crew.kills["trainer"] >= ROUNDS[framework] // 4, f"{crew.kills} {context}"
        assert half_written, f"no trainer kill landed mid-save {context}"
        productive = {p.log for p in publications} - {final_log.name}
        assert len(productive) >= 5, f"only {len(productive)} watchers published before their kill {context}"
        assert published_while_killing >= len(entries) // 10, (
            f"watchers published only {published_while_killing} of {len(entries)} saves while being killed "
            f"{context}"
        )
        print(
            f"{framework}: {ROUNDS[framework]} rounds, kills {crew.kills}, {len(entries)} saves published "
            f"({published_while_killing} during the rounds, by {len(productive)} watchers), "
            f"{len(half_written)} left half-written"
        )
