"""One process of a real Hugging Face Trainer run with ``CkptCallback`` on CPU (gloo), for integration tests.

Run as ``python -m support.integ_hf_run --out FILE --max-steps N [--slow-rank R --slow-seconds S]
[--resume auto|none|PATH] [--jit-at-step N] [--kill-at STEP:before-state|before-publish]`` with the
launcher's variables set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and
the job's (``CKPT_ROOT``, ``DISPATCH_EPOCH``, ``DISPATCH_ATTEMPT``). ``--kill-at`` SIGKILLs the process at
that step's save: after its RNG state and before ``trainer_state.json``, or in ``on_save`` just before
``CkptCallback`` (the save whole, not yet published). ``STEP:rank1-without-rng`` cuts one rank short at that
step's save: rank 1 stops just before writing its RNG state and waits there (never writing it), and rank 0,
its part whole, SIGKILLs itself in ``on_save`` before the publication: the launcher then kills rank 1, and the
save lacks ``rng_state_1.pth`` whatever the timing.
Rank ``R`` sleeps before writing its RNG state, the last file of its part of every save, so it is still
writing after the main process has finished its part. The main process writes ``FILE``: JSON with, for each
publication, the save's files and sizes at that moment; where it resumed from; the first step it trained.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from typing import Any

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments

from ckpt.domain.entries import Entry
from ckpt.integrations.hf import CkptCallback, resume_location
from support.integ_launch import end_rank


class TinyRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.linear(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


class Numbers(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.arange(4, dtype=torch.float32) * (i % 7) / 7
        return {"x": x, "labels": x.sum()}


class SlowRankTrainer(Trainer):
    slow_rank = -1
    slow_seconds = 0.0
    kill_before_state_at = -1
    stall_before_rng_at = -1

    def _save_rng_state(self, output_dir: str) -> None:
        if self.state.global_step == self.stall_before_rng_at:
            while True:  # this rank never writes its RNG state; the launcher kills it
                time.sleep(1)
        if self.args.process_index == self.slow_rank:
            time.sleep(self.slow_seconds)
        super()._save_rng_state(output_dir)
        if self.state.global_step == self.kill_before_state_at:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-save: every file but trainer_state.json is written


class KillBeforePublish(TrainerCallback):  # type: ignore[misc]
    """Placed before CkptCallback: dies in on_save, after the save is whole and before it is published."""

    step = -1

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


class FirstStep(TrainerCallback):  # type: ignore[misc]
    def __init__(self) -> None:
        self.first: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.first is None:
            self.first = int(state.global_step)


class JitSave(TrainerCallback):  # type: ignore[misc]
    """At one step, save and stop the way the Trainer's SIGTERM handling does: ``on_save`` never fires."""

    trainer: Any = None
    step = -1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            from transformers.trainer_jit_checkpoint import CheckpointManager

            CheckpointManager(self.trainer).execute_jit_checkpoint()
            control.should_save = False
            control.should_training_stop = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    parser.add_argument("--resume", default="auto")
    parser.add_argument("--jit-at-step", type=int, default=-1, help="save and stop there as a SIGTERM would")
    parser.add_argument(
        "--kill-at", default="", help="STEP:before-state, STEP:before-publish or STEP:rank1-without-rng"
    )
    options = parser.parse_args()

    published: list[dict[str, Any]] = []

    def on_published(entry: Entry) -> None:
        save = callback.job.store.location(entry)
        files = {name: os.path.getsize(os.path.join(save, name)) for name in sorted(os.listdir(save))}
        published.append({"epoch": entry.epoch, "step": entry.step, "save": save, "files": files})

    callback = CkptCallback(publisher_options={"on_published": on_published})
    args = TrainingArguments(
        output_dir=callback.saves_location,
        max_steps=options.max_steps,
        save_strategy="steps",
        save_steps=2,
        save_total_limit=None,
        per_device_train_batch_size=4,
        learning_rate=0.01,
        logging_steps=1000,
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )
    if options.resume == "auto":
        resume_from = resume_location(args, settle=0.5)
    elif options.resume == "none":
        resume_from = None
    else:
        resume_from = options.resume
    first = FirstStep()
    jit = JitSave()
    killer = KillBeforePublish()
    kill_step, _, kill_where = options.kill_at.partition(":")
    if kill_where == "before-publish" or (kill_where == "rank1-without-rng" and args.process_index != 1):
        killer.step = int(kill_step)
    trainer = SlowRankTrainer(
        model=TinyRegressor(), args=args, train_dataset=Numbers(), callbacks=[killer, callback, first, jit]
    )
    trainer.slow_rank = options.slow_rank
    trainer.slow_seconds = options.slow_seconds
    if kill_where == "before-state":
        trainer.kill_before_state_at = int(kill_step)
    if kill_where == "rank1-without-rng" and args.process_index == 1:
        trainer.stall_before_rng_at = int(kill_step)
    jit.trainer = trainer
    jit.step = options.jit_at_step
    trainer.train(resume_from_checkpoint=resume_from)
    if args.process_index == 0:
        report = {
            "published": published,
            "resumed_from": resume_from,
            "first_step": first.first,
            "final_step": trainer.state.global_step,
        }
        with open(options.out, "w") as f:
            json.dump(report, f)
    end_rank()  # the process group goes and the process leaves now (support.integ_launch)


if __name__ == "__main__":
    main()
