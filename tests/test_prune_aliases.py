"""Prune never removes a folder a remaining or pinned entry reaches by another spelling (issue 19 case 1).

Entries keep the save path as it was given (spec/operations.md §1.2), so one folder can be named twice: a
linked execution folder (ADR 0004's shared-storage layout), a linked save, two links to one folder, a path
through a folder outside the root, a bind mount. Prune judges physical identity on POSIX (§5.11): every
shape below is built with real links (and real bind mounts, in a private mount namespace) on a real file
system, run through ``PosixStore`` and through the command line as a real process, and each ends with the
shared folder in place, ``resolve`` printing a path whose folder exists, and a dry run that decided the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import JOURNAL_PREFIX, PosixStore, Syscalls
from ckpt.adapters.posix.syscalls import PosixRoot
from ckpt.adapters.posix.tree import PosixTree
from ckpt.domain.entries import Entry
from ckpt.domain.errors import StorageError
from ckpt.domain.journal import DECISION_SUFFIX
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import SaveRemoval
from ckpt.domain.prune import SKIP_ANOTHER_PATH
from ckpt.domain.retention import SKIP_PINNED
from support.saves import make_save

FILES = {"model.bin": b"weights", "sub/shard.bin": b"shard"}


def ckpt(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ckpt --root ROOT ARGS`` as a real process (no CKPT_/DISPATCH_ variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    return subprocess.run(
        [sys.executable, "-m", "ckpt", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def publish(root: Path, step: int, save: str) -> None:
    """``ckpt publish --epoch 1 --step STEP SAVE``, which must succeed."""
    done = ckpt(root, "publish", "--epoch", "1", "--step", str(step), save)
    assert done.returncode == 0, done.stderr


def prune(root: Path, *args: str) -> dict[str, Any]:
    """``ckpt prune ARGS --json``, which must succeed; its document."""
    done = ckpt(root, "--json", "prune", *args)
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def skipped(document: dict[str, Any]) -> dict[str, str]:
    return {s["location"]: s["reason"] for s in document["skipped"]}


def resolved_folder(root: Path) -> Path:
    """What ``ckpt resolve`` prints, asserted to be a folder that still holds its files."""
    done = ckpt(root, "resolve")
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.is_dir(), f"resolve printed {folder}, whose folder is gone"
    assert (folder / "model.bin").read_bytes() == b"weights"
    return folder


def prune_twice(root: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dry run, then the prune; both documents (the dry run must change nothing)."""
    before = sorted(str(p) for p in root.rglob("*"))
    dry = prune(root, "--keep", "1", *args, "--dry-run")
    assert sorted(str(p) for p in root.rglob("*")) == before
    return dry, prune(root, "--keep", "1", *args)


def tree_of(path: Path) -> dict[str, bytes | str]:
    """Everything under ``path`` without following links: files' bytes, links' targets, folders."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            if os.path.islink(full):
                out[rel] = "link -> " + os.readlink(full)
            elif os.path.isdir(full):
                out[rel] = "dir"
            else:
                out[rel] = Path(full).read_bytes()
    return out


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty checkpoint root on the test's file system (a real disk: these tests fsync little)."""
    folder = tmp_path / "root"
    folder.mkdir()
    return folder


class TestLinkedExecutionFolder:
    def test_the_issues_sequence_keeps_the_folder_step_9_names(self, root: Path) -> None:
        """exec/a1 -> real; step 5 as exec/real/ck-5, step 9 as exec/a1/ck-5; prune --keep 1 keeps ck-5."""
        make_save(root, "exec/real/ck-5", FILES)
        os.symlink("real", root / "exec" / "a1")
        publish(root, 5, "exec/real/ck-5")
        publish(root, 9, "exec/a1/ck-5")
        dry, done = prune_twice(root)
        shared = f"{root}/exec/real/ck-5"
        assert skipped(dry) == skipped(done) == {shared: SKIP_ANOTHER_PATH}
        assert dry["removed_folders"] == done["removed_folders"] == []
        assert [e["step"] for e in done["removed_entries"]] == [5]
        assert tree_of(root / "exec" / "real" / "ck-5") == {
            "model.bin": b"weights",
            "sub": "dir",
            "sub/shard.bin": b"shard",
        }
        assert resolved_folder(root) == root / "exec" / "a1" / "ck-5"

    def test_the_store_reports_it_and_a_later_prune_still_keeps_it(self, root: Path) -> None:
        """Through PosixStore: the skip is reported; with step 5 gone a second prune has nothing to do."""
        make_save(root, "exec/real/ck-5")
        os.symlink("real", root / "exec" / "a1")
        store = PosixStore(str(root))
        store.publish(1, 5, f"{root}/exec/real/ck-5")
        store.publish(1, 9, f"{root}/exec/a1/ck-5")
        result = store.prune(1)
        assert [(s.location, s.reason) for s in result.skipped] == [
            (f"{root}/exec/real/ck-5", SKIP_ANOTHER_PATH)
        ]
        assert result.removed_entries == (Entry(1, 5, "exec/real/ck-5"),)
        assert store.prune(1).skipped == ()
        assert (root / "exec" / "real" / "ck-5" / "model.bin").is_file()


class TestLinkedSave:
    @pytest.mark.parametrize("execution", ["exec/a1", "exec/linked"], ids=["plain-exec", "linked-exec"])
    def test_a_save_that_is_a_link_keeps_the_folder_it_points_to(self, root: Path, execution: str) -> None:
        """ln -s ck-6 <exec>/ck-7; step 6 as ck-6, step 7 as ck-7: prune keeps ck-6 (exec/ linked or not)."""
        make_save(root, "exec/a1/ck-6", FILES)
        if execution == "exec/linked":
            os.symlink("a1", root / "exec" / "linked")
        os.symlink("ck-6", root / "exec" / "a1" / "ck-7")
        publish(root, 6, f"{execution}/ck-6")
        publish(root, 7, f"{execution}/ck-7")
        dry, done = prune_twice(root)
        reason = SKIP_ANOTHER_PATH
        assert skipped(dry) == skipped(done) == {f"{root}/{execution}/ck-6": reason}
        assert (root / "exec" / "a1" / "ck-6" / "sub" / "shard.bin").read_bytes() == b"shard"
        assert resolved_folder(root) == root / execution / "ck-7"


class TestLinkedSingleFileSave:
    def test_a_last_ckpt_link_keeps_the_file_it_points_to(self, root: Path) -> None:
        """Lightning's ``last.ckpt`` as a link to ``epoch=1.ckpt``: pruning the older entry keeps the file."""
        (root / "exec" / "a").mkdir(parents=True)
        (root / "exec" / "a" / "epoch=1.ckpt").write_bytes(b"weights")
        os.symlink("epoch=1.ckpt", root / "exec" / "a" / "last.ckpt")
        publish(root, 1, "exec/a/epoch=1.ckpt")
        publish(root, 2, "exec/a/last.ckpt")
        dry, done = prune_twice(root)
        assert skipped(dry) == skipped(done) == {f"{root}/exec/a/epoch=1.ckpt": SKIP_ANOTHER_PATH}
        assert (root / "exec" / "a" / "last.ckpt").read_bytes() == b"weights"
        resolved = ckpt(root, "resolve")
        assert resolved.stdout == f"{root}/exec/a/last.ckpt\n", resolved.stderr


class TestLinkedFolderInsideASave:
    def test_pruning_the_save_removes_the_link_as_a_name_and_the_kept_save_survives(self, root: Path) -> None:
        """ck-1 holds links into the kept ck-2: ck-1 goes, links as names; ck-2 (where they point) stays."""
        one = make_save(root, "exec/a/ck-1", FILES)
        make_save(root, "exec/a/ck-2", FILES)
        os.symlink("../ck-2", os.path.join(one, "latest"))
        os.symlink(f"{root}/exec/a/ck-2/sub", os.path.join(one, "sub", "shared"))
        publish(root, 1, "exec/a/ck-1")
        publish(root, 2, "exec/a/ck-2")
        kept = tree_of(root / "exec" / "a" / "ck-2")
        dry, done = prune_twice(root)
        assert dry["removed_folders"] == done["removed_folders"] == [one]
        assert skipped(dry) == skipped(done) == {}
        assert not os.path.lexists(one)
        assert tree_of(root / "exec" / "a" / "ck-2") == kept
        assert resolved_folder(root) == root / "exec" / "a" / "ck-2"


class TestLinkOutsideTheRoot:
    def test_a_kept_save_reached_through_a_folder_outside_the_root(self, root: Path, tmp_path: Path) -> None:
        """exec/out -> /outside, whose ck-5 links back to exec/real/ck-5: that folder stays; nothing outside
        the root is touched."""
        outside = tmp_path / "outside"
        outside.mkdir()
        (outside / "precious.bin").write_bytes(b"keep me")
        make_save(root, "exec/real/ck-5", FILES)
        os.symlink(root / "exec" / "real" / "ck-5", outside / "ck-5")
        os.symlink(outside, root / "exec" / "out")
        publish(root, 5, "exec/real/ck-5")
        publish(root, 9, "exec/out/ck-5")
        before = tree_of(outside)
        dry, done = prune_twice(root)
        assert skipped(dry) == skipped(done) == {f"{root}/exec/real/ck-5": SKIP_ANOTHER_PATH}
        assert tree_of(outside) == before
        assert resolved_folder(root) == root / "exec" / "out" / "ck-5"

    def test_a_removed_entry_through_a_link_out_never_touches_what_it_points_to(
        self, root: Path, tmp_path: Path
    ) -> None:
        """Step 5 as exec/out/ck-5 (a folder outside), step 9 as another link to it: both spared, outside
        untouched."""
        outside = tmp_path / "outside"
        make_save(outside, "ck-5", FILES)
        (root / "exec" / "a").mkdir(parents=True)
        os.symlink(outside, root / "exec" / "out")
        os.symlink(outside / "ck-5", root / "exec" / "a" / "ck-9")
        publish(root, 5, "exec/out/ck-5")
        publish(root, 9, "exec/a/ck-9")
        before = tree_of(outside)
        dry, done = prune_twice(root)
        assert skipped(dry) == skipped(done) == {f"{root}/exec/out/ck-5": SKIP_ANOTHER_PATH}
        assert tree_of(outside) == before
        assert resolved_folder(root) == root / "exec" / "a" / "ck-9"


class TestTwoLinksToOneFolder:
    def test_neither_spelling_of_the_kept_folder_is_removed(self, root: Path) -> None:
        """exec/a1 and exec/a2 -> real; steps 5, 7, 9 name one folder three ways: prune removes no folder."""
        make_save(root, "exec/real/ck-5", FILES)
        os.symlink("real", root / "exec" / "a1")
        os.symlink("real", root / "exec" / "a2")
        publish(root, 5, "exec/real/ck-5")
        publish(root, 7, "exec/a1/ck-5")
        publish(root, 9, "exec/a2/ck-5")
        dry, done = prune_twice(root)
        expected = {f"{root}/exec/a1/ck-5": SKIP_ANOTHER_PATH, f"{root}/exec/real/ck-5": SKIP_ANOTHER_PATH}
        assert skipped(dry) == skipped(done) == expected
        assert [e["step"] for e in done["removed_entries"]] == [5, 7]
        assert done["removed_folders"] == []
        assert resolved_folder(root) == root / "exec" / "a2" / "ck-5"


class TestPhysicalOverlapShapes:
    @pytest.mark.parametrize(
        ("removed", "kept"),
        [
            ("exec/real/ck-5", "exec/a1/ck-5"),  # the candidate IS the kept save
            ("exec/real", "exec/a1/ck-5"),  # the candidate CONTAINS it
            ("exec/real/ck-5/sub", "exec/a1/ck-5"),  # the candidate lies INSIDE it
        ],
        ids=["is", "contains", "inside"],
    )
    def test_a_candidate_physically_overlapping_a_kept_save_stays(
        self, root: Path, removed: str, kept: str
    ) -> None:
        """Whether the removed entry's folder is, contains or lies inside the kept save's, it stays."""
        make_save(root, "exec/real/ck-5", FILES)
        os.symlink("real", root / "exec" / "a1")
        store = PosixStore(str(root))
        store.publish(1, 5, f"{root}/{removed}")
        store.publish(1, 9, f"{root}/{kept}")
        dry = store.prune(1, dry_run=True)
        result = store.prune(1)
        assert dry.skipped == result.skipped
        assert [(s.location, s.reason) for s in result.skipped] == [(f"{root}/{removed}", SKIP_ANOTHER_PATH)]
        assert dry.removed_folders == result.removed_folders == ()
        assert tree_of(root / "exec" / "real" / "ck-5")["sub/shard.bin"] == b"shard"

    def test_a_pin_reaching_the_folder_by_another_path_keeps_it(self, root: Path) -> None:
        """A pinned entry (not the latest) named through the link keeps the folder a removed entry names."""
        make_save(root, "exec/real/ck-5", FILES)
        make_save(root, "exec/real/ck-10")
        os.symlink("real", root / "exec" / "a1")
        store = PosixStore(str(root))
        store.publish(1, 5, f"{root}/exec/real/ck-5")
        pinned = store.publish(1, 9, f"{root}/exec/a1/ck-5")
        store.publish(1, 10, f"{root}/exec/real/ck-10")
        assert store.pin(pinned)
        result = store.prune(1)
        assert result.removed_entries == (Entry(1, 5, "exec/real/ck-5"),)
        assert [(s.location, s.reason) for s in result.skipped] == [
            (f"{root}/exec/real/ck-5", SKIP_ANOTHER_PATH)
        ]
        assert (root / "exec" / "real" / "ck-5" / "model.bin").is_file()

    def test_an_unrelated_folder_is_still_removed(self, root: Path) -> None:
        """Physical identity keeps only what a needed save reaches: a sibling folder still goes."""
        make_save(root, "exec/real/ck-4")
        make_save(root, "exec/real/ck-5")
        os.symlink("real", root / "exec" / "a1")
        store = PosixStore(str(root))
        store.publish(1, 4, f"{root}/exec/real/ck-4")
        store.publish(1, 9, f"{root}/exec/a1/ck-5")
        result = store.prune(1)
        assert result.removed_folders == (f"{root}/exec/real/ck-4",)
        assert result.skipped == ()


class _PublishesAfterThePlan(PosixStore):
    """A POSIX store that runs a queued step right after a listing of pins/ (the plan's, then the re-read's).

    It forces the interleaving "an entry is published between the plan and the re-check" step by step; the
    store's own flow is unchanged.
    """

    __slots__ = ("after_pin_listing",)

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.after_pin_listing: list[Any] = []

    def pin_names(self) -> list[str]:
        listed = super().pin_names()
        if self.after_pin_listing:
            self.after_pin_listing.pop(0)()
        return listed


class TestAliasPublishedDuringThePrune:
    def test_the_recheck_keeps_a_folder_an_alias_entry_published_meanwhile_names(self, root: Path) -> None:
        """After the plan, step 7 is published as exec/a1/ck-5: the re-check keeps exec/real/ck-5."""
        make_save(root, "exec/real/ck-5", FILES)
        make_save(root, "exec/real/ck-6")
        os.symlink("real", root / "exec" / "a1")
        store = _PublishesAfterThePlan(str(root))
        store.publish(1, 5, f"{root}/exec/real/ck-5")
        store.publish(1, 6, f"{root}/exec/real/ck-6")
        store.after_pin_listing.append(lambda: store.publish(1, 7, f"{root}/exec/a1/ck-5"))
        result = store.prune(1)
        assert result.removed_entries == (Entry(1, 5, "exec/real/ck-5"),)
        assert result.removed_folders == ()
        assert [(s.location, s.reason) for s in result.skipped] == [
            (f"{root}/exec/real/ck-5", SKIP_ANOTHER_PATH)
        ]
        assert store.resolve() == Entry(1, 7, "exec/a1/ck-5")
        assert (root / "exec" / "real" / "ck-5" / "sub" / "shard.bin").read_bytes() == b"shard"
        assert [name for name in os.listdir(root) if name.startswith(".ckpt-prune-")] == []

    def test_a_pin_made_meanwhile_is_reported_as_a_pin(self, root: Path) -> None:
        """A folder a pin made during the prune names as text is reported as pinned, not as an alias."""
        make_save(root, "exec/real/ck-5")
        make_save(root, "exec/real/ck-6")
        store = _PublishesAfterThePlan(str(root))
        five = store.publish(1, 5, f"{root}/exec/real/ck-5")
        store.publish(1, 6, f"{root}/exec/real/ck-6")
        store.after_pin_listing.append(lambda: store.create_pin(format_entry_name(five)))
        result = store.prune(1)
        assert [(s.location, s.reason) for s in result.skipped] == [(f"{root}/exec/real/ck-5", SKIP_PINNED)]


# -- bind mounts, in a private mount namespace (as tests/test_hostile_trees.py) -----------------------------

BIND_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys

    base = sys.argv[1]
    root = os.path.join(base, "root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "ckpt-test", base], check=True)
    os.makedirs(os.path.join(root, "exec", "a", "ck-5", "sub"))
    os.makedirs(os.path.join(root, "exec", "b"))
    for name in ("model.bin", "sub/shard.bin"):
        with open(os.path.join(root, "exec", "a", "ck-5", name), "wb") as f:
            f.write(b"weights")
    # exec/b is exec/a again: the same file system, so the same device number, and realpath sees no link.
    subprocess.run(["mount", "--bind", os.path.join(root, "exec", "a"), os.path.join(root, "exec", "b")],
                   check=True)

    def ckpt(*args):
        done = subprocess.run([sys.executable, "-m", "ckpt", "--root", root, *args], capture_output=True,
                              text=True, timeout=60)
        return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    out = {"root": root}
    out["publish-5"] = ckpt("publish", "--epoch", "1", "--step", "5", "exec/a/ck-5")
    out["publish-9"] = ckpt("publish", "--epoch", "1", "--step", "9", "exec/b/ck-5")
    out["dry"] = ckpt("--json", "prune", "--keep", "1", "--dry-run")
    out["prune"] = ckpt("--json", "prune", "--keep", "1")
    out["resolve"] = ckpt("resolve")
    out["left"] = sorted(os.listdir(os.path.join(root, "exec", "a", "ck-5")))
    out["shard"] = open(os.path.join(root, "exec", "b", "ck-5", "sub", "shard.bin"), "rb").read().decode()
    print(json.dumps(out))
    """
)


class TestBindMount:
    def test_prune_keeps_a_folder_a_bind_mount_shows_at_another_path(self, tmp_path: Path) -> None:
        """exec/b is a bind mount of exec/a: step 5 as exec/a/ck-5, step 9 as exec/b/ck-5; ck-5 stays."""
        script = tmp_path / "bind.py"
        script.write_text(BIND_SCRIPT)
        base = tmp_path / "mnt"
        base.mkdir()
        done = subprocess.run(
            ["unshare", "-m", sys.executable, str(script), str(base)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert os.listdir(base) == []  # the host never saw the mounts
        out = json.loads(done.stdout)
        root = out["root"]
        for step in ("publish-5", "publish-9", "dry", "prune", "resolve"):
            assert out[step]["code"] == 0, (step, out[step]["stderr"])
        dry, pruned = json.loads(out["dry"]["stdout"]), json.loads(out["prune"]["stdout"])
        expected = [{"location": f"{root}/exec/a/ck-5", "reason": SKIP_ANOTHER_PATH}]
        assert dry["skipped"] == pruned["skipped"] == expected
        assert dry["removed_folders"] == pruned["removed_folders"] == []
        assert out["resolve"]["stdout"] == f"{root}/exec/b/ck-5\n"
        assert out["left"] == ["model.bin", "sub"]
        assert out["shard"] == "weights"


# -- a needed save reached from inside a candidate: the removal never enters it (§5.11) --------------------


def posix_tree(root: Path) -> PosixTree:
    """The POSIX tree over ``root`` with the real system calls."""
    return PosixTree(PosixRoot(str(root), Syscalls()))


def identity(path: Path) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of ``path``, not following a link: what ``physical_chains`` gives."""
    st = os.lstat(path)
    return (st.st_dev, st.st_ino)


def journals(root: Path) -> list[str]:
    """The prune journals in the root (their decisions left out)."""
    return [n for n in os.listdir(root) if n.startswith(JOURNAL_PREFIX) and not n.endswith(DECISION_SUFFIX)]


SPARED_FOLDER = (
    "is, or holds, the folder of a remaining entry by another path (a bind mount?); prune never removes "
    "through it"
)
SPARED_FILE = "is the file of a remaining entry by another path (a hard link); prune never removes it"


class TestRemovalSparesIdentities:
    def test_the_walk_never_enters_a_folder_whose_identity_is_spared(self, root: Path) -> None:
        """A sub-folder with a spared identity stops the removal, naming it; nothing in it is removed."""
        make_save(root, "exec/b/ck-1", {"model.bin": b"old", "keep/sub/shard.bin": b"shard", "aa/x": b"x"})
        keep = root / "exec" / "b" / "ck-1" / "keep"
        before = tree_of(keep)
        with pytest.raises(StorageError) as caught:
            posix_tree(root).remove_saves_sparing(["exec/b/ck-1"], {identity(keep)})
        assert str(caught.value) == f"cannot remove the folder {root}/exec/b/ck-1: {keep} {SPARED_FOLDER}"
        assert caught.value.location == f"{root}/exec/b/ck-1"
        assert tree_of(keep) == before
        assert not (root / "exec" / "b" / "ck-1" / "model.bin").exists()  # the candidate's own file went

    def test_without_a_spared_identity_the_same_tree_is_removed(self, root: Path) -> None:
        """The control: an identity elsewhere spares nothing here, and the whole folder goes."""
        make_save(root, "exec/b/ck-1", {"model.bin": b"old", "keep/sub/shard.bin": b"shard"})
        elsewhere = Path(make_save(root, "exec/a/ck-5"))
        outcomes = posix_tree(root).remove_saves_sparing(["exec/b/ck-1"], {identity(elsewhere)})
        assert outcomes == [SaveRemoval("exec/b/ck-1")]
        assert not (root / "exec" / "b" / "ck-1").exists()

    def test_the_candidate_itself_spared_is_left_whole(self, root: Path) -> None:
        """A candidate whose own identity is spared (judged before, changed since) loses nothing."""
        candidate = Path(make_save(root, "exec/b/ck-1", FILES))
        with pytest.raises(StorageError, match="prune never removes through it"):
            posix_tree(root).remove_saves_sparing(["exec/b/ck-1"], {identity(candidate)})
        assert tree_of(candidate) == {"model.bin": b"weights", "sub": "dir", "sub/shard.bin": b"shard"}

    def test_a_file_whose_identity_is_spared_is_never_unlinked(self, root: Path) -> None:
        """A hard link inside the candidate to a spared single-file save stops the removal, naming it."""
        (root / "exec" / "a").mkdir(parents=True)
        kept = root / "exec" / "a" / "last.ckpt"
        kept.write_bytes(b"weights")
        make_save(root, "exec/b/ck-1")
        link = root / "exec" / "b" / "ck-1" / "copy.ckpt"
        os.link(kept, link)
        with pytest.raises(StorageError) as caught:
            posix_tree(root).remove_saves_sparing(["exec/b/ck-1"], {identity(kept)})
        assert str(caught.value) == f"cannot remove the folder {root}/exec/b/ck-1: {link} {SPARED_FILE}"
        assert os.stat(kept).st_nlink == 2

    def test_a_single_file_save_whose_identity_is_spared_is_never_unlinked(self, root: Path) -> None:
        """A single-file candidate that is a hard link of a spared file is left."""
        (root / "exec" / "a").mkdir(parents=True)
        kept = root / "exec" / "a" / "last.ckpt"
        kept.write_bytes(b"weights")
        os.link(kept, root / "exec" / "a" / "epoch=1.ckpt")
        with pytest.raises(StorageError, match="a hard link"):
            posix_tree(root).remove_saves_sparing(["exec/a/epoch=1.ckpt"], {identity(kept)})
        assert (root / "exec" / "a" / "epoch=1.ckpt").read_bytes() == b"weights"


class TestHardLinkInsideACandidate:
    def test_prune_stops_keeps_the_journal_and_finishes_once_the_link_is_gone(self, root: Path) -> None:
        """ck-1 holds a hard link of the kept single-file save last.ckpt: prune stops, the next finishes."""
        (root / "exec" / "a").mkdir(parents=True)
        kept = root / "exec" / "a" / "last.ckpt"
        kept.write_bytes(b"weights")
        make_save(root, "exec/b/ck-1")
        os.link(kept, root / "exec" / "b" / "ck-1" / "copy.ckpt")
        store = PosixStore(str(root))
        store.publish(1, 1, f"{root}/exec/b/ck-1")
        store.publish(1, 2, str(kept))
        with pytest.raises(StorageError) as caught:
            store.prune(1)
        assert f"{root}/exec/b/ck-1/copy.ckpt {SPARED_FILE}" in str(caught.value)
        assert "the next prune removes them" in str(caught.value)
        assert len(journals(root)) == 1
        assert os.stat(kept).st_nlink == 2
        os.unlink(root / "exec" / "b" / "ck-1" / "copy.ckpt")  # what the operator does
        result = store.prune(1)
        assert result.removed_folders == (f"{root}/exec/b/ck-1",)
        assert journals(root) == []
        assert kept.read_bytes() == b"weights"


SPARE_SCRIPT = textwrap.dedent(
    """
    import json, os, subprocess, sys

    case, base = sys.argv[1], sys.argv[2]
    root = os.path.join(base, "root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "ckpt-test", base], check=True)

    def write(save, name, data):
        path = os.path.join(root, save, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def tree(path):
        out = {}
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                full = os.path.join(dirpath, name)
                out[os.path.relpath(full, path)] = "dir" if os.path.isdir(full) else open(full).read()
        return out

    def ckpt(*args):
        done = subprocess.run([sys.executable, "-m", "ckpt", "--root", root, *args], capture_output=True,
                              text=True, timeout=60)
        return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}

    write("exec/a/ck-5", "model.bin", b"weights")
    write("exec/a/ck-5", "sub/shard.bin", b"shard")
    write("exec/a", "notes.txt", b"beside the save")
    write("exec/b/ck-1", "model.bin", b"old")
    write("exec/b/ck-1", "zz/old.bin", b"old")
    os.makedirs(os.path.join(root, "exec", "b", "ck-1", "data"))
    # ck-1/data is the needed save (or the folder holding it) again: the same file system and device
    # number, so the removal's mount point check cannot tell; only its identity can.
    source = "exec/a" if case == "holder" else "exec/a/ck-5"
    mount_point = os.path.join(root, "exec", "b", "ck-1", "data")
    subprocess.run(["mount", "--bind", os.path.join(root, source), mount_point], check=True)
    out = {"root": root}
    out["publish-1"] = ckpt("publish", "--epoch", "1", "--step", "1", "exec/b/ck-1")
    out["publish-5"] = ckpt("publish", "--epoch", "1", "--step", "5", "exec/a/ck-5")
    if case == "pin":  # ck-5 is kept by its pin only: step 9 is the latest
        write("exec/c/ck-9", "model.bin", b"newer")
        out["publish-9"] = ckpt("publish", "--epoch", "1", "--step", "9", "exec/c/ck-9")
        out["pin"] = ckpt("pin", "--epoch", "1", "--step", "5")
    out["before"] = tree(os.path.join(root, "exec", "a"))
    out["prune"] = ckpt("--json", "prune", "--keep", "1")
    out["after"] = tree(os.path.join(root, "exec", "a"))
    out["journals"] = [n for n in os.listdir(root) if n.startswith(".ckpt-prune-") and "." not in n[1:]]
    out["entries"] = ckpt("entries")
    subprocess.run(["umount", mount_point], check=True)
    out["again"] = ckpt("--json", "prune", "--keep", "1")
    out["finally"] = tree(os.path.join(root, "exec", "a"))
    out["journals-finally"] = [n for n in os.listdir(root) if n.startswith(".ckpt-prune-")]
    out["candidate-finally"] = os.path.lexists(os.path.join(root, "exec", "b", "ck-1"))
    print(json.dumps(out))
    """
)


class TestBindMountInsideACandidate:
    @pytest.mark.parametrize("case", ["save", "holder", "pin"])
    def test_prune_never_removes_through_a_bind_mount_of_it(self, tmp_path: Path, case: str) -> None:
        """ck-1/data is a bind mount of the kept ck-5 (or of exec/a holding it, or of a pin's save): prune
        stops naming it, ck-5 and exec/a lose nothing, the journal stays; after umount a prune finishes."""
        script = tmp_path / "spare.py"
        script.write_text(SPARE_SCRIPT)
        base = tmp_path / "mnt"
        base.mkdir()
        done = subprocess.run(
            ["unshare", "-m", sys.executable, str(script), case, str(base)],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert os.listdir(base) == []  # the host never saw the mounts
        out = json.loads(done.stdout)
        root = out["root"]
        for step in ("publish-1", "publish-5", "publish-9", "pin", "entries", "again"):
            if step in out:
                assert out[step]["code"] == 0, (step, out[step]["stderr"])
        assert out["before"]["ck-5/sub/shard.bin"] == "shard"
        assert out["after"] == out["before"], "prune removed files of the needed save through the bind mount"
        assert out["prune"]["code"] == 1, out["prune"]
        error = out["prune"]["stderr"]
        assert (
            f"cannot remove the folder {root}/exec/b/ck-1: {root}/exec/b/ck-1/data {SPARED_FOLDER}" in error
        )
        assert len(out["journals"]) == 1
        assert f"listed in {root}/{out['journals'][0]}" in error
        assert f"{root}/exec/a/ck-5" in out["entries"]["stdout"]
        again = json.loads(out["again"]["stdout"])
        assert again["removed_folders"] == [f"{root}/exec/b/ck-1"]
        assert out["finally"] == out["before"]
        assert out["journals-finally"] == []
        assert out["candidate-finally"] is False
