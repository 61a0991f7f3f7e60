"""Real framework runs on CPU against the new rules: Lightning, Orbax (JAX), and DCP without collectives.

Each test saves with the real framework into ``exec/<attempt>/`` while a watcher (the sidecar) runs beside
it, then resumes the next run from ``ckpt resolve --framework X`` (the real CLI, in a subprocess) and checks
that training continues from that step. Marked ``frameworks``; each imports its framework with
``pytest.importorskip``, so the default suite skips them where it is not installed. Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.rulebook import find_rule
from ckpt.application.watcher import Watcher
from support.sidecar import Sidecar

pytestmark = [
    pytest.mark.frameworks,
    # These tests check our watcher against the frameworks, not the frameworks' own notices.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

ATTEMPT = "5.4105.0"
EPOCH = 5_000_000


def ckpt_resolve(store: PosixStore, framework: str, *extra: str) -> dict[str, Any]:
    """``ckpt --json resolve --framework <framework>`` in a subprocess, as a job's wrapper runs it."""
    command = [sys.executable, "-m", "ckpt", "--root", store.root, "--json", "resolve", "--framework"]
    done = subprocess.run(
        [*command, framework, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


@pytest.fixture(autouse=True)
def no_process_group_left() -> Iterator[None]:
    """Lightning's ModelParallelStrategy leaves torch's default process group up; end it after each test."""
    yield
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def store(tmp_path: Path) -> PosixStore:
    root = tmp_path / "root"
    root.mkdir()
    return PosixStore(str(root))


# -- Lightning ---------------------------------------------------------------------------------------------


def _lightning_run(
    saves: str, max_steps: int, resume: str | None, *, sharded: bool = False, **trainer: Any
) -> list[int]:
    """Train a tiny model with ModelCheckpoint every 2 steps; return the global steps the batches ran at.

    ``sharded``: the model is sharded with FSDP2 over the strategy's data-parallel mesh (one CPU process),
    so ModelParallelStrategy writes (and reads back) a distributed checkpoint.
    """
    torch = pytest.importorskip("torch")
    lightning = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import ModelCheckpoint

    seen: list[int] = []

    class Tiny(lightning.LightningModule):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.layer: Any = None

        def configure_model(self) -> None:
            if self.layer is None:
                self.layer = torch.nn.Linear(4, 1)
                if sharded:
                    from torch.distributed.fsdp import fully_shard

                    fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, _index: int) -> Any:
            seen.append(self.trainer.global_step)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    generator = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator)
    data = torch.utils.data.TensorDataset(inputs, targets)
    checkpoints = ModelCheckpoint(dirpath=saves, every_n_train_steps=2, save_top_k=-1, save_last=True)
    run = lightning.Trainer(
        max_steps=max_steps,
        callbacks=[checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        **trainer,
    )
    run.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=resume)
    assert run.global_step == max_steps
    return seen


class TestLightning:
    def test_single_file_saves_publish_and_resume(self, store: PosixStore) -> None:
        """ModelCheckpoint's .ckpt files are published (last.ckpt never); the next run resumes there."""
        saves = store.exec_dir(ATTEMPT)
        with Sidecar(store, find_rule("lightning"), ATTEMPT, EPOCH, settle=0.1) as sidecar:
            _lightning_run(saves, 4, None)
        assert sorted(os.listdir(saves)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "last.ckpt"]
        assert sorted(e.step for e in sidecar.published) == [2, 4]

        resolved = ckpt_resolve(store, "lightning")
        assert resolved["step"] == 4
        assert resolved["location"] == os.path.join(saves, "epoch=0-step=4.ckpt")
        seen = _lightning_run(saves + "-resumed", 6, resolved["location"])
        assert seen == [4, 5]  # continued from step 4, not from 0

    def test_sharded_saves_publish_and_resume(self, store: PosixStore) -> None:
        """ModelParallelStrategy's sharded .ckpt folders (DCP + meta.pt) are published and resumable."""
        lightning = pytest.importorskip("lightning")
        strategies = lightning.pytorch.strategies
        strategy = strategies.ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
        saves = store.exec_dir(ATTEMPT)
        with Sidecar(store, find_rule("lightning"), ATTEMPT, EPOCH, settle=0) as sidecar:
            _lightning_run(saves, 4, None, sharded=True, strategy=strategy)
        files = sorted(os.listdir(os.path.join(saves, "epoch=0-step=4.ckpt")))
        assert files == [".metadata", "__0_0.distcp", "meta.pt"]
        assert sorted(e.step for e in sidecar.published) == [2, 4]

        resolved = ckpt_resolve(store, "lightning")
        assert resolved["step"] == 4
        strategy = strategies.ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=1)
        seen = _lightning_run(saves + "-resumed", 6, resolved["location"], sharded=True, strategy=strategy)
        assert seen == [4, 5]


# -- Orbax (JAX) -------------------------------------------------------------------------------------------


class TestOrbax:
    def test_checkpoint_manager_saves_publish_and_restore(self, store: PosixStore) -> None:
        """CheckpointManager step folders are published once committed; the next run restores the newest."""
        jnp = pytest.importorskip("jax.numpy")
        ocp = pytest.importorskip("orbax.checkpoint")

        saves = store.exec_dir(ATTEMPT)
        state = {"w": jnp.zeros(8), "step": 0}
        with Sidecar(store, find_rule("orbax"), ATTEMPT, EPOCH, settle=0) as sidecar:
            manager = ocp.CheckpointManager(saves)
            for step in (1, 2, 3):
                state = {"w": state["w"] + 1, "step": step}
                manager.save(step, args=ocp.args.StandardSave(state))
            manager.wait_until_finished()
            manager.close()
        assert sorted(e.step for e in sidecar.published) == [1, 2, 3]
        assert all(os.path.exists(os.path.join(saves, str(s), "commit_success.txt")) for s in (1, 2, 3))

        resolved = ckpt_resolve(store, "orbax")
        assert resolved["step"] == 3
        restored = ocp.StandardCheckpointer().restore(
            os.path.join(resolved["location"], "default"), {"w": jnp.zeros(8), "step": 0}
        )
        assert int(restored["step"]) == 3
        assert restored["w"].tolist() == [3.0] * 8


# -- PyTorch DCP without collectives -----------------------------------------------------------------------


class TestDcpWithoutCollectives:
    def test_rank_metadata_needs_the_world_size(self, store: PosixStore, tmp_path: Path) -> None:
        """A use_collectives=False save has only __0.metadata: published with --world-size 1, not without."""
        torch = pytest.importorskip("torch")
        dist = pytest.importorskip("torch.distributed")
        dcp = pytest.importorskip("torch.distributed.checkpoint")

        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
        try:
            folder = os.path.join(store.exec_dir(ATTEMPT), "step-10")
            dcp.save({"w": torch.arange(4.0)}, checkpoint_id=folder, use_collectives=False)
            assert sorted(os.listdir(folder)) == ["__0.metadata", "__0_0.distcp"]

            unknown = Watcher(store, find_rule("dcp"), store.exec_dir(ATTEMPT), EPOCH, 1.0)
            assert unknown.scan() == []
            known = Watcher(store, find_rule("dcp", world_size=1), store.exec_dir(ATTEMPT), EPOCH, 1.0)
            assert [e.step for e in known.scan()] == [10]

            target = {"w": torch.zeros(4)}
            dcp.load(target, checkpoint_id=folder)  # torch falls back to the rank's own metadata
            assert target["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
        finally:
            dist.destroy_process_group()
