"""A complete prune journal is a tombstone (docs/spec/layout.md §5.9, watcher.md §4.6, §6.6, §7.8).

A prune that fails or is killed after it removed an entry leaves its journal and the save's folder, whole or
half deleted. Here that state is made by a real prune on a real root whose second ``unlink`` (the first file
of the save, after the entry) fails with ``EIO``. The watcher, catch-up and verified resolve must then pass
the save over; the killed-at-every-boundary proof across rules and stores is tests/test_kill_during_prune.py.
"""

from __future__ import annotations

import errno
import logging
import threading
from pathlib import Path

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.errors import MalformedError, StorageError
from ckpt.domain.follow import Followed
from ckpt.domain.journal import JOURNAL_PREFIX, format_journal
from ckpt.domain.ports import KnowsRemovals
from ckpt.domain.removing import Removing, being_removed_reason
from ckpt.domain.rules import Rule, builtin_rule
from ckpt.testing import InMemoryStore
from support.faulty_syscalls import FaultySyscalls
from support.harness import Harness
from support.s3 import RequestLog, S3Harness

ATTEMPT = "1.4101.0"
EXEC = f"exec/{ATTEMPT}"
EPOCH = 3
FILES = {"model.safetensors": b"m" * 32, "trainer_state.json": b'{"global_step": 1}'}


def _hf() -> Rule:
    rule = builtin_rule("hf")
    assert rule is not None
    return rule


def _journal(*folders: str) -> bytes:
    return format_journal(folders)


class TestRemoving:
    def test_a_save_equal_to_inside_or_containing_a_listed_folder_is_being_removed(self) -> None:
        """Overlap by path element: the folder itself, a path inside it and one containing it; not a
        sibling whose name merely starts the same."""
        removing = Removing.of_journals([("j1", _journal("exec/a/ck-1"))])
        assert removing.journal_of("exec/a/ck-1") == "j1"
        assert removing.journal_of("exec/a/ck-1/inner") == "j1"
        assert removing.journal_of("exec/a") == "j1"
        assert removing.journal_of("exec/a/ck-10") is None
        assert removing.journal_of("exec/b/ck-1") is None

    def test_an_unfinished_journal_lists_nothing(self) -> None:
        """A journal without its last line was being written: its prune removed nothing, no tombstone."""
        removing = Removing.of_journals([("j1", b"ckpt prune journal 1\nexec/a/ck-1\n")])
        assert not removing
        assert removing.journal_of("exec/a/ck-1") is None

    def test_the_first_journal_by_identifier_names_the_save(self) -> None:
        """Two journals listing one folder: the answer is the first in identifier order, whatever the
        order they were given in."""
        removing = Removing([("j2", ["exec/a/ck-1"]), ("j1", ["exec/a"])])
        assert removing.journal_of("exec/a/ck-1") == "j1"

    def test_a_complete_malformed_journal_is_malformed_error_naming_it(self) -> None:
        """A finished journal that lists a bad save is refused, as prune refuses it."""
        with pytest.raises(MalformedError, match="j1"):
            Removing.of_journals([("j1", b"ckpt prune journal 1\n../x\nend\n")])

    def test_the_reason_names_the_journal(self) -> None:
        assert being_removed_reason("/r/.ckpt-prune-00") == "being removed by a prune (/r/.ckpt-prune-00)"


def _killed_prune_state(root: Path) -> tuple[PosixStore, str, str]:
    """Publish checkpoint-10 and -20, then prune(1) failing at the first file of checkpoint-10: the entry
    is gone, the folder whole, the journal left. Returns the store and the two saves' locations."""
    for step in (10, 20):
        folder = root / EXEC / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        for name, data in FILES.items():
            (folder / name).write_bytes(data)
    store = PosixStore(str(root))
    older, newer = (store.location(Entry(EPOCH, s, f"{EXEC}/checkpoint-{s}")) for s in (10, 20))
    store.publish(EPOCH, 10, older)
    store.publish(EPOCH, 20, newer)
    calls = FaultySyscalls(str(root))
    calls.fail("unlink", nth=3, error=errno.EIO)  # 1: the entry; 2: the decision's temporary name; 3: a file
    with pytest.raises(StorageError, match="the next prune removes them"):
        PosixStore(str(root), syscalls=calls).prune(1)
    assert [e.step for e in store.entries()] == [20]
    assert sorted(p.name for p in (root / EXEC / "checkpoint-10").iterdir()) == sorted(FILES)
    return store, older, newer


def _journal_path(root: Path) -> str:
    (journal,) = (p for p in root.iterdir() if p.name.startswith(JOURNAL_PREFIX) and "." not in p.name[1:])
    return str(journal)


class TestStores:
    def test_posix_names_the_journal_of_a_killed_prune(self, tmp_path: Path) -> None:
        """``removing()`` on POSIX reads the journal a failed prune left, by its path."""
        store, _, _ = _killed_prune_state(tmp_path)
        assert isinstance(store, KnowsRemovals)
        removing = store.removing()
        assert removing.journal_of(f"{EXEC}/checkpoint-10") == _journal_path(tmp_path)
        assert removing.journal_of(f"{EXEC}/checkpoint-20") is None

    def test_the_in_memory_store_never_has_a_save_being_removed(self) -> None:
        """A store without journals answers "nothing", and says so without reading anything."""
        assert not InMemoryStore().removing()

    @pytest.mark.parametrize("harness", ["s3-moto"], indirect=True)
    def test_on_s3_no_journal_costs_one_listing(self, harness: Harness) -> None:
        """On S3, with no journal, ``removing()`` is one ListObjectsV2 under ``.ckpt-prune-``; with one, a
        GetObject more, and the journal is named by its URL."""
        assert isinstance(harness, S3Harness)
        store = harness.store()
        log = RequestLog(harness.store_client)
        assert not store.removing()
        assert log.operations() == ["ListObjectsV2"]
        harness.put(f"{JOURNAL_PREFIX}00aa", _journal(f"{EXEC}/checkpoint-10"))
        log.clear()
        removing = store.removing()
        assert log.operations() == ["ListObjectsV2", "GetObject"]
        url = f"{store.root}/{JOURNAL_PREFIX}00aa"
        assert removing.journal_of(f"{EXEC}/checkpoint-10") == url


class _PruneWhenJournalsAreRead(PosixStore):
    """A POSIX store whose first ``removing()`` first lets a whole prune run (the race the ordering rule
    is about: the journal is dropped between the watcher's judgement and its reading of the journals)."""

    __slots__ = ("pruned",)

    def removing(self) -> Removing:
        if not getattr(self, "pruned", False):
            self.pruned = True
            self.prune(1)
        return super().removing()


class TestWatcher:
    def test_a_restarted_watcher_passes_over_the_save_and_warns_once(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The save a failed prune left looks complete, but its journal lists it: two scans of a new
        watcher publish nothing, one warning names the save and the journal, and it is not waiting."""
        store, older, _ = _killed_prune_state(tmp_path)
        watcher = Watcher(store, _hf(), store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0)
        with caplog.at_level(logging.WARNING, logger="ckpt.watcher"):
            assert watcher.scan() == []
            assert watcher.scan() == []
        warnings = [r.getMessage() for r in caplog.records if "prune has begun removing" in r.getMessage()]
        assert warnings == [
            f"not publishing {older}: a prune has begun removing it ({_journal_path(tmp_path)})"
        ]
        assert [e.step for e in store.entries()] == [20]

    def test_the_next_prune_finishes_and_nothing_is_passed_over_then(self, tmp_path: Path) -> None:
        """Once the next prune removed the folder and dropped the journal, nothing is left to pass over."""
        store, _, _ = _killed_prune_state(tmp_path)
        result = store.prune(1)
        assert result.removed_folders == (str(tmp_path / EXEC / "checkpoint-10"),)
        assert not store.removing()
        assert not (tmp_path / EXEC / "checkpoint-10").exists()

    def test_a_journal_dropped_between_judgement_and_reading_means_no_save_to_publish(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The ordering argument: the watcher judged checkpoint-10 complete, then a prune finished (folder
        removed, journal dropped) before the watcher read the journals. It finds none, and publish meets a
        missing save (SaveNotFoundError): passed over as vanished, nothing published."""
        _killed_prune_state(tmp_path)
        store = _PruneWhenJournalsAreRead(str(tmp_path))
        watcher = Watcher(store, _hf(), store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0)
        with caplog.at_level(logging.WARNING, logger="ckpt.watcher"):
            assert watcher.scan() == []
        assert store.pruned
        assert any("save vanished before it could be published" in r.getMessage() for r in caplog.records)
        assert [e.step for e in store.entries()] == [20]
        assert not (tmp_path / EXEC / "checkpoint-10").exists()

    @pytest.mark.parametrize("harness", ["s3-moto"], indirect=True)
    def test_on_s3_journals_are_read_only_by_a_scan_with_something_to_publish(self, harness: Harness) -> None:
        """A scan that publishes one save lists the journals once; a scan with nothing new does not."""
        assert isinstance(harness, S3Harness)
        store = harness.store()
        harness.make_save(f"{EXEC}/checkpoint-5", FILES)
        watcher = Watcher(store, _hf(), store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0)
        log = RequestLog(harness.store_client)
        assert [e.step for e in watcher.scan()] == [5]
        prefix = JOURNAL_PREFIX  # in the query of the listing (the rest of the key is URL-encoded)
        journal_lists = [s for s in log.sent if s[0] == "ListObjectsV2" and prefix in str(s)]
        assert len(journal_lists) == 1
        log.clear()
        assert watcher.scan() == []
        assert log.operations() == ["ListObjectsV2"]


class TestVerifiedResolve:
    def test_an_entry_whose_save_is_being_removed_is_skipped_naming_the_journal(self, tmp_path: Path) -> None:
        """An entry for the half-removed save (published again by hand) is skipped with the exact reason
        once the newer save is gone."""
        store, older, _ = _killed_prune_state(tmp_path)
        store.publish(EPOCH, 10, older)  # an operator's publish: not refused, but never resolved
        store.publish(EPOCH, 15, older)
        for name in FILES:
            (tmp_path / EXEC / "checkpoint-20" / name).unlink()
        verified = resolve_verified(store, _hf())
        reason = being_removed_reason(_journal_path(tmp_path))
        assert verified.entry is None
        assert [(e.step, why) for e, why in verified.skipped] == [
            (20, "no trainer_state.json"),
            (15, reason),
            (10, reason),
        ]

    @pytest.mark.parametrize("harness", ["s3-moto"], indirect=True)
    def test_on_s3_the_journals_are_read_once_and_only_after_a_save_passed(self, harness: Harness) -> None:
        """On S3: two saves pass the rule, the newer is being removed (skipped, naming the journal's URL):
        one journal listing for the whole resolve. When no save passes, no journal is read."""
        assert isinstance(harness, S3Harness)
        store = harness.store()
        for step in (5, 6):
            store.publish(EPOCH, step, harness.make_save(f"{EXEC}/checkpoint-{step}", FILES))
        harness.put(f"{JOURNAL_PREFIX}00aa", _journal(f"{EXEC}/checkpoint-6"))
        log = RequestLog(harness.store_client)
        verified = resolve_verified(store, _hf())
        assert verified.entry == Entry(EPOCH, 5, f"{EXEC}/checkpoint-5")
        journal = f"{store.root}/{JOURNAL_PREFIX}00aa"
        assert [(e.step, why) for e, why in verified.skipped] == [(6, being_removed_reason(journal))]
        prefix = JOURNAL_PREFIX  # in the query of the listing (the rest of the key is URL-encoded)
        assert sum(1 for s in log.sent if s[0] == "ListObjectsV2" and prefix in s[2]) == 1
        for step in (5, 6):
            harness.remove_save(f"{EXEC}/checkpoint-{step}")
        log.clear()
        assert resolve_verified(store, _hf()).entry is None
        assert not [s for s in log.sent if prefix in s[2]]


class TestFollow:
    def test_a_follower_started_before_the_restart_sees_no_entry_for_the_save(self, tmp_path: Path) -> None:
        """A follower running across the failed prune and a restarted watcher's scan is never offered the
        half-removed save: the first new entry it yields is the next real publication."""
        root = tmp_path
        store, _, _ = _killed_prune_state(root)
        stop = threading.Event()
        followed = store.follow(interval=0.01, stop=stop)
        watcher = Watcher(store, _hf(), store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0)
        assert watcher.scan() == []
        folder = root / EXEC / "checkpoint-30"
        folder.mkdir()
        for name, data in FILES.items():
            (folder / name).write_bytes(data)
        assert [e.step for e in watcher.scan()] == [30]
        first = next(followed)
        stop.set()
        assert list(followed) == []  # and nothing after it: the stop ends the follow
        assert first == Followed(Entry(EPOCH, 30, f"{EXEC}/checkpoint-30"), latest=True)


class TestAnotherSpelling:
    """POSIX: a journal names the save by one spelling, a reader meets it by another (the execution folder is
    a link to shared storage, ADR 0004): the tombstone holds by physical identity (removing.py rule 4)."""

    def _root(self, tmp_path: Path) -> tuple[PosixStore, str]:
        real = tmp_path / "exec" / "real" / "checkpoint-10"
        real.mkdir(parents=True)
        for name, data in FILES.items():
            (real / name).write_bytes(data)
        (tmp_path / EXEC).symlink_to("real")
        journal = tmp_path / f"{JOURNAL_PREFIX}00aa"
        journal.write_bytes(_journal("exec/real/checkpoint-10"))
        return PosixStore(str(tmp_path)), str(journal)

    def test_the_save_through_the_link_is_being_removed(self, tmp_path: Path) -> None:
        """``journal_of`` names the journal for the linked spelling, the real one, and a folder holding it;
        not for a sibling."""
        store, journal = self._root(tmp_path)
        (tmp_path / "exec" / "real" / "checkpoint-20").mkdir()
        removing = store.removing()
        assert removing.journal_of(f"{EXEC}/checkpoint-10") == journal
        assert removing.journal_of("exec/real/checkpoint-10") == journal
        assert removing.journal_of(EXEC) == journal
        assert removing.journal_of(f"{EXEC}/checkpoint-20") is None

    def test_a_watcher_over_the_linked_folder_publishes_nothing(self, tmp_path: Path) -> None:
        """The half-removed save looks complete under the linked spelling: a new watcher publishes nothing."""
        store, _ = self._root(tmp_path)
        watcher = Watcher(store, _hf(), store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0)
        assert watcher.scan() == []
        assert watcher.scan() == []
        assert store.entries() == []
