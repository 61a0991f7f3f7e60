"""Peer rows: ``ckpt resolve`` beside the ways training frameworks find their latest checkpoint.

One tree serves every contender, grown to 1k, 10k and 100k saves in turn and timed at each size, all
contenders interleaved round by round in the same process:

- a ``ckpt`` root whose saves are Hugging Face Trainer folders, ``exec/<attempt>/checkpoint-<step>/`` with a
  ``trainer_state.json`` each, every one published in ``pub/``;
- a torchtitan checkpoint folder, ``step-<step>/`` with a ``.metadata`` each.

The contenders: ``ckpt`` resolve (reads ``pub/`` only), ``ckpt`` verified resolve (``--framework hf``: also
reads the newest save's markers), the floor (``scandir`` of ``pub/`` and ``max`` of the names), Hugging
Face's ``transformers.trainer_utils.get_last_checkpoint`` on the attempt's folder (or, when transformers
cannot be imported, :func:`hf_last_checkpoint`, which does the same work), and a torchtitan-style scan
(:func:`torchtitan_latest_step`). The peers fence no zombie execution, and judge completeness by their
marker at most: ``get_last_checkpoint`` only asks whether each ``checkpoint-<step>`` is a directory.

The trees live on tmpfs (``/dev/shm``) when it is there: on this project's VM, removing the 400k folders and
files of the two 100k trees from ext4 took minutes, longer than the whole benchmark is allowed to run.
Listing a warm directory costs about the same on both (benchmarks/README.md has the numbers).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import resolve_verified
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import METADATA, TRAINER_STATE, Framework
from ckpt.domain.names import format_entry_name
from run import (
    CLOCKS,
    REPO,
    Context,
    Row,
    benchmark,
    best_of,
    filesystem_of,
    interleaved,
    ms,
    ratio,
    scandir_max,
)

ATTEMPT = "1.4101.0"
EPOCH = 1
STEP = 500  # a save every 500 steps
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
MIB = 1024 * 1024

PEERS_NOTE = "no zombie fencing"
HF_NOTE = f"{PEERS_NOTE}; completeness: none (an isdir per entry; trainer_state.json is not looked at)"
TITAN_NOTE = f"{PEERS_NOTE}; completeness: .metadata exists (one stat per entry), nothing more"


# -- the peers -----------------------------------------------------------------------------------------------

_HF_FOLDER = re.compile(r"^checkpoint\-(\d+)$")


def hf_last_checkpoint(folder: str) -> str | None:
    """The newest ``checkpoint-<step>`` folder in ``folder``, found as the Trainer's helper finds it.

    List the folder, keep the names that are exactly ``checkpoint-<digits>`` and that are directories (one
    ``isdir`` each), take the greatest step. Nothing inside a folder is looked at. Used when transformers
    cannot be imported; written here from that description, not copied.
    """
    newest, newest_step = None, -1
    for name in os.listdir(folder):
        match = _HF_FOLDER.search(name)
        if match is None:
            continue
        path = os.path.join(folder, name)
        if os.path.isdir(path) and int(match.group(1)) > newest_step:
            newest, newest_step = path, int(match.group(1))
    return newest


_TITAN_FOLDER = re.compile(r"step-(\d+)")


def torchtitan_latest_step(folder: str) -> int:
    """The greatest step ``N`` whose ``step-N`` folder holds a ``.metadata``, or -1: torchtitan's way.

    List the checkpoint folder, keep the ``step-<digits>`` names, ask for each whether its ``.metadata``
    (written last by DCP) is a file, take the greatest step.
    """
    if not os.path.isdir(folder):
        return -1
    steps = [
        int(match.group(1))
        for name in os.listdir(folder)
        if (match := _TITAN_FOLDER.fullmatch(name)) and os.path.isfile(os.path.join(folder, name, METADATA))
    ]
    return max(steps, default=-1)


def huggingface() -> tuple[Callable[[str], str | None], str]:
    """transformers' ``get_last_checkpoint`` and its label, or our re-implementation when it is not there."""
    try:
        import transformers
        from transformers.trainer_utils import get_last_checkpoint
    except Exception as exc:  # transformers imports torch; any failure means "not importable"
        return hf_last_checkpoint, f"HF get_last_checkpoint (re-implemented: {type(exc).__name__})"
    return get_last_checkpoint, f"HF get_last_checkpoint (transformers {transformers.__version__})"


# -- the trees -----------------------------------------------------------------------------------------------


def _tmpfs_with_room(saves: int) -> Path | None:
    shm = Path("/dev/shm")
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    # About five inodes a save (two folders, three files) and well under a KiB each; ask for a GiB free.
    roomy = stats.f_favail > 6 * saves and stats.f_bavail * stats.f_frsize > 2**30
    return shm if roomy and os.access(shm, os.W_OK) else None


@contextlib.contextmanager
def tree_folder(ctx: Context, saves: int) -> Iterator[Path]:
    """A temporary folder on tmpfs when ``/dev/shm`` has room for the trees, else in the scratch folder."""
    shm = _tmpfs_with_room(saves)
    if shm is None:
        folder = ctx.scratch / "peers"
        folder.mkdir()
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-peers-", dir=shm) as name:
        yield Path(name)


class Trees:
    """The ckpt root with Trainer saves and the torchtitan folder, grown save by save (never shrunk)."""

    def __init__(self, base: Path) -> None:
        self.root = base / "ckpt-root"
        self.pub = self.root / "pub"
        self.hf = self.root / "exec" / ATTEMPT
        self.titan = base / "torchtitan" / "checkpoint"
        for folder in (self.pub, self.hf, self.titan):
            folder.mkdir(parents=True)
        self.count = 0

    def grow(self, count: int) -> None:
        """Add saves until there are ``count``: a folder with its marker in each tree, and the entry."""
        fds = [os.open(folder, _DIR_FLAGS) for folder in (self.pub, self.hf, self.titan)]
        pub, hf, titan = fds
        try:
            for i in range(self.count, count):
                step = STEP * (i + 1)
                entry = Entry(EPOCH, step, f"exec/{ATTEMPT}/checkpoint-{step}")
                os.mkdir(f"checkpoint-{step}", dir_fd=hf)
                fd = os.open(f"checkpoint-{step}/{TRAINER_STATE}", _FLAGS, 0o644, dir_fd=hf)
                try:
                    os.write(fd, json.dumps({"global_step": step}).encode())
                finally:
                    os.close(fd)
                os.close(os.open(format_entry_name(entry), _FLAGS, 0o644, dir_fd=pub))
                os.mkdir(f"step-{step}", dir_fd=titan)
                os.close(os.open(f"step-{step}/{METADATA}", _FLAGS, 0o644, dir_fd=titan))
        finally:
            for fd in fds:
                os.close(fd)
        self.count = count

    @property
    def latest_step(self) -> int:
        return STEP * self.count


# -- memory --------------------------------------------------------------------------------------------------


def traced_peak(fn: Callable[[], object]) -> int:
    """Bytes Python allocated at the peak of one ``fn()`` call, beyond what was allocated before it.

    ``fn`` should be warm (imports done, patterns compiled), as it is after the timed rounds.
    """
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


# A fresh process: warm up on a one-entry root (imports, compiled patterns), then run once on the big root
# and report how far the peak resident set rose. The peak is VmHWM from /proc/self/status, not ru_maxrss:
# Linux carries ru_maxrss across exec, so a child of this process (which holds torch, imported by
# transformers) would report the parent's peak. VmHWM belongs to the new address space.
_PEAK_RSS_PROGRAM = f"""
import json, re, sys
sys.path.insert(0, {str(REPO / "src")!r})
from ckpt.adapters.posix import PosixStore
what, root, small = sys.argv[1:4]
def peak_kib():
    with open("/proc/self/status") as status:
        return int(re.search(r"^VmHWM:\\s+(\\d+) kB", status.read(), re.M).group(1))
calls = {{
    "resolve": lambda root: PosixStore(root).resolve(),
    "entries": lambda root: PosixStore(root).entries(),
}}
calls[what](small)
before = peak_kib()
calls[what](root)
print(json.dumps({{"before_kib": before, "delta_kib": peak_kib() - before}}))
"""


def peak_rss_delta(ctx: Context, what: str, root: Path, small: Path) -> tuple[int, int] | None:
    """(bytes the peak resident set rose, bytes it was at before) for one call in a fresh process, or None."""
    if not Path("/proc/self/status").exists():
        return None
    proc = subprocess.run(
        [ctx.python, "-c", _PEAK_RSS_PROGRAM, what, str(root), str(small)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return None
    answer = json.loads(proc.stdout)
    return answer["delta_kib"] * 1024, answer["before_kib"] * 1024


def _label(saves: int) -> str:
    return f"{saves // 1000}k saves" if saves % 1000 == 0 else f"{saves} saves"


def _mib(size: float) -> str:
    return f"{size / MIB:.1f} MiB" if size >= MIB else f"{size / 1024:.1f} KiB"


def _memory_rows(ctx: Context, trees: Trees, contenders: dict[str, Callable[[], object]]) -> list[Row]:
    small = trees.root.parent / "one-entry-root"
    (small / "pub").mkdir(parents=True)
    (small / "pub" / format_entry_name(Entry(1, 1, "exec/a/checkpoint-1"))).touch()
    label = _label(trees.count)
    base = f"{_mib(traced_peak(contenders['floor']))} traced"
    rows = []
    for name, fn in contenders.items():
        if name == "floor":
            continue
        measured = f"{_mib(traced_peak(fn))} traced peak"
        kind = "resolve" if name == "ckpt resolve" else "entries" if name.startswith("ckpt entries") else ""
        rss = peak_rss_delta(ctx, kind, trees.root, small) if kind else None
        if rss is not None:
            measured += f"; peak RSS +{_mib(rss[0])} in a fresh process (from {_mib(rss[1])})"
        rows.append(
            Row(
                f"memory: {name}",
                label,
                measured,
                f"{base} (scandir + max of pub/)",
                note="traced: Python allocations at the call's peak (tracemalloc); peak RSS: VmHWM",
            )
        )
    return rows


# -- the benchmark -------------------------------------------------------------------------------------------


def _series(name: str) -> tuple[str, dict[str, object]]:
    """The chart label and line style of a contender: ckpt solid, the floor dotted grey, the peers dashed."""
    if name == "floor":
        return "scandir + max of pub/ (floor: validates nothing)", {"linestyle": ":", "color": "grey"}
    if name.startswith("ckpt"):
        return name, {"color": "tab:cyan" if "--framework" in name else "tab:blue"}
    return name, {"linestyle": "--", "color": "tab:orange" if name.startswith("HF") else "tab:purple"}


@benchmark("peers")
def bench_peers(ctx: Context) -> list[Row]:
    """ckpt resolve vs. HF get_last_checkpoint vs. a torchtitan-style scan at 1k, 10k, 100k saves."""
    get_last_checkpoint, hf_label = huggingface()
    largest = max(ctx.sizes)
    with tree_folder(ctx, largest) as base:
        trees = Trees(base)
        store = PosixStore(str(trees.root))
        contenders: dict[str, Callable[[], object]] = {
            "floor": partial(scandir_max, str(trees.pub)),
            "ckpt resolve": store.resolve,
            "ckpt resolve --framework hf": partial(resolve_verified, store, Framework.HF),
            hf_label: partial(get_last_checkpoint, str(trees.hf)),
            "torchtitan-style scan": partial(torchtitan_latest_step, str(trees.titan)),
        }
        fs = filesystem_of(base)
        chart = ctx.chart(
            "latest-checkpoint",
            f"Finding the latest checkpoint: best of interleaved rounds, warm cache, {fs}",
            "saves in the folder",
            "time per call",
        )
        by_name: dict[str, list[Row]] = {name: [] for name in contenders}
        for size in ctx.sizes:
            started = time.perf_counter()
            trees.grow(size)
            grown = time.perf_counter()
            answers: dict[str, object] = {}
            calls = [partial(_keep_answer, answers, name, fn) for name, fn in contenders.items()]
            times = interleaved(calls, _rounds(ctx, size), CLOCKS[ctx.clock])
            print(
                f"  peers, {size} saves: trees {grown - started:.1f} s, "
                f"timing {time.perf_counter() - grown:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            best = {name: best_of(t) for name, t in zip(contenders, times, strict=True)}
            for name, seconds in best.items():
                label, style = _series(name)
                chart.add(label, size, seconds, **style)
            wrong = _disagreements(answers, trees.latest_step, hf_label)
            label = _label(size)
            floor, ckpt = best["floor"], best["ckpt resolve"]
            by_name["ckpt resolve"].append(
                Row(
                    "latest: ckpt resolve",
                    label,
                    ms(ckpt),
                    f"{ms(floor)} (scandir + max of pub/)",
                    ratio(ckpt, floor),
                    note=f"trees on {fs}" + (f"; {wrong}" if wrong else ""),
                )
            )
            notes = {
                "ckpt resolve --framework hf": "reads every entry, then the newest save's markers",
                hf_label: HF_NOTE,
                "torchtitan-style scan": TITAN_NOTE,
            }
            for name, note in notes.items():
                by_name[name].append(
                    Row(
                        f"latest: {name}",
                        label,
                        ms(best[name]),
                        f"{ms(ckpt)} (ckpt resolve)",
                        ratio(best[name], ckpt),
                        note=note,
                    )
                )
        started = time.perf_counter()
        # Verified resolve reads entries() first, so its peak is that of entries: not measured twice.
        memory_of = {
            "ckpt resolve": store.resolve,
            "ckpt entries (and so resolve --framework hf)": store.entries,
            hf_label: contenders[hf_label],
            "torchtitan-style scan": contenders["torchtitan-style scan"],
            "floor": contenders["floor"],
        }
        memory = _memory_rows(ctx, trees, memory_of)
        print(f"  peers memory: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return [row for rows in by_name.values() for row in rows] + memory


def _rounds(ctx: Context, size: int) -> int:
    """As for the other in-process rows, but 3 at 100k: a round there is 3 to 5 s of peers."""
    return min(ctx.rounds(size), 3) if size > 10_000 else ctx.rounds(size)


def _keep_answer(answers: dict[str, object], name: str, fn: Callable[[], object]) -> None:
    answers[name] = fn()


def _disagreements(answers: dict[str, object], step: int, hf_label: str) -> str:
    """Say which contenders did not find the newest save, at ``step`` (all should)."""
    verified = getattr(answers["ckpt resolve --framework hf"], "entry", None)
    found = {
        "ckpt resolve": getattr(answers["ckpt resolve"], "step", None),
        "ckpt resolve --framework hf": getattr(verified, "step", None),
        hf_label: str(answers[hf_label]).rpartition("-")[2],
        "torchtitan-style scan": answers["torchtitan-style scan"],
    }
    wrong = [name for name, value in found.items() if str(value) != str(step)]
    return f"did not find step {step}: {', '.join(wrong)}" if wrong else ""
