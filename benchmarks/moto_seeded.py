"""moto's S3 server, on 127.0.0.1 in a subprocess, with buckets filled before it starts serving.

The S3 rows need buckets holding thousands of objects. Filling them over HTTP costs about 7 ms a
``PutObject`` on moto's server (its request handling, not the network), so 10,000 entries would take over a
minute before anything is measured. This module, run as a script, puts the objects straight into moto's
in-memory backend (about 0.2 ms each; buckets are created through moto's own request handling, so its
bookkeeping is the server's), then hands over to ``moto.server.main``: the server that answers is the one
``python -m moto.server`` runs. Should the backend call ever change in moto, it falls back to sending each
``PutObject`` through moto's request handling in-process, which is slower but the same.

Imported by the S3 benchmarks (``bench_s3``, ``bench_watcher``), it starts and stops that server, builds the
store's client exactly as ``ckpt`` builds it (``make_s3_client``) and counts the requests the client sends.
Nothing here sends a request anywhere but 127.0.0.1.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

HOST = "127.0.0.1"
REGION = "us-east-1"
# Keys moto accepts; they only ever go to 127.0.0.1.
FAKE_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
_START_SECONDS = 120.0  # includes filling the buckets

Seed = Mapping[str, Mapping[str, bytes]]  # bucket -> key -> body


# -- the parent side: start, reach, stop ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
    return port


def _wait_until_answering(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an env proxy
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}: {log.read_text()[-2000:]}")
        try:
            with direct.open(url, timeout=1) as answer:
                answer.read()
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"moto server did not answer at {url} within {_START_SECONDS:g} s")


@contextlib.contextmanager
def moto_server(scratch: Path, seed: Seed) -> Iterator[str]:
    """Start moto's server on a free loopback port with ``seed`` in it; yield its endpoint; stop it."""
    port = _free_port()
    seed_file = scratch / f"moto-seed-{port}.json"
    seed_file.write_text(
        json.dumps({bucket: {k: v.decode() for k, v in objects.items()} for bucket, objects in seed.items()})
    )
    log = scratch / f"moto-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, __file__, str(seed_file), "-H", HOST, "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
    endpoint = f"http://{HOST}:{port}"
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


def store_client(endpoint: str, environ: Mapping[str, str] = FAKE_ENV) -> Any:
    """The client ``ckpt`` builds from a configuration naming ``endpoint`` (path style, one attempt).

    One attempt per request, so a failure shows instead of hiding in a retry (a retry would be counted, as
    every request sent is). Signed with the ``env`` credential source reading ``environ`` (moto's fake keys
    by default; a real server's keys for another server).
    """
    from ckpt.adapters.s3 import make_s3_client
    from ckpt.config import Config, S3Settings

    settings = S3Settings(
        endpoint_url=endpoint,
        region=REGION,
        addressing_style="path",
        connect_timeout=2.0,
        read_timeout=120.0,
        max_attempts=1,
    )
    client = make_s3_client(Config(s3=settings, credentials=({"source": "env"},)), environ=environ)

    def only_loopback(request: Any, **_: Any) -> None:
        if urlsplit(request.url).hostname != HOST:
            raise RuntimeError(f"a benchmark S3 client tried to reach {request.url}; only {HOST} is allowed")

    client.meta.events.register_last("before-send", only_loopback)
    return client


class RequestCounter:
    """Counts the HTTP requests a client sends, by operation (a botocore ``before-send`` handler).

    botocore emits ``before-send`` once per attempt, so a retried request counts each time it is sent.
    """

    def __init__(self, client: Any) -> None:
        self.sent: collections.Counter[str] = collections.Counter()
        client.meta.events.register_first("before-send.s3", self._record)

    def _record(self, event_name: str, **_: Any) -> None:
        self.sent[event_name.rsplit(".", 1)[-1]] += 1

    @contextlib.contextmanager
    def window(self) -> Iterator[collections.Counter[str]]:
        """Yield a counter that holds, once the block ends, the requests sent inside it."""
        before = self.sent.copy()
        counted: collections.Counter[str] = collections.Counter()
        try:
            yield counted
        finally:
            counted.update(self.sent - before)


def describe(counts: Mapping[str, int]) -> str:
    """``"2 requests (ListObjectsV2 1, PutObject 1)"``."""
    total = sum(counts.values())
    parts = ", ".join(f"{op} {n}" for op, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{total} request{'s' if total != 1 else ''}" + (f" ({parts})" if parts else "")


# -- the child side: fill the buckets, then serve ------------------------------------------------------------


def _fill(seed: Mapping[str, Mapping[str, str]]) -> None:
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.test import Client

    app = Client(DomainDispatcherApplication(create_backend_app))
    headers = {"Host": HOST}
    for bucket, objects in seed.items():
        answer = app.put(f"/{bucket}", headers=headers)  # CreateBucket, through moto's request handling
        if answer.status_code != 200:
            raise RuntimeError(f"moto refused to create bucket {bucket}: {answer.status}")
        try:
            from moto.core import DEFAULT_ACCOUNT_ID
            from moto.s3.models import s3_backends

            backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
            for key, body in objects.items():
                backend.put_object(bucket, key, body.encode())
        except (ImportError, KeyError, AttributeError, TypeError):
            for key, body in objects.items():
                answer = app.put(f"/{bucket}/{quote(key)}", data=body.encode(), headers=headers)
                if answer.status_code != 200:
                    raise RuntimeError(f"moto refused to put {key}: {answer.status}") from None


def serve(argv: list[str]) -> None:
    """``moto_seeded.py SEED.json [moto.server options]``: fill the buckets, then run moto's server."""
    from moto import server

    seed_file, *server_args = argv
    _fill(json.loads(Path(seed_file).read_text()))
    server.main(server_args)


if __name__ == "__main__":
    serve(sys.argv[1:])
