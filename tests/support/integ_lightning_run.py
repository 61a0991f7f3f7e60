"""One rank of a real 2-process Lightning DDP run on CPU (gloo) with ``CkptModelCheckpoint``, for the tests.

``python -m support.integ_lightning_run --out FILE --marks DIR --max-steps N [--slow-rank R --slow-seconds S]
[--async-io] [--sharded]`` with the launcher's and the job's variables set. Rank ``R`` sleeps in
``on_save_checkpoint`` (before every save) and then creates ``DIR/rank-R-step-<step>``, so a publication
that came before every rank reached the save's barrier would not find that mark. The main process writes
``FILE``: each publication with whether the mark existed and the checkpoint file's size at that moment;
where it resumed
from; the global step training started at.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from ckpt.domain.entries import Entry
from ckpt.integrations.lightning import (
    CHECKPOINT_FILE,
    CkptAsyncCheckpointIO,
    CkptModelCheckpoint,
    resume_location,
)
from support.integ_launch import end_rank


class Tiny(LightningModule):
    def __init__(self, marks: Path, slow_rank: int, slow_seconds: float) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.marks, self.slow_rank, self.slow_seconds = marks, slow_rank, slow_seconds
        self.started_at: int | None = None

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return ((self.layer(x).squeeze(-1) - y) ** 2).mean()

    def configure_model(self) -> None:
        if self.device_mesh is not None:  # ModelParallelStrategy (--sharded): shard over the data ranks
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self) -> None:
        self.started_at = int(self.trainer.global_step)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.global_rank == self.slow_rank:
            time.sleep(self.slow_seconds)
            (self.marks / f"rank-{self.slow_rank}-step-{self.trainer.global_step}").touch()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--marks", required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--async-io", action="store_true")
    parser.add_argument("--sharded", action="store_true")
    options = parser.parse_args()
    marks = Path(options.marks)

    published: list[dict[str, Any]] = []

    def on_published(entry: Entry) -> None:
        save = checkpoint.job.store.location(entry)
        mark = marks / f"rank-{options.slow_rank}-step-{entry.step}"
        size = os.path.getsize(os.path.join(save, CHECKPOINT_FILE))
        published.append({"epoch": entry.epoch, "step": entry.step, "mark": mark.exists(), "size": size})

    checkpoint = CkptModelCheckpoint(
        every_n_train_steps=2, save_last=True, publisher_options={"on_published": on_published}
    )
    data = torch.utils.data.TensorDataset(torch.ones(64, 4), torch.ones(64))
    trainer = Trainer(
        accelerator="cpu",
        devices=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
        if options.sharded
        else "ddp",
        max_steps=options.max_steps,
        callbacks=[checkpoint],
        plugins=[CkptAsyncCheckpointIO()] if options.async_io else None,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Tiny(marks, options.slow_rank, options.slow_seconds)
    ckpt_path = resume_location()
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        report = {"published": published, "resumed_from": ckpt_path, "started_at": model.started_at}
        with open(options.out, "w") as f:
            json.dump(report, f)
    end_rank()  # the process group goes and the process leaves now (support.integ_launch)


if __name__ == "__main__":
    main()
