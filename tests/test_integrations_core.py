"""The shared core of the integrations: job settings, publish after a barrier, the failed-publish policy."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt.catchup import read_epoch_record
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError, NotFoundError, StorageError
from ckpt.integrations.core import Publisher, open_job, resume_location
from ckpt.testing import InMemoryStore

STATE = b'{"global_step": 1}'


class FlakyStore(InMemoryStore):
    """An in-memory store whose next ``failures`` publications fail as a storage outage would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        if self.failures > 0:
            self.failures -= 1
            raise StorageError("the store is down", location=save_location)
        return super().publish(epoch, step, save_location)


def make_save(store: InMemoryStore, attempt: str, step: int) -> str:
    location = f"{store.exec_dir(attempt)}/checkpoint-{step}"
    store.write_file(location, "trainer_state.json", STATE)
    return location


class TestOpenJob:
    def test_settings_from_the_environment(self, tmp_path: Path) -> None:
        """Root, epoch and attempt come from CKPT_ROOT, DISPATCH_EPOCH and DISPATCH_ATTEMPT."""
        env = {"CKPT_ROOT": str(tmp_path), "DISPATCH_EPOCH": "0042", "DISPATCH_ATTEMPT": "2.1.0"}
        job = open_job(environ=env)
        assert (job.epoch, job.attempt, job.saves_location) == (42, "2.1.0", f"{tmp_path}/exec/2.1.0")

    def test_root_from_the_config_file(self, tmp_path: Path) -> None:
        """Without CKPT_ROOT, the configuration file's root is used."""
        config = tmp_path / "ckpt.toml"
        config.write_text(f'root = "{tmp_path}"\n')
        job = open_job(epoch=1, attempt="a", environ={"CKPT_CONFIG": str(config)})
        assert job.store.root == str(tmp_path)

    @pytest.mark.parametrize(
        ("missing", "named"),
        [
            ("DISPATCH_EPOCH", "DISPATCH_EPOCH"),
            ("DISPATCH_ATTEMPT", "DISPATCH_ATTEMPT"),
            ("CKPT_ROOT", "CKPT_ROOT"),
        ],
    )
    def test_a_missing_setting_is_an_error_naming_it(self, tmp_path: Path, missing: str, named: str) -> None:
        """A missing epoch, attempt or root is an InvalidError at construction that says where to set it."""
        env = {"CKPT_ROOT": str(tmp_path), "DISPATCH_EPOCH": "1", "DISPATCH_ATTEMPT": "a"}
        del env[missing]
        with pytest.raises(InvalidError, match=named):
            open_job(environ=env)

    @pytest.mark.parametrize("epoch", ["-1", "1.5", "18446744073709551616", -1])
    def test_an_invalid_epoch_is_refused(self, tmp_path: Path, epoch: object) -> None:
        """An epoch that is not an unsigned 64-bit integer is refused."""
        with pytest.raises(InvalidError):
            open_job(root=str(tmp_path), epoch=epoch, attempt="a", environ={})  # type: ignore[arg-type]


class TestPublisher:
    def test_a_missing_root_is_an_error_when_made(self, tmp_path: Path) -> None:
        """The main process's publisher refuses a root that does not exist, and does not create it."""
        job = open_job(root=str(tmp_path / "missing"), epoch=1, attempt="a", environ={})
        with pytest.raises(NotFoundError):
            Publisher(job, is_main=True)
        assert not (tmp_path / "missing").exists()

    def test_barrier_comes_before_the_publication(self) -> None:
        """The main process publishes only after the barrier returned."""
        store = InMemoryStore()
        job = open_job(store=store, epoch=5, attempt="a", environ={})
        seen: list[object] = []
        publisher = Publisher(job, is_main=True, barrier=lambda: seen.append(list(store.entries())))
        entry = publisher.publish(10, make_save(store, "a", 10))
        assert seen == [[]]
        assert entry is not None
        assert (entry.epoch, entry.step) == (5, 10)

    def test_only_the_main_process_publishes(self) -> None:
        """Other ranks take part in the barrier and publish nothing."""
        store = InMemoryStore()
        calls: list[str] = []
        publisher = Publisher(
            open_job(store=store, epoch=5, attempt="a", environ={}),
            is_main=False,
            barrier=lambda: calls.append("b"),
        )
        assert publisher.publish(10, make_save(store, "a", 10)) is None
        assert calls == ["b"]
        assert store.entries() == []

    def test_records_the_epoch_when_made(self) -> None:
        """The main process records the execution's epoch before the first save."""
        store = InMemoryStore()
        Publisher(open_job(store=store, epoch=5, attempt="a", environ={}), is_main=True)
        assert read_epoch_record(store, "a") == 5

    def test_a_failed_publication_is_logged_and_retried_at_the_next_save(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A storage failure does not raise into training; the save is published before the next one."""
        store = FlakyStore(failures=1)
        publisher = Publisher(open_job(store=store, epoch=5, attempt="a", environ={}), is_main=True)
        with caplog.at_level(logging.ERROR, logger="ckpt.integrations"):
            assert publisher.publish(10, make_save(store, "a", 10)) is None
        assert "could not publish" in caplog.text
        assert store.entries() == []
        entry = publisher.publish(20, make_save(store, "a", 20))
        assert entry is not None
        assert [(e.epoch, e.step) for e in store.entries()] == [(5, 10), (5, 20)]
        assert publisher.pending == []

    def test_already_published_counts_as_published(self) -> None:
        """A save the sidecar published first is not an error."""
        store = InMemoryStore()
        location = make_save(store, "a", 10)
        existing = store.publish(5, 10, location)
        publisher = Publisher(open_job(store=store, epoch=5, attempt="a", environ={}), is_main=True)
        assert publisher.publish(10, location) == existing

    def test_a_save_outside_the_root_raises(self) -> None:
        """A configuration mistake no retry can mend is raised at once."""
        store = InMemoryStore()
        publisher = Publisher(open_job(store=store, epoch=5, attempt="a", environ={}), is_main=True)
        with pytest.raises(InvalidError):
            publisher.publish(10, "memory://elsewhere/exec/a/checkpoint-10")

    def test_a_refused_save_does_not_block_the_next_ones(self) -> None:
        """After a save outside the root was refused, the next save is published normally."""
        store = InMemoryStore()
        publisher = Publisher(open_job(store=store, epoch=5, attempt="a", environ={}), is_main=True)
        with pytest.raises(InvalidError):
            publisher.publish(10, "memory://elsewhere/exec/a/checkpoint-10")
        assert publisher.publish(20, make_save(store, "a", 20)) is not None
        assert [e.step for e in store.entries()] == [20]

    def test_a_vanished_save_is_dropped(self) -> None:
        """A pending save that the framework deleted meanwhile is dropped, the next one published."""
        store = FlakyStore(failures=1)
        publisher = Publisher(open_job(store=store, epoch=5, attempt="a", environ={}), is_main=True)
        gone = make_save(store, "a", 10)
        publisher.publish(10, gone)
        store.remove_tree(gone)
        assert publisher.publish(20, make_save(store, "a", 20)) is not None
        assert [e.step for e in store.entries()] == [20]


class TestResumeLocation:
    def test_first_run_is_none_then_the_caught_up_save(self) -> None:
        """None on a first run; after a dead execution's unpublished save, that save."""
        store = InMemoryStore()
        assert resume_location("hf", store=store, epoch=1, attempt="a", environ={}, settle=0) is None
        location = make_save(store, "a", 30)
        assert resume_location("hf", store=store, epoch=2, attempt="b", environ={}, settle=0) == location


def test_import_ckpt_imports_no_framework() -> None:
    """``import ckpt`` and ``import ckpt.integrations`` never import a framework."""
    code = (
        "import sys, ckpt, ckpt.integrations\n"
        "loaded = [m for m in ('torch', 'transformers', 'lightning', 'accelerate') if m in sys.modules]\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "[]"


class SaveMissingError(InvalidError, FileNotFoundError):
    """The shape of spec/operations.md's missing-save error: the caller's mistake, and a missing file."""


class TestVanishedSave:
    @pytest.mark.parametrize(
        ("error", "vanished"),
        [
            (SaveMissingError("save memory://root/exec/a/checkpoint-1 does not exist"), True),
            (NotFoundError("save does not exist", location="memory://root/exec/a/checkpoint-1/"), True),
            (NotFoundError("the root does not exist", location="memory://root"), False),
            (StorageError("the store is down", location="memory://root/exec/a/checkpoint-1"), False),
            (InvalidError("not under the root"), False),
        ],
    )
    def test_only_a_missing_save_counts(self, error: Exception, vanished: bool) -> None:
        """A missing save is dropped from the pending list; a missing root or an outage is not."""
        from ckpt.catchup import is_vanished_save

        assert is_vanished_save(error, "memory://root/exec/a/checkpoint-1") is vanished
