"""``ckpt doctor`` through the real command line, on a local root and on an S3 root behind a proxy."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from support.forward_proxy import ForwardProxy
from support.s3 import free_port, new_bucket_name, raw_client
from test_cli import ckpt
from test_cli_s3 import PROXY_PASSWORD, run


class TestDoctorPosix:
    def test_a_healthy_root_passes_every_check(self, tmp_path: Path) -> None:
        """On a writable local root, the root and exclusive-create checks pass and the exit code is 0."""
        result = ckpt("--root", str(tmp_path), "--json", "doctor")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["ok"] is True
        assert [c["name"] for c in document["checks"]] == ["root", "exclusive-create"]
        assert all(c["ok"] for c in document["checks"])
        assert list(tmp_path.iterdir()) == []  # the probe cleaned up after itself

    def test_a_malformed_log_fails_the_root_check(self, tmp_path: Path) -> None:
        """A malformed name in pub/ fails the doctor (exit 1) and the detail names it."""
        (tmp_path / "pub").mkdir()
        (tmp_path / "pub" / "not-an-entry").write_bytes(b"")
        result = ckpt("--root", str(tmp_path), "doctor")
        assert result.returncode == 1
        assert result.stdout.startswith("FAIL root: ")
        assert "not-an-entry" in result.stdout

    def test_a_missing_root_fails(self, tmp_path: Path) -> None:
        """A root that does not exist fails the root check."""
        result = ckpt("--root", str(tmp_path / "absent"), "--json", "doctor")
        assert result.returncode == 1
        assert json.loads(result.stdout)["ok"] is False


def s3_config(path: Path, bucket: str, endpoint: str, style: str, http_proxy: str) -> Path:
    """A configuration for ``s3://bucket`` at ``endpoint`` through ``http_proxy``, one attempt a request."""
    path.write_text(
        f'root = "s3://{bucket}"\n'
        f'[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\naddressing_style = "{style}"\n'
        "connect_timeout = 2\nread_timeout = 10\nmax_attempts = 1\n"
        f'[proxy]\nhttp_proxy = "{http_proxy}"\n'
        '[[credentials]]\nsource = "env"\n'
    )
    return path


class TestDoctorProxyCheck:
    """The proxy check connects to the proxy the root's host is routed through (spec/proxy.md, issue 9)."""

    @pytest.fixture
    def bucket(self, moto_server: str) -> str:
        name = new_bucket_name()
        raw_client(moto_server).create_bucket(Bucket=name)
        return name

    def test_an_unreachable_proxy_fails_the_check_and_is_named(
        self, moto_server: str, bucket: str, tmp_path: Path
    ) -> None:
        """Nothing listens at the proxy address: the proxy check fails, naming it with user-info redacted."""
        port = urlsplit(moto_server).port
        dead_port = free_port()
        proxy = f"http://ckpt:{PROXY_PASSWORD}@127.0.0.1:{dead_port}"
        config = s3_config(tmp_path / "ckpt.toml", bucket, f"http://unresolvable-s3:{port}", "path", proxy)
        doctor = run(config, "--json", "doctor")
        assert doctor.returncode == 1, doctor.stdout + doctor.stderr
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert checks["proxy"]["ok"] is False, checks["proxy"]["detail"]
        assert f"http://ckpt:***@127.0.0.1:{dead_port}" in checks["proxy"]["detail"]
        assert "cannot be reached" in checks["proxy"]["detail"]
        assert checks["root"]["ok"] is False  # the listing could not get through either
        assert PROXY_PASSWORD not in doctor.stdout + doctor.stderr

    def test_the_text_report_says_fail_for_the_proxy(
        self, moto_server: str, bucket: str, tmp_path: Path
    ) -> None:
        """Without --json the proxy line starts with FAIL and names the proxy."""
        dead_port = free_port()
        endpoint = f"http://unresolvable-s3:{urlsplit(moto_server).port}"
        config = s3_config(tmp_path / "ckpt.toml", bucket, endpoint, "path", f"http://127.0.0.1:{dead_port}")
        doctor = run(config, "doctor")
        assert doctor.returncode == 1
        proxy_lines = [line for line in doctor.stdout.splitlines() if " proxy: " in line]
        assert len(proxy_lines) == 1, doctor.stdout
        assert proxy_lines[0].startswith("FAIL proxy: ")
        assert f"127.0.0.1:{dead_port}" in proxy_lines[0]

    def test_a_listening_proxy_passes_and_the_bucket_host_is_named(
        self, moto_server: str, bucket: str, tmp_path: Path
    ) -> None:
        """Through the recording proxy, with virtual-hosted addressing, every check passes; the proxy check
        names the host the client really contacted (the bucket's) and the proxy, redacted."""
        port = urlsplit(moto_server).port
        assert port is not None
        hosts = ("unresolvable-s3", f"{bucket}.unresolvable-s3")
        resolve = dict.fromkeys(hosts, ("127.0.0.1", port))
        with ForwardProxy(resolve=resolve, credentials=("ckpt", PROXY_PASSWORD)) as proxy:
            proxy_url = proxy.url_with("ckpt", PROXY_PASSWORD)
            endpoint = f"http://unresolvable-s3:{port}"
            config = s3_config(tmp_path / "ckpt.toml", bucket, endpoint, "virtual", proxy_url)
            doctor = run(config, "--json", "doctor")
            recorded, proxy_port = proxy.requests, proxy.port
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        checks = {c["name"]: c for c in json.loads(doctor.stdout)["checks"]}
        assert all(c["ok"] for c in checks.values()), checks
        detail = checks["proxy"]["detail"]
        assert (
            detail
            == f"http://{bucket}.unresolvable-s3:{port} is reached through http://ckpt:***@127.0.0.1:{proxy_port}"
        )
        assert {r.host for r in recorded} == {f"{bucket}.unresolvable-s3"}
        assert PROXY_PASSWORD not in doctor.stdout + doctor.stderr
