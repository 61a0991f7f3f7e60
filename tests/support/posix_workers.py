"""Code the POSIX crash and race tests run in child processes: a resumable trainer, publishers, a pruner.

Run from ``tests/`` as ``python -m support.posix_workers COMMAND ...`` (the tests do so with ``cwd``):

* ``trainer``: writes saves file by file into ``--saves`` until killed or ``--count`` saves are written.
  Started again after a SIGKILL, it reads its events file and goes on with the save after the last one it
  began, so the save it was killed in stays half-written forever (see *Saves* below).
* ``publish``: publishes a list of ``(epoch, step, save)`` jobs once every worker is ready, and reports each
  attempt's outcome.
* ``cli-publish``: runs ``ckpt``'s own ``main`` with the given arguments once every worker is ready, and exits
  with its exit code (the command line, with a start barrier a shell cannot give).
* ``publish-new``: writes a new save and publishes it, over and over, at rising steps.
* ``prune``: runs ``prune(keep)`` in a loop until a stop file appears, checking after every prune that each
  remaining entry's folder still holds all its files.

Barrier: ``publish`` and ``cli-publish`` workers import ``ckpt``, open their store, print ``ready`` and block
on a line from stdin; the parent writes ``go`` to all of them once every one is ready. Race workers never
raise: they report what happened as one JSON document on stdout, so the parent can count and compare.

Saves (``trainer``): the save at plan index ``i`` has step ``10 * (i + 1)``. Every kind completes with one
last operation, before which the framework's markers say "incomplete"; a save killed at any point before it
can therefore never be judged complete by the marker rule:

* ``hf`` ``state_last``: every rank's file, then ``trainer_state.json`` in two halves (a reader can see
  invalid JSON in between); the second half completes it.
* ``hf`` ``sentinel``: ``checkpoint-is-incomplete.txt`` first; ``trainer_state.json`` mid-way, a late rank
  still writing after it; removing the sentinel completes it.
* ``hf`` ``staged``: written as ``tmp-checkpoint-<step>`` (not a save name), renamed into place at the end.
* ``dcp`` ``plain``: two rank shards in chunks, ``.metadata.tmp``, then the rename to ``.metadata``.

A complete save holds exactly :func:`manifest` (names and bytes). The trainer never touches a save again once
it is complete. Events, one JSON line per ``write`` (a kill never leaves half a line): ``{"index", "save",
"kind", "started"}`` before the first write of a save, ``{"index", "completing_at"}`` just before the
operation that completes it (so it was not complete before that time), ``{"index", "complete_at"}`` after
it, and ``{"finished": true}`` when ``--count`` saves are written. Times are ``time.time()``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = [
    "HF_KINDS",
    "SAVE_FILES",
    "folder_of",
    "kind_of",
    "manifest",
    "read_files",
    "step_of",
]

TRAINER_STATE = "trainer_state.json"
SENTINEL = "checkpoint-is-incomplete.txt"
HF_KINDS = ("state_last", "sentinel", "staged")
CHUNK = 64  # bytes per write: tiny saves keep the rounds fast
# The files of every save the prune race publishes; the checks look for all of them, byte for byte.
SAVE_FILES: dict[str, bytes] = {"model.safetensors": b"w" * 96, "optimizer.pt": b"o" * 48}


# -- the trainer's saves ----------------------------------------------------------------------------------


def step_of(index: int) -> int:
    """The step of the save at plan index ``index``."""
    return 10 * (index + 1)


def kind_of(framework: str, index: int) -> str:
    """The kind of the save at plan index ``index``."""
    return HF_KINDS[index % len(HF_KINDS)] if framework == "hf" else "plain"


def folder_of(framework: str, index: int) -> str:
    """The folder name the save at ``index`` has once complete (``checkpoint-<step>`` / ``step-<step>``)."""
    return f"checkpoint-{step_of(index)}" if framework == "hf" else f"step-{step_of(index)}"


def _pattern(name: str, size: int, step: int) -> bytes:
    """The bytes of file ``name`` of the save at ``step``: distinct per file and per save."""
    seed = sum(name.encode()) + step
    return bytes((seed + i) % 251 for i in range(size))


def _state(step: int) -> bytes:
    return json.dumps({"global_step": step, "log_history": [{"loss": 0.5, "step": step}]}).encode()


def _sizes(framework: str) -> dict[str, int]:
    if framework == "hf":
        return {"config.json": 0, "model.safetensors": 4 * CHUNK, "rng_state_1.pth": 3 * CHUNK,
                "optimizer.pt": 2 * CHUNK}  # fmt: skip
    return {"__0_0.distcp": 3 * CHUNK, "__1_0.distcp": 3 * CHUNK}


def manifest(framework: str, index: int) -> dict[str, bytes]:
    """Every file of the complete save at ``index``, by path inside the save, with its exact bytes."""
    step = step_of(index)
    files = {name: _pattern(name, size, step) for name, size in _sizes(framework).items()}
    if framework == "hf":
        files["config.json"] = b'{"model_type": "gpt2"}'
        files[TRAINER_STATE] = _state(step)
    else:
        files[".metadata"] = b"pickled metadata %d" % step
    return files


def read_files(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder``, by path relative to it, with its bytes (``{}`` if missing)."""
    files: dict[str, bytes] = {}
    for dirpath, _dirnames, filenames in os.walk(folder):
        for name in filenames:
            path = Path(dirpath, name)
            try:
                files[path.relative_to(folder).as_posix()] = path.read_bytes()
            except FileNotFoundError:
                files[path.relative_to(folder).as_posix()] = b"<vanished while read>"
    return files


class ResumableTrainer:
    """Writes the plan's saves, ``pace`` seconds between writes and ``gap`` between saves."""

    def __init__(self, framework: str, saves: str, events: str, *, pace: float, gap: float) -> None:
        self.framework = framework
        self.saves = saves
        self.events = events
        self.pace = pace
        self.gap = gap

    def _event(self, **document: object) -> None:
        fd = os.open(self.events, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, (json.dumps(document) + "\n").encode())
        finally:
            os.close(fd)

    def _tick(self) -> None:
        time.sleep(self.pace)

    def _grow(self, path: str, data: bytes) -> None:
        """Append ``data`` a chunk at a time, each chunk visible before the next."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            for offset in range(0, len(data), CHUNK):
                os.write(fd, data[offset : offset + CHUNK])
                self._tick()
        finally:
            os.close(fd)

    def _put(self, path: str, data: bytes) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._tick()

    def _half_state(self, path: str, state: bytes) -> Callable[[], None]:
        """Write the first half of ``trainer_state.json``; return what writes the second half."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        half = len(state) // 2
        os.write(fd, state[:half])
        self._tick()

        def finish() -> None:
            try:
                os.write(fd, state[half:])
            finally:
                os.close(fd)

        return finish

    def write(self, index: int) -> None:
        """Write the save at plan index ``index``, recording when it starts, is completing and is complete."""
        kind, name = kind_of(self.framework, index), folder_of(self.framework, index)
        self._event(index=index, save=name, kind=kind, started=time.time())
        files = manifest(self.framework, index)
        if self.framework == "dcp":
            complete = self._write_dcp(name, files)
        elif kind == "state_last":
            complete = self._write_state_last(name, files)
        elif kind == "sentinel":
            complete = self._write_sentinel(name, files)
        else:
            complete = self._write_staged(name, files)
        self._tick()
        self._event(index=index, completing_at=time.time())
        complete()
        self._event(index=index, complete_at=time.time())

    def _ranks(self, folder: str, files: dict[str, bytes], names: tuple[str, ...]) -> None:
        for name in names:
            self._grow(os.path.join(folder, name), files[name])

    def _write_state_last(self, name: str, files: dict[str, bytes]) -> Callable[[], None]:
        folder = os.path.join(self.saves, name)
        os.makedirs(folder)
        self._put(os.path.join(folder, "config.json"), files["config.json"])
        self._ranks(folder, files, ("model.safetensors", "rng_state_1.pth", "optimizer.pt"))
        return self._half_state(os.path.join(folder, TRAINER_STATE), files[TRAINER_STATE])

    def _write_sentinel(self, name: str, files: dict[str, bytes]) -> Callable[[], None]:
        folder = os.path.join(self.saves, name)
        os.makedirs(folder)
        self._put(os.path.join(folder, SENTINEL), b"")
        self._put(os.path.join(folder, "config.json"), files["config.json"])
        self._ranks(folder, files, ("model.safetensors",))
        self._half_state(os.path.join(folder, TRAINER_STATE), files[TRAINER_STATE])()
        self._tick()
        self._ranks(folder, files, ("rng_state_1.pth", "optimizer.pt"))  # late ranks
        return lambda: os.unlink(os.path.join(folder, SENTINEL))

    def _write_staged(self, name: str, files: dict[str, bytes]) -> Callable[[], None]:
        staging = os.path.join(self.saves, f"tmp-{name}")
        os.makedirs(staging)
        self._put(os.path.join(staging, "config.json"), files["config.json"])
        self._ranks(staging, files, ("model.safetensors",))
        self._half_state(os.path.join(staging, TRAINER_STATE), files[TRAINER_STATE])()
        self._ranks(staging, files, ("rng_state_1.pth", "optimizer.pt"))
        return lambda: os.rename(staging, os.path.join(self.saves, name))

    def _write_dcp(self, name: str, files: dict[str, bytes]) -> Callable[[], None]:
        folder = os.path.join(self.saves, name)
        os.makedirs(folder)
        self._ranks(folder, files, ("__0_0.distcp", "__1_0.distcp"))
        self._put(os.path.join(folder, ".metadata.tmp"), files[".metadata"])
        return lambda: os.rename(os.path.join(folder, ".metadata.tmp"), os.path.join(folder, ".metadata"))

    def next_index(self) -> int:
        """The plan index after the last save begun (0 for a fresh start): a killed save is never resumed."""
        try:
            with open(self.events) as f:
                started = [json.loads(line).get("index", -1) for line in f if '"started"' in line]
        except FileNotFoundError:
            return 0
        return max(started, default=-1) + 1

    def run(self, count: int) -> None:
        """Write saves from :meth:`next_index` until ``count`` saves exist in the plan, then record it."""
        os.makedirs(self.saves, exist_ok=True)
        for index in range(self.next_index(), count):
            self.write(index)
            time.sleep(self.gap)
        self._event(finished=True)


# -- race workers ---------------------------------------------------------------------------------------


def _wait_for_go() -> None:
    """The start barrier: say ``ready``, then block until the parent says ``go``."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    line = sys.stdin.readline()
    if line.strip() != "go":
        raise SystemExit(f"expected 'go' on stdin, got {line!r}")


def _entry_triple(entry: Any) -> list[Any]:
    return [entry.epoch, entry.step, entry.save]


def publish_jobs(root: str, jobs: list[list[Any]]) -> dict[str, Any]:
    """Publish every ``[epoch, step, save]`` of ``jobs`` in order; return one outcome per job."""
    from ckpt.adapters.posix import PosixStore
    from ckpt.domain.errors import ExistsError

    store = PosixStore(root)
    store.resolve()  # warm up: imports and the first listing happen before the barrier
    _wait_for_go()
    outcomes: list[dict[str, Any]] = []
    for epoch, step, save in jobs:
        try:
            entry = store.publish(epoch, step, f"{root}/{save}")
        except ExistsError as exc:
            outcomes.append(
                {"job": [epoch, step, save], "outcome": "exists", "entry": _entry_triple(exc.entry)}
            )
        except Exception as exc:  # reported to the parent, which fails the test with it
            outcomes.append({"job": [epoch, step, save], "outcome": "error", "detail": repr(exc)})
        else:
            outcomes.append({"job": [epoch, step, save], "outcome": "won", "entry": _entry_triple(entry)})
    return {"pid": os.getpid(), "outcomes": outcomes}


def cli_publish(argv: list[str]) -> int:
    """Run ``ckpt ARGV`` through ``ckpt.cli.main`` after the barrier; return its exit code."""
    from ckpt.cli import main

    _wait_for_go()
    return main(argv)


def publish_new_saves(root: str, worker: int, workers: int, count: int, seed: int) -> dict[str, Any]:
    """Write and publish ``count`` new saves ``exec/w<worker>/ck-<i>`` at steps ``i * workers + worker``.

    The second half of them go out at epoch 2, the first at epoch 1, so the greatest entry is an epoch-2 one.
    Folder names ``ck-1``, ``ck-10``, ``ck-100`` sit side by side: prune must compare path elements. After
    each publication, ``resolve`` must give that entry or a greater one, however prunes race.
    """
    from ckpt.adapters.posix import PosixStore

    store = PosixStore(root)
    store.resolve()
    rng = random.Random(seed)
    _wait_for_go()
    published: list[list[Any]] = []
    errors: list[str] = []
    for i in range(count):
        save = f"exec/w{worker}/ck-{i}"
        folder = Path(root, save)
        folder.mkdir(parents=True)
        for name, data in SAVE_FILES.items():
            (folder / name).write_bytes(data)
        epoch = 1 if i < count // 2 else 2
        try:
            entry = store.publish(epoch, i * workers + worker, str(folder))
        except Exception as exc:  # reported to the parent, which fails the test with it
            errors.append(f"{save}: {exc!r}")
        else:
            published.append(_entry_triple(entry))
            # Prune keeps the greatest entry, so the latest never goes back below what was just published.
            latest = store.resolve()
            if latest is None or latest < entry:
                errors.append(f"resolve gave {latest} right after {entry} was published")
        time.sleep(rng.uniform(0.002, 0.01))
    return {"published": published, "errors": errors}


def prune_until_stopped(root: str, keep: int, stop: str) -> dict[str, Any]:
    """``prune(keep)`` in a loop until the file ``stop`` exists, then once more; check after every prune.

    After each prune, every remaining entry's folder must hold :data:`SAVE_FILES` (only this process removes
    anything, and publishers write a folder completely before publishing it). Each save is named by one entry
    only, so a prune must remove exactly its removed entries' folders and skip none.
    """
    from ckpt.adapters.posix import PosixStore

    store = PosixStore(root)
    store.resolve()
    _wait_for_go()
    prunes = racing_prunes = racing_removed = 0
    removed: list[list[Any]] = []
    problems: list[str] = []
    removed_folders = 0
    while True:
        stopping = os.path.exists(stop)
        try:
            result = store.prune(keep)
            remaining = store.entries()
        except Exception as exc:  # reported to the parent, which fails the test with it
            problems.append(f"prune {prunes}: {exc!r}")
            break
        prunes += 1
        if not stopping:
            racing_prunes += 1
            racing_removed += len(result.removed_entries)
        removed += [_entry_triple(e) for e in result.removed_entries]
        removed_folders += len(result.removed_folders)
        expected_folders = sorted(store.location(e) for e in result.removed_entries)
        if sorted(result.removed_folders) != expected_folders:
            actual_folders = sorted(result.removed_folders)
            problems.append(f"prune {prunes}: removed folders {actual_folders}, expected {expected_folders}")
        if result.skipped:
            problems.append(f"prune {prunes}: skipped {result.skipped}, expected none")
        for entry in remaining:
            files = read_files(Path(store.location(entry)))
            if files != SAVE_FILES:
                state = "missing" if not Path(store.location(entry)).exists() else f"holds {sorted(files)}"
                problems.append(f"after prune {prunes}: entry {entry} remains but its folder {state}")
        if stopping:
            break
    return {
        "prunes": prunes,
        "racing_prunes": racing_prunes,  # begun before the stop file appeared
        "racing_removed": racing_removed,
        "removed": removed,
        "removed_folders": removed_folders,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["cli-publish"]:
        return cli_publish(arguments[1:])  # ckpt's own options follow: argparse must not see them
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    trainer = commands.add_parser("trainer")
    trainer.add_argument("--framework", choices=("hf", "dcp"), required=True)
    trainer.add_argument("--saves", required=True)
    trainer.add_argument("--events", required=True)
    trainer.add_argument("--pace", type=float, default=0.004)
    trainer.add_argument("--gap", type=float, default=0.01)
    trainer.add_argument("--count", type=int, default=100_000)
    publish = commands.add_parser("publish")
    publish.add_argument("--root", required=True)
    publish.add_argument("--jobs", required=True, help="a JSON file: a list of [epoch, step, save]")
    commands.add_parser("cli-publish", help="cli-publish ARGS...: every argument after it goes to ckpt")
    new = commands.add_parser("publish-new")
    new.add_argument("--root", required=True)
    new.add_argument("--worker", type=int, required=True)
    new.add_argument("--workers", type=int, required=True)
    new.add_argument("--count", type=int, required=True)
    new.add_argument("--seed", type=int, default=0)
    prune = commands.add_parser("prune")
    prune.add_argument("--root", required=True)
    prune.add_argument("--keep", type=int, required=True)
    prune.add_argument("--stop", required=True)
    args = parser.parse_args(arguments)

    report: dict[str, Any]
    if args.command == "trainer":
        ResumableTrainer(args.framework, args.saves, args.events, pace=args.pace, gap=args.gap).run(
            args.count
        )
        return 0
    if args.command == "publish":
        report = publish_jobs(args.root, json.loads(Path(args.jobs).read_text()))
    elif args.command == "publish-new":
        report = publish_new_saves(args.root, args.worker, args.workers, args.count, args.seed)
    else:
        report = prune_until_stopped(args.root, args.keep, args.stop)
    sys.stdout.write(json.dumps(report) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
