"""One rank of a real 2-process gloo run whose attempt is too long for its saves (spec/names.md §4.5).

``python -m support.integ_names_run --out-dir DIR`` with the launcher's and the job's variables set. Each rank
makes ``CkptDCP`` and calls ``resume_location()``: both must refuse on every rank alike, before any save or
collective. When one does not refuse, the rank goes on as a training script would: a ``dcp.save`` of step
500 (whose publication fails on rank 0 only). Then every rank joins one ``all_reduce``, bounded by the
process group's timeout, and writes ``DIR/rank-<i>.json``: what each call raised and the reduced sum. A
rank that never reaches the end (a peer hung or gone) writes nothing, and the test says so.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ckpt.domain.errors import InvalidError
from ckpt.integrations.dcp import CkptDCP, resume_location


def _refusal(call: Any) -> str | None:
    """The message of the ``InvalidError`` ``call`` raised, else ``None`` (it went through)."""
    try:
        call()
    except InvalidError as exc:
        return str(exc)
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out-dir", required=True)
    options = parser.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    rank = dist.get_rank()
    report: dict[str, Any] = {}

    made: list[CkptDCP] = []
    report["constructor"] = _refusal(lambda: made.append(CkptDCP()))
    report["resume_location"] = _refusal(lambda: resume_location(settle=0))
    if made:  # not refused: save as the training loop would, and find out where the publication fails
        report["save"] = _refusal(lambda: made[0].save({"w": torch.ones(2)}, 500))
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)  # every rank must get here: none may be left waiting for a peer
    report["all_reduce"] = total.item()
    Path(options.out_dir, f"rank-{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
