"""Tiered rows (issue 22): replication and restore against bare boto3 loops with the same concurrency, on
the same files in one run, on moto's server and on Ceph RGW; the verification cost per GiB; and what a
save costs the training thread with the in-process replicator.

    .venv/bin/python benchmarks/run.py --only tiered            # moto: 64 MiB in 16 and 2 files;
                                                                # RGW: 1 GiB in 64 and 8 files
    .venv/bin/python benchmarks/run.py --only tiered --quick    # moto 16 MiB, RGW 256 MiB
    .venv/bin/python benchmarks/run.py --only tiered --large    # and RGW 8 GiB in 8 files (~10 min more,
                                                                # 10 GiB of RAM, 16 GiB of disk)

moto's server (a subprocess on 127.0.0.1) keeps every object in its memory and spends milliseconds of
Python on each request, so its sets are small. Ceph RGW (the tests' one-node cluster, ``tests/support/
rgw.py``; skipped with a row saying so where its binaries are missing) carries the issue's 1 GiB set; its
OSD keeps objects in 4 GiB of RAM, so each copy is deleted (and RGW's garbage collector run) once it has
been read back, before the next goes up; the issue's 8 GiB set runs with ``--large``, on a cluster whose
OSD may hold 10 GiB. boto3's ``upload_file`` loop is the transfer machinery both awscli and ``ckpt`` use.
``aws s3 cp --recursive`` is compared when awscli is there (``CKPT_BENCH_AWS``, the path of its ``aws``,
else ``aws`` on the ``PATH``); it pins its own botocore, so it lives in a venv of its own:

    python3 -m venv .venv-aws && .venv-aws/bin/pip install awscli
    CKPT_BENCH_AWS=.venv-aws/bin/aws .venv/bin/python benchmarks/run.py --only tiered
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.application.replication import manifest_problem, replicate, restore_newer
from ckpt.application.rulebook import find_rule
from ckpt.integrations.core import Publisher, open_job
from ckpt.store import open_tiers, tier_files
from moto_seeded import FAKE_ENV, REGION, moto_server, store_client
from rgw_seeded import gateway, missing_binaries
from run import Context, Row, benchmark, best_of, ms

_MiB = 1 << 20
_CHUNK = 8 * _MiB
CONCURRENCY = 8
ROUNDS = 5
RGW_ROUNDS = 3  # a round moves 1 GiB eight times
LARGE = 8 << 30  # --large: the 8 GiB in 8 files, on RGW only (moto would hold it in its memory)
LARGE_ROUNDS = 2  # a round moves 8 GiB eight times: about 5 minutes here


def _fast_root(scratch: Path, name: str, files: int, total: int) -> PosixStore:
    root = scratch / name
    save = root / "exec" / "a" / "checkpoint-1"
    save.mkdir(parents=True)
    size = total // files
    for i in range(files):
        (save / f"shard-{i:03d}.bin").write_bytes(os.urandom(size))
    (save / "trainer_state.json").write_text('{"global_step": 1}')
    store = PosixStore(str(root))
    store.publish(1, 1, str(save))
    return store


def _bare_uploads(client: Any, bucket: str, folder: Path, prefix: str) -> None:
    """What ``aws s3 cp --recursive`` does: boto3's transfer over every file, ``CONCURRENCY`` at a time."""
    from boto3.s3.transfer import S3Transfer, TransferConfig

    transfer = S3Transfer(client=client, config=TransferConfig(max_concurrency=CONCURRENCY))
    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda p: transfer.upload_file(str(p), bucket, f"{prefix}/{p.name}"), paths))


def _verifying_uploads(client: Any, bucket: str, folder: Path, prefix: str) -> None:
    """The bare loop plus the reads ``ckpt`` verifies with: a SHA-256 pass (the manifest's digest) and an MD5
    pass (the expected ETag) over every file before its upload; no other request."""
    from boto3.s3.transfer import S3Transfer, TransferConfig

    transfer = S3Transfer(client=client, config=TransferConfig(max_concurrency=CONCURRENCY))

    def one(path: Path) -> None:
        for algorithm in ("sha256", "md5"):
            with open(path, "rb") as f:
                hashlib.file_digest(f, algorithm)
        transfer.upload_file(str(path), bucket, f"{prefix}/{path.name}")

    paths = sorted(p for p in folder.rglob("*") if p.is_file())
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, paths))


def _verifying_downloads(client: Any, bucket: str, prefix: str, target: Path) -> None:
    """The bare loop plus what a restore verifies with: each file fsynced and read back for its SHA-256."""
    from boto3.s3.transfer import S3Transfer, TransferConfig

    transfer = S3Transfer(client=client, config=TransferConfig(max_concurrency=CONCURRENCY))
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", ())]
    target.mkdir(parents=True, exist_ok=True)

    def one(key: str) -> None:
        local = target / key.rsplit("/", 1)[1]
        transfer.download_file(bucket, key, str(local))
        with open(local, "rb") as f:
            os.fsync(f.fileno())
            hashlib.file_digest(f, "sha256")

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(one, keys))


def _bare_downloads(client: Any, bucket: str, prefix: str, target: Path) -> None:
    from boto3.s3.transfer import S3Transfer, TransferConfig

    transfer = S3Transfer(client=client, config=TransferConfig(max_concurrency=CONCURRENCY))
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", ())]
    target.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        list(pool.map(lambda k: transfer.download_file(bucket, k, str(target / k.rsplit("/", 1)[1])), keys))


def _aws() -> str | None:
    """The ``aws`` command to compare with, or ``None`` (module docstring)."""
    return os.environ.get("CKPT_BENCH_AWS") or shutil.which("aws")


def _aws_env(scratch: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """awscli's environment: the server's keys, and ``max_concurrent_requests`` set to ``CONCURRENCY``."""
    config = scratch / "aws-config"
    config.write_text(f"[default]\nregion = {REGION}\ns3 =\n    max_concurrent_requests = {CONCURRENCY}\n")
    return {"PATH": os.environ.get("PATH", ""), "AWS_CONFIG_FILE": str(config), **environ}


def _aws_cp(aws: str, endpoint: str, env: dict[str, str], source: str, target: str) -> float:
    """The wall time of one ``aws s3 cp --recursive`` process (its start included)."""
    started = time.perf_counter()
    subprocess.run(
        [aws, "--endpoint-url", endpoint, "s3", "cp", "--recursive", "--only-show-errors", source, target],
        env=env,
        check=True,
    )
    return time.perf_counter() - started


def _aws_start(aws: str, env: dict[str, str]) -> float:
    """The median wall time of ``aws --version``: what a process start costs awscli."""
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        subprocess.run([aws, "--version"], env=env, check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _rate(total: int, seconds: float) -> str:
    return f"{total / seconds / _MiB:.0f} MiB/s ({ms(seconds)})"


@attrs.frozen(slots=True)
class _Server:
    """An S3 server the transfer rows run on: its name in the rows, where it answers, and its keys."""

    name: str
    endpoint: str
    environ: Mapping[str, str] = attrs.field(repr=False)
    # Frees what deleted objects held (RGW defers it to its garbage collector); nothing to do on moto.
    collect: Callable[[], object] = attrs.field(default=lambda: None, repr=False)
    rounds: int = ROUNDS


def _empty(client: Any, bucket: str, server: _Server) -> None:
    """Delete every object in ``bucket`` and have the server free their space: the next copy needs it
    (RGW's memstore OSD holds 4 GiB, four 1 GiB copies a round would not fit)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})
    server.collect()


def _settle(warm: Path | None = None) -> None:
    """Write back what the previous copy left dirty in the page cache, so that no copy pays for another's;
    then read ``warm``'s files once, so that every upload reads them from memory: at 8 GiB the downloads
    before it would otherwise have pushed some out, and one upload would read the disk, another not."""
    os.sync()
    for path in sorted(warm.rglob("*")) if warm is not None else ():
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(_CHUNK):
                    pass


def _transfer_rows(ctx: Context, server: _Server, files: int, total: int) -> list[Row]:
    """The rows of one set of files on one server. In each round every copy goes up, is read back, and is
    deleted before the next one goes up."""
    client = store_client(server.endpoint, server.environ)
    amount = f"{total // _MiB} MiB" if total < 1 << 30 else f"{total >> 30} GiB"
    label = f"{amount} in {files} files"
    fast = _fast_root(ctx.scratch, f"tiered-fast-{server.name.split()[0]}-{files}", files, total)
    save = Path(fast.root) / "exec" / "a" / "checkpoint-1"
    replicated, bare_up, restored, bare_down = [], [], [], []
    verifying_up, verifying_down = [], []
    aws = _aws()
    aws_env = _aws_env(ctx.scratch, server.environ) if aws is not None else {}
    aws_up: list[float] = []
    aws_down: list[float] = []
    for round_ in range(server.rounds):
        bucket = f"tiered-{files}-{round_}"
        client.create_bucket(Bucket=bucket)
        durable = S3Store(f"s3://{bucket}", client)
        tiers = open_tiers(fast, durable)
        with tempfile.TemporaryDirectory(dir=ctx.scratch) as where:
            _settle(save)
            started = time.perf_counter()
            outcome = replicate(
                tiers.fast, tiers.fast_files, tiers.durable, tiers.durable_files, files_in_flight=CONCURRENCY
            )
            replicated.append(time.perf_counter() - started)
            assert outcome.failure is None, outcome
            assert len(outcome.published) == 1, outcome
            target = PosixStore(os.path.join(where, "fast"))
            os.mkdir(target.root)
            pair = open_tiers(target, durable)
            _settle()
            started = time.perf_counter()
            back = restore_newer(
                pair.fast, pair.fast_files, pair.durable, pair.durable_files, find_rule("hf"), than=None
            )
            restored.append(time.perf_counter() - started)
            assert back.entry is not None, back.skipped
            _empty(client, bucket, server)
            shutil.rmtree(target.root)

            _settle(save)
            started = time.perf_counter()
            _bare_uploads(client, bucket, save, "bare")
            bare_up.append(time.perf_counter() - started)
            _settle()
            started = time.perf_counter()
            _bare_downloads(client, bucket, "bare", Path(where) / "bare")
            bare_down.append(time.perf_counter() - started)
            _settle()
            started = time.perf_counter()
            _verifying_downloads(client, bucket, "bare", Path(where) / "verifying")
            verifying_down.append(time.perf_counter() - started)
            _empty(client, bucket, server)
            shutil.rmtree(Path(where) / "bare")
            shutil.rmtree(Path(where) / "verifying")

            _settle(save)
            started = time.perf_counter()
            _verifying_uploads(client, bucket, save, "verifying")
            verifying_up.append(time.perf_counter() - started)
            _empty(client, bucket, server)

            if aws is not None:
                _settle(save)
                aws_up.append(_aws_cp(aws, server.endpoint, aws_env, str(save), f"s3://{bucket}/aws"))
                target_folder = os.path.join(where, "aws")
                _settle()
                aws_down.append(_aws_cp(aws, server.endpoint, aws_env, f"s3://{bucket}/aws", target_folder))
                _empty(client, bucket, server)
        client.delete_bucket(Bucket=bucket)
    shutil.rmtree(fast.root)
    up, up_floor, up_verifying = best_of(replicated), best_of(bare_up), best_of(verifying_up)
    down, down_floor, down_verifying = best_of(restored), best_of(bare_down), best_of(verifying_down)
    where_ = f"({server.name})"
    note = f"best of {server.rounds}; boto3 loop with the same concurrency"
    rows = [
        Row(
            f"tiered replicate {where_}", label, _rate(total, up), _rate(total, up_floor),
            f"{up_floor / up:.2f}x", ">= 0.8x bare boto3", up_floor / up >= 0.8, note,
        ),
        Row(
            f"tiered replicate vs verifying loop {where_}", label, _rate(total, up),
            _rate(total, up_verifying), f"{up_verifying / up:.2f}x",
            note="the bare loop plus a SHA-256 and an MD5 pass over each file",
        ),
        Row(
            f"tiered restore {where_}", label, _rate(total, down), _rate(total, down_floor),
            f"{down_floor / down:.2f}x", ">= 0.8x bare boto3", down_floor / down >= 0.8, note,
        ),
        Row(
            f"tiered restore vs verifying loop {where_}", label, _rate(total, down),
            _rate(total, down_verifying), f"{down_verifying / down:.2f}x",
            note="the bare loop plus an fsync and a SHA-256 read-back of each file",
        ),
    ]  # fmt: skip
    if aws is None:
        return rows
    start = _aws_start(aws, aws_env)
    cli = f"aws s3 cp --recursive, {CONCURRENCY} requests at once; its process start ({ms(start)}) included"
    return [
        *rows,
        Row(
            f"tiered replicate vs aws s3 cp {where_}", label, _rate(total, up), _rate(total, best_of(aws_up)),
            f"{best_of(aws_up) / up:.2f}x", ">= 1x aws s3 cp", best_of(aws_up) / up >= 1, cli,
        ),
        Row(
            f"tiered restore vs aws s3 cp {where_}", label, _rate(total, down),
            _rate(total, best_of(aws_down)), f"{best_of(aws_down) / down:.2f}x", ">= 1x aws s3 cp",
            best_of(aws_down) / down >= 1, cli,
        ),
    ]  # fmt: skip


def _verification_row(ctx: Context, total: int) -> Row:
    fast = _fast_root(ctx.scratch, "tiered-verify", 4, total)
    files = tier_files(fast)
    save = "exec/a/checkpoint-1"
    listing = files.listing(save)
    from ckpt.domain.manifest import MANIFEST_NAME, Manifest, ManifestFile, encode_manifest

    manifest = Manifest.of([ManifestFile(i.path, i.size, files.digest(save, i.path).sha256) for i in listing])
    files.write_small(save, MANIFEST_NAME, encode_manifest(manifest))
    verified, bare = [], []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        assert not isinstance(manifest_problem(files, save, digests=True), str)
        verified.append(time.perf_counter() - started)
        started = time.perf_counter()
        for item in listing:
            with open(os.path.join(fast.root, save, item.path), "rb") as f:
                hashlib.file_digest(f, "sha256")
        bare.append(time.perf_counter() - started)
    per_gib = best_of(verified) * (1 << 30) / total
    return Row(
        "tiered verify --digests (POSIX)", f"{total // _MiB} MiB", f"{ms(per_gib)} per GiB",
        f"{ms(best_of(bare) * (1 << 30) / total)} per GiB", f"{best_of(bare) / best_of(verified):.2f}x",
        note="sizes from one listing, then a SHA-256 of every file; baseline: hashlib over the same files",
    )  # fmt: skip


def _hook_row(ctx: Context) -> Row:
    """What a publication costs the training thread with and without the background replicator."""
    saves = 200 if not ctx.quick else 50
    timings: dict[bool, list[float]] = {True: [], False: []}
    for tiered in (False, True):
        root = ctx.scratch / f"hook-{tiered}"
        (root / "exec" / "a").mkdir(parents=True)
        durable = ctx.scratch / f"hook-durable-{tiered}"
        durable.mkdir()
        job = open_job(
            root=str(root), epoch=1, attempt="a", environ={}, durable=str(durable) if tiered else None
        )
        publisher = Publisher(job, is_main=True)
        for step in range(1, saves + 1):
            save = root / "exec" / "a" / f"checkpoint-{step}"
            save.mkdir()
            (save / "trainer_state.json").write_text(json.dumps({"global_step": step}))
            started = time.perf_counter()
            publisher.publish(step, str(save))
            timings[tiered].append(time.perf_counter() - started)
        publisher.close()
    plain, tiered_cost = sorted(timings[False]), sorted(timings[True])
    extra = tiered_cost[len(tiered_cost) // 2] - plain[len(plain) // 2]
    return Row(
        "tiered in-process hook", f"{saves} saves", f"{ms(tiered_cost[len(tiered_cost) // 2])} a save",
        f"{ms(plain[len(plain) // 2])} without tiers", f"+{extra * 1e3:.3f} ms", "< 1 ms more a save",
        extra < 1e-3, "median publish() on the training thread; the copy runs in the replicator's thread",
    )  # fmt: skip


@benchmark("tiered")
def bench_tiered(ctx: Context) -> list[Row]:
    """Replication and restore vs bare boto3 loops on moto and on Ceph RGW, verification per GiB, the
    in-process hook."""
    small = (16 if ctx.quick else 64) * _MiB
    rows: list[Row] = []
    with moto_server(ctx.scratch, {}) as endpoint:
        moto = _Server("moto", endpoint, FAKE_ENV)
        for files in (8, 2) if ctx.quick else (16, 2):
            rows += _transfer_rows(ctx, moto, files, small)
    missing = missing_binaries()
    if missing:
        rows.append(Row("tiered (Ceph RGW 16.2)", "-", "not run", note=f"missing: {', '.join(missing)}"))
    else:
        sets = [(16, 256 * _MiB), (4, 256 * _MiB)] if ctx.quick else [(64, 1 << 30), (8, 1 << 30)]
        memstore = None
        if ctx.large:
            sets.append((8, LARGE))
            memstore = LARGE + (2 << 30)  # one copy at a time, and what the GC has not freed yet
        with gateway(ctx.scratch / "tiered-rgw", memstore_bytes=memstore) as server:
            environ = {"AWS_ACCESS_KEY_ID": server.access_key, "AWS_SECRET_ACCESS_KEY": server.secret_key}
            for files, total in sets:
                rgw = _Server(
                    "Ceph RGW 16.2", server.endpoint, environ,
                    collect=lambda: server.admin("gc", "process", "--include-all"),
                    rounds=RGW_ROUNDS if total < LARGE else LARGE_ROUNDS,
                )  # fmt: skip
                rows += _transfer_rows(ctx, rgw, files, total)
    rows.append(_verification_row(ctx, small))
    rows.append(_hook_row(ctx))
    return rows


if __name__ == "__main__":  # pragma: no cover - run through run.py
    sys.exit("run it through benchmarks/run.py --only tiered")
