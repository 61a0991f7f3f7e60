"""Watcher rows: what a scan costs when 1k saves are already published and no new one has appeared.

This is the sidecar's steady state: it scans every interval (10 s by default) for the whole run, and almost
every scan finds nothing. A scan then lists the saves folder once and reads nothing inside any save
(watcher.py rule 2): on POSIX, one ``scandir``; on S3, one ``ListObjectsV2`` per 1000 saves. The first scan
of a new watcher also reads ``pub/`` once, to learn what is already published; it has its own row.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections import Counter
from functools import partial
from pathlib import Path

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.application.watcher import Watcher
from ckpt.domain.frameworks import TRAINER_STATE, Framework
from ckpt.domain.names import format_entry_name
from moto_seeded import RequestCounter, describe, moto_server, store_client
from run import CLOCKS, REPO, Context, Row, benchmark, best_of, entry_at, interleaved, ms, ratio

SAVES = 1_000
ATTEMPT = "1.4101.0"  # entry_at(i) for i < 2000 is epoch 1, saved under exec/1.4101.0/
EPOCH = 1
TRAINER_STATE_BODY = b'{"global_step": 0}'
LABEL = "1k published saves"


def _saves(count: int) -> list[str]:
    saves = [entry_at(i).save for i in range(count)]
    assert all(save.startswith(f"exec/{ATTEMPT}/checkpoint-") for save in saves)
    return saves


def make_watched_root(parent: Path, count: int) -> Path:
    """A POSIX root where ``count`` Trainer saves exist and are all published (entries put directly)."""
    root = parent / f"watched-{count}"
    pub = root / "pub"
    pub.mkdir(parents=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for i, save in enumerate(_saves(count)):
        folder = root / save
        folder.mkdir(parents=True)
        fd = os.open(folder / TRAINER_STATE, flags, 0o644)
        try:
            os.write(fd, TRAINER_STATE_BODY)
        finally:
            os.close(fd)
        os.close(os.open(pub / format_entry_name(entry_at(i)), flags, 0o644))
    return root


def _scandir_folders(path: str) -> list[str]:
    """The floor of a scan: the names of the sub-folders of the saves folder."""
    with os.scandir(path) as it:
        return [d.name for d in it if d.is_dir(follow_symlinks=False)]


def _fresh_scan(store: PosixStore | S3Store, saves: str) -> object:
    return Watcher(store, Framework.HF, saves, EPOCH, 10.0).scan()


# -- POSIX ---------------------------------------------------------------------------------------------------

_MARKS = ("/ckpt-bench-mark-scan", "/ckpt-bench-mark-scandir", "/ckpt-bench-mark-end")
_STRACE_PROGRAM = f"""
import os, sys
sys.path.insert(0, {str(REPO / "src")!r})
from ckpt.adapters.posix import PosixStore
from ckpt.domain.frameworks import Framework
from ckpt.application.watcher import Watcher
store = PosixStore(sys.argv[1])
saves = store.exec_dir({ATTEMPT!r})
watcher = Watcher(store, Framework.HF, saves, {EPOCH}, 10.0)
def mark(path):
    try:
        os.stat(path)
    except OSError:
        pass
watcher.scan()  # learns what is published
watcher.scan()  # warm
mark({_MARKS[0]!r})
watcher.scan()
mark({_MARKS[1]!r})
with os.scandir(saves) as it:
    [d.name for d in it if d.is_dir(follow_symlinks=False)]
mark({_MARKS[2]!r})
"""
_CALL = re.compile(r"(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\(")


def _window(lines: list[str], first: str, last: str) -> list[str]:
    begin = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i, line in enumerate(lines) if last in line)
    return [line for line in lines[begin + 1 : end] if "resumed>" not in line]


def _by_name(calls: list[str]) -> Counter[str]:
    return Counter(match.group(1) for line in calls if (match := _CALL.match(line)))


def _syscall_row(ctx: Context, root: Path) -> Row:
    row = "watcher scan syscalls (POSIX)"
    target = "no file inside a save opened or read"
    strace = shutil.which("strace")
    if strace is None:
        return Row(row, LABEL, "-", target=target, note="skipped: strace not found")
    trace = ctx.scratch / "strace-watcher.txt"
    proc = subprocess.run(
        [strace, "-f", "-y", "-qq", "-o", str(trace), ctx.python, "-c", _STRACE_PROGRAM, str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not trace.exists():
        why = (proc.stderr.strip().splitlines() or ["no trace"])[-1]
        return Row(row, LABEL, "-", target=target, note=f"skipped: {why}")
    lines = trace.read_text().splitlines()
    scan, floor = _window(lines, _MARKS[0], _MARKS[1]), _window(lines, _MARKS[1], _MARKS[2])
    saves = str(root / "exec" / ATTEMPT) + "/"
    inside = [line for line in scan if line.startswith(("openat", "open(", "read(")) and saves in line]
    reads = _by_name(scan)["read"]

    def detail(calls: list[str]) -> str:
        names = _by_name(calls)
        return f"{len(calls)} ({', '.join(f'{n} {c}' for n, c in names.most_common())})"

    return Row(
        row,
        LABEL,
        f"{detail(scan)}; {len(inside)} opens inside saves, {reads} reads",
        f"{detail(floor)} (scandir of the saves folder)",
        ratio(len(scan), len(floor)) if floor else "-",
        target,
        not inside and reads == 0,
    )


def _posix_rows(ctx: Context) -> list[Row]:
    root = make_watched_root(ctx.scratch, SAVES)
    store = PosixStore(str(root))
    saves = store.exec_dir(ATTEMPT)
    watcher = Watcher(store, Framework.HF, saves, EPOCH, 10.0)
    learned = watcher.scan()
    if learned:
        raise RuntimeError(f"the first scan published {len(learned)} saves; all were published already")
    rounds = 3 if ctx.quick else 15
    floor, steady, first = interleaved(
        [partial(_scandir_folders, saves), watcher.scan, partial(_fresh_scan, store, saves)],
        rounds,
        CLOCKS[ctx.clock],
    )
    f, s, n = best_of(floor), best_of(steady), best_of(first)
    base = f"{ms(f)} (scandir of the saves folder)"
    return [
        Row("watcher scan, nothing new (POSIX)", LABEL, ms(s), base, ratio(s, f)),
        _syscall_row(ctx, root),
        Row(
            "watcher first scan (POSIX)",
            LABEL,
            ms(n),
            base,
            ratio(n, f),
            note="a new watcher: reads pub/ once (entries), then scans",
        ),
    ]


# -- S3 ------------------------------------------------------------------------------------------------------

_BUCKET = "ckpt-bench-watch"


def _seed() -> dict[str, dict[str, bytes]]:
    objects: dict[str, bytes] = {}
    for i, save in enumerate(_saves(SAVES)):
        objects[f"{save}/{TRAINER_STATE}"] = TRAINER_STATE_BODY
        objects[f"pub/{format_entry_name(entry_at(i))}"] = b""
    return {_BUCKET: objects}


def _s3_rows(ctx: Context) -> list[Row]:
    rounds = 3 if ctx.quick else 5
    with moto_server(ctx.scratch, _seed()) as endpoint:
        client = store_client(endpoint)
        counter = RequestCounter(client)
        store = S3Store(f"s3://{_BUCKET}", client)
        saves = store.exec_dir(ATTEMPT)
        watcher = Watcher(store, Framework.HF, saves, EPOCH, 10.0)
        with counter.window() as first_sent:
            learned = watcher.scan()
        if learned:
            raise RuntimeError(f"the first scan published {len(learned)} saves; all were published already")
        windows: list[Counter[str]] = []

        def steady() -> None:
            with counter.window() as sent:
                watcher.scan()
            windows.append(sent)

        times, first_times = interleaved(
            [steady, partial(_fresh_scan, store, saves)], rounds, CLOCKS["wall"], warm_up=False
        )
    pages = math.ceil(SAVES / 1000)
    sent = windows[0]
    same = all(window == sent for window in windows)
    first_pages = math.ceil(SAVES / 1000) + pages
    return [
        Row(
            "watcher scan, nothing new (S3)",
            LABEL,
            f"{ms(best_of(times))} best of {rounds} (wall); {describe(sent)}",
            target=f"{pages} ListObjectsV2 (ceil(saves/1000)), nothing else",
            passed=same and sent == Counter({"ListObjectsV2": pages}),
            note="" if same else "the scans did not all send the same requests",
        ),
        Row(
            "watcher first scan (S3)",
            LABEL,
            f"{ms(best_of(first_times))} best of {rounds} (wall); {describe(first_sent)}",
            note=f"a new watcher: pub/ once, then the saves folder ({first_pages} pages expected)",
        ),
    ]


@benchmark("watcher")
def bench_watcher(ctx: Context) -> list[Row]:
    """A scan over 1k already-published saves with nothing new: POSIX time and syscalls, S3 requests."""
    return [*_posix_rows(ctx), *_s3_rows(ctx)]
