"""One rank of a real 2-process run that SIGKILLs itself at a fixed point of one save, for the crash tests.

``python -m support.integ_killed_run --framework dcp|lightning|accelerate --kill-step N --kill-at POINT``
with the launcher's and the job's variables set (``support.integ_launch``). The run saves every step (DCP,
``async_save``) or every second step (Lightning DDP, Accelerate) and, at the save of step ``N``, the rank
named by ``POINT`` kills itself with SIGKILL, as a node failure would; the test then kills the other rank.
Each point is a fixed moment, so the files on disk afterwards are the same on every run:

* ``dcp``: ``rank1-before-shard``: rank 1, before writing its shard (rank 0's may be written, ``.metadata``
  never is); ``main-before-publish``: rank 0, once the future resolved (``.metadata`` in place), right
  before the integration's publication.
* ``lightning``: ``main-torn-file``: rank 0, with ``model.ckpt`` cut to half its length (a copy into place
  that did not finish); ``main-before-publish``: rank 0, with ``model.ckpt`` whole, before the barrier and
  the publication.
* ``accelerate`` (two objects registered for checkpointing): ``rank1-before-save``: process 1, before it
  writes anything of the save (its ``random_states_1.pkl`` never appears); ``main-before-custom``: process
  0, with ``random_states_0.pkl`` written, before ``custom_checkpoint_0.pkl`` (Accelerate asks the first
  object for its state); ``main-between-custom``: process 0, with ``custom_checkpoint_0.pkl`` written,
  before ``custom_checkpoint_1.pkl``; ``main-before-publish``: process 0, after every process passed the
  integration's barrier, right before the publication.

The saves before step ``N`` are published normally (the DCP loop waits for each publication before the next
save, so which ones are published when the kill comes does not depend on timing).
"""

from __future__ import annotations

import argparse
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run_dcp(kill_step: int, point: str) -> None:
    import torch.distributed as dist
    from torch.distributed.checkpoint import FileSystemWriter

    from ckpt.integrations.dcp import CkptDCP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    target = f"step-{kill_step}"

    class KillingWriter(FileSystemWriter):  # type: ignore[misc]
        def write_data(self, plan: Any, planner: Any) -> Any:
            if point == "rank1-before-shard" and rank == 1 and Path(str(self.path)).name == target:
                die()
            return super().write_data(plan, planner)

    saver = CkptDCP()
    if point == "main-before-publish" and rank == 0:
        publish_now = saver.publisher.publish_now

        def killing_publish(step: int, location: str) -> Any:
            if step == kill_step:
                die()
            return publish_now(step, location)

        saver.publisher.publish_now = killing_publish  # type: ignore[method-assign]
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    future = None
    for step in range(1, kill_step + 2):
        optimizer.zero_grad()
        model(torch.ones(3, 4)).pow(2).mean().backward()
        optimizer.step()
        if future is not None:
            future.result()
            saver.wait()  # the previous save is published before the next starts (module docstring)
        writer = KillingWriter(saver.checkpoint_id(step))
        future = saver.async_save({"model": model.state_dict()}, step, storage_writer=writer)
    if future is not None:
        future.result()
    saver.wait()
    dist.destroy_process_group()


def run_lightning(kill_step: int, point: str) -> None:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    from ckpt.integrations.lightning import CkptModelCheckpoint

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
            x, y = batch
            return ((self.layer(x).squeeze(-1) - y) ** 2).mean()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class KillingIO(TorchCheckpointIO):  # type: ignore[misc]
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            super().save_checkpoint(checkpoint, path, storage_options)
            if Path(str(path)).parent.name == f"step-{kill_step}":
                if point == "main-torn-file":
                    os.truncate(path, os.path.getsize(path) // 2)
                die()

    data = torch.utils.data.TensorDataset(torch.ones(64, 4), torch.ones(64))
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=kill_step + 2,
        callbacks=[CkptModelCheckpoint(every_n_train_steps=2)],
        plugins=[KillingIO()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=4))


def run_accelerate(kill_step: int, point: str) -> None:
    from accelerate import Accelerator

    from ckpt.integrations.accelerate import CkptAccelerate
    from support.integ_accelerate_run import Counter

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    saving: list[int] = []

    class Killing(Counter):
        """Dies when Accelerate asks it for its state at the kill step: before its file is written."""

        def __init__(self, dies_at: str) -> None:
            super().__init__()
            self.dies_at = dies_at

        def state_dict(self) -> dict[str, int]:
            if point == self.dies_at and accelerator.is_main_process and saving[-1] == kill_step:
                die()
            return super().state_dict()

    accelerator.register_for_checkpointing(Killing("main-before-custom"))
    accelerator.register_for_checkpointing(Killing("main-between-custom"))
    saver = CkptAccelerate(accelerator)
    barrier: Callable[[], None] = saver.publisher.barrier

    def killing_barrier() -> None:
        barrier()
        if point == "main-before-publish" and accelerator.is_main_process and saving[-1] == kill_step:
            die()

    saver.publisher.barrier = killing_barrier
    for step in range(1, kill_step + 3):
        optimizer.zero_grad()
        accelerator.backward(model(torch.ones(2, 4)).pow(2).mean())
        optimizer.step()
        if step % 2 == 0:
            saving.append(step)
            if point == "rank1-before-save" and accelerator.process_index == 1 and step == kill_step:
                die()
            saver.save_state(step)
    accelerator.wait_for_everyone()
    accelerator.end_training()


RUNS = {"dcp": run_dcp, "lightning": run_lightning, "accelerate": run_accelerate}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", required=True, choices=sorted(RUNS))
    parser.add_argument("--kill-step", type=int, required=True)
    parser.add_argument("--kill-at", required=True)
    options = parser.parse_args()
    RUNS[options.framework](options.kill_step, options.kill_at)
    raise SystemExit("the run ended without reaching its kill point")


if __name__ == "__main__":
    main()
