"""One rank of a real 2-process PyTorch DCP run on CPU (gloo) with ``CkptDCP.async_save``, for the tests.

``python -m support.integ_dcp_run --out FILE --until N [--slow-rank R --slow-seconds S]`` with the launcher's
and the job's variables set. It resumes from ``resume_location()`` (loading the model and the step), then
trains one step at a time up to step ``N``, async-saving every step and training the next step while
the save is in flight (waiting for it before the next save, as torchtitan does); rank ``R`` sleeps
before each save, so rank 0's save cannot be whole before rank ``R`` has written its shard. The main process
writes ``FILE``: each publication with the save's files at that moment, where it resumed from, the step it
started at, and the sum of the model's weights it loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ckpt.domain.entries import Entry
from ckpt.integrations.dcp import CkptDCP, resume_location, step_of


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--until", type=int, required=True)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    options = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    published: list[dict[str, Any]] = []

    def on_published(entry: Entry) -> None:
        save = saver.job.store.location(entry)
        files = {name: os.path.getsize(os.path.join(save, name)) for name in sorted(os.listdir(save))}
        published.append({"epoch": entry.epoch, "step": entry.step, "files": files})

    saver = CkptDCP(publisher_options={"on_published": on_published})
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    location = resume_location(settle=0)
    start, loaded = 1, None
    if location is not None:
        state = {"model": model.state_dict()}
        import torch.distributed.checkpoint as dcp

        dcp.load(state, checkpoint_id=location)  # type: ignore[attr-defined]
        model.load_state_dict(state["model"])
        start, loaded = step_of(location) + 1, float(sum(p.detach().sum() for p in model.parameters()))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    futures = []
    sums: dict[int, float] = {}
    for step in range(start, options.until + 1):
        optimizer.zero_grad()
        model(torch.ones(3, 4)).pow(2).mean().backward()
        optimizer.step()
        if rank == options.slow_rank:
            time.sleep(options.slow_seconds)
        sums[step] = float(sum(p.detach().sum() for p in model.parameters()))
        if futures:
            futures[-1].result()  # one save in flight at a time, as torchtitan does: saves are collectives
        futures.append(saver.async_save({"model": model.state_dict()}, step))
    for future in futures:
        future.result()
    saver.close()  # waits for the publications, then (with a durable root) for their replication
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        report = {"published": published, "resumed_from": location, "start": start, "loaded_sum": loaded}
        report["sums"] = sums
        with open(options.out, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main()
    # Every rank's work is done and rank 0's report is written and closed: skip the interpreter's teardown.
    # In one CI run (2026-12-07) rank 1 of a resumed run aborted there, "terminate called without an active
    # exception" (a C++ thread of torch's still joinable as its static objects were destroyed), after all
    # that the test reads was in place; a crash before this point still fails the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
