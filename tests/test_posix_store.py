"""POSIX-only behaviour of the store: symbolic links, a missing root, durability, and a publish race."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore, Syscalls
from ckpt.domain.entries import Entry
from ckpt.domain.errors import ExistsError, InvalidError, MalformedError, NotFoundError
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import ProbesExclusiveCreate
from ckpt.testing import InMemoryStore


def make_save(root: Path, save: str) -> str:
    path = root / save
    path.mkdir(parents=True)
    (path / "model.bin").write_bytes(b"weights")
    return str(path)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


class TestRoot:
    def test_relative_root_is_invalid(self) -> None:
        """The root must be an absolute path."""
        with pytest.raises(InvalidError):
            PosixStore("relative/root")

    def test_missing_root_is_an_error_for_every_read(self, tmp_path: Path) -> None:
        """A root that does not exist is NotFoundError, not an empty log."""
        store = PosixStore(str(tmp_path / "absent"))
        with pytest.raises(NotFoundError):
            store.entries()
        with pytest.raises(NotFoundError):
            store.resolve()

    def test_publish_creates_pub(self, root: Path) -> None:
        """The first publish creates pub/."""
        store = PosixStore(str(root))
        store.publish(1, 1, make_save(root, "exec/a/ck-1"))
        assert (root / "pub").is_dir()

    def test_save_that_is_a_file_is_invalid(self, root: Path) -> None:
        """A save must be a directory."""
        (root / "exec").mkdir()
        (root / "exec" / "file").write_bytes(b"")
        with pytest.raises(InvalidError):
            PosixStore(str(root)).publish(1, 1, str(root / "exec" / "file"))

    def test_trailing_slash_on_a_location_is_accepted(self, root: Path) -> None:
        """One trailing slash on an absolute save location names the same save."""
        entry = PosixStore(str(root)).publish(1, 1, make_save(root, "exec/a/ck-1") + "/")
        assert entry.save == "exec/a/ck-1"


class TestPubContents:
    def test_an_entry_that_is_a_symlink_is_malformed(self, root: Path) -> None:
        """A symbolic link in pub/ is not an entry: MalformedError naming it."""
        store = PosixStore(str(root))
        store.publish(1, 1, make_save(root, "exec/a/ck-1"))
        name = format_entry_name(Entry(1, 2, "exec/a/ck-2"))
        os.symlink("/etc/hostname", root / "pub" / name)
        with pytest.raises(MalformedError, match="not a regular file"):
            store.resolve()

    def test_an_entry_that_is_a_fifo_is_malformed(self, root: Path) -> None:
        """A FIFO in pub/ is refused without ever being opened."""
        store = PosixStore(str(root))
        store.publish(1, 1, make_save(root, "exec/a/ck-1"))
        os.mkfifo(root / "pub" / format_entry_name(Entry(1, 2, "exec/a/ck-2")))
        with pytest.raises(MalformedError):
            store.entries()


class TestPruneNeverFollowsLinks:
    def test_a_save_that_is_a_symlink_is_skipped_and_its_target_kept(
        self, root: Path, tmp_path: Path
    ) -> None:
        """A removed entry's folder that is a symbolic link is skipped; the link and its target stay."""
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "precious.bin").write_bytes(b"keep me")
        (root / "exec" / "a").mkdir(parents=True)
        os.symlink(outside, root / "exec" / "a" / "ck-1")
        store = PosixStore(str(root))
        store.publish(1, 1, str(root / "exec" / "a" / "ck-1"))
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        result = store.prune(1)
        assert [s.reason for s in result.skipped] == [
            "is a symbolic link (never removed, nor what it points to)"
        ]
        assert (outside / "precious.bin").read_bytes() == b"keep me"
        assert os.path.islink(root / "exec" / "a" / "ck-1")

    def test_a_save_reached_through_a_symlinked_ancestor_is_skipped(self, root: Path, tmp_path: Path) -> None:
        """A folder whose ancestor below the root is a link is never removed, nor anything behind it."""
        outside = tmp_path / "elsewhere"
        (outside / "ck-1").mkdir(parents=True)
        (outside / "ck-1" / "model.bin").write_bytes(b"keep me")
        (root / "exec").mkdir()
        os.symlink(outside, root / "exec" / "linked")
        store = PosixStore(str(root))
        store.publish(1, 1, str(root / "exec" / "linked" / "ck-1"))
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        result = store.prune(1)
        assert [s.reason for s in result.skipped] == ["is reached through a symbolic link (never removed)"]
        assert (outside / "ck-1" / "model.bin").read_bytes() == b"keep me"

    def test_links_inside_a_removed_folder_are_removed_not_followed(self, root: Path, tmp_path: Path) -> None:
        """Removing a save removes links inside it but never what they point to."""
        outside = tmp_path / "data"
        outside.mkdir()
        (outside / "shard.bin").write_bytes(b"shared")
        save = make_save(root, "exec/a/ck-1")
        os.symlink(outside, os.path.join(save, "dataset"))
        store = PosixStore(str(root))
        store.publish(1, 1, save)
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        result = store.prune(1)
        assert result.removed_folders == (save,)
        assert not os.path.lexists(save)
        assert (outside / "shard.bin").read_bytes() == b"shared"


class _PublishesDuringPrune(PosixStore):
    """A store that publishes a new entry for a folder about to be pruned, right after the removals."""

    __slots__ = ("_reads",)

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self._reads = 0

    def entries(self) -> list[Entry]:
        self._reads += 1
        if self._reads == 2:  # the re-read between removing entries and removing folders
            PosixStore(self.root).publish(9, 9, self.root + "/exec/a/ck-1")
        return super().entries()


class TestPruneRereads:
    def test_an_entry_published_during_prune_protects_its_folder(self, root: Path) -> None:
        """Entries are read again before folders are removed, so a concurrent publication keeps its folder."""
        make_save(root, "exec/a/ck-1")
        make_save(root, "exec/a/ck-2")
        store = _PublishesDuringPrune(str(root))
        store.publish(1, 1, str(root / "exec/a/ck-1"))
        store.publish(1, 2, str(root / "exec/a/ck-2"))
        result = store.prune(1)
        assert [e.step for e in result.removed_entries] == [1]
        assert result.removed_folders == ()
        assert [s.reason for s in result.skipped] == ["named by an entry published during the prune"]
        assert (root / "exec/a/ck-1/model.bin").exists()


def _publish_all(
    root: str,
    jobs: list[tuple[int, int, str]],
    start: multiprocessing.synchronize.Event,
    results: multiprocessing.queues.Queue[tuple[int, list[int]]],
    worker: int,
) -> None:
    store = PosixStore(root)
    won = []
    start.wait()
    for index, (epoch, step, location) in enumerate(jobs):
        try:
            store.publish(epoch, step, location)
            won.append(index)
        except ExistsError:
            pass
    results.put((worker, won))


class TestPublishRace:
    def test_eight_processes_publishing_the_same_forty_entries_yield_one_winner_each(
        self, root: Path
    ) -> None:
        """Exclusive create: of 8 concurrent publishers of the same 40 entries, exactly one wins each."""
        jobs = [(1 + i % 3, i, make_save(root, f"exec/a/ck-{i}")) for i in range(40)]
        ctx = multiprocessing.get_context("fork")
        start = ctx.Event()
        results: multiprocessing.queues.Queue[tuple[int, list[int]]] = ctx.Queue()
        procs = []
        for worker in range(8):
            order = jobs if worker % 2 == 0 else list(reversed(jobs))
            p = ctx.Process(target=_publish_all, args=(str(root), order, start, results, worker))
            p.start()
            procs.append(p)
        start.set()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        wins: dict[tuple[int, int, str], int] = {}
        for worker, won in outcomes:
            order = jobs if worker % 2 == 0 else list(reversed(jobs))
            for index in won:
                wins[order[index]] = wins.get(order[index], 0) + 1
        assert sorted(wins) == sorted(jobs)
        assert set(wins.values()) == {1}
        assert len(PosixStore(str(root)).entries()) == 40


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is installed by .ci/run")
class TestDurability:
    def test_publish_fsyncs_the_entry_pub_and_the_root(self, root: Path, tmp_path: Path) -> None:
        """publish syncs the new file, pub/ and the root before it returns (counted with strace)."""
        save = make_save(root, "exec/a/ck-1")
        (root / "pub").mkdir()
        log = tmp_path / "strace.log"
        subprocess.run(
            [
                "strace",
                "-f",
                "-e",
                "trace=fsync,fdatasync",
                "-o",
                str(log),
                sys.executable,
                "-m",
                "ckpt",
                "--root",
                str(root),
                "publish",
                "--epoch",
                "1",
                "--step",
                "1",
                save,
            ],
            check=True,
            capture_output=True,
        )
        calls = [line for line in log.read_text().splitlines() if "fsync(" in line and "= 0" in line]
        assert len(calls) == 3, calls


class _Vanishing(Syscalls):
    """Real system calls, except that chosen paths vanish between the listing and the look at them."""

    def __init__(self, gone_on_lstat: str, gone_on_scandir: str) -> None:
        self.gone_on_lstat = gone_on_lstat
        self.gone_on_scandir = gone_on_scandir

    def lstat(self, path: str, *, dir_fd: int | None = None) -> os.stat_result:
        if path.endswith(self.gone_on_lstat):
            raise FileNotFoundError(2, "No such file or directory", path)
        return super().lstat(path, dir_fd=dir_fd)

    def scandir(self, path: str | int) -> Any:
        if isinstance(path, str) and path.endswith(self.gone_on_scandir):
            raise FileNotFoundError(2, "No such file or directory", path)
        return super().scandir(path)


class TestFilesWhileTheSaveChanges:
    def test_a_file_or_folder_vanishing_mid_listing_is_left_out_not_everything(self, root: Path) -> None:
        """files() skips what vanished mid-walk; an empty listing would let a changing save 'settle'."""
        save = make_save(root, "exec/a/checkpoint-5")
        (Path(save) / "trainer_state.json").write_bytes(b"{}")
        (Path(save) / "rng_state_1.pth.tmp").write_bytes(b"xx")
        (Path(save) / "staged").mkdir()
        (Path(save) / "staged" / "shard.bin").write_bytes(b"yyy")
        store = PosixStore(str(root), syscalls=_Vanishing("rng_state_1.pth.tmp", "/staged"))
        assert [(f.path, f.size) for f in store.files(save)] == [("model.bin", 7), ("trainer_state.json", 2)]

    def test_a_save_that_is_gone_has_no_files(self, root: Path) -> None:
        """A save folder that no longer exists lists as empty."""
        assert PosixStore(str(root)).files(str(root / "exec/a/missing")) == []


class TestExclusiveCreateProbe:
    def test_the_probe_is_a_declared_capability_and_leaves_nothing(self, tmp_path: Path) -> None:
        """PosixStore offers ProbesExclusiveCreate, as S3Store does; the probe passes and removes its file."""
        store = PosixStore(str(tmp_path))
        assert isinstance(store, ProbesExclusiveCreate)
        probe = store.probe_exclusive_create()
        assert (probe.honoured, probe.location.startswith(f"{tmp_path}/.ckpt-doctor-")) == (True, True)
        assert os.listdir(tmp_path) == []

    def test_the_in_memory_store_does_not_pretend_to_probe(self) -> None:
        """A store without the capability is not mistaken for one that has it."""
        assert not isinstance(InMemoryStore(), ProbesExclusiveCreate)
