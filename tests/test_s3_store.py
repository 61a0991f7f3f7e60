"""S3-specific behaviour of ``ckpt.adapters.s3`` (the shared store contract is in test_store_contract.py).

What only S3 has: the root URL, request budgets (counted on the wire with botocore's ``before-send``),
conditional-create answers (412, 409, 501), ``DeleteObjects`` per-key errors, pagination, error translation,
the exclusive-create probe, and how the client is built from the configuration. moto runs in-process for
the budgets (objects are put straight into its backend, which is fast) and as a server over HTTP for the
wire-level doubles. No request leaves 127.0.0.1.
"""

from __future__ import annotations

import math
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError
from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends

from ckpt.adapters.s3 import PAGE_SIZE, S3Store, make_s3_client, open_s3_store, parse_s3_root
from ckpt.config import Config, S3Settings
from ckpt.domain.entries import Entry
from ckpt.domain.errors import (
    CredentialsError,
    ExistsError,
    InvalidError,
    MalformedError,
    NotFoundError,
    SaveNotFoundError,
    StorageError,
)
from ckpt.domain.names import format_entry_name
from ckpt.store import open_store
from support.s3 import (
    FAKE_ENV,
    RequestLog,
    answer_instead,
    error_body,
    free_port,
    http_settings,
    isolate_from_aws_environment,
    mock_aws,
    new_bucket_name,
    only_loopback,
    raw_client,
)

ROOT_PREFIX = "team-a/run-42"
SAVE = "exec/1.4101.0/checkpoint-500"


class InProcess:
    """A fresh bucket in moto in-process: ``client`` arranges, ``put_fast`` writes straight to the backend."""

    def __init__(self) -> None:
        self.bucket = new_bucket_name()
        self.client = raw_client()
        self.client.create_bucket(Bucket=self.bucket)
        self._backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def store(self, root: str | None = None) -> tuple[S3Store, RequestLog, Any]:
        """Return a store on its own client (root default ``<bucket>/team-a/run-42``), its log, the client."""
        client = raw_client()
        return S3Store(root or f"s3://{self.bucket}/{ROOT_PREFIX}", client), RequestLog(client), client

    def put(self, key: str, data: bytes = b"") -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def put_fast(self, key: str, data: bytes = b"") -> None:
        """Put an object without a request (thousands of objects in a fraction of a second)."""
        self._backend.put_object(self.bucket, key, data, disable_notification=True)

    def keys(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", ()))


class OverHttp:
    """A fresh bucket on moto's server: ``client`` arranges; ``store()`` gives a store with its own client."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.bucket = new_bucket_name()
        self.client = raw_client(endpoint)
        self.client.create_bucket(Bucket=self.bucket)

    def store(self, client: Any = None) -> tuple[S3Store, RequestLog, Any]:
        """Return a store on ``client`` (default: a fresh plain client), its request log and the client."""
        client = client or raw_client(self.endpoint)
        return S3Store(f"s3://{self.bucket}", client), RequestLog(client), client

    def put(self, key: str, data: bytes = b"") -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def keys(self, prefix: str) -> list[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(obj["Key"] for page in pages for obj in page.get("Contents", ()))


@pytest.fixture
def moto() -> Iterator[InProcess]:
    with mock_aws():
        yield InProcess()


@pytest.fixture
def http(s3_server: str) -> OverHttp:
    return OverHttp(s3_server)


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """Fake keys in the environment, no ~/.aws, no instance metadata."""
    isolate_from_aws_environment(monkeypatch, tmp_path)
    return monkeypatch


def configured_client(endpoint: str, **settings: Any) -> Any:
    """Return the client ``make_s3_client`` builds for ``endpoint`` (needs the ``aws_env`` fixture)."""
    return only_loopback(make_s3_client(http_settings(endpoint, **settings), environ=FAKE_ENV))


class NoClient:
    """A client that fails the test on any call: proves that an operation sent no request."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected S3 request: {name}")


def pub_key(entry: Entry, prefix: str = "") -> str:
    return f"{prefix}pub/{format_entry_name(entry)}"


class TestParseS3Root:
    def test_a_bucket_alone_has_an_empty_prefix(self) -> None:
        """s3://BUCKET is the top of the bucket."""
        root = parse_s3_root("s3://ml-checkpoints")
        assert (root.bucket, root.prefix, root.url) == ("ml-checkpoints", "", "s3://ml-checkpoints")

    def test_a_prefix_ends_in_a_slash_and_one_trailing_slash_is_dropped(self) -> None:
        """s3://BUCKET/PREFIX/ and s3://BUCKET/PREFIX are the same root, shown without the slash."""
        for text in ("s3://ml-checkpoints/team-a/run-42", "s3://ml-checkpoints/team-a/run-42/"):
            root = parse_s3_root(text)
            assert (root.bucket, root.prefix) == ("ml-checkpoints", "team-a/run-42/")
            assert root.url == "s3://ml-checkpoints/team-a/run-42"

    def test_directory_bucket_names_are_accepted(self) -> None:
        """S3 Express directory buckets (``--x-s3``) are valid roots."""
        assert parse_s3_root("s3://ckpt--use1-az4--x-s3/run").bucket == "ckpt--use1-az4--x-s3"

    @pytest.mark.parametrize(
        ("root", "reason"),
        [
            ("s3://", "empty"),
            ("s3:///prefix", "empty"),
            ("s3://ab", "3 to 63"),
            ("s3://" + "a" * 64, "3 to 63"),
            ("s3://My-Bucket", "lower-case"),
            ("s3://my_bucket", "lower-case"),
            ("s3://-bucket", "start and end"),
            ("s3://bucket-", "start and end"),
            ("s3://my..bucket", "adjacent periods"),
            ("s3://192.168.5.4", "IP address"),
            ("s3://xn--bucket", "reserves"),
            ("s3://bucket-s3alias", "reserves"),
            ("s3://bucket:9000", "port"),
            ("s3://bucket/a//b", "empty path element"),
            ("s3://bucket/a/../b", "'..'"),
            ("s3://bucket/./b", "'..'"),
            ("s3://bucket/a?versionId=1", "query"),
            ("s3://bucket/a#part", "fragment"),
            ("s3://bucket/a\x01b", "control character"),
            ("s3://bucket/" + "p" * 800, "bytes long"),
        ],
    )
    def test_invalid_roots_are_refused_naming_the_url_and_the_reason(self, root: str, reason: str) -> None:
        """A root that breaks S3's bucket rules or is not a clean prefix is InvalidError naming both."""
        with pytest.raises(InvalidError) as caught:
            parse_s3_root(root)
        message = str(caught.value)
        assert repr(root) in message
        assert reason in message

    @pytest.mark.parametrize("root", ["S3://bucket", "https://bucket/x", "bucket/x", ""])
    def test_other_schemes_are_refused(self, root: str) -> None:
        """Only the lower-case s3:// scheme names an S3 root."""
        with pytest.raises(InvalidError, match="not an s3:// URL"):
            parse_s3_root(root)

    def test_user_info_is_refused_and_never_shown(self) -> None:
        """Credentials in the URL are refused, and the message redacts them."""
        with pytest.raises(InvalidError) as caught:
            parse_s3_root("s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/run")
        message = str(caught.value)
        assert "wJalrXUtnFEMI" not in message
        assert "AKIDEXAMPLE" not in message
        assert "s3://***@bucket/run" in message


class TestLocations:
    def test_locations_with_a_prefix(self) -> None:
        """Locations are s3://bucket/prefix/<save>, and exec_dir is under exec/."""
        store = S3Store("s3://b-1/team-a/run-42/", NoClient())
        assert store.root == "s3://b-1/team-a/run-42"
        assert store.location(Entry(1, 2, SAVE)) == f"s3://b-1/team-a/run-42/{SAVE}"
        assert store.exec_dir("2.4102.0") == "s3://b-1/team-a/run-42/exec/2.4102.0"

    def test_locations_without_a_prefix(self) -> None:
        """At the top of the bucket, a location is s3://bucket/<save>."""
        store = S3Store("s3://b-1", NoClient())
        assert store.location(Entry(1, 2, SAVE)) == f"s3://b-1/{SAVE}"
        assert store.save_of(f"s3://b-1/{SAVE}/") == SAVE

    @pytest.mark.parametrize(
        "location",
        [
            f"s3://b-1/team-a/run-420/{SAVE}",  # a sibling prefix that merely starts with the root's
            f"s3://b-2/team-a/run-42/{SAVE}",  # another bucket
            f"/team-a/run-42/{SAVE}",  # a POSIX path
            "s3://b-1/team-a/run-42",  # the root itself
            "s3://b-1/team-a/run-42/pub/x",  # inside pub/
        ],
    )
    def test_locations_outside_the_root_are_refused_without_a_request(self, location: str) -> None:
        """Publishing a location that is not a save under the root is InvalidError, before any request."""
        store = S3Store("s3://b-1/team-a/run-42", NoClient())
        with pytest.raises(InvalidError):
            store.publish(1, 1, location)


class TestPublish:
    def test_publish_is_one_listing_and_one_conditional_put_of_an_empty_entry(self, moto: InProcess) -> None:
        """publish sends ListObjectsV2 (MaxKeys=1) then PutObject with If-None-Match: *, and nothing else."""
        store, log, _client = moto.store()
        moto.put(f"{ROOT_PREFIX}/{SAVE}/model.bin", b"weights")
        entry = store.publish(7, 500, store.location(Entry(7, 500, SAVE)))
        assert log.operations() == ["ListObjectsV2", "PutObject"]
        assert "max-keys=1" in log.sent[0][2]
        key = pub_key(entry, f"{ROOT_PREFIX}/")
        head = moto.client.head_object(Bucket=moto.bucket, Key=key)
        assert head["ContentLength"] == 0

    def test_the_put_carries_if_none_match_star(self, http: OverHttp) -> None:
        """The entry is created with the If-None-Match: * header on the wire."""
        store, _log, client = http.store()
        seen: list[bytes | None] = []
        client.meta.events.register(
            "before-send.s3.PutObject", lambda request, **_: seen.append(request.headers.get("If-None-Match"))
        )
        http.put(f"{SAVE}/model.bin")
        store.publish(1, 1, store.location(Entry(1, 1, SAVE)))
        assert seen == [b"*"]

    def test_an_existing_entry_is_refused_by_the_storage_and_left_untouched(self, moto: InProcess) -> None:
        """A 412 answer to the conditional put is ExistsError carrying the entry; the object is unchanged."""
        store, log, _client = moto.store()
        entry = Entry(7, 500, SAVE)
        moto.put(f"{ROOT_PREFIX}/{SAVE}/model.bin")
        moto.put(pub_key(entry, f"{ROOT_PREFIX}/"), b"left by someone else")
        with pytest.raises(ExistsError) as caught:
            store.publish(7, 500, store.location(entry))
        assert caught.value.entry == entry
        # The 412 costs one HeadObject: the object has no writer token of this publish (operations.md §2.6).
        assert log.operations() == ["ListObjectsV2", "PutObject", "HeadObject"]
        kept = moto.client.get_object(Bucket=moto.bucket, Key=pub_key(entry, f"{ROOT_PREFIX}/"))
        assert kept["Body"].read() == b"left by someone else"

    def test_a_missing_save_sends_no_put(self, moto: InProcess) -> None:
        """A save with no object under it is SaveNotFoundError after the listing and one HeadObject."""
        store, log, _client = moto.store()
        with pytest.raises(SaveNotFoundError, match="does not exist"):
            store.publish(1, 1, store.location(Entry(1, 1, SAVE)))
        assert log.operations() == ["ListObjectsV2", "HeadObject"]

    def test_an_object_at_the_save_key_is_a_single_file_save(self, moto: InProcess) -> None:
        """An object at exactly the save's key, with nothing under it, is a single-file save: published."""
        store, log, _client = moto.store()
        moto.put(f"{ROOT_PREFIX}/{SAVE}")
        assert store.publish(1, 1, store.location(Entry(1, 1, SAVE))) == Entry(1, 1, SAVE)
        assert log.operations() == ["ListObjectsV2", "HeadObject", "PutObject"]

    def test_a_longer_sibling_folder_does_not_make_a_save_exist(self, moto: InProcess) -> None:
        """Objects under checkpoint-10/ do not count as the save checkpoint-1."""
        store, _log, _client = moto.store()
        moto.put(f"{ROOT_PREFIX}/exec/a/checkpoint-10/model.bin")
        with pytest.raises(SaveNotFoundError):
            store.publish(1, 1, store.location(Entry(1, 1, "exec/a/checkpoint-1")))

    def test_a_conflict_409_is_retried_and_then_succeeds(self, http: OverHttp, aws_env: Any) -> None:
        """409 ConditionalRequestConflict on the put is retried; the retry creates the entry."""
        store, log, client = http.store(configured_client(http.endpoint))
        answered = answer_instead(client, "PutObject", 409, error_body("ConditionalRequestConflict"), times=1)
        http.put(f"{SAVE}/model.bin")
        entry = store.publish(3, 30, store.location(Entry(3, 30, SAVE)))
        assert len(answered) == 1
        assert log.operations() == ["ListObjectsV2", "PutObject", "PutObject"]
        assert http.keys("pub/") == [pub_key(entry)]

    def test_a_conflict_that_persists_is_a_storage_error_after_bounded_attempts(self, http: OverHttp) -> None:
        """A 409 on every attempt ends, after four puts, in StorageError naming the code and the entry key."""
        store, log, client = http.store()
        answer_instead(client, "PutObject", 409, error_body("ConditionalRequestConflict"))
        http.put(f"{SAVE}/model.bin")
        with pytest.raises(StorageError, match="ConditionalRequestConflict") as caught:
            store.publish(3, 30, store.location(Entry(3, 30, SAVE)))
        assert log.count("PutObject") == 4
        assert format_entry_name(Entry(3, 30, SAVE)) in str(caught.value)

    def test_a_retried_put_meeting_its_own_earlier_success_is_this_publish(
        self, http: OverHttp, aws_env: Any
    ) -> None:
        """The first put landed but its answer was lost (500); the retry meets 412, the HeadObject finds this
        publish's writer token: the entry is returned as published by this call."""
        store, log, client = http.store(configured_client(http.endpoint, max_attempts=2))
        entry = Entry(3, 30, SAVE)
        http.put(f"{SAVE}/model.bin")

        def land_then_fail(request: Any) -> bytes:
            token = request.headers["x-amz-meta-ckpt-writer"].decode()  # the write reached the storage ...
            http.client.put_object(
                Bucket=http.bucket, Key=pub_key(entry), Body=b"", Metadata={"ckpt-writer": token}
            )
            return error_body("InternalError")  # ... but the client saw a server error

        answer_instead(client, "PutObject", 500, land_then_fail, times=1)
        assert store.publish(3, 30, store.location(entry)) == entry
        assert log.operations() == ["ListObjectsV2", "PutObject", "PutObject", "HeadObject"]
        assert http.keys("pub/") == [pub_key(entry)]

    def test_a_retried_put_meeting_another_writers_entry_reports_exists(
        self, http: OverHttp, aws_env: Any
    ) -> None:
        """The first put never landed (500) and another writer created the entry meanwhile: its object holds
        another token, so the retry's 412 is ExistsError."""
        store, log, client = http.store(configured_client(http.endpoint, max_attempts=2))
        entry = Entry(3, 30, SAVE)
        http.put(f"{SAVE}/model.bin")

        def other_writer_then_fail(request: Any) -> bytes:
            other = "0" * 32
            http.client.put_object(
                Bucket=http.bucket, Key=pub_key(entry), Body=b"", Metadata={"ckpt-writer": other}
            )
            return error_body("InternalError")

        answer_instead(client, "PutObject", 500, other_writer_then_fail, times=1)
        with pytest.raises(ExistsError) as caught:
            store.publish(3, 30, store.location(entry))
        assert caught.value.entry == entry
        assert log.operations() == ["ListObjectsV2", "PutObject", "PutObject", "HeadObject"]

    def test_a_storage_without_conditional_create_is_refused(self, http: OverHttp) -> None:
        """501 NotImplemented to If-None-Match is a StorageError saying the storage cannot hold the log."""
        store, _log, client = http.store()
        answer_instead(client, "PutObject", 501, error_body("NotImplemented"))
        http.put(f"{SAVE}/model.bin")
        with pytest.raises(StorageError, match="does not implement If-None-Match"):
            store.publish(1, 1, store.location(Entry(1, 1, SAVE)))


class TestReads:
    def test_resolve_over_2500_entries_is_three_list_requests(self, moto: InProcess) -> None:
        """resolve over n entries costs ceil(n/1000) ListObjectsV2 requests and nothing else."""
        store, log, _client = moto.store()
        n = 2500
        for step in range(n):
            moto.put_fast(pub_key(Entry(1, step, f"exec/a/ck-{step}"), f"{ROOT_PREFIX}/"))
        assert store.resolve() == Entry(1, n - 1, f"exec/a/ck-{n - 1}")
        assert log.operations() == ["ListObjectsV2"] * math.ceil(n / PAGE_SIZE)
        log.clear()
        entries = store.entries()
        assert len(entries) == n
        assert [e.step for e in entries] == list(range(n))
        assert log.operations() == ["ListObjectsV2"] * 3

    def test_an_empty_log_is_one_list_request(self, moto: InProcess) -> None:
        """Nothing published: resolve is None after a single listing."""
        store, log, _client = moto.store()
        assert store.resolve() is None
        assert log.operations() == ["ListObjectsV2"]

    def test_a_sub_folder_of_pub_on_a_later_page_is_malformed(self, moto: InProcess) -> None:
        """A common prefix inside pub/ is MalformedError naming it, also when it shows up on page two."""
        store, log, _client = moto.store()
        for step in range(1200):
            moto.put_fast(pub_key(Entry(1, step, f"exec/a/ck-{step}"), f"{ROOT_PREFIX}/"))
        moto.put_fast(f"{ROOT_PREFIX}/pub/zz-folder/inside")
        with pytest.raises(MalformedError) as caught:
            store.entries()
        assert caught.value.value == "zz-folder"
        assert "zz-folder" in str(caught.value)
        assert log.count("ListObjectsV2") == 2

    def test_the_pub_folder_marker_is_not_an_entry(self, moto: InProcess) -> None:
        """The zero-byte ``pub/`` object some consoles create is pub/ itself, not a malformed name."""
        store, _log, _client = moto.store()
        moto.put(f"{ROOT_PREFIX}/pub/")
        assert store.entries() == []

    def test_a_sibling_prefix_is_another_root(self, moto: InProcess) -> None:
        """Entries under team-a/run-420 are not seen from team-a/run-42."""
        store, _log, _client = moto.store()
        sibling, _, _ = moto.store(f"s3://{moto.bucket}/{ROOT_PREFIX}0")
        moto.put(f"{ROOT_PREFIX}0/{SAVE}/model.bin")
        sibling.publish(1, 1, sibling.location(Entry(1, 1, SAVE)))
        assert store.entries() == []
        assert [e.save for e in sibling.entries()] == [SAVE]

    def test_a_missing_bucket_is_not_found_naming_the_bucket(self, moto: InProcess) -> None:
        """NoSuchBucket becomes NotFoundError whose message and location name the bucket."""
        store, _log, _client = moto.store("s3://no-such-bucket-here/run")
        for read in (store.entries, store.resolve):
            with pytest.raises(NotFoundError) as caught:
                read()
            assert "'no-such-bucket-here' does not exist" in str(caught.value)
            assert "NoSuchBucket" in str(caught.value)
            assert caught.value.location == "s3://no-such-bucket-here"

    def test_files_leave_out_folder_markers_and_folders_work_at_the_root(self, moto: InProcess) -> None:
        """files() lists objects (not ``sub/`` markers) sorted; folders() of the root lists exec."""
        store, _log, _client = moto.store()
        for key, data in (("b.bin", b"12"), ("sub/", b""), ("sub/a.bin", b"1"), ("a.json", b"{}")):
            moto.put(f"{ROOT_PREFIX}/{SAVE}/{key}", data)
        files = store.files(store.location(Entry(1, 1, SAVE)))
        assert [(f.path, f.size) for f in files] == [("a.json", 2), ("b.bin", 2), ("sub/a.bin", 1)]
        assert [(f.name, f.location) for f in store.folders(store.root)] == [("exec", f"{store.root}/exec")]


class TestPrune:
    def test_pruning_k_entries_and_a_folder_of_m_objects_is_ceil_k_plus_ceil_m_deletes(
        self, moto: InProcess
    ) -> None:
        """1001 entries and one folder of 1500 objects take 2 + 2 DeleteObjects of at most 1000 keys."""
        store, log, client = moto.store()
        base = f"{ROOT_PREFIX}/"
        removed = [Entry(1, 0, "exec/a")] + [Entry(1, i, f"exec/a/ck-{i}") for i in range(1, 1001)]
        kept = Entry(2, 0, "exec/b/ck-0")
        for entry in [*removed, kept]:
            moto.put_fast(pub_key(entry, base))
        m = 1500
        for i in range(m):
            moto.put_fast(f"{base}exec/a/ck-{i % 1000}/shard-{i:05d}")
        moto.put_fast(f"{base}exec/b/ck-0/model.bin")
        sizes: list[int] = []
        client.meta.events.register(
            "before-send.s3.DeleteObjects", lambda request, **_: sizes.append(request.body.count(b"<Key>"))
        )
        result = store.prune(1)
        k = len(removed)
        assert log.count("DeleteObjects") == math.ceil(k / 1000) + math.ceil(m / 1000)
        assert sizes == [1000, 1, 1000, 500]
        assert result.removed_folders == (f"{store.root}/exec/a",)
        assert len(result.removed_entries) == k
        assert store.entries() == [kept]
        assert moto.keys(f"{base}exec/a/") == []
        assert moto.keys(f"{base}exec/b/") == [f"{base}exec/b/ck-0/model.bin"]

    def test_a_dry_run_sends_only_the_listings(self, moto: InProcess) -> None:
        """prune(dry_run=True) reads the log and the journals, and writes and deletes nothing."""
        store, log, _client = moto.store()
        for step in (1, 2):
            moto.put(f"{ROOT_PREFIX}/exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        log.clear()
        result = store.prune(1, dry_run=True)
        assert [e.step for e in result.removed_entries] == [1]
        assert log.operations() == ["ListObjectsV2"] * 3  # the log, the pins, then earlier journals

    def test_an_entry_published_during_the_prune_protects_its_folder(self, moto: InProcess) -> None:
        """The log is read again after the entry deletions: a folder a new entry names is skipped."""
        store, _log, client = moto.store()
        for step in (1, 2):
            moto.put(f"{ROOT_PREFIX}/exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        late = Entry(9, 1, "exec/a/ck-1")

        def publish_late(**_: Any) -> None:
            moto.put(pub_key(late, f"{ROOT_PREFIX}/"))

        client.meta.events.register("after-call.s3.DeleteObjects", publish_late)
        result = store.prune(1)
        location = store.location(late)
        assert [(s.location, s.reason) for s in result.skipped] == [
            (location, "named by an entry published during the prune")
        ]
        assert moto.keys(f"{ROOT_PREFIX}/exec/a/ck-1/") == [f"{ROOT_PREFIX}/exec/a/ck-1/model.bin"]

    def test_refused_entry_deletions_stop_the_prune_before_any_folder(self, http: OverHttp) -> None:
        """Per-key errors on the entries are a StorageError listing them; no folder is touched."""
        store, log, client = http.store()
        for step in (1, 2, 3):
            http.put(f"exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        answer_instead(client, "DeleteObjects", 200, _refuse_every_key("AccessDenied"))
        with pytest.raises(StorageError) as caught:
            store.prune(1)
        message = str(caught.value)
        assert "could not remove 2 of 2 entries" in message
        assert "AccessDenied" in message
        assert store.location(Entry(1, 1, "exec/a/ck-1")) not in message  # entry URLs, not folders
        assert f"s3://{http.bucket}/{pub_key(Entry(1, 1, 'exec/a/ck-1'))}" in message
        assert log.count("DeleteObjects") == 1
        assert http.keys("exec/a/ck-1/") == ["exec/a/ck-1/model.bin"]

    def test_a_single_file_save_is_deleted_in_the_same_batch_as_the_folders(self, moto: InProcess) -> None:
        """A single-file save's object joins the folders' keys: one DeleteObjects for the saves' keys."""
        store, _log, client = moto.store()
        base = f"{ROOT_PREFIX}/"
        moto.put(f"{base}exec/a/ck-1/model.bin")
        moto.put(f"{base}exec/a/ck-1/optimizer.pt")
        moto.put(f"{base}exec/a/ck-2")  # a single-file save: the object at exactly the save's key
        moto.put(f"{base}exec/a/ck-3/model.bin")
        for step in (1, 2, 3):
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        sizes: list[int] = []
        client.meta.events.register(
            "before-send.s3.DeleteObjects", lambda request, **_: sizes.append(request.body.count(b"<Key>"))
        )
        result = store.prune(1)
        assert sizes == [2, 3]  # the two entries, then the three saved objects together
        assert result.removed_folders == (f"{store.root}/exec/a/ck-1", f"{store.root}/exec/a/ck-2")
        assert moto.keys(f"{base}exec/a/") == [f"{base}exec/a/ck-3/model.bin"]
        assert [e.step for e in store.entries()] == [3]

    def test_refused_folder_objects_are_reported_after_the_other_folders_are_removed(
        self, http: OverHttp
    ) -> None:
        """Per-key errors inside one folder do not stop the others, and end in a StorageError naming them."""
        store, _log, client = http.store()
        for step in (1, 2, 3):
            http.put(f"exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        # The folders' objects go out in one DeleteObjects: the storage deletes the others and refuses
        # exec/a/ck-1's (taken out of the request before it is signed, reported refused in the answer).
        held: list[str] = []

        def hold_ck_1(params: dict[str, Any], **_: Any) -> None:
            objects = params["Delete"]["Objects"]
            held.extend(o["Key"] for o in objects if o["Key"].startswith("exec/a/ck-1/"))
            params["Delete"]["Objects"] = [o for o in objects if o["Key"] not in held]

        def refuse_held(parsed: dict[str, Any], **_: Any) -> None:
            parsed["Errors"] = [{"Key": key, "Code": "AccessDenied"} for key in held]

        client.meta.events.register("provide-client-params.s3.DeleteObjects", hold_ck_1)
        client.meta.events.register("after-call.s3.DeleteObjects", refuse_held)
        with pytest.raises(StorageError) as caught:
            store.prune(1)
        message = str(caught.value)
        assert f"s3://{http.bucket}/exec/a/ck-1/model.bin (AccessDenied)" in message
        assert "removed 2 entries and 1 folders" in message
        assert http.keys("exec/a/ck-2/") == []
        assert http.keys("exec/a/ck-1/") == ["exec/a/ck-1/model.bin"]
        assert [e.step for e in store.entries()] == [3]

    def test_no_such_key_in_a_delete_answer_counts_as_gone(self, http: OverHttp) -> None:
        """A per-key NoSuchKey means the object is already gone, which is what prune asked for."""
        store, _log, client = http.store()
        for step in (1, 2):
            http.put(f"exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        folder = b"exec/a/ck-1/"
        answer_instead(
            client, "DeleteObjects", 200, _refuse_every_key("NoSuchKey"), when=lambda r: folder in r.body
        )
        result = store.prune(1)
        assert [e.step for e in result.removed_entries] == [1]
        assert result.removed_folders == (store.location(Entry(1, 1, "exec/a/ck-1")),)


class TestPruneJournal:
    def test_a_prune_writes_its_journal_first_and_drops_it_last(self, moto: InProcess) -> None:
        """One PutObject of <prefix>.ckpt-prune-<hex> before any delete; one DeleteObject of it at the end."""
        store, log, client = moto.store()
        for step in (1, 2):
            moto.put(f"{ROOT_PREFIX}/exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        journals: list[bytes] = []
        client.meta.events.register(
            "before-parameter-build.s3.PutObject", lambda params, **_: journals.append(params["Body"])
        )
        log.clear()
        store.prune(1)
        assert log.operations() == [
            "ListObjectsV2",  # the plan
            "ListObjectsV2",  # the pins for the plan: none
            "ListObjectsV2",  # journals earlier prunes left: none
            "PutObject",  # this prune's journal
            "DeleteObjects",  # the entry
            "ListObjectsV2",  # the re-read: the entries
            "ListObjectsV2",  # the re-read: the pins
            "PutObject",  # the journal's decision, If-None-Match: *
            "HeadObject",  # the journal still there
            "ListObjectsV2",  # the folder's objects
            "DeleteObjects",  # the folder
            "DeleteObject",  # the journal
            "DeleteObject",  # its decision
        ]
        entry = format_entry_name(Entry(1, 1, "exec/a/ck-1"))
        assert journals == [
            f"ckpt prune journal 2\nfolder exec/a/ck-1\nentry {entry}\nend\n".encode(),
            f"ckpt prune decision 1\n{entry}\nend\n".encode(),
        ]
        assert moto.keys(f"{ROOT_PREFIX}/.ckpt-prune-") == []

    def test_a_failed_prune_leaks_no_folder_and_the_next_finishes(self, http: OverHttp) -> None:
        """A prune failing after removing its entries leaves its journal; the next prune removes it."""
        store, _log, client = http.store()
        for step in (1, 2, 3):
            http.put(f"exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        answer_instead(
            client,
            "DeleteObjects",
            503,
            error_body("ServiceUnavailable", "down"),
            when=lambda request: b"exec/a/ck-1/" in request.body,
        )
        with pytest.raises(StorageError) as caught:
            store.prune(1)
        assert "the next prune removes them" in str(caught.value)
        assert [e.step for e in store.entries()] == [3]  # the entries went before the folders
        assert http.keys("exec/a/ck-1/") == ["exec/a/ck-1/model.bin"]
        assert len(http.keys(".ckpt-prune-")) == 2  # the journal and its decision
        clean = S3Store(store.root, http.client)
        result = clean.prune(1)
        assert result.removed_entries == ()
        # The failure stopped the removals at ck-1, so ck-2 was left too: the journal lists both.
        assert result.removed_folders == tuple(clean.location(Entry(1, n, f"exec/a/ck-{n}")) for n in (1, 2))
        assert http.keys("exec/a/ck-1/") == []
        assert http.keys(".ckpt-prune-") == []

    def test_a_folder_a_journal_lists_but_an_entry_needs_again_stays(self, moto: InProcess) -> None:
        """A journal's folder published again since is neither removed nor reported; the journal goes."""
        store, _log, _client = moto.store()
        moto.put(f"{ROOT_PREFIX}/exec/a/ck-1/model.bin")
        moto.put(f"{ROOT_PREFIX}/.ckpt-prune-0123456789abcdef", b"ckpt prune journal 1\nexec/a/ck-1\nend\n")
        store.publish(1, 1, store.location(Entry(1, 1, "exec/a/ck-1")))
        result = store.prune(1)
        assert (result.removed_folders, result.skipped) == ((), ())
        assert moto.keys(f"{ROOT_PREFIX}/exec/a/ck-1/") == [f"{ROOT_PREFIX}/exec/a/ck-1/model.bin"]
        assert moto.keys(f"{ROOT_PREFIX}/.ckpt-prune-") == []

    def test_a_malformed_journal_stops_the_prune_naming_it(self, moto: InProcess) -> None:
        """A finished journal that does not parse is MalformedError naming its URL; nothing is removed."""
        store, _log, _client = moto.store()
        for step in (1, 2):
            moto.put(f"{ROOT_PREFIX}/exec/a/ck-{step}/model.bin")
            store.publish(1, step, store.location(Entry(1, step, f"exec/a/ck-{step}")))
        key = f"{ROOT_PREFIX}/.ckpt-prune-0123456789abcdef"
        moto.put(key, b"ckpt prune journal 1\n../../etc\nend\n")
        with pytest.raises(MalformedError, match=re.escape(f"s3://{moto.bucket}/{key}")):
            store.prune(1)
        assert len(store.entries()) == 2


def _refuse_every_key(code: str) -> Any:
    """Return a DeleteObjects answer body refusing every key of the request with ``code``."""

    def body(request: Any) -> bytes:
        keys = re.findall(rb"<Key>(.*?)</Key>", request.body)
        errors = b"".join(
            b"<Error><Key>" + key + b"</Key><Code>" + code.encode() + b"</Code><Message>no</Message></Error>"
            for key in keys
        )
        return b'<?xml version="1.0" encoding="UTF-8"?><DeleteResult>' + errors + b"</DeleteResult>"

    return body


class TestErrorTranslation:
    def _assert_ours_alone(self, error: BaseException) -> None:
        assert not isinstance(error, ClientError | BotoCoreError)
        assert error.__cause__ is None
        assert error.__context__ is None

    def test_access_denied_is_a_storage_error_naming_bucket_and_code_without_the_body(
        self, http: OverHttp
    ) -> None:
        """403 AccessDenied becomes StorageError (not NotFoundError) with the code; S3's text is dropped."""
        store, _log, client = http.store()
        answer_instead(client, "ListObjectsV2", 403, error_body("AccessDenied", "BODY-TEXT-ECHO"))
        with pytest.raises(StorageError) as caught:
            store.resolve()
        message = str(caught.value)
        assert not isinstance(caught.value, NotFoundError)
        assert f"s3://{http.bucket}/pub/" in message
        assert "AccessDenied, HTTP 403" in message
        assert "BODY-TEXT-ECHO" not in message
        self._assert_ours_alone(caught.value)

    def test_a_refused_signature_is_a_credentials_error_that_drops_the_echoed_request(
        self, http: OverHttp
    ) -> None:
        """SignatureDoesNotMatch is CredentialsError; the canonical request S3 echoes (with token) is gone."""
        store, _log, client = http.store()
        echo = "x-amz-security-token:SESSION-TOKEN-VALUE"
        answer_instead(
            client, "ListObjectsV2", 403, error_body("SignatureDoesNotMatch", CanonicalRequest=echo)
        )
        with pytest.raises(CredentialsError) as caught:
            store.entries()
        assert "SignatureDoesNotMatch" in str(caught.value)
        assert "SESSION-TOKEN-VALUE" not in str(caught.value)
        self._assert_ours_alone(caught.value)

    def test_an_unreachable_endpoint_is_a_storage_error_naming_bucket_and_endpoint(
        self, aws_env: Any
    ) -> None:
        """Connection refused on a closed loopback port: StorageError naming the bucket and the endpoint."""
        endpoint = f"http://127.0.0.1:{free_port()}"
        store = S3Store("s3://ckpt-unreachable/run", configured_client(endpoint, max_attempts=1))
        with pytest.raises(StorageError) as caught:
            store.resolve()
        message = str(caught.value)
        assert "s3://ckpt-unreachable/run/pub/" in message
        assert f"cannot connect to {endpoint}" in message
        self._assert_ours_alone(caught.value)

    def test_a_silent_endpoint_is_a_storage_error_after_the_read_timeout(self, aws_env: Any) -> None:
        """A server that accepts but never answers ends in StorageError once read_timeout passes."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)  # the kernel completes the handshake; nothing ever reads or answers
            endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
            client = configured_client(endpoint, max_attempts=1, read_timeout=0.3)
            store = S3Store("s3://ckpt-silent", client)
            with pytest.raises(StorageError, match="did not answer in time") as caught:
                store.resolve()
        self._assert_ours_alone(caught.value)

    def test_no_credentials_anywhere_is_a_credentials_error(
        self, s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A chain that finds nothing is CredentialsError listing the sources, not a botocore error."""
        isolate_from_aws_environment(monkeypatch, tmp_path)
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        client = make_s3_client(http_settings(s3_server, credentials=()), environ={})
        store = S3Store("s3://ckpt-nokeys", only_loopback(client))
        expected = "no credentials found; sources tried: aws-default"
        with pytest.raises(CredentialsError, match=expected) as caught:
            store.resolve()
        self._assert_ours_alone(caught.value)


class TestProbeExclusiveCreate:
    def test_moto_honours_exclusive_create_and_the_probe_leaves_nothing(
        self, moto: InProcess, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Of eight concurrent creates one wins, seven get 412, and the probe object is deleted afterwards."""
        from moto.s3.responses import S3Response

        # moto checks the condition and then writes; made atomic here, as S3 is (support/atomic_moto_server).
        put_object, lock = S3Response.put_object, threading.Lock()

        def atomic_put_object(self: Any) -> Any:
            with lock:
                return put_object(self)

        monkeypatch.setattr(S3Response, "put_object", atomic_put_object)
        store, log, _client = moto.store()
        result = store.probe_exclusive_create()
        assert (result.honoured, result.writers, result.created, result.refused) == (True, 8, 1, 7)
        assert result.location.startswith(f"{store.root}/.ckpt-doctor/")
        # Each of the seven 412s is followed by one HeadObject (operations.md §2.6); the delete comes last.
        assert sorted(log.operations()[:-1]) == ["HeadObject"] * 7 + ["PutObject"] * 8
        assert log.operations()[-1] == "DeleteObject"
        assert moto.keys(f"{ROOT_PREFIX}/") == []

    def test_a_storage_ignoring_if_none_match_is_reported(self, http: OverHttp) -> None:
        """When the condition is dropped on the way, the second create succeeds and the probe says so."""
        store, _log, client = http.store()

        def drop_condition(request: Any, **_: Any) -> None:
            del request.headers["If-None-Match"]

        client.meta.events.register("before-sign.s3.PutObject", drop_condition)
        result = store.probe_exclusive_create()
        assert result.honoured is False
        assert "ignores the condition" in result.detail
        assert http.keys(".ckpt-doctor/") == []

    def test_a_storage_rejecting_the_condition_is_reported(self, http: OverHttp) -> None:
        """501 NotImplemented to If-None-Match: * means exclusive create is not honoured."""
        store, _log, client = http.store()
        answer_instead(client, "PutObject", 501, error_body("NotImplemented"))
        result = store.probe_exclusive_create()
        assert result.honoured is False
        assert "does not implement" in result.detail


def proxy_lookup(client: Any, url: str) -> str | None:
    """The proxy botocore's HTTP session would take for a request to ``url`` (its per-request lookup)."""
    answer: str | None = client._endpoint.http_session._proxy_config.proxy_url_for(url)
    return answer


class TestMakeS3Client:
    def test_client_settings_come_from_the_configuration(self, aws_env: Any) -> None:
        """Endpoint, region, addressing style, timeouts and standard retries are the [s3] values."""
        config = Config(
            s3=S3Settings(
                endpoint_url="http://127.0.0.1:9",
                region="eu-west-3",
                addressing_style="path",
                connect_timeout=1.5,
                read_timeout=7.0,
                max_attempts=3,
            )
        )
        client = make_s3_client(config, environ={})
        assert client.meta.endpoint_url == "http://127.0.0.1:9"
        assert client.meta.region_name == "eu-west-3"
        assert (client.meta.config.connect_timeout, client.meta.config.read_timeout) == (1.5, 7.0)
        assert client.meta.config.retries == {"total_max_attempts": 3, "mode": "standard"}
        assert client.meta.config.s3["addressing_style"] == "path"
        assert client.meta.config.proxies == {}

    def test_ambient_aws_settings_cannot_redirect_the_client(
        self, aws_env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """AWS_ENDPOINT_URL*, AWS_DEFAULT_REGION, AWS_MAX_ATTEMPTS and a profile's settings are ignored."""
        profile = tmp_path / "aws-config"
        profile.write_text(
            "[default]\nregion = ap-south-1\nendpoint_url = http://127.0.0.1:2\nmax_attempts = 9\n"
            "s3 =\n  addressing_style = virtual\n"
        )
        aws_env.setenv("AWS_CONFIG_FILE", str(profile))
        aws_env.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1")
        aws_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        aws_env.setenv("AWS_DEFAULT_REGION", "ap-south-1")
        aws_env.setenv("AWS_MAX_ATTEMPTS", "9")
        client = make_s3_client(Config(), environ={})
        assert client.meta.region_name == "us-east-1"
        assert client.meta.endpoint_url.endswith(".amazonaws.com")
        assert client.meta.config.retries == {"total_max_attempts": 5, "mode": "standard"}
        assert client.meta.config.s3["addressing_style"] == "auto"

    def test_the_proxy_comes_from_the_rule_on_the_given_environment(
        self, aws_env: pytest.MonkeyPatch
    ) -> None:
        """The environment passed in decides the proxy, NO_PROXY included; os.environ is not read.

        botocore's own setting is always ``{}``; the client's per-request proxy lookup answers from the rule.
        """
        aws_env.setenv("HTTPS_PROXY", "http://127.0.0.1:3")
        config = Config(s3=S3Settings(endpoint_url="https://objects.example.internal:9000"))
        url = "https://objects.example.internal:9000/bucket/key"
        direct = make_s3_client(config, environ={})
        assert (direct.meta.config.proxies, proxy_lookup(direct, url)) == ({}, None)
        proxied = {"HTTPS_PROXY": "http://proxy.example.internal:3128"}
        assert (
            proxy_lookup(make_s3_client(config, environ=proxied), url) == "http://proxy.example.internal:3128"
        )
        bypassed = {**proxied, "NO_PROXY": ".example.internal"}
        assert proxy_lookup(make_s3_client(config, environ=bypassed), url) is None

    def test_a_proxy_table_replaces_the_environment(self, aws_env: Any) -> None:
        """With a [proxy] table, the proxy variables of the environment are not consulted."""
        config = Config(
            s3=S3Settings(endpoint_url="https://objects.example.internal:9000"),
            proxy={"https_proxy": "http://configured.example:8080"},
        )
        client = make_s3_client(config, environ={"HTTPS_PROXY": "http://from-env.example:3128"})
        assert (
            proxy_lookup(client, "https://objects.example.internal:9000/") == "http://configured.example:8080"
        )

    def test_open_s3_store_talks_to_the_configured_endpoint(self, http: OverHttp, aws_env: Any) -> None:
        """open_s3_store (and open_store for s3:// roots) builds a working store from the configuration."""
        config = http_settings(http.endpoint)
        http.put(f"{ROOT_PREFIX}/{SAVE}/model.bin")
        root = f"s3://{http.bucket}/{ROOT_PREFIX}"
        store = open_s3_store(root, config=config, environ=FAKE_ENV)
        entry = store.publish(2, 20, f"{root}/{SAVE}")
        same_root = open_store(root, config=config, environ=FAKE_ENV)
        assert isinstance(same_root, S3Store)
        assert same_root.resolve() == entry

    def test_open_s3_store_refuses_a_bad_root_before_building_a_client(self) -> None:
        """The root is checked first: a bad URL fails even with a configuration no client could use."""
        broken = Config(s3=S3Settings(endpoint_url="::not a url::"))
        with pytest.raises(InvalidError, match="not a valid S3 root"):
            open_s3_store("s3://Bad_Bucket", config=broken, environ={})

    def test_a_malformed_endpoint_is_invalid(self, aws_env: Any) -> None:
        """An endpoint URL botocore cannot use is InvalidError naming the setting."""
        with pytest.raises(InvalidError, match=r"s3\.endpoint_url"):
            make_s3_client(Config(s3=S3Settings(endpoint_url="::not a url::")), environ={})

    def test_importing_the_adapter_imports_no_vendor_library(self) -> None:
        """boto3 and botocore are imported when a store is opened, never when the module is imported."""
        code = "import sys, ckpt.adapters.s3; print(sorted(m for m in sys.modules if m.startswith('boto')))"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        )
        assert out.stdout.strip() == "[]"
