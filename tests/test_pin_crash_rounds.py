"""Crash rounds for pins on POSIX: a pinner and a pruner, both killed with SIGKILL at random moments.

Round after round, new saves are published, then a pinner process (pinning random published entries, one
line on stdout per pin that returned) and a pruner process (``prune(keep=2)`` over and over) run together
until both are killed with SIGKILL after a random delay. After every round, judged from the files: every
pin that returned (its line was printed before the kill) still has its entry and its save's files, and
every entry still has its save's files; a prune killed half-way is finished by the next one (its journal),
never at a pinned folder's expense. At the end one prune runs to completion: exactly the two latest entries
and the pinned ones remain, with their folders.

The kill schedule comes from a seed: a fixed one in the test command (ADR 0013: the same schedule on every
clone), printed (pytest shows it when a test fails); set ``CKPT_CRASH_SEED`` to replay or to explore another.
The assertions hold for every interleaving the seed may produce.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry

ROUNDS = 25
NEW_EACH_ROUND = 4

WORKER = textwrap.dedent(
    """
    import json, random, sys
    from ckpt.adapters.posix import PosixStore
    from ckpt.domain.errors import NotFoundError

    root, role, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = PosixStore(root)
    rng = random.Random(seed)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        if role == "prune":
            store.prune(keep=2)
            continue
        entries = store.entries()
        if not entries or rng.random() < 0.8:
            continue  # most looks pin nothing, so that the pruner has entries to remove
        entry = rng.choice(entries)
        try:
            store.pin(entry)
        except NotFoundError:
            continue
        print(json.dumps({"epoch": entry.epoch, "step": entry.step, "save": entry.save}), flush=True)
    """
)


# The kill schedule of the test command; a run under CKPT_CRASH_SEED explores another.
DEFAULT_SEED = 20261201


def seed() -> int:
    chosen = int(os.environ.get("CKPT_CRASH_SEED") or DEFAULT_SEED)
    print(f"CKPT_CRASH_SEED={chosen}")
    return chosen


def has_files(root: Path, entry: Entry) -> bool:
    return (root / entry.save / "model.bin").is_file()


def start(root: Path, role: str, worker_seed: int) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(root), role, str(worker_seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    first = process.stdout.readline()  # started and connected: the round's clock starts after this
    assert json.loads(first) == {"ready": True}, process.stderr.read() if process.stderr else first
    return process


def test_pins_that_returned_survive_killed_pinners_and_pruners(tmp_path: Path) -> None:
    """SIGKILL at random moments never costs a pin that returned its entry or its folder."""
    rng = random.Random(seed())
    root = tmp_path / "root"
    root.mkdir()
    store = PosixStore(str(root))
    pinned: set[Entry] = set()
    step = 0
    for round_number in range(ROUNDS):
        for _ in range(NEW_EACH_ROUND):
            step += 1
            folder = root / "exec" / "a" / f"ck-{step}"
            folder.mkdir(parents=True)
            (folder / "model.bin").write_bytes(b"w")
            store.publish(1, step, str(folder))
        workers = [start(root, "pin", rng.randrange(2**32)), start(root, "prune", rng.randrange(2**32))]
        time.sleep(rng.uniform(0.0, 0.3))  # the kill lands wherever the workers are by then
        for worker in rng.sample(workers, len(workers)):
            worker.send_signal(signal.SIGKILL)
        outputs = [worker.communicate(timeout=30) for worker in workers]
        for line in outputs[0][0].splitlines()[1:]:
            if line.endswith("}"):  # a line cut by the kill was not a pin that returned
                record = json.loads(line)
                pinned.add(Entry(record["epoch"], record["step"], record["save"]))
        listed = set(store.entries())
        lost = sorted(e.step for e in pinned if e not in listed or not has_files(root, e))
        assert lost == [], f"round {round_number}: pinned entries lost: {lost}"
        broken = sorted(e.step for e in listed if not has_files(root, e))
        assert broken == [], f"round {round_number}: entries without their files: {broken}"

    print(f"{len(pinned)} pins returned over {ROUNDS} rounds; {len(store.entries())} entries listed")
    store.prune(keep=2)
    remaining = set(store.entries())
    latest = {Entry(1, step - 1, f"exec/a/ck-{step - 1}"), Entry(1, step, f"exec/a/ck-{step}")}
    assert latest | pinned <= remaining
    # Nothing else is left but entries some pin names (a pinner killed mid-pin may have left its pin).
    assert remaining - latest <= set(store.pinned())
    assert all(has_files(root, e) for e in remaining)
