"""The epoch record on every store (``WritesSmallFiles``), and catch-up on S3 (docs/adr/0011).

On POSIX the record is a fsynced temporary file renamed into place, never written through a link and never
creating a mistyped root; on S3 it is one ``PutObject``. With it, catch-up on an S3 root knows the epoch of
an execution that died before publishing anything, in process and through ``ckpt resume``.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.catchup import catch_up, read_epoch_record, record_epoch, resume
from ckpt.domain.catchup import EPOCH_RECORD
from ckpt.domain.errors import InvalidError, NotFoundError, StorageError
from ckpt.domain.frameworks import Framework
from ckpt.domain.ports import WritesSmallFiles
from support.faulty_syscalls import FaultySyscalls
from support.fixtures import HARNESS_FACTORIES
from support.harness import Harness
from support.s3 import RequestLog, S3Harness, new_bucket_name, raw_client

STATE = json.dumps({"global_step": 1}).encode()
HF_FILES = {"model.safetensors": b"m" * 64, "trainer_state.json": STATE}


def hf_save(harness: Harness, attempt: str, step: int, *, complete: bool = True) -> str:
    files = dict(HF_FILES) if complete else {"model.safetensors": b"m" * 64}
    return harness.make_save(f"exec/{attempt}/checkpoint-{step}", files)


@pytest.fixture(params=["posix", "s3-http", "s3-moto"])
def real_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """A harness on each real store."""
    yield from HARNESS_FACTORIES[request.param](request, tmp_path)


class TestWritesSmallFiles:
    def test_every_store_writes_and_replaces_a_small_file(self, harness: Harness) -> None:
        """The capability is there on every store; the second write replaces the first, nested folders
        are created, and the file reads back through the store."""
        store = harness.store()
        assert isinstance(store, WritesSmallFiles)
        folder = store.exec_dir("a.1")
        store.write_file(folder, EPOCH_RECORD, b"7\n")
        store.write_file(folder, EPOCH_RECORD, b"8\n")
        store.write_file(folder, "deeper/note", b"n")
        assert store.read_file(folder, EPOCH_RECORD) == b"8\n"
        assert store.read_file(folder, "deeper/note") == b"n"
        assert read_epoch_record(store, "a.1") == 8

    @pytest.mark.parametrize("name", ["", "/abs", "../up", "a/../b", "trailing/"])
    def test_a_bad_name_is_refused_before_any_write(self, real_harness: Harness, name: str) -> None:
        """A name that is not a clean relative path is InvalidError, and nothing is written. (The fake's
        ``write_file`` builds any tree a test asks for, hostile names included, so it is not held to this.)"""
        store = real_harness.store()
        assert isinstance(store, WritesSmallFiles)
        with pytest.raises(InvalidError):
            store.write_file(store.exec_dir("a"), name, b"x")
        assert store.folders(store.root) == []

    def test_a_location_outside_the_root_is_refused(self, harness: Harness) -> None:
        store = harness.store()
        assert isinstance(store, WritesSmallFiles)
        with pytest.raises(InvalidError):
            store.write_file("/elsewhere/exec/a", EPOCH_RECORD, b"1\n")


class TestPosixRecord:
    def test_a_missing_root_is_not_created(self, tmp_path: Path) -> None:
        """Writing the record under a mistyped root fails with NotFoundError; the root stays absent."""
        missing = tmp_path / "no-such-root"
        with pytest.raises(NotFoundError):
            record_epoch(PosixStore(str(missing)), "a", 3)
        assert not missing.exists()

    def test_never_written_through_a_link(self, tmp_path: Path) -> None:
        """An execution folder that is a link to elsewhere is refused; nothing lands at the link's target."""
        root = tmp_path / "root"
        (root / "exec").mkdir(parents=True)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (root / "exec" / "a").symlink_to(elsewhere)
        with pytest.raises(StorageError, match="link"):
            record_epoch(PosixStore(str(root)), "a", 3)
        assert list(elsewhere.iterdir()) == []

    def test_fsynced_file_renamed_into_place_then_folders_synced(self, tmp_path: Path) -> None:
        """The order that makes the record durable and atomic: new folders' parents synced, the temporary
        file written and synced before the rename, the folder synced after it."""
        calls = FaultySyscalls(str(tmp_path))
        record_epoch(PosixStore(str(tmp_path), syscalls=calls), "a", 3)
        steps = [(c.operation, c.target) for c in calls.calls if c.operation in ("mkdir", "fsync", "rename")]
        assert [op for op, _ in steps] == ["mkdir", "fsync", "mkdir", "fsync", "fsync", "rename", "fsync"]
        assert (steps[0][1], steps[2][1]) == ("exec", "exec/a")
        assert steps[5][1] == f"exec/a/{EPOCH_RECORD}"
        assert (tmp_path / "exec" / "a" / EPOCH_RECORD).read_bytes() == b"3\n"

    def test_a_failed_rename_keeps_the_old_record_and_leaves_no_temporary_file(self, tmp_path: Path) -> None:
        """When the rename fails the record still holds the old epoch and the folder holds nothing else."""
        calls = FaultySyscalls(str(tmp_path))
        store = PosixStore(str(tmp_path), syscalls=calls)
        record_epoch(store, "a", 9)
        calls.fail("rename", nth=2, error=errno.EIO)
        with pytest.raises(StorageError, match="Input/output error"):
            record_epoch(store, "a", 5)
        assert sorted(p.name for p in (tmp_path / "exec" / "a").iterdir()) == [EPOCH_RECORD]
        assert read_epoch_record(store, "a") == 9


class TestS3Record:
    @pytest.fixture(params=["s3-http", "s3-moto"])
    def harness(self, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
        yield from HARNESS_FACTORIES[request.param](request, tmp_path)

    def test_the_record_is_one_put_under_the_exec_prefix(self, harness: S3Harness) -> None:
        """Recording a new execution's epoch reads the record once and puts it once: nothing else."""
        store = harness.store()
        log = RequestLog(harness.store_client)
        assert record_epoch(store, "a", 10) == 10
        assert log.operations() == ["GetObject", "PutObject"]
        assert harness.keys_under("exec/a") == [harness.key(f"exec/a/{EPOCH_RECORD}")]
        log.clear()
        assert record_epoch(store, "a", 12) == 10  # a higher epoch keeps the lower record: one read
        assert log.operations() == ["GetObject"]

    def test_a_missing_bucket_is_not_found_and_not_created(self, harness: S3Harness) -> None:
        """A mistyped bucket fails with NotFoundError; nothing creates it."""
        from ckpt.adapters.s3 import S3Store

        missing = new_bucket_name()
        with pytest.raises(NotFoundError):
            record_epoch(S3Store(f"s3://{missing}/run", harness.store_client), "a", 3)
        names = [b["Name"] for b in harness.client.list_buckets()["Buckets"]]
        assert missing not in names

    def test_catch_up_publishes_a_dead_execution_that_never_published(self, harness: S3Harness) -> None:
        """Execution a recorded its epoch, wrote saves and died before publishing anything: the next start
        publishes its complete saves under epoch 10 (without the record it would be passed over)."""
        store = harness.store()
        record_epoch(store, "a", 10)
        hf_save(harness, "a", 100)
        hf_save(harness, "a", 200)
        hf_save(harness, "a", 300, complete=False)
        caught = catch_up(store, Framework.HF, attempt="b", epoch=20, settle=0)
        assert [(e.epoch, e.step) for e in caught.published] == [(10, 100), (10, 200)]
        assert caught.passed == ()
        resumed = resume(store, Framework.HF, attempt="b", epoch=20, settle=0)
        assert resumed.location == f"{store.root}/exec/a/checkpoint-200"
        assert read_epoch_record(store, "b") == 20


def _cli(config: Path, *args: str, attempt: str, epoch: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    env.update({"AWS_ACCESS_KEY_ID": "resume-key", "AWS_SECRET_ACCESS_KEY": "resume-secret"})
    env.update({"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(epoch)})
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "ckpt", "--config", str(config), *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


class TestResumeCommandOnS3:
    def test_resume_records_the_epoch_and_catches_up_the_dead_execution(
        self, s3_server: str, tmp_path: Path
    ) -> None:
        """`ckpt resume` on s3://BUCKET/PREFIX: the first start records epoch 10 and prints nothing; after
        execution a died with two unpublished saves, the next start publishes them at 10 and prints the
        newer one."""
        client = raw_client(s3_server)
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        root = f"s3://{bucket}/team-a/run-42"
        config = tmp_path / "ckpt.toml"
        config.write_text(
            f'root = "{root}"\n[s3]\nendpoint_url = "{s3_server}"\nregion = "us-east-1"\n'
            'addressing_style = "path"\nconnect_timeout = 2\nread_timeout = 10\nmax_attempts = 2\n'
            '[[credentials]]\nsource = "env"\n'
        )
        first = _cli(config, "resume", "--framework", "hf", attempt="a", epoch=10)
        assert (first.returncode, first.stdout) == (0, ""), first.stderr
        record = client.get_object(Bucket=bucket, Key=f"team-a/run-42/exec/a/{EPOCH_RECORD}")
        assert record["Body"].read() == b"10\n"
        for step, files in ((100, HF_FILES), (200, HF_FILES), (300, {"model.safetensors": b"m"})):
            for name, data in files.items():
                key = f"team-a/run-42/exec/a/checkpoint-{step}/{name}"
                client.put_object(Bucket=bucket, Key=key, Body=data)
        second = _cli(config, "resume", "--framework", "hf", "--settle", "0.1", attempt="b", epoch=20)
        assert (second.returncode, second.stdout) == (0, f"{root}/exec/a/checkpoint-200\n"), second.stderr
        entries = _cli(config, "entries", attempt="b", epoch=20).stdout.splitlines()
        assert entries == [f"10 100 {root}/exec/a/checkpoint-100", f"10 200 {root}/exec/a/checkpoint-200"]
