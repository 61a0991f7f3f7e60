"""The ``[s3]`` settings of secure buckets (spec/config.md §3.1, spec/layout.md §9, ADR 0028), over real HTTP.

The server is ``support.secure_moto_server``: moto's server, which stores and reports the encryption, KMS
key and storage class a write asks for, plus the two checks S3 makes and moto omits (an expected bucket
owner that does not own the bucket is ``403 AccessDenied`` on every request; a bucket policy denying an
unencrypted ``PutObject`` is judged on the request's header). Every object ``ckpt`` writes is looked at
with ``HeadObject`` through a separate plain boto3 client, and every request's headers are recorded on the
wire (botocore ``before-send``). No request leaves 127.0.0.1.

``TestOnCephRgw`` runs the same proofs through the session's Ceph RGW 16.2.15 (``support.rgw``: the KMS
test backend with one key, a placement class ``COLD``), stating per server where RGW does otherwise than
S3 (spec/layout.md §9.4): it ignores ``AES256`` and the expected owner, and ``ckpt doctor`` says so.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto.core import DEFAULT_ACCOUNT_ID

from ckpt.adapters.s3 import BucketSettings, S3Store, make_s3_client, open_s3_store, parse_s3_root
from ckpt.adapters.s3.objects import Bucket
from ckpt.adapters.s3_saves import S3Saves
from ckpt.application.catchup import record_epoch
from ckpt.application.world_size_record import record_world_size
from ckpt.config import parse_config
from ckpt.domain.catchup import EPOCH_RECORD, WORLD_SIZE_RECORD
from ckpt.domain.errors import CkptError, ConfigError, StorageError
from support.rgw import KMS_KEY_ID as RGW_KMS_KEY_ID
from support.rgw import STORAGE_CLASS as RGW_STORAGE_CLASS
from support.rgw import RgwServer
from support.s3 import http_settings, new_bucket_name, raw_client, serve_moto
from support.saves import put_save
from test_cli_s3 import KEYS, run

KMS_ARN = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
SECURE = {
    "sse": "aws:kms",
    "sse_kms_key_id": KMS_ARN,
    "storage_class": "STANDARD_IA",
    "expected_bucket_owner": DEFAULT_ACCOUNT_ID,  # moto's account owns every bucket it creates
}
OTHER_OWNER = "111122223333"
SECRET = "sse-test-secret-never-shown"
ENV = {"AWS_ACCESS_KEY_ID": "sse-test-key", "AWS_SECRET_ACCESS_KEY": SECRET}
ATTEMPT = "1.4101.0"
DENY_UNENCRYPTED = {  # the policy AWS documents for "refuse a PutObject without server-side encryption"
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "DenyUnencryptedObjectUploads",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:PutObject",
            "Resource": "arn:aws:s3:::{bucket}/*",
            "Condition": {"Null": {"s3:x-amz-server-side-encryption": "true"}},
        }
    ],
}
_SSE_HEADERS = {
    "x-amz-server-side-encryption": "aws:kms",
    "x-amz-server-side-encryption-aws-kms-key-id": KMS_ARN,
    "x-amz-storage-class": "STANDARD_IA",
}


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's server with the owner and encryption-policy checks (``support.secure_moto_server``)."""
    log = tmp_path_factory.mktemp("secure-moto") / "server.log"
    tests = str(Path(__file__).resolve().parent)
    with serve_moto(log, module="support.secure_moto_server", cwd=tests) as endpoint:
        yield endpoint


@pytest.fixture
def bucket(secure_server: str) -> str:
    name = new_bucket_name()
    raw_client(secure_server).create_bucket(Bucket=name)
    return name


class Wire:
    """Every request a client sends, with its headers; each object it writes, as another client heads it."""

    def __init__(self, client: Any, looker: Any, bucket: str) -> None:
        self.sent: list[tuple[str, dict[str, str]]] = []
        self.heads: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._looker, self._bucket = looker, bucket
        client.meta.events.register_first("before-send.s3", self._record)
        client.meta.events.register("before-parameter-build.s3.PutObject", self._remember_key)
        client.meta.events.register("after-call.s3.PutObject", self._head_written)

    def _record(self, request: Any, event_name: str, **_: Any) -> None:
        headers = {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()}
        with self._lock:
            self.sent.append((event_name.rsplit(".", 1)[-1], headers))

    def _remember_key(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["written_key"] = params["Key"]

    def _head_written(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if http_response.status_code == 200:  # looked at now: a journal or a probe is deleted soon after
            head = self._looker.head_object(Bucket=self._bucket, Key=context["written_key"])
            with self._lock:
                self.heads[context["written_key"]] = head

    def operations(self) -> set[str]:
        return {operation for operation, _ in self.sent}


def secure_store(endpoint: str, bucket: str, **settings: str) -> tuple[S3Store, Wire]:
    """The store a ``Config`` with ``settings`` makes (as ``open_s3_store``), its client watched."""
    config = http_settings(endpoint, **settings)
    client = make_s3_client(config, environ=ENV)
    wire = Wire(client, raw_client(endpoint), bucket)
    store = S3Store(f"s3://{bucket}", client, settings=BucketSettings.from_s3_settings(config.s3))
    return store, wire


def publish_saves(store: S3Store, looker: Any, steps: tuple[int, ...]) -> None:
    for step in steps:
        put_save(looker, store.bucket, f"exec/{ATTEMPT}/checkpoint-{step}")
        store.publish(1, step, store.exec_dir(ATTEMPT) + f"/checkpoint-{step}")


def write_every_kind(store: S3Store, looker: Any) -> None:
    """Entries, a pin, the epoch and world-size records, a prune (its journal and decision), doctor's two
    probes, and the watcher's reads of a save folder (listing, head, ranged get)."""
    publish_saves(store, looker, (100, 200, 300))
    assert store.pin(store.entries()[1]) is True
    assert record_epoch(store, ATTEMPT, 1) == 1
    assert record_world_size(store, ATTEMPT, 2) == 2
    assert [e.step for e in store.prune(1).removed_entries] == [100]
    assert store.probe_exclusive_create().honoured
    assert store.check_write_settings()[0] is True
    reader = store.saves_reader(store.exec_dir(ATTEMPT))
    assert reader.items()
    assert reader.is_file(EPOCH_RECORD)
    assert reader.head(EPOCH_RECORD, 1) == b"1"


WRITTEN_KINDS = {
    "entry": r"pub/.+",
    "pin": r"pins/.+",
    "epoch record": rf"exec/{ATTEMPT}/{re.escape(EPOCH_RECORD)}",
    "world-size record": rf"exec/{ATTEMPT}/{re.escape(WORLD_SIZE_RECORD)}",
    "prune journal": r"\.ckpt-prune-[0-9a-f]{16}",
    "prune decision": r"\.ckpt-prune-[0-9a-f]{16}\.decided",
    "doctor probe": r"\.ckpt-doctor/[0-9a-f]{16}",
}


def assert_every_kind_written(wire: Wire, *, sse: str, key_id: str, storage_class: str) -> None:
    """Every kind of object was written, and each came back (HeadObject) as asked."""
    written = set(wire.heads)
    for kind, pattern in WRITTEN_KINDS.items():
        assert any(re.fullmatch(pattern, key) for key in written), f"no {kind} among {sorted(written)}"
    for key, head in wire.heads.items():
        assert head.get("ServerSideEncryption") == sse, key
        assert head.get("SSEKMSKeyId") == key_id, key
        assert head.get("StorageClass") == storage_class, key


class TestEveryWriteCarriesTheSettings:
    def test_every_object_ckpt_writes_comes_back_encrypted_in_its_class(
        self, secure_server: str, bucket: str
    ) -> None:
        """Entries, a pin, the epoch and world-size records, the prune journal and decision and doctor's
        probes are all written with aws:kms, the key and STANDARD_IA, and every request (reads, listings,
        heads, deletes) carries the expected owner; HeadObject by another client shows what was stored."""
        store, wire = secure_store(secure_server, bucket, **SECURE)
        write_every_kind(store, raw_client(secure_server))
        assert_every_kind_written(wire, sse="aws:kms", key_id=KMS_ARN, storage_class="STANDARD_IA")

        assert {"PutObject", "ListObjectsV2", "HeadObject", "GetObject", "DeleteObjects", "DeleteObject"} <= (
            wire.operations()
        )
        owners = [(operation, headers.get("x-amz-expected-bucket-owner")) for operation, headers in wire.sent]
        probes = [owner for owner in owners if owner[1] != DEFAULT_ACCOUNT_ID]
        assert probes == [("HeadObject", "000000000000")]  # doctor's: does the server check the owner?
        for operation, headers in wire.sent:
            for name, value in _SSE_HEADERS.items():
                assert (headers.get(name) == value) is (operation == "PutObject"), (operation, name)

    def test_open_s3_store_takes_the_settings_from_the_configuration(self, secure_server: str) -> None:
        """The production path: ``open_s3_store`` hands the [s3] keys to every request of the store."""
        config = http_settings(secure_server, sse="AES256", storage_class="ONEZONE_IA")
        store = open_s3_store("s3://some-bucket", config=config, environ=ENV)
        assert store.settings == BucketSettings(sse="AES256", storage_class="ONEZONE_IA")
        assert store.settings.write_params() == {
            "ServerSideEncryption": "AES256",
            "StorageClass": "ONEZONE_IA",
        }

    def test_without_settings_no_request_carries_them(self, secure_server: str, bucket: str) -> None:
        """No key set: no request sends an encryption, class or owner header (the bucket's defaults hold)."""
        store, wire = secure_store(secure_server, bucket)
        publish_saves(store, raw_client(secure_server), (100,))
        assert wire.sent
        for _operation, headers in wire.sent:
            assert not {"x-amz-expected-bucket-owner", *_SSE_HEADERS} & set(headers)


def every_request_kind(client: Any, bucket: str, owner: str) -> dict[str, Any]:
    """One request of every kind ckpt sends, each expecting ``owner`` (``exec/1.1.0/checkpoint-1`` exists)."""
    root = parse_s3_root(f"s3://{bucket}")
    on = Bucket(root, client, BucketSettings(expected_bucket_owner=owner))
    saves = S3Saves(client, bucket, "exec/1.1.0/", settings=on.settings)
    return {
        "ListObjectsV2": lambda: list(on.pages("", delimiter=True, action="list")),
        "ListObjectsV2 (one key)": lambda: on.any_object_under("exec/", action="check"),
        "PutObject": lambda: on.put("exec/1.1.0/.ckpt-epoch", b"1\n", action="write"),
        "PutObject (exclusive)": lambda: on.create_new("pub/x", action="publish"),
        "GetObject": lambda: on.get("exec/1.1.0/checkpoint-1/trainer_state.json", action="read", limit=99),
        "GetObject (ranged)": lambda: saves.head("checkpoint-1/trainer_state.json", 4),
        "HeadObject": lambda: on.head("exec/1.1.0/checkpoint-1/trainer_state.json", action="check"),
        "DeleteObjects": lambda: on.delete_keys(["pub/x"], action="remove", location="s3://b/pub/"),
        "DeleteObject": lambda: on.delete_object("pub/x", action="remove"),
    }


class TestExpectedBucketOwner:
    def test_a_wrong_owner_is_refused_on_every_request_kind_and_named(
        self, secure_server: str, bucket: str
    ) -> None:
        """With another account as expected owner, every kind of request is refused (403 AccessDenied)
        and each error names ``[s3] expected_bucket_owner`` and the account; the right owner passes."""
        looker = raw_client(secure_server)
        put_save(looker, bucket, "exec/1.1.0/checkpoint-1")
        client = make_s3_client(http_settings(secure_server), environ=ENV)

        def requests(owner: str) -> dict[str, Any]:
            return every_request_kind(client, bucket, owner)

        for kind, request in requests(OTHER_OWNER).items():
            with pytest.raises(StorageError) as caught:
                request()
            message = str(caught.value)
            assert "access denied" in message, (kind, message)
            assert f"[s3] expected_bucket_owner ({OTHER_OWNER})" in message, (kind, message)
            assert SECRET not in message
        for request in requests(DEFAULT_ACCOUNT_ID).values():
            request()  # the bucket's owner: every request passes

    def test_doctor_fails_naming_the_expected_owner(
        self, secure_server: str, bucket: str, tmp_path: Path
    ) -> None:
        """``ckpt doctor`` with a wrong expected owner exits 1; the root check names the key."""
        config = write_config(
            tmp_path / "ckpt.toml", secure_server, bucket, expected_bucket_owner=OTHER_OWNER
        )
        result = run(config, "--json", "doctor")
        assert result.returncode == 1, result.stdout + result.stderr
        checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
        assert checks["root"]["ok"] is False
        assert f"[s3] expected_bucket_owner ({OTHER_OWNER})" in checks["root"]["detail"]
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr


def write_config(path: Path, endpoint: str, bucket: str, **settings: str) -> Path:
    lines = [
        f'root = "s3://{bucket}"',
        "[s3]",
        f'endpoint_url = "{endpoint}"',
        'region = "us-east-1"',
        'addressing_style = "path"',
        "max_attempts = 1",
        *(f'{key} = "{value}"' for key, value in settings.items()),
        "[[credentials]]",
        'source = "env"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


class TestDoctorWriteSettings:
    def test_the_probe_reports_the_encryption_and_class_it_came_back_with(
        self, secure_server: str, bucket: str, tmp_path: Path
    ) -> None:
        """The write-settings check passes and shows what HeadObject of its probe object reported."""
        config = write_config(tmp_path / "ckpt.toml", secure_server, bucket, **SECURE)
        result = run(config, "--json", "doctor")
        assert result.returncode == 0, result.stdout + result.stderr
        checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
        detail = checks["write-settings"]["detail"]
        assert checks["write-settings"]["ok"] is True
        assert f"encryption aws:kms with KMS key {KMS_ARN}, storage class STANDARD_IA" in detail
        assert detail.endswith("; a request expecting another owner was refused")
        assert raw_client(secure_server).list_objects_v2(Bucket=bucket).get("KeyCount") == 0  # cleaned up

    def test_an_object_stored_otherwise_than_asked_fails_the_check(self) -> None:
        """A HeadObject answer with another encryption, key or class is each reported (a server that ignored
        the headers); a bare key id matches the ARN S3 reports, an alias is not compared."""
        settings = BucketSettings(sse="aws:kms", sse_kms_key_id="1234abcd", storage_class="STANDARD_IA")
        assert settings.check_written({}) == [
            "encryption none (asked for aws:kms)",
            "KMS key none (asked for 1234abcd)",
            "storage class STANDARD (asked for STANDARD_IA)",
        ]
        arn = "arn:aws:kms:us-east-1:1:key/1234abcd"
        good = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": arn, "StorageClass": "STANDARD_IA"}
        assert settings.check_written(good) == []
        assert BucketSettings(sse="aws:kms", sse_kms_key_id="alias/ckpt").check_written(good) == []
        assert BucketSettings(storage_class="STANDARD").check_written({}) == []


class TestHints:
    def test_the_kms_hint_is_given_only_on_a_write_with_a_key_set(self) -> None:
        """An unknown access key on a read, or on a write without ``sse_kms_key_id``, is only that."""
        keyed = BucketSettings(sse="aws:kms", sse_kms_key_id="k-1")
        assert "[s3] sse_kms_key_id (k-1)" in keyed.kms_hint(write=True)
        assert keyed.kms_hint(write=False) == ""
        assert BucketSettings(sse="aws:kms").kms_hint(write=True) == ""

    def test_the_owner_doctor_probes_with_is_never_the_expected_one(self) -> None:
        for owner in ("000000000000", "000000000001", OTHER_OWNER):
            assert BucketSettings(expected_bucket_owner=owner).other_owner() != owner


class TestABucketThatRequiresEncryption:
    def test_an_unencrypted_write_is_refused_with_a_message_naming_the_sse_key(
        self, secure_server: str, bucket: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Under the documented deny-unencrypted policy, publish without ``sse`` fails with a message that
        suggests the bucket requires encryption and names ``[s3] sse``; with ``sse`` it succeeds."""
        looker = raw_client(secure_server)
        policy = json.dumps(DENY_UNENCRYPTED).replace("{bucket}", bucket)
        looker.put_bucket_policy(Bucket=bucket, Policy=policy)
        plain, _ = secure_store(secure_server, bucket)
        caplog.set_level(logging.DEBUG)
        with pytest.raises(StorageError) as caught:
            plain.write_file(plain.exec_dir(ATTEMPT), EPOCH_RECORD, b"1\n")
        message = str(caught.value)
        assert "access denied" in message
        assert "the bucket may require server-side encryption: set [s3] sse" in message
        assert SECRET not in message + caplog.text

        encrypted, _ = secure_store(secure_server, bucket, sse="AES256")
        encrypted.write_file(encrypted.exec_dir(ATTEMPT), EPOCH_RECORD, b"1\n")
        head = looker.head_object(Bucket=bucket, Key=f"exec/{ATTEMPT}/{EPOCH_RECORD}")
        assert head["ServerSideEncryption"] == "AES256"

    def test_the_command_line_says_so_in_one_line(
        self, secure_server: str, bucket: str, tmp_path: Path
    ) -> None:
        """``ckpt publish`` as a process: exit 1, one line naming ``[s3] sse``, no secret; with ``sse`` set
        in the file the same publish succeeds."""
        looker = raw_client(secure_server)
        put_save(looker, bucket, f"exec/{ATTEMPT}/checkpoint-100")
        policy = json.dumps(DENY_UNENCRYPTED).replace("{bucket}", bucket)
        looker.put_bucket_policy(Bucket=bucket, Policy=policy)
        args = ("publish", "--epoch", "1", "--step", "100", f"exec/{ATTEMPT}/checkpoint-100")
        refused = run(write_config(tmp_path / "plain.toml", secure_server, bucket), *args)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        errors = [line for line in refused.stderr.splitlines() if line.startswith("ckpt: ")]  # not the logs
        assert len(errors) == 1, refused.stderr
        assert errors[0].startswith("ckpt: cannot publish ")
        assert "the bucket may require server-side encryption: set [s3] sse" in errors[0]
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in refused.stderr
        published = run(write_config(tmp_path / "sse.toml", secure_server, bucket, sse="AES256"), *args)
        assert published.returncode == 0, published.stderr

    def test_stock_moto_cannot_prove_it(self, moto_server: str) -> None:
        """Why the double exists: moto's own server ignores the policy's condition and refuses the encrypted
        put as well (and accepts any expected owner), so it cannot tell ckpt's settings from their absence."""
        looker = raw_client(moto_server)
        name = new_bucket_name()
        looker.create_bucket(Bucket=name)
        looker.put_bucket_policy(Bucket=name, Policy=json.dumps(DENY_UNENCRYPTED).replace("{bucket}", name))
        from botocore.exceptions import ClientError

        with pytest.raises(ClientError):
            looker.put_object(Bucket=name, Key="k", Body=b"", ServerSideEncryption="AES256")
        looker.delete_bucket_policy(Bucket=name)
        looker.put_object(Bucket=name, Key="k", Body=b"", ExpectedBucketOwner=OTHER_OWNER)


class TestConfiguration:
    @pytest.mark.parametrize(
        ("table", "key", "says"),
        [
            ({"sse": "aes256"}, "s3.sse", '"AES256" or "aws:kms"'),
            ({"sse": "aws:kms:dsse"}, "s3.sse", '"AES256" or "aws:kms"'),
            ({"sse": ""}, "s3.sse", "non-empty string"),
            ({"sse": True}, "s3.sse", "non-empty string"),
            ({"sse": "AES256", "sse_kms_key_id": KMS_ARN}, "s3.sse_kms_key_id", 'needs s3.sse = "aws:kms"'),
            ({"sse_kms_key_id": KMS_ARN}, "s3.sse_kms_key_id", 'needs s3.sse = "aws:kms"'),
            ({"sse": "aws:kms", "sse_kms_key_id": "my key"}, "s3.sse_kms_key_id", "without spaces"),
            ({"sse": "aws:kms", "sse_kms_key_id": "k" * 2049}, "s3.sse_kms_key_id", "longer than 2048"),
            ({"expected_bucket_owner": "12345678901"}, "s3.expected_bucket_owner", "12 decimal digits"),
            ({"expected_bucket_owner": "arn:aws:iam::1"}, "s3.expected_bucket_owner", "12 decimal digits"),
            ({"expected_bucket_owner": 123456789012}, "s3.expected_bucket_owner", "quote it"),
            ({"storage_class": "standard_ia"}, "s3.storage_class", "S3 spells it 'STANDARD_IA'"),
            ({"storage_class": "GLACIER"}, "s3.storage_class", "archive class"),
            ({"storage_class": "DEEP_ARCHIVE"}, "s3.storage_class", "archive class"),
            ({"storage_class": "COLD STORE"}, "s3.storage_class", "letters, digits"),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_key(self, table: dict[str, Any], key: str, says: str) -> None:
        with pytest.raises(ConfigError) as caught:
            parse_config({"s3": table})
        assert caught.value.key == key
        assert key in str(caught.value)
        assert says in str(caught.value)

    def test_good_values_are_taken(self) -> None:
        config = parse_config({"s3": {**SECURE}})
        assert BucketSettings.from_s3_settings(config.s3) == BucketSettings(
            "aws:kms", KMS_ARN, DEFAULT_ACCOUNT_ID, "STANDARD_IA"
        )
        for storage_class in ("STANDARD", "GLACIER_IR", "INTELLIGENT_TIERING", "COLD"):  # COLD: an RGW class
            assert parse_config({"s3": {"storage_class": storage_class}}).s3.storage_class == storage_class
        assert parse_config({"s3": {"sse": "aws:kms"}}).s3.sse_kms_key_id is None  # S3's own managed key

    def test_reprs_show_no_secret(self) -> None:
        """The settings are not secret (a key ARN names a key); the credentials never appear beside them."""
        config = parse_config({"s3": {**SECURE}, "credentials": [{"source": "env"}]})
        shown = repr(config) + repr(BucketSettings.from_s3_settings(config.s3))
        assert KMS_ARN in shown
        assert SECRET not in shown


@pytest.fixture(scope="module")
def rgw(rgw_server: RgwServer) -> RgwServer:
    """The session's Ceph RGW 16.2.15 (tests/support/rgw.py: its KMS test backend knows ``KMS_KEY_ID``,
    its default placement has the class ``STORAGE_CLASS``), with this module's signing key registered."""
    rgw_server.add_key(ENV["AWS_ACCESS_KEY_ID"], SECRET)
    return rgw_server


@pytest.fixture
def rgw_bucket(rgw: RgwServer) -> str:
    name = new_bucket_name()
    raw_client(rgw.endpoint).create_bucket(Bucket=name)
    return name


RGW_SECURE = {"sse": "aws:kms", "sse_kms_key_id": RGW_KMS_KEY_ID, "storage_class": RGW_STORAGE_CLASS}


class TestOnCephRgw:
    """The same settings through a real gateway, where it behaves otherwise than S3 (ADR 0028 records it):
    Pacific has SSE-KMS (its testing backend) but no SSE-S3 (``AES256`` is accepted and ignored), only the
    storage classes its placement defines, and no check of ``x-amz-expected-bucket-owner``."""

    def test_every_object_ckpt_writes_comes_back_encrypted_in_its_class(
        self, rgw: RgwServer, rgw_bucket: str
    ) -> None:
        store, wire = secure_store(rgw.endpoint, rgw_bucket, **RGW_SECURE)
        write_every_kind(store, raw_client(rgw.endpoint))
        assert_every_kind_written(wire, sse="aws:kms", key_id=RGW_KMS_KEY_ID, storage_class=RGW_STORAGE_CLASS)
        for operation, headers in wire.sent:
            assert "x-amz-expected-bucket-owner" not in headers, operation
            assert (headers.get("x-amz-server-side-encryption") == "aws:kms") is (operation == "PutObject")

    def test_the_server_ignores_the_expected_owner_and_doctor_says_so(
        self, rgw: RgwServer, rgw_bucket: str, tmp_path: Path
    ) -> None:
        """RGW answers every request kind expecting another owner (S3 refuses each, as the moto tests
        above show); ``ckpt doctor`` finds that out and fails the write-settings check naming the key."""
        put_save(raw_client(rgw.endpoint), rgw_bucket, "exec/1.1.0/checkpoint-1")
        client = make_s3_client(http_settings(rgw.endpoint), environ=ENV)
        for request in every_request_kind(client, rgw_bucket, OTHER_OWNER).values():
            request()  # RGW 16.2.15 does not look at x-amz-expected-bucket-owner
        config = write_config(
            tmp_path / "ckpt.toml", rgw.endpoint, rgw_bucket, expected_bucket_owner=OTHER_OWNER
        )
        result = run(config, "--json", "doctor")
        assert result.returncode == 1, result.stdout + result.stderr
        checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
        assert checks["root"]["ok"] is True
        assert checks["exclusive-create"]["ok"] is True
        assert checks["write-settings"]["ok"] is False
        assert checks["write-settings"]["detail"] == (
            "the server answered a request expecting the owner 000000000000: it does not check [s3] "
            "expected_bucket_owner, which guards nothing there"
        )
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in result.stdout + result.stderr

    def test_doctor_reports_kms_and_the_class_and_an_ignored_aes256(
        self, rgw: RgwServer, rgw_bucket: str, tmp_path: Path
    ) -> None:
        """With aws:kms, the gateway's key and its class the check passes showing what came back; with
        ``AES256`` the write succeeds but the object is stored unencrypted (Pacific has no SSE-S3), and
        the check fails saying so."""
        config = write_config(tmp_path / "kms.toml", rgw.endpoint, rgw_bucket, **RGW_SECURE)
        result = run(config, "--json", "doctor")
        assert result.returncode == 0, result.stdout + result.stderr
        detail = {c["name"]: c for c in json.loads(result.stdout)["checks"]}["write-settings"]["detail"]
        assert detail == (
            f"sse aws:kms, sse_kms_key_id {RGW_KMS_KEY_ID}, storage_class {RGW_STORAGE_CLASS}; the probe "
            f"object came back with encryption aws:kms with KMS key {RGW_KMS_KEY_ID}, storage class "
            f"{RGW_STORAGE_CLASS}"
        )
        config = write_config(tmp_path / "aes.toml", rgw.endpoint, rgw_bucket, sse="AES256")
        result = run(config, "--json", "doctor")
        assert result.returncode == 1, result.stdout + result.stderr
        check = {c["name"]: c for c in json.loads(result.stdout)["checks"]}["write-settings"]
        assert check["ok"] is False
        assert check["detail"] == "the probe object came back with encryption none (asked for AES256)"
        assert raw_client(rgw.endpoint).list_objects_v2(Bucket=rgw_bucket).get("KeyCount") == 0  # cleaned up

    def test_a_class_or_key_the_gateway_lacks_is_refused_on_the_first_write(
        self, rgw: RgwServer, rgw_bucket: str
    ) -> None:
        """An S3 class the placement does not define is ``400 InvalidArgument``; a KMS key the backend does
        not hold is ``403 InvalidAccessKeyId`` (RGW's code, not a bad access key): nothing is written."""
        for settings, says in (
            ({"storage_class": "STANDARD_IA"}, "(InvalidArgument, HTTP 400)"),
            (
                {"sse": "aws:kms", "sse_kms_key_id": "no-such-key"},
                (
                    "S3 does not know the access key id, or the server has no KMS key [s3] "
                    "sse_kms_key_id (no-such-key): Ceph RGW answers so for a key it cannot find "
                    "(InvalidAccessKeyId, HTTP 403)"
                ),
            ),
        ):
            store, _ = secure_store(rgw.endpoint, rgw_bucket, **settings)
            with pytest.raises(CkptError) as caught:
                store.write_file(store.exec_dir(ATTEMPT), EPOCH_RECORD, b"1\n")
            assert says in str(caught.value), settings
            assert SECRET not in str(caught.value)
        assert raw_client(rgw.endpoint).list_objects_v2(Bucket=rgw_bucket).get("KeyCount") == 0

    def test_a_policy_refusing_unencrypted_writes_is_enforced_and_named(
        self, rgw: RgwServer, rgw_bucket: str, tmp_path: Path
    ) -> None:
        """RGW evaluates the documented ``Null`` condition on ``s3:x-amz-server-side-encryption``:
        ``ckpt publish`` without ``sse`` exits 1 with one line naming ``[s3] sse``; with aws:kms it
        publishes, and the entry is stored encrypted."""
        looker = raw_client(rgw.endpoint)
        put_save(looker, rgw_bucket, f"exec/{ATTEMPT}/checkpoint-100")
        looker.put_bucket_policy(
            Bucket=rgw_bucket, Policy=json.dumps(DENY_UNENCRYPTED).replace("{bucket}", rgw_bucket)
        )
        args = ("publish", "--epoch", "1", "--step", "100", f"exec/{ATTEMPT}/checkpoint-100")
        refused = run(write_config(tmp_path / "plain.toml", rgw.endpoint, rgw_bucket), *args)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        errors = [line for line in refused.stderr.splitlines() if line.startswith("ckpt: ")]
        assert len(errors) == 1, refused.stderr
        assert errors[0].startswith("ckpt: cannot publish ")
        assert "(AccessDenied, HTTP 403)" in errors[0]
        assert "the bucket may require server-side encryption: set [s3] sse" in errors[0]
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in refused.stderr
        published = run(write_config(tmp_path / "kms.toml", rgw.endpoint, rgw_bucket, **RGW_SECURE), *args)
        assert published.returncode == 0, published.stderr
        (entry,) = [o["Key"] for o in looker.list_objects_v2(Bucket=rgw_bucket, Prefix="pub/")["Contents"]]
        head = looker.head_object(Bucket=rgw_bucket, Key=entry)
        assert (head.get("ServerSideEncryption"), head.get("SSEKMSKeyId")) == ("aws:kms", RGW_KMS_KEY_ID)

    def test_a_string_not_equals_policy_lets_a_write_without_the_header_through_on_rgw(
        self, rgw: RgwServer, rgw_bucket: str, secure_server: str, bucket: str
    ) -> None:
        """``StringNotEquals s3:x-amz-server-side-encryption aws:kms`` alone: S3 (and the moto wrapper)
        refuse a put without the header, RGW 16.2.15 lets it through (a missing key does not match); both
        refuse ``AES256`` and take ``aws:kms``. Such a bucket needs the ``Null`` statement too on RGW."""
        from botocore.exceptions import ClientError

        kms = {"moto": KMS_ARN, "rgw": RGW_KMS_KEY_ID}
        plain_refused = {"moto": True, "rgw": False}
        for server, endpoint, name in (("moto", secure_server, bucket), ("rgw", rgw.endpoint, rgw_bucket)):
            looker = raw_client(endpoint)
            statement = {**DENY_UNENCRYPTED["Statement"][0]}  # type: ignore[index]
            statement["Condition"] = {"StringNotEquals": {"s3:x-amz-server-side-encryption": "aws:kms"}}
            statement["Resource"] = f"arn:aws:s3:::{name}/*"
            looker.put_bucket_policy(
                Bucket=name, Policy=json.dumps({**DENY_UNENCRYPTED, "Statement": [statement]})
            )
            for extra, refused in (
                ({}, plain_refused[server]),
                ({"ServerSideEncryption": "AES256"}, True),
                ({"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": kms[server]}, False),
            ):
                if not refused:
                    looker.put_object(Bucket=name, Key="k", Body=b"", **extra)
                    continue
                with pytest.raises(ClientError) as caught:
                    looker.put_object(Bucket=name, Key="k", Body=b"", **extra)
                assert caught.value.response["Error"]["Code"] == "AccessDenied", (server, extra)
