"""The Accelerate integration on a real 2-process run on CPU (gloo): a slow process, resume, fencing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.integrations.core import Publisher, newest_with_file, open_job
from support.integ_launch import run_ranks

pytestmark = [pytest.mark.frameworks, pytest.mark.filterwarnings("ignore::UserWarning")]


def run(root: Path, attempt: str, epoch: int, out: Path, *args: str) -> dict[str, Any]:
    env = {"CKPT_ROOT": str(root), "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt}
    run_ranks("support.integ_accelerate_run", ["--out", str(out), *args], world_size=2, env=env)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


class TestTwoProcesses:
    def test_publish_after_everyone_saved_resume_and_fence_a_zombie(self, tmp_path: Path) -> None:
        """Each save is published once the slow process wrote its RNG state; the next execution loads the
        newest, continues at the next step, and its epoch fences a zombie."""
        pytest.importorskip("accelerate")
        root = tmp_path / "root"
        root.mkdir()
        first = run(
            root, "a", 10, tmp_path / "a.json", "--until", "4", "--slow-rank", "1", "--slow-seconds", "1.5"
        )
        assert [(p["epoch"], p["step"]) for p in first["published"]] == [(10, 2), (10, 4)]
        for publication in first["published"]:
            save = root / "exec" / "a" / f"step-{publication['step']}"
            assert publication["files"] == {f.name: f.stat().st_size for f in save.iterdir()}
            assert "random_states_1.pkl" in publication["files"]

        second = run(root, "b", 20, tmp_path / "b.json", "--until", "6")
        assert second["resumed_from"] == str(root / "exec" / "a" / "step-4")
        assert second["start"] == 5
        assert second["loaded"] == pytest.approx(first["sums"]["4"])
        store = PosixStore(str(root))
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 2), (10, 4), (20, 6)]

        zombie = Publisher(open_job(root=str(root), epoch=10, attempt="a", environ={}), is_main=True)
        shutil.copytree(root / "exec" / "a" / "step-4", root / "exec" / "a" / "step-900")
        assert zombie.publish(900, str(root / "exec" / "a" / "step-900")) is not None
        newest = newest_with_file(store, "random_states_0.pkl", folder_prefix="step-")
        assert newest == str(root / "exec" / "b" / "step-6")


class TestCatchUp:
    def test_resume_publishes_only_saves_every_process_finished(self, tmp_path: Path) -> None:
        """A save with every process's RNG state whole is caught up at its epoch and resumed from; one
        missing a process's file, or with a cut-off pickle, is not."""
        pytest.importorskip("accelerate")
        from types import SimpleNamespace

        from ckpt.catchup import record_epoch
        from ckpt.integrations.accelerate import CkptAccelerate

        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 10)
        pickled = b"\x80\x04K\x01."  # pickle of 1: ends with STOP
        for step, files in {
            4: {"random_states_0.pkl": pickled, "random_states_1.pkl": pickled},
            6: {"random_states_0.pkl": pickled},
            8: {"random_states_0.pkl": pickled, "random_states_1.pkl": pickled[:-1]},
        }.items():
            save = tmp_path / "exec" / "a" / f"step-{step}"
            save.mkdir(parents=True)
            for name, data in files.items():
                (save / name).write_bytes(data)
        # What CkptAccelerate uses of an Accelerator, for two processes, on the main one.
        accelerator = SimpleNamespace(num_processes=2, is_main_process=True, wait_for_everyone=lambda: None)
        saver = CkptAccelerate(accelerator, root=str(tmp_path), epoch=20, attempt="b", environ={})
        assert saver.resume_location() == str(tmp_path / "exec" / "a" / "step-4")
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 4)]

    def test_a_real_torch_save_is_whole_and_every_cut_of_it_is_not(self, tmp_path: Path) -> None:
        """Accelerate writes random_states_<i>.pkl with torch.save, a zip: whole with its end record at
        the very end, not whole when cut anywhere (found by the SIGKILL test: the STOP-opcode check alone
        judged every real save unfinished, so catch-up never published one)."""
        pytest.importorskip("accelerate")
        import io
        from types import SimpleNamespace

        import torch

        from ckpt.integrations.accelerate import CkptAccelerate

        buffer = io.BytesIO()
        torch.save({"step": 4, "torch_manual_seed": torch.get_rng_state()}, buffer)
        whole = buffer.getvalue()
        store = PosixStore(str(tmp_path))
        accelerator = SimpleNamespace(num_processes=1, is_main_process=True, wait_for_everyone=lambda: None)
        saver = CkptAccelerate(accelerator, root=str(tmp_path), epoch=20, attempt="b", environ={})
        save = tmp_path / "exec" / "a" / "step-4"
        save.mkdir(parents=True)
        for cut in (len(whole), len(whole) - 1, len(whole) - 22, len(whole) // 2, 1):
            (save / "random_states_0.pkl").write_bytes(whole[:cut])
            assert saver.is_whole_save(store, str(save)) == (cut == len(whole)), cut
