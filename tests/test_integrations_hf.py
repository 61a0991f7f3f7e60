"""The Hugging Face Trainer integration on a real 2-process gloo run on CPU, with a deliberately slow rank."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import resolve_verified
from ckpt.domain.frameworks import Framework
from ckpt.integrations.core import Publisher, open_job
from support.integ_launch import TESTS, free_port, run_killed_ranks, run_ranks

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

SLOW_SECONDS = 2.0


def run(root: Path, attempt: str, epoch: int, out: Path, *args: str, world_size: int = 2) -> dict[str, Any]:
    env = {"CKPT_ROOT": str(root), "DISPATCH_EPOCH": str(epoch), "DISPATCH_ATTEMPT": attempt}
    run_ranks("support.integ_hf_run", ["--out", str(out), *args], world_size=world_size, env=env)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


class TestMissingSettings:
    def test_missing_epoch_is_an_error_at_construction(self, tmp_path: Path) -> None:
        """A callback without an epoch refuses to be made, naming DISPATCH_EPOCH."""
        pytest.importorskip("transformers")
        from ckpt.domain.errors import InvalidError
        from ckpt.integrations.hf import CkptCallback

        with pytest.raises(InvalidError, match="DISPATCH_EPOCH"):
            CkptCallback(root=str(tmp_path), attempt="a", environ={})


class TestTwoRanks:
    def test_publish_after_every_rank_resume_jit_save_and_fence_a_zombie(self, tmp_path: Path) -> None:
        """Nothing is published before the slow rank's files exist; the next start catches up the JIT save,
        resumes at the right step, and its higher epoch fences the old execution's later publications."""
        pytest.importorskip("transformers")
        root = tmp_path / "root"
        root.mkdir()
        first = run(
            root, "a", 10, tmp_path / "a.json", "--max-steps", "8", "--slow-rank", "1",
            "--slow-seconds", str(SLOW_SECONDS), "--jit-at-step", "5",
        )  # fmt: skip
        # Published by the main process only after rank 1, sleeping before its RNG state, had written it.
        assert [(p["epoch"], p["step"]) for p in first["published"]] == [(10, 2), (10, 4)]
        for publication in first["published"]:
            save = Path(publication["save"])
            final = {f.name: f.stat().st_size for f in save.iterdir()}
            assert publication["files"] == final, "published before every rank had finished writing"
            assert "rng_state_1.pth" in publication["files"]
        # The JIT save at step 5 exists on disk but was never published (on_save does not fire for it).
        assert first["final_step"] == 5
        assert (root / "exec" / "a" / "checkpoint-5" / "trainer_state.json").exists()
        store = PosixStore(str(root))
        assert [e.step for e in store.entries()] == [2, 4]

        second = run(root, "b", 20, tmp_path / "b.json", "--max-steps", "7")
        assert second["resumed_from"] == str(root / "exec" / "a" / "checkpoint-5")
        assert (second["first_step"], second["final_step"]) == (6, 7)
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 2), (10, 4), (10, 5), (20, 6), (20, 7)]

        # A zombie of the first execution keeps publishing, at a higher step but its own, older epoch.
        zombie = Publisher(open_job(root=str(root), epoch=10, attempt="a", environ={}), is_main=True)
        shutil.copytree(root / "exec" / "a" / "checkpoint-5", root / "exec" / "a" / "checkpoint-900")
        assert zombie.publish(900, str(root / "exec" / "a" / "checkpoint-900")) is not None
        verified = resolve_verified(store, Framework.HF)
        assert verified.entry is not None
        assert (verified.entry.epoch, verified.entry.step) == (20, 7)


class TestRecordedWorldSize:
    def test_resume_location_passes_over_a_save_missing_rank_1s_rng_state(self, tmp_path: Path) -> None:
        """Issue 20, case 5: a 2-process run dies at its step-4 save with rank 1's RNG state never written
        (rank 0's part whole, trainer_state.json too). Its publisher recorded the world size 2 beside the
        epoch, so the next start's resume_location(args), given no world size, judges checkpoint-4 by it:
        not caught up, and every rank resumes from checkpoint-2 (without the record it resumed from 4)."""
        pytest.importorskip("transformers")
        root = tmp_path / "root"
        root.mkdir()
        env = {"CKPT_ROOT": str(root), "DISPATCH_EPOCH": "10", "DISPATCH_ATTEMPT": "a"}
        args = ["--out", str(tmp_path / "a.json"), "--max-steps", "8", "--kill-at", "4:rank1-without-rng"]
        run_killed_ranks("support.integ_hf_run", args, world_size=2, env=env, killed=0, logs=tmp_path / "a")
        cut = root / "exec" / "a" / "checkpoint-4"
        assert (cut / "trainer_state.json").exists()
        assert (cut / "rng_state_0.pth").exists()
        assert not (cut / "rng_state_1.pth").exists()
        assert (root / "exec" / "a" / ".ckpt-world-size").read_bytes() == b"2\n"
        store = PosixStore(str(root))
        assert [e.step for e in store.entries()] == [2]

        second = run(root, "b", 20, tmp_path / "b.json", "--max-steps", "4")
        assert second["resumed_from"] == str(root / "exec" / "a" / "checkpoint-2")
        assert second["first_step"] == 3
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 2), (20, 4)]
        assert (root / "exec" / "b" / ".ckpt-world-size").read_bytes() == b"2\n"


def _complete(save: Path) -> bool:
    try:
        state = json.loads((save / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and all(
        (save / n).exists() for n in ("model.safetensors", "rng_state.pth")
    )


@pytest.mark.slow
class TestKilled:
    @pytest.mark.parametrize(("kill_at", "expected"), [("4:before-state", 2), ("4:before-publish", 4)])
    def test_a_real_run_killed_mid_save_loses_no_complete_save(
        self, tmp_path: Path, kill_at: str, expected: int
    ) -> None:
        """SIGKILL mid-save, or between a whole save and its publication: every published save is complete,
        and the next start's `ckpt resume` publishes and returns the newest complete save."""
        pytest.importorskip("transformers")
        root = tmp_path / "root"
        root.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
        env.update({"CKPT_ROOT": str(root), "DISPATCH_EPOCH": "10", "DISPATCH_ATTEMPT": "a"})
        env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"})
        env["MASTER_PORT"] = str(free_port())
        killed = subprocess.run(
            [sys.executable, "-m", "support.integ_hf_run", "--out", str(tmp_path / "a.json"),
             "--max-steps", "8", "--kill-at", kill_at],
            cwd=TESTS, env=env, capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-2000:] + killed.stderr[-2000:]
        store = PosixStore(str(root))
        assert [e.step for e in store.entries()] == [2]
        env.update({"DISPATCH_EPOCH": "20", "DISPATCH_ATTEMPT": "b"})
        resumed = subprocess.run(
            [sys.executable, "-m", "ckpt", "resume", "--framework", "hf", "--settle", "0.2"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout == f"{root}/exec/a/checkpoint-{expected}\n"
        assert all(_complete(Path(store.location(e))) for e in store.entries())
        assert store.entries()[-1].step == expected
