"""Ceph RGW for the benchmarks: the tests' one-node cluster, its buckets filled before anything is measured.

The cluster is the one the RGW test tier runs (``tests/support/rgw.py``: a monitor, a memstore OSD and
radosgw, every daemon on 127.0.0.1, started and stopped by PID). Unlike moto's server, RGW has no backend a
benchmark could write into, and a signed ``PutObject`` through botocore costs the client about 2 ms of CPU:
16 threads filled about 160 objects a second, so the 111,000 objects of the 1k, 10k and 100k buckets would
take over ten minutes. Instead each bucket is opened to anonymous writes (the canned ACL
``public-read-write``) for the time of the fill, the objects are sent as plain HTTP ``PUT`` requests on
:data:`FILL_THREADS` keep-alive connections (about 0.5 ms of client CPU each; about 600 a second on a
2-core machine, where RGW's own CPU is then the limit), and the ACL is set back to ``private``. Every
measured request is signed, as ``ckpt`` signs it.

Nothing here sends a request anywhere but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import repeat
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from moto_seeded import HOST, Seed, store_client

REPO = Path(__file__).resolve().parent.parent
FILL_THREADS = 32


def _fill(endpoint: str, environ: Mapping[str, str], seed: Seed) -> None:
    client = store_client(endpoint, environ)
    where = urlsplit(endpoint)
    if where.hostname != HOST or where.port is None:
        raise RuntimeError(f"the RGW benchmark fills only a server on {HOST}, not {endpoint}")
    local = threading.local()

    def put(bucket: str, key: str, body: bytes) -> None:
        connection = getattr(local, "connection", None)
        if connection is None:
            connection = local.connection = http.client.HTTPConnection(HOST, where.port, timeout=60)
        length = {"Content-Length": str(len(body))}
        connection.request("PUT", f"/{bucket}/{quote(key)}", body=body, headers=length)
        answer = connection.getresponse()
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"RGW refused the anonymous PUT of {key!r} in {bucket}: {answer.status}")

    for bucket, objects in seed.items():
        client.create_bucket(Bucket=bucket)
        client.put_bucket_acl(Bucket=bucket, ACL="public-read-write")
        try:
            with ThreadPoolExecutor(FILL_THREADS) as pool:
                list(pool.map(put, repeat(bucket), objects, objects.values()))  # raises the first failure
        finally:
            client.put_bucket_acl(Bucket=bucket, ACL="private")


def _cluster_ticks(folder: Path) -> int:
    """The CPU time (clock ticks, user and system) used so far by the cluster's daemons: the processes
    started with ``folder``'s ``ceph.conf`` on their command line."""
    conf = str(folder / "ceph.conf").encode()
    ticks = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            if conf not in (proc / "cmdline").read_bytes().split(b"\0"):
                continue
            stat = (proc / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ticks


def quiesce(folder: Path, *, idle_share: float = 0.1, longest: float = 120.0) -> float:
    """Wait until the cluster in ``folder`` uses under ``idle_share`` of a CPU over a second (or ``longest``
    seconds have passed); return the seconds waited.

    A guard, not a proven cause: a daemon still at work after the fill would take from a 2-core machine
    what the client's requests and parsing need. In the runs of 2026-12-07 it found the cluster idle
    within a second every time; the rows' swings of that day were the client's garbage collector
    (``bench_s3_floor`` collects before each timed call).
    """
    started = time.perf_counter()
    hertz = os.sysconf("SC_CLK_TCK")
    before = _cluster_ticks(folder)
    while time.perf_counter() - started < longest:
        time.sleep(1.0)
        now = _cluster_ticks(folder)
        if now - before < idle_share * hertz:
            break
        before = now
    return time.perf_counter() - started


def _support() -> Any:
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import support.rgw

    return support.rgw


def missing_binaries() -> list[str]:
    """The Ceph binaries this machine lacks (``.ci/run`` installs them); empty when RGW can start."""
    missing: list[str] = _support().missing_binaries()
    return missing


def gateway(folder: Path, *, memstore_bytes: int | None = None) -> contextlib.AbstractContextManager[Any]:
    """The tests' cluster in ``folder``, empty: yields its ``RgwServer`` (endpoint, keys, ``admin``).

    ``memstore_bytes``: the RAM its OSD may fill (the tests' 4 GiB when ``None``).
    """
    support = _support()
    size = support.MEMSTORE_BYTES if memstore_bytes is None else memstore_bytes
    return support.serve_rgw(folder, memstore_bytes=size)  # type: ignore[no-any-return]


@contextlib.contextmanager
def rgw_server(
    scratch: Path, seed: Seed, *, tcp_nodelay: bool = True
) -> Iterator[tuple[str, dict[str, str]]]:
    """Start a one-node Ceph cluster in ``scratch`` holding ``seed``; yield its endpoint and signing keys.

    ``tcp_nodelay=False`` starts the gateway's frontend with its default, Nagle's algorithm on.
    """
    serve_rgw = _support().serve_rgw
    started = time.perf_counter()
    with serve_rgw(scratch / ("rgw" if tcp_nodelay else "rgw-nagle"), tcp_nodelay=tcp_nodelay) as server:
        environ = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
        up = time.perf_counter()
        _fill(server.endpoint, environ, seed)
        filled = time.perf_counter()
        waited = quiesce(server.folder)
        count = sum(len(objects) for objects in seed.values())
        print(
            f"  rgw: up in {up - started:.1f} s, {count} objects filled in {filled - up:.1f} s, "
            f"idle {waited:.1f} s later",
            file=sys.stderr,
            flush=True,
        )
        yield server.endpoint, environ
