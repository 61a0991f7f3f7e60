"""``python -m support.trainer folder|bucket ...``: the trainer as a process (``tests/`` on the import path:
:func:`support.module_command` with :func:`support.subprocess_env`, or ``cwd=tests/``).

Started again after a kill, it goes on with the plan item after the last one it began (or at ``--start``),
so no save is ever written twice.
"""

from __future__ import annotations

import argparse
import sys

from support.trainer.plan import CHUNK, endless_plan, mixed_plan
from support.trainer.sinks import BucketSink, FolderSink, Sink
from support.trainer.writer import Trainer, next_index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m support.trainer", description="The simulated trainer.")
    where = parser.add_subparsers(dest="sink", required=True)
    where.add_parser("folder", help="saves into a folder, file by file")
    bucket = where.add_parser("bucket", help="saves into a bucket, object by object")
    bucket.add_argument("--endpoint", required=True, help="a loopback S3 endpoint (moto)")
    bucket.add_argument("--bucket", required=True)
    for command in where.choices.values():
        command.add_argument("--framework", choices=("hf", "dcp"), required=True)
        command.add_argument("--saves", required=True, help="a folder; in a bucket, a key prefix")
        command.add_argument("--events", required=True)
        command.add_argument("--plan", choices=("mixed", "endless"), default="mixed")
        command.add_argument("--rounds", type=int, default=2, help="rounds of the mixed plan")
        command.add_argument("--count", type=int, default=None, help="stop before plan item COUNT")
        command.add_argument("--start", type=int, default=None, help="default: after the last item begun")
        command.add_argument("--pace", type=float, default=0.005, help="seconds after every step")
        command.add_argument("--gap", type=float, default=0.0, help="seconds between saves")
        command.add_argument("--chunk", type=int, default=CHUNK, help="bytes a file grows by per write")
    args = parser.parse_args(argv)

    sink: Sink
    if args.sink == "folder":
        sink = FolderSink(args.saves)
    else:
        from support.s3_processes import direct_client  # botocore only where a bucket is written

        sink = BucketSink(direct_client(args.endpoint), args.bucket, args.saves)
    plan = mixed_plan(args.framework, args.rounds) if args.plan == "mixed" else endless_plan(args.framework)
    start = next_index(args.events) if args.start is None else args.start
    trainer = Trainer(sink, pace=args.pace, gap=args.gap, chunk=args.chunk, events=args.events)
    trainer.run(plan, start=start, count=args.count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
