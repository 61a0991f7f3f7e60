"""POSIX-only behaviour of the store: symbolic links, a missing root, durability, and a publish race."""

from __future__ import annotations

import errno
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore, Syscalls
from ckpt.application.verify import resolve_verified
from ckpt.domain.entries import Entry
from ckpt.domain.errors import ExistsError, InvalidError, MalformedError, NotFoundError, StorageError
from ckpt.domain.frameworks import Framework
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import ProbesExclusiveCreate
from ckpt.testing import InMemoryStore
from support.faulty_syscalls import FaultySyscalls
from support.saves import make_save


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

    def test_save_that_is_a_fifo_is_invalid(self, root: Path) -> None:
        """A save must be a folder or a regular file: a FIFO is neither (and is never opened)."""
        (root / "exec").mkdir()
        os.mkfifo(root / "exec" / "fifo")
        with pytest.raises(InvalidError, match="is neither a folder nor a regular file"):
            PosixStore(str(root)).publish(1, 1, str(root / "exec" / "fifo"))

    def test_a_single_file_save_is_synced(self, root: Path) -> None:
        """sync_save of a single-file save fsyncs the file and its folder, without error."""
        (root / "exec").mkdir()
        (root / "exec" / "epoch=0-step=5.ckpt").write_bytes(b"weights")
        store = PosixStore(str(root))
        store.sync_save(str(root / "exec" / "epoch=0-step=5.ckpt"))
        assert store.publish(1, 5, str(root / "exec" / "epoch=0-step=5.ckpt")).step == 5

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
            timeout=120,
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


def ckpt_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ckpt`` with no CKPT_/DISPATCH_ variables from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    return subprocess.run(
        [sys.executable, "-m", "ckpt", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


class TestPublishWhatIsNotASave:
    def test_a_missing_save_exits_2_as_an_invalid_argument(self, root: Path) -> None:
        """ckpt publish of a save folder that does not exist exits 2 with one line, publishing nothing."""
        save = root / "exec/a/ck-1"
        result = ckpt_cli("--root", str(root), "publish", "--epoch", "1", "--step", "1", str(save))
        assert (result.returncode, result.stderr) == (2, f"ckpt: save {save} does not exist\n")
        assert not (root / "pub").exists() or os.listdir(root / "pub") == []

    def test_a_regular_file_is_published_as_a_single_file_save(self, root: Path) -> None:
        """ckpt publish of a regular file publishes it (a single-file save), as on every store."""
        save = root / "exec/a/ck-1"
        save.parent.mkdir(parents=True)
        save.write_bytes(b"weights")
        result = ckpt_cli("--root", str(root), "publish", "--epoch", "1", "--step", "1", str(save))
        assert (result.returncode, result.stderr) == (0, "")
        assert [e.save for e in PosixStore(str(root)).entries()] == ["exec/a/ck-1"]

    def test_a_missing_root_is_still_a_storage_failure(self, tmp_path: Path) -> None:
        """With the root itself gone, publish is NotFoundError (exit 1), not an invalid save."""
        root = tmp_path / "gone"
        with pytest.raises(NotFoundError) as caught:
            PosixStore(str(root)).publish(1, 1, str(root / "exec/a/ck-1"))
        assert not isinstance(caught.value, InvalidError)


class TestRootWithDotDot:
    @pytest.mark.parametrize("root_text", ["{base}/link/../root", "{base}/./root", "{base}/root/."])
    def test_a_root_with_dot_elements_is_refused(self, tmp_path: Path, root_text: str) -> None:
        """A root with '.' or '..' elements is InvalidError: the kernel may resolve it to another folder."""
        with pytest.raises(InvalidError, match=r"'\.' or '\.\.' path element"):
            PosixStore(root_text.format(base=tmp_path))

    def test_prune_through_the_cli_refuses_it_and_removes_nothing(self, tmp_path: Path) -> None:
        """ckpt --root /a/link/../root prune exits 2, leaving both trees (the text's, the kernel's) whole.

        /a/link points to /b/deep, so the kernel reads /a/link/../root as /b/root, while text normalisation
        gives /a/root: before the fix, prune read one tree's entries and removed folders from the other.
        """
        text_root = tmp_path / "a" / "root"
        kernel_root = tmp_path / "b" / "root"
        (tmp_path / "b" / "deep").mkdir(parents=True)
        (tmp_path / "a").mkdir()
        os.symlink(tmp_path / "b" / "deep", tmp_path / "a" / "link")
        for root in (text_root, kernel_root):
            root.mkdir()
            store = PosixStore(str(root))
            store.publish(1, 1, make_save(root, "exec/a/ck-1"))
            store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        result = ckpt_cli("--root", f"{tmp_path}/a/link/../root", "prune", "--keep", "1")
        assert result.returncode == 2, result.stderr
        assert "'.' or '..' path element" in result.stderr
        for root in (text_root, kernel_root):
            assert (root / "exec/a/ck-1").is_dir()
            assert len(os.listdir(root / "pub")) == 2

    def test_a_root_through_a_link_is_the_folder_the_kernel_resolves(self, tmp_path: Path) -> None:
        """A root whose path holds a symbolic link (no '..') works: every command sees the same folder."""
        (tmp_path / "real").mkdir()
        os.symlink(tmp_path / "real", tmp_path / "link")
        store = PosixStore(f"{tmp_path}/link/")
        assert store.root == f"{tmp_path}/link"
        make_save(tmp_path / "real", "exec/a/ck-1")
        store.publish(1, 1, f"{tmp_path}/link/exec/a/ck-1")
        assert [e.step for e in PosixStore(str(tmp_path / "real")).entries()] == [1]


class TestExistsOnlyNoSuchFileIsAbsence:
    @pytest.mark.parametrize("err", [errno.EIO, errno.EACCES, errno.ENOMEM])
    def test_an_io_error_on_the_sentinel_is_a_storage_error_not_absence(self, root: Path, err: int) -> None:
        """EIO (or EACCES...) looking at checkpoint-is-incomplete.txt raises; it never reads as "absent"."""
        save = make_save(root, "exec/a/checkpoint-5")
        (Path(save) / "trainer_state.json").write_bytes(b"{}")
        (Path(save) / "checkpoint-is-incomplete.txt").write_bytes(b"")
        calls = FaultySyscalls(str(root))
        calls.fail("lstat", 1, err)
        with pytest.raises(StorageError) as caught:
            PosixStore(str(root), syscalls=calls).exists(save, "checkpoint-is-incomplete.txt")
        assert f"{save}/checkpoint-is-incomplete.txt" in str(caught.value)
        assert os.strerror(err) in str(caught.value)

    def test_verified_resolve_does_not_pass_an_unreadable_incomplete_save(self, root: Path) -> None:
        """With the sentinel's lstat failing, verified resolve raises instead of accepting the save."""
        save = make_save(root, "exec/a/checkpoint-5")
        (Path(save) / "trainer_state.json").write_bytes(b"{}")
        (Path(save) / "checkpoint-is-incomplete.txt").write_bytes(b"")
        PosixStore(str(root)).publish(1, 5, save)
        calls = FaultySyscalls(str(root))
        calls.fail("lstat", 2, errno.EIO)  # the first lstat is trainer_state.json's, before it is read
        with pytest.raises(StorageError):
            resolve_verified(PosixStore(str(root), syscalls=calls), Framework.HF)

    @pytest.mark.parametrize("err", [errno.EIO, errno.EACCES])
    def test_an_io_error_on_a_folder_on_the_way_is_a_storage_error(self, root: Path, err: int) -> None:
        """A failed open of a folder between the root and the file is an error too, not absence."""
        save = make_save(root, "exec/a/step-5")
        (Path(save) / ".metadata").write_bytes(b"m")
        calls = FaultySyscalls(str(root))
        calls.fail("open", 3, err)  # the root, exec, then a
        with pytest.raises(StorageError):
            PosixStore(str(root), syscalls=calls).exists(save, ".metadata")

    def test_a_missing_name_or_a_file_on_the_way_is_absence(self, root: Path) -> None:
        """ENOENT, and ENOTDIR where an element of the name is a file, are "absent"."""
        save = make_save(root, "exec/a/step-5")
        store = PosixStore(str(root))
        assert store.exists(save, ".metadata") is False
        assert store.exists(save, "model.bin/.metadata") is False
        assert store.read_file(save, "model.bin/x") is None


class TestMarkersAreRegularFilesOnPosix:
    def test_a_dangling_link_named_metadata_does_not_complete_a_dcp_save(self, root: Path) -> None:
        """A dangling .metadata link is no marker: exists is False and verified resolve passes it over."""
        save = make_save(root, "exec/a/step-5")
        os.symlink("nowhere", os.path.join(save, ".metadata"))
        store = PosixStore(str(root))
        store.publish(1, 5, save)
        assert store.exists(save, ".metadata") is False
        assert resolve_verified(store, Framework.DCP).entry is None

    def test_a_link_to_a_real_file_is_no_marker_either(self, root: Path, tmp_path: Path) -> None:
        """A .metadata that links to a regular file is still a link: not a marker."""
        save = make_save(root, "exec/a/step-5")
        (tmp_path / "elsewhere").write_bytes(b"m")
        os.symlink(tmp_path / "elsewhere", os.path.join(save, ".metadata"))
        assert PosixStore(str(root)).exists(save, ".metadata") is False

    def test_a_folder_named_like_the_hf_sentinel_does_not_block_a_save(self, root: Path) -> None:
        """A folder called checkpoint-is-incomplete.txt is no sentinel: the hf save is complete."""
        save = make_save(root, "exec/a/checkpoint-5")
        (Path(save) / "trainer_state.json").write_bytes(b"{}")
        (Path(save) / "checkpoint-is-incomplete.txt").mkdir()
        store = PosixStore(str(root))
        entry = store.publish(1, 5, save)
        assert store.exists(save, "checkpoint-is-incomplete.txt") is False
        assert resolve_verified(store, Framework.HF).entry == entry


class TestReadFileStaysInsideTheSave:
    def test_a_trainer_state_linking_to_dev_zero_reads_as_absent_at_once(self, root: Path) -> None:
        """trainer_state.json -> /dev/zero is a link: read_file returns None without opening it."""
        save = make_save(root, "exec/a/checkpoint-5")
        os.symlink("/dev/zero", os.path.join(save, "trainer_state.json"))
        calls = FaultySyscalls(str(root))
        assert PosixStore(str(root), syscalls=calls).read_file(save, "trainer_state.json") is None
        assert not any(c.operation == "read" for c in calls.calls)

    def test_a_trainer_state_linking_outside_the_save_is_not_read(self, root: Path, tmp_path: Path) -> None:
        """A link to a valid trainer_state.json elsewhere is not followed: the save has no trainer state."""
        save = make_save(root, "exec/a/checkpoint-5")
        (tmp_path / "state.json").write_bytes(b'{"global_step": 5}')
        os.symlink(tmp_path / "state.json", os.path.join(save, "trainer_state.json"))
        store = PosixStore(str(root))
        assert store.read_file(save, "trainer_state.json") is None
        store.publish(1, 5, save)
        assert resolve_verified(store, Framework.HF).entry is None

    def test_a_file_reached_through_a_linked_folder_is_not_read(self, root: Path, tmp_path: Path) -> None:
        """A folder link inside the save (sub -> elsewhere) is never gone through."""
        save = make_save(root, "exec/a/checkpoint-5")
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "x.json").write_bytes(b"{}")
        os.symlink(tmp_path / "elsewhere", os.path.join(save, "sub"))
        store = PosixStore(str(root))
        assert store.read_file(save, "sub/x.json") is None
        assert store.exists(save, "sub/x.json") is False

    def test_a_save_that_is_a_link_is_not_read_through(self, root: Path, tmp_path: Path) -> None:
        """A save folder that is itself a link out of the root has no readable files and no folders."""
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "trainer_state.json").write_bytes(b"{}")
        (root / "exec" / "a").mkdir(parents=True)
        os.symlink(tmp_path / "elsewhere", root / "exec" / "a" / "checkpoint-5")
        store = PosixStore(str(root))
        save = str(root / "exec" / "a" / "checkpoint-5")
        assert store.read_file(save, "trainer_state.json") is None
        assert store.folders(save) == []

    def test_read_file_outside_the_root_is_invalid(self, root: Path) -> None:
        """read_file("/etc", "passwd") is InvalidError, not the file's content."""
        store = PosixStore(str(root))
        with pytest.raises(InvalidError):
            store.read_file("/etc", "passwd")
        with pytest.raises(InvalidError):
            store.folders("/etc")
