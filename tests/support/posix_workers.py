"""Code the POSIX race tests run in child processes: publishers and a pruner.

The POSIX crash rounds' trainer is ``support.trainer`` (``folder --plan endless``).

Run from ``tests/`` as ``python -m support.posix_workers COMMAND ...`` (the tests do so with ``cwd``):

* ``publish``: publishes a list of ``(epoch, step, save)`` jobs once every worker is ready, and reports each
  attempt's outcome.
* ``cli-publish``: runs ``ckpt``'s own ``main`` with the given arguments once every worker is ready, and exits
  with its exit code (the command line, with a start barrier a shell cannot give).
* ``publish-new``: writes a new save and publishes it, over and over, at rising steps.
* ``prune``: runs ``prune(keep)`` in a loop until a stop file appears, checking after every prune that each
  remaining entry's folder still holds all its files.

Barrier: ``publish`` and ``cli-publish`` workers import ``ckpt``, open their store, print ``ready`` and block
on a line from stdin; the parent writes ``go`` to all of them once every one is ready. Race workers never
raise: they report what happened as one JSON document on stdout, so the parent can count and compare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from support.saves import make_save, read_files

__all__ = ["SAVE_FILES", "main"]

# The files of every save the prune race publishes; the checks look for all of them, byte for byte.
SAVE_FILES: dict[str, bytes] = {"model.safetensors": b"w" * 96, "optimizer.pt": b"o" * 48}


# -- race workers ---------------------------------------------------------------------------------------


def _wait_for_go() -> None:
    """The start barrier: say ``ready``, then block until the parent says ``go``."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected 'go' on stdin, got {line!r}")


def _entry_triple(entry: Any) -> list[Any]:
    return [entry.epoch, entry.step, entry.save]


def publish_jobs(root: str, jobs: list[list[Any]]) -> dict[str, Any]:
    """Publish every ``[epoch, step, save]`` of ``jobs`` in order; return one outcome per job."""
    from ckpt.adapters.posix import PosixStore
    from ckpt.domain.errors import ExistsError

    store = PosixStore(root)
    store.resolve()  # warm up: imports and the first listing happen before the barrier
    _wait_for_go()
    outcomes: list[dict[str, Any]] = []
    for epoch, step, save in jobs:
        try:
            entry = store.publish(epoch, step, f"{root}/{save}")
        except ExistsError as exc:
            outcomes.append(
                {"job": [epoch, step, save], "outcome": "exists", "entry": _entry_triple(exc.entry)}
            )
        except Exception as exc:  # reported to the parent, which fails the test with it
            outcomes.append({"job": [epoch, step, save], "outcome": "error", "detail": repr(exc)})
        else:
            outcomes.append({"job": [epoch, step, save], "outcome": "won", "entry": _entry_triple(entry)})
    return {"pid": os.getpid(), "outcomes": outcomes}


def cli_publish(argv: list[str]) -> int:
    """Run ``ckpt ARGV`` through ``ckpt.cli.main`` after the barrier; return its exit code."""
    from ckpt.cli import main

    _wait_for_go()
    return main(argv)


def publish_new_saves(root: str, worker: int, workers: int, count: int, seed: int) -> dict[str, Any]:
    """Write and publish ``count`` new saves ``exec/w<worker>/ck-<i>`` at steps ``i * workers + worker``.

    The second half of them go out at epoch 2, the first at epoch 1, so the greatest entry is an epoch-2 one.
    Folder names ``ck-1``, ``ck-10``, ``ck-100`` sit side by side: prune must compare path elements. After
    each publication, ``resolve`` must give that entry or a greater one, however prunes race.
    """
    from ckpt.adapters.posix import PosixStore

    store = PosixStore(root)
    store.resolve()
    rng = random.Random(seed)
    _wait_for_go()
    published: list[list[Any]] = []
    errors: list[str] = []
    for i in range(count):
        save = f"exec/w{worker}/ck-{i}"
        folder = make_save(root, save, SAVE_FILES)
        epoch = 1 if i < count // 2 else 2
        try:
            entry = store.publish(epoch, i * workers + worker, folder)
        except Exception as exc:  # reported to the parent, which fails the test with it
            errors.append(f"{save}: {exc!r}")
        else:
            published.append(_entry_triple(entry))
            # Prune keeps the greatest entry, so the latest never goes back below what was just published.
            latest = store.resolve()
            if latest is None or latest < entry:
                errors.append(f"resolve gave {latest} right after {entry} was published")
        time.sleep(rng.uniform(0.002, 0.01))
    return {"published": published, "errors": errors}


def prune_until_stopped(root: str, keep: int, stop: str) -> dict[str, Any]:
    """``prune(keep)`` in a loop until the file ``stop`` exists, then once more; check after every prune.

    After each prune, every remaining entry's folder must hold :data:`SAVE_FILES` (only this process removes
    anything, and publishers write a folder completely before publishing it). Each save is named by one entry
    only, so a prune must remove exactly its removed entries' folders and skip none.
    """
    from ckpt.adapters.posix import PosixStore

    store = PosixStore(root)
    store.resolve()
    _wait_for_go()
    prunes = racing_prunes = racing_removed = 0
    removed: list[list[Any]] = []
    problems: list[str] = []
    removed_folders = 0
    while True:
        stopping = os.path.exists(stop)
        try:
            result = store.prune(keep)
            remaining = store.entries()
        except Exception as exc:  # reported to the parent, which fails the test with it
            problems.append(f"prune {prunes}: {exc!r}")
            break
        prunes += 1
        if not stopping:
            racing_prunes += 1
            racing_removed += len(result.removed_entries)
        removed += [_entry_triple(e) for e in result.removed_entries]
        removed_folders += len(result.removed_folders)
        expected_folders = sorted(store.location(e) for e in result.removed_entries)
        if sorted(result.removed_folders) != expected_folders:
            actual_folders = sorted(result.removed_folders)
            problems.append(f"prune {prunes}: removed folders {actual_folders}, expected {expected_folders}")
        if result.skipped:
            problems.append(f"prune {prunes}: skipped {result.skipped}, expected none")
        for entry in remaining:
            files = read_files(Path(store.location(entry)))
            if files != SAVE_FILES:
                state = "missing" if not Path(store.location(entry)).exists() else f"holds {sorted(files)}"
                problems.append(f"after prune {prunes}: entry {entry} remains but its folder {state}")
        if stopping:
            break
    return {
        "prunes": prunes,
        "racing_prunes": racing_prunes,  # begun before the stop file appeared
        "racing_removed": racing_removed,
        "removed": removed,
        "removed_folders": removed_folders,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["cli-publish"]:
        return cli_publish(arguments[1:])  # ckpt's own options follow: argparse must not see them
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    publish = commands.add_parser("publish")
    publish.add_argument("--root", required=True)
    publish.add_argument("--jobs", required=True, help="a JSON file: a list of [epoch, step, save]")
    commands.add_parser("cli-publish", help="cli-publish ARGS...: every argument after it goes to ckpt")
    new = commands.add_parser("publish-new")
    new.add_argument("--root", required=True)
    new.add_argument("--worker", type=int, required=True)
    new.add_argument("--workers", type=int, required=True)
    new.add_argument("--count", type=int, required=True)
    new.add_argument("--seed", type=int, default=0)
    prune = commands.add_parser("prune")
    prune.add_argument("--root", required=True)
    prune.add_argument("--keep", type=int, required=True)
    prune.add_argument("--stop", required=True)
    args = parser.parse_args(arguments)

    report: dict[str, Any]
    if args.command == "publish":
        report = publish_jobs(args.root, json.loads(Path(args.jobs).read_text()))
    elif args.command == "publish-new":
        report = publish_new_saves(args.root, args.worker, args.workers, args.count, args.seed)
    else:
        report = prune_until_stopped(args.root, args.keep, args.stop)
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
