"""Signatures and credentials on a server that checks them: Ceph RGW (``rgw_server``, tests/support/rgw.py).

moto accepts any signature, so these hold only here:

* a wrong secret and an unknown access key fail the real ``ckpt`` command with a ``CredentialsError``
  (exit 1) that names the code and the credential source, with no traceback and no secret in the output;
* a key rotated on the server (the new key added and written to the ``file`` source's folder, or to the
  Vault secret the ``vault`` source reads from the project's fake Vault; the old one removed with
  ``radosgw-admin``) is picked up by the client's forced refresh (credentials.md §7.4), without a new
  client: the publish that meets the rotation completes, once; a prune whose key is revoked between two of
  its requests completes with exactly the outcome of an undisturbed prune;
* a request signed with a clock 20 minutes behind is reported as clock skew.
"""

from __future__ import annotations

import datetime
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import botocore.auth
import pytest

from ckpt.adapters.s3 import S3Store, make_s3_client
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CredentialsError, StorageError
from support.fake_vault import FakeVault
from support.rgw import RgwServer
from support.s3 import http_settings, new_bucket_name, only_loopback, raw_client
from support.saves import put_save

WRONG_SECRET = "wrong-SECRET-never-printed-5e1f"
UNKNOWN_KEY = "AKIDNOBODYREGISTERED"
UNKNOWN_SECRET = "unknown-SECRET-never-printed-77aa"


@pytest.fixture
def bucket(rgw_server: RgwServer) -> str:
    name = new_bucket_name()
    raw_client(rgw_server.endpoint).create_bucket(Bucket=name)
    return name


def write_keys(folder: Path, access_key: str, secret_key: str) -> None:
    """Write the ``file`` source's two key files, private, each replaced whole (a rename)."""
    folder.mkdir(exist_ok=True)
    for name, value in (("access_key_id", access_key), ("secret_access_key", secret_key)):
        staged = folder / f".{name}.new"
        staged.write_text(value + "\n")
        staged.chmod(0o600)
        staged.replace(folder / name)


def store_on_file_keys(
    rgw_server: RgwServer, bucket: str, keys: Path, key: tuple[str, str]
) -> tuple[S3Store, Any]:
    """Register ``key`` on the gateway, write it to the ``file`` source's folder ``keys``, and return a store
    on ``bucket`` and its client, which signs with that source."""
    rgw_server.add_key(*key)
    write_keys(keys, *key)
    config = http_settings(rgw_server.endpoint, credentials=({"source": "file", "dir": str(keys)},))
    client = only_loopback(make_s3_client(config, {}))
    return S3Store(f"s3://{bucket}", client), client


def refreshes(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The forced credential refreshes ckpt logged."""
    return [r.getMessage() for r in caplog.records if "refreshing the credentials" in r.getMessage()]


def ckpt_command(
    tmp_path: Path, endpoint: str, root: str, source: str, env: dict[str, str], *args: str
) -> Any:
    """Run ``ckpt --config <file> ARGS`` with one credential source table (``source`` is its TOML body)."""
    config = tmp_path / "ckpt.toml"
    config.write_text(
        f'root = "{root}"\n[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\n'
        'addressing_style = "path"\n'
        f"connect_timeout = 2\nread_timeout = 10\nmax_attempts = 2\n[[credentials]]\n{source}\n"
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        clean.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "ckpt", "--config", str(config), *args],
        capture_output=True, text=True, env={**clean, **env}, timeout=120, check=False,
    )  # fmt: skip


class TestRefusedKeys:
    def test_a_wrong_secret_is_a_credentials_error_naming_the_file_source(
        self, rgw_server: RgwServer, bucket: str, tmp_path: Path
    ) -> None:
        """A registered key with the wrong secret: SignatureDoesNotMatch, exit 1, the source 'file' named."""
        keys = tmp_path / "keys"
        write_keys(keys, rgw_server.access_key, WRONG_SECRET)
        result = ckpt_command(
            tmp_path, rgw_server.endpoint, f"s3://{bucket}", f'source = "file"\ndir = "{keys}"', {}, "entries"
        )
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert "SignatureDoesNotMatch, HTTP 403" in result.stderr, output
        assert "the keys came from the credential source 'file'" in result.stderr, output
        assert "Traceback" not in output
        assert WRONG_SECRET not in output

    def test_an_unknown_access_key_is_a_credentials_error_naming_the_env_source(
        self, rgw_server: RgwServer, bucket: str, tmp_path: Path
    ) -> None:
        """An access key the server never issued: InvalidAccessKeyId, exit 1, the source 'env' named."""
        env = {"AWS_ACCESS_KEY_ID": UNKNOWN_KEY, "AWS_SECRET_ACCESS_KEY": UNKNOWN_SECRET}
        root = f"s3://{bucket}"
        result = ckpt_command(tmp_path, rgw_server.endpoint, root, 'source = "env"', env, "resolve")
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert "S3 does not know the access key id (InvalidAccessKeyId, HTTP 403)" in result.stderr, output
        assert "the keys came from the credential source 'env'" in result.stderr, output
        assert "Traceback" not in output
        assert UNKNOWN_SECRET not in output

    def test_the_error_raised_in_python_carries_the_source(self, rgw_server: RgwServer, bucket: str) -> None:
        """The same refusal through the library: ``CredentialsError.source`` is the source's name."""
        config = http_settings(rgw_server.endpoint)
        environ = {"AWS_ACCESS_KEY_ID": UNKNOWN_KEY, "AWS_SECRET_ACCESS_KEY": UNKNOWN_SECRET}
        client = only_loopback(make_s3_client(config, environ))
        with pytest.raises(CredentialsError) as caught:
            S3Store(f"s3://{bucket}", client).entries()
        assert caught.value.source == "env"
        assert UNKNOWN_SECRET not in str(caught.value) + repr(caught.value)


# What each rotation test publishes: one entry with the old key, one after the rotation.
ROTATED = [Entry(1, 100, "exec/a/checkpoint-100"), Entry(1, 200, "exec/a/checkpoint-200")]


class TestRotation:
    def test_a_key_rotated_on_the_server_is_picked_up_without_a_new_client(
        self, rgw_server: RgwServer, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Old key removed on the server, new key in the secret folder: the next publish refreshes and
        completes, exactly once; the old key is refused from then on."""
        old, new = ("AKIDROTATEOLD", "rotate-old-SECRET-1"), ("AKIDROTATENEW", "rotate-new-SECRET-2")
        keys = tmp_path / "keys"
        store, _client = store_on_file_keys(rgw_server, bucket, keys, old)
        arrange = raw_client(rgw_server.endpoint)
        for step in (100, 200):
            put_save(arrange, bucket, f"exec/a/checkpoint-{step}")
        first = store.publish(1, 100, f"s3://{bucket}/exec/a/checkpoint-100")

        rgw_server.add_key(*new)
        write_keys(keys, *new)
        rgw_server.remove_key(old[0])
        with caplog.at_level(logging.WARNING, logger="ckpt"):
            second = store.publish(1, 200, f"s3://{bucket}/exec/a/checkpoint-200")  # the same client
        logged = refreshes(caplog)
        assert len(logged) == 1, logged  # the first request the old key signed; one refresh, one retry
        assert logged[0].startswith("S3 answered InvalidAccessKeyId to ")
        assert new[1] not in caplog.text
        assert old[1] not in caplog.text

        assert store.entries() == [first, second] == ROTATED
        stale = only_loopback(
            make_s3_client(
                http_settings(rgw_server.endpoint),
                {"AWS_ACCESS_KEY_ID": old[0], "AWS_SECRET_ACCESS_KEY": old[1]},
            )
        )
        with pytest.raises(CredentialsError, match="InvalidAccessKeyId"):
            S3Store(f"s3://{bucket}", stale).entries()

    def test_a_key_rotated_in_vault_is_picked_up_without_a_new_client(
        self, rgw_server: RgwServer, bucket: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The same rotation with the keys in Vault (AppRole login, a KV v2 secret): the refused request
        makes the chain read the secret's new version, and the publish completes once."""
        old, new = ("AKIDVAULTOLD", "vault-old-SECRET-3"), ("AKIDVAULTNEW", "vault-new-SECRET-4")
        rgw_server.add_key(*old)
        secret_id = "ckpt-secret-id-never-shown"
        with FakeVault() as vault:
            vault.allow_approle("ckpt-role", secret_id)
            vault.put_secret("s3/ckpt", {"access_key_id": old[0], "secret_access_key": old[1]})
            source = {
                "source": "vault", "address": vault.url, "allow_insecure_http": True, "path": "s3/ckpt",
                "auth": {"method": "approle", "role_id": "ckpt-role", "secret_id": secret_id},
            }  # fmt: skip
            config = http_settings(rgw_server.endpoint, credentials=(source,))
            client = only_loopback(make_s3_client(config, {}))
            store = S3Store(f"s3://{bucket}", client)
            arrange = raw_client(rgw_server.endpoint)
            for step in (100, 200):
                put_save(arrange, bucket, f"exec/a/checkpoint-{step}")
            first = store.publish(1, 100, f"s3://{bucket}/exec/a/checkpoint-100")
            reads_before = len(vault.calls("/secret/data/s3/ckpt"))

            rgw_server.add_key(*new)
            vault.put_secret("s3/ckpt", {"access_key_id": new[0], "secret_access_key": new[1]})
            rgw_server.remove_key(old[0])
            with caplog.at_level(logging.WARNING, logger="ckpt"):
                second = store.publish(1, 200, f"s3://{bucket}/exec/a/checkpoint-200")
            assert len(vault.calls("/secret/data/s3/ckpt")) == reads_before + 1  # one refresh, one read
        assert len(refreshes(caplog)) == 1, refreshes(caplog)
        for secret in (old[1], new[1], secret_id):
            assert secret not in caplog.text
        assert store.entries() == [first, second] == ROTATED

    def test_a_prune_whose_key_is_revoked_between_its_requests_completes_as_undisturbed(
        self, rgw_server: RgwServer, bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The key is rotated on the server after the prune's first request and before its second (that
        request is already signed with the old key, so RGW refuses it): the refresh takes the new key from
        the file source and the prune goes on; the log, the folders and the journals end as a prune that met
        no rotation leaves them: the two newest kept, the rest gone, no journal."""
        old, new = ("AKIDPRUNEOLD", "prune-old-SECRET-5"), ("AKIDPRUNENEW", "prune-new-SECRET-6")
        keys = tmp_path / "keys"
        store, client = store_on_file_keys(rgw_server, bucket, keys, old)
        arrange = raw_client(rgw_server.endpoint)
        saves = [f"exec/a/checkpoint-{step}" for step in (100, 200, 300, 400)]
        for step, save in zip((100, 200, 300, 400), saves, strict=True):
            put_save(arrange, bucket, save)
            store.publish(1, step, f"s3://{bucket}/{save}")

        sent: list[str] = []

        def rotate_before_the_second_request(request: Any, **_: Any) -> None:
            sent.append(f"{request.method} {request.url}")
            if len(sent) == 2:  # signed with the old key already: the server refuses it once rotated
                rgw_server.add_key(*new)
                write_keys(keys, *new)
                rgw_server.remove_key(old[0])

        events = client.meta.events
        events.register_last("before-send", rotate_before_the_second_request)
        with caplog.at_level(logging.WARNING, logger="ckpt"):
            store.prune(2)
        events.unregister("before-send", rotate_before_the_second_request)

        assert len(sent) > 2, sent  # the rotation happened inside the prune
        logged = refreshes(caplog)
        assert len(logged) == 1, logged  # the second request was refused once, then went on
        assert logged[0].startswith("S3 answered InvalidAccessKeyId to ")
        assert store.entries() == [Entry(1, 300, saves[2]), Entry(1, 400, saves[3])]
        left = {item["Key"] for item in arrange.list_objects_v2(Bucket=bucket).get("Contents", ())}
        assert not any(key.startswith((f"{saves[0]}/", f"{saves[1]}/")) for key in left), sorted(left)
        assert all(any(key.startswith(f"{save}/") for key in left) for save in saves[2:]), sorted(left)
        assert not any(".ckpt-prune-" in key for key in left), sorted(left)


class TestClockSkew:
    def test_a_clock_twenty_minutes_behind_is_reported_as_clock_skew(
        self, rgw_server: RgwServer, bucket: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """botocore's signer reads the time through ``botocore.auth.get_current_datetime``: 20 minutes behind,
        RGW answers ``RequestTimeTooSkewed``, which ckpt reports as clock skew (a StorageError)."""
        client = only_loopback(
            make_s3_client(
                http_settings(rgw_server.endpoint, max_attempts=1),
                {"AWS_ACCESS_KEY_ID": rgw_server.access_key, "AWS_SECRET_ACCESS_KEY": rgw_server.secret_key},
            )
        )
        store = S3Store(f"s3://{bucket}", client)
        assert store.entries() == []  # the right clock signs fine
        behind = datetime.timedelta(minutes=20)
        real_now = botocore.auth.get_current_datetime
        monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: real_now(*a, **k) - behind)
        with pytest.raises(StorageError) as caught:
            store.entries()
        assert not isinstance(caught.value, CredentialsError)
        message = str(caught.value)
        assert "clock skew: this machine's clock is too far from the server's" in message
        assert "(RequestTimeTooSkewed, HTTP 403)" in message
