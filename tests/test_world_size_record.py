"""The world size of the run that wrote the saves is recorded and used on every path (issue 20, case 5).

An outside tool ran a real 2-process Trainer with ``CkptCallback`` and ``resume_location(args)``, killing rank
1 at each of its file events: catch-up judged the dead execution's saves without a world size and resumed
from saves lacking ``rng_state_1.pth``. Now the writers of the epoch record write
``exec/<attempt>/.ckpt-world-size`` beside it (spec/layout.md §8.5), and catch-up and verified resolve judge
each execution's saves by it (spec/watcher.md §2.5b). Every store: in memory, POSIX, S3 (moto, over HTTP and
in process).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.application.verify import resolve_verified
from ckpt.catchup import catch_up, read_world_size_record, record_epoch, record_world_size, resume
from ckpt.domain.catchup import WORLD_SIZE_RECORD
from ckpt.domain.errors import InvalidError, MalformedError
from ckpt.domain.frameworks import Framework
from ckpt.domain.ports import WatchStore
from ckpt.integrations.core import Publisher, open_job, resume_location
from support.fixtures import HARNESS_FACTORIES
from support.harness import Harness
from support.rule_layouts import zip_bytes
from support.s3 import RequestLog, S3Harness

DEAD = "1.4101.0"  # the execution that died
NEW = "1.4101.1"  # the one starting now


def hf_save(harness: Harness, attempt: str, step: int, ranks: tuple[int, ...]) -> str:
    """An hf save of ``attempt`` at ``step`` holding the RNG states of ``ranks`` only."""
    files = {"model.safetensors": b"m" * 64, "trainer_state.json": json.dumps({"global_step": step}).encode()}
    files.update({f"rng_state_{rank}.pth": zip_bytes(32) for rank in ranks})
    return harness.make_save(f"exec/{attempt}/checkpoint-{step}", files)


def dead_run(harness: Harness, *, record: bool = True) -> WatchStore:
    """A dead 2-process execution at epoch 10: checkpoint-5 whole, checkpoint-9 without rank 1's RNG state
    (rank 1 was killed after its last write but one); neither published. With ``record``, the folder records
    its world size, as its publisher now does."""
    store = harness.store()
    record_epoch(store, DEAD, 10)
    if record:
        record_world_size(store, DEAD, 2)
    hf_save(harness, DEAD, 5, (0, 1))
    hf_save(harness, DEAD, 9, (0,))
    return store


class TestRecord:
    def test_written_read_back_and_kept_when_greater(self, harness: Harness) -> None:
        """The record is ``2\\n``; a smaller size keeps it (the stricter judge), a greater one replaces it."""
        store = harness.store()
        assert read_world_size_record(store, DEAD) is None
        assert record_world_size(store, DEAD, 2) == 2
        assert store.read_file(store.exec_dir(DEAD), WORLD_SIZE_RECORD) == b"2\n"
        assert record_world_size(store, DEAD, 1) == 2
        assert read_world_size_record(store, DEAD) == 2
        assert record_world_size(store, DEAD, 4) == 4
        assert read_world_size_record(store, DEAD) == 4

    def test_a_malformed_record_is_refused_by_the_parser_and_replaced(self, harness: Harness) -> None:
        """``02\\n`` is not the canonical form: MalformedError to read, replaced by the next writer."""
        store = harness.store()
        harness.make_save(f"exec/{DEAD}", {WORLD_SIZE_RECORD: b"02\n"})
        with pytest.raises(MalformedError):
            read_world_size_record(store, DEAD)
        assert record_world_size(store, DEAD, 2) == 2
        assert store.read_file(store.exec_dir(DEAD), WORLD_SIZE_RECORD) == b"2\n"


class TestCatchUp:
    def test_a_dead_execution_is_judged_by_its_recorded_world_size(self, harness: Harness) -> None:
        """The case of the issue: the new start gives no world size; the record says 2, so checkpoint-9
        (rank 1's RNG state missing) stays unpublished and the job resumes from checkpoint-5."""
        store = dead_run(harness)
        caught = catch_up(store, Framework.HF, attempt=NEW, epoch=20, settle=0)
        assert [(e.epoch, e.step) for e in caught.published] == [(10, 5)]
        assert [(t.attempt, t.world_size) for t in caught.plan.targets] == [(DEAD, 2), (NEW, None)]
        resumed = resume(store, Framework.HF, attempt=NEW, epoch=20, settle=0)
        assert resumed.location == f"{store.exec_dir(DEAD).rstrip('/')}/checkpoint-5"

    def test_without_a_record_the_world_size_is_unknown(self, harness: Harness) -> None:
        """An execution of an older release (no record): both saves pass, as before. This is what the
        record changes; an explicit world size still serves such folders."""
        store = dead_run(harness, record=False)
        caught = catch_up(store, Framework.HF, attempt=NEW, epoch=20, settle=0)
        assert [e.step for e in caught.published] == [5, 9]

    def test_an_explicit_world_size_serves_a_folder_without_a_record(self, harness: Harness) -> None:
        store = dead_run(harness, record=False)
        caught = catch_up(store, Framework.HF, attempt=NEW, epoch=20, settle=0, world_size=2)
        assert [e.step for e in caught.published] == [5]

    def test_an_explicit_world_size_that_conflicts_with_the_record_is_refused(self, harness: Harness) -> None:
        """Neither silently wins: InvalidError naming the folder, the record and both sizes; nothing is
        published."""
        store = dead_run(harness)
        with pytest.raises(InvalidError, match=r"records a world size of 2 .*a world size of 4 was given"):
            catch_up(store, Framework.HF, attempt=NEW, epoch=20, settle=0, world_size=4)
        assert store.entries() == []

    def test_a_malformed_record_is_an_unknown_world_size(self, harness: Harness) -> None:
        store = dead_run(harness, record=False)
        harness.make_save(f"exec/{DEAD}", {WORLD_SIZE_RECORD: b"two\n"})
        caught = catch_up(store, Framework.HF, attempt=NEW, epoch=20, settle=0)
        assert [e.step for e in caught.published] == [5, 9]


class TestVerifiedResolve:
    def published(self, harness: Harness, *, record: bool = True) -> WatchStore:
        store = dead_run(harness, record=record)
        for step in (5, 9):
            store.publish(10, step, f"{store.exec_dir(DEAD).rstrip('/')}/checkpoint-{step}")
        return store

    def test_an_entry_is_judged_by_the_world_size_its_folder_records(self, harness: Harness) -> None:
        """No world size given: checkpoint-9 is skipped with the rank reason, checkpoint-5 is the answer."""
        store = self.published(harness)
        verified = resolve_verified(store, Framework.HF)
        assert verified.entry is not None
        assert verified.entry.step == 5
        assert [entry.step for entry, _ in verified.skipped] == [9]
        assert "rng_state_1.pth" in verified.skipped[0][1]

    def test_the_same_explicit_world_size_agrees(self, harness: Harness) -> None:
        store = self.published(harness)
        assert resolve_verified(store, Framework.HF, world_size=2) == resolve_verified(store, Framework.HF)

    def test_a_conflicting_explicit_world_size_is_refused(self, harness: Harness) -> None:
        store = self.published(harness)
        with pytest.raises(InvalidError, match=r"exec/1\.4101\.0.* records a world size of 2"):
            resolve_verified(store, Framework.HF, world_size=3)

    def test_without_a_record_the_newest_passes(self, harness: Harness) -> None:
        """An older release's folder: no world size is known, so no per-rank check (as before)."""
        store = self.published(harness, record=False)
        verified = resolve_verified(store, Framework.HF)
        assert verified.entry is not None
        assert verified.entry.step == 9

    def test_a_rule_without_a_world_size_reads_no_record(self, harness: Harness) -> None:
        """NeMo's rule has no world size: a conflicting-looking record is not read, nothing is refused."""
        store = self.published(harness)
        from ckpt.application.rulebook import find_rule

        verified = resolve_verified(store, find_rule("nemo"), world_size=3)
        assert verified.entry is None  # no nemo save here at all; what matters is that nothing raised


class TestS3Requests:
    @pytest.fixture(params=["s3-http", "s3-moto"])
    def harness(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
        yield from HARNESS_FACTORIES[request.param](request, tmp_path)

    def test_the_record_is_one_put_and_verified_resolve_reads_it_once_per_folder(
        self, harness: S3Harness
    ) -> None:
        """Recording is a read and one PutObject; a verified resolve walking two entries of one folder
        reads that folder's record once."""
        store = harness.store()
        log = RequestLog(harness.store_client)
        assert record_world_size(store, DEAD, 2) == 2
        assert log.operations() == ["GetObject", "PutObject"]
        assert harness.keys_under(f"exec/{DEAD}") == [harness.key(f"exec/{DEAD}/{WORLD_SIZE_RECORD}")]
        record_epoch(store, DEAD, 10)
        hf_save(harness, DEAD, 5, (0, 1))
        hf_save(harness, DEAD, 9, (0,))
        for step in (5, 9):
            store.publish(10, step, f"{store.exec_dir(DEAD).rstrip('/')}/checkpoint-{step}")
        log.clear()
        verified = resolve_verified(store, Framework.HF)
        assert verified.entry is not None
        assert verified.entry.step == 5
        reads = [url for op, _, url in log.sent if op == "GetObject" and url.endswith(WORLD_SIZE_RECORD)]
        assert len(reads) == 1


class TestWriters:
    def test_the_publisher_records_the_jobs_world_size(self, harness: Harness) -> None:
        """open_job takes the run's size from WORLD_SIZE; the main process's publisher records it."""
        store = harness.store()
        job = open_job(store=store, epoch=10, attempt=DEAD, environ={"WORLD_SIZE": "2"})
        assert job.world_size == 2
        Publisher(job, is_main=True, barrier=lambda: None)
        assert read_world_size_record(store, DEAD) == 2

    def test_a_bad_world_size_in_the_environment_is_refused(self, harness: Harness) -> None:
        with pytest.raises(InvalidError, match="WORLD_SIZE"):
            open_job(store=harness.store(), epoch=10, attempt=DEAD, environ={"WORLD_SIZE": "0"})

    def test_no_world_size_known_records_none(self, harness: Harness) -> None:
        store = harness.store()
        job = open_job(store=store, epoch=10, attempt=DEAD, environ={})
        Publisher(job, is_main=True, barrier=lambda: None)
        assert read_world_size_record(store, DEAD) is None

    def test_resume_location_records_this_runs_size_and_judges_the_dead_one_by_its_record(
        self, harness: Harness
    ) -> None:
        """The whole story in process: the new start (2 processes, WORLD_SIZE=2) records its own size and
        resumes from checkpoint-5 of the dead run, judged by the dead run's record."""
        store = dead_run(harness)
        location = resume_location(
            "hf", store=store, epoch=20, attempt=NEW, environ={"WORLD_SIZE": "2"}, settle=0
        )
        assert location == f"{store.exec_dir(DEAD).rstrip('/')}/checkpoint-5"
        assert read_world_size_record(store, NEW) == 2
