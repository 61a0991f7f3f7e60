"""One process of a real Accelerate run on CPU with ``CkptAccelerate``, for the integration tests.

``python -m support.integ_accelerate_run --out FILE --until N [--slow-rank R --slow-seconds S]`` with the
launcher's and the job's variables set. It loads the latest published state, then trains up to step ``N``,
saving every second step; process ``R`` sleeps before each save, so its ``random_states_R.pkl`` comes last.
The main process writes ``FILE``: each publication with the save's files at that moment, the step it
started from, and the weights it loaded and saved.
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


if __name__ == "__main__":
    main()
