"""Races on S3: publishers and a pruner in separate processes, on one bucket of a real HTTP S3 server.

The processes are started with multiprocessing's ``spawn`` method and run the workers of
``tests/support/s3_processes.py``, each with its own store opened the way ``ckpt`` opens one
(``open_s3_store`` from a ``Config``); a barrier releases them together. Each test runs on both servers of
``s3_server``: Ceph RGW, whose exclusive create is its own (an exclusive create of the head RADOS object),
and moto's server with ``PutObject`` made atomic (``tests/support/atomic_moto_server.py``): stock moto
checks ``If-None-Match: *`` and then writes, with other requests free to run in between, which S3 never
allows; these tests hold ``ckpt`` to S3's contract, not to that gap in the double.

* ``TestPublishersRacing``: 16 processes publish overlapping entries (the same names, and names only they
  publish): exactly one process creates each entry, every other one gets ``ExistsError``, nothing else.
* ``TestPruneRacingPublishers``: four processes keep publishing new saves while a pruner runs
  ``prune(keep=3)`` over and over: after every prune (and at the end) no remaining entry's save misses an
  object, and every published entry is either still there or was removed by a prune, once.
"""

from __future__ import annotations

import collections
import multiprocessing
import random
from typing import Any

from ckpt.adapters.s3 import S3Store
from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name
from support.s3 import new_bucket_name, raw_client
from support.s3_processes import (
    SAVE_FILES,
    PruneJob,
    PruneReport,
    PublishJob,
    PublishNewSavesJob,
    missing_objects,
    prune_repeatedly,
    publish_names,
    publish_new_saves,
)
from support.saves import put_save

PUBLISHERS = 16
PROCESS_SECONDS = 120  # the most any child may take; a hung child fails the test instead of hanging it


class Bucket:
    """A fresh bucket on the S3 server, arranged and read back straight, with no proxy."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.name = new_bucket_name()
        self.client = raw_client(endpoint)
        self.client.create_bucket(Bucket=self.name)
        self.root = f"s3://{self.name}"

    def make_save(self, save: str) -> None:
        put_save(self.client, self.name, save, SAVE_FILES)

    def pub_sizes(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix="pub/"):
            found.update((obj["Key"][len("pub/") :], obj["Size"]) for obj in page.get("Contents", ()))
        return found


def run_processes(targets: list[tuple[Any, tuple[Any, ...]]], results: Any) -> list[Any]:
    """Start one spawned process per ``(function, args)``; return what each put on ``results``."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=(*args, results)) for target, args in targets]
    for process in processes:
        process.start()
    try:
        answers = [results.get(timeout=PROCESS_SECONDS) for _ in processes]
    finally:
        for process in processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()
    assert [p.exitcode for p in processes] == [0] * len(processes)
    return answers


class TestPublishersRacing:
    def test_sixteen_publishers_make_exactly_one_winner_per_name(self, s3_server: str) -> None:
        """16 processes publish 12 shared names and 2 names each of their own: one creation per name."""
        bucket = Bucket(s3_server)
        shared = [(1, step, "exec/race/ck-a") for step in range(8)]
        shared += [(2, step, "exec/race/ck-b") for step in range(4)]  # same steps, another save and epoch
        for save in ("exec/race/ck-a", "exec/race/ck-b", *(f"exec/w{i}/ck" for i in range(PUBLISHERS))):
            bucket.make_save(save)
        jobs = []
        for worker in range(PUBLISHERS):
            own = [(1, 100 + worker, f"exec/w{worker}/ck"), (3, 0, f"exec/w{worker}/ck")]
            entries = shared + own
            random.Random(worker).shuffle(entries)
            jobs.append(PublishJob(s3_server, bucket.root, tuple(entries)))
        context = multiprocessing.get_context("spawn")
        ready = context.Barrier(PUBLISHERS)
        answers = run_processes([(publish_names, (job, ready)) for job in jobs], context.Queue())

        outcomes = [outcome for answer in answers for outcome in answer]
        unexpected = [(entry, outcome) for entry, outcome in outcomes if outcome not in ("created", "exists")]
        assert unexpected == []
        created = collections.Counter(entry for entry, outcome in outcomes if outcome == "created")
        tried = collections.Counter(entry for entry, _ in outcomes)
        assert {entry: created[entry] for entry in tried} == dict.fromkeys(tried, 1)
        assert all(tried[entry] == PUBLISHERS for entry in shared)
        expected = sorted(format_entry_name(Entry(*entry)) for entry in tried)
        assert bucket.pub_sizes() == dict.fromkeys(expected, 0)  # each an empty object, nothing else


class TestPruneRacingPublishers:
    def test_no_remaining_entry_ever_misses_an_object(self, s3_server: str) -> None:
        """While 4 processes publish new saves, repeated prune(keep=3) never leaves a broken entry."""
        bucket = Bucket(s3_server)
        publishers, saves_each, keep = 4, 25, 3
        context = multiprocessing.get_context("spawn")
        ready, stop, reports = context.Barrier(publishers + 1), context.Event(), context.Queue()
        pruner = context.Process(
            target=prune_repeatedly,
            args=(PruneJob(s3_server, bucket.root, bucket.name, keep), ready, stop, reports),
        )
        pruner.start()
        try:
            jobs = [
                PublishNewSavesJob(s3_server, bucket.root, bucket.name, worker, saves_each, epoch=5)
                for worker in range(publishers)
            ]
            answers = run_processes([(publish_new_saves, (job, ready)) for job in jobs], context.Queue())
            stop.set()
            report: PruneReport = reports.get(timeout=PROCESS_SECONDS)
        finally:
            pruner.join(PROCESS_SECONDS)
            if pruner.is_alive():
                pruner.kill()
                pruner.join()
        assert pruner.exitcode == 0

        published = [entry for entry_list, _ in answers for entry in entry_list]
        assert [error for _, errors in answers for error in errors] == []
        assert len(published) == publishers * saves_each
        assert (report.violations, report.errors) == ((), ())
        assert report.prunes >= 3, "the pruner hardly ran: the race was not exercised"
        assert report.removed_folders > 0

        store = S3Store(bucket.root, bucket.client)
        remaining = store.entries()
        assert len(remaining) == keep  # the pruner's last prune ran after every publication
        assert remaining == sorted(Entry(*entry) for entry in published)[-keep:]
        assert missing_objects(bucket.client, bucket.name, "", [entry.save for entry in remaining]) == []
        removed = collections.Counter(report.removed_entries)
        assert all(count == 1 for count in removed.values())
        assert sorted([*removed, *(entry.key for entry in remaining)]) == sorted(published)
