"""One process of a real Accelerate run on CPU with ``CkptAccelerate``, for the integration tests.

``python -m support.integ_accelerate_run --out FILE --until N [--slow-rank R --slow-seconds S] [--custom K]``
with the launcher's and the job's variables set; ``K`` objects are registered for checkpointing (their
``custom_checkpoint_<i>.pkl`` files: ``load_state`` raises when a save holds another count). It loads the
latest published state, then trains up to step ``N``, saving every second step; process ``R`` sleeps before
each save, so its ``random_states_R.pkl`` comes last. The main process writes ``FILE``: each publication
with the save's files at that moment, the step it started from, and the weights it loaded and saved.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ckpt.domain.entries import Entry
from ckpt.integrations.accelerate import CkptAccelerate
from support.integ_launch import end_rank


class Counter:
    """An object registered for checkpointing: Accelerate saves it as custom_checkpoint_<i>.pkl."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.value = int(state["value"])


class SlowSaves(CkptAccelerate):
    slow_process = -1
    slow_seconds = 0.0

    def save_state(self, step: int, **options: Any) -> str:
        if self.accelerator.process_index == self.slow_process:
            time.sleep(self.slow_seconds)
        return super().save_state(step, **options)


def weight_sum(model: nn.Module) -> float:
    return float(sum(p.detach().sum() for p in model.parameters()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--until", type=int, required=True)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--custom", type=int, default=0)
    options = parser.parse_args()

    published: list[dict[str, Any]] = []

    def on_published(entry: Entry) -> None:
        save = saver.job.store.location(entry)
        files = {name: os.path.getsize(os.path.join(save, name)) for name in sorted(os.listdir(save))}
        published.append({"epoch": entry.epoch, "step": entry.step, "files": files})

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    for _ in range(options.custom):
        accelerator.register_for_checkpointing(Counter())
    saver = SlowSaves(accelerator, publisher_options={"on_published": on_published})
    saver.slow_process, saver.slow_seconds = options.slow_rank, options.slow_seconds
    resumed = saver.resume_location()
    start = saver.load_latest() + 1
    loaded = weight_sum(model)
    sums: dict[int, float] = {}
    for step in range(start, options.until + 1):
        optimizer.zero_grad()
        accelerator.backward(model(torch.ones(2, 4)).pow(2).mean())
        optimizer.step()
        if step % 2 == 0:
            sums[step] = weight_sum(model)
            saver.save_state(step)
    if accelerator.is_main_process:
        report = {
            "published": published,
            "resumed_from": resumed,
            "start": start,
            "loaded": loaded,
            "sums": sums,
        }
        with open(options.out, "w") as f:
            json.dump(report, f)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    end_rank()  # the process group goes and the process leaves now (support.integ_launch)


if __name__ == "__main__":
    main()
