"""S3 rows: requests and time of publish, resolve, entries and prune against moto's server on 127.0.0.1.

Request counts are what carries over to real S3 (each request is a round trip, tens of milliseconds away
from a region); times are moto's, whose server spends about half a millisecond per key serializing a
listing, so they say little about S3 and are reported beside a bare listing of the same pages through the
same client. Buckets are filled before the server starts (``moto_seeded``); entries are put directly,
not published one by one.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from ckpt.adapters.s3 import S3Store
from ckpt.application.following import follow
from ckpt.domain.errors import ExistsError
from ckpt.domain.names import format_entry_name
from moto_seeded import RequestCounter, describe, moto_server, store_client
from run import Context, Row, benchmark, entry_at, ms, ratio, size_label

PUBLISH_SAVE = "exec/9.4109.0/checkpoint-500"  # the save every publish row publishes (one object under it)
PUBLISH_EPOCH = 9
KEEP = 10
# (removed entries, objects in each removed save): one sharded save, then many small ones.
PRUNES = ((1, 1500), (100, 2))
# The 100 x 2 prune again with a round trip added to every request (client-side, as a network would): where
# the listings' concurrency shows. The old sequential prune sent 206 requests one after the other (203, and
# the prune journal's 3).
LATENCY_SECONDS = 0.03
SEQUENTIAL_REQUESTS = 206
LATENCY_BUCKET = "ckpt-bench-prune-latency"


def _bucket(size: int) -> str:
    return f"ckpt-bench-{size}"


def _prune_bucket(removed: int) -> str:
    return f"ckpt-bench-prune-{removed}"


def s3_sizes(ctx: Context) -> tuple[int, ...]:
    """S3 listings are slow on moto (about half a second a page): at most 10k, and only 1k with --quick."""
    sizes = tuple(size for size in ctx.sizes if size <= (1_000 if ctx.quick else 10_000))
    return sizes or (1_000,)


def _seed(ctx: Context) -> dict[str, dict[str, bytes]]:
    seed: dict[str, dict[str, bytes]] = {}
    for size in s3_sizes(ctx):
        objects = {f"pub/{format_entry_name(entry_at(i))}": b"" for i in range(size)}
        objects[f"{PUBLISH_SAVE}/model.safetensors"] = b"weights"
        seed[_bucket(size)] = objects
    for removed, per_save in PRUNES:
        objects = {}
        for i in range(removed + KEEP):
            entry = entry_at(i)
            objects[f"pub/{format_entry_name(entry)}"] = b""
            count = per_save if i < removed else 1  # the oldest ``removed`` entries go
            for n in range(count):
                objects[f"{entry.save}/shard-{n:05d}.distcp"] = b"x"
        seed[_prune_bucket(removed)] = objects
        if (removed, per_save) == (100, 2):
            seed[LATENCY_BUCKET] = dict(objects)
    return seed


class _Timed:
    """Wall time, this process's CPU time and the requests of each call, per function."""

    def __init__(self, counter: RequestCounter) -> None:
        self.counter = counter
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.requests: list[Counter[str]] = []
        self.last: object = None  # what the last call returned

    def __call__(self, fn: Callable[[], object]) -> object:
        """Call ``fn`` and record it, also when it raises (the error then propagates)."""
        with self.counter.window() as sent:
            self.requests.append(sent)  # filled in when the window closes
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                self.last = fn()
                return self.last
            finally:
                self.cpu.append(time.process_time() - cpu)
                self.wall.append(time.perf_counter() - wall)

    def shown(self, how: str = "best") -> str:
        wall = min(self.wall) if how == "best" else statistics.median(self.wall)
        cpu = min(self.cpu) if how == "best" else statistics.median(self.cpu)
        runs = len(self.wall)
        label = "1 run" if runs == 1 else f"{how} of {runs}"
        return f"{ms(wall)} {label} (client CPU {ms(cpu)})"

    def best(self) -> float:
        return min(self.wall)

    def same_requests(self) -> Counter[str] | None:
        """The requests of every call, when all calls sent the same ones."""
        first = self.requests[0]
        return first if all(sent == first for sent in self.requests) else None


def _rounds(ctx: Context, size: int) -> int:
    if size > 1_000:
        return 1  # ~10 pages of half a second each on moto
    return 2 if ctx.quick else 3


def _bare_listing(client: Any, bucket: str) -> str:
    """The floor on S3: the same ListObjectsV2 pages resolve asks for, keeping the greatest key."""
    params: dict[str, Any] = {"Bucket": bucket, "Prefix": "pub/", "Delimiter": "/", "MaxKeys": 1000}
    latest = ""
    while True:
        page = client.list_objects_v2(**params)
        latest = max([latest, *(obj["Key"] for obj in page.get("Contents", ()))])
        if not page.get("IsTruncated"):
            return latest
        params["ContinuationToken"] = page["NextContinuationToken"]


def _listing_rows(ctx: Context, client: Any, counter: RequestCounter, size: int, warm: bool) -> list[Row]:
    store = S3Store(f"s3://{_bucket(size)}", client)
    floor, resolve, entries = (_Timed(counter) for _ in range(3))
    calls = [(resolve, store.resolve), (entries, store.entries)]
    if size <= 1_000:  # the floor costs as much as resolve; at 10k that is ten more seconds of moto
        calls.insert(0, (floor, lambda: _bare_listing(client, _bucket(size))))
    if warm:  # the first requests of a client load its endpoint rules and open the connection
        for _, fn in calls:
            fn()
    for _ in range(_rounds(ctx, size)):
        for timed, fn in calls:
            timed(fn)
    pages = math.ceil(size / 1000)
    label = size_label(size)
    base = f"{floor.shown()} (bare ListObjectsV2 pages, same client)" if floor.wall else "-"
    resolve_sent = resolve.same_requests()
    expected = entry_at(size - 1)
    note = "" if resolve.last == expected else f"resolve returned {resolve.last}, expected {expected}"
    return [
        Row(
            "S3 resolve",
            label,
            f"{resolve.shown()}; {describe(resolve_sent or resolve.requests[0])}",
            base,
            ratio(resolve.best(), floor.best()) if floor.wall else "-",
            f"= ceil(n/1000) = {pages} ListObjectsV2, nothing else",
            resolve_sent == Counter({"ListObjectsV2": pages}) and not note,
            note,
        ),
        Row(
            "S3 entries",
            label,
            f"{entries.shown()}; {describe(entries.requests[0])}",
            base,
            ratio(entries.best(), floor.best()) if floor.wall else "-",
        ),
    ]


FOLLOW_INTERVAL = 0.05  # seconds; short, so that the row takes a fraction of a second plus moto's pages


def _follow_row(ctx: Context, client: Any, counter: RequestCounter, size: int) -> Row:
    """``follow`` with nothing published meanwhile: what each interval costs on the wire."""
    store = S3Store(f"s3://{_bucket(size)}", client)
    listings = 3 if ctx.quick else 5
    stop = threading.Event()
    done: list[None] = []

    class CountedListings:
        """The store as ``follow`` sees it, counting its listings and stopping after enough of them."""

        root = store.root

        def entries(self) -> Any:
            listed = store.entries()
            done.append(None)
            if len(done) > listings:  # the listing of "now", then ``listings`` intervals
                stop.set()
            return listed

    with counter.window() as sent:
        wall = time.perf_counter()
        found = list(follow(CountedListings(), interval=FOLLOW_INTERVAL, stop=stop))
        wall = time.perf_counter() - wall
    pages = math.ceil(size / 1000)
    intervals = len(done) - 1
    note = f"yielded {len(found)} entries, expected none" if found else ""
    return Row(
        "S3 follow, nothing new",
        size_label(size),
        f"{intervals} intervals of {FOLLOW_INTERVAL:g}s after the listing of now, {ms(wall)} in all; "
        f"{describe(sent)}",
        target=f"1 listing per interval = {pages} ListObjectsV2 each, nothing else",
        passed=sent == Counter({"ListObjectsV2": pages * len(done)}) and not note,
        note=note,
    )


def _publish_rows(ctx: Context, client: Any, counter: RequestCounter, size: int, step: int) -> list[Row]:
    store = S3Store(f"s3://{_bucket(size)}", client)
    location = f"{store.root}/{PUBLISH_SAVE}"
    timed = _Timed(counter)
    rounds = 3 if ctx.quick else 10
    for n in range(rounds):
        timed(lambda n=n: store.publish(PUBLISH_EPOCH, step + n, location))
    most = max(sum(sent.values()) for sent in timed.requests)
    rows = [
        Row(
            "S3 publish",
            size_label(size),
            f"{timed.shown('median')}; {describe(timed.same_requests() or timed.requests[-1])} each",
            target="<= 2 requests",
            passed=most <= 2,
        )
    ]
    again = _Timed(counter)
    try:
        again(lambda: store.publish(PUBLISH_EPOCH, step, location))
        outcome = "published again?"
    except ExistsError:
        outcome = "ExistsError"
    rows.append(
        Row(
            "S3 publish (already published)",
            size_label(size),
            f"{again.shown()}; {describe(again.requests[0])}; {outcome}",
            target="<= 2 requests",
            passed=sum(again.requests[0].values()) <= 2 and outcome == "ExistsError",
        )
    )
    return rows


def _prune_rows(client: Any, counter: RequestCounter) -> list[Row]:
    rows = []
    for removed, per_save in PRUNES:
        store = S3Store(f"s3://{_prune_bucket(removed)}", client)
        timed = _Timed(counter)
        result = timed(lambda store=store: store.prune(KEEP))
        sent = timed.requests[0]
        # Entries, then every folder's objects batched across folders (s3.py rule 3).
        deletes = math.ceil(removed / 1000) + math.ceil(removed * per_save / 1000)
        folder_lists = removed * math.ceil(per_save / 1000)  # one listing a folder (a page is 1000 keys)
        what = "1 entry + 1 folder" if removed == 1 else f"{removed} entries + {removed} folders"
        done = getattr(result, "removed_entries", ()), getattr(result, "removed_folders", ())
        note = ""
        if (len(done[0]), len(done[1])) != (removed, removed):
            note = f"removed {len(done[0])} entries and {len(done[1])} folders, expected {removed} of each"
        rows.append(
            Row(
                "S3 prune",
                f"keep={KEEP} of {removed + KEEP}: {what} of {per_save:,} objects",
                f"{timed.shown()}; {describe(sent)}",
                target=(
                    f"DeleteObjects = ceil(k/1000) + ceil(all objects/1000) = {deletes}, "
                    f"folder listings = {folder_lists}"
                ),
                passed=sent["DeleteObjects"] == deletes
                # pub/ twice, the prune journal's listing, and pins/ twice (before and after the entries go)
                and sent["ListObjectsV2"] <= folder_lists + 5
                and not note,
                note=note,
            )
        )
    return rows


def _prune_latency_row(client: Any, counter: RequestCounter) -> Row:
    """The 100 x 2 prune with ``LATENCY_SECONDS`` added to each request, against the sequential figure."""

    def round_trip(**_: Any) -> None:
        time.sleep(LATENCY_SECONDS)

    client.meta.events.register("before-send.s3", round_trip, unique_id="bench-round-trip")
    try:
        store = S3Store(f"s3://{LATENCY_BUCKET}", client)
        timed = _Timed(counter)
        timed(lambda: store.prune(KEEP))
    finally:
        client.meta.events.unregister("before-send.s3", unique_id="bench-round-trip")
    sent = timed.requests[0]
    sequential = SEQUENTIAL_REQUESTS * LATENCY_SECONDS  # the old prune's waiting alone, one after the other
    return Row(
        "S3 prune (30 ms round trip)",
        f"keep={KEEP} of 110: 100 entries + 100 folders of 2 objects",
        f"{timed.shown()}; {describe(sent)}",
        baseline=f"{ms(sequential)} ({SEQUENTIAL_REQUESTS} sequential requests x 30 ms, no server time)",
        target="well under the sequential figure (< half)",
        passed=timed.best() < sequential / 2,
    )


@benchmark("s3")
def bench_s3(ctx: Context) -> list[Row]:
    """Requests and time of resolve, entries, publish and prune over moto's server (a subprocess)."""
    listing: list[Row] = []
    publishing: list[Row] = []
    with moto_server(ctx.scratch, _seed(ctx)) as endpoint:
        client = store_client(endpoint)
        counter = RequestCounter(client)
        for n, size in enumerate(s3_sizes(ctx)):
            listing += _listing_rows(ctx, client, counter, size, warm=n == 0)
            listing.append(_follow_row(ctx, client, counter, size))
            # Steps above every seeded entry's, so each publish creates a new, greatest entry.
            publishing += _publish_rows(ctx, client, counter, size, step=10**9)
        prunes = _prune_rows(client, counter)
        prunes.append(_prune_latency_row(client, counter))
    resolves = [row for row in listing if row.benchmark == "S3 resolve"]
    entries = [row for row in listing if row.benchmark == "S3 entries"]
    follows = [row for row in listing if row.benchmark == "S3 follow, nothing new"]
    first_publish = [row for row in publishing if row.benchmark == "S3 publish"]
    again = [row for row in publishing if row.benchmark != "S3 publish"][:1]
    return [*resolves, *entries, *follows, *first_publish, *again, *prunes]
