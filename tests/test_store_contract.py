"""The store contract (spec/operations.md), written once and run against every store implementation.

The ``harness`` fixture builds a fresh root on each storage: the in-memory fake, a real POSIX directory, S3
through moto (in-process and over HTTP), and a real S3 server, Ceph RGW over HTTP (``s3-rgw``,
tests/support/rgw.py). The harness arranges trees beside the store, so what is checked is what the store
itself reads and writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ckpt
from ckpt.application.verify import resolve_verified
from ckpt.domain.entries import Entry
from ckpt.domain.errors import (
    CkptError,
    ExistsError,
    InvalidError,
    InvalidTypeError,
    MalformedError,
    SaveNotFoundError,
    StorageError,
)
from ckpt.domain.frameworks import Framework
from ckpt.domain.names import format_entry_name
from ckpt.domain.saves import MAX_READ_BYTES, too_large
from support.fixtures import CONTRACT_HARNESS_FACTORIES
from support.harness import Harness

EXEC_A = "exec/1.4101.0"
EXEC_B = "exec/2.4102.0"


@pytest.fixture(params=sorted(CONTRACT_HARNESS_FACTORIES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """One fresh store per implementation, the real S3 server included (the shared harness omits it)."""
    yield from CONTRACT_HARNESS_FACTORIES[request.param](request, tmp_path)


class TestPublish:
    def test_publish_returns_the_entry_and_lists_it(self, harness: Harness) -> None:
        """A published save is returned as its entry and is the one entry listed."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-500")
        entry = store.publish(1_000_000, 500, location)
        assert entry == Entry(1_000_000, 500, f"{EXEC_A}/checkpoint-500")
        assert store.entries() == [entry]
        assert harness.pub_names() == [format_entry_name(entry)]

    def test_republish_raises_exists_with_the_entry_and_changes_nothing(self, harness: Harness) -> None:
        """Publishing (epoch, step, save) twice raises ExistsError carrying it; the log is unchanged."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-500")
        first = store.publish(7, 500, location)
        before = harness.pub_names()
        with pytest.raises(ExistsError) as caught:
            store.publish(7, 500, location)
        assert caught.value.entry == first
        assert harness.pub_names() == before

    def test_same_save_at_another_step_is_another_entry(self, harness: Harness) -> None:
        """The entry is (epoch, step, save): the same save at another step is a separate publication."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-500")
        store.publish(7, 500, location)
        store.publish(7, 501, location)
        assert [e.step for e in store.entries()] == [500, 501]

    def test_missing_save_is_an_invalid_argument(self, harness: Harness) -> None:
        """A save that does not exist is SaveNotFoundError, an InvalidError (exit 2), not a StorageError."""
        store = harness.store()
        location = store.exec_dir("a") + "/checkpoint-1"
        with pytest.raises(SaveNotFoundError) as caught:
            store.publish(1, 1, location)
        assert isinstance(caught.value, InvalidError)
        assert not isinstance(caught.value, StorageError)
        assert caught.value.location == location
        assert str(caught.value) == f"save {location} does not exist"
        assert store.entries() == []

    def test_a_regular_file_is_a_single_file_save(self, harness: Harness) -> None:
        """A location naming a file (on S3 an object at exactly its key) is a single-file save."""
        store = harness.store()
        location = harness.make_file(f"{EXEC_A}/epoch=0-step=5.ckpt", b"weights")
        entry = store.publish(1, 5, location)
        assert entry == Entry(1, 5, f"{EXEC_A}/epoch=0-step=5.ckpt")
        assert store.location(entry) == location
        assert store.entries() == [entry]

    def test_location_outside_the_root_is_invalid(self, harness: Harness) -> None:
        """A location that is not under the root is InvalidError."""
        store = harness.store()
        with pytest.raises(InvalidError):
            store.publish(1, 1, "/elsewhere/exec/a/checkpoint-1")

    @pytest.mark.parametrize(
        "save",
        ["pub", "pub/x", "exec/a/../b", "exec/./a", "exec//a", "exec/a\x01b"],
        ids=["pub", "inside-pub", "dotdot", "dot", "empty-element", "control-char"],
    )
    def test_invalid_save_paths_are_refused(self, harness: Harness, save: str) -> None:
        """A save path that is not clean, or is pub/ or inside it, is InvalidError."""
        store = harness.store()
        with pytest.raises(InvalidError):
            store.publish(1, 1, store.root.rstrip("/") + "/" + save)
        assert store.entries() == []

    def test_save_too_long_for_an_entry_name_is_invalid(self, harness: Harness) -> None:
        """A save over 133 bytes cannot be carried by a 255-byte name and is InvalidError."""
        store = harness.store()
        location = harness.make_save("exec/a/" + "x" * 130)
        with pytest.raises(InvalidError, match="133"):
            store.publish(1, 1, location)

    @pytest.mark.parametrize(("epoch", "step"), [(-1, 0), (0, -1), (2**64, 0), (0, 2**64)])
    def test_out_of_range_numbers_are_invalid(self, harness: Harness, epoch: int, step: int) -> None:
        """Epoch and step are unsigned 64-bit integers."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-1")
        with pytest.raises(InvalidError):
            store.publish(epoch, step, location)

    def test_extreme_numbers_round_trip(self, harness: Harness) -> None:
        """0 and 2**64-1 are valid epochs and steps and list back exactly."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-1")
        store.publish(0, 2**64 - 1, location)
        store.publish(2**64 - 1, 0, location)
        assert [(e.epoch, e.step) for e in store.entries()] == [(0, 2**64 - 1), (2**64 - 1, 0)]


class TestEntriesAndResolve:
    def test_nothing_published_resolves_to_none(self, harness: Harness) -> None:
        """An empty root (no pub/ yet) has no entries and resolves to None."""
        store = harness.store()
        assert store.entries() == []
        assert store.resolve() is None

    def test_a_zombie_with_a_higher_step_never_wins(self, harness: Harness) -> None:
        """The older epoch loses whatever its step: the newer submission's save is resolved."""
        store = harness.store()
        store.publish(1_000_000, 500, harness.make_save(f"{EXEC_A}/checkpoint-500"))
        store.publish(2_000_000, 100, harness.make_save(f"{EXEC_B}/checkpoint-100"))
        store.publish(1_000_000, 900, harness.make_save(f"{EXEC_A}/checkpoint-900"))
        assert store.resolve() == Entry(2_000_000, 100, f"{EXEC_B}/checkpoint-100")

    def test_entries_are_ascending_by_epoch_step_save(self, harness: Harness) -> None:
        """Entries come back ordered by (epoch, step, save) whatever the publication order."""
        store = harness.store()
        specs = [(2, 5, "exec/b/z"), (1, 9, "exec/a/y"), (2, 5, "exec/b/a"), (2, 4, "exec/c/x")]
        for epoch, step, save in specs:
            store.publish(epoch, step, harness.make_save(save))
        assert [e.key for e in store.entries()] == sorted(specs)
        assert store.resolve() == Entry(2, 5, "exec/b/z")

    def test_tie_on_epoch_and_step_is_broken_by_save_code_points(self, harness: Harness) -> None:
        """Among equal (epoch, step) the greatest save by code point wins, not the greatest name."""
        store = harness.store()
        # base32 puts digits after letters, so the name order of these saves differs from their own order.
        for save in ("exec/a/~", "exec/a/a", "exec/a/é"):
            store.publish(3, 3, harness.make_save(save))
        assert store.resolve() == Entry(3, 3, "exec/a/é")
        assert [e.save for e in store.entries()] == ["exec/a/a", "exec/a/~", "exec/a/é"]

    def test_a_malformed_name_is_an_error_naming_it(self, harness: Harness) -> None:
        """A name in pub/ that does not parse is MalformedError naming it, never skipped."""
        store = harness.store()
        store.publish(1, 1, harness.make_save(f"{EXEC_A}/checkpoint-1"))
        bad = format_entry_name(Entry(1, 2, f"{EXEC_A}/checkpoint-2")) + ".tmp"
        harness.put_raw_name(bad)
        for read in (store.entries, store.resolve):
            with pytest.raises(MalformedError) as caught:
                read()
            assert caught.value.value == bad
            assert bad in str(caught.value)

    def test_a_sub_folder_of_pub_is_malformed(self, harness: Harness) -> None:
        """A folder inside pub/ is MalformedError, even when its name would parse."""
        store = harness.store()
        name = format_entry_name(Entry(1, 2, f"{EXEC_A}/checkpoint-2"))
        harness.put_raw_name(name, folder=True)
        with pytest.raises(MalformedError):
            store.entries()
        with pytest.raises(MalformedError):
            store.resolve()


class TestPrune:
    @pytest.mark.parametrize("keep", [0, -1])
    def test_keep_below_one_is_invalid(self, harness: Harness, keep: int) -> None:
        """keep must be at least 1, so prune can never remove the resolved entry."""
        with pytest.raises(InvalidError):
            harness.store().prune(keep)

    def test_keeps_the_latest_and_removes_the_rest_with_their_folders(self, harness: Harness) -> None:
        """prune keeps the N greatest entries and removes the others and the folders only they named."""
        store = harness.store()
        for step in (100, 200, 300, 400):
            store.publish(1, step, harness.make_save(f"{EXEC_A}/checkpoint-{step}"))
        result = store.prune(2)
        assert [e.step for e in result.removed_entries] == [100, 200]
        assert [e.step for e in store.entries()] == [300, 400]
        assert sorted(result.removed_folders) == sorted(
            store.location(Entry(1, s, f"{EXEC_A}/checkpoint-{s}")) for s in (100, 200)
        )
        assert not harness.save_exists(f"{EXEC_A}/checkpoint-100")
        assert not harness.save_exists(f"{EXEC_A}/checkpoint-200")
        assert harness.save_exists(f"{EXEC_A}/checkpoint-300")
        assert harness.save_exists(f"{EXEC_A}/checkpoint-400")
        assert result.skipped == ()

    def test_a_folder_named_by_a_remaining_entry_stays(self, harness: Harness) -> None:
        """A removed entry whose save a kept entry also names leaves the folder in place."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-100")
        store.publish(1, 100, location)
        store.publish(2, 100, location)
        result = store.prune(1)
        assert [e.epoch for e in result.removed_entries] == [1]
        assert result.removed_folders == ()
        assert harness.save_exists(f"{EXEC_A}/checkpoint-100")

    def test_folders_containing_or_inside_a_kept_save_stay(self, harness: Harness) -> None:
        """A removed save that contains, or lies inside, a kept save is not removed."""
        store = harness.store()
        store.publish(1, 1, harness.make_save("exec/a"))
        store.publish(1, 2, harness.make_save("exec/b/inner"))
        store.publish(1, 3, harness.make_save("exec/a/inner"))
        store.publish(1, 4, harness.make_save("exec/b"))
        result = store.prune(2)  # keeps exec/a/inner and exec/b
        assert result.removed_folders == ()
        for save in ("exec/a", "exec/a/inner", "exec/b", "exec/b/inner"):
            assert harness.save_exists(save)

    def test_a_single_file_save_is_removed(self, harness: Harness) -> None:
        """prune removes a single-file save like a folder: afterwards it cannot be published again."""
        store = harness.store()
        for step in (1, 2):
            store.publish(1, step, harness.make_file(f"{EXEC_A}/epoch=0-step={step}.ckpt", b"weights"))
        result = store.prune(1)
        gone = store.location(Entry(1, 1, f"{EXEC_A}/epoch=0-step=1.ckpt"))
        assert (result.removed_folders, result.skipped) == ((gone,), ())
        with pytest.raises(SaveNotFoundError):
            store.publish(2, 1, gone)
        kept = store.location(Entry(1, 2, f"{EXEC_A}/epoch=0-step=2.ckpt"))
        assert store.publish(2, 2, kept).save.endswith("step=2.ckpt")

    def test_overlap_compares_whole_path_elements(self, harness: Harness) -> None:
        """ck-1 is removed although a kept entry names ck-10: elements, not string prefixes, compare."""
        store = harness.store()
        store.publish(1, 1, harness.make_save("exec/a/ck-1"))
        store.publish(1, 10, harness.make_save("exec/a/ck-10"))
        result = store.prune(1)
        assert [e.save for e in result.removed_entries] == ["exec/a/ck-1"]
        assert not harness.save_exists("exec/a/ck-1")
        assert harness.save_exists("exec/a/ck-10")

    def test_dry_run_changes_nothing_and_reports_the_plan(self, harness: Harness) -> None:
        """A dry run reports what prune would remove and leaves entries and folders alone."""
        store = harness.store()
        for step in (1, 2, 3):
            store.publish(1, step, harness.make_save(f"{EXEC_A}/checkpoint-{step}"))
        before = harness.pub_names()
        result = store.prune(1, dry_run=True)
        assert result.dry_run is True
        assert [e.step for e in result.removed_entries] == [1, 2]
        assert len(result.removed_folders) == 2
        assert harness.pub_names() == before
        assert harness.save_exists(f"{EXEC_A}/checkpoint-1")

    def test_a_folder_already_gone_is_skipped_not_an_error(self, harness: Harness) -> None:
        """A removed entry whose folder is already gone is reported as skipped, not an error."""
        store = harness.store()
        store.publish(1, 1, harness.make_save(f"{EXEC_A}/checkpoint-1"))
        store.publish(1, 2, harness.make_save(f"{EXEC_A}/checkpoint-2"))
        harness.remove_save(f"{EXEC_A}/checkpoint-1")
        result = store.prune(1)
        assert [e.step for e in result.removed_entries] == [1]
        assert result.removed_folders == ()
        assert [s.reason for s in result.skipped] == ["already gone"]

    def test_keep_at_least_the_count_removes_nothing(self, harness: Harness) -> None:
        """keep >= number of entries removes nothing."""
        store = harness.store()
        store.publish(1, 1, harness.make_save(f"{EXEC_A}/checkpoint-1"))
        result = store.prune(5)
        assert (result.removed_entries, result.removed_folders, result.skipped) == ((), (), ())
        assert len(store.entries()) == 1


class TestLocations:
    def test_exec_dir_and_location_are_under_the_root(self, harness: Harness) -> None:
        """exec_dir(attempt) is <root>/exec/<attempt> and an entry's location is <root>/<save>."""
        store = harness.store()
        root = store.root.rstrip("/")
        assert store.exec_dir("2.4102.0") == f"{root}/exec/2.4102.0"
        assert store.location(Entry(1, 1, "exec/x/ck")) == f"{root}/exec/x/ck"

    @pytest.mark.parametrize("attempt", ["", ".", "..", "a/b", "a\x00b", "a\nb", "x" * 256])
    def test_bad_attempts_are_invalid(self, harness: Harness, attempt: str) -> None:
        """An attempt must be exactly one path element."""
        with pytest.raises(InvalidError):
            harness.store().exec_dir(attempt)


class TestWatchPort:
    def test_folders_lists_direct_sub_folders_only(self, harness: Harness) -> None:
        """folders() lists the folders directly inside a location, with their locations."""
        store = harness.store()
        harness.make_save(f"{EXEC_A}/checkpoint-1", {"a.bin": b"1", "sub/b.bin": b"2"})
        harness.make_save(f"{EXEC_A}/step-2")
        exec_dir = store.exec_dir("1.4101.0")
        found = sorted((f.name, f.location) for f in store.folders(exec_dir))
        assert found == [("checkpoint-1", f"{exec_dir}/checkpoint-1"), ("step-2", f"{exec_dir}/step-2")]

    def test_folders_of_a_missing_location_is_empty(self, harness: Harness) -> None:
        """A location that does not exist has no folders (the trainer has not saved yet)."""
        store = harness.store()
        assert store.folders(store.exec_dir("never")) == []

    def test_read_file_exists_and_files(self, harness: Harness) -> None:
        """read_file, exists and files see a save's files and their sizes."""
        store = harness.store()
        location = harness.make_save(
            f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"{}", "w/x.bin": b"123"}
        )
        assert store.read_file(location, "trainer_state.json") == b"{}"
        assert store.read_file(location, "missing.json") is None
        assert store.exists(location, "w/x.bin") is True
        assert store.exists(location, "nope") is False
        assert [(f.path, f.size) for f in store.files(location)] == [
            ("trainer_state.json", 2),
            ("w/x.bin", 3),
        ]


def sibling_of_root(store: Any) -> str:
    """A location that starts like the root but is not under it: ``<root>-other/exec/a/ck-1``."""
    return store.root.rstrip("/") + "-other/exec/a/ck-1"


class TestWatchPortBoundaries:
    def test_folders_of_the_root_with_or_without_a_trailing_slash(self, harness: Harness) -> None:
        """folders(root) and folders(root + "/") list the root's folders with the same locations."""
        store = harness.store()
        harness.make_save(f"{EXEC_A}/checkpoint-1")
        harness.put_raw_name(format_entry_name(Entry(1, 1, f"{EXEC_A}/checkpoint-1")))
        root = store.root.rstrip("/")
        expected = [("exec", f"{root}/exec"), ("pub", f"{root}/pub")]
        assert sorted((f.name, f.location) for f in store.folders(store.root)) == expected
        assert sorted((f.name, f.location) for f in store.folders(root + "/")) == expected

    def test_a_trailing_slash_on_a_location_changes_nothing(self, harness: Harness) -> None:
        """folders(location + "/") gives the same folders and locations as folders(location)."""
        store = harness.store()
        harness.make_save(f"{EXEC_A}/checkpoint-1")
        exec_dir = store.exec_dir("1.4101.0")
        expected = [("checkpoint-1", f"{exec_dir}/checkpoint-1")]
        assert [(f.name, f.location) for f in store.folders(exec_dir)] == expected
        assert [(f.name, f.location) for f in store.folders(exec_dir + "/")] == expected

    @pytest.mark.parametrize("operation", ["folders", "read_file", "exists", "files", "sync_save"])
    @pytest.mark.parametrize("where", ["sibling", "dotdot", "other-scheme"])
    def test_locations_outside_the_root_are_invalid(
        self, harness: Harness, operation: str, where: str
    ) -> None:
        """Every read (and sync_save) refuses a location outside the root with InvalidError."""
        store = harness.store()
        harness.make_save(f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"{}"})
        location = {
            "sibling": sibling_of_root(store),
            "dotdot": f"{store.root.rstrip('/')}/{EXEC_A}/../../..",
            "other-scheme": "/etc" if not store.root.startswith("/") else "s3://bucket/exec/a",
        }[where]
        calls: dict[str, Callable[[], object]] = {
            "folders": lambda: store.folders(location),
            "read_file": lambda: store.read_file(location, "trainer_state.json"),
            "exists": lambda: store.exists(location, "trainer_state.json"),
            "files": lambda: store.files(location),
            "sync_save": lambda: store.sync_save(location),
        }
        with pytest.raises(InvalidError):
            calls[operation]()

    @pytest.mark.parametrize(
        "name", ["../checkpoint-2/trainer_state.json", "/etc/passwd", "a/../b", "./x", "a//b", "", "x/"]
    )
    @pytest.mark.parametrize("operation", ["read_file", "exists"])
    def test_file_names_that_leave_the_save_are_invalid(
        self, harness: Harness, operation: str, name: str
    ) -> None:
        """A file name must be a clean path inside its save: ../x and /x are InvalidError everywhere."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"{}"})
        harness.make_save(f"{EXEC_A}/checkpoint-2", {"trainer_state.json": b"{}"})
        with pytest.raises(InvalidError):
            getattr(store, operation)(location, name)

    def test_sync_save_of_a_save_and_of_a_missing_one(self, harness: Harness) -> None:
        """sync_save returns for a save (leaving it in place) and for a location with nothing there."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"{}"})
        assert store.sync_save(location) is None
        assert store.sync_save(store.exec_dir("never") + "/checkpoint-1") is None
        assert store.read_file(location, "trainer_state.json") == b"{}"


class TestMarkersAreRegularFiles:
    def test_a_folder_named_like_a_marker_is_not_one(self, harness: Harness) -> None:
        """A .metadata folder (on S3: objects under .metadata/) is not the .metadata file."""
        store = harness.store()
        location = harness.make_save(
            f"{EXEC_A}/step-1", {".metadata/part": b"m", "trainer_state.json/x": b"{}"}
        )
        assert store.exists(location, ".metadata") is False
        assert store.read_file(location, ".metadata") is None
        assert store.read_file(location, "trainer_state.json") is None
        assert resolve_verified(store, Framework.DCP).entry is None

    def test_a_regular_file_is_a_marker(self, harness: Harness) -> None:
        """A regular file inside the save, at the top or deeper, exists and reads back."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/step-1", {".metadata": b"m", "sub/x.bin": b"123"})
        assert store.exists(location, ".metadata") is True
        assert store.exists(location, "sub/x.bin") is True
        assert store.read_file(location, "sub/x.bin") == b"123"


class TestReadCap:
    def test_a_file_over_the_cap_is_an_error_saying_so(self, harness: Harness) -> None:
        """read_file refuses a file over 64 MiB with a StorageError naming the file and the cap."""
        store = harness.store()
        location = harness.make_save(
            f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"x" * (MAX_READ_BYTES + 1)}
        )
        with pytest.raises(StorageError, match="64 MiB") as caught:
            store.read_file(location, "trainer_state.json")
        expected = too_large(f"{location}/trainer_state.json", MAX_READ_BYTES + 1)
        assert str(caught.value) == str(expected)
        assert caught.value.location == expected.location

    def test_a_file_at_the_cap_reads_whole(self, harness: Harness) -> None:
        """A file of exactly 64 MiB is read in full."""
        store = harness.store()
        location = harness.make_save(f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"y" * MAX_READ_BYTES})
        data = store.read_file(location, "trainer_state.json")
        assert data is not None
        assert len(data) == MAX_READ_BYTES


# Every public store method, called with a wrong-typed argument. ``save`` is a valid save's location.
WRONG_TYPED_STORE_CALLS: dict[str, Callable[[Any, str], object]] = {
    "publish-epoch-none": lambda s, save: s.publish(None, 1, save),
    "publish-epoch-true": lambda s, save: s.publish(True, 1, save),
    "publish-epoch-str": lambda s, save: s.publish("1", 1, save),
    "publish-step-float": lambda s, save: s.publish(1, 1.0, save),
    "publish-location-none": lambda s, save: s.publish(1, 1, None),
    "publish-location-int": lambda s, save: s.publish(1, 1, 1),
    "publish-location-bytes": lambda s, save: s.publish(1, 1, save.encode()),
    "prune-keep-str": lambda s, save: s.prune("2"),
    "prune-keep-true": lambda s, save: s.prune(True),
    "prune-keep-none": lambda s, save: s.prune(None),
    "prune-dry-run-str": lambda s, save: s.prune(1, dry_run="yes"),
    "location-none": lambda s, save: s.location(None),
    "location-str": lambda s, save: s.location("exec/a/ck-1"),
    "exec-dir-int": lambda s, save: s.exec_dir(3),
    "exec-dir-none": lambda s, save: s.exec_dir(None),
    "folders-none": lambda s, save: s.folders(None),
    "folders-bytes": lambda s, save: s.folders(save.encode()),
    "read-file-location-none": lambda s, save: s.read_file(None, "trainer_state.json"),
    "read-file-name-none": lambda s, save: s.read_file(save, None),
    "read-file-name-bytes": lambda s, save: s.read_file(save, b"trainer_state.json"),
    "exists-location-int": lambda s, save: s.exists(3, ".metadata"),
    "exists-name-none": lambda s, save: s.exists(save, None),
    "files-none": lambda s, save: s.files(None),
    "sync-save-none": lambda s, save: s.sync_save(None),
    "resolve-verified-framework-str": lambda s, save: resolve_verified(s, "hf"),
    "resolve-verified-framework-none": lambda s, save: resolve_verified(s, None),
}


class TestWrongTypes:
    @pytest.mark.parametrize("call", sorted(WRONG_TYPED_STORE_CALLS))
    def test_every_store_method_refuses_a_wrong_type_alike(self, harness: Harness, call: str) -> None:
        """A wrong-typed argument is InvalidTypeError (an InvalidError and a TypeError) on every store."""
        store = harness.store()
        save = harness.make_save(f"{EXEC_A}/checkpoint-1", {"trainer_state.json": b"{}"})
        store.publish(1, 1, save)
        with pytest.raises(InvalidTypeError) as caught:
            WRONG_TYPED_STORE_CALLS[call](store, save)
        assert isinstance(caught.value, TypeError)
        assert isinstance(caught.value, CkptError)
        assert [e.step for e in store.entries()] == [1]


ENTRY = Entry(1, 1, "exec/a/ck-1")

# ckpt's top-level functions (and the Entry value), called with a wrong-typed argument.
WRONG_TYPED_API_CALLS: dict[str, Callable[[], object]] = {
    "entry-epoch-str": lambda: ckpt.Entry("1", 1, "exec/a/ck-1"),
    "entry-step-true": lambda: ckpt.Entry(1, True, "exec/a/ck-1"),
    "entry-save-none": lambda: ckpt.Entry(1, 1, None),  # type: ignore[arg-type]
    "format-entry-name-none": lambda: ckpt.format_entry_name(None),  # type: ignore[arg-type]
    "format-entry-name-tuple": lambda: ckpt.format_entry_name((1, 1, "exec/a")),  # type: ignore[arg-type]
    "parse-entry-name-none": lambda: ckpt.parse_entry_name(None),  # type: ignore[arg-type]
    "parse-entry-name-bytes": lambda: ckpt.parse_entry_name(b"x"),  # type: ignore[arg-type]
    "parse-epoch-int": lambda: ckpt.parse_epoch(1),  # type: ignore[arg-type]
    "parse-step-none": lambda: ckpt.parse_step(None),  # type: ignore[arg-type]
    "parse-framework-none": lambda: ckpt.parse_framework(None),
    "validate-save-none": lambda: ckpt.validate_save(None),  # type: ignore[arg-type]
    "validate-attempt-int": lambda: ckpt.validate_attempt(3),  # type: ignore[arg-type]
    "latest-none": lambda: ckpt.latest(None),  # type: ignore[arg-type]
    "latest-of-strings": lambda: ckpt.latest(["exec/a"]),  # type: ignore[list-item]
    "overlaps-folder-none": lambda: ckpt.overlaps(None, [ENTRY]),  # type: ignore[arg-type]
    "overlaps-entries-none": lambda: ckpt.overlaps("exec/a", None),  # type: ignore[arg-type]
    "overlaps-entries-of-strings": lambda: ckpt.overlaps("exec/a", ["exec/a"]),  # type: ignore[list-item]
    "plan-prune-keep-str": lambda: ckpt.plan_prune([ENTRY], "2"),  # type: ignore[arg-type]
    "plan-prune-entries-none": lambda: ckpt.plan_prune(None, 1),  # type: ignore[arg-type]
    "plan-prune-entries-of-ints": lambda: ckpt.plan_prune([1], 1),  # type: ignore[list-item]
    "open-store-none": lambda: ckpt.open_store(None),  # type: ignore[arg-type]
    "open-store-path-object": lambda: ckpt.open_store(__import__("pathlib").Path("/")),  # type: ignore[arg-type]
    "open-store-config-str": lambda: ckpt.open_store("/", config="ckpt.toml"),  # type: ignore[arg-type]
    "open-store-environ-list": lambda: ckpt.open_store("/", environ=[]),  # type: ignore[arg-type]
    "resolve-verified-store-none": lambda: ckpt.resolve_verified(None, ckpt.parse_framework("hf")),
    "in-memory-store-name-int": lambda: __import__("ckpt.testing").testing.InMemoryStore(3),
    "watcher-store-none": lambda: ckpt.Watcher(
        None,  # type: ignore[arg-type]
        ckpt.parse_framework("hf"),
        "memory://root/exec/a",
        1,
        1,
    ),
    "watcher-framework-str": lambda: ckpt.Watcher(
        __import__("ckpt.testing").testing.InMemoryStore(),
        "hf",  # type: ignore[arg-type]
        "memory://root/exec/a",
        1,
        1,
    ),
}


class TestWrongTypesThroughTheApi:
    @pytest.mark.parametrize("call", sorted(WRONG_TYPED_API_CALLS))
    def test_every_top_level_function_refuses_a_wrong_type(self, call: str) -> None:
        """A wrong-typed argument to ckpt's functions is InvalidTypeError, never AttributeError."""
        with pytest.raises(InvalidTypeError) as caught:
            WRONG_TYPED_API_CALLS[call]()
        assert isinstance(caught.value, TypeError)
