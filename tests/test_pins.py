"""Pins and retention tiers on every store (the contract, run against the in-memory fake, POSIX and S3 through
moto in-process and over HTTP), the pin layout on disk and in the bucket, and the pin race flows."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError, MalformedError, NotFoundError, StorageError
from ckpt.domain.names import format_entry_name
from ckpt.domain.retention import SKIP_PINNED, KeepReason, Kept
from ckpt.testing import InMemoryStore
from support.faulty_syscalls import FaultySyscalls
from support.harness import Harness, MemoryHarness, PosixHarness

EXEC = "exec/1.4101.0"


def put_raw_pin(harness: Harness, name: str, *, folder: bool = False) -> None:
    """Put any name into ``pins/`` beside the store (bypassing it), as a file or a folder."""
    if isinstance(harness, MemoryHarness):
        harness.store().put_raw_pin(name, folder=folder)
    elif isinstance(harness, PosixHarness):
        pins = os.path.join(harness.root, "pins")
        os.makedirs(pins, exist_ok=True)
        if folder:
            os.mkdir(os.path.join(pins, name))
        else:
            open(os.path.join(pins, name), "wb").close()
    else:
        s3: Any = harness
        s3.put(f"pins/{name}/marker" if folder else f"pins/{name}")


def publish_steps(harness: Harness, *steps: int, epoch: int = 1) -> list[Entry]:
    store = harness.store()
    return [store.publish(epoch, s, harness.make_save(f"{EXEC}/checkpoint-{s}")) for s in steps]


class TestPinContract:
    def test_a_pinned_entry_is_listed_as_pinned(self, harness: Harness) -> None:
        """pin returns True the first time; pinned() lists the entry; the entries are unchanged."""
        store = harness.store()
        first, second = publish_steps(harness, 100, 200)
        assert store.pin(first) is True
        assert store.pinned() == [first]
        assert store.entries() == [first, second]

    def test_pinning_twice_is_not_an_error(self, harness: Harness) -> None:
        """A second pin of the same entry returns False and changes nothing."""
        store = harness.store()
        (entry,) = publish_steps(harness, 100)
        store.pin(entry)
        assert store.pin(entry) is False
        assert store.pinned() == [entry]

    def test_pinning_an_entry_that_is_not_published_is_not_found(self, harness: Harness) -> None:
        """Pinning an entry that does not exist is NotFoundError, and no pin is created."""
        store = harness.store()
        publish_steps(harness, 100)
        with pytest.raises(NotFoundError, match="no such entry"):
            store.pin(Entry(1, 999, f"{EXEC}/checkpoint-999"))
        assert store.pinned() == []

    def test_unpinning_twice_is_not_an_error(self, harness: Harness) -> None:
        """unpin returns True when there was a pin, then False; never an error."""
        store = harness.store()
        (entry,) = publish_steps(harness, 100)
        store.pin(entry)
        assert store.unpin(entry) is True
        assert store.unpin(entry) is False
        assert store.pinned() == []

    def test_a_malformed_pin_is_refused_by_pinned_and_by_prune(self, harness: Harness) -> None:
        """A name in pins/ that is not an entry name is MalformedError; prune then removes nothing."""
        store = harness.store()
        publish_steps(harness, 100, 200)
        put_raw_pin(harness, "not-an-entry")
        with pytest.raises(MalformedError, match="pin"):
            store.pinned()
        with pytest.raises(MalformedError):
            store.prune(keep=1)
        assert len(store.entries()) == 2

    def test_a_folder_in_pins_is_malformed(self, harness: Harness) -> None:
        """A folder inside pins/ is MalformedError."""
        store = harness.store()
        (entry,) = publish_steps(harness, 100)
        put_raw_pin(harness, format_entry_name(entry), folder=True)
        with pytest.raises(MalformedError):
            store.pinned()

    def test_a_save_in_pins_cannot_be_published(self, harness: Harness) -> None:
        """pins/ is reserved like pub/: a save there is InvalidError."""
        store = harness.store()
        with pytest.raises(InvalidError, match="pins"):
            store.publish(1, 1, store.root.rstrip("/") + "/pins/x")


class TestPruneContract:
    def test_prune_never_removes_a_pinned_entry_nor_its_folder(self, harness: Harness) -> None:
        """Whatever keep says, a pinned entry and its save stay, reported as kept for being pinned."""
        store = harness.store()
        e100, e200, e300 = publish_steps(harness, 100, 200, 300)
        store.pin(e100)
        result = store.prune(keep=1)
        assert store.entries() == [e100, e300]
        assert result.removed_entries == (e200,)
        assert harness.save_exists(e100.save)
        assert not harness.save_exists(e200.save)
        assert result.kept == (Kept(e100, (KeepReason.PINNED,)), Kept(e300, (KeepReason.LATEST,)))

    def test_keep_every_keeps_the_multiples(self, harness: Harness) -> None:
        """--keep-every K keeps every entry whose step is a multiple of K, beside the latest N."""
        store = harness.store()
        entries = publish_steps(harness, 1000, 1500, 2000, 2500)
        result = store.prune(keep=1, keep_every=1000)
        assert store.entries() == [entries[0], entries[2], entries[3]]
        assert result.removed_entries == (entries[1],)
        assert [k.reasons for k in result.kept] == [
            (KeepReason.EVERY,),
            (KeepReason.EVERY,),
            (KeepReason.LATEST,),
        ]

    def test_a_dry_run_reports_the_reasons_and_changes_nothing(self, harness: Harness) -> None:
        """The dry run gives the kept entries with their reasons, and removes nothing."""
        store = harness.store()
        e10, e20, e30 = publish_steps(harness, 10, 20, 30)
        store.pin(e20)
        result = store.prune(keep=1, keep_every=10, dry_run=True)
        assert result.dry_run
        assert result.kept == (
            Kept(e10, (KeepReason.EVERY,)),
            Kept(e20, (KeepReason.EVERY, KeepReason.PINNED)),
            Kept(e30, (KeepReason.LATEST, KeepReason.EVERY)),
        )
        assert result.removed_entries == ()
        assert store.entries() == [e10, e20, e30]

    def test_a_pin_protects_a_folder_another_removed_entry_names(self, harness: Harness) -> None:
        """A removed entry of the same save as a pinned entry goes, but the folder stays."""
        store = harness.store()
        location = harness.make_save(f"{EXEC}/checkpoint-5")
        old = store.publish(1, 5, location)
        pinned = store.publish(2, 5, location)
        store.publish(3, 9, harness.make_save(f"{EXEC}/checkpoint-9"))
        store.pin(pinned)
        store.prune(keep=1)
        assert old not in store.entries()
        assert harness.save_exists(old.save)

    def test_invalid_keep_every_is_refused(self, harness: Harness) -> None:
        """keep_every below 1 is InvalidError before anything is removed."""
        store = harness.store()
        publish_steps(harness, 1, 2)
        with pytest.raises(InvalidError):
            store.prune(keep=1, keep_every=0)
        assert len(store.entries()) == 2


class TestLayout:
    def test_posix_pin_is_an_empty_file_named_as_the_entry(self, tmp_path: Any) -> None:
        """On POSIX a pin is the empty file <root>/pins/<entry name>."""
        root = tmp_path / "root"
        root.mkdir()
        harness = PosixHarness(str(root))
        (entry,) = publish_steps(harness, 100)
        harness.store().pin(entry)
        pin = root / "pins" / format_entry_name(entry)
        assert pin.is_file()
        assert pin.stat().st_size == 0
        assert sorted(os.listdir(root / "pins")) == [format_entry_name(entry)]

    def test_posix_pins_that_is_a_symbolic_link_is_refused(self, tmp_path: Any) -> None:
        """A pins/ that is a link is never read or written through."""
        root = tmp_path / "root"
        root.mkdir()
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (root / "pins").symlink_to(elsewhere)
        harness = PosixHarness(str(root))
        (entry,) = publish_steps(harness, 100)
        with pytest.raises(Exception, match="symbolic link"):
            harness.store().pin(entry)
        assert os.listdir(elsewhere) == []


class Racing(InMemoryStore):
    """An in-memory store that runs the next queued step right after it answers a listing of pins/."""

    def __init__(self) -> None:
        super().__init__()
        self.after_pin_listing: list[Any] = []
        self.after_entry_listing: list[Any] = []

    def pin_names(self) -> list[str]:
        listed = super().pin_names()
        if self.after_pin_listing:
            self.after_pin_listing.pop(0)()
        return listed

    def entries(self) -> list[Entry]:
        listed = super().entries()
        if self.after_entry_listing:
            self.after_entry_listing.pop(0)()
        return listed


class TestPinRacingPrune:
    """The interleavings that matter, forced step by step (real processes race in test_pin_race.py)."""

    def _store(self) -> tuple[Racing, list[Entry]]:
        store = Racing()
        entries = []
        for step in (1, 2, 3):
            location = f"{store.root}/{EXEC}/checkpoint-{step}"
            store.make_dir(location)
            entries.append(store.publish(1, step, location))
        return store, entries

    def test_a_pin_made_after_the_plan_puts_the_entry_back_and_keeps_the_folder(self) -> None:
        """A pin created between prune's plan and its removals: the entry is put back, the folder kept."""
        store, (e1, e2, e3) = self._store()
        # Right after the plan read the pins (none), e1 is pinned; prune then removes e1 and e2.
        store.after_pin_listing.append(lambda: store.create_pin(format_entry_name(e1)))
        result = store.prune(keep=1)
        assert store.entries() == [e1, e3]
        assert result.removed_entries == (e2,)
        assert f"{store.root}/{e1.save}" not in result.removed_folders
        assert {s.location: s.reason for s in result.skipped} == {f"{store.root}/{e1.save}": SKIP_PINNED}
        assert [f.name for f in store.folders(f"{store.root}/{EXEC}")] == ["checkpoint-1", "checkpoint-3"]

    def test_a_pin_whose_entry_vanished_is_undone_and_not_found(self) -> None:
        """When the entry is gone at the pin's second look, its new pin is removed: NotFoundError."""
        store, (e1, _e2, e3) = self._store()
        # The pin's first listing sees e1; a whole prune then runs before the pin is created.
        store.after_entry_listing.append(lambda: store.prune(keep=1))
        with pytest.raises(NotFoundError, match="prune removed"):
            store.pin(e1)
        assert store.pinned() == []
        assert store.entries() == [e3]

    def test_an_unpin_after_the_plan_keeps_the_entry_this_time(self) -> None:
        """An entry pinned when the plan was made is kept even if it is unpinned before the removals."""
        store, (e1, _e2, e3) = self._store()
        store.pin(e1)
        store.after_pin_listing.append(lambda: store.unpin(e1))
        store.prune(keep=1)
        assert store.entries() == [e1, e3]
        assert store.pinned() == []


class TestPosixPinFaults:
    """Every system call a pin makes, failed in turn (real calls on real files, one of them failing)."""

    @pytest.mark.parametrize("operation", ["mkdir", "open", "fsync", "scandir"])
    def test_a_failed_call_is_a_storage_error_and_pinning_again_converges(
        self, tmp_path: Any, operation: str
    ) -> None:
        """Each failing call is StorageError naming the root; a new pin then pins the entry exactly once."""
        root = tmp_path / "root"
        root.mkdir()
        harness = PosixHarness(str(root))
        (entry,) = publish_steps(harness, 100)
        probe = FaultySyscalls(str(root))
        PosixStore(str(root), syscalls=probe).pin(entry)  # a fault-free pin on a root without pins/
        count = probe.count(operation)
        assert count >= 1
        for nth in range(1, count + 1):
            PosixStore(str(root)).unpin(entry)
            os.rmdir(root / "pins")
            calls = FaultySyscalls(str(root))
            calls.fail(operation, nth, errno.EIO)
            with pytest.raises(StorageError) as caught:
                PosixStore(str(root), syscalls=calls).pin(entry)
            assert str(root) in str(caught.value)
            assert os.strerror(errno.EIO) in str(caught.value)
            PosixStore(str(root)).pin(entry)
            assert PosixStore(str(root)).pinned() == [entry]
            assert PosixStore(str(root)).entries() == [entry]
