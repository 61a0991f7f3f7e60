"""Qualifying an S3 server a site runs: the exclusive-create probes on ``external_s3`` (docs/s3-servers.md).

``external_s3`` is the server ``CKPT_TEST_S3_ENDPOINT``/``_BUCKET``/``_KEY``/``_SECRET`` name, or, without
them, the session's Ceph RGW reached through the same code (one shared bucket, a fresh prefix per test, the
given keys): so this runs in CI too. The store contract runs there as harness ``s3-external`` when the
variables are set. What is probed is what ``ckpt`` relies on:

* ``ckpt doctor``'s probe (eight concurrent creates of one new key) passes: one wins, seven are refused;
* 16 threads publishing the same entry through one store: exactly one creates it, 15 get ``ExistsError``,
  over 5 rounds;
* the variables are checked: incomplete ones, or a host off this machine under CI, are refused by name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from ckpt.adapters.s3 import S3Store
from ckpt.domain.errors import ExistsError
from support.external_s3 import (
    ExternalS3,
    ExternalS3Error,
    allow_endpoint,
    delete_prefix,
    from_environ,
    new_prefix,
)
from support.saves import put_save

THREADS, ROUNDS = 16, 5
SECRET = "external-SECRET-never-shown"


class Outcomes:
    """What each racing thread saw, collected under a lock."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self._lock = threading.Lock()

    def add(self, outcome: str) -> None:
        with self._lock:
            self.seen.append(outcome)


def publish_once(store: S3Store, step: int, save: str, start: threading.Barrier, outcomes: Outcomes) -> None:
    """Wait for the others, publish (1, step, save) once, and record the outcome (never raise)."""
    start.wait()
    try:
        store.publish(1, step, save)
        outcomes.add("created")
    except ExistsError:
        outcomes.add("exists")
    except Exception as exc:
        outcomes.add(f"{type(exc).__name__}: {exc}")


@pytest.fixture
def prefix(external_s3: ExternalS3) -> Iterator[str]:
    prefix = new_prefix()
    yield prefix
    delete_prefix(allow_endpoint(external_s3.client(), external_s3.endpoint), external_s3.bucket, prefix)


def test_the_doctor_probe_passes(external_s3: ExternalS3, prefix: str, tmp_path: Path) -> None:
    """``ckpt --json doctor`` on ``s3://<bucket>/<prefix>``: 8 concurrent creates, 1 created, 7 refused."""
    target = external_s3
    config = tmp_path / "ckpt.toml"
    config.write_text(
        f'root = "s3://{target.bucket}/{prefix}"\n[s3]\nendpoint_url = "{target.endpoint}"\n'
        f'region = "{target.region}"\naddressing_style = "path"\nconnect_timeout = 5\nread_timeout = 30\n'
        '[[credentials]]\nsource = "env"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "ckpt", "--config", str(config), "--json", "doctor"],
        capture_output=True, text=True, env={**env, **target.environ}, timeout=120, check=False,
    )  # fmt: skip
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    check = checks["exclusive-create"]
    assert result.returncode == 0, result.stdout + result.stderr
    assert (check["ok"], check["writers"], check["created"], check["refused"]) == (True, 8, 1, 7)
    assert target.secret_key not in result.stdout + result.stderr


def test_racing_publishers_make_exactly_one_winner(external_s3: ExternalS3, prefix: str) -> None:
    """16 threads publish the same (epoch, step, save) at once, 5 times: one creation a round, 15 refusals."""
    client = allow_endpoint(external_s3.client(), external_s3.endpoint)
    root = f"s3://{external_s3.bucket}/{prefix}"
    store = S3Store(root, client)
    put_save(client, external_s3.bucket, f"{prefix}/exec/race/ck")
    for step in range(ROUNDS):
        start, outcomes = threading.Barrier(THREADS), Outcomes()
        threads = [
            threading.Thread(target=publish_once, args=(store, step, f"{root}/exec/race/ck", start, outcomes))
            for _ in range(THREADS)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert sorted(outcomes.seen) == ["created"] + ["exists"] * (THREADS - 1), (step, outcomes.seen)
    assert [entry.step for entry in store.entries()] == list(range(ROUNDS))


class TestTheVariables:
    FULL: ClassVar[dict[str, str]] = {
        "CKPT_TEST_S3_ENDPOINT": "http://127.0.0.1:9000",
        "CKPT_TEST_S3_BUCKET": "qualify",
        "CKPT_TEST_S3_KEY": "AKIDSITE",
        "CKPT_TEST_S3_SECRET": SECRET,
    }

    def test_unset_means_none_and_a_full_set_is_read(self) -> None:
        assert from_environ({}, ci=True) is None
        target = from_environ(self.FULL, ci=True)
        assert target == ExternalS3("http://127.0.0.1:9000", "qualify", "AKIDSITE", SECRET, "us-east-1")
        assert SECRET not in repr(target)

    def test_an_incomplete_set_names_what_is_missing(self) -> None:
        partial = {k: v for k, v in self.FULL.items() if k != "CKPT_TEST_S3_SECRET"}
        with pytest.raises(ExternalS3Error, match="CKPT_TEST_S3_SECRET is not"):
            from_environ(partial, ci=False)

    @pytest.mark.parametrize("endpoint", ["ftp://127.0.0.1", "http://h:99999", "127.0.0.1:9000"])
    def test_a_bad_endpoint_is_refused_by_name(self, endpoint: str) -> None:
        with pytest.raises(ExternalS3Error, match="CKPT_TEST_S3_ENDPOINT"):
            from_environ({**self.FULL, "CKPT_TEST_S3_ENDPOINT": endpoint}, ci=False)

    def test_a_remote_host_is_allowed_to_an_operator_and_refused_in_ci(self) -> None:
        remote = {**self.FULL, "CKPT_TEST_S3_ENDPOINT": "https://minio.site.example:9000"}
        assert from_environ(remote, ci=False) is not None
        with pytest.raises(ExternalS3Error, match="not on this machine"):
            from_environ(remote, ci=True)
