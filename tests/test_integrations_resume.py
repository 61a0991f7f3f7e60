"""Resume with catch-up: the plan, the epoch record, the catch-up on every store, and ``ckpt resume``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.catchup import catch_up, read_epoch_record, record_epoch, resume
from ckpt.domain.catchup import (
    EPOCH_RECORD,
    CatchUpTarget,
    PassedExecution,
    attempt_of_saves,
    execution_saves,
    format_epoch_record,
    parse_epoch_record,
    parse_sub_folder,
    plan_catch_up,
    sub_folder_of,
)
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError, MalformedError
from ckpt.domain.frameworks import Framework
from ckpt.domain.ports import FileInfo, WatchStore
from ckpt.testing import InMemoryStore
from support.harness import Harness
from support.integ_kill_writer import BOUNDARIES_PER_SAVE, complete_steps
from support.rule_layouts import zip_bytes
from support.silent_endpoint import silent_endpoint, silent_s3_config

STATE = json.dumps({"global_step": 1}).encode()
HF_FILES = {"model.safetensors": b"m" * 64, "trainer_state.json": STATE}


def hf_save(harness: Harness, attempt: str, step: int, *, complete: bool = True) -> str:
    files = dict(HF_FILES) if complete else {"model.safetensors": b"m" * 64}
    return harness.make_save(f"exec/{attempt}/checkpoint-{step}", files)


def put_record(harness: Harness, attempt: str, epoch: int) -> None:
    harness.make_save(f"exec/{attempt}", {EPOCH_RECORD: format_epoch_record(epoch)})


class TestEpochRecord:
    def test_round_trip(self) -> None:
        """A record is the epoch in decimal and a newline, and parses back."""
        assert format_epoch_record(2_000_000) == b"2000000\n"
        assert parse_epoch_record(b"2000000\n") == 2_000_000

    @pytest.mark.parametrize("data", [b"", b"12", b"012\n", b"+1\n", b"1 \n", b"\xff\n", b"1\n\n", b"x\n"])
    def test_anything_else_is_malformed(self, data: bytes) -> None:
        """Only the canonical form parses; the rest is MalformedError."""
        with pytest.raises(MalformedError):
            parse_epoch_record(data)


class TestPlanCatchUp:
    def test_targets_in_epoch_order_with_the_current_execution(self) -> None:
        """Every execution with a known epoch up to the current one is a target, lowest epoch first."""
        plan = plan_catch_up("c", 30, {"b": 20, "a": 10, "c": 30}, [])
        assert plan.targets == (CatchUpTarget("a", 10), CatchUpTarget("b", 20), CatchUpTarget("c", 30))
        assert plan.passed == ()

    def test_a_folder_too_long_for_the_longest_save_name_is_passed_over(self) -> None:
        """Rule 6: a folder an older release left, whose saves could never be published, is no target
        (publishing them would fail and end every later catch-up); the boundary folder still is one."""
        long, boundary = "a" * 97, "b" * 96  # exec/<97>/checkpoint-<20 digits> is 134 bytes; <96> is 133
        plan = plan_catch_up(
            "c", 30, {long: 10, boundary: 10, "c": 30}, [], longest_name="checkpoint-18446744073709551615"
        )
        assert plan.targets == (CatchUpTarget(boundary, 10), CatchUpTarget("c", 30))
        ((passed_attempt, reason),) = [(p.attempt, p.reason) for p in plan.passed]
        assert passed_attempt == long
        assert reason.startswith("too long for its saves' longest name: the save 'exec/aaa")
        assert "is 134 bytes" in reason
        assert plan_catch_up("c", 30, {long: 10}, []).targets[0] == CatchUpTarget(long, 10)  # only "x" there

    def test_current_execution_is_a_target_without_a_record(self) -> None:
        """The current execution's folder is looked at even before it records anything."""
        assert plan_catch_up("c", 30, {}, []).targets == (CatchUpTarget("c", 30),)

    def test_unknown_epoch_is_passed_over(self) -> None:
        """An execution with no record and no entry is never published at a guessed epoch."""
        plan = plan_catch_up("c", 30, {"a": None}, [])
        assert [p.attempt for p in plan.passed] == ["a"]
        assert "unknown" in plan.passed[0].reason

    def test_epoch_from_entries_when_there_is_no_record(self) -> None:
        """Without a record, the greatest epoch of the folder's entries is its epoch."""
        entries = [Entry(12, 5, "exec/a/checkpoint-5"), Entry(11, 3, "exec/a/checkpoint-3")]
        plan = plan_catch_up("c", 30, {"a": None}, entries)
        assert plan.targets == (CatchUpTarget("a", 12), CatchUpTarget("c", 30))

    def test_a_record_wins_over_entries(self) -> None:
        """The record says which epoch the execution ran at, whatever its entries carry."""
        entries = [Entry(11, 5, "exec/a/checkpoint-5")]
        assert plan_catch_up("c", 30, {"a": 12}, entries).targets[0] == CatchUpTarget("a", 12)

    def test_newer_execution_is_passed_over(self) -> None:
        """An execution with a greater epoch than the current one is left to its own publisher."""
        plan = plan_catch_up("c", 30, {"z": 40}, [])
        assert plan.targets == (CatchUpTarget("c", 30),)
        assert plan.passed == (PassedExecution("z", "a newer execution (epoch 40 > 30) publishes its own"),)

    def test_older_than_the_newest_published_epoch_is_passed_over(self) -> None:
        """An execution older than the newest published epoch cannot change where a job resumes."""
        entries = [Entry(20, 7, "exec/b/checkpoint-7")]
        plan = plan_catch_up("c", 30, {"a": 10, "b": 20}, entries)
        assert plan.targets == (CatchUpTarget("b", 20), CatchUpTarget("c", 30))
        assert [p.attempt for p in plan.passed] == ["a"]

    def test_current_folder_keeps_a_lower_recorded_epoch(self) -> None:
        """A folder that records a lower epoch than the current one is caught up at the lower one."""
        assert plan_catch_up("c", 30, {"c": 25}, []).targets == (CatchUpTarget("c", 25),)


class TestSubFolder:
    """Rule 7: saves in the same sub-folder of every execution folder (``exec/<attempt>/<sub-folder>``)."""

    def test_the_folder_an_execution_saves_in(self) -> None:
        """No sub-folder is the execution folder itself; a trailing '/' changes nothing."""
        assert execution_saves("2.4102.0") == "exec/2.4102.0"
        assert execution_saves("2.4102.0", "checkpoint/") == "exec/2.4102.0/checkpoint"
        assert execution_saves("a", "run/ckpt") == "exec/a/run/ckpt"
        assert parse_sub_folder("pub") == "pub"  # pub/ is special at the root only

    @pytest.mark.parametrize("bad", ["/checkpoint", "../b/checkpoint", "a/./b", "a//b", "a\x00b"])
    def test_a_sub_folder_that_is_no_clean_relative_path_is_refused(self, bad: str) -> None:
        """An absolute, unclean or control-character sub-folder is InvalidError naming it."""
        with pytest.raises(InvalidError, match="saves sub-folder"):
            parse_sub_folder(bad)

    def test_the_sub_folder_of_a_watch_saves_folder(self) -> None:
        """The value watch --saves takes, inside this execution's folder, names the sub-folder."""
        assert sub_folder_of("exec/b/checkpoint", "b") == "checkpoint"
        assert sub_folder_of("exec/b", "b") == ""
        for elsewhere in ("exec/a/checkpoint", "exec/bb/checkpoint", "shared/checkpoint"):
            with pytest.raises(InvalidError, match="is not inside this execution's folder 'exec/b'"):
                sub_folder_of(elsewhere, "b")

    def test_the_execution_a_saves_folder_lies_in(self) -> None:
        """A sidecar watching exec/<attempt>/<sub-folder> knows whose epoch to record; elsewhere, nobody's."""
        assert attempt_of_saves("exec/a/checkpoint") == "a"
        assert attempt_of_saves("exec/a") == "a"
        assert attempt_of_saves("exec") is None
        assert attempt_of_saves("shared/a/checkpoint") is None

    def test_rule_6_measures_the_sub_folder(self) -> None:
        """A folder whose longest save fits without the sub-folder but not with it is passed over."""
        boundary = "b" * 91  # exec/<91>/step-<20 digits> is 122 bytes; with /checkpoint, 133: the limit
        longer = "c" * 92  # 123 bytes without the sub-folder, 134 with it
        records = {boundary: 10, longer: 10, "d": 20}
        plan = plan_catch_up("d", 20, records, [], longest_name="step-18446744073709551615")
        assert [t.attempt for t in plan.targets] == [boundary, longer, "d"]
        plan = plan_catch_up(
            "d", 20, records, [], longest_name="step-18446744073709551615", sub_folder="checkpoint"
        )
        assert [t.attempt for t in plan.targets] == [boundary, "d"]
        ((passed,),) = [plan.passed]
        assert passed.attempt == longer
        assert f"'exec/{longer}/checkpoint/step-18446744073709551615' is 134 bytes" in passed.reason


class TestRecordEpoch:
    def test_posix_record_is_written_and_read(self, tmp_path: Path) -> None:
        """On POSIX the record is a real file in the execution folder, created with its parents."""
        store = PosixStore(str(tmp_path))
        assert record_epoch(store, "a.1", 7) == 7
        assert (tmp_path / "exec" / "a.1" / EPOCH_RECORD).read_bytes() == b"7\n"
        assert read_epoch_record(store, "a.1") == 7

    def test_a_lower_record_is_kept_and_a_higher_one_replaced(self, tmp_path: Path) -> None:
        """The folder keeps the lowest epoch any execution declared for it."""
        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 7)
        assert record_epoch(store, "a", 9) == 7
        assert record_epoch(store, "a", 5) == 5
        assert read_epoch_record(store, "a") == 5

    def test_a_malformed_record_is_replaced(self, tmp_path: Path) -> None:
        """A record that does not parse is rewritten, not an error that stops a job from starting."""
        folder = tmp_path / "exec" / "a"
        folder.mkdir(parents=True)
        (folder / EPOCH_RECORD).write_bytes(b"garbage")
        assert record_epoch(PosixStore(str(tmp_path)), "a", 3) == 3
        assert (folder / EPOCH_RECORD).read_bytes() == b"3\n"


class TestCatchUp:
    def test_every_store_keeps_the_record(self, harness: Harness) -> None:
        """POSIX, S3 and the fake all keep an epoch record (``WritesSmallFiles``)."""
        store = harness.store()
        assert record_epoch(store, "a", 3) == 3
        assert read_epoch_record(store, "a") == 3

    def test_dead_execution_saves_are_published_at_its_epoch(self, harness: Harness) -> None:
        """Complete unpublished saves of a dead execution are published under its own epoch; others not."""
        store = harness.store()
        put_record(harness, "a", 10)
        store.publish(10, 100, hf_save(harness, "a", 100))
        hf_save(harness, "a", 200)
        hf_save(harness, "a", 300, complete=False)
        caught = catch_up(store, Framework.HF, attempt="b", epoch=20, settle=0)
        assert [(e.epoch, e.step, e.save) for e in caught.published] == [(10, 200, "exec/a/checkpoint-200")]
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 100), (10, 200)]

    def test_epoch_from_entries_when_there_is_no_record(self, harness: Harness) -> None:
        """A folder without a record is caught up at the epoch of its published entries."""
        store = harness.store()
        store.publish(10, 100, hf_save(harness, "a", 100))
        hf_save(harness, "a", 200)
        caught = catch_up(store, Framework.HF, attempt="b", epoch=20, settle=0)
        assert [(e.epoch, e.step) for e in caught.published] == [(10, 200)]

    def test_unknown_and_newer_executions_are_left_alone(self, harness: Harness) -> None:
        """No record and no entry, or a greater epoch: nothing of it is published."""
        store = harness.store()
        hf_save(harness, "unknown", 500)
        put_record(harness, "newer", 30)
        hf_save(harness, "newer", 600)
        caught = catch_up(store, Framework.HF, attempt="b", epoch=20, settle=0)
        assert caught.published == ()
        assert sorted(p.attempt for p in caught.passed) == ["newer", "unknown"]
        assert store.entries() == []

    def test_dcp_saves(self, harness: Harness) -> None:
        """DCP saves are complete with .metadata; settle never delays them."""
        store = harness.store()
        put_record(harness, "a", 10)
        harness.make_save("exec/a/step-40", {"__0_0.distcp": b"x", ".metadata": b"m"})
        harness.make_save("exec/a/step-50", {"__0_0.distcp": b"x"})
        caught = catch_up(store, Framework.DCP, attempt="b", epoch=20)
        assert [(e.epoch, e.step) for e in caught.published] == [(10, 40)]

    def test_saves_in_a_sub_folder(self, harness: Harness) -> None:
        """With a sub-folder, each execution's saves are looked for there, on every store; an epoch
        learnt from entries counts for entries inside the sub-folder too."""
        store = harness.store()
        put_record(harness, "a", 10)
        harness.make_save("exec/a/checkpoint/step-40", {"__0_0.distcp": b"x", ".metadata": b"m"})
        harness.make_save("exec/a/checkpoint/step-50", {"__0_0.distcp": b"x"})
        store.publish(11, 5, harness.make_save("exec/n/checkpoint/step-5", {".metadata": b"m"}))
        harness.make_save("exec/n/checkpoint/step-60", {".metadata": b"m"})
        assert catch_up(store, Framework.DCP, attempt="b", epoch=20).published == ()  # the bug: not there
        caught = catch_up(store, Framework.DCP, attempt="b", epoch=20, sub_folder="checkpoint")
        published = [(e.epoch, e.step, e.save) for e in caught.published]
        assert published == [(11, 60, "exec/n/checkpoint/step-60")]
        assert [p.attempt for p in caught.passed] == ["a"]  # epoch 10 is older than the published 11


class _ZombieStore:
    """A real store whose one save keeps growing: every look at its files first appends to one of them.

    It stands for a zombie execution still writing that save while the catch-up looks at it.
    """

    def __init__(self, store: PosixStore, growing: Path) -> None:
        self._store = store
        self._growing = growing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def files(self, save_location: str) -> list[FileInfo]:
        if save_location.rstrip("/") == str(self._growing.parent):
            with self._growing.open("ab") as f:
                f.write(b"more")
        return self._store.files(save_location)


class TestZombieStillWriting:
    def test_a_save_still_changing_is_not_published(self, tmp_path: Path) -> None:
        """A save whose files keep changing through the settle time is passed over by the catch-up."""
        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 10)
        save = tmp_path / "exec" / "a" / "checkpoint-100"
        save.mkdir()
        (save / "trainer_state.json").write_bytes(STATE)
        (save / "rng_state_1.pth").write_bytes(b"r")
        zombie: WatchStore = _ZombieStore(store, save / "rng_state_1.pth")  # type: ignore[assignment]
        caught = catch_up(zombie, Framework.HF, attempt="b", epoch=20, settle=0.2)
        assert caught.published == ()
        assert store.entries() == []
        # Once the writer stops, the save settles and the next start publishes it.
        caught = catch_up(store, Framework.HF, attempt="b", epoch=20, settle=0.2)
        assert [(e.epoch, e.step) for e in caught.published] == [(10, 100)]


class TestResume:
    def test_first_run(self) -> None:
        """Nothing anywhere: no location, the current epoch recorded, nothing published."""
        store = InMemoryStore()
        resumed = resume(store, Framework.HF, attempt="a", epoch=5, settle=0)
        assert (resumed.entry, resumed.location) == (None, None)
        assert read_epoch_record(store, "a") == 5

    def test_resume_and_resume_location_take_a_sub_folder(self) -> None:
        """The in-process path (ckpt.resume_location) catches up the same sub-folder as ckpt resume."""
        import ckpt

        store = InMemoryStore()
        record_epoch(store, "old", 1)
        save = store.exec_dir("old") + "/checkpoint/step-7"
        store.write_file(save, ".metadata", b"m")
        job = {"store": store, "epoch": 2, "attempt": "new", "environ": {}}
        assert ckpt.resume_location("dcp", **job) is None
        assert ckpt.resume_location("dcp", sub_folder="checkpoint", **job) == save
        assert resume(store, Framework.DCP, attempt="new", epoch=2, sub_folder="checkpoint").location == save
        with pytest.raises(InvalidError, match="saves sub-folder '/checkpoint'"):
            ckpt.resume_location("dcp", sub_folder="/checkpoint", **job)
        with pytest.raises(InvalidError, match=r"with saves sub-folder 'x{110}' is too long for dcp saves"):
            ckpt.resume_location("dcp", sub_folder="x" * 110, **job)

    def test_older_epoch_never_wins_over_the_current_one(self) -> None:
        """A zombie publishing higher steps at its older epoch never becomes the place to resume from."""
        store = InMemoryStore()
        record_epoch(store, "old", 1)
        store.write_file(store.exec_dir("old") + "/checkpoint-200", "trainer_state.json", STATE)
        first = resume(store, Framework.HF, attempt="new", epoch=2, settle=0)
        assert first.location == store.exec_dir("old") + "/checkpoint-200"
        own = store.exec_dir("new") + "/checkpoint-250"
        store.write_file(own, "trainer_state.json", STATE)
        store.publish(2, 250, own)
        zombie = store.exec_dir("old") + "/checkpoint-900"
        store.write_file(zombie, "trainer_state.json", STATE)
        store.publish(1, 900, zombie)
        assert resume(store, Framework.HF, attempt="third", epoch=3, settle=0).location == own


def ckpt(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "ckpt", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=120,
        check=False,
    )


def write_hf_save(root: Path, attempt: str, step: int, *, complete: bool = True) -> Path:
    save = root / "exec" / attempt / f"checkpoint-{step}"
    save.mkdir(parents=True)
    (save / "model.safetensors").write_bytes(b"m" * 64)
    if complete:
        (save / "trainer_state.json").write_bytes(STATE)
    return save


class TestResumeCommand:
    def env(self, root: Path, attempt: str, epoch: int) -> dict[str, str]:
        return {"CKPT_ROOT": str(root), "DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(epoch)}

    def test_first_run_prints_nothing_and_exits_0(self, tmp_path: Path) -> None:
        """On a first run the output is empty and the exit code 0; `resolve` still exits 3."""
        result = ckpt("resume", "--framework", "hf", env=self.env(tmp_path, "a.1", 7))
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
        assert (tmp_path / "exec" / "a.1" / EPOCH_RECORD).read_bytes() == b"7\n"
        assert ckpt("resolve", "--framework", "hf", env=self.env(tmp_path, "a.1", 7)).returncode == 3

    def test_catches_up_the_dead_execution_and_prints_its_newest_save(self, tmp_path: Path) -> None:
        """A save the dead execution completed, never published, is published at its epoch and resumed."""
        assert ckpt("resume", "--framework", "hf", env=self.env(tmp_path, "a", 10)).returncode == 0
        published = write_hf_save(tmp_path, "a", 100)
        assert (
            ckpt("publish", "--step", "100", str(published), env=self.env(tmp_path, "a", 10)).returncode == 0
        )
        newest = write_hf_save(tmp_path, "a", 200)
        write_hf_save(tmp_path, "a", 300, complete=False)
        result = ckpt("resume", "--framework", "hf", "--settle", "0.1", env=self.env(tmp_path, "b", 20))
        assert (result.returncode, result.stdout) == (0, f"{newest}\n"), result.stderr
        assert "caught up" in result.stderr
        entries = ckpt("entries", env=self.env(tmp_path, "b", 20)).stdout.splitlines()
        assert entries == [f"10 100 {published}", f"10 200 {newest}"]

    def test_json_document(self, tmp_path: Path) -> None:
        """--json gives the location, the entry, what was caught up, passed over and skipped."""
        env = self.env(tmp_path, "b", 20)
        (tmp_path / "exec" / "a").mkdir(parents=True)
        (tmp_path / "exec" / "a" / EPOCH_RECORD).write_bytes(b"10\n")
        newest = write_hf_save(tmp_path, "a", 200)
        write_hf_save(tmp_path, "stray", 900)
        result = ckpt("--json", "resume", "--framework", "hf", "--settle", "0", env=env)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["location"] == str(newest)
        assert document["entry"]["epoch"] == 10
        assert [e["step"] for e in document["caught_up"]] == [200]
        assert [p["attempt"] for p in document["passed"]] == ["stray"]
        assert document["skipped"] == []
        empty = ckpt("--json", "resume", "--framework", "dcp", "--no-catch-up", env=env)
        assert json.loads(empty.stdout)["location"] is None

    @pytest.mark.parametrize("extra", [[], ["--no-catch-up"]])
    def test_an_attempt_too_long_for_the_rules_saves_exits_2_at_once(
        self, tmp_path: Path, extra: list[str]
    ) -> None:
        """Refused before the epoch record, naming the attempt, the longest save name and the limit: the
        execution could publish none of the saves it is about to make (spec/names.md §4.5)."""
        attempt = "a" * 97
        result = ckpt("resume", "--framework", "hf", *extra, env=self.env(tmp_path, attempt, 7))
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr.startswith(f"ckpt: attempt '{attempt}' is too long for hf saves"), result.stderr
        assert "'checkpoint-18446744073709551615'" in result.stderr
        assert "at most 133 bytes" in result.stderr
        assert not (tmp_path / "exec").exists()
        assert not (tmp_path / "pub").exists()
        dcp = ckpt("resume", "--framework", "dcp", *extra, env=self.env(tmp_path, "a" * 103, 7))
        assert dcp.returncode == 2, dcp.stderr
        assert "'step-18446744073709551615'" in dcp.stderr
        fits = ckpt("resume", "--framework", "dcp", *extra, env=self.env(tmp_path, "a" * 102, 7))
        assert fits.returncode == 0, fits.stderr

    def test_a_leftover_folder_too_long_for_its_saves_no_longer_fails_resume(self, tmp_path: Path) -> None:
        """A folder an older release let in (epoch record and a complete save, exec/<120>/x fits but its
        checkpoint-500 does not) is passed over with its reason; the newer execution resumes, exit 0."""
        long = "a" * 120
        (tmp_path / "exec" / long).mkdir(parents=True)
        (tmp_path / "exec" / long / EPOCH_RECORD).write_bytes(b"10\n")
        write_hf_save(tmp_path, long, 500)
        older = write_hf_save(tmp_path, "b", 400)
        (tmp_path / "exec" / "b" / EPOCH_RECORD).write_bytes(b"10\n")
        env = self.env(tmp_path, "c", 20)
        result = ckpt("--json", "resume", "--framework", "hf", "--settle", "0", env=env)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["location"] == str(older)
        ((passed,),) = [[p for p in document["passed"] if p["attempt"] == long]]
        assert f"'exec/{long}/checkpoint-18446744073709551615' is 157 bytes" in passed["reason"]
        assert "at most 133 bytes" in passed["reason"]

    def test_no_catch_up_publishes_nothing(self, tmp_path: Path) -> None:
        """--no-catch-up is a verified resolve: a never-published save stays unpublished."""
        env = self.env(tmp_path, "b", 20)
        (tmp_path / "exec" / "a").mkdir(parents=True)
        (tmp_path / "exec" / "a" / EPOCH_RECORD).write_bytes(b"10\n")
        write_hf_save(tmp_path, "a", 200)
        result = ckpt("resume", "--framework", "hf", "--no-catch-up", env=env)
        assert (result.returncode, result.stdout) == (0, "")
        assert not (tmp_path / "pub").exists()

    def test_any_rule_the_watcher_takes(self, tmp_path: Path) -> None:
        """A built-in rule beyond hf/dcp (a Lightning single-file save) and a configured rule catch up too."""
        env = self.env(tmp_path, "b", 20)
        dead = tmp_path / "exec" / "a"
        dead.mkdir(parents=True)
        (dead / EPOCH_RECORD).write_bytes(b"10\n")
        whole = dead / "epoch=0-step=100.ckpt"
        whole.write_bytes(zip_bytes(256))
        (dead / "epoch=0-step=200.ckpt").write_bytes(zip_bytes(256)[:-30])  # cut short: no zip end record
        result = ckpt("resume", "--framework", "lightning", "--settle", "0", env=env)
        assert (result.returncode, result.stdout) == (0, f"{whole}\n"), result.stderr
        assert ckpt("entries", env=env).stdout.splitlines() == [f"10 100 {whole}"]

        config = tmp_path / "ckpt.toml"
        config.write_text('[[frameworks]]\nname = "mine"\npattern = "save_{step}"\nrequired = ["DONE"]\n')
        done = dead / "save_300"
        done.mkdir()
        (done / "DONE").write_bytes(b"")
        (dead / "save_400").mkdir()  # no DONE yet
        mine = ckpt("--config", str(config), "resume", "--framework", "mine", "--settle", "0", env=env)
        assert (mine.returncode, mine.stdout) == (0, f"{done}\n"), mine.stderr
        assert ckpt("entries", env=env).stdout.splitlines() == [f"10 100 {whole}", f"10 300 {done}"]

    def test_an_unknown_rule_is_refused_naming_the_known_ones(self, tmp_path: Path) -> None:
        """A name no rule has: exit 2, one line listing the names it could be; nothing is recorded."""
        result = ckpt("resume", "--framework", "keras", env=self.env(tmp_path, "b", 20))
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert all(name in result.stderr for name in ("keras", "lightning", "orbax")), result.stderr
        assert not (tmp_path / "exec").exists()

    def test_a_store_that_never_answers_fails_within_the_scan_timeout(self, tmp_path: Path) -> None:
        """The epoch record is bounded like every scan: a silent S3 endpoint is exit 1, not a hung start."""
        env = {
            "DISPATCH_ATTEMPT": "b",
            "DISPATCH_EPOCH": "20",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        with silent_endpoint() as (url, held):
            config = silent_s3_config(tmp_path / "ckpt.toml", url)
            result = ckpt(
                "--root",
                "s3://bucket",
                "--config",
                str(config),
                "resume",
                "--framework",
                "hf",
                "--scan-timeout",
                "1",
                env=env,
            )
        assert (result.returncode, result.stdout) == (1, ""), result.stderr
        assert "recording the epoch in s3://bucket/exec/b took longer than 1s" in result.stderr
        assert held

    @pytest.mark.parametrize("missing", ["DISPATCH_EPOCH", "DISPATCH_ATTEMPT"])
    def test_missing_epoch_or_attempt_is_a_usage_error(self, tmp_path: Path, missing: str) -> None:
        """Without an epoch or an attempt the command refuses in one line with exit 2."""
        env = self.env(tmp_path, "b", 20)
        del env[missing]
        result = ckpt("resume", "--framework", "hf", env=env)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("ckpt: ")
        assert len(result.stderr.strip().splitlines()) == 1
        assert result.stdout == ""

    def test_a_missing_root_is_an_error_and_is_not_created(self, tmp_path: Path) -> None:
        """A mistyped root fails with exit 1 instead of being created by the epoch record."""
        missing = tmp_path / "no-such-root"
        result = ckpt("resume", "--framework", "hf", env=self.env(missing, "b", 20))
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith("ckpt: ")
        assert not missing.exists()

    def test_bad_settle_is_a_usage_error(self, tmp_path: Path) -> None:
        """A settle time that is not a plain number of seconds is refused with exit 2."""
        result = ckpt("resume", "--framework", "hf", "--settle", "-1", env=self.env(tmp_path, "b", 20))
        assert result.returncode == 2
        assert "--settle" in result.stderr


def dcp_save(folder: Path, *, complete: bool = True) -> Path:
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"x" * 64)
    if complete:
        (folder / ".metadata").write_bytes(b"m")
    return folder


def watch_until(env: dict[str, str], *args: str, line: str) -> list[str]:
    """Run ``ckpt watch ARGS`` until a line of its log contains ``line``, then kill it (SIGKILL: no drain)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    full_env.update(env, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [sys.executable, "-m", "ckpt", "watch", *args], stderr=subprocess.PIPE, text=True, env=full_env
    )
    seen: list[str] = []
    try:
        assert process.stderr is not None
        for text in process.stderr:  # ends when the process does: a watch that dies early fails below
            seen.append(text)
            if line in text:
                break
        else:
            raise AssertionError(f"ckpt watch ended before logging {line!r}: {seen}")
    finally:
        process.kill()
        process.wait(timeout=30)
        if process.stderr is not None:
            process.stderr.close()
    return seen


class TestResumeSavesSubFolder:
    """Issue 20, case 7: the sidecar watches ``--saves exec/<attempt>/checkpoint`` (docs/kubernetes.md)."""

    def env(self, root: Path, attempt: str, epoch: int) -> dict[str, str]:
        return {"CKPT_ROOT": str(root), "DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(epoch)}

    def test_a_save_the_killed_sidecar_never_published_is_caught_up(self, tmp_path: Path) -> None:
        """The sidecar publishes step 20 and is killed; step 40 is written after. Without --saves, resume
        goes back to step 20; with the sidecar's own --saves spelling it publishes step 40 at the dead
        execution's epoch and resumes from it."""
        older = dcp_save(tmp_path / "exec" / "a" / "checkpoint" / "step-20")
        seen = watch_until(
            self.env(tmp_path, "a", 10),
            "--framework",
            "dcp",
            "--saves",
            "exec/a/checkpoint",
            "--interval",
            "600",
            line="published",
        )
        assert any(str(older) in text for text in seen), seen
        newest = dcp_save(tmp_path / "exec" / "a" / "checkpoint" / "step-40")
        dcp_save(tmp_path / "exec" / "a" / "checkpoint" / "step-50", complete=False)  # still being written
        env = self.env(tmp_path, "b", 20)
        before = ckpt("resume", "--framework", "dcp", env=env)
        assert (before.returncode, before.stdout) == (0, f"{older}\n"), before.stderr
        result = ckpt("resume", "--framework", "dcp", "--saves", "exec/b/checkpoint", env=env)
        assert (result.returncode, result.stdout) == (0, f"{newest}\n"), result.stderr
        assert "caught up" in result.stderr
        assert ckpt("entries", env=env).stdout.splitlines() == [f"10 20 {older}", f"10 40 {newest}"]

    def test_a_sidecar_killed_before_its_first_publication_leaves_the_epoch(self, tmp_path: Path) -> None:
        """watch --saves inside exec/<attempt>/ records that execution's epoch before its first scan, so a
        save it never published is caught up at that epoch (the absolute spelling works as well)."""
        watch_until(
            self.env(tmp_path, "a", 10),
            "--framework",
            "dcp",
            "--saves",
            "exec/a/checkpoint/",
            "--interval",
            "600",
            line="watching",
        )
        assert (tmp_path / "exec" / "a" / EPOCH_RECORD).read_bytes() == b"10\n"
        assert not (tmp_path / "pub").exists()
        save = dcp_save(tmp_path / "exec" / "a" / "checkpoint" / "step-40")
        env = self.env(tmp_path, "b", 20)
        saves = str(tmp_path / "exec" / "b" / "checkpoint")
        result = ckpt("--json", "resume", "--framework", "dcp", "--saves", saves, env=env)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["location"] == str(save)
        assert (document["entry"]["epoch"], document["entry"]["step"]) == (10, 40)

    @pytest.mark.parametrize(
        ("saves", "says"),
        [
            ("exec/a/checkpoint", "is not inside this execution's folder 'exec/b'"),
            ("shared/checkpoint", "is not inside this execution's folder 'exec/b'"),
            ("/elsewhere/checkpoint", "is not under the root"),
            ("exec/b/../a", "not clean"),
        ],
    )
    def test_saves_outside_this_executions_folder_is_a_usage_error(
        self, tmp_path: Path, saves: str, says: str
    ) -> None:
        """Catch-up finds every execution's saves by their place in its folder: any other --saves is exit 2,
        one line naming it, before anything is written."""
        result = ckpt("resume", "--framework", "dcp", "--saves", saves, env=self.env(tmp_path, "b", 20))
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        assert result.stderr.startswith("ckpt: "), result.stderr
        assert says in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "exec").exists()


KILL_STEPS = [10, 20]


def _wait_for(path: Path, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert process.poll() is None, "the writer exited before reaching its kill point"
        assert time.monotonic() < deadline, "the writer never reached its kill point"
        time.sleep(0.02)


class TestKilledAtEveryFileBoundary:
    """The issue's measurement: trainer and sidecar killed together at every file boundary of the saves."""

    @pytest.mark.parametrize("stop_after", range(len(KILL_STEPS) * BOUNDARIES_PER_SAVE + 1))
    def test_resume_finds_the_newest_complete_save(self, tmp_path: Path, stop_after: int) -> None:
        """After a SIGKILL of writer and sidecar, `ckpt resume` prints the newest complete save on disk,
        and every published save is complete."""
        root = tmp_path / "root"
        root.mkdir()
        store = PosixStore(str(root))
        record_epoch(store, "a", 10)  # what `ckpt resume` wrote when execution a started
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
        env.update({"CKPT_ROOT": str(root), "DISPATCH_EPOCH": "10", "DISPATCH_ATTEMPT": "a"})
        ready = tmp_path / "ready"
        tests = Path(__file__).resolve().parent
        sidecar = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckpt",
                "watch",
                "--framework",
                "hf",
                "--interval",
                "0.1",
                "--settle",
                "0.2",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        writer = subprocess.Popen(
            [sys.executable, "-m", "support.integ_kill_writer", "--saves", store.exec_dir("a"),
             "--steps", ",".join(map(str, KILL_STEPS)), "--stop-after", str(stop_after),
             "--ready", str(ready)],
            cwd=tests,
        )  # fmt: skip
        try:
            _wait_for(ready, writer)
        finally:
            for process in (writer, sidecar):  # a node failure: both die at once
                process.kill()
                process.wait()
        complete = complete_steps(KILL_STEPS, stop_after)
        env.update({"DISPATCH_EPOCH": "20", "DISPATCH_ATTEMPT": "b"})
        result = subprocess.run(
            [sys.executable, "-m", "ckpt", "resume", "--framework", "hf", "--settle", "0.2"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        expected = f"{store.exec_dir('a')}/checkpoint-{complete[-1]}\n" if complete else ""
        assert result.stdout == expected
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, step) for step in complete]
