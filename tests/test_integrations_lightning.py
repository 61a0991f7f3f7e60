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


class TestCatchUp:
    def _record(self, root: Path, attempt: str, epoch: int) -> None:
        from ckpt.catchup import record_epoch

        record_epoch(PosixStore(str(root)), attempt, epoch)

    def test_whole_saves_only(self, tmp_path: Path) -> None:
        """A torch.save file with its zip end record is whole; a truncated one, or a sharded folder without
        meta.pt, is not."""
        torch = pytest.importorskip("torch")
        from ckpt.integrations.lightning import is_whole_save

        store = PosixStore(str(tmp_path))
        whole = tmp_path / "step-1"
        whole.mkdir()
        torch.save({"weights": torch.ones(64)}, whole / "model.ckpt")
        cut = tmp_path / "step-2"
        cut.mkdir()
        (cut / "model.ckpt").write_bytes((whole / "model.ckpt").read_bytes()[:-30])
        sharded = tmp_path / "step-3" / "model.ckpt"
        sharded.mkdir(parents=True)
        (sharded / ".metadata").write_bytes(b"m")
        assert is_whole_save(store, str(whole))
        assert not is_whole_save(store, str(cut))
        assert not is_whole_save(store, str(tmp_path / "step-3"))
        (sharded / "meta.pt").write_bytes(b"p")
        assert is_whole_save(store, str(tmp_path / "step-3"))

    def test_a_big_checkpoint_is_judged_by_its_tail(self, tmp_path: Path) -> None:
        """A 96 MiB (sparse) file is whole when its last bytes hold the zip end record, and not otherwise."""
        pytest.importorskip("lightning")
        from ckpt.integrations.lightning import is_whole_save

        save = tmp_path / "step-1"
        save.mkdir()
        with (save / "model.ckpt").open("wb") as f:
            f.truncate(96 << 20)
        assert not is_whole_save(PosixStore(str(tmp_path)), str(save))
        with (save / "model.ckpt").open("ab") as f:
            f.write(b"PK\x05\x06" + bytes(18))
        assert is_whole_save(PosixStore(str(tmp_path)), str(save))

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
        assert resume_location(root=str(tmp_path), epoch=20, attempt="b", environ={}) == str(
            whole / "model.ckpt"
        )
        assert [(e.epoch, e.step) for e in PosixStore(str(tmp_path)).entries()] == [(10, 8)]


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
