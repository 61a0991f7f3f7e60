"""S3 rows against the request floor: resolve beside its bare ListObjectsV2 requests, publish beside one PUT.

Issue 21 ("reads at the request floor", ADR 0027): a listing should cost what its requests cost, not what
parsing their answers costs. For each server in :data:`SERVERS` (moto's and Ceph RGW's, side by side; any
loopback endpoint can be added with :func:`add_server`), in one run:

* ``S3 resolve vs bare requests``: ``S3Store.resolve()`` over 1k, 10k and 100k entries, interleaved round by
  round with the *bare requests*: the same signed ``ListObjectsV2`` pages through a client built the same
  way, whose answers botocore does not parse at all (a ``before-parse`` handler takes the continuation
  token out of the raw bytes and hands botocore an empty body). That is the requests' own time: signing,
  the round trip, the server, reading the body. Targets: wall time at most 1.2x the bare requests, at
  most 20 µs of client CPU a key, and one ``ListObjectsV2`` a page: ceil(n/1000) on moto; RGW may cut a
  listing into a page or two more (a page may hold fewer than MaxKeys), and the bare requests get the
  same pages, so the row compares with their count and says so.
* ``S3 entries, client CPU``: ``entries()`` over the same listing (information; target 20 µs a key).
* ``S3 publish vs one conditional PUT``: ``publish`` of a new entry (``ListObjectsV2`` with ``MaxKeys=1``,
  then ``PutObject`` with ``If-None-Match: *``), interleaved with one bare ``PutObject`` of a new key with
  ``If-None-Match: *``, and with the publish's own two requests sent bare; medians. Target: at most 1.1x
  the one PUT, which two round trips one after the other cannot meet (the row says so); the second
  baseline shows what ``ckpt`` adds to its requests. The publish row runs once more on a gateway whose
  beast frontend keeps its default, Nagle's algorithm on (``PUBLISH_ONLY``): what a site that leaves out
  ``tcp_nodelay=1`` pays on every small request (docs/s3-servers.md).

``--only s3-floor`` (``--sizes`` picks the listing sizes). Entries are put straight into moto's backend
before it serves (``moto_seeded``); RGW is the test tier's one-node cluster, filled by parallel anonymous
PUTs before anything is measured (``rgw_seeded``). At 100k a listing costs moto about a minute, so its
100k rows run one round, warmed by a one-key listing instead of a whole one; a server that lists 100k keys
in seconds (RGW) runs three, as one round there showed a few percent of the gateway's own jitter. Each
timed listing starts from a heap just collected (``gc.collect()``): the cyclic garbage collector's passes
over the process's objects, which a page's tree sets off, cost as much as the tree itself, and without a
common starting point whichever call happened to run a full collection looked slower.
"""

from __future__ import annotations

import contextlib
import gc
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import unescape

from ckpt.adapters.s3 import S3Store
from ckpt.domain.names import format_entry_name
from moto_seeded import FAKE_ENV, RequestCounter, Seed, describe, moto_server, store_client
from rgw_seeded import rgw_server
from run import Context, Row, benchmark, entry_at, ms, ratio, size_label

LIST_GOAL = 1.2  # resolve's wall time over the bare requests'
CPU_GOAL_US = 20.0  # client CPU a key
PUBLISH_GOAL = 1.1  # publish's median over one bare conditional PUT's
SAVE = "exec/9.4109.0/checkpoint-500"  # the save every publish names (one object under it)


@dataclass(frozen=True)
class Served:
    """A running S3 server: its name in the rows, its endpoint, the environment its client signs from."""

    name: str
    endpoint: str
    environ: Mapping[str, str]
    slow_listing: bool = False  # a 100k listing costs minutes (moto): one round at that size


ServerFactory = Callable[[Path, Seed], contextlib.AbstractContextManager[Served]]


@contextlib.contextmanager
def _moto(scratch: Path, seed: Seed) -> Iterator[Served]:
    with moto_server(scratch, seed) as endpoint:
        yield Served("moto", endpoint, FAKE_ENV, slow_listing=True)


@contextlib.contextmanager
def _rgw(scratch: Path, seed: Seed) -> Iterator[Served]:
    with rgw_server(scratch, seed) as (endpoint, environ):
        yield Served("Ceph RGW 16.2", endpoint, environ)


@contextlib.contextmanager
def _rgw_nagle(scratch: Path, seed: Seed) -> Iterator[Served]:
    with rgw_server(scratch, seed, tcp_nodelay=False) as (endpoint, environ):
        yield Served("Ceph RGW 16.2, beast without tcp_nodelay", endpoint, environ)


#: The servers every run measures, side by side, in this order.
SERVERS: dict[str, ServerFactory] = {"moto": _moto, "rgw": _rgw, "rgw-nagle": _rgw_nagle}
#: Servers measured for their publish row only: a server setting that small requests show, not listings.
PUBLISH_ONLY = {"rgw-nagle"}


def add_server(name: str, factory: ServerFactory) -> None:
    """Measure one more server: ``factory(scratch, seed)`` starts it (on 127.0.0.1) holding ``seed``
    (bucket -> key -> body) and yields :class:`Served`; leaving the context stops it."""
    SERVERS[name] = factory


def _bucket(size: int) -> str:
    return f"ckpt-floor-{size}"


def _sizes(ctx: Context) -> tuple[int, ...]:
    return tuple(size for size in ctx.sizes if size <= (10_000 if ctx.quick else 100_000)) or (1_000,)


def _seed(ctx: Context, sizes: tuple[int, ...]) -> dict[str, dict[str, bytes]]:
    seed: dict[str, dict[str, bytes]] = {}
    for size in sizes:
        objects = {f"pub/{format_entry_name(entry_at(i))}": b"" for i in range(size)}
        objects[f"{SAVE}/model.safetensors"] = b"weights"
        seed[_bucket(size)] = objects
    return seed


class BareRequests:
    """The floor: ``ListObjectsV2`` pages sent through ``client``, their answers never parsed by botocore."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._token: str | None = None
        client.meta.events.register_first("before-parse.s3.ListObjectsV2", self._raw)

    def _raw(self, response_dict: dict[str, Any], **_: Any) -> None:
        body = response_dict["body"]
        self._token = None
        if response_dict["status_code"] == 200 and b"<IsTruncated>true</IsTruncated>" in body:
            start = body.find(b"<NextContinuationToken>") + len(b"<NextContinuationToken>")
            self._token = unescape(body[start : body.find(b"</NextContinuationToken>")].decode())
        response_dict["body"] = b""  # botocore parses nothing

    def list(self, bucket: str) -> int:
        """Send the pages resolve sends for ``bucket``; return how many."""
        params: dict[str, Any] = {"Bucket": bucket, "Prefix": "pub/", "Delimiter": "/", "MaxKeys": 1000}
        pages = 0
        while True:
            self.client.list_objects_v2(**params)
            pages += 1
            if self._token is None:
                return pages
            params["ContinuationToken"] = self._token


def _timed(fn: Callable[[], object], counter: RequestCounter) -> tuple[float, float, Counter[str], object]:
    """Wall time, this process's CPU time, the requests and the answer of one call (from a collected heap)."""
    with counter.window() as sent:
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        answer = fn()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return wall, cpu, sent, answer


def _rounds(ctx: Context, size: int, served: Served) -> int:
    if size >= 100_000:
        return 1 if served.slow_listing or ctx.quick else 3
    if ctx.quick:
        return 2
    return 9 if size <= 1_000 else 3


def _resolve_rows(ctx: Context, served: Served, size: int) -> list[Row]:
    client = store_client(served.endpoint, served.environ)
    counter = RequestCounter(client)
    bare = BareRequests(store_client(served.endpoint, served.environ))
    store = S3Store(f"s3://{_bucket(size)}", client)
    if size <= 10_000:
        store.resolve(), bare.list(_bucket(size))  # warm: endpoint rules loaded, connection open
    else:  # a whole listing would cost a minute on moto: one key warms the same
        for warm in (client, bare.client):
            warm.list_objects_v2(Bucket=_bucket(size), Prefix="pub/", MaxKeys=1)
    floor: list[tuple[float, float]] = []
    server_pages: set[int] = set()  # how many pages the server cut the listing into (RGW's may be short)
    resolved: list[tuple[float, float, Counter[str], object]] = []
    listed: list[tuple[float, float, Counter[str], object]] = []
    for _ in range(_rounds(ctx, size, served)):
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        server_pages.add(bare.list(_bucket(size)))
        floor.append((time.perf_counter() - wall, time.process_time() - cpu))
        resolved.append(_timed(store.resolve, counter))
        if size <= 10_000:  # at 100k a listing of moto's costs a minute; resolve's row is the one that counts
            listed.append(_timed(store.entries, counter))
    pages = max(server_pages)
    short = ""
    if server_pages != {math.ceil(size / 1000)}:
        short = f"the server cut the listing into {pages} pages (a page may hold fewer than MaxKeys)"
    best_floor = min(floor)
    best = min(resolved, key=lambda r: r[0])
    cpu_us = min(r[1] for r in resolved) / size * 1e6
    expected = entry_at(size - 1)
    right = all(r[3] == expected for r in resolved)
    requests_ok = len(server_pages) == 1 and all(r[2] == Counter({"ListObjectsV2": pages}) for r in resolved)
    wall_ratio = best[0] / best_floor[0]
    rows = [
        Row(
            f"S3 resolve vs bare requests ({served.name})",
            size_label(size),
            f"{ms(best[0])} best of {len(resolved)}, client CPU {ms(min(r[1] for r in resolved))} "
            f"= {cpu_us:.1f} µs a key ({ratio(min(r[1] for r in resolved), best_floor[1])} the bare CPU); "
            f"{describe(best[2])}",
            f"{ms(best_floor[0])} (client CPU {ms(best_floor[1])}): the same {pages} signed "
            f"page{'s' if pages > 1 else ''}, unparsed",
            ratio(best[0], best_floor[0]),
            f"<= {LIST_GOAL}x, <= {CPU_GOAL_US:g} µs CPU a key, one ListObjectsV2 a page",
            wall_ratio <= LIST_GOAL and cpu_us <= CPU_GOAL_US and requests_ok and right,
            short if right else f"resolve returned {resolved[-1][3]}, expected {expected}",
        )
    ]
    if listed:
        cpu_us = min(r[1] for r in listed) / size * 1e6
        rows.append(
            Row(
                f"S3 entries, client CPU ({served.name})",
                size_label(size),
                f"{ms(min(r[0] for r in listed))} best of {len(listed)}, client CPU "
                f"{ms(min(r[1] for r in listed))} = {cpu_us:.1f} µs a key; {describe(listed[0][2])}",
                f"{ms(best_floor[0])} (bare requests)",
                ratio(min(r[0] for r in listed), best_floor[0]),
                f"<= {CPU_GOAL_US:g} µs CPU a key",
                cpu_us <= CPU_GOAL_US and all(len(r[3]) == size for r in listed),  # type: ignore[arg-type]
            )
        )
    return rows


def _publish_row(ctx: Context, served: Served, size: int) -> Row:
    client = store_client(served.endpoint, served.environ)
    counter = RequestCounter(client)
    bucket = _bucket(size)
    store = S3Store(f"s3://{bucket}", client)
    location = f"{store.root}/{SAVE}"
    rounds = 3 if ctx.quick else 10
    bare: list[float] = []
    pair: list[float] = []  # the publish's own two requests, bare: the save's one-key listing, the PUT
    published: list[tuple[float, float, Counter[str], object]] = []
    client.put_object(Bucket=bucket, Key="bench/warm", Body=b"", IfNoneMatch="*")  # warm the connection
    for n in range(rounds):
        start = time.perf_counter()
        client.put_object(Bucket=bucket, Key=f"bench/put-{n}", Body=b"", IfNoneMatch="*")
        bare.append(time.perf_counter() - start)
        start = time.perf_counter()
        client.list_objects_v2(Bucket=bucket, Prefix=f"{SAVE}/", MaxKeys=1)
        client.put_object(Bucket=bucket, Key=f"bench/pair-{n}", Body=b"", IfNoneMatch="*")
        pair.append(time.perf_counter() - start)
        published.append(_timed(lambda n=n: store.publish(9, 10**9 + n, location), counter))
    median = statistics.median(r[0] for r in published)
    floor = statistics.median(bare)
    both = statistics.median(pair)
    most = max(sum(r[2].values()) for r in published)
    return Row(
        f"S3 publish vs one conditional PUT ({served.name})",
        size_label(size),
        f"{ms(median)} median of {rounds} (client CPU {ms(statistics.median(r[1] for r in published))}); "
        f"{describe(published[-1][2])} each",
        f"{ms(floor)} (one PutObject, If-None-Match: *); {ms(both)} ({ratio(median, both)}) for the same two "
        "requests sent bare",
        ratio(median, floor),
        f"<= {PUBLISH_GOAL}x, 2 requests",
        median / floor <= PUBLISH_GOAL and most <= 2,
        "" if median / floor <= PUBLISH_GOAL else "a publish is two round trips, one after the other",
    )


@benchmark("s3-floor")
def bench_s3_floor(ctx: Context) -> list[Row]:
    """resolve against its bare requests, publish against one PUT, on every server in SERVERS."""
    resolves: list[tuple[int, int, Row]] = []  # (size, server, row): the servers side by side at each size
    entries: list[tuple[int, int, Row]] = []
    publishes: list[Row] = []
    for order, (name, factory) in enumerate(SERVERS.items()):
        sizes = (min(_sizes(ctx)),) if name in PUBLISH_ONLY else _sizes(ctx)
        with factory(ctx.scratch, _seed(ctx, sizes)) as served:
            for size in () if name in PUBLISH_ONLY else sizes:
                for row in _resolve_rows(ctx, served, size):
                    found = resolves if row.benchmark.startswith("S3 resolve") else entries
                    found.append((size, order, row))
            publishes.append(_publish_row(ctx, served, min(sizes)))
    return [row for _, _, row in sorted(resolves)] + [row for _, _, row in sorted(entries)] + publishes
