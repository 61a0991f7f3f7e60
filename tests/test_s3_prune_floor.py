"""S3 prune at the request floor: folder objects deleted in batches across folders, listings a few at once.

Against moto's server over HTTP; the requests are counted on the wire (botocore ``before-send``), and the
listings' concurrency is proven with a barrier that only concurrent listings can pass.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any

import pytest

from ckpt.adapters.s3 import S3Store
from ckpt.domain.entries import Entry
from ckpt.domain.errors import StorageError
from ckpt.domain.names import format_entry_name
from support.s3 import RequestLog, new_bucket_name, raw_client

REMOVED, KEEP, OBJECTS = 100, 10, 2
LISTINGS_AT_ONCE = 8


class Bucket:
    """A fresh bucket on moto's server holding ``REMOVED + KEEP`` published saves of ``OBJECTS`` objects."""

    def __init__(self, endpoint: str) -> None:
        self.client = raw_client(endpoint)
        self.name = new_bucket_name()
        self.client.create_bucket(Bucket=self.name)
        self.endpoint = endpoint
        for step in range(REMOVED + KEEP):
            save = f"exec/a/checkpoint-{step}"
            for i in range(OBJECTS):
                self.client.put_object(Bucket=self.name, Key=f"{save}/part-{i}", Body=b"w")
            self.client.put_object(
                Bucket=self.name, Key=f"pub/{format_entry_name(Entry(1, step, save))}", Body=b""
            )

    def store(self) -> tuple[S3Store, RequestLog, Any]:
        client = raw_client(self.endpoint)
        return S3Store(f"s3://{self.name}", client), RequestLog(client), client

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", ()))


@pytest.fixture
def bucket(moto_server: str) -> Bucket:
    return Bucket(moto_server)


def folder_listings(log: RequestLog) -> int:
    return sum(1 for op, _, url in log.sent if op == "ListObjectsV2" and "prefix=exec" in url)


class TestPruneRequests:
    def test_a_hundred_folders_cost_two_deletes(self, bucket: Bucket) -> None:
        """100 entries and 100 two-object folders: 2 DeleteObjects and 100 folder listings (was 101, 100)."""
        store, log, _client = bucket.store()
        result = store.prune(KEEP)
        assert len(result.removed_entries) == REMOVED
        assert len(result.removed_folders) == REMOVED
        assert result.skipped == ()
        deletes = math.ceil(REMOVED / 1000) + math.ceil(REMOVED * OBJECTS / 1000)
        assert {
            "DeleteObjects": log.count("DeleteObjects"),
            "folder listings": folder_listings(log),
            "all listings": log.count("ListObjectsV2"),
            "requests": len(log.sent),
        } == {
            "DeleteObjects": deletes,
            "folder listings": REMOVED,
            "all listings": REMOVED + 5,  # and pub/ twice, pins/ twice, and the prune journal's listing
            # and the journal's put and delete, its decision's put (If-None-Match) and delete, and one
            # HeadObject: the journal still there once decided
            "requests": 112,
        }
        assert len(bucket.keys("exec/")) == KEEP * OBJECTS
        assert len(bucket.keys("pub/")) == KEEP

    def test_folder_listings_run_concurrently_and_bounded(self, bucket: Bucket) -> None:
        """Eight folder listings are in flight together (a barrier only they can pass), never more."""
        store, _log, client = bucket.store()
        together = threading.Barrier(LISTINGS_AT_ONCE, timeout=30)
        lock = threading.Lock()
        state = {"in_flight": 0, "most": 0, "seen": 0}

        def before(request: Any, **_: Any) -> None:
            if "prefix=exec" not in request.url:
                return
            with lock:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                state["seen"] += 1
                first = state["seen"] <= LISTINGS_AT_ONCE
            if first:
                together.wait()  # breaks (and fails the prune) unless eight listings are sent at once

        def done(http_response: Any, **_: Any) -> None:
            # The request's URL, not the parsed answer: the store reads its pages itself (ADR 0027).
            if "prefix=exec" in http_response.url:
                with lock:
                    state["in_flight"] -= 1

        client.meta.events.register("before-send.s3.ListObjectsV2", before)
        client.meta.events.register("after-call.s3.ListObjectsV2", done)
        result = store.prune(KEEP)
        assert len(result.removed_folders) == REMOVED
        assert state["most"] == LISTINGS_AT_ONCE

    def test_a_refused_object_keeps_only_its_folder_out_of_the_removed(self, bucket: Bucket) -> None:
        """Objects refused inside the shared batch are reported; the other folders still count as removed."""
        store, _log, client = bucket.store()
        refused_folder = "exec/a/checkpoint-3/"

        sent: list[bytes] = []

        def record(request: Any, **_: Any) -> None:
            sent.append(request.body)

        def refuse_that_folder(parsed: dict[str, Any], **_: Any) -> None:
            # The storage deleted the others and refused that folder's objects (as a legal hold would).
            keys = re.findall(rb"<Key>(.*?)</Key>", sent[-1])
            refused = [key.decode() for key in keys if key.decode().startswith(refused_folder)]
            parsed["Errors"] = [{"Key": key, "Code": "AccessDenied"} for key in refused]

        client.meta.events.register("before-send.s3.DeleteObjects", record)
        client.meta.events.register("after-call.s3.DeleteObjects", refuse_that_folder)
        with pytest.raises(StorageError) as caught:
            store.prune(KEEP)
        message = str(caught.value)
        assert f"removed {REMOVED} entries and {REMOVED - 1} folders" in message
        assert f"s3://{bucket.name}/{refused_folder}part-0 (AccessDenied)" in message
