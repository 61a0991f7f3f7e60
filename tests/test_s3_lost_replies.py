"""S3 creates that know their own: a conditional put that landed, its reply lost (operations.md §2.6).

Every test runs the real ``S3Store`` (or the CLI as a subprocess) against the S3 server over HTTP (moto's,
then Ceph RGW), through a relay on 127.0.0.1 in front of it (``ForwardProxy(upstream=...)``,
tests/support/forward_proxy.py): the client's endpoint is the relay, which forwards the first ``PutObject`` of
one key to the server, reads its answer and closes the client's connection without sending it; every later
request passes through. botocore retries the put, the retry meets 412, and the ``HeadObject`` that follows
finds this call's writer token in the object: the create is this call's. Another writer's create, an object
removed since the 412, a server that drops user metadata, and a failing ``HeadObject`` are each proven to stay
on the safe side.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.s3 import S3Store, make_s3_client
from ckpt.application.watcher import Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CredentialsError, ExistsError, NotFoundError, StorageError
from ckpt.domain.frameworks import Framework
from ckpt.domain.names import format_entry_name
from support.forward_proxy import (
    Drop,
    DropConnection,
    Exchange,
    ForwardProxy,
    Match,
    RecordedRequest,
    Respond,
    StripRequestHeader,
)
from support.s3 import (
    FAKE_ENV,
    RequestLog,
    http_settings,
    isolate_from_aws_environment,
    new_bucket_name,
    only_loopback,
    raw_client,
)
from test_cli_s3 import run, write_config

SAVE = "exec/2.4102.0/step-5"
ENTRY = Entry(7, 5, SAVE)
ENTRY_KEY = f"pub/{format_entry_name(ENTRY)}"
PIN_KEY = f"pins/{format_entry_name(ENTRY)}"
TOKEN_HEADER = "x-amz-meta-ckpt-writer"
TOKEN = re.compile(r"[0-9a-f]{32}")


class World:
    """A fresh bucket with one save; ``relay`` in front of moto; ``raw`` straight to moto."""

    def __init__(self, relay: ForwardProxy, raw: Any, monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
        self.relay = relay
        self.raw = raw
        self.bucket = new_bucket_name()
        raw.create_bucket(Bucket=self.bucket)
        raw.put_object(Bucket=self.bucket, Key=f"{SAVE}/.metadata", Body=b"m")
        raw.put_object(Bucket=self.bucket, Key=f"{SAVE}/__0_0.distcp", Body=b"shard")
        isolate_from_aws_environment(monkeypatch, tmp)  # the configured clients read no ~/.aws

    def store(self) -> tuple[S3Store, RequestLog]:
        """A store whose configured client (two attempts, as ``http_settings`` has it) talks to the relay."""
        client = only_loopback(make_s3_client(http_settings(self.relay.url), environ=FAKE_ENV))
        return S3Store(f"s3://{self.bucket}", client), RequestLog(client)

    def key_path(self, key: str) -> str:
        return f"/{self.bucket}/{key}"

    def drop_first_reply(self, key: str) -> Match:
        """Make the relay lose moto's answer to the next ``PutObject`` of ``key`` (moto applied it)."""
        match = Match(method="PUT", path_prefix=self.key_path(key), times=1)
        self.relay.rules.append(DropConnection(after_forwarding=True, when=match))
        return match

    def requests_for(self, key: str) -> list[RecordedRequest]:
        return [r for r in self.relay.requests if r.path == self.key_path(key)]

    def tokens_sent(self, key: str) -> list[str]:
        """The writer token of each ``PutObject`` of ``key`` the relay received, in order."""
        return [str(r.header(TOKEN_HEADER)) for r in self.requests_for(key) if r.method == "PUT"]

    def stored(self, key: str) -> dict[str, Any]:
        return dict(self.raw.head_object(Bucket=self.bucket, Key=key))

    def keys(self, prefix: str) -> list[str]:
        answer = self.raw.list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(obj["Key"] for obj in answer.get("Contents", ()))


@pytest.fixture
def world(s3_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[World]:
    port = int(s3_server.rsplit(":", 1)[1])
    with ForwardProxy(upstream=("127.0.0.1", port)) as relay:
        yield World(relay, raw_client(s3_server), monkeypatch, tmp_path)


class TestPublishWhoseReplyWasLost:
    def test_publish_returns_its_entry_not_exists_error(self, world: World) -> None:
        """The put landed, its reply was dropped, the retry met 412: the HeadObject finds our token, so
        publish returns the entry; four requests (ListObjectsV2, PutObject twice, HeadObject)."""
        store, log = world.store()
        dropped = world.drop_first_reply(ENTRY_KEY)
        assert store.publish(7, 5, store.location(ENTRY)) == ENTRY
        assert dropped.hits == 1
        assert [(r.method, r.outcome) for r in world.requests_for(ENTRY_KEY)] == [
            ("PUT", "dropped-after-forwarding"),
            ("PUT", "forwarded"),  # moto answered 412: the first put's object was there
            ("HEAD", "forwarded"),
        ]
        assert log.operations() == ["ListObjectsV2", "PutObject", "PutObject", "HeadObject"]
        first, retry = world.tokens_sent(ENTRY_KEY)
        assert TOKEN.fullmatch(first)
        assert retry == first  # botocore's retry is the same request
        stored = world.stored(ENTRY_KEY)
        assert (stored["ContentLength"], stored["Metadata"]) == (0, {"ckpt-writer": first})
        assert store.entries() == [ENTRY]

    def test_a_watcher_counts_it_as_its_own_and_fires_on_published_once(self, world: World) -> None:
        """A scan whose put lost its reply returns the entry and calls on_published once; a second scan and
        a new watcher publish nothing and send no put."""
        store, _log = world.store()
        fired: list[Entry] = []
        location = store.exec_dir("2.4102.0")
        watcher = Watcher(store, Framework.DCP, location, 7, 1.0, settle=0, on_published=fired.append)
        world.drop_first_reply(ENTRY_KEY)
        assert watcher.scan() == [ENTRY]
        assert fired == [ENTRY]
        world.relay.clear()
        assert watcher.scan() == []
        assert Watcher(store, Framework.DCP, location, 7, 1.0, settle=0).scan() == []
        assert fired == [ENTRY]
        assert [r for r in world.relay.requests if r.method == "PUT"] == []

    def test_another_publisher_of_the_entry_still_gets_exists_error(self, world: World) -> None:
        """After the lost-reply publish, a second publisher of the same entry, whose own 412 reply is lost
        too, gets ExistsError: only the writer whose token is stored can see its create as its own. No
        message carries a token."""
        first, _ = world.store()
        world.drop_first_reply(ENTRY_KEY)
        assert first.publish(7, 5, first.location(ENTRY)) == ENTRY
        second, log = world.store()
        world.relay.clear()
        world.drop_first_reply(ENTRY_KEY)
        with pytest.raises(ExistsError) as caught:
            second.publish(7, 5, second.location(ENTRY))
        assert caught.value.entry == ENTRY
        assert log.operations() == ["ListObjectsV2", "PutObject", "PutObject", "HeadObject"]
        ours, theirs = world.tokens_sent(ENTRY_KEY)[0], world.stored(ENTRY_KEY)["Metadata"]["ckpt-writer"]
        assert ours != theirs
        assert ours not in str(caught.value)
        assert theirs not in str(caught.value)
        assert world.keys("pub/") == [ENTRY_KEY]

    def test_an_entry_removed_between_the_412_and_the_head_is_exists(self, world: World) -> None:
        """Another writer's entry answers 412; it is removed before the HeadObject: that is "exists"
        (someone else's create happened), never "created"."""
        world.raw.put_object(Bucket=world.bucket, Key=ENTRY_KEY, Body=b"")  # another writer's, no token
        store, log = world.store()
        world.relay.rules.append(RemoveBeforeForwarding(world, ENTRY_KEY, Match(method="HEAD", times=1)))
        with pytest.raises(ExistsError):
            store.publish(7, 5, store.location(ENTRY))
        assert log.operations() == ["ListObjectsV2", "PutObject", "HeadObject"]
        assert world.keys("pub/") == []

    def test_a_server_that_drops_user_metadata_reports_a_lost_reply_as_exists(
        self, world: World, s3_server_kind: str
    ) -> None:
        """Where the metadata does not reach the object, a lost reply is ExistsError, as before the token:
        the safe side (the entry exists, durably); operations.md §2.6 says so.

        The metadata is removed on the way, by the relay. moto checks no signature and stores the object
        without it. botocore signs ``x-amz-meta-ckpt-writer``, so a server that checks signatures (Ceph RGW,
        as AWS) refuses that put instead: a clear CredentialsError saying the signed request was changed,
        and no entry. (A server that drops metadata by itself is then seen on moto only.)"""
        world.relay.rules.append(StripRequestHeader(TOKEN_HEADER, when=Match(method="PUT")))
        store, _log = world.store()
        if s3_server_kind == "rgw":
            with pytest.raises(CredentialsError, match="changed the signed request"):
                store.publish(7, 5, store.location(ENTRY))
            assert world.keys("pub/") == []
            return
        world.drop_first_reply(ENTRY_KEY)
        with pytest.raises(ExistsError):
            store.publish(7, 5, store.location(ENTRY))
        assert world.stored(ENTRY_KEY)["Metadata"] == {}
        assert world.keys("pub/") == [ENTRY_KEY]

    def test_a_failing_head_after_the_412_is_a_clear_storage_error(self, world: World) -> None:
        """When the HeadObject fails, whose create it was cannot be told: StorageError naming the entry's
        URL, no botocore error attached, never a guess."""
        store, _log = world.store()
        world.drop_first_reply(ENTRY_KEY)
        world.relay.rules.append(Respond(403, when=Match(method="HEAD")))
        with pytest.raises(StorageError) as caught:
            store.publish(7, 5, store.location(ENTRY))
        text = str(caught.value)
        assert f"s3://{world.bucket}/{ENTRY_KEY}" in text, text
        assert "tell who created (a 412 answered publish)" in text, text
        assert "access denied" in text, text
        assert caught.value.__cause__ is None
        assert caught.value.__context__ is None
        assert world.tokens_sent(ENTRY_KEY)[0] not in text

    def test_a_put_whose_every_reply_is_lost_is_a_storage_error_without_the_token(self, world: World) -> None:
        """With every put's reply lost and no attempt left, publish fails with a ckpt error (not
        ExistsError) that shows no token."""
        store, _log = world.store()
        world.relay.rules.append(DropConnection(after_forwarding=True, when=Match(method="PUT")))
        with pytest.raises(StorageError) as caught:
            store.publish(7, 5, store.location(ENTRY))
        assert all(token not in str(caught.value) for token in world.tokens_sent(ENTRY_KEY))


class RemoveBeforeForwarding:
    """A relay rule: remove ``key`` from moto (straight, not through the relay) before forwarding the
    matching request."""

    def __init__(self, world: World, key: str, when: Match) -> None:
        self.world, self.key, self.when = world, key, when

    def apply(self, exchange: Exchange) -> None:
        if self.when.take(exchange):
            self.world.raw.delete_object(Bucket=self.world.bucket, Key=self.key)


class TestPinWhoseReplyWasLost:
    def test_the_pin_returns_true_and_leaves_exactly_one_pin(self, world: World) -> None:
        """The pin's put lands, its reply is lost: pin returns True (this call pinned), one pin exists, and
        pinning again says already pinned."""
        world.raw.put_object(Bucket=world.bucket, Key=ENTRY_KEY, Body=b"")
        store, _log = world.store()
        world.drop_first_reply(PIN_KEY)
        assert store.pin(ENTRY) is True
        assert [r.outcome for r in world.requests_for(PIN_KEY) if r.method == "PUT"] == [
            "dropped-after-forwarding",
            "forwarded",
        ]
        assert world.keys("pins/") == [PIN_KEY]
        assert world.stored(PIN_KEY)["ContentLength"] == 0
        assert store.pinned() == [ENTRY]
        assert store.pin(ENTRY) is False
        assert world.keys("pins/") == [PIN_KEY]

    def test_a_pin_whose_entry_was_pruned_meanwhile_removes_its_own_pin(self, world: World) -> None:
        """The entry is removed while the pin's put is on its way, and the put's reply is lost: the pin
        is still known as this call's, so pin removes it again and raises NotFoundError: no stray pin."""
        world.raw.put_object(Bucket=world.bucket, Key=ENTRY_KEY, Body=b"")
        store, _log = world.store()
        put_of_pin = Match(method="PUT", path_prefix=world.key_path(PIN_KEY), times=1)
        world.relay.rules.append(RemoveBeforeForwarding(world, ENTRY_KEY, put_of_pin))  # a prune, meanwhile
        world.drop_first_reply(PIN_KEY)
        with pytest.raises(NotFoundError):
            store.pin(ENTRY)
        assert put_of_pin.hits == 1
        assert world.keys("pins/") == []
        assert store.pinned() == []


class DropEachWritersFirstReply:
    """A relay rule: lose moto's answer to the first ``PutObject`` of each writer token under ``path_prefix``
    (its retry, carrying the same token, passes)."""

    def __init__(self, path_prefix: str) -> None:
        self.path_prefix = path_prefix
        self.seen: set[str] = set()

    def apply(self, exchange: Exchange) -> None:
        token = exchange.header(TOKEN_HEADER)
        if exchange.method == "PUT" and exchange.path.startswith(self.path_prefix) and token not in self.seen:
            self.seen.add(str(token))
            exchange.drop = Drop.AFTER_FORWARDING


class TestProbeWithLostReplies:
    def test_the_concurrent_probe_still_counts_one_winner(self, world: World) -> None:
        """Eight writers with distinct tokens, the first reply of every one of them lost (the winner's
        included): still one created and seven refused, so doctor passes a good store; 16 puts, 8 heads."""
        store, log = world.store()
        lose = DropEachWritersFirstReply(f"/{world.bucket}/.ckpt-doctor/")
        world.relay.rules.append(lose)
        result = store.probe_exclusive_create()
        assert (result.honoured, result.writers, result.created, result.refused) == (True, 8, 1, 7)
        assert len(lose.seen) == 8
        assert all(TOKEN.fullmatch(token) for token in lose.seen)
        puts = [r.outcome for r in world.relay.requests if r.method == "PUT"]
        assert sorted(puts) == ["dropped-after-forwarding"] * 8 + ["forwarded"] * 8
        assert log.count("HeadObject") == 8  # every retry met 412 and asked whose the object was
        assert world.keys(".ckpt-doctor/") == []


class TestCliBehindTheRelay:
    def test_json_publish_whose_reply_was_lost_exits_0_with_the_entry(
        self, world: World, tmp_path: Path
    ) -> None:
        """``ckpt --json publish`` against the relay endpoint: exit 0 and the entry document; the token
        appears in no output line, debug log records included."""
        config = write_config(tmp_path / "ckpt.toml", f"s3://{world.bucket}", world.relay.url)
        world.drop_first_reply(ENTRY_KEY)
        published = run(
            config, "--log-level", "debug", "--json", "publish", "--epoch", "7", "--step", "5", SAVE
        )
        assert published.returncode == 0, published.stderr
        assert json.loads(published.stdout)["location"] == f"s3://{world.bucket}/{SAVE}"
        assert json.loads(published.stdout)["step"] == 5
        token = world.stored(ENTRY_KEY)["Metadata"]["ckpt-writer"]
        assert world.tokens_sent(ENTRY_KEY) == [token, token]
        assert token not in published.stdout + published.stderr
        again = run(config, "publish", "--epoch", "7", "--step", "5", SAVE)
        assert again.returncode == 4, again.stderr
        assert token not in again.stdout + again.stderr
