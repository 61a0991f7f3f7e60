"""S3 harnesses for the store contract suite, and the wire-level doubles the S3 tests use.

These harnesses satisfy ``harness.Harness``:

* ``s3-moto``: moto in-process (``moto.mock_aws``); the store's root has a key prefix
  (``s3://<bucket>/team-a/run-42``), so every test also checks that nothing escapes the prefix.
* ``s3-http``: moto's server started as a subprocess on 127.0.0.1 (one per test session), reached over real
  HTTP by a client that ``open_s3_store`` builds from a ``Config``; the root is a bare bucket.
* ``s3-rgw`` (the store contract only): the same over HTTP to Ceph's RADOS Gateway (``support.rgw``), a
  real S3 server that checks signatures and creates exclusively by itself.

Each test gets a fresh bucket. The harness arranges objects with its own client, beside the store's.

The doubles here are wire-level (botocore ``before-send`` handlers that answer instead of the server, and a
request log); they never patch our own code. Nothing here sends a request anywhere but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

# moto is imported before any botocore session exists: on import it puts its in-process stub into
# botocore's built-in handlers, and only sessions created afterwards carry it.
import moto.core.models as moto_core_models
import pytest
from moto import mock_aws

from ckpt.adapters.s3 import S3Store
from ckpt.config import Config, S3Settings
from support.harness import Harness
from support.saves import put_save

REGION = "us-east-1"
# Credentials moto accepts; they only ever go to 127.0.0.1 or nowhere (in-process).
FAKE_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
# The environment handed to clients built from a Config: its env credential source reads the fake keys here,
# so no test depends on os.environ for signing.
FAKE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_SERVER_START_SECONDS = 30.0


def new_bucket_name() -> str:
    """Return a fresh, valid bucket name."""
    return f"ckpt-test-{uuid.uuid4().hex[:16]}"


def free_port() -> int:
    """Return a loopback TCP port that nothing listens on (at the time of the call)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def only_loopback(client: Any) -> Any:
    """Make ``client`` refuse any request that would leave 127.0.0.1; return it.

    botocore calls every ``before-send`` handler (the first answer wins), so the guard sees each request. A
    request to an AWS URL is allowed only while moto's in-process stub is on, because the stub answers it.
    """

    def guard(request: Any, **_: Any) -> None:
        if urlsplit(request.url).hostname == "127.0.0.1" or moto_core_models.botocore_stubber.enabled:
            return
        raise AssertionError(f"a test S3 client tried to reach {request.url}; only 127.0.0.1 is allowed")

    client.meta.events.register_last("before-send", guard)
    return client


@functools.cache
def _arranging_session() -> Any:
    """One botocore session for the tests' own clients: it loads the S3 model once, not once per test."""
    import botocore.session

    return botocore.session.Session()


def raw_client(endpoint_url: str | None = None) -> Any:
    """Return a plain S3 client for arranging objects (in-process moto when ``endpoint_url`` is None)."""
    from botocore.config import Config as BotoConfig

    client = _arranging_session().create_client(
        "s3",
        region_name=REGION,
        endpoint_url=endpoint_url,
        # proxies={}: an HTTP(S)_PROXY in the environment must not carry loopback test traffic away.
        config=BotoConfig(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}, proxies={}),
        **FAKE_CREDENTIALS,
    )
    return only_loopback(client)


def isolate_from_aws_environment(monkeypatch: pytest.MonkeyPatch, tmp: Path) -> None:
    """Point botocore's default chain at fake keys and away from ~/.aws, profiles, endpoints and IMDS."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def http_settings(endpoint_url: str, *, credentials: Any = ({"source": "env"},), **overrides: Any) -> Config:
    """Return a configuration pointing the S3 client at ``endpoint_url`` (path style, short timeouts).

    It signs with the ``env`` credential source, which reads the ``environ`` given to the client (FAKE_ENV).
    """
    settings: dict[str, Any] = {
        "endpoint_url": endpoint_url,
        "region": REGION,
        "addressing_style": "path",
        "connect_timeout": 2.0,
        "read_timeout": 10.0,
        "max_attempts": 2,
    }
    settings.update(overrides)
    return Config(s3=S3Settings(**settings), credentials=tuple(credentials))


# -- the moto server subprocess --------------------------------------------------------------------------


def _wait_until_answering(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an env proxy
    deadline = time.monotonic() + _SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with direct.open(url, timeout=1) as answer:  # 127.0.0.1 only
                answer.read()
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer at {url} within {_SERVER_START_SECONDS}s")


@contextlib.contextmanager
def serve_moto(log: Path, *, module: str = "moto.server", cwd: str | None = None) -> Iterator[str]:
    """Run ``python -m <module> -H 127.0.0.1 -p <free port>`` until the ``with`` ends; yield its endpoint URL.

    The server's output goes to ``log`` (shown if it fails to start); it is terminated, then killed, at exit.
    """
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", module, "-H", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    try:
        _wait_until_answering(f"{endpoint}/moto-api/", process, log)
        yield endpoint
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the harness -----------------------------------------------------------------------------------------


class S3Harness:
    """A fresh bucket; ``client`` arranges objects beside ``store``, whose client is ``store_client``."""

    def __init__(self, name: str, store: S3Store, store_client: Any, client: Any) -> None:
        self.name = name
        self._store = store
        self.store_client = store_client
        self.client = client
        self.bucket = store.bucket
        self.prefix = store.prefix

    def store(self) -> S3Store:
        return self._store

    def key(self, save: str) -> str:
        """Return the key of ``save`` (or of any path relative to the root)."""
        return self.prefix + save

    def put(self, path: str, data: bytes = b"") -> None:
        """Put one object at ``path`` relative to the root."""
        self.client.put_object(Bucket=self.bucket, Key=self.key(path), Body=data)

    def keys_under(self, path: str) -> list[str]:
        """Return every key under ``<root>/<path>/``, sorted."""
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.key(path) + "/"):
            keys.extend(obj["Key"] for obj in page.get("Contents", ()))
        return sorted(keys)

    def make_save(self, save: str, files: dict[str, bytes] | None = None) -> str:
        put_save(self.client, self.bucket, self.key(save), files)
        return f"{self._store.root}/{save}"

    def make_file(self, path: str, data: bytes) -> str:
        self.put(path, data)
        return f"{self._store.root}/{path}"

    def remove_save(self, save: str) -> None:
        for key in self.keys_under(save):
            self.client.delete_object(Bucket=self.bucket, Key=key)

    def save_exists(self, save: str) -> bool:
        return bool(self.keys_under(save))

    def put_raw_name(self, name: str, *, folder: bool = False) -> None:
        self.put(f"pub/{name}/marker" if folder else f"pub/{name}")

    def pub_names(self) -> list[str]:
        pub = self.key("pub/")
        names = set()
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=pub, Delimiter="/"):
            names.update(obj["Key"][len(pub) :] for obj in page.get("Contents", ()))
            names.update(p["Prefix"][len(pub) : -1] for p in page.get("CommonPrefixes", ()))
        return sorted(names)


def moto_in_process(_request: pytest.FixtureRequest, _tmp: Path) -> Iterator[Harness]:
    """A harness on moto in-process, root ``s3://<fresh bucket>/team-a/run-42``."""
    with mock_aws():
        client = raw_client()
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        store_client = raw_client()
        store = S3Store(f"s3://{bucket}/team-a/run-42", store_client)
        yield S3Harness("s3-moto", store, store_client, client)


def moto_over_http(request: pytest.FixtureRequest, _tmp: Path) -> Iterator[Harness]:
    """A harness on moto's server over HTTP, root ``s3://<fresh bucket>``, with the configured client."""
    endpoint: str = request.getfixturevalue("moto_server")
    store_client = request.getfixturevalue("moto_server_store_client")
    client = raw_client(endpoint)
    bucket = new_bucket_name()
    client.create_bucket(Bucket=bucket)
    yield S3Harness("s3-http", S3Store(f"s3://{bucket}", store_client), store_client, client)


def rgw_over_http(request: pytest.FixtureRequest, _tmp: Path) -> Iterator[Harness]:
    """A harness on Ceph RGW (``rgw_server``), root ``s3://<fresh bucket>``, with the configured client."""
    endpoint: str = request.getfixturevalue("rgw_server").endpoint
    store_client = request.getfixturevalue("rgw_server_store_client")
    client = raw_client(endpoint)
    bucket = new_bucket_name()
    client.create_bucket(Bucket=bucket)
    yield S3Harness("s3-rgw", S3Store(f"s3://{bucket}", store_client), store_client, client)


S3_HARNESS_FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Iterator[Harness]]] = {
    "s3-http": moto_over_http,
    "s3-moto": moto_in_process,
}
# The real S3 server: the store contract runs on it too (test_store_contract.py), the other suites do not.
REAL_S3_HARNESS_FACTORIES: dict[str, Callable[[pytest.FixtureRequest, Path], Iterator[Harness]]] = {
    "s3-rgw": rgw_over_http,
}


# -- wire-level doubles ----------------------------------------------------------------------------------


class RequestLog:
    """Records every HTTP request a client sends (botocore ``before-send``): operation, method, URL."""

    def __init__(self, client: Any) -> None:
        self.sent: list[tuple[str, str, str]] = []
        # botocore calls every before-send handler, so this sees requests a double or moto's stub answers too.
        client.meta.events.register_first("before-send.s3", self._record)

    def _record(self, request: Any, event_name: str, **_: Any) -> None:
        self.sent.append((event_name.rsplit(".", 1)[-1], request.method, request.url))

    def operations(self) -> list[str]:
        """Return the operation names sent, in order."""
        return [operation for operation, _, _ in self.sent]

    def count(self, operation: str) -> int:
        """Return how many requests of ``operation`` were sent."""
        return self.operations().count(operation)

    def clear(self) -> None:
        self.sent.clear()


class _RawBody:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def fake_response(url: str, status: int, body: bytes) -> Any:
    """Return a botocore HTTP response with ``status`` and ``body``, as a server would send it."""
    from botocore.awsrequest import AWSResponse

    return AWSResponse(url, status, {"Content-Type": "application/xml"}, _RawBody(body))


def error_body(code: str, message: str = "refused by the test double", **extra: str) -> bytes:
    """Return an S3 ``<Error>`` document."""
    elements = {"Code": code, "Message": message, **extra}
    fields = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in elements.items())
    return f'<?xml version="1.0" encoding="UTF-8"?><Error>{fields}<RequestId>0</RequestId></Error>'.encode()


def answer_instead(
    client: Any,
    operation: str,
    status: int,
    body: bytes | Callable[[Any], bytes],
    *,
    times: int | None = None,
    when: Callable[[Any], bool] | None = None,
) -> list[Any]:
    """Make ``client`` receive a fake answer for ``operation`` instead of the server's.

    Use it over HTTP (moto's server): an answer given here means the request is never sent. moto's in-process
    stub, in contrast, still carries out a request another handler answered.

    ``times`` limits how many requests are answered (then the server answers again); ``when`` picks the
    requests. ``body`` may be a function of the request. Returns the list of requests answered.
    """
    answered: list[Any] = []

    def handler(request: Any, event_name: str, **_: Any) -> Any:
        if event_name.rsplit(".", 1)[-1] != operation:
            return None
        if times is not None and len(answered) >= times:
            return None
        if when is not None and not when(request):
            return None
        answered.append(request)
        payload = body(request) if callable(body) else body
        return fake_response(request.url, status, payload)

    client.meta.events.register("before-send.s3", handler)
    return answered
