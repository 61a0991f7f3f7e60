"""Framework-rule rows: the first complete scan of a 1,000-shard DeepSpeed save on S3, and the scan after it.

A DeepSpeed save is complete when ``latest`` names its tag and every shard is a complete zip; on S3 the
watcher reads each shard's zip end record with one ranged GET (the last 64 KiB at most), at most 16 at a
time, and never a whole shard. The first complete scan therefore costs about one request per shard plus a
handful; the scan after the publication costs one listing, as for any rule (watcher.py rule 2).
"""

from __future__ import annotations

import io
import time
import zipfile
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from ckpt.adapters.s3 import S3Store
from ckpt.application.watcher import Watcher
from ckpt.domain.rules.deepspeed import DeepSpeedRule
from moto_seeded import RequestCounter, describe, moto_server, store_client
from run import Context, Row, benchmark, ms

SHARDS = 1_000
ATTEMPT = "1.4101.0"
EPOCH = 1
TAG = "global_step10"
LABEL = f"{SHARDS:,}-shard DeepSpeed save"
_BUCKET = "ckpt-bench-rules"


def _shard(rank: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", bytes([rank % 251]) * 4096)
    return buffer.getvalue()


@benchmark("rules")
def bench_rules(ctx: Context) -> list[Row]:
    """The first complete scan of a 1,000-shard DeepSpeed save on S3 (requests, time) and the one after."""
    with moto_server(ctx.scratch, {_BUCKET: {}}) as endpoint:
        client = store_client(endpoint)
        store = S3Store(f"s3://{_BUCKET}", client)
        saves = store.exec_dir(ATTEMPT)
        prefix = saves[len(f"s3://{_BUCKET}/") :]
        names = ["mp_rank_00_model_states.pt"]
        names += [f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" for rank in range(SHARDS - 1)]

        def put(name: str) -> None:
            client.put_object(Bucket=_BUCKET, Key=f"{prefix}/{TAG}/{name}", Body=_shard(len(name)))

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(put, names))
        client.put_object(Bucket=_BUCKET, Key=f"{prefix}/latest", Body=TAG.encode())

        counter = RequestCounter(client)
        watcher = Watcher(store, DeepSpeedRule(world_size=SHARDS - 1), saves, EPOCH, 10.0)
        with counter.window() as first:
            started = time.perf_counter()
            created = watcher.scan()
            first_time = time.perf_counter() - started
        with counter.window() as after:
            started = time.perf_counter()
            again = watcher.scan()
            after_time = time.perf_counter() - started
    gets = first.get("GetObject", 0)
    return [
        Row(
            "deepspeed first complete scan (S3)",
            LABEL,
            f"{ms(first_time)} (wall); {describe(first)}",
            target=f"published; {SHARDS} ranged GETs (shard tails) + 1 (latest), never a whole shard",
            passed=[e.step for e in created] == [10] and gets == SHARDS + 1,
            note="tails read 16 at a time",
        ),
        Row(
            "deepspeed scan after publication (S3)",
            LABEL,
            f"{ms(after_time)} (wall); {describe(after)}",
            target="1 ListObjectsV2, nothing else",
            passed=again == [] and after == Counter({"ListObjectsV2": 1}),
        ),
    ]
