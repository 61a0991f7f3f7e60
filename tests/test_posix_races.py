"""Races on one POSIX root between real processes: overlapping publishers, and prune against publishers.

Workers are ``python -m support.posix_workers`` processes (tests/support/posix_workers.py). They import
``ckpt``, open their store and wait on a start barrier, so that all of them hit ``pub/`` at the same moment;
each reports every attempt's outcome as JSON, and the checks here compare expected with actual.

* 16 publishers of overlapping entries (some shared by all, some by neighbours, some by one): one winner per
  name, ``ExistsError`` carrying the entry for everyone else, and the log holds exactly the union.
* 16 ``ckpt publish`` command lines on one entry: one exits 0 with the entry, the others exit 4.
* 4 publishers of new saves against a pruner looping ``prune(keep)``: after every prune no remaining entry's
  folder is missing or emptied, ``resolve`` never drops below an entry just published, and at the end the
  log holds the ``keep`` greatest entries and ``resolve`` gives the greatest of all.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name
from support.posix_workers import SAVE_FILES
from support.saves import make_save, read_files

TESTS = Path(__file__).parent
WORKERS = [sys.executable, "-m", "support.posix_workers"]
PUBLISHERS = 16

Triple = tuple[int, int, str]
StartWorker = Callable[..., subprocess.Popen[str]]


def environment() -> dict[str, str]:
    """Our environment without ckpt's, the scheduler's or AWS's variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}


@pytest.fixture
def start_worker() -> Iterator[StartWorker]:
    """Start ``support.posix_workers ARGS`` processes, pipes to us; any left at the end is killed."""
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [*WORKERS, *args],
            cwd=TESTS,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(),
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


def release(processes: list[subprocess.Popen[str]], timeout: float = 60) -> None:
    """The start barrier: wait until every process says ``ready``, then tell them all ``go``."""
    for process in processes:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line != "ready\n":
            _, err = process.communicate(timeout=timeout)
            raise AssertionError(f"a worker did not get ready: {line!r} {err[-2000:]}")
    for process in processes:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()


def collect(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    """Wait for a worker; return its exit code, stdout (after ``ready``) and stderr."""
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def run_together(processes: list[subprocess.Popen[str]]) -> list[tuple[int, str, str]]:
    """Release every process at once and collect them all."""
    release(processes)
    return [collect(process) for process in processes]


def overlapping_jobs() -> list[list[Triple]]:
    """The jobs of the 16 publishers: some triples shared by all, some by neighbours, some by one only.

    * All 16: ``exec/all/ck-<n>`` for n in 1..10 (``ck-1`` beside ``ck-10``), each at epochs 1 and 2 (two
      entries per folder): 20 triples.
    * Neighbours ``p`` and ``p + 1`` (mod 16): ``exec/pair-<p>/ck-<k>`` at step ``100 + k``, k in 0..2.
    * Worker ``w`` alone: ``exec/w<w>/ck-<k>`` at step ``1000 + 10 w + k``, k in 0..3.

    Even workers publish in ascending order (each hammers the same entry at the same time as the others),
    odd ones in a shuffled order (fixed seed), so both head-on and staggered collisions happen.
    """
    shared = [(epoch, n, f"exec/all/ck-{n}") for n in range(1, 11) for epoch in (1, 2)]
    pairs = {p: [(1, 100 + k, f"exec/pair-{p}/ck-{k}") for k in range(3)] for p in range(PUBLISHERS)}
    jobs = []
    for w in range(PUBLISHERS):
        own = [(1, 1000 + 10 * w + k, f"exec/w{w}/ck-{k}") for k in range(4)]
        mine = sorted([*shared, *pairs[w], *pairs[(w - 1) % PUBLISHERS], *own])
        if w % 2:
            random.Random(w).shuffle(mine)
        jobs.append(mine)
    return jobs


class TestOverlappingPublishers:
    def test_sixteen_processes_publishing_overlapping_entries_yield_one_winner_each(
        self, tmp_path: Path, start_worker: StartWorker
    ) -> None:
        """Of 16 processes publishing overlapping entries at once, one wins each; the rest get ExistsError."""
        root = tmp_path / "root"
        root.mkdir()
        jobs = overlapping_jobs()
        union = sorted({triple for mine in jobs for triple in mine})
        for save in sorted({save for _, _, save in union}):
            make_save(root, save, SAVE_FILES)
        processes = []
        for w, mine in enumerate(jobs):
            job_file = tmp_path / f"jobs-{w}.json"
            job_file.write_text(json.dumps(mine))
            processes.append(start_worker("publish", "--root", str(root), "--jobs", str(job_file)))
        finished = run_together(processes)

        assert [(code, err) for code, _, err in finished] == [(0, "")] * PUBLISHERS
        wins: Counter[Triple] = Counter()
        attempts: Counter[Triple] = Counter()
        losses: Counter[Triple] = Counter()
        wrong: list[dict[str, Any]] = []
        for w, (_, out, _) in enumerate(finished):
            outcomes = json.loads(out)["outcomes"]
            assert [tuple(o["job"]) for o in outcomes] == jobs[w]
            for outcome in outcomes:
                epoch, step, save = outcome["job"]
                job = (epoch, step, save)
                attempts[job] += 1
                if outcome["outcome"] == "won" and tuple(outcome["entry"]) == job:
                    wins[job] += 1
                elif outcome["outcome"] == "exists" and tuple(outcome["entry"]) == job:
                    losses[job] += 1  # ExistsError, carrying the very entry that was attempted
                else:
                    wrong.append(outcome)
        assert wrong == []
        assert dict(wins) == dict.fromkeys(union, 1)
        assert dict(losses) == {t: n - 1 for t, n in attempts.items() if n > 1}
        assert sorted(Counter(attempts.values()).items()) == [(1, 64), (2, 48), (16, 20)]

        store = PosixStore(str(root))
        assert store.entries() == [Entry(*t) for t in union]
        assert len(os.listdir(root / "pub")) == len(union)  # nothing else left behind in pub/

    def test_sixteen_cli_publishers_of_one_entry_exit_0_once_and_4_otherwise(
        self, tmp_path: Path, start_worker: StartWorker
    ) -> None:
        """16 ``ckpt publish`` processes released at once on one entry: one exits 0, the others exit 4."""
        root = tmp_path / "root"
        root.mkdir()
        make_save(root, "exec/cli/ck-7", SAVE_FILES)
        argv = ["--root", str(root), "--json", "publish", "--epoch", "3", "--step", "7", "exec/cli/ck-7"]
        processes = [start_worker("cli-publish", *argv) for _ in range(PUBLISHERS)]
        finished = run_together(processes)

        codes = sorted(code for code, _, _ in finished)
        assert codes == [0] + [4] * (PUBLISHERS - 1)
        (winner,) = [out for code, out, _ in finished if code == 0]
        assert json.loads(winner) == {
            "epoch": 3,
            "step": 7,
            "save": "exec/cli/ck-7",
            "location": f"{root}/exec/cli/ck-7",
            "name": format_entry_name(Entry(3, 7, "exec/cli/ck-7")),
        }
        losers = [(out, err) for code, out, err in finished if code == 4]
        assert {out for out, _ in losers} == {""}
        assert all(
            err.startswith("ckpt: already published: ") and err.count("\n") == 1 for _, err in losers
        ), [err for _, err in losers]
        assert PosixStore(str(root)).entries() == [Entry(3, 7, "exec/cli/ck-7")]


class TestPruneAgainstPublishers:
    @pytest.mark.parametrize("keep", [1, 3])
    def test_prune_in_a_loop_never_leaves_an_entry_without_its_folder(
        self, tmp_path: Path, start_worker: StartWorker, keep: int
    ) -> None:
        """While 4 processes publish new saves, a looping prune never leaves an entry whose folder is gone."""
        root = tmp_path / "root"
        root.mkdir()
        stop = tmp_path / "stop"
        pruner = start_worker("prune", "--root", str(root), "--keep", str(keep), "--stop", str(stop))
        publishers = [
            start_worker(
                "publish-new",
                *("--root", str(root), "--worker", str(w), "--workers", "4", "--count", "120"),
                *("--seed", str(w)),
            )
            for w in range(4)
        ]
        release([pruner, *publishers])
        finished = [collect(publisher) for publisher in publishers]
        assert [(code, err) for code, _, err in finished] == [(0, "")] * 4
        reports = [json.loads(out) for _, out, _ in finished]
        stop.touch()  # the pruner prunes once more, checks, and reports
        code, out, err = collect(pruner)
        assert (code, err) == (0, "")
        pruned = json.loads(out)

        assert [r["errors"] for r in reports] == [[]] * 4
        published = sorted(Entry(*t) for r in reports for t in r["published"])
        assert len(published) == 4 * 120
        assert pruned["problems"] == []
        removed = sorted(Entry(*t) for t in pruned["removed"])
        assert len(removed) == len(set(removed))  # no entry removed twice
        store = PosixStore(str(root))
        remaining = store.entries()
        assert remaining == published[-keep:]  # the final prune ran after every publication
        assert sorted(removed + remaining) == published  # entries vanish only by prune, each once
        assert store.resolve() == max(published)
        assert {e.save: read_files(root / e.save) for e in remaining} == dict.fromkeys(
            [e.save for e in remaining], SAVE_FILES
        )
        assert [e.save for e in removed if (root / e.save).exists()] == []
        assert pruned["removed_folders"] == len(removed)
        # The prunes really raced the publishers: many ran, and removed entries, before the last publication.
        assert pruned["racing_prunes"] >= 10, pruned["racing_prunes"]
        assert pruned["racing_removed"] > 0, pruned["racing_removed"]
        print(
            f"keep {keep}: {pruned['racing_prunes']} prunes raced the publishers, removing "
            f"{pruned['racing_removed']} entries; {len(removed)} removed in all"
        )
