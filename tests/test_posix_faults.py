"""The POSIX store under failing system calls: every call of publish, prune and the reads, failed in turn.

Each operation's calls are written out below, in order, as the store makes them; a test proves the list is
complete (it is what a fault-free run records). Every call is then failed with EIO, ENOSPC, EACCES and EROFS
(``support.faulty_syscalls.FaultySyscalls``: the real calls on real files, the chosen one failing) and the
outcome checked:

- the error is a ``StorageError`` whose message names the path involved and the reason;
- publish: an entry whose creation was reported as failed never resolves afterwards, except in the cases
  docs/adr/0003-publish-durability.md documents, asserted exactly here;
- prune: no folder a remaining entry names was touched, nothing outside the root was, and running prune
  again without faults finishes the job (the folders a failed prune left are removed; docs/adr/0004).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import NamedTuple

import pytest

from ckpt.adapters.posix import JOURNAL_PREFIX, PosixStore, Syscalls
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CkptError, ExistsError, StorageError
from ckpt.domain.journal import TEMPORARY_MARK
from ckpt.domain.names import format_entry_name
from support.faulty_syscalls import Call, FaultySyscalls
from support.saves import make_save

ERRORS = [errno.EIO, errno.ENOSPC, errno.EACCES, errno.EROFS]
ERROR_IDS = [errno.errorcode[e] for e in ERRORS]

SAVE = "exec/a/ck-1"
ENTRY = Entry(1, 1, SAVE)
ENTRY_NAME = format_entry_name(ENTRY)


def tree(path: Path) -> dict[str, str]:
    """Everything under ``path`` without following links: relative path -> kind and content."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, path)
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                out[rel] = "link -> " + os.readlink(full)
            elif stat.S_ISDIR(mode):
                out[rel] = "dir"
            elif stat.S_ISREG(mode):
                out[rel] = "file " + Path(full).read_bytes().decode(errors="replace")
            else:
                out[rel] = f"other {stat.S_IFMT(mode):o}"  # a FIFO: never opened
    return out


def assert_names(error: BaseException, *paths: str, err: int) -> None:
    """The error is ours, one of the storage kind, and its message names every path and the reason."""
    assert isinstance(error, StorageError), repr(error)
    message = str(error)
    for path in paths:
        assert path in message, (path, message)
    assert os.strerror(err) in message, message


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
    """A sentinel folder beside the root that nothing may touch."""
    o = scratch / "outside"
    o.mkdir()
    (o / "precious.bin").write_bytes(b"keep me")
    return o


# -- publish ---------------------------------------------------------------------------------------------

REFUSED = "refused"  # publish raises; no entry was created
UNDONE = "undone"  # publish raises; the entry it created was removed again
PUBLISHED = "published"  # publish returns: the failing call cannot have lost anything (a read-only close)


class Step(NamedTuple):
    """One system call of an operation: what it does, the call, and what a fault in it leads to."""

    name: str
    operation: str
    target: str  # relative to the root; "." is the root, <entry> the entry's name
    outcome: str
    error_path: str = ""  # the path the error must name (relative to the root), when not the target


# A first publish (pub/ does not exist yet), call by call.
PUBLISH_STEPS = [
    Step("stat of the save", "stat", SAVE, REFUSED),
    Step("open of pub/, missing", "open", "pub", REFUSED),
    Step("mkdir of pub/", "mkdir", "pub", REFUSED),
    Step("open of the root to sync it after mkdir", "open", ".", REFUSED),
    Step("fsync of the root after mkdir", "fsync", ".", REFUSED),
    Step("close of the root after mkdir", "close", ".", PUBLISHED),
    Step("open of pub/ without following a link", "open", "pub", REFUSED),
    Step("O_EXCL create of the entry", "open", "pub/<entry>", REFUSED),
    Step("fsync of the entry", "fsync", "pub/<entry>", UNDONE),
    Step("close of the entry", "close", "pub/<entry>", UNDONE),
    Step("fsync of pub/", "fsync", "pub", UNDONE),
    Step("open of the root to sync it", "open", ".", UNDONE),
    Step("fsync of the root", "fsync", ".", UNDONE),
    Step("close of the root", "close", ".", PUBLISHED),
    Step("close of pub/", "close", "pub", PUBLISHED),
]
UNDONE_STEPS = [i for i, step in enumerate(PUBLISH_STEPS) if step.outcome == UNDONE]


def nth(steps: list[Step], index: int) -> int:
    """Which call of its operation step ``index`` is (counting from 1)."""
    return sum(1 for s in steps[: index + 1] if s.operation == steps[index].operation)


# The stat of each ancestor of the root up to /, as many as the root is deep here: one step in the lists.
ABOVE_ROOT = "<above-root>"


def recorded(calls: list[Call]) -> list[tuple[str, str]]:
    """Recorded calls with the entry and journal names written as placeholders, and the stats of the
    root's ancestors (targets ``..``, ``../..``, ...) as one :data:`ABOVE_ROOT` step."""
    out: list[tuple[str, str]] = []
    for operation, target in calls:
        written = re.sub(re.escape(JOURNAL_PREFIX) + "[0-9a-f]+", "<journal>", target)
        written = re.sub(re.escape(TEMPORARY_MARK) + "[0-9a-f]+", TEMPORARY_MARK + "<hex>", written)
        for placeholder, name in PLACEHOLDERS.items():
            written = written.replace(name, placeholder)
        if operation == "stat" and written.split("/")[0] == "..":
            if out[-1] == ("stat", ABOVE_ROOT):
                continue
            written = ABOVE_ROOT
        out.append((operation, written))
    return out


def call_number(steps: list[Step], index: int, root: Path) -> int:
    """Which call of its operation step ``index`` is, counting each :data:`ABOVE_ROOT` step as the stats it
    stands for (one per ancestor of the root); for that step itself, the first of them."""
    above = len(Path(os.path.realpath(root)).parents)
    step = steps[index]
    expanded = sum(1 for s in steps[:index] if (s.operation, s.target) == (step.operation, ABOVE_ROOT))
    return nth(steps, index) + expanded * (above - 1)


def absolute(root: Path, target: str) -> str:
    rel = target.replace("<entry>", ENTRY_NAME)
    return str(root) if rel == "." else f"{root}/{rel}"


class TestPublishSteps:
    def test_the_steps_are_every_call_a_first_publish_makes(self, root: Path) -> None:
        """The steps listed are exactly the system calls a fault-free first publish makes, in order."""
        make_save(root, SAVE)
        calls = FaultySyscalls(str(root))
        PosixStore(str(root), syscalls=calls).publish(1, 1, str(root / SAVE))
        assert recorded(calls.calls) == [(s.operation, s.target) for s in PUBLISH_STEPS]

    @pytest.mark.parametrize("err", ERRORS, ids=ERROR_IDS)
    @pytest.mark.parametrize("index", range(len(PUBLISH_STEPS)), ids=[s.name for s in PUBLISH_STEPS])
    def test_a_fault_in_each_step(self, root: Path, outside: Path, index: int, err: int) -> None:
        """A failed step is a clear StorageError and leaves no entry; a failed read-only close is harmless."""
        step = PUBLISH_STEPS[index]
        make_save(root, SAVE)
        before = tree(outside)
        calls = FaultySyscalls(str(root))
        calls.fail(step.operation, nth(PUBLISH_STEPS, index), err)
        store = PosixStore(str(root), syscalls=calls)
        if step.outcome == PUBLISHED:
            assert store.publish(1, 1, str(root / SAVE)) == ENTRY
            assert PosixStore(str(root)).resolve() == ENTRY
            return
        with pytest.raises(StorageError) as caught:
            store.publish(1, 1, str(root / SAVE))
        assert_names(caught.value, absolute(root, step.target), err=err)
        if step.outcome == UNDONE:
            assert_names(caught.value, absolute(root, "pub/<entry>"), err=err)
            assert "the entry was removed again" in str(caught.value)
        assert PosixStore(str(root)).resolve() is None
        assert PosixStore(str(root)).entries() == []
        assert tree(outside) == before
        # Nothing is left half-done: the same publish, retried without faults, succeeds.
        assert PosixStore(str(root)).publish(1, 1, str(root / SAVE)) == ENTRY


class TestPublishUndo:
    @pytest.mark.parametrize("err", ERRORS, ids=ERROR_IDS)
    @pytest.mark.parametrize("index", UNDONE_STEPS, ids=[PUBLISH_STEPS[i].name for i in UNDONE_STEPS])
    def test_when_the_undo_fails_too_the_entry_remains_and_the_error_says_so(
        self, root: Path, index: int, err: int
    ) -> None:
        """The documented case: a step after the create fails and so does the unlink undoing it."""
        step = PUBLISH_STEPS[index]
        make_save(root, SAVE)
        calls = FaultySyscalls(str(root))
        calls.fail(step.operation, nth(PUBLISH_STEPS, index), errno.EIO)
        calls.fail("unlink", 1, err)
        with pytest.raises(StorageError) as caught:
            PosixStore(str(root), syscalls=calls).publish(1, 1, str(root / SAVE))
        message = str(caught.value)
        assert_names(caught.value, absolute(root, "pub/<entry>"), str(root / SAVE), err=err)
        assert f"removing the entry again failed too ({os.strerror(err)}), so it may remain" in message
        store = PosixStore(str(root))
        assert store.resolve() == ENTRY  # it remains, and it names the complete save
        with pytest.raises(ExistsError):
            store.publish(1, 1, str(root / SAVE))

    @pytest.mark.parametrize("index", UNDONE_STEPS, ids=[PUBLISH_STEPS[i].name for i in UNDONE_STEPS])
    def test_an_undo_whose_sync_fails_has_still_removed_the_entry(self, root: Path, index: int) -> None:
        """If only the fsync of pub/ after the undo's unlink fails, the entry is gone all the same."""
        step = PUBLISH_STEPS[index]
        make_save(root, SAVE)
        calls = FaultySyscalls(str(root))
        calls.fail(step.operation, nth(PUBLISH_STEPS, index), errno.EIO)
        calls.fail("fsync", calls_of("fsync", PUBLISH_STEPS[: index + 1]) + 1, errno.EIO)
        with pytest.raises(StorageError, match="the entry was removed again"):
            PosixStore(str(root), syscalls=calls).publish(1, 1, str(root / SAVE))
        undo = calls.calls.index(Call("unlink", f"pub/{ENTRY_NAME}"))
        assert calls.calls[undo + 1] == Call("fsync", "pub")
        assert PosixStore(str(root)).resolve() is None

    def test_the_undo_removes_only_the_entry_it_created(self, root: Path) -> None:
        """The undo unlinks exactly the new name, relative to the pub/ descriptor, and nothing else."""
        make_save(root, SAVE)
        make_save(root, "exec/a/ck-0")
        PosixStore(str(root)).publish(1, 0, str(root / "exec/a/ck-0"))
        calls = FaultySyscalls(str(root))
        calls.fail("fsync", 1, errno.EIO)
        with pytest.raises(StorageError):
            PosixStore(str(root), syscalls=calls).publish(1, 1, str(root / SAVE))
        assert [c for c in calls.calls if c.operation == "unlink"] == [Call("unlink", f"pub/{ENTRY_NAME}")]
        assert [e.step for e in PosixStore(str(root)).entries()] == [0]

    @pytest.mark.parametrize("err", [errno.EIO, errno.EACCES], ids=["EIO", "EACCES"])
    def test_a_create_reported_failed_after_it_happened_leaves_the_entry(self, root: Path, err: int) -> None:
        """The second documented case: the file system made the entry, then reported the create as failed."""
        make_save(root, SAVE)
        calls = FaultySyscalls(str(root))
        create = PUBLISH_STEPS.index(step_named("O_EXCL create of the entry"))
        calls.fail("open", nth(PUBLISH_STEPS, create), err, after=True)
        with pytest.raises(StorageError) as caught:
            PosixStore(str(root), syscalls=calls).publish(1, 1, str(root / SAVE))
        assert_names(caught.value, absolute(root, "pub/<entry>"), err=err)
        assert "cannot create the entry" in str(caught.value)
        # Publish cannot tell this from a create that did nothing, and must not unlink a name that may be
        # another publisher's: the entry stays, naming the complete save, and a retry sees ExistsError.
        assert PosixStore(str(root)).resolve() == ENTRY
        with pytest.raises(ExistsError):
            PosixStore(str(root)).publish(1, 1, str(root / SAVE))


def step_named(name: str) -> Step:
    return next(s for s in PUBLISH_STEPS if s.name == name)


def calls_of(operation: str, steps: list[Step]) -> int:
    return sum(1 for s in steps if s.operation == operation)


# -- reads -----------------------------------------------------------------------------------------------

READ_STEPS = [
    Step("open of pub/ without following a link", "open", "pub", REFUSED),
    Step("scandir of pub/", "scandir", "pub", REFUSED),
    Step("reading the listing", "readdir", "pub", REFUSED),
    Step("close of pub/", "close", "pub", PUBLISHED),
]


class TestReadFaults:
    @pytest.mark.parametrize("read", ["resolve", "entries"])
    def test_the_steps_are_every_call_a_read_makes(self, root: Path, read: str) -> None:
        """resolve and entries make the same four calls: open pub/, list it, read the listing, close."""
        PosixStore(str(root)).publish(1, 1, make_save(root, SAVE))
        calls = FaultySyscalls(str(root))
        getattr(PosixStore(str(root), syscalls=calls), read)()
        assert recorded(calls.calls) == [(s.operation, s.target) for s in READ_STEPS]

    @pytest.mark.parametrize("err", ERRORS, ids=ERROR_IDS)
    @pytest.mark.parametrize("index", range(len(READ_STEPS)), ids=[s.name for s in READ_STEPS])
    @pytest.mark.parametrize("read", ["resolve", "entries"])
    def test_a_fault_in_each_step(self, root: Path, read: str, index: int, err: int) -> None:
        """A failed listing is a StorageError naming pub/ and the reason; a failed close changes nothing."""
        PosixStore(str(root)).publish(1, 1, make_save(root, SAVE))
        step = READ_STEPS[index]
        calls = FaultySyscalls(str(root))
        calls.fail(step.operation, 1, err)
        store = PosixStore(str(root), syscalls=calls)
        if step.outcome == PUBLISHED:
            assert getattr(store, read)() in (ENTRY, [ENTRY])
            return
        with pytest.raises(StorageError) as caught:
            getattr(store, read)()
        assert_names(caught.value, f"{root}/pub", err=err)
        assert caught.value.location == f"{root}/pub"


# -- prune -----------------------------------------------------------------------------------------------

# Three entries, keep 1: two entries and their folders go. ck-1 holds a sub-folder and a link out of the
# root (removed as a name, never followed); ck-2 a FIFO (removed, never opened).
PLACEHOLDERS = {
    "<entry>": ENTRY_NAME,
    "<entry-2>": format_entry_name(Entry(1, 2, "exec/a/ck-2")),
}
PRUNE_CALLS = """
    open pub                        the plan: read pub/
    scandir pub
    readdir pub
    close pub
    open pins                       the plan: read pins/ (missing here: no pins)
    open .                          journals that earlier prunes left
    scandir .
    readdir .
    close .
    realpath exec/a/ck-3            two spellings (§5.11): each kept save and candidate resolved and
    stat exec/a/ck-3                identified, with every ancestor up to / (each once)
    stat exec/a
    stat exec
    stat .
    stat <above-root>
    realpath exec/a/ck-1
    stat exec/a/ck-1
    realpath exec/a/ck-2
    stat exec/a/ck-2
    open .                          the journal of this prune: created, written, synced, and the root synced
    open <journal>
    write <journal>
    fsync <journal>
    close <journal>
    fsync .
    close .
    open pub                        the entries
    unlink pub/<entry>
    unlink pub/<entry-2>
    fsync pub
    close pub
    open pub                        the re-read: pub/ first, then pins/ (ckpt.domain.journal rule 3)
    scandir pub
    readdir pub
    close pub
    open pins
    open .                          the decision: written whole under a temporary name, linked into place
    open <journal>.decided.tmp-<hex>
    write <journal>.decided.tmp-<hex>
    fsync <journal>.decided.tmp-<hex>
    close <journal>.decided.tmp-<hex>
    link <journal>.decided
    unlink <journal>.decided.tmp-<hex>
    fsync .
    close .
    open .                          and the journal checked to be still there
    lstat <journal>
    close .
    realpath exec/a/ck-3            the re-check, again   : each kept save and candidate resolved and
    stat exec/a/ck-3                identified, with every ancestor up to / (each once); the removal
    stat exec/a                     spares the needed identities this round found
    stat exec
    stat .
    stat <above-root>
    realpath exec/a/ck-1
    stat exec/a/ck-1
    realpath exec/a/ck-2
    stat exec/a/ck-2
    open .                          the folders, removed relative to one descriptor of the root
    open exec                       ck-1: every element opened with O_NOFOLLOW
    open exec/a
    lstat exec/a/ck-1
    fstat exec/a                    not a mount point
    open exec/a/ck-1
    fstat exec/a/ck-1
    scandir exec/a/ck-1
    readdir exec/a/ck-1
    unlink exec/a/ck-1/dataset      the link, as a name
    unlink exec/a/ck-1/model.bin
    open exec/a/ck-1/sub
    close exec/a/ck-1
    fstat exec/a/ck-1/sub
    scandir exec/a/ck-1/sub
    readdir exec/a/ck-1/sub
    unlink exec/a/ck-1/sub/shard.bin
    open exec/a/ck-1                ".." of sub, checked to be the folder it left
    close exec/a/ck-1/sub
    fstat exec/a/ck-1
    rmdir exec/a/ck-1/sub
    close exec/a/ck-1
    rmdir exec/a/ck-1
    fsync exec/a
    close exec/a
    close exec
    open exec                       ck-2
    open exec/a
    lstat exec/a/ck-2
    fstat exec/a
    open exec/a/ck-2
    fstat exec/a/ck-2
    scandir exec/a/ck-2
    readdir exec/a/ck-2
    unlink exec/a/ck-2/fifo
    unlink exec/a/ck-2/model.bin
    close exec/a/ck-2
    rmdir exec/a/ck-2
    fsync exec/a
    close exec/a
    close exec
    close .
    open .                          the job is done: the journal goes
    unlink <journal>
    unlink <journal>.decided        after its journal, never before
    fsync .
    close .
"""
PRUNE_STEPS = [
    Step(f"{i:02d} {line.split()[0]} {line.split()[1]}", line.split()[0], line.split()[1], "")
    for i, line in enumerate(line for line in PRUNE_CALLS.strip().splitlines())
]
# What is left after a prune that went well (and after a failed one and a fault-free prune after it).
FINAL_TREE = {
    "exec": "dir",
    "exec/a": "dir",
    "exec/a/ck-3": "dir",
    "exec/a/ck-3/model.bin": "file weights",
    "pub": "dir",
    f"pub/{format_entry_name(Entry(1, 3, 'exec/a/ck-3'))}": "file ",
}


def build_prune_root(root: Path, outside: Path) -> dict[str, str]:
    """Publish ck-1, ck-2, ck-3 and return the tree before pruning."""
    store = PosixStore(str(root))
    one = make_save(root, "exec/a/ck-1", {"model.bin": b"weights", "sub/shard.bin": b"shard"})
    os.symlink(outside, os.path.join(one, "dataset"))
    two = make_save(root, "exec/a/ck-2")
    os.mkfifo(os.path.join(two, "fifo"))
    store.publish(1, 1, one)
    store.publish(1, 2, two)
    store.publish(1, 3, make_save(root, "exec/a/ck-3"))
    return tree(root)


def fail_prune_step(calls: FaultySyscalls, operation: str, target: str, err: int) -> None:
    """Fail the first step of prune that makes ``operation`` on ``target``."""
    index = next(i for i, s in enumerate(PRUNE_STEPS) if (s.operation, s.target) == (operation, target))
    calls.fail(operation, nth(PRUNE_STEPS, index), err)


def assert_entries_keep_their_folders(root: Path, before: dict[str, str]) -> None:
    """Every entry still listed names a folder whose every file is as it was before the prune."""
    for entry in PosixStore(str(root)).entries():
        inside = {k: v for k, v in before.items() if k == entry.save or k.startswith(entry.save + "/")}
        now = {k: v for k, v in tree(root).items() if k in inside}
        assert now == inside, f"the folder of the remaining entry {entry} changed"


class TestPruneSteps:
    def test_the_steps_are_every_call_prune_makes(self, root: Path, outside: Path) -> None:
        """The calls listed are exactly the system calls a fault-free prune makes, in order."""
        build_prune_root(root, outside)
        calls = FaultySyscalls(str(root))
        result = PosixStore(str(root), syscalls=calls).prune(1)
        assert recorded(calls.calls) == [(s.operation, s.target) for s in PRUNE_STEPS]
        assert [e.step for e in result.removed_entries] == [1, 2]
        assert tree(root) == FINAL_TREE

    @pytest.mark.parametrize("err", ERRORS, ids=ERROR_IDS)
    @pytest.mark.parametrize("index", range(len(PRUNE_STEPS)), ids=[s.name for s in PRUNE_STEPS])
    def test_a_fault_in_each_step(self, root: Path, outside: Path, index: int, err: int) -> None:
        """A failed step is a clear error, spares every folder a remaining entry names; a rerun finishes."""
        step = PRUNE_STEPS[index]
        before = build_prune_root(root, outside)
        sentinel = tree(outside)
        calls = FaultySyscalls(str(root))
        calls.fail(step.operation, call_number(PRUNE_STEPS, index, root), err)
        store = PosixStore(str(root), syscalls=calls)
        written = step.target.startswith("<journal>")
        if step.operation == "close" and not written:
            store.prune(1)  # closing a descriptor that was only read loses nothing
        elif step.operation == "unlink" and TEMPORARY_MARK in step.target:
            store.prune(1)  # the decision is in place; its temporary name is left for the next prune
            assert [n for n in os.listdir(root) if TEMPORARY_MARK in n]
            PosixStore(str(root)).prune(1)
        else:
            with pytest.raises(StorageError) as caught:
                store.prune(1)
            assert_names(caught.value, str(root), err=err)
            assert str(caught.value.location).startswith(str(root)), caught.value.location
            assert_entries_keep_their_folders(root, before)
            assert tree(outside) == sentinel
            PosixStore(str(root)).prune(1)
        assert tree(root) == FINAL_TREE
        assert tree(outside) == sentinel

    def test_the_rerun_reports_the_folders_it_finished(self, root: Path, outside: Path) -> None:
        """A prune that failed to remove ck-1 leaves it in its journal; the next removes and reports it."""
        build_prune_root(root, outside)
        calls = FaultySyscalls(str(root))
        fail_prune_step(calls, "rmdir", "exec/a/ck-1", errno.EIO)
        with pytest.raises(StorageError) as caught:
            PosixStore(str(root), syscalls=calls).prune(1)
        message = str(caught.value)
        assert message.startswith(f"cannot remove the folder {root}/exec/a/ck-1: Input/output error")
        assert "the next prune removes them" in message
        assert [n for n in os.listdir(root) if n.startswith(JOURNAL_PREFIX)]
        result = PosixStore(str(root)).prune(1)
        assert result.removed_entries == ()
        assert result.removed_folders == (f"{root}/exec/a/ck-1", f"{root}/exec/a/ck-2")
        assert result.skipped == ()
        assert tree(root) == FINAL_TREE

    def test_an_error_deep_in_a_folder_names_where(self, root: Path, outside: Path) -> None:
        """A call failing inside a folder being removed is reported with the path it failed at."""
        build_prune_root(root, outside)
        calls = FaultySyscalls(str(root))
        fail_prune_step(calls, "unlink", "exec/a/ck-1/sub/shard.bin", errno.EACCES)
        with pytest.raises(StorageError) as caught:
            PosixStore(str(root), syscalls=calls).prune(1)
        folder = f"{root}/exec/a/ck-1"
        assert str(caught.value).startswith(
            f"cannot remove the folder {folder}: Permission denied (at {folder}/sub/shard.bin)"
        )

    def test_a_dry_run_only_reads(self, root: Path, outside: Path) -> None:
        """prune --dry-run makes no call that writes, and reports the plan."""
        before = build_prune_root(root, outside)
        calls = FaultySyscalls(str(root))
        result = PosixStore(str(root), syscalls=calls).prune(1, dry_run=True)
        reads = {"open", "scandir", "readdir", "close", "realpath", "stat"}  # realpath, stat: §5.11
        assert {c.operation for c in calls.calls} <= reads
        assert result.removed_folders == (f"{root}/exec/a/ck-1", f"{root}/exec/a/ck-2")
        assert tree(root) == before

    def test_a_dry_run_after_a_failed_prune_shows_the_folders_left(self, root: Path, outside: Path) -> None:
        """The folders a failed prune left are part of the next plan, and so of a dry run."""
        build_prune_root(root, outside)
        calls = FaultySyscalls(str(root))
        fail_prune_step(calls, "fsync", "pub", errno.EIO)  # after the entries were removed
        with pytest.raises(StorageError, match=f"cannot sync {root}/pub: Input/output error"):
            PosixStore(str(root), syscalls=calls).prune(1)
        result = PosixStore(str(root)).prune(1, dry_run=True)
        assert result.removed_entries == ()
        assert result.removed_folders == (f"{root}/exec/a/ck-1", f"{root}/exec/a/ck-2")


class TestPruneJournal:
    def test_a_folder_an_entry_names_again_is_never_removed_from_a_journal(
        self, root: Path, outside: Path
    ) -> None:
        """A folder left by a failed prune that was published again meanwhile stays, and is not reported."""
        build_prune_root(root, outside)
        calls = FaultySyscalls(str(root))
        fail_prune_step(calls, "fsync", "pub", errno.EIO)
        with pytest.raises(StorageError):
            PosixStore(str(root), syscalls=calls).prune(1)
        store = PosixStore(str(root))
        store.publish(2, 1, str(root / "exec/a/ck-1"))  # ck-1 is a save again
        result = store.prune(2)
        assert result.removed_folders == (f"{root}/exec/a/ck-2",)
        assert result.skipped == ()
        assert (root / "exec/a/ck-1/sub/shard.bin").read_bytes() == b"shard"
        assert not [n for n in os.listdir(root) if n.startswith(JOURNAL_PREFIX)]

    def test_a_left_folder_needed_again_does_not_shield_a_planned_folder_inside_it(self, root: Path) -> None:
        """A journal's folder needed by an entry published mid-prune stays; the planned one inside goes."""
        (root / f"{JOURNAL_PREFIX}0123456789abcdef").write_text("ckpt prune journal 1\nexec/b\nend\n")
        store = PosixStore(str(root))
        store.publish(1, 1, make_save(root, "exec/b/ck-1"))
        store.publish(1, 2, make_save(root, "exec/a/ck-2"))
        racing = _PublishesAtTheReread(str(root), 2, 1, make_save(root, "exec/b/ck-7"))
        result = PosixStore(str(root), syscalls=racing).prune(1)
        assert result.removed_folders == (f"{root}/exec/b/ck-1",)
        assert result.skipped == ()
        assert (root / "exec/b/ck-7/model.bin").exists()
        assert not [n for n in os.listdir(root) if n.startswith(JOURNAL_PREFIX)]

    def test_an_unfinished_journal_is_dropped_without_removing_anything(self, root: Path) -> None:
        """A journal without its last line was being written when its prune stopped: it lists nothing."""
        make_save(root, SAVE)
        (root / f"{JOURNAL_PREFIX}0123456789abcdef").write_text(f"ckpt prune journal 1\n{SAVE}\n")
        result = PosixStore(str(root)).prune(1)
        assert result.removed_folders == ()
        assert (root / SAVE / "model.bin").exists()
        assert not [n for n in os.listdir(root) if n.startswith(JOURNAL_PREFIX)]

    @pytest.mark.parametrize(
        "content",
        ["something else\nexec/a/ck-1\nend\n", "ckpt prune journal 1\n../../etc\nend\n"],
        ids=["bad-header", "bad-folder"],
    )
    def test_a_malformed_journal_is_an_error_naming_it(self, root: Path, content: str) -> None:
        """A finished journal that does not parse stops prune with MalformedError naming the file."""
        journal = root / f"{JOURNAL_PREFIX}0123456789abcdef"
        journal.write_text(content)
        with pytest.raises(CkptError, match=re.escape(str(journal))):
            PosixStore(str(root)).prune(1)
        assert journal.exists()


class _PublishesAtTheReread(Syscalls):
    """Real system calls; another publisher publishes a save just before prune reads pub/ again."""

    __slots__ = ("_entry", "_location", "_opens", "_pub", "_root")

    def __init__(self, root: str, epoch: int, step: int, location: str) -> None:
        self._root = root
        self._pub = f"{root}/pub"
        self._entry = (epoch, step)
        self._location = location
        self._opens = 0

    def open(self, path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        """``os.open``; the third open of pub/ (prune's re-read) comes right after another publish."""
        if path == self._pub and dir_fd is None:
            self._opens += 1
            if self._opens == 3:
                PosixStore(self._root).publish(*self._entry, self._location)
        return super().open(path, flags, mode, dir_fd=dir_fd)


# -- the watcher's reads and syncs -----------------------------------------------------------------------


class TestSaveFaults:
    @pytest.mark.parametrize("err", ERRORS, ids=ERROR_IDS)
    @pytest.mark.parametrize("operation", ["files", "sync_save"])
    def test_a_fault_in_any_call_is_an_error_naming_the_save(
        self, root: Path, operation: str, err: int
    ) -> None:
        """files() and sync_save() turn any failed call (but a read-only close) into an error naming it."""
        location = make_save(root, SAVE, {"model.bin": b"w", "sub/shard.bin": b"s"})
        trace = FaultySyscalls(str(root))
        getattr(PosixStore(str(root), syscalls=trace), operation)(location)
        for index, (call, _) in enumerate(trace.calls):
            if call == "close":
                continue
            calls = FaultySyscalls(str(root))
            calls.fail(call, sum(1 for c, _ in trace.calls[: index + 1] if c == call), err)
            with pytest.raises(StorageError) as caught:
                getattr(PosixStore(str(root), syscalls=calls), operation)(location)
            assert_names(caught.value, location, err=err)
