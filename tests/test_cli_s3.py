"""The command line on an ``s3://`` root, end to end: a config file, an S3 server over HTTP, real processes.

Every command runs on moto's server and on Ceph RGW (``s3_server``); the proxy double runs on moto.

Every command of spec/cli.md runs against the bucket; ``doctor`` reports the credential source and the
proxy, and
fails when a proxy in the way strips ``If-None-Match`` (a server that ignores the condition would silently
overwrite entries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest

from support.forward_proxy import ForwardProxy, Match, StripRequestHeader
from support.s3 import new_bucket_name

KEYS = {"AWS_ACCESS_KEY_ID": "cli-test-key", "AWS_SECRET_ACCESS_KEY": "cli-test-secret-value"}
PROXY_PASSWORD = "proxy-pass-never-printed"


def run(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    env.update(KEYS)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "ckpt", "--config", str(config), *args],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip


def write_config(path: Path, root: str, endpoint: str, proxy: str | None = None) -> Path:
    text = (
        f'root = "{root}"\n[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\n'
        'addressing_style = "path"\nconnect_timeout = 2\nread_timeout = 10\nmax_attempts = 2\n'
    )
    if proxy is not None:
        text += f'[proxy]\nhttp_proxy = "{proxy}"\n'
    text += '[[credentials]]\nsource = "env"\n'
    path.write_text(text)
    return path


def make_bucket(endpoint: str) -> tuple[Any, str]:
    client = boto3.client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id="x", aws_secret_access_key="y",
    )  # fmt: skip
    name = new_bucket_name()
    client.create_bucket(Bucket=name)
    return client, name


@pytest.fixture
def bucket(moto_server: str) -> tuple[Any, str]:
    return make_bucket(moto_server)


class TestEveryCommandOnS3:
    def test_publish_resolve_entries_prune_exec_dir_and_doctor(self, s3_server: str, tmp_path: Path) -> None:
        """All commands work on s3://BUCKET/PREFIX from a config file, with the documented documents.

        On moto's server and on Ceph RGW (``s3_server``): there the keys are really checked."""
        client, name = make_bucket(s3_server)
        root = f"s3://{name}/team-a/run-42"
        config = write_config(tmp_path / "ckpt.toml", root, s3_server)
        exec_dir = run(config, "exec-dir", "--attempt", "2.4102.0")
        assert exec_dir.stdout == f"{root}/exec/2.4102.0\n", exec_dir.stderr
        for step in (100, 200, 300):
            key = f"team-a/run-42/exec/2.4102.0/checkpoint-{step}/trainer_state.json"
            client.put_object(Bucket=name, Key=key, Body=b'{"global_step": %d}' % step)
            published = run(config, "--json", "publish", "--epoch", "7", "--step", str(step),
                            f"exec/2.4102.0/checkpoint-{step}")  # fmt: skip
            assert published.returncode == 0, published.stderr
            assert json.loads(published.stdout)["location"] == f"{root}/exec/2.4102.0/checkpoint-{step}"
        again = run(config, "publish", "--epoch", "7", "--step", "300", "exec/2.4102.0/checkpoint-300")
        assert again.returncode == 4
        assert run(config, "resolve").stdout == f"{root}/exec/2.4102.0/checkpoint-300\n"
        assert [json.loads(run(config, "--json", "entries").stdout)[i]["step"] for i in (0, 2)] == [100, 300]
        verified = run(config, "--json", "resolve", "--framework", "hf")
        assert json.loads(verified.stdout)["step"] == 300, verified.stderr
        pruned = json.loads(run(config, "--json", "prune", "--keep", "1").stdout)
        assert [e["step"] for e in pruned["removed_entries"]] == [100, 200]
        left = client.list_objects_v2(Bucket=name, Prefix="team-a/run-42/exec/")["Contents"]
        assert [o["Key"].split("/")[4] for o in left] == ["checkpoint-300"]

        doctor = run(config, "--json", "doctor")
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert list(checks) == ["root", "credentials", "proxy", "exclusive-create", "write-settings"]
        assert "'env'" in checks["credentials"]["detail"]
        assert "direct" in checks["proxy"]["detail"]
        assert all(c["ok"] for c in checks.values())
        assert KEYS["AWS_SECRET_ACCESS_KEY"] not in doctor.stdout + doctor.stderr


class TestDoctorCatchesIgnoredConditions:
    def test_a_proxy_stripping_if_none_match_fails_the_doctor(
        self, moto_server: str, bucket: tuple[Any, str], tmp_path: Path
    ) -> None:
        """Behind a proxy that drops If-None-Match, the second probe create succeeds and doctor exits 1."""
        _client, name = bucket
        port = urlsplit(moto_server).port
        assert port is not None
        endpoint = f"http://unresolvable-s3:{port}"  # reachable only through the proxy
        strip = StripRequestHeader("If-None-Match", when=Match(method="PUT"))
        with ForwardProxy(
            resolve={"unresolvable-s3": ("127.0.0.1", port)},
            credentials=("ckpt", PROXY_PASSWORD),
            rules=[strip],
        ) as proxy:
            proxy_url = proxy.url_with("ckpt", PROXY_PASSWORD)
            config = write_config(tmp_path / "ckpt.toml", f"s3://{name}", endpoint, proxy=proxy_url)
            doctor = run(config, "--json", "doctor")
            assert doctor.returncode == 1, doctor.stdout + doctor.stderr
            checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
            assert checks["root"]["ok"] is True, checks["root"]["detail"]
            assert checks["proxy"]["ok"] is True
            assert f"127.0.0.1:{proxy.port}" in checks["proxy"]["detail"]
            assert checks["exclusive-create"]["ok"] is False
            assert PROXY_PASSWORD not in doctor.stdout + doctor.stderr
            assert {r.host for r in proxy.requests} == {"unresolvable-s3"}
            assert any(r.method == "PUT" for r in proxy.requests)
