"""Tiered checkpoints end to end (docs/spec/tiered.md): real files, real processes, moto's server and
Ceph RGW for S3.

A fast POSIX root is replicated to a durable root (POSIX or S3) with ``ckpt replicate``; ``ckpt resume
--durable`` restores from it after the fast root is deleted. Replicators are SIGKILLed at every file
boundary and rerun; durable files are corrupted; a zombie's older-epoch save is replicated too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import boto3
import pytest

import ckpt
from ckpt.adapters.s3 import BucketSettings, S3Store, make_s3_client
from ckpt.domain.manifest import (
    MANIFEST_NAME,
    RESTORING,
    RESTORING_NAME,
    Listed,
    decode_manifest,
    verify_listing,
)
from support.rgw import KMS_KEY_ID, STORAGE_CLASS
from support.s3 import FAKE_ENV, http_settings, new_bucket_name, raw_client, serve_moto

SRC = str(Path(ckpt.__file__).resolve().parents[1])
TESTS = str(Path(__file__).resolve().parent)
KEYS = {"AWS_ACCESS_KEY_ID": "tiered-test-key", "AWS_SECRET_ACCESS_KEY": "tiered-test-secret"}
FILES_PER_SAVE = 3


def run(
    *args: str, env: dict[str, str] | None = None, module: str = "ckpt"
) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    full.update(KEYS)
    full["PYTHONPATH"] = os.pathsep.join([SRC, TESTS])
    full.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
    )


def hf_save(root: Path, attempt: str, step: int, *, size: int = 3000, complete: bool = True) -> Path:
    """An hf save of three files (one in a sub-folder), its bytes fixed by the step."""
    save = root / "exec" / attempt / f"checkpoint-{step}"
    (save / "sub").mkdir(parents=True)
    (save / "model.safetensors").write_bytes(bytes((step + i) % 251 for i in range(size)))
    (save / "sub" / "shard.bin").write_bytes(f"shard of {step}".encode())
    if complete:
        (save / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return save


def publish(root: Path, epoch: int, step: int, save: Path) -> None:
    result = run("--root", str(root), "publish", "--epoch", str(epoch), "--step", str(step), str(save))
    assert result.returncode == 0, result.stderr


def entries(root: str, *extra: str) -> list[str]:
    result = run(*extra, "--root", root, "entries")
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def files_of(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST_NAME
    }


def resume(
    fast: Path, durable: str, attempt: str, epoch: int, *extra: str
) -> subprocess.CompletedProcess[str]:
    env = {"DISPATCH_ATTEMPT": attempt, "DISPATCH_EPOCH": str(epoch)}
    return run(*extra, "--root", str(fast), "resume", "--framework", "hf", "--durable", durable, env=env)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """A fast root with two published hf saves (epoch 5, steps 100 and 200) and an empty durable root."""
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    fast.mkdir()
    durable.mkdir()
    for step in (100, 200):
        publish(fast, 5, step, hf_save(fast, "a", step))
    return fast, durable


class TestReplicatePosix:
    def test_replicate_then_resume_from_a_deleted_fast_root(self, roots: tuple[Path, Path]) -> None:
        """Both saves reach the durable root whole, with a manifest that verifies, at the same epoch and
        step; with the fast root gone, resume restores the newest and publishes it locally."""
        fast, durable = roots
        result = run("--root", str(fast), "replicate", "--to", str(durable), "--once", "--framework", "hf")
        assert result.returncode == 0, result.stderr
        saves = [durable / "exec" / "a" / f"checkpoint-{s}" for s in (100, 200)]
        assert result.stdout.splitlines() == [str(s) for s in saves]
        assert entries(str(durable)) == [f"5 100 {saves[0]}", f"5 200 {saves[1]}"]
        for save in saves:
            original = fast / save.relative_to(durable)
            assert files_of(save) == files_of(original)
            manifest = decode_manifest((save / MANIFEST_NAME).read_bytes())
            listing = [Listed(p, len(b)) for p, b in files_of(original).items()]
            assert verify_listing(manifest, listing) is None
        expected = files_of(fast / "exec" / "a" / "checkpoint-200")
        shutil.rmtree(fast)
        result = resume(fast, str(durable), "b", 6, "--json")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        restored = fast / "exec" / "a" / "checkpoint-200"
        assert document["location"] == str(restored)
        assert document["restored"]["location"] == str(saves[1])
        assert files_of(restored) == expected
        assert (restored / MANIFEST_NAME).read_bytes() == (saves[1] / MANIFEST_NAME).read_bytes()
        assert entries(str(fast)) == [f"5 200 {restored}"]
        again = resume(fast, str(durable), "c", 7)
        assert (again.returncode, again.stdout) == (0, f"{restored}\n")  # the fast copy is newest now

    def test_a_second_pass_copies_nothing_and_publishes_nothing(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        result = run("--json", "--root", str(fast), "replicate", "--to", str(durable), "--once")
        document = json.loads(result.stdout)
        assert (document["published"], document["files_copied"], document["pending"]) == ([], 0, [])

    def test_a_newer_fast_save_wins_over_the_durable_one(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        newest = hf_save(fast, "a", 300)
        publish(fast, 5, 300, newest)
        result = resume(fast, str(durable), "b", 6, "--json")
        document = json.loads(result.stdout)
        assert (document["location"], document["restored"]) == (str(newest), None)

    def test_an_incomplete_save_is_passed_over_and_the_next_one_replicated(self, tmp_path: Path) -> None:
        fast, durable = tmp_path / "fast", tmp_path / "durable"
        durable.mkdir()
        publish(fast, 5, 100, hf_save(fast, "a", 100, complete=False))
        publish(fast, 5, 200, hf_save(fast, "a", 200))
        result = run(
            "--json", "--root", str(fast), "replicate", "--to", str(durable), "--once", "--framework", "hf"
        )
        document = json.loads(result.stdout)
        assert [e["step"] for e in document["published"]] == [200]
        assert [p["entry"]["step"] for p in document["passed"]] == [100]
        assert "passed over" in result.stderr

    @pytest.mark.parametrize("name", [b"notes\xff.txt", b"tab\there.txt"])
    def test_a_save_with_a_name_no_manifest_can_list_is_passed_over(
        self, tmp_path: Path, name: bytes
    ) -> None:
        """tiered.md §2.5a: a save holding a file named with a byte that is not UTF-8, or a control character,
        is passed over with the reason before anything of it is copied, and the next save is replicated."""
        fast, durable = tmp_path / "fast", tmp_path / "durable"
        durable.mkdir()
        odd = hf_save(fast, "a", 100)
        with open(os.path.join(os.fsencode(odd), name), "wb") as f:
            f.write(b"notes")
        publish(fast, 5, 100, odd)
        publish(fast, 5, 200, hf_save(fast, "a", 200))
        passed = []
        for _ in range(2):  # the second pass neither stops at it nor copies it: it is older than 200 (§2.1)
            result = run("--json", "--root", str(fast), "replicate", "--to", str(durable), "--once")
            assert result.returncode == 0, result.stderr
            document = json.loads(result.stdout)
            passed.append([(p["entry"]["step"], p["reason"].split(":")[0]) for p in document["passed"]])
        assert passed == [[(100, f"file {os.fsdecode(name)!r} cannot be listed in a manifest")], []]
        assert entries(str(durable)) == [f"5 200 {durable}/exec/a/checkpoint-200"]
        assert not (durable / "exec" / "a" / "checkpoint-100").exists()

    def test_a_folder_of_the_save_that_cannot_be_read_fails_the_entry(self) -> None:
        """tiered.md §2.2 step 1: a sub-folder the replicator may not list fails the entry (exit 1, nothing
        published), never a durable copy and manifest without it. Run as an unprivileged user when the tests
        run as root (root reads any folder)."""
        import tempfile

        top = Path(tempfile.mkdtemp(prefix="ckpt-unreadable-", dir="/tmp"))
        fast, durable = top / "fast", top / "durable"
        save = hf_save(fast, "a", 100)
        locked = save / "sub"
        try:
            publish(fast, 5, 100, save)
            durable.mkdir()
            for folder in (top, durable):
                folder.chmod(0o777)
            locked.chmod(0)
            # As root, a first pass over another pair of roots loads every module the command imports
            # lazily (the interpreter's own library may be readable by root alone); then it drops to nobody.
            warm_fast, warm_durable = top / "warm-fast", top / "warm-durable"
            publish(warm_fast, 1, 1, hf_save(warm_fast, "a", 1))
            warm_durable.mkdir()
            script = (
                "import json, os, sys\n"
                "from ckpt.cli import main\n"
                "warm, args = map(json.loads, sys.argv[1:])\n"
                "if os.getuid() == 0:\n"
                "    assert main(warm) == 0\n"
                "    os.setgid(65534)\n"
                "    os.setuid(65534)\n"
                "sys.exit(main(args))\n"
            )
            commands = [
                json.dumps(["--root", str(root), "replicate", "--to", str(to), "--once"])
                for root, to in ((warm_fast, warm_durable), (fast, durable))
            ]
            result = subprocess.run(
                [sys.executable, "-c", script, *commands],
                capture_output=True,
                text=True,
                env={
                    **{
                        k: v
                        for k, v in os.environ.items()
                        if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))
                    },
                    **KEYS,
                    "PYTHONPATH": os.pathsep.join([SRC, TESTS]),
                },
                timeout=120,
                check=False,
            )
            assert result.returncode == 1, result.stderr
            assert f"cannot list {str(locked)!r}: Permission denied" in result.stderr
            assert not (durable / "pub").exists() or not any((durable / "pub").iterdir())
            assert not (durable / "exec" / "a" / "checkpoint-100" / MANIFEST_NAME).exists()
        finally:
            locked.chmod(0o755)
            shutil.rmtree(top)

    def test_a_failed_copy_publishes_nothing_exits_1_and_reports_what_is_not_durable(
        self, roots: tuple[Path, Path]
    ) -> None:
        """A durable path blocked by a file fails the first entry: no entry is published (nor the second,
        which comes after it), --once exits 1, and both fast entries are reported not yet durable."""
        fast, durable = roots
        (durable / "exec").mkdir()
        (durable / "exec" / "a").write_bytes(b"in the way")
        result = run("--root", str(fast), "replicate", "--to", str(durable), "--once")
        assert result.returncode == 1
        assert f"replication failed: {durable}/exec/a/checkpoint-100: cannot write" in result.stderr
        lines = [line for line in result.stderr.splitlines() if "not yet durable" in line]
        assert lines == [f"ckpt: not yet durable: {fast}/exec/a/checkpoint-{s}" for s in (100, 200)]
        assert entries(str(durable)) == []
        (durable / "exec" / "a").unlink()
        again = run("--root", str(fast), "replicate", "--to", str(durable), "--once")
        assert again.returncode == 0, again.stderr
        assert len(entries(str(durable))) == 2

    def test_the_durable_root_may_not_be_inside_the_fast_root(self, roots: tuple[Path, Path]) -> None:
        fast, _ = roots
        (fast / "inner").mkdir()
        result = run("--root", str(fast), "replicate", "--to", str(fast / "inner"), "--once")
        assert result.returncode == 2
        assert "must not be the fast root" in result.stderr


class TestKilledReplicator:
    @pytest.mark.parametrize("boundary", range(1, 2 * FILES_PER_SAVE + 1))
    def test_killed_after_each_file_the_rerun_copies_only_what_is_missing(
        self, roots: tuple[Path, Path], boundary: int
    ) -> None:
        """SIGKILL right after the n-th file is stored: no entry for a save not whole; the rerun copies
        exactly the files still missing and publishes each entry once."""
        fast, durable = roots
        # One file at a time: the n-th file boundary is then exactly n files stored (the parallel copy has
        # its own test below).
        args = ("--root", str(fast), "replicate", "--to", str(durable), "--once", "--files", "1")
        env = {"TIERED_FAST_ROOT": str(fast)}
        killed = run("kill", str(boundary), *args, env=env, module="support.tiered_replicator")
        assert killed.returncode == -9, killed.stderr
        whole = boundary // FILES_PER_SAVE  # saves whose every file was stored before the kill
        published = entries(str(durable))
        assert len(published) <= whole
        result = run("--json", *args)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["files_copied"] == 2 * FILES_PER_SAVE - boundary
        assert document["files_present"] == boundary - FILES_PER_SAVE * len(published)
        assert len(document["published"]) == 2 - len(published)
        assert len(entries(str(durable))) == 2

    @pytest.mark.parametrize("boundary", range(1, 2 * FILES_PER_SAVE + 1))
    def test_with_files_copied_at_once_a_kill_at_any_file_leaves_no_torn_entry(
        self, roots: tuple[Path, Path], boundary: int
    ) -> None:
        """Three files in flight (--files 3), SIGKILL after the n-th stored: other copies may have been
        whole or half done. No entry names a save that is not whole and verified; the rerun copies what is
        missing (what was stored stays stored) and publishes each entry once."""
        fast, durable = roots
        args = ("--root", str(fast), "replicate", "--to", str(durable), "--once", "--files", "3")
        env = {"TIERED_FAST_ROOT": str(fast)}
        killed = run("kill", str(boundary), *args, env=env, module="support.tiered_replicator")
        assert killed.returncode == -9, killed.stderr
        for line in entries(str(durable)):
            save = Path(line.split(" ", 2)[2])
            manifest = decode_manifest((save / MANIFEST_NAME).read_bytes())
            assert verify_listing(manifest, [Listed(p, len(b)) for p, b in files_of(save).items()]) is None
            assert files_of(save) == files_of(fast / save.relative_to(durable))
        published_before = len(entries(str(durable)))
        result = run("--json", *args)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["files_present"] >= boundary - FILES_PER_SAVE * published_before
        assert document["files_copied"] + document["files_present"] == FILES_PER_SAVE * (2 - published_before)
        assert len(document["published"]) == 2 - published_before
        assert [line.split()[:2] for line in entries(str(durable))] == [["5", "100"], ["5", "200"]]

    def test_killed_after_the_manifest_the_rerun_publishes_once(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        args = ("--root", str(fast), "replicate", "--to", str(durable), "--once")
        killed = run(
            "kill-manifest",
            "1",
            *args,
            env={"TIERED_FAST_ROOT": str(fast)},
            module="support.tiered_replicator",
        )
        assert killed.returncode == -9
        assert entries(str(durable)) == []
        document = json.loads(run("--json", *args).stdout)
        assert (document["files_present"], document["files_copied"]) == (FILES_PER_SAVE, FILES_PER_SAVE)
        assert [e["step"] for e in document["published"]] == [100, 200]

    def test_sigterm_finishes_the_file_and_reports_what_is_not_durable(
        self, roots: tuple[Path, Path]
    ) -> None:
        fast, durable = roots
        args = ("--root", str(fast), "replicate", "--to", str(durable), "--interval", "60", "--files", "1")
        result = run(
            "term", "1", *args, env={"TIERED_FAST_ROOT": str(fast)}, module="support.tiered_replicator"
        )
        assert result.returncode == 0, result.stderr
        assert entries(str(durable)) == []
        assert (durable / "exec" / "a" / "checkpoint-100" / "model.safetensors").is_file()
        lines = [line for line in result.stderr.splitlines() if "not yet durable" in line]
        assert lines == [f"ckpt: not yet durable: {fast}/exec/a/checkpoint-{s}" for s in (100, 200)]


# What a restore installs in the fast save, in order: its mark (§6.3), each file, then the manifest.
RESTORE_INSTALLS = FILES_PER_SAVE + 2


class TestKilledRestore:
    @pytest.mark.parametrize("boundary", range(1, RESTORE_INSTALLS + 1))
    def test_killed_after_each_restored_file_the_rerun_restores_and_publishes(
        self, roots: tuple[Path, Path], boundary: int
    ) -> None:
        """SIGKILL after the n-th file installed in the fast root (the mark, each file, the manifest): no
        fast entry names the half-restored save; the next resume restores it whole and publishes it once."""
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        expected = files_of(fast / "exec" / "a" / "checkpoint-200")
        shutil.rmtree(fast)
        env = {"TIERED_FAST_ROOT": str(fast), "DISPATCH_ATTEMPT": "b", "DISPATCH_EPOCH": "6"}
        args = ("--root", str(fast), "resume", "--framework", "hf", "--durable", str(durable))
        killed = run("kill-restore", str(boundary), *args, env=env, module="support.tiered_replicator")
        assert killed.returncode == -9, killed.stderr
        assert killed.stdout == ""
        assert entries(str(fast)) == []
        result = resume(fast, str(durable), "c", 7)
        restored = fast / "exec" / "a" / "checkpoint-200"
        assert (result.returncode, result.stdout) == (0, f"{restored}\n"), result.stderr
        assert files_of(restored) == expected
        assert entries(str(fast)) == [f"5 200 {restored}"]


class TestUnfinishedRestore:
    """tiered.md §6.3, §8.3: a restore marks the fast save folder before its first file and unmarks it after
    the manifest, so a restore that failed or was killed leaves a folder no path calls a complete save:
    not catch-up, not a resume without the durable root, not ``resume_location``, not the replicator."""

    def test_a_restore_that_fails_verification_leaves_nothing_catch_up_publishes(
        self, roots: tuple[Path, Path]
    ) -> None:
        """The newest durable copy's model does not verify, after its other files did: the restore of the
        older one publishes exec/a on the fast root, so the next resume's catch-up judges the torn folder
        of the newer one; its mark keeps it from being published and resumed from."""
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        model = durable / "exec" / "a" / "checkpoint-200" / "model.safetensors"
        data = bytearray(model.read_bytes())
        data[1000] ^= 0xFF  # same size: only the restore's digest finds it
        model.write_bytes(bytes(data))
        shutil.rmtree(fast)
        older, torn = (fast / "exec" / "a" / f"checkpoint-{s}" for s in (100, 200))
        first = resume(fast, str(durable), "b", 6)
        assert (first.returncode, first.stdout) == (0, f"{older}\n"), first.stderr
        assert (torn / RESTORING_NAME).is_file()
        assert (torn / "trainer_state.json").is_file()  # the rule's marker alone would call it complete
        for attempt, epoch in (("c", 7), ("d", 8)):
            again = resume(fast, str(durable), attempt, epoch)
            assert (again.returncode, again.stdout) == (0, f"{older}\n"), again.stderr
        found = ckpt.resume_location("hf", settle=0, root=str(fast), epoch=9, attempt="e", environ={})
        assert found == str(older)
        assert entries(str(fast)) == [f"5 100 {older}"]

    @pytest.mark.parametrize("boundary", range(1, RESTORE_INSTALLS + 1))
    def test_killed_restore_of_a_lost_save_whose_entry_remains(
        self, roots: tuple[Path, Path], boundary: int
    ) -> None:
        """The fast entry of step 200 remains but its folder was lost; a restore into it is killed after each
        install. Every path that resumes from the fast root alone passes the folder over as being restored
        (the CLI, resume_location); the next resume with the durable root restores it whole."""
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        newest = fast / "exec" / "a" / "checkpoint-200"
        older = fast / "exec" / "a" / "checkpoint-100"
        expected = files_of(newest)
        shutil.rmtree(newest)
        env = {"TIERED_FAST_ROOT": str(fast), "DISPATCH_ATTEMPT": "b", "DISPATCH_EPOCH": "6"}
        args = ("--root", str(fast), "resume", "--framework", "hf", "--durable", str(durable))
        killed = run("kill-restore", str(boundary), *args, env=env, module="support.tiered_replicator")
        assert killed.returncode == -9, killed.stderr
        assert (newest / RESTORING_NAME).is_file()
        env = {"DISPATCH_ATTEMPT": "c", "DISPATCH_EPOCH": "7"}
        alone = run("--root", str(fast), "resume", "--framework", "hf", env=env)
        assert (alone.returncode, alone.stdout) == (0, f"{older}\n"), alone.stderr
        skipped = [line for line in alone.stderr.splitlines() if line.startswith(f"ckpt: skipped {newest}: ")]
        if boundary > FILES_PER_SAVE:  # every file is in: only the mark tells the folder from a save
            assert (newest / "trainer_state.json").is_file()
        if (newest / "trainer_state.json").is_file():
            assert skipped == [f"ckpt: skipped {newest}: {RESTORING}"], alone.stderr
        else:
            assert skipped == [f"ckpt: skipped {newest}: no trainer_state.json"], alone.stderr
        found = ckpt.resume_location("hf", settle=0, root=str(fast), epoch=8, attempt="d", environ={})
        assert found == str(older)
        result = resume(fast, str(durable), "e", 9)
        assert (result.returncode, result.stdout) == (0, f"{newest}\n"), result.stderr
        assert files_of(newest) == expected
        assert not (newest / RESTORING_NAME).exists()
        assert entries(str(fast)) == [f"5 100 {older}", f"5 200 {newest}"]

    def test_a_fast_save_holding_the_mark_is_not_replicated(self, tmp_path: Path) -> None:
        """With or without a rule, the replicator passes over a published fast save that holds the mark."""
        fast, durable = tmp_path / "fast", tmp_path / "durable"
        durable.mkdir()
        marked = hf_save(fast, "a", 100)
        (marked / RESTORING_NAME).write_bytes(b"")
        publish(fast, 5, 100, marked)
        publish(fast, 5, 200, hf_save(fast, "a", 200))
        for rule in ((), ("--framework", "hf")):
            result = run("--json", "--root", str(fast), "replicate", "--to", str(durable), "--once", *rule)
            assert result.returncode == 0, result.stderr
            document = json.loads(result.stdout)
            assert [(p["entry"]["step"], p["reason"]) for p in document["passed"]] == [(100, RESTORING)]
            shutil.rmtree(durable)
            durable.mkdir()
        assert not (durable / "exec").exists()

    def test_a_restore_never_writes_through_a_link_in_the_fast_save(self, roots: tuple[Path, Path]) -> None:
        """A folder of the fast save that is a link (here to a folder outside the fast root) stops the
        restore of that save: nothing is written through it, and the next older copy is used."""
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        shutil.rmtree(fast)
        outside = fast.parent / "outside"
        outside.mkdir()
        newest = fast / "exec" / "a" / "checkpoint-200"
        newest.mkdir(parents=True)
        (newest / "sub").symlink_to(outside)
        result = resume(fast, str(durable), "b", 6)
        older = fast / "exec" / "a" / "checkpoint-100"
        assert (result.returncode, result.stdout) == (0, f"{older}\n"), result.stderr
        link = newest / "sub"
        assert f"cannot write under {str(link)!r}: it is a symbolic link" in result.stderr
        assert list(outside.iterdir()) == []
        assert entries(str(fast)) == [f"5 100 {older}"]


class TestParallelRestore:
    def test_the_files_of_a_save_are_fetched_at_once_and_published_after_all(self, tmp_path: Path) -> None:
        """tiered.md §6.3: a restore fetches the save's files at once (three fetches meet at a barrier that
        one-at-a-time fetching would never pass), and the fast entry exists only once all are installed."""
        import threading

        from ckpt.adapters.posix import PosixStore
        from ckpt.adapters.posix.tiered import PosixTierFiles
        from ckpt.application.replication import replicate, restore_newer
        from ckpt.application.rulebook import find_rule
        from ckpt.store import open_tiers

        fast, durable = tmp_path / "fast", tmp_path / "durable"
        save = hf_save(fast, "a", 100)
        publish(fast, 5, 100, save)
        durable.mkdir()
        tiers = open_tiers(PosixStore(str(fast)), PosixStore(str(durable)))
        assert replicate(tiers.fast, tiers.fast_files, tiers.durable, tiers.durable_files).failure is None
        expected = files_of(save)
        shutil.rmtree(fast)
        fast.mkdir()
        meeting = threading.Barrier(FILES_PER_SAVE, timeout=30)
        published_during: list[list[str]] = []

        class MeetingFiles(PosixTierFiles):
            __slots__ = ()

            def fetch(self, save: str, path: str, local_path: str) -> None:
                meeting.wait()  # BrokenBarrierError, not a CkptError, if the fetches came one at a time
                published_during.append(entries(str(fast)))
                super().fetch(save, path, local_path)

        outcome = restore_newer(
            PosixStore(str(fast)),
            tiers.fast_files.__class__(str(fast)),
            tiers.durable,
            MeetingFiles(str(durable)),
            find_rule("hf"),
            than=None,
        )
        assert (outcome.entry, outcome.skipped) == (tiers.durable.entries()[0], ())
        assert files_of(save) == expected
        assert published_during == [[]] * FILES_PER_SAVE
        assert entries(str(fast)) == [f"5 100 {save}"]

    def test_a_restore_first_removes_the_temporary_files_a_killed_one_left(self, tmp_path: Path) -> None:
        """tiered.md §4.3, §6.3: a restore killed with files in flight leaves temporary files (its own name,
        and boto3's download name on the way to it); the next restore removes them, and nothing else."""
        from ckpt.adapters.posix.tiered import PosixTierFiles

        fast, durable = tmp_path / "fast", tmp_path / "durable"
        save = hf_save(fast, "a", 100)
        publish(fast, 5, 100, save)
        durable.mkdir()
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        expected = files_of(save)
        shutil.rmtree(fast)
        left = [
            save / ".model.safetensors.ckpt-tmp-0123456789abcdef",
            save / "sub" / ".shard.bin.ckpt-tmp-fedcba9876543210.a1B2c3D4",
        ]
        kept = save / ".model.safetensors.ckpt-tmp-not-ours"
        (save / "sub").mkdir(parents=True)
        for path in [*left, kept]:
            path.write_bytes(b"partial")
        listed = PosixTierFiles(str(fast)).listing("exec/a/checkpoint-100") or []
        assert [item.path for item in listed] == [kept.name]  # the temporary files are no part of the save
        result = resume(fast, str(durable), "b", 6)
        assert (result.returncode, result.stdout) == (0, f"{save}\n"), result.stderr
        assert files_of(save) == {**expected, kept.name: b"partial"}


class TestConcurrentReplicators:
    def test_two_replicators_at_once_publish_each_entry_once(self, roots: tuple[Path, Path]) -> None:
        """Two replicator processes race over the same roots: both succeed, every entry is published once,
        and together they published each exactly once."""
        fast, durable = roots
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
        env["PYTHONPATH"] = os.pathsep.join([SRC, TESTS])
        command = [
            sys.executable,
            "-m",
            "ckpt",
            "--json",
            "--root",
            str(fast),
            "replicate",
            "--to",
            str(durable),
        ]
        both = [
            subprocess.Popen([*command, "--once"], stdout=subprocess.PIPE, env=env, text=True)
            for _ in range(2)
        ]
        outputs = [p.communicate(timeout=120)[0] for p in both]
        assert [p.returncode for p in both] == [0, 0]
        published = sorted(e["step"] for out in outputs for e in json.loads(out)["published"])
        assert published == [100, 200]
        assert entries(str(durable)) == [f"5 {s} {durable}/exec/a/checkpoint-{s}" for s in (100, 200)]


class TestCorruption:
    @pytest.mark.parametrize("how", ["flipped-byte", "truncated", "manifest-missing", "manifest-nested"])
    def test_a_corrupt_durable_copy_is_skipped_and_the_older_one_restored(
        self, roots: tuple[Path, Path], how: str
    ) -> None:
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        newest = durable / "exec" / "a" / "checkpoint-200"
        model = newest / "model.safetensors"
        data = bytearray(model.read_bytes())
        if how == "flipped-byte":
            data[1000] ^= 0xFF
            model.write_bytes(bytes(data))
        elif how == "truncated":
            model.write_bytes(bytes(data[:-1]))
        elif how == "manifest-nested":
            (newest / MANIFEST_NAME).write_bytes(b"[" * 100_000 + b"]" * 100_000)
        else:
            (newest / MANIFEST_NAME).unlink()
        expected = files_of(fast / "exec" / "a" / "checkpoint-100")
        shutil.rmtree(fast)
        result = resume(fast, str(durable), "b", 6)
        older = fast / "exec" / "a" / "checkpoint-100"
        assert (result.returncode, result.stdout) == (0, f"{older}\n"), result.stderr
        skipped = [line for line in result.stderr.splitlines() if line.startswith(f"ckpt: skipped {newest}:")]
        reason = {
            "flipped-byte": "sha256",
            "truncated": "bytes, the manifest says",
            "manifest-missing": "no manifest",
            "manifest-nested": "nests too deeply",
        }
        assert len(skipped) == 1, result.stderr
        assert reason[how] in skipped[0]
        assert files_of(older) == expected
        assert entries(str(fast)) == [f"5 100 {older}"]
        left = fast / "exec" / "a" / "checkpoint-200"
        assert not left.exists() or not any(p.name.startswith(".model") for p in left.iterdir())


class TestZombieEpoch:
    def test_a_zombie_save_keeps_its_older_epoch_on_the_durable_root(self, tmp_path: Path) -> None:
        """The zombie's step 900 at epoch 1 is published after the new execution's step 50 at epoch 2; on
        the durable root it keeps epoch 1, so the resume restores step 50."""
        fast, durable = tmp_path / "fast", tmp_path / "durable"
        durable.mkdir()
        live = hf_save(fast, "b", 50)
        publish(fast, 2, 50, live)
        publish(fast, 1, 900, hf_save(fast, "a", 900))
        result = run("--root", str(fast), "replicate", "--to", str(durable), "--once")
        assert result.returncode == 0, result.stderr
        assert entries(str(durable)) == [
            f"1 900 {durable}/exec/a/checkpoint-900",
            f"2 50 {durable}/exec/b/checkpoint-50",
        ]
        shutil.rmtree(fast)
        result = resume(fast, str(durable), "c", 3)
        assert (result.returncode, result.stdout) == (0, f"{live}\n"), result.stderr

    def test_a_zombie_save_published_after_a_newer_one_was_replicated_is_not_copied(
        self, tmp_path: Path
    ) -> None:
        fast, durable = tmp_path / "fast", tmp_path / "durable"
        durable.mkdir()
        publish(fast, 2, 50, hf_save(fast, "b", 50))
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        publish(fast, 1, 900, hf_save(fast, "a", 900))  # the zombie, late
        result = run("--json", "--root", str(fast), "replicate", "--to", str(durable), "--once")
        assert json.loads(result.stdout)["published"] == []
        assert entries(str(durable)) == [f"2 50 {durable}/exec/b/checkpoint-50"]


class TestDurablePrune:
    def test_entries_a_durable_prune_removed_are_not_copied_again(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        assert run("--root", str(durable), "prune", "--keep", "1").returncode == 0
        assert len(entries(str(durable))) == 1
        document = json.loads(
            run("--json", "--root", str(fast), "replicate", "--to", str(durable), "--once").stdout
        )
        assert (document["published"], document["files_copied"], document["pending"]) == ([], 0, [])
        assert entries(str(durable)) == [f"5 200 {durable}/exec/a/checkpoint-200"]
        assert not (durable / "exec" / "a" / "checkpoint-100").exists()

    def test_a_killed_copys_temporary_file_stays_out_of_the_save_until_its_prune(
        self, roots: tuple[Path, Path]
    ) -> None:
        """tiered.md §4.2: the temporary file a replicator killed mid-copy left on a POSIX durable root is no
        part of the save (not listed, not in the manifest, not replaced: the next copy takes a new name), and
        goes with its save when a durable prune removes it."""
        fast, durable = roots
        left = {}
        for step in (100, 200):
            save = durable / "exec" / "a" / f"checkpoint-{step}"
            save.mkdir(parents=True)
            left[step] = save / ".model.safetensors.ckpt-tmp-0123456789abcdef"
            left[step].write_bytes(b"the first bytes of a killed copy")
        result = run("--root", str(fast), "replicate", "--to", str(durable), "--once", "--framework", "hf")
        assert result.returncode == 0, result.stderr
        for step in (100, 200):
            save = durable / "exec" / "a" / f"checkpoint-{step}"
            manifest = json.loads((save / MANIFEST_NAME).read_text())
            copied = files_of(fast / "exec" / "a" / f"checkpoint-{step}")
            assert sorted(f["path"] for f in manifest["files"]) == sorted(copied)
            assert files_of(save) == {**copied, left[step].name: b"the first bytes of a killed copy"}
        verified = resolve_verify(str(durable), "--verify", "--digests")
        newest = durable / "exec" / "a" / "checkpoint-200"
        assert (verified.returncode, verified.stdout) == (0, f"{newest}\n"), verified.stderr
        assert run("--root", str(durable), "prune", "--keep", "1").returncode == 0
        assert not left[100].parent.exists()
        assert left[200].exists()


class TestFastPrune:
    @pytest.fixture
    def pending(self, roots: tuple[Path, Path]) -> tuple[Path, Path]:
        """Steps 100 and 200 replicated, 300 and 400 published on the fast root only."""
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        for step in (300, 400):
            publish(fast, 5, step, hf_save(fast, "a", step))
        return fast, durable

    def steps(self, fast: Path) -> list[str]:
        return [line.split()[1] for line in entries(str(fast))]

    def test_a_fast_prune_keeps_what_is_not_yet_durable(self, pending: tuple[Path, Path]) -> None:
        fast, durable = pending
        result = run("--root", str(fast), "prune", "--keep", "1", "--durable", str(durable))
        assert result.returncode == 0, result.stderr
        assert self.steps(fast) == ["300", "400"]
        assert not (fast / "exec" / "a" / "checkpoint-200").exists()
        assert (fast / "exec" / "a" / "checkpoint-300").is_dir()
        assert "(pinned)" not in "".join(entries(str(fast)))  # the prune's own pins are gone
        assert result.stderr.count("kept, not yet durable") == 2

    def test_dry_run_changes_nothing_and_says_the_same(self, pending: tuple[Path, Path]) -> None:
        fast, durable = pending
        result = run("--root", str(fast), "prune", "--keep", "1", "--durable", str(durable), "--dry-run")
        assert result.returncode == 0, result.stderr
        removed = [line for line in result.stdout.splitlines() if line.startswith("would remove entry")]
        assert [line.split()[6] for line in removed] == ["100", "200"]
        assert self.steps(fast) == ["100", "200", "300", "400"]

    @pytest.mark.parametrize("how", ["force", "no-durable"])
    def test_force_or_no_durable_prunes_as_usual(self, pending: tuple[Path, Path], how: str) -> None:
        fast, durable = pending
        extra = ("--durable", str(durable), "--force") if how == "force" else ()
        assert run("--root", str(fast), "prune", "--keep", "1", *extra).returncode == 0
        assert self.steps(fast) == ["400"]

    def test_force_alone_is_a_usage_error(self, pending: tuple[Path, Path]) -> None:
        fast, _ = pending
        assert run("--root", str(fast), "prune", "--keep", "1", "--force").returncode == 2


# -- S3 -------------------------------------------------------------------------------------------------


def s3_config(path: Path, endpoint: str) -> str:
    path.write_text(
        f'[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\naddressing_style = "path"\n'
        'connect_timeout = 2\nread_timeout = 10\nmax_attempts = 2\n[[credentials]]\nsource = "env"\n'
    )
    return str(path)


@pytest.fixture
def s3(
    s3_server: str, s3_server_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Any, str, str]:
    """A fresh bucket on each S3 server (moto's, Ceph RGW): the client, the durable root URL and a config
    file for it."""
    if s3_server_kind == "rgw":
        request.getfixturevalue("rgw_server").add_key(*KEYS.values())
    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="y",
    )
    bucket = new_bucket_name()
    client.create_bucket(Bucket=bucket)
    return client, f"s3://{bucket}/tiers", s3_config(tmp_path / "ckpt.toml", s3_server)


class TestKilledRestoreS3:
    """On moto's server and on Ceph RGW (``s3``): TestKilledRestore's restore, from an S3 durable root."""

    # The restore's first install is its mark (§6.3): the n-th file is install n + 1.
    @pytest.mark.parametrize("boundary", range(2, FILES_PER_SAVE + 2))
    def test_killed_after_each_restored_file_the_rerun_restores_it_whole(
        self, tmp_path: Path, s3: tuple[Any, str, str], boundary: int
    ) -> None:
        """SIGKILL after the n-th file installed, the others in flight (a 9 MiB file is still downloading
        in parts when the small ones are done, boto3 writing it under a name of its own): no fast entry;
        the next resume restores the save whole, with no temporary file of either kind left in it
        (tiered.md §4.3, §6.3)."""
        _, root, config = s3
        fast = tmp_path / "fast"
        save = hf_save(fast, "a", 100, size=9 << 20)
        publish(fast, 5, 100, save)
        replicated = run("--config", config, "--root", str(fast), "replicate", "--to", root, "--once")
        assert replicated.returncode == 0, replicated.stderr
        expected = files_of(save)
        shutil.rmtree(fast)
        env = {"TIERED_FAST_ROOT": str(fast), "DISPATCH_ATTEMPT": "b", "DISPATCH_EPOCH": "6"}
        args = ("--config", config, "--root", str(fast), "resume", "--framework", "hf", "--durable", root)
        killed = run("kill-restore", str(boundary), *args, env=env, module="support.tiered_replicator")
        assert killed.returncode == -9, killed.stderr
        assert killed.stdout == ""
        assert entries(str(fast)) == []
        result = resume(fast, root, "c", 7, "--config", config)
        assert (result.returncode, result.stdout) == (0, f"{save}\n"), result.stderr
        assert files_of(save) == expected
        assert entries(str(fast)) == [f"5 100 {save}"]


def entry_key(client: Any, root: str) -> str:
    """The key, relative to the root, of the only entry in the root's ``pub/``."""
    bucket, prefix = root.split("/")[2], "tiers/pub/"
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    assert len(keys) == 1, keys
    return keys[0][len("tiers/") :]


class TestReplicateS3:
    """On moto's server and on Ceph RGW (``s3_server``)."""

    def test_multipart_upload_with_checksums_then_restore(
        self, tmp_path: Path, s3: tuple[Any, str, str], s3_server_kind: str
    ) -> None:
        """A 17 MiB file goes up in parts with a CRC32 the server checked and the SHA-256 as metadata; the
        fast root deleted, resume restores it byte for byte and publishes it locally. Ceph RGW 16.2 takes
        the upload but reports no additional checksum (tiered.md §4.1)."""
        client, root, config = s3
        fast = tmp_path / "fast"
        save = hf_save(fast, "a", 100, size=17 << 20)
        publish(fast, 5, 100, save)
        result = run("--config", config, "--root", str(fast), "replicate", "--to", root, "--once")
        assert result.returncode == 0, result.stderr
        assert entries(root, "--config", config) == [f"5 100 {root}/exec/a/checkpoint-100"]
        bucket = root.split("/")[2]
        head = client.head_object(
            Bucket=bucket, Key="tiers/exec/a/checkpoint-100/model.safetensors", ChecksumMode="ENABLED"
        )
        assert head["ContentLength"] == 17 << 20
        assert ("ChecksumCRC32" in head) is (s3_server_kind == "moto")
        assert head["ETag"].strip('"').endswith("-3")  # three 8 MiB parts: the managed multipart transfer
        assert len(head["Metadata"]["ckpt-sha256"]) == 64
        expected = files_of(save)
        shutil.rmtree(fast)
        result = resume(fast, root, "b", 6, "--config", config)
        assert (result.returncode, result.stdout) == (0, f"{save}\n"), result.stderr
        assert files_of(save) == expected

    def test_a_pass_lists_the_save_once_and_verifies_each_upload_by_its_answer(
        self, tmp_path: Path, s3: tuple[Any, str, str], s3_server_kind: str
    ) -> None:
        """A save the durable root lacks costs no request per file besides its upload (tiered.md §4.1,
        §5.2): one listing of the durable save instead of a head per file, and each upload verified by the
        ETag its own answer carries (a single PUT, and a multipart one's completion) instead of a head.
        Ceph RGW 16.2 completes a multipart upload with an empty ETag: that one file is verified by a head.
        A rerun heads only the files the listing shows with the fast file's size, and copies none."""
        from ckpt.adapters.posix import PosixStore
        from ckpt.application.replication import replicate
        from ckpt.store import open_tiers

        client, root, _ = s3
        sent: list[str] = []
        client.meta.events.register_first(
            "before-send.s3", lambda event_name, **_: sent.append(event_name.rsplit(".", 1)[-1])
        )
        fast = tmp_path / "fast"
        save = hf_save(fast, "a", 100, size=9 << 20)  # two 8 MiB parts: a multipart upload
        publish(fast, 5, 100, save)
        tiers = open_tiers(PosixStore(str(fast)), S3Store(root, client))
        first = replicate(tiers.fast, tiers.fast_files, tiers.durable, tiers.durable_files)
        assert (first.failure, len(first.published), first.files_copied) == (None, 1, 3)
        assert sent.count("HeadObject") == (1 if s3_server_kind == "rgw" else 0), sent
        assert sent.count("ListObjectsV2") == 3  # the durable log, the durable save, the publish's check
        assert sent.count("PutObject") == 2 + 2  # two small files, the manifest, the entry
        assert (sent.count("CreateMultipartUpload"), sent.count("CompleteMultipartUpload")) == (1, 1)
        sent.clear()
        client.delete_object(Bucket=root.split("/")[2], Key="tiers/" + entry_key(client, root))
        again = replicate(tiers.fast, tiers.fast_files, tiers.durable, tiers.durable_files)
        assert (again.failure, len(again.published), again.files_copied, again.files_present) == (
            None,
            1,
            0,
            3,
        )
        assert sent.count("HeadObject") == 3  # one per file the listing shows with the same size

    @pytest.mark.parametrize("boundary", [1, 2])
    def test_killed_replicator_reuploads_only_what_is_missing(
        self, tmp_path: Path, s3: tuple[Any, str, str], boundary: int
    ) -> None:
        _, root, config = s3
        fast = tmp_path / "fast"
        publish(fast, 5, 100, hf_save(fast, "a", 100))
        # One file at a time: the n-th file boundary is then exactly n files stored.
        args = ("--config", config, "--root", str(fast), "replicate", "--to", root, "--once", "--files", "1")
        killed = run(
            "kill",
            str(boundary),
            *args,
            env={"TIERED_FAST_ROOT": str(fast)},
            module="support.tiered_replicator",
        )
        assert killed.returncode == -9, killed.stderr
        assert entries(root, "--config", config) == []
        document = json.loads(run("--json", *args).stdout)
        assert (document["files_present"], document["files_copied"]) == (boundary, FILES_PER_SAVE - boundary)
        assert len(document["published"]) == 1
        assert len(entries(root, "--config", config)) == 1

    def test_an_overwritten_object_fails_verification_and_the_older_save_is_restored(
        self, tmp_path: Path, s3: tuple[Any, str, str]
    ) -> None:
        client, root, config = s3
        fast = tmp_path / "fast"
        for step in (100, 200):
            publish(fast, 5, step, hf_save(fast, "a", step))
        assert (
            run("--config", config, "--root", str(fast), "replicate", "--to", root, "--once").returncode == 0
        )
        bucket = root.split("/")[2]
        key = "tiers/exec/a/checkpoint-200/model.safetensors"
        good = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        client.put_object(Bucket=bucket, Key=key, Body=bytes(b ^ 1 for b in good))  # same size, other bytes
        shutil.rmtree(fast)
        result = resume(fast, root, "b", 6, "--config", config)
        older = fast / "exec" / "a" / "checkpoint-100"
        assert (result.returncode, result.stdout) == (0, f"{older}\n"), result.stderr
        assert f"skipped {root}/exec/a/checkpoint-200: file 'model.safetensors' has sha256" in result.stderr


# -- S3 bucket settings (layout.md §9.1) ---------------------------------------------------------------------

KMS_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
OWNER = "123456789012"  # moto's account: it owns every bucket moto creates
SECURE = {"sse": "aws:kms", "sse_kms_key_id": KMS_ARN, "storage_class": "STANDARD_IA"}
_SSE_HEADERS = {
    "x-amz-server-side-encryption": "aws:kms",
    "x-amz-server-side-encryption-aws-kms-key-id": KMS_ARN,
    "x-amz-storage-class": "STANDARD_IA",
}
_CREATES = {"PutObject", "CreateMultipartUpload"}  # the requests that create an object


def secure_config(path: Path, endpoint: str, **settings: str) -> str:
    """``s3_config`` with the bucket settings ``settings`` added to its ``[s3]`` table."""
    s3_config(path, endpoint)
    lines = path.read_text().split("\n")
    lines[1:1] = [f'{key} = "{value}"' for key, value in settings.items()]
    path.write_text("\n".join(lines))
    return str(path)


def heads_under(client: Any, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
    """The ``HeadObject`` answer of every object under ``prefix``, by key relative to it."""
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    return {o["Key"][len(prefix) :]: client.head_object(Bucket=bucket, Key=o["Key"]) for o in listed}


DENY_UNENCRYPTED = {  # AWS's documented "refuse a PutObject without server-side encryption"
    "Version": "2012-10-17",
    "Statement": [
        {
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:PutObject",
            "Resource": "arn:aws:s3:::{bucket}/*",
            "Condition": {"Null": {"s3:x-amz-server-side-encryption": "true"}},
        }
    ],
}


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's server judging a bucket policy on the request's encryption header
    (``support.secure_moto_server``)."""
    log = tmp_path_factory.mktemp("secure-moto") / "server.log"
    with serve_moto(log, module="support.secure_moto_server", cwd=TESTS) as endpoint:
        yield endpoint


class TestS3BucketSettings:
    def test_every_request_on_the_durable_root_carries_the_settings(
        self, moto_server: str, tmp_path: Path
    ) -> None:
        """Through the ``DurableFiles`` port: a multipart upload, a single-part one and the manifest are
        created with aws:kms, the key and STANDARD_IA (HeadObject by another client shows them); only the
        requests that create an object carry those, and every request, parts, heads, listing and
        downloads included, carries the expected owner (headers recorded on the wire)."""
        looker = raw_client(moto_server)
        bucket = new_bucket_name()
        looker.create_bucket(Bucket=bucket)
        config = http_settings(moto_server, expected_bucket_owner=OWNER, **SECURE)
        client = make_s3_client(config, environ=FAKE_ENV)
        sent: list[tuple[str, dict[str, str]]] = []

        def record(request: Any, event_name: str, **_: Any) -> None:
            headers = {
                k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()
            }
            sent.append((event_name.rsplit(".", 1)[-1], headers))

        client.meta.events.register_first("before-send.s3", record)
        store = S3Store(f"s3://{bucket}/tiers", client, settings=BucketSettings.from_s3_settings(config.s3))
        files = store.durable_files()
        save = "exec/a/checkpoint-100"
        big, small = tmp_path / "big", tmp_path / "small"
        big.write_bytes(bytes(i % 251 for i in range(9 << 20)))  # two 8 MiB parts: a multipart upload
        small.write_bytes(b"shard")
        for local, name in ((big, "model.safetensors"), (small, "sub/shard.bin")):
            data = local.read_bytes()
            files.put(str(local), save, name, hashlib.sha256(data).hexdigest(), len(data))
        files.write_small(save, MANIFEST_NAME, b"{}")
        assert files.read_small(save, MANIFEST_NAME) == b"{}"
        assert [item.path for item in files.listing(save) or []] == [
            MANIFEST_NAME,
            "model.safetensors",
            "sub/shard.bin",
        ]
        files.fetch(save, "model.safetensors", str(tmp_path / "back"))
        assert (tmp_path / "back").read_bytes() == big.read_bytes()

        heads = heads_under(looker, bucket, f"tiers/{save}/")
        assert sorted(heads) == [MANIFEST_NAME, "model.safetensors", "sub/shard.bin"]
        assert heads["model.safetensors"]["ETag"].strip('"').endswith("-2")
        for key, head in heads.items():
            got = (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId"), head.get("StorageClass"))
            assert got == ("aws:kms", KMS_ARN, "STANDARD_IA"), key
        operations = {operation for operation, _ in sent}
        assert {"CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "PutObject"} <= operations
        assert {"HeadObject", "GetObject", "ListObjectsV2"} <= operations
        for operation, headers in sent:
            assert headers.get("x-amz-expected-bucket-owner") == OWNER, operation
            for name, value in _SSE_HEADERS.items():
                assert (headers.get(name) == value) is (operation in _CREATES), (operation, name)

    def test_replicate_and_resume_carry_the_settings_of_the_configuration(
        self, s3_server: str, s3_server_kind: str, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        """``ckpt replicate`` with the ``[s3]`` settings of a secure bucket writes every file, the manifest
        and the entry encrypted with the KMS key in the class asked for (HeadObject shows them), and
        ``ckpt resume --durable`` restores from it. On Ceph RGW: its KMS test key and its class COLD
        (support.rgw; RGW ignores the expected owner, so it is not set there)."""
        if s3_server_kind == "rgw":
            request.getfixturevalue("rgw_server").add_key(*KEYS.values())
            settings = {"sse": "aws:kms", "sse_kms_key_id": KMS_KEY_ID, "storage_class": STORAGE_CLASS}
        else:
            settings = {**SECURE, "expected_bucket_owner": OWNER}
        looker = raw_client(s3_server)
        bucket = new_bucket_name()
        looker.create_bucket(Bucket=bucket)
        root = f"s3://{bucket}/tiers"
        config = secure_config(tmp_path / "ckpt.toml", s3_server, **settings)
        fast = tmp_path / "fast"
        save = hf_save(fast, "a", 100, size=9 << 20)  # model.safetensors goes up in two parts
        publish(fast, 5, 100, save)
        result = run("--config", config, "--root", str(fast), "replicate", "--to", root, "--once")
        assert result.returncode == 0, result.stderr

        heads = heads_under(looker, bucket, "tiers/")
        prefix = "exec/a/checkpoint-100/"
        written = {prefix + name for name in ("model.safetensors", "sub/shard.bin", "trainer_state.json")}
        assert written | {prefix + MANIFEST_NAME} <= set(heads)
        assert any(key.startswith("pub/") for key in heads), sorted(heads)
        assert heads[prefix + "model.safetensors"]["ETag"].strip('"').endswith("-2")
        wanted = (settings["sse"], settings["sse_kms_key_id"], settings["storage_class"])
        for key, head in heads.items():
            got = (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId"), head.get("StorageClass"))
            assert got == wanted, key

        expected = files_of(save)
        shutil.rmtree(fast)
        result = resume(fast, root, "b", 6, "--config", config)
        assert (result.returncode, result.stdout) == (0, f"{save}\n"), result.stderr
        assert files_of(save) == expected

    def test_a_bucket_that_requires_encryption_refuses_an_unencrypted_copy_naming_the_sse_key(
        self, secure_server: str, tmp_path: Path
    ) -> None:
        """Under the deny-unencrypted policy ``ckpt replicate`` without ``sse`` exits 1, its error naming
        ``[s3] sse`` (the upload's refusal carries the settings' hint, layout.md §9.2) and the entry not yet
        durable, no secret shown; with ``sse`` in the file the same replication succeeds."""
        looker = raw_client(secure_server)
        bucket = new_bucket_name()
        looker.create_bucket(Bucket=bucket)
        policy = json.dumps(DENY_UNENCRYPTED).replace("{bucket}", bucket)
        looker.put_bucket_policy(Bucket=bucket, Policy=policy)
        root = f"s3://{bucket}/tiers"
        fast = tmp_path / "fast"
        save = hf_save(fast, "a", 100)
        publish(fast, 5, 100, save)
        args = ("--root", str(fast), "replicate", "--to", root, "--once")
        refused = run("--config", s3_config(tmp_path / "plain.toml", secure_server), *args)
        assert refused.returncode == 1, refused.stderr
        assert "cannot upload s3://" in refused.stderr
        assert "the bucket may require server-side encryption: set [s3] sse" in refused.stderr
        assert f"ckpt: not yet durable: {save}" in refused.stderr
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in refused.stderr
        assert entries(root, "--config", str(tmp_path / "plain.toml")) == []
        config = secure_config(tmp_path / "sse.toml", secure_server, sse="AES256")
        replicated = run("--config", config, *args)
        assert replicated.returncode == 0, replicated.stderr
        assert entries(root, "--config", config) == [f"5 100 {root}/exec/a/checkpoint-100"]


def resolve_verify(root: str, *extra: str, config: str | None = None) -> subprocess.CompletedProcess[str]:
    options = ["--config", config] if config else []
    return run(*options, "--root", root, "resolve", "--framework", "hf", *extra)


class TestResolveVerify:
    """``ckpt resolve --framework X --verify [--digests]`` (tiered.md §10, cli.md §4.5)."""

    def test_sizes_always_digests_when_asked(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        newest, older = (durable / "exec" / "a" / f"checkpoint-{s}" for s in (200, 100))
        result = resolve_verify(str(durable), "--verify", "--digests")
        assert (result.returncode, result.stdout) == (0, f"{newest}\n"), result.stderr
        model = newest / "model.safetensors"
        data = bytearray(model.read_bytes())
        data[7] ^= 1  # one bit, same size
        model.write_bytes(bytes(data))
        sizes = resolve_verify(str(durable), "--verify")
        assert (sizes.returncode, sizes.stdout, sizes.stderr) == (0, f"{newest}\n", "")  # sizes agree
        digests = resolve_verify(str(durable), "--verify", "--digests", "--json")
        assert digests.returncode == 0, digests.stderr
        document = json.loads(digests.stdout)
        assert document["location"] == str(older)
        [skipped] = document["skipped"]
        assert skipped["entry"]["location"] == str(newest)
        assert skipped["reason"].startswith("file 'model.safetensors' has sha256 ")
        assert f"ckpt: skipped {newest}: file 'model.safetensors' has sha256" in digests.stderr
        model.write_bytes(bytes(data[:-1]))  # now one byte short: sizes alone see it
        cut = resolve_verify(str(durable), "--verify")
        assert (cut.returncode, cut.stdout) == (0, f"{older}\n")
        assert "has 2999 bytes, the manifest says 3000" in cut.stderr

    def test_a_save_without_a_manifest_does_not_verify(self, roots: tuple[Path, Path]) -> None:
        fast, _ = roots  # published on the fast root: no manifest there
        plain = resolve_verify(str(fast))
        assert plain.returncode == 0
        result = resolve_verify(str(fast), "--verify")
        assert (result.returncode, result.stdout) == (3, "")
        assert result.stderr.count(f"no manifest ({MANIFEST_NAME})") == 2

    @pytest.mark.parametrize(
        ("extra", "message"),
        [
            (["--verify"], "--verify applies to a verified resolve"),
            (["--digests"], "--digests applies to --verify"),
        ],
    )
    def test_misused_options_are_usage_errors(self, tmp_path: Path, extra: list[str], message: str) -> None:
        result = run("--root", str(tmp_path), "resolve", *extra)
        assert result.returncode == 2
        assert message in result.stderr

    def test_on_s3_a_changed_object_fails_the_digests(self, tmp_path: Path, s3: tuple[Any, str, str]) -> None:
        client, root, config = s3
        fast = tmp_path / "fast"
        save = hf_save(fast, "a", 100)
        publish(fast, 5, 100, save)
        result = run("--config", config, "--root", str(fast), "replicate", "--to", root, "--once")
        assert result.returncode == 0, result.stderr
        location = f"{root}/exec/a/checkpoint-100"
        ok = resolve_verify(root, "--verify", "--digests", config=config)
        assert (ok.returncode, ok.stdout) == (0, f"{location}\n"), ok.stderr
        bucket = root.split("/")[2]
        key = "tiers/exec/a/checkpoint-100/sub/shard.bin"
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
        client.put_object(Bucket=bucket, Key=key, Body=body.upper())  # same size, other bytes
        assert resolve_verify(root, "--verify", config=config).stdout == f"{location}\n"
        changed = resolve_verify(root, "--verify", "--digests", config=config)
        assert (changed.returncode, changed.stdout) == (3, "")
        assert f"ckpt: skipped {location}: file 'sub/shard.bin' has sha256 " in changed.stderr


class TestDoctorBothRoots:
    """``ckpt doctor --durable DURABLE`` (tiered.md §11, cli.md §9.2)."""

    def test_both_roots_checked_and_the_lag_reported(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots

        def doctor() -> dict[str, Any]:
            result = run("--json", "--root", str(fast), "doctor", "--durable", str(durable))
            assert result.returncode == 0, result.stdout + result.stderr
            return {c["name"]: c for c in json.loads(result.stdout)["checks"]}

        before = doctor()
        names = ["root", "exclusive-create", "durable root", "durable exclusive-create", "tiers"]
        assert list(before) == names
        assert all(c["ok"] for c in before.values())
        assert (before["tiers"]["pending"], before["tiers"]["lag_steps"]) == (2, 200)
        assert run("--root", str(fast), "replicate", "--to", str(durable), "--once").returncode == 0
        publish(fast, 5, 300, hf_save(fast, "a", 300))
        after = doctor()["tiers"]
        assert (after["pending"], after["lag_steps"]) == (1, 100)
        detail = "1 entries not yet durable, 100 steps behind; newest durable: epoch 5 step 200"
        assert after["detail"] == detail

    def test_a_pair_that_is_not_allowed_fails(self, roots: tuple[Path, Path]) -> None:
        fast, _ = roots
        inside = fast / "durable"
        inside.mkdir()
        result = run("--root", str(fast), "doctor", "--durable", str(inside))
        assert result.returncode == 1
        assert "FAIL tiers:" in result.stdout
        assert "must not be the fast root" in result.stdout

    @pytest.mark.parametrize("s3_server", ["moto"], indirect=True)
    def test_an_s3_durable_root_gets_the_s3_checks(self, tmp_path: Path, s3: tuple[Any, str, str]) -> None:
        _, root, config = s3
        fast = tmp_path / "fast"
        fast.mkdir()
        result = run("--config", config, "--root", str(fast), "doctor", "--durable", root)
        assert result.returncode == 0, result.stdout + result.stderr
        names = [line.split(":", 1)[0][5:] for line in result.stdout.splitlines()]
        assert names == [
            "root",
            "exclusive-create",
            "durable root",
            "durable credentials",
            "durable proxy",
            "durable exclusive-create",
            "durable write-settings",
            "durable multipart-cleanup",
            "tiers",
        ]
        assert "\nwarn durable multipart-cleanup: no enabled lifecycle rule" in result.stdout

    def test_the_durable_buckets_lifecycle_and_incomplete_uploads_are_reported(
        self, tmp_path: Path, s3: tuple[Any, str, str]
    ) -> None:
        """Without a lifecycle rule that aborts incomplete uploads under the root, a warning (exit 0) that
        counts them; a rule elsewhere changes nothing; one that covers the root makes the check pass."""
        client, root, config = s3
        bucket = root.split("/")[2]
        fast = tmp_path / "fast"
        fast.mkdir()

        def cleanup() -> dict[str, Any]:
            result = run("--json", "--config", config, "--root", str(fast), "doctor", "--durable", root)
            assert result.returncode == 0, result.stdout + result.stderr
            return {c["name"]: c for c in json.loads(result.stdout)["checks"]}["durable multipart-cleanup"]

        first = cleanup()
        assert (first["ok"], first.get("warning"), first["incomplete_uploads"]) == (True, True, 0)
        assert first["detail"].startswith("no enabled lifecycle rule of the bucket aborts incomplete")
        # What a replicator killed mid-upload leaves: an upload begun and never completed.
        client.create_multipart_upload(Bucket=bucket, Key="tiers/exec/a/checkpoint-100/model.safetensors")
        client.create_multipart_upload(Bucket=bucket, Key="elsewhere/x")  # not under the root
        documented = documented_lifecycle()  # docs/tiered.md's rule, as the page gives it
        rule = {key: value for key, value in documented["Rules"][0].items() if key not in ("ID", "Filter")}
        client.put_bucket_lifecycle_configuration(
            Bucket=bucket,
            LifecycleConfiguration={"Rules": [{**rule, "ID": "other", "Filter": {"Prefix": "elsewhere/"}}]},
        )
        second = cleanup()
        assert (second.get("warning"), second["incomplete_uploads"]) == (True, 1)
        assert second["detail"].endswith(f"1 incomplete under {root}/ now")
        client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration=documented)
        third = cleanup()
        assert "warning" not in third
        assert third["ok"] is True
        assert third["detail"] == (
            "lifecycle rule 'abort-incomplete-uploads' aborts incomplete multipart uploads after 2 days; "
            f"1 incomplete under {root}/ now"
        )
        one_day = {**documented["Rules"][0], "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1}}
        client.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={"Rules": [one_day]})
        assert "aborts incomplete multipart uploads after 1 day; 1 incomplete" in cleanup()["detail"]

    @pytest.mark.parametrize("s3_server", ["rgw"], indirect=True)
    def test_a_lifecycle_the_credentials_may_not_read_is_a_warning_not_a_failure(
        self, tmp_path: Path, s3: tuple[Any, str, str]
    ) -> None:
        """A bucket policy that refuses reading the lifecycle and listing the uploads (a replicator's narrow
        role): the check warns that both are unknown, and doctor still exits 0."""
        client, root, config = s3
        bucket = root.split("/")[2]
        refused = ["s3:GetLifecycleConfiguration", "s3:ListBucketMultipartUploads"]
        statement = {
            "Effect": "Deny",
            "Principal": "*",
            "Action": refused,
            "Resource": f"arn:aws:s3:::{bucket}",
        }
        policy = {"Version": "2012-10-17", "Statement": [statement]}
        client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
        fast = tmp_path / "fast"
        fast.mkdir()
        result = run("--json", "--config", config, "--root", str(fast), "doctor", "--durable", root)
        assert result.returncode == 0, result.stdout + result.stderr
        check = {c["name"]: c for c in json.loads(result.stdout)["checks"]}["durable multipart-cleanup"]
        assert (check["ok"], check["warning"], "incomplete_uploads" in check) == (True, True, False)
        assert check["detail"] == (
            "the bucket's lifecycle rules could not be read (access denied), so whether one aborts the "
            "incomplete multipart uploads a killed replicator leaves is unknown; its incomplete multipart "
            "uploads could not be listed (access denied)"
        )


def documented_lifecycle() -> dict[str, Any]:
    """The lifecycle configuration docs/tiered.md tells a site to put on its durable bucket."""
    page = (Path(__file__).parent.parent / "docs" / "tiered.md").read_text()
    found = re.search(r"--lifecycle-configuration '(\{.*?\})'\n```", page, re.DOTALL)
    assert found is not None, "docs/tiered.md lost its lifecycle example"
    configuration: dict[str, Any] = json.loads(found.group(1))
    return configuration


class TestLifecycleRules:
    """``aborting_rule``: the lifecycle rules that abort every incomplete upload under a root (cleanup.py,
    rule 1)."""

    ABORT: ClassVar[dict[str, Any]] = {
        "Status": "Enabled",
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 3},
        "ID": "r",
    }

    @pytest.mark.parametrize(
        ("extra", "covers"),
        [
            ({"Filter": {}}, True),
            ({"Filter": {"Prefix": ""}}, True),
            ({"Filter": {"Prefix": "ti"}}, True),
            ({"Filter": {"Prefix": "tiers/"}}, True),
            ({"Filter": {"Prefix": "tiers/exec/"}}, False),  # the root's pub/ and pins/ are outside it
            ({"Filter": {"And": {"Prefix": "tiers"}}}, True),
            ({"Filter": {"And": {"Prefix": "tiers", "Tags": [{"Key": "a", "Value": "b"}]}}}, False),
            ({"Filter": {"Tag": {"Key": "a", "Value": "b"}}}, False),
            ({"Filter": {"ObjectSizeGreaterThan": 10}}, False),
            ({"Prefix": "tiers"}, True),  # the older form
            ({"Prefix": "other"}, False),
            ({"Filter": {}, "Status": "Disabled"}, False),
            ({"Filter": {}, "AbortIncompleteMultipartUpload": {}}, False),
        ],
    )
    def test_a_rule_covers_the_root_only_by_prefix(self, extra: dict[str, Any], covers: bool) -> None:
        from ckpt.adapters.s3.cleanup import aborting_rule

        rules = [{"ID": "expire", "Status": "Enabled", "Expiration": {"Days": 9}}, {**self.ABORT, **extra}]
        assert aborting_rule(rules, "tiers/") == (("r", 3) if covers else None)


class TestTransferSettings:
    """``--concurrency`` and ``--max-bandwidth`` (tiered.md §12, cli.md §14.6)."""

    @pytest.mark.parametrize(
        ("text", "rate"),
        [("1", 1), ("200M", 200_000_000), ("3k", 3000), ("1Gi", 1 << 30), ("2Mi", 2 << 20), ("1Ki", 1024)],
    )
    def test_rates(self, text: str, rate: int) -> None:
        from ckpt.domain.tiered_ports import parse_rate

        assert parse_rate(text, "--max-bandwidth") == rate

    @pytest.mark.parametrize(
        "text", ["0", "", "-5", "1.5M", "10MB", "M", "\uff11\uff10", "5 M", "7iM", "1K", "2m", "3\n"]
    )
    def test_bad_rates_are_refused_naming_the_option(self, roots: tuple[Path, Path], text: str) -> None:
        fast, durable = roots
        options = ["--once", "--max-bandwidth", text]
        result = run("--root", str(fast), "replicate", "--to", str(durable), *options)
        assert result.returncode == 2
        assert f"--max-bandwidth {text!r}: give bytes per second" in result.stderr
        assert entries(str(durable)) == []  # nothing copied

    @pytest.mark.parametrize("text", ["0", "65", "x", "-1"])
    def test_bad_concurrency_is_refused(self, roots: tuple[Path, Path], text: str) -> None:
        fast, durable = roots
        result = run("--root", str(fast), "replicate", "--to", str(durable), "--once", "--concurrency", text)
        assert result.returncode == 2
        assert f"--concurrency {text!r}" in result.stderr or f"--concurrency {text}:" in result.stderr

    def test_a_bounded_posix_copy_waits_as_the_bucket_says(self, tmp_path: Path) -> None:
        """5 MiB at 1 MiB/s with a one-second burst: 4 s of waiting in all, counted on a fake clock, and the
        copy verifies as an unbounded one."""
        from ckpt.adapters.posix.tiered import PosixTierFiles, sha256_of

        now = [100.0]
        waits: list[float] = []

        def sleep(seconds: float) -> None:
            waits.append(seconds)
            now[0] += seconds

        source = tmp_path / "model.bin"
        source.write_bytes(os.urandom(5 << 20))
        durable = tmp_path / "durable"
        durable.mkdir()
        files = PosixTierFiles(str(durable), max_bandwidth=1 << 20, clock=lambda: now[0], sleep=sleep)
        files.put(str(source), "exec/a/ck-1", "model.bin", sha256_of(str(source)), 5 << 20)
        assert sum(waits) == pytest.approx(4.0)
        assert len(waits) == 4
        assert (durable / "exec/a/ck-1/model.bin").read_bytes() == source.read_bytes()
        files.put(str(source), "exec/a/ck-2", "model.bin", sha256_of(str(source)), 5 << 20)
        assert sum(waits) == pytest.approx(9.0)  # the bucket is shared: no new burst for the second file

    def test_a_bounded_replicate_cli_run_copies_everything(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        options = ["--max-bandwidth", "1Gi", "--concurrency", "2"]
        result = run("--root", str(fast), "replicate", "--to", str(durable), "--once", *options)
        assert result.returncode == 0, result.stderr
        assert [line.split()[:2] for line in entries(str(durable))] == [["5", "100"], ["5", "200"]]

    @pytest.mark.parametrize("s3_server", ["moto"], indirect=True)
    def test_s3_uploads_run_with_the_bounds_and_restores_without(
        self, tmp_path: Path, s3: tuple[Any, str, str]
    ) -> None:
        from ckpt.config import load_config
        from ckpt.domain.tiered_ports import TransferSettings
        from ckpt.store import open_store, tier_files

        _, root, config = s3
        store = open_store(root, config=load_config(config), environ=KEYS)
        files = tier_files(store, TransferSettings(3, 5_000_000))
        upload, download = files.transfer_config(), files.transfer_config(upload=False)
        assert (upload.max_request_concurrency, upload.max_bandwidth) == (3, 5_000_000)
        assert (download.max_request_concurrency, download.max_bandwidth) == (3, None)
        fast = tmp_path / "fast"
        publish(fast, 5, 100, hf_save(fast, "a", 100, size=9 << 20))  # two parts
        options = ["--concurrency", "1", "--max-bandwidth", "100M"]
        result = run("--config", config, "--root", str(fast), "replicate", "--to", root, "--once", *options)
        assert result.returncode == 0, result.stderr
        assert entries(root, "--config", config) == [f"5 100 {root}/exec/a/checkpoint-100"]

    def test_the_integrations_read_the_bounds_from_the_environment(self, tmp_path: Path) -> None:
        from ckpt.domain.errors import InvalidError
        from ckpt.integrations.core import open_job

        fast, durable = tmp_path / "fast", tmp_path / "durable"
        durable.mkdir()
        env = {"CKPT_ROOT": str(fast), "DISPATCH_EPOCH": "1", "DISPATCH_ATTEMPT": "a"}
        env["CKPT_DURABLE"] = str(durable)
        job = open_job(environ={**env, "CKPT_DURABLE_MAX_BANDWIDTH": "1Ki"})
        assert job.tiers is not None
        assert job.tiers.durable_files._bucket is not None  # a bounded POSIX copy
        with pytest.raises(InvalidError, match="CKPT_DURABLE_MAX_BANDWIDTH '1 K'"):
            open_job(environ={**env, "CKPT_DURABLE_MAX_BANDWIDTH": "1 K"})
        with pytest.raises(InvalidError, match="CKPT_DURABLE_CONCURRENCY 'many'"):
            open_job(environ={**env, "CKPT_DURABLE_CONCURRENCY": "many"})


class TestReplicationMetrics:
    """``ckpt replicate --metrics-port`` (cli.md §14.7, ckpt.adapters.prometheus rule 3a) and ``--json``'s
    ``lag_steps`` (tiered.md §11.1)."""

    def test_a_running_replicator_serves_what_it_copied_and_the_lag(self, roots: tuple[Path, Path]) -> None:
        from test_watch_metrics import Sidecar, scrape

        fast, durable = roots
        options = ["--to", str(durable), "--interval", "0.1", "--metrics-port", "0"]
        sidecar = Sidecar(fast, *options, command="replicate")
        try:
            url = sidecar.wait_for_line(r"serving metrics at (http://127\.0\.0\.1:\d+/metrics)").group(1)

            def until(name: str, value: float) -> dict[str, float]:
                deadline = time.monotonic() + 30
                while True:
                    _, samples = scrape(url)
                    if samples.get(name) == value or time.monotonic() > deadline:
                        return samples
                    time.sleep(0.05)

            samples = until("ckpt_replicate_saves_published_total", 2)
            assert samples["ckpt_replicate_saves_published_total"] == 2
            assert samples["ckpt_replicate_files_copied_total"] == 2 * FILES_PER_SAVE
            save_bytes = sum(len(b) for b in files_of(fast / "exec" / "a" / "checkpoint-100").values())
            save_bytes += sum(len(b) for b in files_of(fast / "exec" / "a" / "checkpoint-200").values())
            assert samples["ckpt_replicate_bytes_copied_total"] == save_bytes
            newest = samples["ckpt_replicate_last_durable_epoch"], samples["ckpt_replicate_last_durable_step"]
            assert newest == (5, 200)
            assert samples["ckpt_replicate_pass_failures_total"] == 0
            samples = until("ckpt_replicate_entries_pending", 0)
            assert (samples["ckpt_replicate_lag_steps"], samples["ckpt_replicate_lag_seconds"]) == (0, 0)
            # A save whose copy cannot be installed (a folder where a file must go, on the durable root):
            # every pass fails and is retried; the entry waits, and the lag shows it.
            (durable / "exec" / "a" / "checkpoint-300" / "model.safetensors").mkdir(parents=True)
            publish(fast, 5, 300, hf_save(fast, "a", 300))
            samples = until("ckpt_replicate_entries_pending", 1)
            assert samples["ckpt_replicate_entries_pending"] == 1
            assert samples["ckpt_replicate_lag_steps"] == 100
            assert samples["ckpt_replicate_pass_failures_total"] >= 1
            assert samples["ckpt_replicate_verification_failures_total"] == 0  # it failed; nothing was wrong
            assert samples["ckpt_replicate_saves_published_total"] == 2
            assert sidecar.stop() == 0
        finally:
            sidecar.kill()

    def test_json_reports_the_lag_after_the_pass(self, roots: tuple[Path, Path]) -> None:
        fast, durable = roots
        publish(fast, 5, 300, hf_save(fast, "a", 300, complete=False))  # passed over under the rule
        options = ["--to", str(durable), "--once", "--framework", "hf"]
        result = run("--json", "--root", str(fast), "replicate", *options)
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert [e["step"] for e in document["published"]] == [100, 200]
        assert document["lag_steps"] == 100  # the newest fast entry is not durable

    def test_lag_seconds_and_verification_failures_on_a_fake_clock(self) -> None:
        from prometheus_client import CollectorRegistry

        from ckpt.adapters.prometheus import ReplicationMetrics
        from ckpt.application.replication import Replicated
        from ckpt.domain.entries import Entry

        now = [10.0]
        registry = CollectorRegistry()
        metrics = ReplicationMetrics(registry, "test", clock=lambda: now[0])
        first, second = Entry(1, 10, "exec/a/ck-10"), Entry(1, 20, "exec/a/ck-20")
        failed = Replicated(failure="cannot verify s3://b/x", verification_failed=True, newest_fast=second)
        metrics.passed(failed, (first, second))
        now[0] = 25.0
        metrics.passed(Replicated(published=(first,), newest_fast=second, newest_durable=first), (second,))
        now[0] = 40.0

        def value(name: str) -> float | None:
            return registry.get_sample_value(f"ckpt_replicate_{name}")

        assert value("lag_seconds") == 30.0  # ck-20 has waited since it was first seen, at 10
        assert value("lag_steps") == 10
        assert (value("verification_failures_total"), value("pass_failures_total")) == (1, 1)
        assert value("seconds_since_last_successful_pass") == 15.0
        metrics.passed(Replicated(published=(second,), newest_fast=second, newest_durable=second), ())
        assert (value("lag_seconds"), value("lag_steps"), value("entries_pending")) == (0.0, 0, 0)
        assert (value("saves_published_total"), value("passes_total")) == (2, 3)


class TestChecksumChoice:
    """``ckpt replicate --checksum`` (tiered.md §12.5): the S3 additional checksum of every upload."""

    def test_sha256_on_every_upload(
        self, tmp_path: Path, s3: tuple[Any, str, str], s3_server_kind: str
    ) -> None:
        client, root, config = s3
        fast = tmp_path / "fast"
        publish(fast, 5, 100, hf_save(fast, "a", 100, size=9 << 20))  # one multipart file, two single ones
        args = ("--config", config, "--root", str(fast), "replicate", "--to", root, "--once")
        result = run(*args, "--checksum", "SHA256")
        assert result.returncode == 0, result.stderr
        bucket = root.split("/")[2]
        for name, size in (("model.safetensors", 9 << 20), ("sub/shard.bin", len(b"shard of 100"))):
            head = client.head_object(
                Bucket=bucket, Key=f"tiers/exec/a/checkpoint-100/{name}", ChecksumMode="ENABLED"
            )
            assert head["ContentLength"] == size
            # moto records the checksum asked for; Ceph RGW 16.2 takes the upload and reports none (§4.1).
            assert ("ChecksumSHA256" in head) is (s3_server_kind == "moto"), head
            assert "ChecksumCRC32" not in head
        verified = resolve_verify(root, "--verify", "--digests", config=config)
        assert verified.stdout == f"{root}/exec/a/checkpoint-100\n", verified.stderr

    @pytest.mark.parametrize("s3_server", ["moto"], indirect=True)
    def test_a_checksum_botocore_cannot_compute_here_is_refused_before_any_upload(
        self, tmp_path: Path, s3: tuple[Any, str, str]
    ) -> None:
        import importlib.util

        _, root, config = s3
        fast = tmp_path / "fast"
        publish(fast, 5, 100, hf_save(fast, "a", 100))
        args = ("--config", config, "--root", str(fast), "replicate", "--to", root, "--once")
        bad = run(*args, "--checksum", "md5")
        assert bad.returncode == 2
        assert "--checksum 'md5': give one of CRC32, CRC32C, CRC64NVME, SHA256" in bad.stderr
        crc32c = run(*args, "--checksum", "CRC32C")
        if importlib.util.find_spec("awscrt") is None:  # not a dependency: the usual case
            assert crc32c.returncode == 2
            assert "botocore computes it only with awscrt" in crc32c.stderr
            assert entries(root, "--config", config) == []
        else:
            assert crc32c.returncode == 0, crc32c.stderr
