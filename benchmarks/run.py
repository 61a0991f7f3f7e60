"""The benchmark table: ckpt on POSIX and S3, its watcher, and its peers, each beside a floor or a target.

    .venv/bin/python benchmarks/run.py                # the full table (a few minutes)
    .venv/bin/python benchmarks/run.py --quick        # 1k and 10k entries, fewer repetitions
    .venv/bin/python benchmarks/run.py --out FILE.md  # also write the table as Markdown
    .venv/bin/python benchmarks/run.py --report       # benchmarks/out/report.md, with plots (matplotlib)
    .venv/bin/python benchmarks/run.py --large        # also the sets that take many minutes and GiB

Every timed thing runs beside its baseline in the same run, interleaved round by round, so that a busy
machine slows both alike; the table reports the best round (in-process timings) or the median (whole
processes). Targets are reported as PASS or FAIL, never asserted: this script always exits 0 unless it
cannot run at all. benchmarks/README.md says what each row measures.

Adding rows: write a function that takes a :class:`Context` and returns a list of :class:`Row`, decorated
with ``@benchmark("name")``, either here or in a module ``benchmarks/bench_<topic>.py`` (imported
automatically; it can ``from run import Context, Row, benchmark, best_of, median``). A benchmark that has
a picture to show adds points to ``ctx.chart(...)``; ``--report`` draws every chart as a PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "src"))

from ckpt.adapters.posix import PosixStore  # noqa: E402 - after the path set-up above
from ckpt.domain.entries import Entry  # noqa: E402
from ckpt.domain.names import format_entry_name  # noqa: E402
from ckpt.domain.prune import plan_prune  # noqa: E402

# -- rows and the registry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One line of the table. ``passed`` is None for rows that only inform (no target)."""

    benchmark: str
    size: str
    measured: str
    baseline: str = "-"
    ratio: str = "-"
    target: str = "-"
    passed: bool | None = None
    note: str = ""

    @property
    def result(self) -> str:
        if self.passed is None:
            if self.note.startswith("error"):
                return "ERROR"
            return "SKIP" if self.note.startswith("skipped") else "info"
        return "PASS" if self.passed else "FAIL"


@dataclass
class Chart:
    """A log-log plot for the report: named series of (x, y) points, drawn by ``--report``."""

    title: str
    xlabel: str
    ylabel: str
    series: dict[str, dict[float, float]] = field(default_factory=dict)
    styles: dict[str, dict[str, object]] = field(default_factory=dict)  # label -> matplotlib line options

    def add(self, label: str, x: float, y: float, **style: object) -> None:
        """Add the point (``x``, ``y``) to the series ``label`` (a later point at the same x replaces it).

        ``style`` (``linestyle="--"``, ``color="grey"``) is passed to matplotlib for the series' line.
        """
        self.series.setdefault(label, {})[x] = y
        self.styles.setdefault(label, {}).update(style)


@dataclass
class Context:
    """What every benchmark may use: the options, a scratch folder, and the roots made so far."""

    quick: bool
    sizes: tuple[int, ...]
    scratch: Path
    clock: str = "wall"  # or "cpu" (this process's CPU time, or its children's): steadier on a busy machine
    large: bool = False  # --large: the sets that take many minutes and gigabytes (the tiered 8 GiB)
    python: str = sys.executable
    roots: dict[int, Path] = field(default_factory=dict)
    charts: dict[str, Chart] = field(default_factory=dict)

    def root(self, size: int) -> Path:
        """A checkpoint root whose pub/ holds ``size`` entries, made once per run."""
        if size not in self.roots:
            self.roots[size] = make_root(self.scratch, size)
        return self.roots[size]

    def rounds(self, size: int) -> int:
        """How many interleaved rounds to time at ``size`` entries."""
        if self.quick:
            return 3
        return 15 if size <= 10_000 else 7

    def chart(self, name: str, title: str, xlabel: str, ylabel: str) -> Chart:
        """The chart ``name`` (made on first use); ``--report`` draws it as ``<name>.png``."""
        if name not in self.charts:
            self.charts[name] = Chart(title, xlabel, ylabel)
        return self.charts[name]


Benchmark = Callable[[Context], list[Row]]
REGISTRY: dict[str, Benchmark] = {}


def benchmark(name: str) -> Callable[[Benchmark], Benchmark]:
    """Register a benchmark under ``name``; rows appear in registration order."""

    def register(fn: Benchmark) -> Benchmark:
        REGISTRY[name] = fn
        return fn

    return register


# -- timing helpers ------------------------------------------------------------------------------------------


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
CHILD_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": _children_cpu}


def interleaved(
    fns: Sequence[Callable[[], object]],
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
    *,
    warm_up: bool = True,
) -> list[list[float]]:
    """Run ``fns`` once each to warm up, then ``rounds`` times in turn; return each one's times in seconds.

    ``warm_up=False`` skips the first, untimed run (for calls that take seconds and are already warm).
    """
    for fn in fns if warm_up else ():
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, times, strict=True):
            start = clock()
            fn()
            out.append(clock() - start)
    return times


def best_of(times: Sequence[float]) -> float:
    return min(times)


def median(times: Sequence[float]) -> float:
    return statistics.median(times)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x"


def size_label(size: int) -> str:
    return f"{size // 1000}k entries" if size % 1000 == 0 else f"{size} entries"


# -- a realistic pub/ ----------------------------------------------------------------------------------------


def entry_at(i: int) -> Entry:
    """The i-th publication of a run: a save every 500 steps, a new execution every 2,000 saves."""
    epoch = 1 + i // 2000
    return Entry(epoch, 500 * (i + 1), f"exec/{epoch}.{4100 + epoch}.0/checkpoint-{500 * (i + 1)}")


def make_root(parent: Path, size: int) -> Path:
    """A checkpoint root whose pub/ holds ``size`` entries (empty files, as publish makes them)."""
    root = parent / f"root-{size}"
    pub = root / "pub"
    pub.mkdir(parents=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    for i in range(size):
        os.close(os.open(pub / format_entry_name(entry_at(i)), flags, 0o644))
    return root


def scandir_max(pub: str) -> str:
    """The floor resolve is held to: list pub/ and take the greatest name, validating nothing."""
    with os.scandir(pub) as it:
        return max(d.name for d in it)


# -- benchmarks ----------------------------------------------------------------------------------------------


@benchmark("resolve-entries")
def bench_resolve_entries(ctx: Context) -> list[Row]:
    """resolve and entries over a real pub/, each beside scandir + max() measured in the same rounds."""
    resolve_rows, entries_rows = [], []
    largest = max(ctx.sizes)
    for size in ctx.sizes:
        root = ctx.root(size)
        store = PosixStore(str(root))
        base, res, ent = interleaved(
            [partial(scandir_max, str(root / "pub")), store.resolve, store.entries],
            ctx.rounds(size),
            CLOCKS[ctx.clock],
        )
        b, r, e = best_of(base), best_of(res), best_of(ent)
        shown = size == largest  # the target applies at 100k; smaller runs show it without judging
        resolve_rows.append(
            Row(
                "resolve (strict)",
                size_label(size),
                ms(r),
                f"{ms(b)} (scandir + max)",
                ratio(r, b),
                "<= 1.5x at 100k" if shown else "-",
                r <= 1.5 * b if shown and size >= 100_000 else None,
                _target_note(size) if shown else "",
            )
        )
        entries_rows.append(
            Row("entries (strict, sorted)", size_label(size), ms(e), f"{ms(b)} (scandir + max)", ratio(e, b))
        )
    return resolve_rows + entries_rows


def _target_note(size: int) -> str:
    return "" if size >= 100_000 else "target applies at 100k entries"


@benchmark("plan_prune")
def bench_plan_prune(ctx: Context) -> list[Row]:
    """plan_prune over the largest listing's parsed entries, beside resolve over the same listing."""
    size = max(ctx.sizes)
    store = PosixStore(str(ctx.root(size)))
    entries = store.entries()
    res, prune = interleaved(
        [store.resolve, partial(plan_prune, entries, 10)], ctx.rounds(size), CLOCKS[ctx.clock]
    )
    r, p = best_of(res), best_of(prune)
    return [
        Row(
            "plan_prune(keep=10)",
            size_label(size),
            ms(p),
            f"{ms(r)} (resolve, same rounds)",
            ratio(p, r),
            "<= 5x resolve at 100k",
            p <= 5 * r if size >= 100_000 else None,
            _target_note(size),
        )
    ]


# Run under strace: one resolve between two marks, then the bare scandir + max between the next two. The
# marks are stat() calls on paths that do not exist, easy to find in the trace.
_MARKS = ("/ckpt-bench-mark-resolve", "/ckpt-bench-mark-scandir", "/ckpt-bench-mark-end")
_STRACE_PROGRAM = f"""
import os, sys
sys.path.insert(0, {str(REPO / "src")!r})
from ckpt.adapters.posix import PosixStore
store, pub = PosixStore(sys.argv[1]), os.path.join(sys.argv[1], "pub")
def mark(path):
    try:
        os.stat(path)
    except OSError:
        pass
store.resolve()  # warm up: imports, compiled patterns
mark({_MARKS[0]!r})
store.resolve()
mark({_MARKS[1]!r})
with os.scandir(pub) as it:
    max(d.name for d in it)
mark({_MARKS[2]!r})
"""


def _calls_on(lines: list[str], first: str, last: str, path: str) -> tuple[int, dict[str, int], int]:
    """Count the traced calls between two marks: those on ``path`` (by name), and all of them."""
    begin = next(i for i, line in enumerate(lines) if first in line)
    end = next(i for i, line in enumerate(lines) if last in line)
    calls = [line for line in lines[begin + 1 : end] if "resumed>" not in line]
    by_name: dict[str, int] = {}
    for line in calls:
        if path in line:  # strace -y prints the path of every file descriptor
            match = re.match(r"(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\(", line)
            name = match.group(1) if match else "?"
            by_name[name] = by_name.get(name, 0) + 1
    return sum(by_name.values()), by_name, len(calls)


@benchmark("syscalls")
def bench_syscalls(ctx: Context) -> list[Row]:
    """System calls one resolve makes on pub/ over 10k entries, traced with strace -f -y in a subprocess."""
    size = 10_000
    label, row = size_label(size), "resolve syscalls on pub/"
    strace = shutil.which("strace")
    if strace is None:
        return [Row(row, label, "-", target="< 50", note="skipped: strace not found")]
    root = ctx.root(size)
    trace = ctx.scratch / "strace.txt"
    proc = subprocess.run(
        [strace, "-f", "-y", "-qq", "-o", str(trace), ctx.python, "-c", _STRACE_PROGRAM, str(root)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not trace.exists():
        why = (proc.stderr.strip().splitlines() or ["no trace"])[-1]
        return [Row(row, label, "-", target="< 50", note=f"skipped: {why}")]
    lines = trace.read_text().splitlines()
    pub = str(root / "pub")
    count, by_name, total = _calls_on(lines, _MARKS[0], _MARKS[1], pub)
    base, _, base_total = _calls_on(lines, _MARKS[1], _MARKS[2], pub)
    detail = ", ".join(f"{name} {n}" for name, n in sorted(by_name.items(), key=lambda kv: -kv[1]))
    return [
        Row(
            row,
            label,
            f"{count} ({detail}); {total} in all",
            f"{base} (scandir + max); {base_total} in all",
            ratio(count, base) if base else "-",
            "< 50",
            count < 50,
        )
    ]


def _process_env(pycache: Path) -> dict[str, str]:
    # Bytecode cached in a private folder, so that every command starts warm (as an installed package does)
    # and nothing is written beside the sources.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _ckpt_command(ctx: Context) -> tuple[list[str], list[str], str]:
    """How to run ckpt: as the console script if the venv has one, else ``python -m ckpt``.

    Returns the command, the same arguments for ``python -X importtime``, and a label.
    """
    script = Path(ctx.python).parent / "ckpt"
    if script.exists():
        label = str(script.relative_to(REPO)) if script.is_relative_to(REPO) else str(script)
        return [str(script)], [ctx.python, str(script)], label
    return [ctx.python, "-m", "ckpt"], [ctx.python, "-m", "ckpt"], "python -m ckpt"


@benchmark("startup")
def bench_startup(ctx: Context) -> list[Row]:
    """Whole-process wall time of `ckpt resolve` beside `python -c pass` and `python -c "import attrs"`."""
    root = ctx.root(10)
    env = _process_env(ctx.scratch / "pycache")
    ckpt, ckpt_python, ckpt_label = _ckpt_command(ctx)
    args = ["--root", str(root), "resolve"]
    commands = {
        "pass": [ctx.python, "-c", "pass"],
        "attrs": [ctx.python, "-c", "import attrs"],
        "ckpt": [*ckpt, *args],
    }

    def runner(argv: list[str]) -> Callable[[], object]:
        return lambda: subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)

    runs = 5 if ctx.quick else 15
    runners = [runner(argv) for argv in commands.values()]
    times = dict(zip(commands, interleaved(runners, runs, CHILD_CLOCKS[ctx.clock]), strict=True))
    t_pass, t_attrs, t_ckpt = (median(times[k]) for k in ("pass", "attrs", "ckpt"))

    traced = subprocess.run(
        [ckpt_python[0], "-X", "importtime", *ckpt_python[1:], *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    modules = {line.rsplit("|", 1)[1].strip() for line in traced.stderr.splitlines() if "|" in line}
    modules.discard("imported package")  # the header line
    heavy = sorted(m for m in modules if m.split(".")[0] in {"boto3", "botocore", "hvac", "requests"})
    return [
        Row(
            "`ckpt resolve` process",
            "10 entries",
            f"{ms(t_ckpt)} median ({ckpt_label})",
            f'{ms(t_attrs)} (python -c "import attrs"); {ms(t_pass)} (python -c pass)',
            ratio(t_ckpt, t_attrs),
            '<= 1.5x "import attrs"',
            t_ckpt <= 1.5 * t_attrs,
        ),
        Row(
            "`ckpt resolve` imports",
            "10 entries",
            f"{len(modules)} modules; boto3/botocore/hvac/requests: " + (", ".join(heavy) or "none"),
            target="neither boto3 nor hvac",
            passed=not heavy,
        ),
    ]


# -- the table -----------------------------------------------------------------------------------------------


def machine_info(scratch: Path, load_before: str) -> list[str]:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return [
        (
            f"- machine: {platform.platform()}, {os.cpu_count()} CPUs ({cpu}); "
            f"load average before {load_before}, after {load_average()}"
        ),
        f"- python: {platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        f"- scratch folder: {scratch.parent} ({filesystem_of(scratch)})",
    ]


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def filesystem_of(path: Path) -> str:
    best, kind = "", "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
                best, kind = fields[1], fields[2]
    return kind


def markdown(rows: Sequence[Row]) -> list[str]:
    header = ["benchmark", "size", "measured", "baseline", "ratio", "target", "result"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.benchmark, row.size, row.measured, row.baseline, row.ratio, row.target, row.result]
        if row.note:
            cells[-1] += f" ({row.note})"
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return lines


def discover() -> None:
    """Import every ``benchmarks/bench_*.py``, whose ``@benchmark`` functions then join the registry."""
    sys.modules.setdefault("run", sys.modules[__name__])  # so that `from run import ...` finds this registry
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    for path in sorted(HERE.glob("bench_*.py")):
        importlib.import_module(path.stem)


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-") as folder:
        yield Path(folder)


def run_benchmark(name: str, ctx: Context) -> list[Row]:
    """Run one benchmark; a benchmark that fails becomes one ERROR row, and the others still run."""
    print(f"running {name} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    try:
        rows = REGISTRY[name](ctx)
    except Exception as exc:
        traceback.print_exc()
        why = (str(exc).strip().splitlines() or [""])[0]
        rows = [Row(name, "-", "-", note=f"error: {type(exc).__name__}: {why}")]
    print(f"  {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    return rows


# -- the report ----------------------------------------------------------------------------------------------

REPORT_NAME = "report.md"
MATPLOTLIB_MISSING = (
    "Plots skipped: matplotlib is missing. The `bench` extra installs it: "
    "`.venv/bin/pip install -e '.[bench]'`."
)


def _size_tick(x: float) -> str:
    return f"{x / 1000:g}k" if x >= 1000 else f"{x:g}"


def _time_tick(y: float) -> str:
    return f"{y * 1e3:g} ms" if y < 1 else f"{y:g} s"


def _spread(values: list[float], gap: float) -> list[float]:
    """Move sorted ``values`` up so that neighbours are at least ``gap`` apart (labels would overlap)."""
    out: list[float] = []
    for value in values:
        out.append(max(value, out[-1] + gap) if out else value)
    return out


def draw_charts(charts: dict[str, Chart], folder: Path) -> list[str]:
    """Draw each chart as ``<name>.png`` in ``folder``; return the report's lines that show them.

    matplotlib is imported here, and only here: without it the report says the plots were skipped.
    """
    drawable = {n: c for n, c in charts.items() if any(len(points) > 1 for points in c.series.values())}
    if not drawable:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError:
        return [MATPLOTLIB_MISSING, ""]
    lines: list[str] = []
    for name, chart in drawable.items():
        fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
        # Series drawn (and listed in the legend) from the slowest at the largest x down.
        ordered = sorted(chart.series.items(), key=lambda item: -item[1][max(item[1])])
        xs = sorted({x for _, points in ordered for x in points})
        ys = [y for _, points in ordered for y in points.values()]
        decades = math.log10(max(ys) / min(ys)) if min(ys) > 0 else 1.0
        ends: list[tuple[float, str, str]] = []
        for label, points in ordered:
            x = sorted(points)
            style = {"marker": "o", "linewidth": 1.8, **chart.styles.get(label, {})}
            (line,) = ax.plot(x, [points[k] for k in x], label=label, **style)
            ends.append((math.log10(points[x[-1]]), ms(points[x[-1]]), line.get_color()))
        # Value labels right of the last points, nudged apart where they would overlap.
        ends.sort()
        for (_, text, color), place in zip(ends, _spread([e[0] for e in ends], 0.045 * decades), strict=True):
            ax.annotate(text, (xs[-1] * 1.12, 10**place), va="center", fontsize=8, color=color)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: _size_tick(x)))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: _time_tick(y)))
        ax.set_xlim(xs[0] / 1.5, xs[-1] * 2.2)  # room for the value labels on the right
        ax.set_ylim(min(ys) / 1.5, max(ys) * 1.8)
        ax.set_title(chart.title, fontsize=11)
        ax.set_xlabel(chart.xlabel)
        ax.set_ylabel(chart.ylabel)
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.15)
        ax.legend(fontsize=9, loc="upper left")
        fig.tight_layout()
        fig.savefig(folder / f"{name}.png")
        plt.close(fig)
        lines += [f"![{chart.title}]({name}.png)", ""]
    return lines


def report(header: Sequence[str], rows: Sequence[Row], charts: dict[str, Chart], folder: Path) -> Path:
    """Write ``folder/report.md`` (machine, a verdict per target, every row, plots); return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    results = [row.result for row in rows]
    kinds = ("PASS", "FAIL", "ERROR", "SKIP", "info")
    counts = ", ".join(f"{results.count(kind)} {kind}" for kind in kinds if kind in results)
    judged = [row for row in rows if row.passed is not None or row.result in {"ERROR", "SKIP"}]
    verdicts = [(row.result, row.benchmark, row.size, row.measured, row.target) for row in judged]
    lines = [
        "# ckpt benchmark report",
        "",
        *header,
        f"- results: {counts}",
        "",
        "## Targets",
        "",
        "| result | benchmark | size | measured | target |",
        "|---|---|---|---|---|",
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |" for cells in verdicts),
        "",
        "## Every row",
        "",
        *markdown(rows),
        "",
    ]
    plots = draw_charts(charts, folder)
    if plots:
        lines += ["## Plots", "", *plots]
    path = folder / REPORT_NAME
    path.write_text("\n".join(lines).rstrip("\n") + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k entries, fewer repetitions")
    parser.add_argument(
        "--large",
        action="store_true",
        help="also the sets that take many minutes and gigabytes (tiered: 8 GiB in 8 files on Ceph RGW)",
    )
    parser.add_argument("--out", metavar="FILE", help="also write the table as Markdown to FILE")
    parser.add_argument(
        "--report",
        nargs="?",
        const=str(HERE / "out"),
        metavar="DIR",
        help="write DIR/report.md with every row, PASS/FAIL and plots (default DIR: benchmarks/out/)",
    )
    parser.add_argument("--sizes", help="comma-separated listing sizes (default 1000,10000,100000)")
    parser.add_argument("--only", action="append", metavar="NAME", help="run only this benchmark (repeats)")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time (default), or CPU time: steadier on a machine busy with other work",
    )
    args = parser.parse_args(argv)
    discover()
    sizes = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    if args.sizes:
        sizes = tuple(sorted(int(s) for s in args.sizes.split(",")))
    selected = args.only or list(REGISTRY)
    unknown = sorted(set(selected) - set(REGISTRY))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(REGISTRY)}")

    rows: list[Row] = []
    started, load_before = time.perf_counter(), load_average()
    with scratch_folder() as scratch:
        ctx = Context(quick=args.quick, sizes=sizes, scratch=scratch, clock=args.clock, large=args.large)
        for name in selected:
            rows.extend(run_benchmark(name, ctx))
        info = machine_info(scratch, load_before)
    header = [
        *info,
        (
            f"- run: {'--quick' if args.quick else 'full'}{', --large' if args.large else ''}, "
            f"sizes {', '.join(map(str, sizes))}, "
            f"{time.perf_counter() - started:.0f} s; {args.clock} clock; in-process rows: best of "
            "interleaved rounds, warm cache; process rows: median of interleaved runs"
        ),
    ]
    lines = ["# ckpt benchmarks", "", *header, "", *markdown(rows)]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    if args.report:
        path = report(header, rows, ctx.charts, Path(args.report))
        print(f"report: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
