"""Credentials a platform team brings: a ``Source`` built in code, and a source kind a plugin registers.

The plugin is ``tests/plugins/ckpt_example_source``, installed into the test environment by ``.ci/run`` and
``dev.py`` (a real package with a real ``ckpt.credential_sources`` entry point), and signs against moto's
server over HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import boto3
import pytest

import ckpt
from ckpt.config import load_config
from ckpt.creds import Chain, Credentials, EnvSource, Source, SourceSettings
from ckpt.domain.errors import ConfigError, InvalidError
from support.s3 import http_settings, new_bucket_name

KEY_ID = "AKIDPLATFORM"
SECRET = "platform-secret-never-shown"


class PlatformSource:
    """A team's own secret service, as a ``ckpt.creds.Source``: counts its fetches."""

    def __init__(self, name: str = "platform-secrets") -> None:
        self._name = name
        self.fetches = 0
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    def fetch(self) -> Credentials | None:
        with self._lock:
            self.fetches += 1
        return Credentials(KEY_ID, SECRET, source=self._name)


@pytest.fixture
def bucket(moto_server: str) -> str:
    client = boto3.client(
        "s3", endpoint_url=moto_server, region_name="us-east-1",
        aws_access_key_id="x", aws_secret_access_key="y",
    )  # fmt: skip
    name = new_bucket_name()
    client.create_bucket(Bucket=name)
    return name


def signatures(store: Any) -> list[str]:
    """Start recording the ``Authorization`` header of every request ``store`` sends; return the list."""
    seen: list[str] = []

    def record(request: Any, **_: Any) -> None:
        header = request.headers.get("Authorization")
        seen.append(header.decode() if isinstance(header, bytes) else str(header))

    store._bucket.client.meta.events.register_first("before-send.s3", record)
    return seen


class TestOpenStoreWithCredentials:
    def test_a_source_from_code_signs_every_request(self, moto_server: str, bucket: str) -> None:
        """``open_store(root, credentials=source)`` signs with that source, not the configuration's chain."""
        source = PlatformSource()
        # The configuration names the env source, whose variables are unset here: unused, or this would fail.
        config = http_settings(moto_server)
        store = ckpt.open_store(f"s3://{bucket}/run", config=config, environ={}, credentials=source)
        sent = signatures(store)
        save = f"s3://{bucket}/run/exec/a/checkpoint-1"
        store._bucket.client.put_object(Bucket=bucket, Key="run/exec/a/checkpoint-1/model", Body=b"w")
        entry = store.publish(1, 1, save)
        assert store.resolve() == entry
        assert source.fetches >= 1
        assert sent
        assert all(f"Credential={KEY_ID}/" in header for header in sent), sent
        assert store.connection.credentials_source == "platform-secrets"  # type: ignore[attr-defined]

    def test_a_chain_from_code_asks_its_sources_in_order(self, moto_server: str, bucket: str) -> None:
        """A ``Chain`` is a ``Source``: its first source that has keys signs (here after an absent one)."""
        absent = EnvSource(environ={})
        source = PlatformSource("vault-of-the-team")
        store = ckpt.open_store(
            f"s3://{bucket}",
            config=http_settings(moto_server),
            environ={},
            credentials=Chain([absent, source]),
        )
        assert store.entries() == []
        assert store.connection.credentials_source == "vault-of-the-team"  # type: ignore[attr-defined]

    def test_something_that_is_not_a_source_is_refused(self, tmp_path: Path) -> None:
        """``credentials`` must be a ``Source``; anything else is ``InvalidError`` naming its type."""
        with pytest.raises(InvalidError, match=r"credentials must be a ckpt\.creds\.Source.*got a dict"):
            ckpt.open_store(str(tmp_path), credentials={"access_key_id": KEY_ID})  # type: ignore[arg-type]

    def test_a_posix_root_signs_nothing(self, tmp_path: Path) -> None:
        """A POSIX root takes a source and never asks it."""
        source = PlatformSource()
        store = ckpt.open_store(str(tmp_path), credentials=source)
        assert store.entries() == []
        assert source.fetches == 0

    def test_the_built_in_sources_are_sources(self) -> None:
        """What ``open_store`` accepts is the documented protocol; the built-in chain satisfies it."""
        assert isinstance(Chain([EnvSource(environ={})]), Source)
        assert isinstance(PlatformSource(), Source)


# -- the installed plugin -----------------------------------------------------------------------------------


def write_document(path: Path) -> Path:
    path.write_text(json.dumps({"key_id": KEY_ID, "secret": SECRET}))
    return path


def plugin_config(tmp_path: Path, endpoint: str, root: str, table: str) -> Path:
    config = tmp_path / "ckpt.toml"
    config.write_text(
        f'root = "{root}"\n[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\n'
        'addressing_style = "path"\nconnect_timeout = 2\nread_timeout = 10\nmax_attempts = 2\n'
        f"[[credentials]]\n{table}\n"
    )
    return config


def run_ckpt(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "ckpt", "--config", str(config), *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


class TestPluginSource:
    def test_the_plugin_is_installed(self) -> None:
        """The example plugin's entry point is installed in this environment (a real package)."""
        from importlib import metadata

        names = [e.name for e in metadata.entry_points(group=ckpt.creds.ENTRY_POINT_GROUP)]
        assert "json-document" in names

    def test_a_plugin_kind_signs_through_the_cli(self, tmp_path: Path, moto_server: str, bucket: str) -> None:
        """``source = "json-document"`` builds the plugin's source: publish works and doctor names it."""
        document = write_document(tmp_path / "s3.json")
        config = plugin_config(
            tmp_path, moto_server, f"s3://{bucket}/run",
            f'source = "json-document"\npath = "{document}"\nrequired = true',
        )  # fmt: skip
        arranging = boto3.client(
            "s3", endpoint_url=moto_server, region_name="us-east-1",
            aws_access_key_id="x", aws_secret_access_key="y",
        )  # fmt: skip
        arranging.put_object(Bucket=bucket, Key="run/exec/a/checkpoint-7/model", Body=b"w")
        published = run_ckpt(config, "publish", "--epoch", "3", "--step", "7", "exec/a/checkpoint-7")
        assert published.returncode == 0, published.stderr
        assert "credentials from json-document (access key id AKIDPLATFORM)" in published.stderr
        doctor = run_ckpt(config, "--json", "doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert checks["credentials"] == {
            "name": "credentials",
            "ok": True,
            "detail": "signed with credentials from source 'json-document'",
        }
        assert SECRET not in doctor.stdout + doctor.stderr + published.stderr

    def test_a_plugin_in_code_config(self, tmp_path: Path, moto_server: str, bucket: str) -> None:
        """A configuration read in-process uses the plugin too; the keys are those of the document."""
        document = write_document(tmp_path / "s3.json")
        config_file = plugin_config(
            tmp_path, moto_server, f"s3://{bucket}", f'source = "json-document"\npath = "{document}"'
        )
        config = load_config(str(config_file))
        store = ckpt.open_store(f"s3://{bucket}", config=config, environ={})
        sent = signatures(store)
        assert store.entries() == []
        assert sent
        assert all(f"Credential={KEY_ID}/" in header for header in sent), sent

    def test_the_plugin_validates_its_own_keys(self, tmp_path: Path) -> None:
        """A key the plugin does not know is a usage error (exit 2) naming the full key; nothing is sent."""
        config = plugin_config(
            tmp_path,
            "http://127.0.0.1:9",
            "s3://bucket",
            'source = "json-document"\npath = "/x"\ncolour = "red"',
        )
        result = run_ckpt(config, "resolve")
        assert result.returncode == 2, result.stderr
        assert "unknown key 'credentials[0].colour' for source 'json-document'" in result.stderr
        with pytest.raises(ConfigError) as caught:
            load_config(str(config))
        assert caught.value.key == "credentials[0].colour"

    def test_an_unknown_kind_lists_the_installed_ones(self, tmp_path: Path) -> None:
        """A kind no package registers is a ``ConfigError`` listing the built-in and the installed kinds."""
        config = plugin_config(tmp_path, "http://127.0.0.1:9", "s3://bucket", 'source = "nope"')
        with pytest.raises(ConfigError, match=r"credentials\[0\]\.source must be one of env, file, vault, "
                           r"aws-default, json-document, got 'nope'"):  # fmt: skip
            load_config(str(config))

    def test_settings_handed_to_a_plugin_never_show_the_table(self) -> None:
        """``SourceSettings`` may hold secrets from the table: its repr leaves the table out."""
        settings = SourceSettings("json-document", "json-document", {"token": SECRET}, "credentials[0]", {})
        assert SECRET not in repr(settings)
        assert settings.key("token") == "credentials[0].token"
