"""The POSIX store on trees built to hurt it: link loops, links out of the root, a pub/ that is a link,
hostile entry names, a huge pub/, a read-only root, a root that is a file, a mount point inside a save.

Each case ends in a clear error or the documented behaviour, and a sentinel folder outside the root (links
point into it) is snapshotted before and compared after: nothing outside the root is ever touched. The
read-only root and the mount point are real mounts made in a private mount namespace (``unshare -m``) by a
child process, so the host never sees them.
"""

from __future__ import annotations

import base64
import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry
from ckpt.domain.errors import ExistsError, MalformedError, NotFoundError, StorageError
from ckpt.domain.names import format_entry_name
from support.faulty_syscalls import FaultySyscalls
from support.saves import make_save


def snapshot(path: Path) -> dict[str, tuple[str, int, str]]:
    """Everything under ``path`` (itself included), never following a link: kind, mtime, content or target.

    Folder times are in it, so a name created and removed again inside a folder shows too.
    """
    out: dict[str, tuple[str, int, str]] = {}
    pending = [str(path)]
    while pending:
        current = pending.pop()
        st = os.lstat(current)
        rel = os.path.relpath(current, path)
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", 0, os.readlink(current))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", st.st_mtime_ns, "")
            pending.extend(os.path.join(current, name) for name in os.listdir(current))
        elif stat.S_ISREG(st.st_mode):
            out[rel] = ("file", st.st_mtime_ns, Path(current).read_bytes().decode(errors="replace"))
        else:
            out[rel] = ("other", st.st_mtime_ns, "")  # a FIFO: never opened
    return out


def ckpt(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    return subprocess.run(
        [sys.executable, "-m", "ckpt", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``ckpt: `` line a failed command prints (asserting there is exactly one, no traceback)."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ckpt: "), lines
    return lines[0]


@pytest.fixture
def scratch(tmpfs_path: Path) -> Path:
    """Scratch space on tmpfs: these tests make many real fsync calls and check nothing fsync does."""
    return tmpfs_path


@pytest.fixture
def root(tmpfs_root: Path) -> Path:
    """The checkpoint root, on tmpfs."""
    return tmpfs_root


@pytest.fixture
def outside(scratch: Path) -> Path:
    """A sentinel tree beside the root: a file, a folder of files, and a folder of valid-looking entries."""
    o = scratch / "outside"
    (o / "data").mkdir(parents=True)
    (o / "precious.bin").write_bytes(b"keep me")
    (o / "data" / "shard.bin").write_bytes(b"shared")
    (o / "pub").mkdir()
    (o / "pub" / format_entry_name(Entry(9, 9, "exec/z/ck-9"))).write_bytes(b"")
    (o / "exec" / "z" / "ck-9").mkdir(parents=True)
    (o / "exec" / "z" / "ck-9" / "model.bin").write_bytes(b"not yours")
    return o


class TestLinkLoopsInsideASave:
    @pytest.fixture
    def looped(self, root: Path, outside: Path) -> str:
        """A save with a link to itself, two links to each other, a link to its parent and one to /."""
        save = make_save(root, "exec/a/ck-1", {"model.bin": b"weights", "sub/shard.bin": b"s"})
        os.symlink(".", os.path.join(save, "self"))
        os.symlink("b", os.path.join(save, "a"))
        os.symlink("a", os.path.join(save, "b"))
        os.symlink("..", os.path.join(save, "sub", "up"))
        os.symlink("/", os.path.join(save, "slash"))
        os.symlink(outside, os.path.join(save, "outside"))
        return save

    def test_files_lists_each_link_once_as_itself(self, looped: str) -> None:
        """files() terminates and lists every link as an entry of its own size, never what it points to."""
        store = PosixStore(str(Path(looped).parents[2]))
        listed = {f.path: f.size for f in store.files(looped)}
        assert set(listed) == {"a", "b", "model.bin", "outside", "self", "slash", "sub/shard.bin", "sub/up"}
        assert listed["self"] == os.lstat(os.path.join(looped, "self")).st_size

    def test_sync_save_terminates_and_never_opens_a_link(self, looped: str, outside: Path) -> None:
        """sync_save fsyncs the two regular files and the folders, and opens nothing a link names."""
        root = str(Path(looped).parents[2])
        calls = FaultySyscalls(root)
        before = snapshot(outside)
        PosixStore(root, syscalls=calls).sync_save(looped)
        opened = [c.target for c in calls.calls if c.operation == "open"]
        assert sorted(opened) == sorted(
            [
                "exec/a/ck-1/model.bin",
                "exec/a/ck-1/sub/shard.bin",
                "exec/a/ck-1/sub",
                "exec/a/ck-1",
                "exec/a",
            ]
        )
        assert snapshot(outside) == before

    def test_prune_removes_the_save_and_its_links_only(self, looped: str, outside: Path) -> None:
        """Pruning the looped save removes it, links as names, and nothing they point to."""
        root = Path(looped).parents[2]
        store = PosixStore(str(root))
        store.publish(1, 1, looped)
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        before = snapshot(outside)
        result = store.prune(1)
        assert result.removed_folders == (looped,)
        assert not os.path.lexists(looped)
        assert snapshot(outside) == before


class TestLinksOutOfTheRoot:
    def test_prune_never_touches_what_links_point_to(self, root: Path, outside: Path) -> None:
        """A save that is a link out, one reached through a link out, and links inside a save: all spared."""
        (root / "exec" / "a").mkdir(parents=True)
        os.symlink(outside / "data", root / "exec" / "a" / "ck-1")  # the save is a link
        os.symlink(outside / "exec" / "z", root / "exec" / "linked")  # an ancestor is a link
        inner = make_save(root, "exec/a/ck-3")
        os.symlink(outside / "precious.bin", os.path.join(inner, "weights.bin"))
        store = PosixStore(str(root))
        store.publish(1, 1, str(root / "exec/a/ck-1"))
        store.publish(1, 2, str(root / "exec/linked/ck-9"))
        store.publish(1, 3, inner)
        store.publish(1, 4, make_save(root, "exec/a/ck-4"))
        before = snapshot(outside)
        result = store.prune(1)
        assert [e.step for e in result.removed_entries] == [1, 2, 3]
        assert result.removed_folders == (inner,)
        assert sorted((s.location, s.reason) for s in result.skipped) == [
            (f"{root}/exec/a/ck-1", "is a symbolic link (never removed, nor what it points to)"),
            (f"{root}/exec/linked/ck-9", "is reached through a symbolic link (never removed)"),
        ]
        assert snapshot(outside) == before


class TestPubIsALink:
    @pytest.fixture
    def linked(self, root: Path, outside: Path) -> PosixStore:
        """A root whose pub/ is a link to a folder of valid entries outside the root."""
        os.symlink(outside / "pub", root / "pub")
        make_save(root, "exec/a/ck-1")
        return PosixStore(str(root))

    @pytest.mark.parametrize("operation", ["resolve", "entries", "prune", "publish"])
    def test_every_operation_refuses_it_naming_pub(
        self, linked: PosixStore, root: Path, outside: Path, operation: str
    ) -> None:
        """Reads, prune and publish refuse a symbolic-link pub/ with a StorageError naming it."""
        before = snapshot(outside)
        calls: dict[str, Callable[[], object]] = {
            "resolve": linked.resolve,
            "entries": linked.entries,
            "prune": lambda: linked.prune(1),
            "publish": lambda: linked.publish(1, 1, str(root / "exec/a/ck-1")),
        }
        with pytest.raises(StorageError) as caught:
            calls[operation]()
        assert str(caught.value) == (
            f"{root}/pub is a symbolic link: refusing to read or write entries through it, as that would "
            f"touch files outside the root {root}"
        )
        assert caught.value.location == f"{root}/pub"
        assert snapshot(outside) == before

    def test_the_command_line_exits_1_with_one_line(self, linked: PosixStore, root: Path) -> None:
        """ckpt resolve on such a root fails with exit 1 and one line naming pub/."""
        result = ckpt("--root", str(root), "resolve")
        assert result.returncode == 1
        assert f"ckpt: {root}/pub is a symbolic link" in one_line_error(result)

    def test_pub_that_is_a_file_is_refused_too(self, root: Path) -> None:
        """A pub/ that is a regular file is a StorageError saying so, for reads and publish."""
        (root / "pub").write_bytes(b"")
        store = PosixStore(str(root))
        with pytest.raises(StorageError, match=f"^{root}/pub is not a directory$"):
            store.resolve()
        with pytest.raises(StorageError, match=f"^{root}/pub is not a directory$"):
            store.publish(1, 1, make_save(root, "exec/a/ck-1"))


class TestExecIsALink:
    def test_publish_works_and_prune_never_removes_through_it(self, root: Path, outside: Path) -> None:
        """Saves under a linked exec/ exist, so they publish; prune removes their entries, not folders."""
        os.symlink(outside / "exec", root / "exec")
        store = PosixStore(str(root))
        store.publish(1, 1, str(root / "exec/z/ck-9"))
        make_save(outside, "exec/z/ck-10")
        store.publish(1, 2, str(root / "exec/z/ck-10"))
        before = snapshot(outside)
        result = store.prune(1)
        assert [e.step for e in result.removed_entries] == [1]
        assert result.removed_folders == ()
        assert [(s.location, s.reason) for s in result.skipped] == [
            (f"{root}/exec/z/ck-9", "is reached through a symbolic link (never removed)")
        ]
        assert snapshot(outside) == before


class TestOddEntries:
    def test_a_fifo_in_pub_is_malformed_and_never_opened(self, root: Path) -> None:
        """A FIFO in pub/ is MalformedError, and no call opens anything inside pub/."""
        store = PosixStore(str(root))
        store.publish(1, 1, make_save(root, "exec/a/ck-1"))
        fifo = format_entry_name(Entry(1, 2, "exec/a/ck-2"))
        os.mkfifo(root / "pub" / fifo)
        calls = FaultySyscalls(str(root))
        for read in (PosixStore(str(root), syscalls=calls).resolve, PosixStore(str(root)).entries):
            with pytest.raises(MalformedError, match="not a regular file") as caught:
                read()
            assert caught.value.value == fifo
        assert [c.target for c in calls.calls if c.operation == "open"] == ["pub", "pub"]

    def test_a_folder_in_pub_is_malformed_and_prune_removes_nothing(self, root: Path) -> None:
        """A folder in pub/ is MalformedError for every read, and prune stops before removing anything."""
        store = PosixStore(str(root))
        store.publish(1, 1, make_save(root, "exec/a/ck-1"))
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        (root / "pub" / format_entry_name(Entry(1, 3, "exec/a/ck-3"))).mkdir()
        before = snapshot(root)
        for operation in (store.resolve, store.entries, lambda: store.prune(1)):
            with pytest.raises(MalformedError, match="a folder"):
                operation()
        assert snapshot(root) == before

    @pytest.mark.parametrize(
        "save",
        ["../etc", "exec/../../etc", "/etc/passwd", "exec/a/", "pub/x", "exec/a\x00b", "."],
        ids=["dotdot", "inner-dotdot", "absolute", "trailing-slash", "inside-pub", "nul", "dot"],
    )
    def test_names_that_decode_to_escaping_saves_are_malformed(self, root: Path, save: str) -> None:
        """An entry whose base32 decodes to a save leaving the root, or not clean, is malformed."""
        name = "00000000000000000001-00000000000000000001-" + base64.b32encode(save.encode()).decode().rstrip(
            "="
        )
        store = PosixStore(str(root))
        store.publish(1, 0, make_save(root, "exec/a/ck-0"))
        (root / "pub" / name).write_bytes(b"")
        before = snapshot(root)
        for operation in (store.resolve, store.entries, lambda: store.prune(1)):
            with pytest.raises(MalformedError) as caught:
                operation()
            assert caught.value.value == name
        assert snapshot(root) == before


class TestHugePub:
    def test_a_hundred_thousand_entries_resolve_and_list_in_seconds(self, root: Path) -> None:
        """With 100,000 entries in pub/, resolve returns the greatest and entries() all, in a few seconds."""
        (root / "pub").mkdir()
        pub = os.open(root / "pub", os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(100_000):
                name = format_entry_name(Entry(1_000_000 + i % 3, i, f"exec/3.4103.0/checkpoint-{i}"))
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=pub))
        finally:
            os.close(pub)
        store = PosixStore(str(root))
        started = time.monotonic()
        latest = store.resolve()
        resolved_in = time.monotonic() - started
        started = time.monotonic()
        entries = store.entries()
        listed_in = time.monotonic() - started
        assert latest == Entry(1_000_002, 99_998, "exec/3.4103.0/checkpoint-99998")
        assert len(entries) == 100_000
        assert entries[-1] == latest
        assert resolved_in < 5, resolved_in
        assert listed_in < 10, listed_in


class TestRootIsAFile:
    @pytest.fixture
    def file_root(self, scratch: Path) -> Path:
        path = scratch / "file-root"
        path.write_bytes(b"not a folder")
        return path

    @pytest.mark.parametrize("operation", ["resolve", "entries", "prune", "publish"])
    def test_every_operation_says_the_root_is_not_a_directory(self, file_root: Path, operation: str) -> None:
        """Every operation on a root that is a file fails with a StorageError saying exactly that."""
        store = PosixStore(str(file_root))
        calls: dict[str, Callable[[], object]] = {
            "resolve": store.resolve,
            "entries": store.entries,
            "prune": lambda: store.prune(1),
            "publish": lambda: store.publish(1, 1, f"{file_root}/exec/a/ck-1"),
        }
        with pytest.raises(StorageError) as caught:
            calls[operation]()
        assert not isinstance(caught.value, NotFoundError)
        assert str(caught.value) == f"root {file_root} is not a directory"
        assert file_root.read_bytes() == b"not a folder"

    def test_the_command_line_exits_1_with_one_line(self, file_root: Path) -> None:
        """ckpt entries on such a root exits 1 with one line naming it."""
        result = ckpt("--root", str(file_root), "entries")
        assert result.returncode == 1
        assert one_line_error(result) == f"ckpt: root {file_root} is not a directory"


class TestDeepTrees:
    def test_a_save_nested_1200_folders_deep_is_listed_and_pruned(self, root: Path, outside: Path) -> None:
        """A tree deeper than Python's recursion limit is listed, synced and removed without recursion."""
        save = make_save(root, "exec/a/ck-1")
        fd = os.open(save, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(1200):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.close(os.open("leaf.bin", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
        os.close(fd)
        store = PosixStore(str(root))
        files = store.files(save)
        assert [f.path for f in files] == ["d/" * 1200 + "leaf.bin", "model.bin"]
        store.sync_save(save)
        store.publish(1, 1, save)
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        before = snapshot(outside)
        assert store.prune(1).removed_folders == (save,)
        assert not os.path.lexists(save)
        assert snapshot(outside) == before


class TestFifoInASave:
    def test_nothing_waits_on_a_fifo(self, root: Path) -> None:
        """A FIFO inside a save is listed, skipped by sync_save, never opened as a file, removed by prune."""
        save = make_save(root, "exec/a/ck-1")
        os.mkfifo(os.path.join(save, "trainer_state.json"))
        store = PosixStore(str(root))
        assert [f.path for f in store.files(save)] == ["model.bin", "trainer_state.json"]
        store.sync_save(save)  # opening it to fsync it would wait for a writer forever
        assert store.read_file(save, "trainer_state.json") is None  # not a regular file: no trainer state
        assert store.exists(save, "trainer_state.json") is False
        store.publish(1, 1, save)
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        assert store.prune(1).removed_folders == (save,)


# -- real mounts, in a private mount namespace ------------------------------------------------------------

MOUNT_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from ckpt.adapters.posix import PosixStore

    case, base = sys.argv[1], sys.argv[2]
    root = os.path.join(base, "root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "ckpt-test", base], check=True)
    os.mkdir(root)

    def save(rel, files=("model.bin",)):
        path = os.path.join(root, rel)
        os.makedirs(path)
        for name in files:
            with open(os.path.join(path, name), "wb") as f:
                f.write(b"weights")
        return path

    def ckpt(*args):
        done = subprocess.run([sys.executable, "-m", "ckpt", "--root", root, *args], capture_output=True,
                              text=True, timeout=60)
        return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    store = PosixStore(root)
    out = {"root": root}
    if case == "read-only":
        store.publish(1, 1, save("exec/a/ck-1"))
        store.publish(1, 2, save("exec/a/ck-2"))
        later = save("exec/a/ck-3")
        subprocess.run(["mount", "-o", "remount,ro", base], check=True)
        out["resolve"] = ckpt("resolve")
        out["entries"] = ckpt("entries")
        out["publish"] = ckpt("publish", "--epoch", "1", "--step", "3", later)
        out["prune"] = ckpt("prune", "--keep", "1")
        out["after"] = ckpt("entries")
    elif case == "mount-point":
        mounted = save("exec/a/ck-1")
        store.publish(1, 1, mounted)
        store.publish(1, 2, save("exec/a/ck-2"))
        os.mkdir(os.path.join(mounted, "mnt"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "other-fs", os.path.join(mounted, "mnt")],
                       check=True)
        with open(os.path.join(mounted, "mnt", "precious.bin"), "wb") as f:
            f.write(b"on another file system")
        out["prune"] = ckpt("prune", "--keep", "1")
        out["kept"] = os.path.exists(os.path.join(mounted, "mnt", "precious.bin"))
        out["entries"] = ckpt("entries")
    print(json.dumps(out))
    """
)


def in_mount_namespace(tmp_path: Path, case: str) -> dict[str, Any]:
    """Run MOUNT_SCRIPT's ``case`` under ``unshare -m``: its mounts live and die with that process."""
    script = tmp_path / "mounts.py"
    script.write_text(MOUNT_SCRIPT)
    base = tmp_path / "mnt"
    base.mkdir()
    done = subprocess.run(
        ["unshare", "-m", sys.executable, str(script), case, str(base)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=str(Path(__file__).parent),
    )
    assert done.returncode == 0, done.stderr
    assert os.listdir(base) == []  # the host never saw the tmpfs
    result: dict[str, Any] = json.loads(done.stdout)
    return result


class TestReadOnlyRoot:
    def test_reads_work_and_writes_fail_with_one_line_naming_the_path(self, tmp_path: Path) -> None:
        """On a read-only root, reads work; publish and prune exit 1 saying "Read-only file system"."""
        out = in_mount_namespace(tmp_path, "read-only")
        root = out["root"]
        assert out["resolve"] == {"code": 0, "stdout": f"{root}/exec/a/ck-2\n", "stderr": ""}
        assert out["entries"]["code"] == 0
        name = format_entry_name(Entry(1, 3, "exec/a/ck-3"))
        publish = out["publish"]
        assert publish["code"] == 1
        assert (
            publish["stderr"] == f"ckpt: cannot create the entry {root}/pub/{name}: Read-only file system\n"
        )
        prune = out["prune"]
        assert prune["code"] == 1
        assert prune["stderr"].startswith(f"ckpt: cannot create the prune journal {root}/.ckpt-prune-")
        assert prune["stderr"].endswith(": Read-only file system\n")
        assert prune["stderr"].count("\n") == 1
        assert out["after"] == out["entries"]


class TestMountPointInASave:
    def test_prune_never_removes_files_on_another_file_system(self, tmp_path: Path) -> None:
        """A file system mounted in a pruned save stops the removal with an error naming the mount."""
        out = in_mount_namespace(tmp_path, "mount-point")
        root = out["root"]
        prune = out["prune"]
        assert prune["code"] == 1
        lines = prune["stderr"].splitlines()
        assert lines[0] == f"ckpt: removed entry: epoch 1 step 1 {root}/exec/a/ck-1"  # what it left first
        assert lines[-1].startswith(
            f"ckpt: cannot remove the folder {root}/exec/a/ck-1: a mount point of another file system "
            f"(prune never removes files on one) (at {root}/exec/a/ck-1/mnt)"
        )
        assert out["kept"] is True
        assert out["entries"]["stdout"] == f"1 2 {root}/exec/a/ck-2\n"


class TestPublishThroughLinks:
    def test_a_save_reached_through_a_link_publishes_and_republishing_is_exists(
        self, root: Path, outside: Path
    ) -> None:
        """A save behind a linked ancestor exists, so it publishes; nothing is written outside the root."""
        os.symlink(outside / "exec", root / "exec")
        before = snapshot(outside)
        store = PosixStore(str(root))
        store.publish(1, 1, str(root / "exec/z/ck-9"))
        with pytest.raises(ExistsError):
            store.publish(1, 1, str(root / "exec/z/ck-9"))
        assert snapshot(outside) == before
