"""The watcher (``ckpt.Watcher``): scan and watch semantics on the in-memory, POSIX and S3 stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import open_s3_store
from ckpt.application.verify import resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError, MalformedError, NotFoundError, ScanTimeoutError
from ckpt.domain.frameworks import Framework
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import FileInfo, Folder, PruneResult, WatchStore
from ckpt.testing import InMemoryStore
from support.harness import Harness
from support.s3 import FAKE_ENV, RequestLog, S3Harness, http_settings, isolate_from_aws_environment
from support.saves import rng_state_bytes
from support.silent_endpoint import silent_endpoint
from support.trainer import FolderSink, Trainer, complete_folders, mixed_plan

HF, DCP = Framework.HF, Framework.DCP
ATTEMPT = "1.4101.0"
EXEC = f"exec/{ATTEMPT}"
STATE = b'{"global_step": 1}'


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingStore:
    """A WatchStore that forwards to a real one and records every call (a spy, not a stand-in).

    ``sync_save`` exists exactly when the inner store has it, so the watcher's duck typing sees the truth.
    ``before_publish`` lets a test act just before a publication reaches the store.
    """

    def __init__(self, inner: WatchStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.before_publish: Callable[[str], None] | None = None

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    def per_save_calls(self) -> list[tuple[str, str]]:
        return [c for c in self.calls if c[0] in ("read_file", "exists", "files", "sync_save", "publish")]

    @property
    def root(self) -> str:
        return self.inner.root

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        self.calls.append(("publish", save_location))
        if self.before_publish is not None:
            self.before_publish(save_location)
        return self.inner.publish(epoch, step, save_location)

    def entries(self) -> list[Entry]:
        self.calls.append(("entries", ""))
        return self.inner.entries()

    def resolve(self) -> Entry | None:
        return self.inner.resolve()

    def prune(self, keep: int, *, dry_run: bool = False) -> PruneResult:
        return self.inner.prune(keep, dry_run=dry_run)

    def location(self, entry: Entry) -> str:
        return self.inner.location(entry)

    def exec_dir(self, attempt: str) -> str:
        return self.inner.exec_dir(attempt)

    def folders(self, location: str) -> list[Folder]:
        self.calls.append(("folders", location))
        return self.inner.folders(location)

    def read_file(self, save_location: str, name: str) -> bytes | None:
        self.calls.append(("read_file", save_location))
        return self.inner.read_file(save_location, name)

    def exists(self, save_location: str, name: str) -> bool:
        self.calls.append(("exists", save_location))
        return self.inner.exists(save_location, name)

    def files(self, save_location: str) -> list[FileInfo]:
        self.calls.append(("files", save_location))
        return self.inner.files(save_location)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)  # AttributeError when the inner store has no such thing
        if name != "sync_save":
            return attribute

        def sync_save(location: str) -> None:
            self.calls.append(("sync_save", location))
            attribute(location)

        return sync_save


class _WithoutSync:
    """The in-memory fake with its sync_save hidden, as an embedder's store that has none."""

    def __init__(self, inner: InMemoryStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "sync_save":
            raise AttributeError(name)
        return getattr(self._inner, name)


def watcher(store: WatchStore, framework: Framework = HF, **kwargs: Any) -> Watcher:
    kwargs.setdefault("settle", 0)
    saves = kwargs.pop("saves", store.exec_dir(ATTEMPT))
    epoch = kwargs.pop("epoch", 1)
    interval = kwargs.pop("interval", 0.02)
    return Watcher(store, framework, saves, epoch, interval, **kwargs)


def steps(entries: list[Entry]) -> list[int]:
    return [e.step for e in entries]


class TestScan:
    def test_publishes_complete_saves_in_step_order(self, harness: Harness) -> None:
        """Every complete save is published in step order, whatever order it was written in."""
        for step in (30, 4, 200):
            harness.make_save(f"{EXEC}/checkpoint-{step}", {"trainer_state.json": STATE, "model": b"w"})
        seen: list[Entry] = []
        created = watcher(harness.store(), on_published=seen.append).scan()
        assert steps(created) == [4, 30, 200]
        assert seen == created
        assert [e.save for e in harness.store().entries()] == [f"{EXEC}/checkpoint-{s}" for s in (4, 30, 200)]
        assert {e.epoch for e in created} == {1}

    def test_ignores_folders_that_are_not_saves(self, harness: Harness) -> None:
        """tmp-checkpoint-N, checkpoint-best and runs are never published, even when they look complete."""
        for name in ("tmp-checkpoint-5", "checkpoint-best", "runs", "checkpoint-", "step-5"):
            harness.make_save(f"{EXEC}/{name}", {"trainer_state.json": STATE})
        harness.make_save(f"{EXEC}/checkpoint-5", {"trainer_state.json": STATE})
        assert [e.save for e in watcher(harness.store()).scan()] == [f"{EXEC}/checkpoint-5"]

    def test_incomplete_saves_wait_for_a_later_scan(self, harness: Harness) -> None:
        """An incomplete save is passed over, a later one still published, and it goes out once complete."""
        harness.make_save(f"{EXEC}/checkpoint-10", {"model": b"w"})
        harness.make_save(f"{EXEC}/checkpoint-20", {"trainer_state.json": b'{"glob'})
        harness.make_save(f"{EXEC}/checkpoint-30", {"trainer_state.json": STATE})
        w = watcher(harness.store())
        assert steps(w.scan()) == [30]
        harness.make_save(f"{EXEC}/checkpoint-20", {"trainer_state.json": STATE})
        assert steps(w.scan()) == [20]
        assert w.scan() == []
        harness.make_save(f"{EXEC}/checkpoint-10", {"trainer_state.json": STATE})
        assert steps(w.scan()) == [10]
        assert steps(harness.store().entries()) == [10, 20, 30]

    def test_sentinel_holds_a_save_back(self, harness: Harness) -> None:
        """A save with checkpoint-is-incomplete.txt is not published."""
        harness.make_save(
            f"{EXEC}/checkpoint-10", {"trainer_state.json": STATE, "checkpoint-is-incomplete.txt": b""}
        )
        assert watcher(harness.store()).scan() == []

    def test_dcp_needs_metadata(self, harness: Harness) -> None:
        """A dcp save goes out once .metadata is there, at once (no settle by default)."""
        harness.make_save(f"{EXEC}/step-10", {"__0_0.distcp": b"x", ".metadata.tmp": b"m"})
        w = watcher(harness.store(), DCP, settle=None)
        assert w.settle == 0
        assert w.scan() == []
        harness.make_save(f"{EXEC}/step-10", {".metadata": b"m"})
        assert steps(w.scan()) == [10]

    def test_dcp_is_never_delayed_by_settle(self, harness: Harness) -> None:
        """A dcp save with .metadata goes out on the first scan that sees it, even with a large settle."""
        store = RecordingStore(harness.store())
        harness.make_save(f"{EXEC}/step-10", {"__0_0.distcp": b"x", ".metadata": b"m"})
        w = watcher(store, DCP, settle=3600)
        assert steps(w.scan()) == [10]
        assert store.count("files") == 0  # no listing taken: nothing to settle

    def test_hf_world_size_waits_for_every_rank(self, harness: Harness) -> None:
        """With world size 2, a save goes out only once rank 1's RNG state is there and a complete zip."""
        save = f"{EXEC}/checkpoint-10"
        harness.make_save(save, {"trainer_state.json": STATE, "rng_state_0.pth": rng_state_bytes(0)})
        w = watcher(harness.store(), world_size=2)
        assert w.scan() == []  # rank 1 has written nothing
        harness.make_save(save, {"rng_state_1.pth": rng_state_bytes(1)[:-5]})
        assert w.scan() == []  # rank 1 was cut short
        harness.make_save(save, {"rng_state_1.pth": rng_state_bytes(1)})
        assert steps(w.scan()) == [10]

    def test_hf_world_size_and_settle_together(self, harness: Harness) -> None:
        """Every rank complete, the save still waits for its listing to settle; one listing serves both."""
        clock = FakeClock()
        store = RecordingStore(harness.store())
        files = {"trainer_state.json": STATE, "rng_state_0.pth": rng_state_bytes(0)}
        harness.make_save(f"{EXEC}/checkpoint-10", {**files, "rng_state_1.pth": rng_state_bytes(1)})
        w = watcher(store, settle=5, clock=clock, world_size=2)
        assert w.scan() == []
        assert store.count("files") == 1
        clock.advance(5)
        assert steps(w.scan()) == [10]

    def test_invalid_world_size(self) -> None:
        """A world size that is not a whole number from 1 is refused."""
        for bad in (0, -1, True, 2.0):
            with pytest.raises(InvalidError, match="world size"):
                watcher(InMemoryStore(), world_size=bad)

    def test_hf_waits_for_the_listing_to_settle(self, harness: Harness) -> None:
        """An hf save goes out once its listing was unchanged for the settle time; a change restarts it."""
        clock = FakeClock()
        harness.make_save(f"{EXEC}/checkpoint-10", {"trainer_state.json": STATE, "model": b"w"})
        w = watcher(harness.store(), settle=None, interval=5, clock=clock)
        assert w.settle == 5
        assert w.scan() == []  # first look
        clock.advance(4.9)
        assert w.scan() == []  # unchanged, too soon
        harness.make_save(f"{EXEC}/checkpoint-10", {"rng_state_1.pth": b"late rank"})
        clock.advance(0.2)
        assert w.scan() == []  # changed: starts again
        clock.advance(4.9)
        assert w.scan() == []
        clock.advance(0.1)
        assert steps(w.scan()) == [10]
        assert w.scan() == []

    def test_existing_entry_counts_as_published(self, harness: Harness) -> None:
        """A save another publisher already published at our epoch is not returned and never read."""
        location = harness.make_save(f"{EXEC}/checkpoint-10", {"trainer_state.json": STATE})
        harness.make_save(f"{EXEC}/checkpoint-20", {"trainer_state.json": STATE})
        harness.store().publish(1, 10, location)
        store = RecordingStore(harness.store())
        w = watcher(store)
        assert steps(w.scan()) == [20]
        assert [c for c in store.per_save_calls() if c[1] == location] == []
        assert steps(harness.store().entries()) == [10, 20]

    def test_a_race_lost_to_exists_error_counts_as_published(self, harness: Harness) -> None:
        """When another watcher publishes between our check and our publish, ExistsError means done."""
        store = RecordingStore(harness.store())
        harness.make_save(f"{EXEC}/checkpoint-10", {"trainer_state.json": STATE})

        def racing_watcher(location: str) -> None:
            store.inner.publish(1, 10, location)

        store.before_publish = racing_watcher
        w = watcher(store)
        assert w.scan() == []
        store.before_publish = None
        assert steps(harness.store().entries()) == [10]
        store.calls.clear()
        assert w.scan() == []
        assert store.per_save_calls() == []

    def test_restarted_watcher_learns_what_is_published(self, harness: Harness) -> None:
        """A new watcher reads entries() once and never reads or republishes a save of its epoch."""
        for step in (1, 2, 3):
            harness.make_save(f"{EXEC}/checkpoint-{step}", {"trainer_state.json": STATE})
        assert steps(watcher(harness.store()).scan()) == [1, 2, 3]
        store = RecordingStore(harness.store())
        restarted = watcher(store)
        assert restarted.scan() == []
        assert Counter(name for name, _ in store.calls) == Counter({"entries": 1, "folders": 1})
        store.calls.clear()
        assert restarted.scan() == []
        assert store.calls == [("folders", store.exec_dir(ATTEMPT))]

    def test_only_entries_of_its_own_epoch_count(self, harness: Harness) -> None:
        """An entry of another epoch for the same folder does not stop publication at this epoch."""
        location = harness.make_save(f"{EXEC}/checkpoint-7", {"trainer_state.json": STATE})
        harness.store().publish(1, 7, location)
        created = watcher(harness.store(), epoch=2).scan()
        assert [(e.epoch, e.step) for e in created] == [(2, 7)]

    def test_a_save_that_vanishes_before_publication_is_passed_over(self, harness: Harness) -> None:
        """A save deleted between its check and its publication (retention) is skipped; the scan goes on."""
        store = RecordingStore(harness.store())
        harness.make_save(f"{EXEC}/checkpoint-1", {"trainer_state.json": STATE})
        harness.make_save(f"{EXEC}/checkpoint-2", {"trainer_state.json": STATE})

        def retention(location: str) -> None:
            if location.endswith("checkpoint-1"):
                harness.remove_save(f"{EXEC}/checkpoint-1")

        store.before_publish = retention
        assert steps(watcher(store).scan()) == [2]

    def test_missing_saves_folder_is_no_saves(self, harness: Harness) -> None:
        """Before the framework creates the execution's folder, a scan finds nothing."""
        harness.make_save("exec/other/checkpoint-1", {"trainer_state.json": STATE})
        assert watcher(harness.store()).scan() == []

    def test_malformed_log_ends_the_scan(self, harness: Harness) -> None:
        """A malformed name in pub/ is a scan error (MalformedError), never skipped."""
        harness.make_save(f"{EXEC}/checkpoint-1", {"trainer_state.json": STATE})
        harness.put_raw_name("junk.tmp")
        with pytest.raises(MalformedError):
            watcher(harness.store()).scan()

    def test_missing_root_is_an_error(self, tmp_path: Path) -> None:
        """A root that does not exist (or vanished) makes the scan fail with NotFoundError."""
        with pytest.raises(NotFoundError):
            watcher(PosixStore(str(tmp_path / "absent"))).scan()

    @pytest.mark.parametrize(
        ("kwargs", "message"),
        [
            ({"interval": 0}, "interval"),
            ({"interval": -1}, "interval"),
            ({"interval": float("nan")}, "interval"),
            ({"settle": -0.5}, "settle"),
            ({"settle": float("inf")}, "settle"),
            ({"scan_timeout": 0}, "scan timeout"),
            ({"epoch": -1}, "epoch"),
            ({"epoch": 2**64}, "epoch"),
            ({"saves": ""}, "saves location"),
        ],
    )
    def test_invalid_settings(self, kwargs: dict[str, Any], message: str) -> None:
        """Settings out of range are refused with InvalidError naming the setting."""
        with pytest.raises(InvalidError, match=message):
            watcher(InMemoryStore(), **kwargs)


class TestScanCost:
    def test_a_thousand_published_saves_cost_one_listing(self) -> None:
        """With 1000 saves published and nothing new, a scan is one folders listing and no per-save reads."""
        inner = InMemoryStore()
        for step in range(1000):
            location = f"{inner.exec_dir(ATTEMPT)}/checkpoint-{step}"
            inner.write_file(location, "trainer_state.json", STATE)
            inner.publish(1, step, location)
        store = RecordingStore(inner)
        w = watcher(store)
        assert w.scan() == []
        assert sorted(name for name, _ in store.calls) == ["entries", "folders"]
        for _ in range(3):
            store.calls.clear()
            assert w.scan() == []
            assert store.calls == [("folders", inner.exec_dir(ATTEMPT))]

    @pytest.mark.parametrize("harness", ["s3-moto"], indirect=True)
    def test_on_s3_a_scan_of_published_saves_is_one_list_request(self, harness: Harness) -> None:
        """On S3, a watcher over published saves reads no save, and a scan is exactly one ListObjectsV2."""
        assert isinstance(harness, S3Harness)
        store = harness.store()
        # 250 rather than 1000 keeps moto's in-process server fast; the in-memory test above uses 1000, and
        # the count of requests does not depend on the number of saves (one listing page holds 1000).
        for step in range(250):
            save = f"{EXEC}/checkpoint-{step}"
            harness.put(f"{save}/trainer_state.json", STATE)
            harness.put_raw_name(format_entry_name(Entry(1, step, save)))
        log = RequestLog(harness.store_client)
        w = watcher(store)
        assert w.scan() == []
        assert sorted(log.operations()) == ["ListObjectsV2", "ListObjectsV2"]  # entries(), then folders()
        for _ in range(3):
            log.clear()
            assert w.scan() == []
            assert log.operations() == ["ListObjectsV2"]


class TestSync:
    def test_posix_saves_are_synced_before_publication(self, tmp_path: Path) -> None:
        """On POSIX the watcher calls sync_save on a save right before publishing it."""
        store = RecordingStore(PosixStore(str(tmp_path)))
        save = tmp_path / EXEC / "checkpoint-3"
        save.mkdir(parents=True)
        (save / "trainer_state.json").write_bytes(STATE)
        assert steps(watcher(store).scan()) == [3]
        location = str(save)
        assert [c for c in store.calls if c[0] in ("sync_save", "publish")] == [
            ("sync_save", location),
            ("publish", location),
        ]

    def test_stores_without_sync_save_just_publish(self) -> None:
        """A store without sync_save (an embedder's own; ours all have one) is published to directly."""
        store = RecordingStore(_WithoutSync(InMemoryStore()))  # type: ignore[arg-type]
        store.inner.write_file(f"{store.exec_dir(ATTEMPT)}/checkpoint-3", "trainer_state.json", STATE)  # type: ignore[attr-defined]
        assert not hasattr(store, "sync_save")
        assert steps(watcher(store).scan()) == [3]


def run_watch(w: Watcher, stop: threading.Event) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``w.watch(stop)`` in a thread; the dict gets ``created`` or ``error``, and ``ended_at``."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["created"] = w.watch(stop)
        except Exception as exc:
            outcome["error"] = exc
        outcome["ended_at"] = time.monotonic()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def write_hf_save(folder: Path, step: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"w" * 100)
    (folder / "trainer_state.json").write_bytes(b'{"global_step": %d}' % step)


class TestWatch:
    def test_publishes_as_saves_appear_and_stops(self, tmp_path: Path) -> None:
        """watch() keeps scanning every interval, publishes saves as they complete, and returns on stop."""
        store = PosixStore(str(tmp_path))
        stop = threading.Event()
        thread, outcome = run_watch(watcher(store, DCP, interval=0.02), stop)
        exec_dir = tmp_path / EXEC
        for step in (1, 2, 3):
            (exec_dir / f"step-{step}").mkdir(parents=True)
            (exec_dir / f"step-{step}" / ".metadata").write_bytes(b"m")
            deadline = time.monotonic() + 5
            while len(store.entries()) < step and time.monotonic() < deadline:
                time.sleep(0.01)
        stop.set()
        thread.join(5)
        assert not thread.is_alive()
        assert steps(outcome["created"]) == [1, 2, 3]

    def test_a_scan_error_ends_the_watch(self, tmp_path: Path) -> None:
        """When a scan fails (the root vanished), watch() ends with that error."""
        root = tmp_path / "root"
        root.mkdir()
        stop = threading.Event()
        thread, outcome = run_watch(watcher(PosixStore(str(root)), interval=0.02), stop)
        time.sleep(0.1)
        shutil.rmtree(root)
        thread.join(5)
        assert not thread.is_alive()
        assert isinstance(outcome.get("error"), NotFoundError)
        stop.set()

    def test_stop_drains_a_save_that_just_completed(self, tmp_path: Path) -> None:
        """A save completed right before the stop is still published, after waiting for it to settle."""
        store = PosixStore(str(tmp_path))
        stop = threading.Event()
        w = watcher(store, interval=0.05, settle=0.4)
        thread, outcome = run_watch(w, stop)
        time.sleep(0.15)
        writing = time.monotonic()  # the watcher's first look at the save comes after this
        write_hf_save(tmp_path / EXEC / "checkpoint-9", 9)
        stopped_at = time.monotonic()
        stop.set()
        thread.join(5)
        assert steps(outcome["created"]) == [9]
        # Settle counts from its first look, which is after `writing` (not necessarily after the stop).
        assert outcome["ended_at"] - writing >= 0.35, outcome["ended_at"] - writing
        assert outcome["ended_at"] - stopped_at < 4

    def test_stop_without_pending_saves_returns_at_once(self, tmp_path: Path) -> None:
        """With nothing waiting to settle, a stopped watch returns without waiting for the settle time."""
        store = PosixStore(str(tmp_path))
        (tmp_path / EXEC / "checkpoint-1").mkdir(parents=True)  # no markers: not settling
        stop = threading.Event()
        thread, outcome = run_watch(watcher(store, interval=0.05, settle=60), stop)
        time.sleep(0.1)
        stopped_at = time.monotonic()
        stop.set()
        thread.join(30)
        assert outcome["created"] == []
        assert outcome["ended_at"] - stopped_at < 15  # far below the settle time, even on a loaded machine

    def test_drain_is_bounded_by_the_settle_time(self, tmp_path: Path) -> None:
        """A save that keeps changing is not published, and the drain still ends after the settle time."""
        store = PosixStore(str(tmp_path))
        folder = tmp_path / EXEC / "checkpoint-1"
        write_hf_save(folder, 1)
        keep_writing = threading.Event()
        keep_writing.set()

        def grow() -> None:
            with open(folder / "rng_state_1.pth", "ab") as f:
                while keep_writing.is_set():
                    f.write(b"x")
                    f.flush()
                    time.sleep(0.005)

        writer = threading.Thread(target=grow, daemon=True)
        writer.start()
        stop = threading.Event()
        stop.set()
        started = time.monotonic()
        try:
            created = watcher(store, interval=0.05, settle=0.3).watch(stop)
        finally:
            keep_writing.clear()
            writer.join()
        assert created == []
        assert 0.3 <= time.monotonic() - started < 4

    def test_drain_publishes_a_save_a_slow_scan_looked_at_early(self, tmp_path: Path) -> None:
        """A settled save whose look ended past the drain deadline is looked at again, not dropped."""

        class SlowListing(PosixStore):
            __slots__ = ()

            def files(self, location: str) -> list[FileInfo]:
                if location.endswith("checkpoint-6"):
                    time.sleep(0.25)  # a big save: its listing takes a while
                return super().files(location)

        for step in (5, 6):
            write_hf_save(tmp_path / EXEC / f"checkpoint-{step}", step)
        stop = threading.Event()
        stop.set()  # what --once does
        created = watcher(SlowListing(str(tmp_path)), interval=0.3, settle=0.3).watch(stop)
        assert steps(created) == [5, 6]

    def test_once_waits_for_settle_then_publishes(self, harness: Harness) -> None:
        """A watch whose stop is already set (``--once``) scans, waits the settle time, and publishes."""
        harness.make_save(f"{EXEC}/checkpoint-5", {"trainer_state.json": STATE})
        stop = threading.Event()
        stop.set()
        started = time.monotonic()
        created = watcher(harness.store(), interval=10, settle=0.2).watch(stop)
        assert steps(created) == [5]
        assert 0.2 <= time.monotonic() - started < 5

    def test_drain_waits_for_a_dcp_save_still_being_written(self, tmp_path: Path) -> None:
        """After a stop, a dcp save without .metadata yet is looked at again, within the settle time."""

        class MetadataOnSecondLook(PosixStore):
            __slots__ = ("looks",)

            def folders(self, location: str) -> list[Folder]:
                self.looks = getattr(self, "looks", 0) + 1
                if self.looks == 2:  # the coordinator renames .metadata into place between two scans
                    (tmp_path / EXEC / "step-3" / ".metadata").write_bytes(b"m")
                return super().folders(location)

        (tmp_path / EXEC / "step-3").mkdir(parents=True)
        (tmp_path / EXEC / "step-3" / "__0_0.distcp").write_bytes(b"x")
        stop = threading.Event()
        stop.set()
        created = watcher(MetadataOnSecondLook(str(tmp_path)), DCP, interval=0.05, settle=30).watch(stop)
        assert steps(created) == [3]

    def test_drain_does_not_wait_for_a_dead_rank(self, tmp_path: Path) -> None:
        """An hf save missing a rank's file does not hold the drain: once it came, it would need a settle."""
        folder = tmp_path / EXEC / "checkpoint-4"
        write_hf_save(folder, 4)
        (folder / "rng_state_0.pth").write_bytes(rng_state_bytes(0))
        stop = threading.Event()
        stop.set()
        started = time.monotonic()
        w = watcher(PosixStore(str(tmp_path)), interval=0.05, settle=60, world_size=2)
        assert w.watch(stop) == []
        assert time.monotonic() - started < 15  # far below the settle time, even on a loaded machine

    def test_dcp_drain_is_bounded_by_the_settle_time(self, tmp_path: Path) -> None:
        """A dcp save whose .metadata never comes ends the drain after the settle time, unpublished."""
        (tmp_path / EXEC / "step-3").mkdir(parents=True)
        stop = threading.Event()
        stop.set()
        started = time.monotonic()
        created = watcher(PosixStore(str(tmp_path)), DCP, interval=0.05, settle=0.3).watch(stop)
        assert created == []
        assert 0.3 <= time.monotonic() - started < 4

    def test_once_with_dcp_is_one_scan(self, harness: Harness) -> None:
        """With settle 0, a stopped watch is exactly one scan."""
        store = RecordingStore(harness.store())
        harness.make_save(f"{EXEC}/step-5", {".metadata": b"m"})
        stop = threading.Event()
        stop.set()
        assert steps(watcher(store, DCP, settle=None).watch(stop)) == [5]
        assert store.count("folders") == 1


@pytest.fixture
def hung_server() -> Iterator[str]:
    """The URL of a loopback endpoint that accepts connections and never answers."""
    with silent_endpoint() as (url, _held):
        yield url


class HttpProbeStore(RecordingStore):
    """A WatchStore whose folder listing first asks an HTTP server (as a network store would)."""

    def __init__(self, inner: WatchStore, url: str) -> None:
        super().__init__(inner)
        self.url = url

    def folders(self, location: str) -> list[Folder]:
        with urllib.request.urlopen(self.url) as answer:  # no client timeout: only the watcher's bounds it
            answer.read()
        return super().folders(location)


class TestScanTimeout:
    def test_a_store_that_never_answers_ends_the_watch(self, hung_server: str) -> None:
        """A store that accepts the connection and never answers ends watch() with ScanTimeoutError."""
        store = HttpProbeStore(InMemoryStore(), f"{hung_server}/")
        w = watcher(store, scan_timeout=0.3)
        started = time.monotonic()
        with pytest.raises(ScanTimeoutError, match=r"took longer than 0\.3s"):
            w.watch(threading.Event())
        assert time.monotonic() - started < 5  # the server never answers: only the 0.3 s bound ends it
        stuck = [t for t in threading.enumerate() if t.name == "ckpt-watcher-scan"]
        assert stuck
        assert all(t.daemon for t in stuck)
        with pytest.raises(ScanTimeoutError, match="still running"):
            w.scan()

    def test_s3_store_that_never_answers(
        self, hung_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """The S3 store pointed at a server that never answers times out too, long before botocore would."""
        isolate_from_aws_environment(monkeypatch, tmp_path)
        endpoint = hung_server
        config = http_settings(endpoint, read_timeout=30.0)
        store = open_s3_store("s3://bucket", config=config, environ=FAKE_ENV)
        w = watcher(store, DCP, scan_timeout=0.5)
        stop = threading.Event()
        stop.set()  # even the --once path is bounded
        started = time.monotonic()
        with pytest.raises(ScanTimeoutError):
            w.watch(stop)
        assert time.monotonic() - started < 10  # botocore alone would wait its 30 s read timeout

    def test_a_slow_but_answering_store_is_fine(self) -> None:
        """Scans that finish within the timeout do not trip it."""
        store = InMemoryStore()
        store.write_file(f"{store.exec_dir(ATTEMPT)}/step-1", ".metadata", b"m")
        stop = threading.Event()
        stop.set()
        assert steps(watcher(store, DCP, scan_timeout=5).watch(stop)) == [1]


def listing(folder: str) -> list[tuple[str, int]]:
    """Every file under ``folder`` with its size, sorted: what "complete" means for a save on disk."""
    found = []
    for dirpath, _, filenames in os.walk(folder):
        for f in filenames:
            path = os.path.join(dirpath, f)
            found.append((os.path.relpath(path, folder), os.path.getsize(path)))
    return sorted(found)


class TestWithSimulatedTrainer:
    @pytest.mark.parametrize("framework", [HF, DCP])
    def test_every_complete_save_once_and_nothing_early(self, tmp_path: Path, framework: Framework) -> None:
        """Against a trainer writing file by file, each complete save is published once, only when final."""
        name = str(framework)
        store = RecordingStore(PosixStore(str(tmp_path)))
        saves = tmp_path / EXEC
        at_publication: dict[str, list[list[tuple[str, int]]]] = {}

        def snapshot(location: str) -> None:
            at_publication.setdefault(os.path.basename(location), []).append(listing(location))

        store.before_publish = snapshot
        plan = mixed_plan(name, 1 if framework is HF else 2)
        settle = 0.15 if framework is HF else 0
        stop = threading.Event()
        thread, outcome = run_watch(watcher(store, framework, interval=0.01, settle=settle), stop)
        Trainer(FolderSink(saves), pace=0.003).run(plan)
        stop.set()
        thread.join(10)
        assert "error" not in outcome

        published = sorted(os.path.basename(store.location(e)) for e in store.inner.entries())
        assert published == sorted(complete_folders(plan))
        assert sorted(at_publication) == published
        for folder, looks in at_publication.items():
            assert looks == [listing(str(saves / folder))], f"{folder} published before it was final"
        verified = resolve_verified(store.inner, framework)
        assert verified.entry is not None
        assert verified.entry.step == max(int(f.rsplit("-", 1)[1]) for f in published)


class TestWatchCommandWorldSize:
    """``ckpt watch --world-size N`` and its default, ``WORLD_SIZE``, run as the real CLI."""

    @staticmethod
    def watch_once(root: Path, *args: str, world_size_env: str | None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
        if world_size_env is not None:
            env["WORLD_SIZE"] = world_size_env
        command = ["--root", str(root), "--json", "watch", "--framework", "hf", "--attempt", ATTEMPT]
        return subprocess.run(
            [sys.executable, "-m", "ckpt", *command, "--epoch", "1", "--once", "--settle", "0", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def test_option_beats_the_environment(self, tmp_path: Path) -> None:
        """--world-size wins over WORLD_SIZE; WORLD_SIZE applies when the option is absent."""
        folder = tmp_path / EXEC / "checkpoint-3"
        write_hf_save(folder, 3)
        (folder / "rng_state_0.pth").write_bytes(rng_state_bytes(0))
        held = self.watch_once(tmp_path, world_size_env="2")
        assert (held.returncode, held.stdout) == (0, '{"published": []}\n'), held.stderr
        assert "world size 2" in held.stderr
        held = self.watch_once(tmp_path, "--world-size", "2", world_size_env="1")
        assert (held.returncode, held.stdout) == (0, '{"published": []}\n'), held.stderr
        done = self.watch_once(tmp_path, "--world-size", "1", world_size_env="2")
        assert done.returncode == 0, done.stderr
        assert [e["step"] for e in json.loads(done.stdout)["published"]] == [3]

    @pytest.mark.parametrize(
        ("args", "env", "message"),
        [
            (("--world-size", "0"), None, "world size 0 must be between 1"),
            (("--world-size", "1.5"), None, "world size '1.5' is not a whole number"),
            ((), "eight", "WORLD_SIZE in the environment: world size 'eight' is not a whole number"),
        ],
    )
    def test_bad_world_size_exits_2(
        self, tmp_path: Path, args: tuple[str, ...], env: str | None, message: str
    ) -> None:
        """A world size that is not a whole number from 1, from the option or the environment, exits 2."""
        done = self.watch_once(tmp_path, *args, world_size_env=env)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
