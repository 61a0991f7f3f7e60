"""Pin racing prune with several real processes: a pin that succeeded never loses its entry or its folder.

Whatever the interleaving, the outcome is checked against the rule (``ckpt.pins`` rule 2): every pin call
that returned kept its entry and its save's folder, every pin call that raised left no pin behind, and a
final prune leaves exactly the latest entry and the pinned ones. The processes start together on a "go"
file; which pins win is up to the scheduler, the assertions hold for every outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry

STEPS = range(1, 41)
PINNERS = 4
PRUNERS = 2

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from ckpt.adapters.posix import PosixStore
    from ckpt.domain.entries import Entry
    from ckpt.domain.errors import NotFoundError

    root, role, which, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    store = PosixStore(root)
    while not os.path.exists(go):
        time.sleep(0.001)
    if role == "pin":
        for step in range(1, 40):
            if step % int(sys.argv[5]) != which:
                continue
            entry = Entry(1, step, f"exec/a/ck-{step}")
            try:
                store.pin(entry)
                print(json.dumps({"step": step, "ok": True}), flush=True)
            except NotFoundError:
                print(json.dumps({"step": step, "ok": False}), flush=True)
    else:
        for _ in range(6):
            store.prune(keep=1)
    """
)


def test_a_pin_that_returned_never_loses_its_entry_or_folder(tmp_path: Path) -> None:
    """4 pinners and 2 pruners at once on one POSIX root: every successful pin keeps entry and folder."""
    root = tmp_path / "root"
    root.mkdir()
    store = PosixStore(str(root))
    for step in STEPS:
        folder = root / "exec" / "a" / f"ck-{step}"
        folder.mkdir(parents=True)
        (folder / "model.bin").write_bytes(b"w")
        store.publish(1, step, str(folder))
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), "pin", str(i), str(go), str(PINNERS)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(PINNERS)
    ] + [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), "prune", str(i), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(PRUNERS)
    ]
    time.sleep(0.5)  # let the interpreters start; the race itself starts on the go file, not on this clock
    go.touch()
    outcomes: dict[int, bool] = {}
    for process in processes:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        for line in out.splitlines():
            result = json.loads(line)
            outcomes[result["step"]] = result["ok"]
    assert sorted(outcomes) == list(range(1, 40))

    pinned = {e.step for e in store.pinned()}
    won = {step for step, ok in outcomes.items() if ok}
    assert pinned == won  # a pin that raised left nothing behind
    listed = {e.step for e in store.entries()}
    for step in won:
        assert step in listed, f"pinned step {step} lost its entry"
        assert (root / "exec" / "a" / f"ck-{step}" / "model.bin").is_file(), (
            f"pinned step {step} lost its folder"
        )

    store.prune(keep=1)
    assert {e.step for e in store.entries()} == won | {40}
    assert store.entries()[-1] == Entry(1, 40, "exec/a/ck-40")
    left = {int(name.removeprefix("ck-")) for name in os.listdir(root / "exec" / "a")}
    assert left == won | {40}
