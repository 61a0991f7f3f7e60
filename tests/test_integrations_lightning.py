"""The Lightning integration on a real 2-process DDP run on CPU (gloo): sync and async IO, resume, fencing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.errors import InvalidError
from ckpt.integrations.core import Publisher, open_job
from support.integ_launch import run_ranks

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


def run(root: Path, attempt: str, epoch: int, tmp: Path, *args: str) -> dict[str, Any]:
    env = {
        "CKPT_ROOT": str(root),
        "DISPATCH_EPOCH": str(epoch),
        "DISPATCH_ATTEMPT": attempt,
        "NODE_RANK": "0",
    }
    out, marks = tmp / f"{attempt}.json", tmp / f"marks-{attempt}"
    marks.mkdir()
    run_ranks(
        "support.integ_lightning_run",
        ["--out", str(out), "--marks", str(marks), *args],
        world_size=2,
        env=env,
    )
    report: dict[str, Any] = json.loads(out.read_text())
    return report


class TestOptions:
    def test_dirpath_and_filename_are_decided_by_the_callback(self, tmp_path: Path) -> None:
        """Saves must go to <exec>/step-<step>/model.ckpt, so dirpath and filename are refused."""
        pytest.importorskip("lightning")
        from ckpt.integrations.lightning import CkptModelCheckpoint

        with pytest.raises(InvalidError, match="dirpath"):
            CkptModelCheckpoint(
                dirpath=str(tmp_path), settings={"root": str(tmp_path), "epoch": 1, "attempt": "a"}
            )

    def test_first_run_resumes_from_nothing(self, tmp_path: Path) -> None:
        """resume_location is None when nothing is published."""
        pytest.importorskip("lightning")
        from ckpt.integrations.lightning import resume_location

        assert resume_location(root=str(tmp_path), epoch=1, attempt="a", environ={}) is None


class TestTwoRanks:
    def test_sync_then_async_io_resume_and_fence_a_zombie(self, tmp_path: Path) -> None:
        """Saves are published after every rank reached the save's barrier, last.ckpt never; the next
        execution (async IO) resumes at the right step and publishes once each write is done; its epoch
        fences a zombie."""
        pytest.importorskip("lightning")
        root = tmp_path / "root"
        root.mkdir()
        first = run(root, "a", 10, tmp_path, "--max-steps", "4", "--slow-rank", "1", "--slow-seconds", "1.5")
        assert [(p["epoch"], p["step"], p["mark"]) for p in first["published"]] == [
            (10, 2, True),
            (10, 4, True),
        ]
        assert (root / "exec" / "a" / "last.ckpt").exists()
        store = PosixStore(str(root))
        assert [e.save for e in store.entries()] == ["exec/a/step-2", "exec/a/step-4"]

        second = run(root, "b", 20, tmp_path, "--max-steps", "6", "--async-io")
        assert second["resumed_from"] == str(root / "exec" / "a" / "step-4" / "model.ckpt")
        assert second["started_at"] == 4
        final_size = (root / "exec" / "b" / "step-6" / "model.ckpt").stat().st_size
        assert [(p["epoch"], p["step"], p["size"]) for p in second["published"]] == [(20, 6, final_size)]

        zombie = Publisher(open_job(root=str(root), epoch=10, attempt="a", environ={}), is_main=True)
        shutil.copytree(root / "exec" / "a" / "step-4", root / "exec" / "a" / "step-900")
        assert zombie.publish(900, str(root / "exec" / "a" / "step-900")) is not None
        from ckpt.integrations.lightning import resume_location

        assert resume_location(root=str(root), epoch=30, attempt="c", environ={}) == str(
            root / "exec" / "b" / "step-6" / "model.ckpt"
        )


def _lightning_reason(store: PosixStore, location: str) -> str | None:
    """What the built-in ``lightning`` rule says of the save at ``location`` (``None``: complete)."""
    from ckpt.application.inspection import judge, saves_reader
    from ckpt.application.rulebook import find_rule
    from ckpt.domain.rules import Item, Kind

    rule = find_rule("lightning")
    parent, _, name = location.rstrip("/").rpartition("/")
    (save,) = rule.saves([Item(name, Kind.FOLDER)])
    return judge(rule, save, (), saves_reader(store, parent))


def _sharded(folder: Path, *, meta: bytes | None, metadata: bool = True, ranks: int = 2) -> None:
    """A sharded save as ModelParallel writes it into ``folder/model.ckpt/`` (support.lightning_saves)."""
    checkpoint = folder / "model.ckpt"
    checkpoint.mkdir(parents=True)
    for rank in range(ranks):
        (checkpoint / f"__{rank}_0.distcp").write_bytes(bytes(100))
    if metadata:
        (checkpoint / ".metadata").write_bytes(b"dcp metadata")
    if meta is not None:
        (checkpoint / "meta.pt").write_bytes(meta)


class TestShardedTwoRanks:
    def test_model_parallel_saves_resume_at_the_right_step(self, tmp_path: Path) -> None:
        """A real 2-process ModelParallelStrategy run (FSDP2 over the data ranks, CPU, gloo) saves sharded
        folders, ``step-<step>/model.ckpt/`` with each rank's ``.distcp``, ``.metadata`` and ``meta.pt``,
        published once every rank is done; the next execution resumes from the newest at its step (it
        started from step 0 when only a regular ``model.ckpt`` counted, issue 20 case 1), and the verified
        resolve with the recorded world size of 2 agrees."""
        pytest.importorskip("lightning")
        from ckpt.application.rulebook import find_rule
        from ckpt.application.verify import resolve_verified

        root = tmp_path / "root"
        root.mkdir()
        first = run(
            root,
            "a",
            10,
            tmp_path,
            "--max-steps",
            "4",
            "--sharded",
            "--slow-rank",
            "1",
            "--slow-seconds",
            "1",
        )
        assert [(p["epoch"], p["step"], p["mark"]) for p in first["published"]] == [
            (10, 2, True),
            (10, 4, True),
        ]
        sharded = root / "exec" / "a" / "step-4" / "model.ckpt"
        assert sorted(p.name for p in sharded.iterdir()) == [
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
            "meta.pt",
        ]
        assert (root / "exec" / "a" / ".ckpt-world-size").read_text() == "2\n"
        store = PosixStore(str(root))
        verified = resolve_verified(store, find_rule("lightning"))
        assert verified.entry is not None
        assert verified.entry.save == "exec/a/step-4"

        second = run(root, "b", 20, tmp_path, "--max-steps", "6", "--sharded")
        assert second["resumed_from"] == str(sharded)
        assert second["started_at"] == 4
        assert [(p["epoch"], p["step"]) for p in second["published"]] == [(20, 6)]


class TestCatchUp:
    """Issue 20 case 1: the catch-up and the resume of the integration ask the built-in ``lightning`` rule."""

    def _record(self, root: Path, attempt: str, epoch: int) -> None:
        from ckpt.catchup import record_epoch

        record_epoch(PosixStore(str(root)), attempt, epoch)

    def test_no_completion_check_of_its_own(self) -> None:
        """``is_whole_save`` is gone, and the module no longer asks ``newest_with_file``."""
        pytest.importorskip("lightning")
        import inspect

        from ckpt.integrations import lightning

        assert not hasattr(lightning, "is_whole_save")
        assert "newest_with_file" not in inspect.getsource(lightning)

    def test_whole_saves_only(self, tmp_path: Path) -> None:
        """A torch.save file is whole; one cut short, one with bytes after its end record (an end record in
        the last 64 KiB that does not end the file), a sharded folder without meta.pt, and one whose meta.pt
        is a single byte are not: only the whole ones are caught up, and the job resumes from the newest."""
        torch = pytest.importorskip("torch")
        from ckpt.integrations.lightning import resume_location

        self._record(tmp_path, "a", 10)
        saves = tmp_path / "exec" / "a"
        whole = saves / "step-1"
        whole.mkdir(parents=True)
        torch.save({"weights": torch.ones(64)}, whole / "model.ckpt")
        data = (whole / "model.ckpt").read_bytes()
        (saves / "step-2").mkdir()
        (saves / "step-2" / "model.ckpt").write_bytes(data[:-30])
        (saves / "step-3").mkdir()
        (saves / "step-3" / "model.ckpt").write_bytes(data + bytes(100))
        _sharded(saves / "step-4", meta=None)
        _sharded(saves / "step-5", meta=b"p")
        store = PosixStore(str(tmp_path))
        assert _lightning_reason(store, str(saves / "step-1")) is None
        assert "not a complete zip" in str(_lightning_reason(store, str(saves / "step-3")))
        assert _lightning_reason(store, str(saves / "step-4")) == "no model.ckpt/meta.pt"
        assert "model.ckpt/meta.pt is not a complete zip" in str(
            _lightning_reason(store, str(saves / "step-5"))
        )
        assert resume_location(root=str(tmp_path), epoch=20, attempt="b", environ={}, settle=0) == str(
            whole / "model.ckpt"
        )
        assert [(e.epoch, e.save) for e in store.entries()] == [(10, "exec/a/step-1")]

    def test_two_whole_sharded_saves_resume_from_the_newest(self, tmp_path: Path) -> None:
        """Two whole sharded saves, published: the job resumes from the newer one's model.ckpt folder (it
        restarted from step 0 when only a regular model.ckpt counted)."""
        pytest.importorskip("lightning")
        from ckpt.integrations.lightning import resume_location
        from support.lightning_saves import meta_pt

        store = PosixStore(str(tmp_path))
        for step in (2, 4):
            save = tmp_path / "exec" / "a" / f"step-{step}"
            _sharded(save, meta=meta_pt())
            store.publish(10, step, str(save))
        assert resume_location(root=str(tmp_path), epoch=20, attempt="b", environ={}) == str(
            tmp_path / "exec" / "a" / "step-4" / "model.ckpt"
        )

    def test_resume_publishes_what_the_dead_execution_left(self, tmp_path: Path) -> None:
        """The next start publishes a whole unpublished save at the dead execution's epoch and resumes
        from it; a cut-off save is left alone."""
        torch = pytest.importorskip("torch")
        from ckpt.integrations.lightning import resume_location

        self._record(tmp_path, "a", 10)
        whole = tmp_path / "exec" / "a" / "step-8"
        whole.mkdir(parents=True)
        torch.save({"global_step": 8}, whole / "model.ckpt")
        cut = tmp_path / "exec" / "a" / "step-9"
        cut.mkdir()
        (cut / "model.ckpt").write_bytes((whole / "model.ckpt").read_bytes()[:100])
        assert resume_location(root=str(tmp_path), epoch=20, attempt="b", environ={}, settle=0) == str(
            whole / "model.ckpt"
        )
        assert [(e.epoch, e.step) for e in PosixStore(str(tmp_path)).entries()] == [(10, 8)]

    def test_the_dead_executions_world_size_decides(self, tmp_path: Path) -> None:
        """A sharded save with per-rank DCP metadata (``__<r>.metadata``) and no ``.metadata`` is whole only
        for the world size the execution that wrote it recorded: 2 ranks' files for a record of 2; with 3
        recorded it is not, whatever the size of the resuming run (``WORLD_SIZE=1``)."""
        pytest.importorskip("lightning")
        from ckpt.catchup import record_world_size
        from ckpt.integrations.lightning import resume_location
        from support.lightning_saves import meta_pt

        for recorded, expected in ((2, "step-4"), (3, None)):
            root = tmp_path / str(recorded)
            root.mkdir()
            self._record(root, "a", 10)
            record_world_size(PosixStore(str(root)), "a", recorded)
            save = root / "exec" / "a" / "step-4"
            _sharded(save, meta=meta_pt(), metadata=False)
            for rank in range(2):
                (save / "model.ckpt" / f"__{rank}.metadata").write_bytes(b"rank metadata")
            found = resume_location(
                root=str(root), epoch=20, attempt="b", environ={"WORLD_SIZE": "1"}, settle=0
            )
            assert found == (None if expected is None else str(save / "model.ckpt")), recorded


class TestShardedSaveFileByFile:
    """The exact on-disk sequence of a 2-process sharded save (``support.lightning_saves``, from Lightning's
    and DCP's source), cut at every file boundary: the catch-up publishes nothing and verified resolve passes
    the save over until ``meta.pt`` is whole, then both take it."""

    def test_every_cut_until_the_last_file(self, tmp_path: Path) -> None:
        pytest.importorskip("lightning")
        from ckpt.application.rulebook import find_rule
        from ckpt.application.verify import resolve_verified
        from ckpt.catchup import record_world_size
        from ckpt.integrations.lightning import resume_location
        from support.lightning_saves import sharded_states

        states = sharded_states(2)
        assert [s.whole for s in states].count(True) == 1
        assert states[-1].whole
        for index, state in enumerate(states):
            for path in ("catch-up", "verified"):
                root = tmp_path / f"{index}-{path}"
                root.mkdir()
                store = PosixStore(str(root))
                self._write(root, state, store, record_world_size)
                save = root / "exec" / "a" / "step-4"
                if path == "catch-up":
                    found = resume_location(root=str(root), epoch=20, attempt="b", environ={}, settle=0)
                    assert found == (str(save / "model.ckpt") if state.whole else None), state.name
                    assert len(store.entries()) == int(state.whole), state.name
                else:
                    store.publish(10, 4, str(save))
                    verified = resolve_verified(store, find_rule("lightning"))
                    assert (verified.entry is not None) == state.whole, (state.name, verified.skipped)

    @staticmethod
    def _write(root: Path, state: Any, store: PosixStore, record_world_size: Any) -> None:
        from ckpt.catchup import record_epoch
        from support.lightning_saves import write_tree

        record_epoch(store, "a", 10)
        record_world_size(store, "a", 2)
        write_tree(root / "exec" / "a" / "step-4" / "model.ckpt", state.files)


class TestCatchUpOnS3:
    def test_a_checkpoint_larger_than_the_read_cap_is_caught_up(self, tmp_path: Path) -> None:
        """On S3 only the end of model.ckpt is read (a ranged GET): a whole checkpoint bigger than the 64 MiB
        a store reads from a file is still caught up, and one cut short is not."""
        pytest.importorskip("lightning")
        import io
        import zipfile

        from ckpt.catchup import record_epoch
        from ckpt.domain.saves import MAX_READ_BYTES
        from ckpt.integrations.lightning import resume_location
        from support.s3 import moto_in_process

        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr("archive/data/0", bytes(MAX_READ_BYTES + 1024))
        whole = buffer.getvalue()
        harness = moto_in_process(None, tmp_path)  # type: ignore[arg-type]
        s3 = next(harness)
        try:
            store = s3.store()
            record_epoch(store, "a", 10)
            s3.make_save("exec/a/step-4", {"model.ckpt": whole})
            s3.make_save("exec/a/step-6", {"model.ckpt": whole[:4096]})  # torn: no end record
            location = resume_location(store=store, epoch=20, attempt="b", environ={})
            assert location == f"{store.root}/exec/a/step-4/model.ckpt"
            assert [(e.epoch, e.step) for e in store.entries()] == [(10, 4)]
        finally:
            harness.close()
