"""``catch_up_folders`` looks where ``catch_up`` looks and judges with the same world size (issue 20).

The catch-up for frameworks judged by a check of their own (``ckpt.application.catchup.catch_up_folders``)
knew neither the saves sub-folder (docs/kubernetes.md's ``exec/<attempt>/checkpoint``, watcher.md §7.9) nor
the world-size record of the execution that wrote the saves (layout.md §8.5, watcher.md §2.5b): it looked
into ``exec/<attempt>`` only, and its check could not tell a whole save of 4 processes from one whose ranks
2-3 never wrote. Real files on a POSIX root, and the in-memory store.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ckpt.application.catchup import catch_up_folders, record_epoch, record_world_size
from ckpt.domain.errors import InvalidError
from ckpt.domain.ports import WatchStore
from ckpt.store import open_store
from ckpt.testing import InMemoryStore

DEAD, NOW = "a", "b"


@pytest.fixture(params=["posix", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> WatchStore:
    if request.param == "memory":
        return InMemoryStore()
    (tmp_path / "root").mkdir()
    return open_store(str(tmp_path / "root"))


def _write(store: WatchStore, save: str, files: dict[str, bytes]) -> None:
    """Create ``files`` in the save ``save`` (relative to the root), beside the store under test."""
    if isinstance(store, InMemoryStore):
        for name, data in files.items():
            store.write_file(f"{store.root}/{save}", name, data)
        return
    folder = Path(store.root) / save
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)


def _ranks_written(store: WatchStore, location: str, world_size: int | None) -> bool:
    """Whole when every rank of the run that wrote it left its file (unknown size: rank 0's)."""
    return all(store.exists(location, f"rank_{i}.pkl") for i in range(world_size or 1))


def _saves(store: WatchStore, caught: object) -> list[str]:
    return [e.save for e in getattr(caught, "published", ())]


class TestSubFolder:
    def test_saves_in_the_sub_folder_are_caught_up(self, store: WatchStore) -> None:
        """``sub_folder="checkpoint"``: the save in ``exec/a/checkpoint`` is published at its epoch."""
        record_epoch(store, DEAD, 1)
        _write(store, f"exec/{DEAD}/checkpoint/step-5", {"rank_0.pkl": b"x"})
        caught = catch_up_folders(
            store,
            lambda s, loc: s.exists(loc, "rank_0.pkl"),
            folder_prefix="step-",
            attempt=NOW,
            epoch=2,
            sub_folder="checkpoint",
        )
        assert _saves(store, caught) == [f"exec/{DEAD}/checkpoint/step-5"]
        assert caught.published[0].epoch == 1

    def test_without_the_sub_folder_nothing_is_found(self, store: WatchStore) -> None:
        """Looking into the execution folder itself finds no ``step-<N>`` there: nothing is published."""
        record_epoch(store, DEAD, 1)
        _write(store, f"exec/{DEAD}/checkpoint/step-5", {"rank_0.pkl": b"x"})
        caught = catch_up_folders(store, lambda s, loc: True, folder_prefix="step-", attempt=NOW, epoch=2)
        assert caught.published == ()

    def test_a_bad_sub_folder_is_refused(self, store: WatchStore) -> None:
        """A sub-folder that is no clean relative path is ``InvalidError`` before anything is read."""
        with pytest.raises(InvalidError, match=r"\.\."):
            catch_up_folders(
                store, lambda s, loc: True, folder_prefix="step-", attempt=NOW, epoch=2, sub_folder="../x"
            )


class TestWorldSize:
    def test_the_record_judges_the_save(self, store: WatchStore) -> None:
        """A folder recording 4 processes: a save with ranks 0-1 only is not whole, one with 0-3 is."""
        record_epoch(store, DEAD, 1)
        record_world_size(store, DEAD, 4)
        _write(store, f"exec/{DEAD}/step-5", {"rank_0.pkl": b"x", "rank_1.pkl": b"x"})
        _write(store, f"exec/{DEAD}/step-9", {f"rank_{i}.pkl": b"x" for i in range(4)})
        seen: list[int | None] = []

        def whole(s: WatchStore, location: str, world_size: int | None) -> bool:
            seen.append(world_size)
            return _ranks_written(s, location, world_size)

        caught = catch_up_folders(store, whole, folder_prefix="step-", attempt=NOW, epoch=2)
        assert _saves(store, caught) == [f"exec/{DEAD}/step-9"]
        assert set(seen) == {4}

    def test_the_given_size_serves_a_folder_without_a_record(self, store: WatchStore) -> None:
        """No record: the explicit world size is the check's."""
        record_epoch(store, DEAD, 1)
        _write(store, f"exec/{DEAD}/step-5", {"rank_0.pkl": b"x", "rank_1.pkl": b"x"})
        caught = catch_up_folders(
            store, _ranks_written, folder_prefix="step-", attempt=NOW, epoch=2, world_size=4
        )
        assert caught.published == ()
        caught = catch_up_folders(
            store, _ranks_written, folder_prefix="step-", attempt=NOW, epoch=2, world_size=2
        )
        assert _saves(store, caught) == [f"exec/{DEAD}/step-5"]

    def test_a_record_and_another_given_size_are_refused(self, store: WatchStore) -> None:
        """A record of 4 and an explicit 2: ``InvalidError`` naming both, nothing published."""
        record_epoch(store, DEAD, 1)
        record_world_size(store, DEAD, 4)
        _write(store, f"exec/{DEAD}/step-5", {f"rank_{i}.pkl": b"x" for i in range(4)})
        with pytest.raises(InvalidError, match=r"records a world size of 4.*world size of 2 was given"):
            catch_up_folders(store, _ranks_written, folder_prefix="step-", attempt=NOW, epoch=2, world_size=2)
        assert store.entries() == []

    def test_a_two_argument_check_still_works(self, store: WatchStore) -> None:
        """A check written before the world size existed is called as before, record or not."""
        record_epoch(store, DEAD, 1)
        record_world_size(store, DEAD, 4)
        _write(store, f"exec/{DEAD}/step-5", {"rank_0.pkl": b"x"})
        caught = catch_up_folders(
            store, lambda s, loc: s.exists(loc, "rank_0.pkl"), folder_prefix="step-", attempt=NOW, epoch=2
        )
        assert _saves(store, caught) == [f"exec/{DEAD}/step-5"]
