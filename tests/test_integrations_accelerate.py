"""The Accelerate integration on a real 2-process run on CPU (gloo): a slow process, resume, fencing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.rulebook import find_rule
from ckpt.application.verify import resolve_verified
from ckpt.integrations.core import Publisher, open_job
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
        newest = resolve_verified(store, find_rule("accelerate")).entry
        assert newest is not None
        assert store.location(newest) == str(root / "exec" / "b" / "step-6")


def two_processes(**more: Any) -> Any:
    """What CkptAccelerate uses of an Accelerator, for the main one of two processes."""
    from types import SimpleNamespace

    fields = {"num_processes": 2, "is_main_process": True, "wait_for_everyone": lambda: None, **more}
    return SimpleNamespace(**fields)


def torch_saved(state: object) -> bytes:
    import io

    import torch

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def lay_out(root: Path, attempt: str, saves: dict[int, dict[str, bytes]]) -> None:
    for step, files in saves.items():
        save = root / "exec" / attempt / f"step-{step}"
        save.mkdir(parents=True)
        for name, data in files.items():
            (save / name).write_bytes(data)


class TestCatchUp:
    """The helper's catch-up asks the accelerate rule (spec/watcher.md §2.12) with the writing run's world
    size; each test is a defect of the check the integration kept before (issue 20, case 2)."""

    def resume(self, root: Path, **accelerator: Any) -> str | None:
        from ckpt.integrations.accelerate import CkptAccelerate

        saver = CkptAccelerate(
            two_processes(**accelerator), root=str(root), epoch=20, attempt="b", environ={}
        )
        return saver.resume_location()

    def test_a_save_of_more_processes_than_the_resuming_run(self, tmp_path: Path) -> None:
        """A 4-process save whose processes 2-3 never wrote their RNG state is not caught up by a 2-process
        resume: the record of the run that wrote it (4) counts, not the resuming run's 2."""
        pytest.importorskip("accelerate")
        from ckpt.catchup import record_epoch, record_world_size

        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 10)
        record_world_size(store, "a", 4)
        state = torch_saved({"step": 1})
        lay_out(
            tmp_path,
            "a",
            {
                2: {f"random_states_{p}.pkl": state for p in range(4)},
                4: {f"random_states_{p}.pkl": state for p in range(2)},
            },
        )
        assert self.resume(tmp_path) == str(tmp_path / "exec" / "a" / "step-2")
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 2)]

    def test_a_save_before_its_custom_checkpoint(self, tmp_path: Path) -> None:
        """The main process writes custom_checkpoint_<i>.pkl after its RNG state; a save killed before it
        (the manifest counts one object) is not caught up: load_state would raise on it."""
        pytest.importorskip("accelerate")
        from ckpt.catchup import record_epoch, record_world_size
        from ckpt.domain.rules.accelerate import MANIFEST

        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 10)
        record_world_size(store, "a", 2)
        state = torch_saved({"step": 1})
        whole = {
            "random_states_0.pkl": state,
            "random_states_1.pkl": state,
            MANIFEST: b'{"custom_objects": 1}',
        }
        lay_out(tmp_path, "a", {2: {**whole, "custom_checkpoint_0.pkl": state}, 4: whole})
        assert self.resume(tmp_path, _custom_objects=[object()]) == str(tmp_path / "exec" / "a" / "step-2")
        assert [(e.epoch, e.step) for e in store.entries()] == [(10, 2)]

    def test_a_torn_legacy_pickle(self, tmp_path: Path) -> None:
        """A plain pickle cut right after a '.' byte inside its data starts with PROTO and ends with 0x2e,
        which the old check took for whole; the rule walks its opcodes and refuses it."""
        pytest.importorskip("accelerate")
        import pickle

        from ckpt.catchup import record_epoch, record_world_size

        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 10)
        record_world_size(store, "a", 2)
        whole = pickle.dumps({"seed": b"a.b", "step": 4}, protocol=2)
        torn = whole[: whole.index(b"a.") + 2]
        assert torn.startswith(b"\x80")
        assert torn.endswith(b".")
        lay_out(
            tmp_path,
            "a",
            {
                2: {"random_states_0.pkl": whole, "random_states_1.pkl": whole},
                4: {"random_states_0.pkl": whole, "random_states_1.pkl": torn},
            },
        )
        assert self.resume(tmp_path) == str(tmp_path / "exec" / "a" / "step-2")

    def test_a_real_torch_save_is_whole_and_every_cut_of_it_is_not(self, tmp_path: Path) -> None:
        """Accelerate writes random_states_<i>.pkl with torch.save, a zip: whole with its end record at
        the very end, not whole when cut anywhere (the rule's zip check, spec/watcher.md §2.4)."""
        pytest.importorskip("accelerate")
        import torch

        from ckpt.catchup import record_epoch, record_world_size

        whole = torch_saved({"step": 4, "torch_manual_seed": torch.get_rng_state()})
        store = PosixStore(str(tmp_path))
        record_epoch(store, "a", 10)
        record_world_size(store, "a", 1)
        lay_out(tmp_path, "a", {4: {"random_states_0.pkl": whole}})
        from ckpt.application.inspection import judge, saves_reader
        from ckpt.domain.rules import Save

        rule = find_rule("accelerate", world_size=1)
        reader = saves_reader(store, store.exec_dir("a"))
        for cut in (len(whole), len(whole) - 1, len(whole) - 22, len(whole) // 2, 1):
            (tmp_path / "exec" / "a" / "step-4" / "random_states_0.pkl").write_bytes(whole[:cut])
            assert (judge(rule, Save(4, "step-4"), (), reader) is None) == (cut == len(whole)), cut
