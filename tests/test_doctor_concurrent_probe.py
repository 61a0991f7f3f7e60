"""``ckpt doctor``'s exclusive-create probe: eight concurrent creates of one new key, exactly one winner.

Storages in their own processes, seen by the real ``ckpt`` command:

- ``support.racy_moto_server``: a conditional put waits between its check and its write until a second one
  passed the check too, so two concurrent creates deterministically both win: doctor must fail;
- ``s3_server``, each in turn: ``support.atomic_moto_server`` (S3's contract) and Ceph RGW: doctor must pass;
- each of them behind the forward proxy that strips ``If-None-Match``: doctor must fail (on moto every
  create wins; RGW refuses the request whose signed header was removed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest

from ckpt.domain.exclusive_probe import judge_exclusive_creates
from support.forward_proxy import ForwardProxy, Match, StripRequestHeader
from support.s3 import new_bucket_name, serve_moto

TESTS = Path(__file__).parent
KEYS = {"AWS_ACCESS_KEY_ID": "probe-test-key", "AWS_SECRET_ACCESS_KEY": "probe-test-secret"}


@pytest.fixture(scope="module")
def racy_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("racy-moto") / "server.log"
    with serve_moto(log, module="support.racy_moto_server", cwd=str(TESTS)) as endpoint:
        yield endpoint


def new_bucket(endpoint: str) -> tuple[Any, str]:
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="x", aws_secret_access_key="y",
    )  # fmt: skip
    name = new_bucket_name()
    client.create_bucket(Bucket=name)
    return client, name


def doctor(tmp_path: Path, root: str, endpoint: str, proxy: str | None = None) -> tuple[int, dict[str, Any]]:
    """Run ``ckpt --json doctor`` on ``root``; return the exit code and the exclusive-create check."""
    config = tmp_path / "ckpt.toml"
    text = (
        f'root = "{root}"\n[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\n'
        'addressing_style = "path"\nconnect_timeout = 2\nread_timeout = 20\nmax_attempts = 2\n'
    )
    if proxy is not None:
        text += f'[proxy]\nhttp_proxy = "{proxy}"\n'
    config.write_text(text + '[[credentials]]\nsource = "env"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    env.update(KEYS)
    result = subprocess.run(
        [sys.executable, "-m", "ckpt", "--config", str(config), "--json", "doctor"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["root"]["ok"] is True, result.stdout + result.stderr
    return result.returncode, checks["exclusive-create"]


def probe_objects(client: Any, bucket: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix="run/.ckpt-doctor/")
    return [item["Key"] for item in listed.get("Contents", [])]


class TestVerdict:
    def test_one_winner_is_honoured(self) -> None:
        """Exactly one success and the rest refused as existing: honoured, with the numbers."""
        verdict = judge_exclusive_creates(["exists", "created", "exists", "exists"], "creates")
        assert (verdict.honoured, verdict.writers, verdict.created, verdict.refused) == (True, 4, 1, 3)

    @pytest.mark.parametrize(
        ("outcomes", "says"),
        [
            (["created", "created", "exists"], "2 of 3 concurrent creates of one new name succeeded"),
            (["created"] * 3, "all 3 concurrent creates of one new name succeeded: the storage (or a proxy"),
            (["exists"] * 3, "none of 3 concurrent creates"),
            (["unsupported", "created", "exists"], "does not implement"),
        ],
    )
    def test_anything_else_is_not(self, outcomes: list[Any], says: str) -> None:
        """Two winners, no winner, or a refused condition: not honoured, and the detail says which."""
        verdict = judge_exclusive_creates(outcomes, "creates")
        assert verdict.honoured is False
        assert says in verdict.detail


class TestDoctorProbe:
    def test_a_server_letting_two_concurrent_creates_win_fails(self, racy_moto: str, tmp_path: Path) -> None:
        """Check-then-write with a pause in between: several of the eight creates win, doctor exits 1."""
        client, bucket = new_bucket(racy_moto)
        code, check = doctor(tmp_path, f"s3://{bucket}/run", racy_moto)
        assert code == 1
        assert check["ok"] is False
        assert check["writers"] == 8
        assert check["created"] >= 2
        assert check["created"] + check["refused"] == 8
        # How many of the eight passed the check before the first write depends on timing; at least two did.
        assert "two publishers could both believe they published the same entry" in check["detail"]
        assert probe_objects(client, bucket) == []

    def test_an_atomic_server_passes(self, s3_server: str, tmp_path: Path) -> None:
        """S3's contract: one create of the eight wins, seven get 412, and the probe leaves nothing.

        On the atomic moto server and on Ceph RGW, whose exclusive create is its own."""
        client, bucket = new_bucket(s3_server)
        code, check = doctor(tmp_path, f"s3://{bucket}/run", s3_server)
        assert code == 0, check
        assert (check["ok"], check["writers"], check["created"], check["refused"]) == (True, 8, 1, 7)
        assert probe_objects(client, bucket) == []

    def test_a_proxy_stripping_the_condition_fails(
        self, s3_server: str, s3_server_kind: str, tmp_path: Path
    ) -> None:
        """Through a proxy that drops If-None-Match doctor fails on every server, for the server's reason.

        moto checks no signature, so every create wins, even on the atomic server. botocore signs
        ``if-none-match``, so a server that checks signatures (Ceph RGW, as AWS) refuses each stripped PUT
        with 403 ``SignatureDoesNotMatch``: the probe cannot run, and the detail says the request was
        changed on the way or the secret is wrong."""
        client, bucket = new_bucket(s3_server)
        port = urlsplit(s3_server).port
        assert port is not None
        strip = StripRequestHeader("If-None-Match", when=Match(method="PUT"))
        with ForwardProxy(resolve={"unresolvable-s3": ("127.0.0.1", port)}, rules=[strip]) as proxy:
            code, check = doctor(tmp_path, f"s3://{bucket}/run", f"http://unresolvable-s3:{port}", proxy.url)
        assert code == 1
        assert check["ok"] is False
        if s3_server_kind == "moto":  # the server ignores signatures: every create won
            assert (check["writers"], check["created"], check["refused"]) == (8, 8, 0)
        else:
            assert "SignatureDoesNotMatch, HTTP 403" in check["detail"], check
            assert "changed the signed request" in check["detail"], check
        assert probe_objects(client, bucket) == []
