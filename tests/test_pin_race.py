"""Pin racing prune with several real processes, on POSIX and on S3 (moto's server with atomic conditional
puts, and Ceph RGW): a pin that succeeded never loses its entry or its folder.

Whatever the interleaving, the outcome is checked against the rule (``ckpt.application.pins`` rule 2):
every pin call that returned kept its entry and its save's folder; a pin call that raised left either no
pin, or a pin the prunes then honoured or that names an entry removed for good (rule 2: it can only
protect); no entry is ever listed whose folder is gone; and a final prune leaves exactly the latest entry
and the pinned ones still listed. Two prunes at once may fail (layout.md §5.8: one pruner per root), and
such a failure is recorded, never a loss. The processes start together on a "go"
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
from typing import Any

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.domain.entries import Entry
from support.s3 import new_bucket_name, raw_client

POSIX_LAST = 40  # entries at steps 1..LAST; the pinners try every step but the last
S3_LAST = 16  # fewer on moto, whose requests are slow
TESTS = Path(__file__).parent
PINNERS = 4
PRUNERS = 2

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from ckpt.domain.entries import Entry
    from ckpt.domain.errors import NotFoundError

    root, role, which, go, every, last, endpoint = sys.argv[1:8]
    which, every, last = int(which), int(every), int(last)
    if endpoint == "-":
        from ckpt.adapters.posix import PosixStore
        store = PosixStore(root)
    else:
        sys.path.insert(0, sys.argv[8])
        from ckpt.adapters.s3 import S3Store
        from support.s3_processes import direct_client
        store = S3Store(root, direct_client(endpoint))
    store.entries()  # connected and ready before the race starts
    open(f"{go}.ready-{role}-{which}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    if role == "pin":
        for step in range(1, last):
            if step % every != which:
                continue
            entry = Entry(1, step, f"exec/a/ck-{step}")
            try:
                store.pin(entry)
                print(json.dumps({"step": step, "ok": True}), flush=True)
            except NotFoundError:
                print(json.dumps({"step": step, "ok": False}), flush=True)
    else:
        from ckpt.domain.errors import StorageError
        for _ in range(6):
            try:
                store.prune(keep=1)
            except StorageError as exc:  # two prunes at once (layout.md §5.8)
                print(json.dumps({"prune_failed": str(exc)}), flush=True)
    """
)


class PosixRoot:
    """A POSIX root with the race's saves and entries."""

    endpoint = "-"

    def __init__(self, tmp_path: Path, last: int) -> None:
        self.path = tmp_path / "root"
        self.path.mkdir()
        self.root = str(self.path)
        self.store: Any = PosixStore(self.root)
        for step in range(1, last + 1):
            folder = self.path / "exec" / "a" / f"ck-{step}"
            folder.mkdir(parents=True)
            (folder / "model.bin").write_bytes(b"w")
            self.store.publish(1, step, str(folder))

    def has_save(self, step: int) -> bool:
        return (self.path / "exec" / "a" / f"ck-{step}" / "model.bin").is_file()

    def saves_left(self) -> set[int]:
        return {int(name.removeprefix("ck-")) for name in os.listdir(self.path / "exec" / "a")}


class S3Root:
    """A bucket on moto's server with the race's saves and entries."""

    def __init__(self, endpoint: str, last: int) -> None:
        self.endpoint = endpoint
        self.bucket = new_bucket_name()
        self.client = raw_client(endpoint)
        self.client.create_bucket(Bucket=self.bucket)
        self.root = f"s3://{self.bucket}"
        self.store: Any = S3Store(self.root, raw_client(endpoint))
        for step in range(1, last + 1):
            self.client.put_object(Bucket=self.bucket, Key=f"exec/a/ck-{step}/model.bin", Body=b"w")
            self.store.publish(1, step, f"{self.root}/exec/a/ck-{step}")

    def _keys(self) -> set[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix="exec/a/")
        return {obj["Key"] for page in pages for obj in page.get("Contents", ())}

    def has_save(self, step: int) -> bool:
        return f"exec/a/ck-{step}/model.bin" in self._keys()

    def saves_left(self) -> set[int]:
        return {int(key.split("/")[2].removeprefix("ck-")) for key in self._keys()}


def race(where: Any, tmp_path: Path, last: int) -> dict[int, bool]:
    """Run the pinners and pruners on ``where`` together; return each step's pin outcome."""
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    common = [str(go), str(PINNERS), str(last), where.endpoint, str(TESTS)]
    roles = [("pin", i) for i in range(PINNERS)] + [("prune", i) for i in range(PRUNERS)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, where.root, role, str(i), *common],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for role, i in roles
    ]
    ready = [Path(f"{go}.ready-{role}-{i}") for role, i in roles]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready) and time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            break  # a worker died before the race: its stderr says why, below
        time.sleep(0.01)
    go.touch()  # every worker is connected: the race starts now, for all of them at once
    finished = [process.communicate(timeout=300) for process in processes]  # every pipe read and closed
    assert [
        (p.returncode, err) for p, (_, err) in zip(processes, finished, strict=True) if p.returncode
    ] == []
    outcomes: dict[int, bool] = {}
    for out, _ in finished:
        for line in out.splitlines():
            result = json.loads(line)
            if "step" in result:
                outcomes[result["step"]] = result["ok"]
    assert sorted(outcomes) == list(range(1, last))
    return outcomes


def check(where: Any, outcomes: dict[int, bool], last: int) -> None:
    """Every pin that returned kept entry and save; every pin that raised left nothing; a final prune
    leaves exactly the latest and the pinned."""
    store = where.store
    won = {step for step, ok in outcomes.items() if ok}
    pinned = {e.step for e in store.pinned()}
    assert won <= pinned  # a pin that returned is there; one that raised may have left its pin
    store.prune(keep=1)  # finishes any journal the racing prunes left (a dead or failed one)
    store.prune(keep=1)
    listed = {e.step for e in store.entries()}
    for step in sorted(won):
        assert step in listed, f"pinned step {step} lost its entry"
        assert where.has_save(step), f"pinned step {step} lost its folder"
    for step in sorted(listed):
        assert where.has_save(step), f"step {step} is listed but its folder is gone"
    assert listed == (pinned & listed) | {last}
    assert store.entries()[-1] == Entry(1, last, f"exec/a/ck-{last}")
    assert where.saves_left() == listed


def test_posix_a_pin_that_returned_never_loses_its_entry_or_folder(tmp_path: Path) -> None:
    """4 pinners and 2 pruners at once on one POSIX root: every successful pin keeps entry and folder."""
    where = PosixRoot(tmp_path, POSIX_LAST)
    check(where, race(where, tmp_path, POSIX_LAST), POSIX_LAST)


def test_s3_a_pin_that_returned_never_loses_its_entry_or_folder(tmp_path: Path, s3_server: str) -> None:
    """The same race on one bucket of moto's server."""
    where = S3Root(s3_server, S3_LAST)
    check(where, race(where, tmp_path, S3_LAST), S3_LAST)
