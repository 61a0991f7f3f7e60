"""Following the publication log: the pure rule, ``ckpt.application.following.follow`` on every store,
S3's request budget on the wire, and ``ckpt follow`` as a real process (output, signals, exit codes)."""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import PAGE_SIZE, S3Store
from ckpt.application.following import follow
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError, MalformedError
from ckpt.domain.follow import Followed, new_entries
from ckpt.domain.names import format_entry_name
from ckpt.testing import InMemoryStore
from support.harness import Harness
from support.s3 import RequestLog, new_bucket_name, raw_client
from support.silent_endpoint import silent_endpoint, silent_s3_config

CKPT = [sys.executable, "-m", "ckpt"]
OLD = Entry(2, 100, "exec/b/ck-100")
NEW = Entry(2, 200, "exec/b/ck-200")
ZOMBIE = Entry(1, 900, "exec/a/ck-900")


class TestNewEntries:
    def test_unseen_entries_come_ascending_and_only_the_greatest_is_the_latest(self) -> None:
        """A zombie's late entry and an entry overtaken in the same listing are marked as not the latest."""
        between = Entry(2, 150, "exec/b/ck-150")
        assert new_entries([NEW, ZOMBIE, OLD, between], seen=[OLD]) == (
            Followed(ZOMBIE, latest=False),
            Followed(between, latest=False),
            Followed(NEW, latest=True),
        )

    def test_a_seen_entry_is_never_new_again(self) -> None:
        """An entry seen in any earlier listing is not new, even when it is the latest."""
        assert new_entries([OLD, NEW], seen=[NEW, OLD]) == ()

    def test_a_zombie_alone_is_not_the_latest(self) -> None:
        """The only new entry is not the latest when an older-looking greater entry is in the listing."""
        assert new_entries([OLD, ZOMBIE], seen=[OLD]) == (Followed(ZOMBIE, latest=False),)

    def test_an_empty_listing_has_nothing_new(self) -> None:
        """No entries: nothing is new."""
        assert new_entries([], seen=[OLD]) == ()


def _memory_store() -> InMemoryStore:
    store = InMemoryStore()
    for entry in (OLD, NEW, ZOMBIE, Entry(2, 300, "exec/b/ck-300"), Entry(2, 1000, "exec/b/ck-1000")):
        store.make_dir(store.location(entry))
    return store


def _publish(store: Any, entry: Entry) -> None:
    store.publish(entry.epoch, entry.step, store.location(entry))


class TestFollow:
    def test_it_starts_from_now(self) -> None:
        """Entries published before ``follow`` is called are not yielded; the next one is, as the latest."""
        store = _memory_store()
        _publish(store, OLD)
        followed = follow(store, interval=0.01)
        _publish(store, NEW)
        assert next(followed) == Followed(NEW, latest=True)
        followed.close()

    def test_from_start_yields_what_is_published_first(self) -> None:
        """With from_start the entries already there come first, ascending, the greatest as the latest."""
        store = _memory_store()
        _publish(store, NEW)
        _publish(store, ZOMBIE)
        followed = follow(store, interval=0.01, from_start=True)
        assert [next(followed), next(followed)] == [Followed(ZOMBIE, False), Followed(NEW, True)]
        followed.close()

    def test_a_zombies_late_publication_is_shown_as_not_the_latest(self) -> None:
        """A late entry at an older epoch is yielded, marked as not the latest."""
        store = _memory_store()
        _publish(store, NEW)
        followed = follow(store, interval=0.01)
        _publish(store, ZOMBIE)
        assert next(followed) == Followed(ZOMBIE, latest=False)
        followed.close()

    def test_each_entry_once_even_when_a_prune_removed_and_put_it_back(self) -> None:
        """An entry that vanished from a listing and came back is not yielded again."""
        store = _memory_store()
        followed = follow(store, interval=0.01)
        _publish(store, OLD)
        assert next(followed) == Followed(OLD, True)
        _publish(store, NEW)
        assert next(followed) == Followed(NEW, True)
        store.prune(keep=1)
        assert store.entries() == [NEW]
        store.make_dir(store.location(OLD))  # the prune removed its folder too
        _publish(store, OLD)  # back again
        third = Entry(2, 300, "exec/b/ck-300")
        _publish(store, third)
        assert next(followed) == Followed(third, True)
        followed.close()

    def test_on_posix_too(self, tmp_path: Path) -> None:
        """The same on a POSIX root."""
        store = PosixStore(str(tmp_path))
        for entry in (OLD, NEW, ZOMBIE):
            os.makedirs(store.location(entry))
        _publish(store, NEW)
        followed = follow(store, interval=0.01)
        _publish(store, ZOMBIE)
        assert next(followed) == Followed(ZOMBIE, latest=False)
        followed.close()

    def test_stop_ends_a_waiting_follow_at_once(self) -> None:
        """Setting stop during a (long) wait ends the generator without another listing."""
        store = _memory_store()
        stop = threading.Event()
        got: list[Followed] = []
        followed = follow(store, interval=3600, stop=stop)
        consumer = threading.Thread(target=lambda: got.extend(followed))
        consumer.start()
        stop.set()
        consumer.join(10)
        assert not consumer.is_alive()
        assert got == []

    def test_a_malformed_log_is_raised(self) -> None:
        """A bad name in pub/ ends the follow with MalformedError."""
        store = _memory_store()
        followed = follow(store, interval=0.01)
        store.put_raw_entry("not-an-entry")
        with pytest.raises(MalformedError):
            next(followed)

    @pytest.mark.parametrize(
        ("interval", "scan_timeout"), [(0, 1), (-1, 1), (math.nan, 1), (math.inf, 1), (True, 1), (1, 0)]
    )
    def test_invalid_seconds_are_refused_before_any_listing(self, interval: Any, scan_timeout: Any) -> None:
        """A non-positive, non-finite or non-number interval or scan timeout is InvalidError."""
        store = InMemoryStore()
        store.put_raw_entry("not-an-entry")  # a listing would raise MalformedError instead
        with pytest.raises(InvalidError):
            follow(store, interval=interval, scan_timeout=scan_timeout)


class TestStoreFollow:
    def test_every_store_follows_its_own_log(self, harness: Harness) -> None:
        """store.follow() on every store: from now, a zombie's late entry marked, the new latest marked."""
        store = harness.store()
        store.publish(2, 100, harness.make_save("exec/b/ck-100"))
        followed = store.follow(interval=0.01)
        zombie = store.publish(1, 900, harness.make_save("exec/a/ck-900"))
        newest = store.publish(2, 200, harness.make_save("exec/b/ck-200"))
        assert [next(followed), next(followed)] == [Followed(zombie, False), Followed(newest, True)]
        followed.close()


@pytest.fixture
def s3_bucket(s3_server: str) -> tuple[str, Any]:
    """A fresh bucket on moto's server, and a client that arranges it."""
    bucket = new_bucket_name()
    client = raw_client(s3_server)
    client.create_bucket(Bucket=bucket)
    return bucket, client


class TestS3Budget:
    @pytest.mark.parametrize("published", [0, 10, 1500])
    def test_nothing_new_is_one_listing_per_interval_on_the_wire(
        self, s3_server: str, s3_bucket: tuple[str, Any], published: int
    ) -> None:
        """Each listing with nothing new is ceil(n/1000) ListObjectsV2 requests (at least one), no other."""
        bucket, arranging = s3_bucket
        for step in range(published):
            arranging.put_object(Bucket=bucket, Key=f"pub/{format_entry_name(Entry(1, step, 'exec/a/c'))}")
        client = raw_client(s3_server)
        store = S3Store(f"s3://{bucket}", client)
        log = RequestLog(client)
        per_listing = max(1, math.ceil(published / PAGE_SIZE))
        listings = 5
        stop = threading.Event()
        sent: list[None] = []

        def stop_after_enough(**_: Any) -> None:
            # Counted here: botocore calls this more specific handler before the request log's.
            sent.append(None)
            if len(sent) == listings * per_listing:
                stop.set()

        client.meta.events.register("before-send.s3.ListObjectsV2", stop_after_enough)
        assert list(follow(store, interval=0.01, stop=stop)) == []
        assert log.operations() == ["ListObjectsV2"] * (listings * per_listing)

    def test_a_new_entry_costs_nothing_more(self, s3_server: str, s3_bucket: tuple[str, Any]) -> None:
        """An entry published between listings is yielded; the follower still sends only listings."""
        bucket, arranging = s3_bucket
        client = raw_client(s3_server)
        store = S3Store(f"s3://{bucket}", client)
        log = RequestLog(client)
        followed = follow(store, interval=0.01)
        arranging.put_object(Bucket=bucket, Key=f"pub/{format_entry_name(NEW)}")
        assert next(followed) == Followed(NEW, latest=True)
        followed.close()
        assert set(log.operations()) == {"ListObjectsV2"}


# -- the command ---------------------------------------------------------------------------------------


def environment(**extra: str) -> dict[str, str]:
    """The environment of a ckpt process: ours, minus ckpt's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class Following:
    """A running ``ckpt follow``: its stdout and stderr read line by line as they come."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*CKPT, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or environment(),
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = threading.Condition()
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.out), daemon=True),
            threading.Thread(target=self._read, args=(self.process.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], lines: list[str]) -> None:
        for line in stream:
            with self._changed:
                lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, lines: list[str], count: int, timeout: float = 20) -> list[str]:
        """Wait until ``lines`` (``self.out`` or ``self.err``) holds ``count`` lines; return them."""
        with self._changed:
            self._changed.wait_for(lambda: len(lines) >= count or self.process.poll() is not None, timeout)
        assert len(lines) >= count, f"stdout {self.out}, stderr {self.err}"
        return lines[:count]

    def wait_started(self) -> None:
        """Wait for the log line that says the listing of "now" is done."""
        with self._changed:
            started = self._changed.wait_for(lambda: any(" following " in line for line in self.err), 20)
        assert started, f"ckpt follow did not start: {self.err}"

    def finish(self, timeout: float = 20) -> int:
        """Wait for the process and its output; return its exit code."""
        code = self.process.wait(timeout=timeout)
        self._close()
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=20)
        self._close()

    def _close(self) -> None:
        for reader in self._readers:
            reader.join(5)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None and not stream.closed:
                stream.close()


@pytest.fixture
def running() -> Iterator[Any]:
    """Start ``ckpt follow`` processes; any still running at the end of the test is killed."""
    started: list[Following] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Following:
        following = Following(*args, env=env)
        started.append(following)
        return following

    yield start
    for following in started:
        following.kill()


@pytest.fixture
def root(tmp_path: Path) -> PosixStore:
    path = tmp_path / "root"
    path.mkdir()
    store = PosixStore(str(path))
    for entry in (OLD, NEW, ZOMBIE):
        os.makedirs(store.location(entry))
    return store


class TestCommand:
    @pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
    def test_prints_each_new_entry_flushed_and_ends_on_a_signal(
        self, root: PosixStore, running: Any, sig: signal.Signals
    ) -> None:
        """Text lines say whether each entry is the latest; SIGTERM or SIGINT ends the follow with exit 0."""
        _publish(root, OLD)
        following = running("--root", root.root, "follow", "--interval", "0.05")
        following.wait_started()
        _publish(root, NEW)
        assert following.wait_for(following.out, 1) == [f"latest 2 200 {root.location(NEW)}"]
        _publish(root, ZOMBIE)
        assert following.wait_for(following.out, 2)[1] == f"not-latest 1 900 {root.location(ZOMBIE)}"
        following.process.send_signal(sig)
        assert following.finish() == 0
        assert following.out == [
            f"latest 2 200 {root.location(NEW)}",
            f"not-latest 1 900 {root.location(ZOMBIE)}",
        ]
        assert not any(line.startswith("ckpt: ") for line in following.err), following.err

    def test_a_reader_that_goes_away_ends_it_quietly_with_141(self, root: PosixStore, tmp_path: Path) -> None:
        """`ckpt follow | head -1`: the next line finds the pipe closed; no error line, no traceback, exit 141
        as a shell shows a writer that SIGPIPE ended (errors.md §2.1)."""
        _publish(root, OLD)
        stderr = tmp_path / "stderr"
        with stderr.open("w") as err:
            process = subprocess.Popen(
                [*CKPT, "--root", root.root, "follow", "--interval", "0.05", "--from-start"],
                stdout=subprocess.PIPE, stderr=err, text=True, env=environment(),
            )  # fmt: skip
        try:
            assert process.stdout is not None
            assert select.select([process.stdout], [], [], 30)[0], "no first line within 30 s"
            assert process.stdout.readline().startswith("latest 2 100 ")  # `head -1` reads one line ...
            process.stdout.close()  # ... and exits
            _publish(root, NEW)
            assert process.wait(timeout=30) == 141, stderr.read_text()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            if process.stdout is not None and not process.stdout.closed:
                process.stdout.close()
        lines = stderr.read_text().splitlines()
        assert [line for line in lines if " info following " not in line] == []  # only the start-up record

    def test_json_lines_from_the_start(self, root: PosixStore, running: Any) -> None:
        """--json --from-start prints one JSON document per entry, already published ones first."""
        _publish(root, ZOMBIE)
        _publish(root, NEW)
        following = running("--root", root.root, "--json", "follow", "--interval", "0.05", "--from-start")
        documents = [json.loads(line) for line in following.wait_for(following.out, 2)]
        assert documents == [
            {
                "epoch": e.epoch,
                "step": e.step,
                "save": e.save,
                "location": root.location(e),
                "name": format_entry_name(e),
                "latest": e == NEW,
            }
            for e in (ZOMBIE, NEW)
        ]
        following.process.send_signal(signal.SIGTERM)
        assert following.finish() == 0

    @pytest.mark.parametrize(
        "args", [["--interval", "0"], ["--interval", "-1"], ["--scan-timeout", "nan"], ["--interval", "1e3"]]
    )
    def test_invalid_seconds_exit_2(self, root: PosixStore, args: list[str]) -> None:
        """A number of seconds that is not a plain positive decimal is a usage error."""
        result = subprocess.run(
            [*CKPT, "--root", root.root, "follow", *args],
            capture_output=True,
            text=True,
            env=environment(),
            timeout=30,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("ckpt: ")

    def test_a_malformed_log_exits_5(self, root: PosixStore, running: Any) -> None:
        """A bad name appearing in pub/ ends the follow with exit 5 and one error line."""
        following = running("--root", root.root, "follow", "--interval", "0.05")
        following.wait_started()
        Path(root.root, "pub").mkdir(exist_ok=True)
        Path(root.root, "pub", "not-an-entry").touch()
        assert following.finish() == 5
        assert following.err[-1].startswith("ckpt: ")

    def test_a_store_that_never_answers_exits_1_in_time(self, tmp_path: Path) -> None:
        """An S3 endpoint that accepts and never answers ends the follow with exit 1 in time."""
        env = environment(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_CONFIG_FILE=str(tmp_path / "none"),
            AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
            AWS_EC2_METADATA_DISABLED="true",
        )
        with silent_endpoint() as (url, held):
            config = silent_s3_config(tmp_path / "ckpt.toml", url)
            started = time.monotonic()
            result = subprocess.run(
                [*CKPT, "--root", "s3://bucket", "--config", str(config), "follow", "--scan-timeout", "1"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
        elapsed = time.monotonic() - started
        assert result.returncode == 1, result.stderr
        assert "took longer than 1s" in result.stderr
        assert elapsed < 8, elapsed
        assert held, "the follower never connected"
