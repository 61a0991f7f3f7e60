"""The PyTorch DCP integration, a real 2-process gloo run on CPU: async saves, a slow rank, resume, fence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import resolve_verified
from ckpt.domain.errors import InvalidError
from ckpt.domain.frameworks import Framework
from ckpt.integrations.core import Publisher, open_job
from support.integ_launch import run_ranks

pytestmark = [pytest.mark.frameworks, pytest.mark.filterwarnings("ignore::UserWarning")]


def run(root: Path, attempt: str, epoch: int, out: Path, *args: str) -> dict[str, Any]:
    env = {"CKPT_ROOT": str(root), "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt}
    run_ranks("support.integ_dcp_run", ["--out", str(out), *args], world_size=2, env=env)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


class TestOptions:
    def test_rank_local_saves_and_a_checkpoint_id_are_refused(self, tmp_path: Path) -> None:
        """use_collectives=False has no global .metadata to wait for; the location comes from the step."""
        pytest.importorskip("torch")
        from ckpt.integrations.dcp import CkptDCP, step_of

        saver = CkptDCP(root=str(tmp_path), epoch=1, attempt="a", environ={})
        with pytest.raises(InvalidError, match="use_collectives"):
            saver.save({}, 5, use_collectives=False)
        with pytest.raises(InvalidError, match="checkpoint_id"):
            saver.async_save({}, 5, checkpoint_id=str(tmp_path))
        assert saver.checkpoint_id(5) == f"{tmp_path}/exec/a/step-5"
        assert step_of(saver.checkpoint_id(5)) == 5

    def test_made_before_the_process_group_is_refused(self, tmp_path: Path) -> None:
        """With several processes and no process group yet, every rank would publish: refused."""
        pytest.importorskip("torch")
        from ckpt.integrations.dcp import CkptDCP

        with pytest.raises(InvalidError, match="init_process_group"):
            CkptDCP(root=str(tmp_path), epoch=1, attempt="a", environ={"WORLD_SIZE": "2"})


class TestTwoRanks:
    def test_async_saves_publish_when_whole_resume_and_fence_a_zombie(self, tmp_path: Path) -> None:
        """Each async save is published once .metadata and every rank's shard exist, at the step it was
        scheduled with; the next execution loads the newest and continues; its epoch fences a zombie."""
        pytest.importorskip("torch")
        root = tmp_path / "root"
        root.mkdir()
        first = run(
            root, "a", 10, tmp_path / "a.json", "--until", "2", "--slow-rank", "1", "--slow-seconds", "1.5"
        )
        assert [(p["epoch"], p["step"]) for p in first["published"]] == [(10, 1), (10, 2)]
        for publication in first["published"]:
            save = root / "exec" / "a" / f"step-{publication['step']}"
            assert publication["files"] == {f.name: f.stat().st_size for f in save.iterdir()}
            assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(publication["files"])

        second = run(root, "b", 20, tmp_path / "b.json", "--until", "3")
        assert second["resumed_from"] == str(root / "exec" / "a" / "step-2")
        assert second["start"] == 3
        assert second["loaded_sum"] == pytest.approx(first["sums"]["2"])
        store = PosixStore(str(root))
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 1), (10, 2), (20, 3)]

        zombie = Publisher(open_job(root=str(root), epoch=10, attempt="a", environ={}), is_main=True)
        shutil.copytree(root / "exec" / "a" / "step-2", root / "exec" / "a" / "step-900")
        assert zombie.publish(900, str(root / "exec" / "a" / "step-900")) is not None
        verified = resolve_verified(store, Framework.DCP)
        assert verified.entry is not None
        assert (verified.entry.epoch, verified.entry.step) == (20, 3)
