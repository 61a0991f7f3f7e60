"""The simulated trainer: writes saves step by step, the way Hugging Face ``Trainer`` and PyTorch DCP do.

One module for the watcher, crash and S3 suites. The saves, their plans and the events file are shared; what
differs is where a save goes and how far a crash test needs to follow it:

* :class:`SimulatedTrainer` (``posix``): a plan of every kind of save (:func:`hf_plan` / :func:`dcp_plan`)
  into a folder, file by file, in-process (``SimulatedTrainer(...).run(plan)`` in a thread) or as a
  subprocess. The watcher and sustained suites use it.
* :class:`ResumableTrainer` (``resumable``): saves with exact contents (:func:`manifest`), started again after
  a SIGKILL it goes on with the save after the last one it began. The POSIX crash rounds use it.
* :class:`S3Trainer` (``s3``): the plan of :func:`plan_for` into a bucket, object by object. The S3 crash
  rounds use it.

Run as ``python -m support.trainer posix|resumable|s3 ...`` with ``tests/`` on the import path (the tests use
:func:`support.module_command` and :func:`support.subprocess_env`, or ``cwd=tests/``).

Every event is one JSON line appended with a single ``write`` (a kill never leaves half a line); times are
``time.time()``.

Saves of the plan (``posix`` and ``s3``), each written in small steps ``pace`` seconds apart so that a watcher
can catch it half-way:

* ``hf``: ``plain`` (model in chunks, ``trainer_state.json`` written in two halves with a pause between, so a
  reader can see invalid JSON), ``sentinel`` (``checkpoint-is-incomplete.txt`` first, removed last),
  ``late_rank`` (``trainer_state.json`` complete, then another rank's file keeps growing: only settle
  protects), ``staged`` (written as ``tmp-checkpoint-N`` and renamed into place). Never complete:
  ``abandoned_sentinel``, ``abandoned_partial_state`` (truncated JSON), ``abandoned_array_state``
  (``trainer_state.json`` is a JSON array), ``abandoned_staged`` (``tmp-checkpoint-N`` never renamed),
  ``best`` (``checkpoint-best``, complete files but not a save name), ``runs`` (a log folder).
* ``dcp``: ``plain`` (rank shards in chunks, then ``.metadata.tmp`` renamed to ``.metadata``), never complete:
  ``abandoned`` (shards and ``.metadata.tmp`` only), ``runs``.

Steps are written out of order. ``posix`` events: ``{"save": name, "complete_at": t}`` right after the save
became complete, or ``{"save": name, "complete": false}`` for a save that never will; then ``{"done": true}``.

On S3 an object appears whole, so "partly written" means "some objects are there": ``plain`` puts model,
optimizer, rng state, then ``trainer_state.json`` first as half a JSON text and then whole; ``sentinel``
deletes the sentinel last; ``late_rank`` puts three more ranks' files a pause apart after
``trainer_state.json`` (the plan has two of these a round); ``staged`` is copied object by object from
``tmp-checkpoint-N`` with ``trainer_state.json`` last, then the staging objects are deleted; ``dcp`` ``plain``
puts ``.metadata`` last. ``--start N`` resumes the plan at item N (the crash tests pass the item after the
interrupted one), so no save is ever written twice. ``s3`` events: ``{"index": i, "save": name, "started":
t}`` before the first request of item i, ``{"index": i, "completing_at": t}`` just before the request that
completes a save (so it cannot have been complete before ``t``), ``{"index": i, "written": t, "complete":
bool}`` after its last request, and ``{"finished": true}`` at the end of the plan.

Saves of the ``resumable`` trainer: the save at plan index ``i`` has step ``10 * (i + 1)``. Every kind
completes with one last operation, before which the framework's markers say "incomplete"; a save killed at
any point before it can therefore never be judged complete by the marker rule:

* ``hf`` ``state_last``: every rank's file, then ``trainer_state.json`` in two halves (a reader can see
  invalid JSON in between); the second half completes it.
* ``hf`` ``sentinel``: ``checkpoint-is-incomplete.txt`` first; ``trainer_state.json`` mid-way, a late rank
  still writing after it; removing the sentinel completes it.
* ``hf`` ``staged``: written as ``tmp-checkpoint-<step>`` (not a save name), renamed into place at the end.
* ``dcp`` ``plain``: two rank shards in chunks, ``.metadata.tmp``, then the rename to ``.metadata``.

A complete save holds exactly :func:`manifest` (names and bytes). The trainer never touches a save again once
it is complete. ``resumable`` events: ``{"index", "save", "kind", "started"}`` before the first write of a
save, ``{"index", "completing_at"}`` just before the operation that completes it (so it was not complete
before that time), ``{"index", "complete_at"}`` after it, and ``{"finished": true}`` when ``--count`` saves
are written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from support.saves import SENTINEL, TRAINER_STATE, rng_state_bytes

__all__ = [
    "HF_KINDS",
    "SENTINEL",
    "TRAINER_STATE",
    "ResumableTrainer",
    "S3Trainer",
    "SaveSpec",
    "SimulatedTrainer",
    "complete_folders",
    "dcp_plan",
    "folder_of",
    "hf_plan",
    "kind_of",
    "main",
    "manifest",
    "plan_for",
    "rng_state_bytes",
    "step_of",
]

HF_COMPLETE = ("plain", "sentinel", "late_rank", "staged")
HF_NEVER = ("abandoned_sentinel", "abandoned_partial_state", "abandoned_array_state", "abandoned_staged")
DCP_COMPLETE = ("plain",)
DCP_NEVER = ("abandoned",)


# -- what every trainer shares ---------------------------------------------------------------------------


def trainer_state(step: int, loss: float = 0.5) -> bytes:
    """The text of ``trainer_state.json`` at ``step``."""
    return json.dumps({"global_step": step, "log_history": [{"loss": loss, "step": step}]}).encode()


def append_event(events: str, document: dict[str, object]) -> None:
    """Append ``document`` to the events file as one JSON line, in a single ``write``."""
    fd = os.open(events, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (json.dumps(document) + "\n").encode())  # one write: a kill cannot leave half a line
    finally:
        os.close(fd)


class _FileWriter:
    """Writes files in small steps, ``pace`` seconds apart, each step visible before the next."""

    def __init__(self, *, pace: float, chunk: int) -> None:
        self.pace = pace
        self.chunk = chunk

    def _tick(self) -> None:
        time.sleep(self.pace)

    def _grow(self, path: str, data: bytes) -> None:
        """Append ``data`` a chunk at a time, each chunk visible before the next."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            for offset in range(0, len(data), self.chunk):
                os.write(fd, data[offset : offset + self.chunk])
                self._tick()
        finally:
            os.close(fd)

    def _put(self, path: str, data: bytes) -> None:
        """Write the whole file at once."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        self._tick()

    def _half_state(self, path: str, state: bytes) -> Callable[[bool], None]:
        """Write half of ``trainer_state.json``; return what closes it (writing the rest if asked)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        half = len(state) // 2
        os.write(fd, state[:half])
        self._tick()

        def finish(rest: bool = True) -> None:
            try:
                if rest:
                    os.write(fd, state[half:])
            finally:
                os.close(fd)

        return finish


# -- the plan: every kind of save ------------------------------------------------------------------------


@dataclass(frozen=True)
class SaveSpec:
    """One save the trainer will write: how (``kind``) and at which step."""

    kind: str
    step: int

    def folder(self, framework: str) -> str:
        """The folder name the save ends up under."""
        if self.kind == "best":
            return "checkpoint-best"
        if self.kind == "runs":
            return "runs"
        if self.kind == "abandoned_staged":
            return f"tmp-checkpoint-{self.step}"
        return f"checkpoint-{self.step}" if framework == "hf" else f"step-{self.step}"

    @property
    def completes(self) -> bool:
        """True when the save ends up complete under the framework's rule."""
        return self.kind in HF_COMPLETE or self.kind in DCP_COMPLETE


def hf_plan(rounds: int = 2) -> list[SaveSpec]:
    """Every hf kind, ``rounds`` times, at steps out of order (complete and never-complete interleaved)."""
    plan: list[SaveSpec] = []
    for r in range(rounds):
        base = 100 * (rounds - r)  # later rounds write lower steps: out of order
        kinds = [
            *("plain", "abandoned_sentinel", "sentinel", "late_rank", "abandoned_partial_state"),
            *("staged", "abandoned_array_state", "abandoned_staged"),
        ]
        plan += [SaveSpec(kind, base + 10 * i) for i, kind in enumerate(kinds)]
        if r == 0:
            plan += [SaveSpec("best", 0), SaveSpec("runs", 0)]
    # Swap neighbours so that even within a round the steps do not rise.
    for i in range(0, len(plan) - 1, 3):
        plan[i], plan[i + 1] = plan[i + 1], plan[i]
    return plan


def dcp_plan(rounds: int = 3) -> list[SaveSpec]:
    """Complete saves and an abandoned one per round, at steps out of order."""
    plan: list[SaveSpec] = []
    for r in range(rounds):
        base = 100 * (rounds - r)
        plan += [SaveSpec("plain", base + 20), SaveSpec("abandoned", base + 30), SaveSpec("plain", base + 10)]
    plan.append(SaveSpec("runs", 0))
    return plan


def plan_for(framework: str, rounds: int) -> list[SaveSpec]:
    """The plan the S3 trainer writes: :func:`hf_plan` with a second late-rank save beside each hf one
    (the kind only settle protects, so the one that shows a watcher publishing early), or :func:`dcp_plan`."""
    if framework == "dcp":
        return dcp_plan(rounds)
    plan: list[SaveSpec] = []
    for spec in hf_plan(rounds):
        plan.append(spec)
        if spec.kind == "late_rank":
            plan.append(SaveSpec("late_rank", spec.step + 5))
    return plan


def complete_folders(framework: str, plan: list[SaveSpec]) -> set[str]:
    """The folder names of the saves in ``plan`` that end up complete."""
    return {spec.folder(framework) for spec in plan if spec.completes}


def _filler(total: int, chunk: int) -> bytes:
    """``total`` bytes, each chunk of ``chunk`` bytes one repeated value (so a torn write shows)."""
    return b"".join(bytes([offset % 251]) * min(chunk, total - offset) for offset in range(0, total, chunk))


# -- the plan into a folder ------------------------------------------------------------------------------


class SimulatedTrainer(_FileWriter):
    """Writes saves into ``saves_dir`` step by step, sleeping ``pace`` seconds between steps."""

    def __init__(
        self,
        framework: str,
        saves_dir: str,
        *,
        pace: float = 0.005,
        gap: float = 0.0,
        chunk: int = 512,
        events: str | None = None,
        on_complete: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(pace=pace, chunk=chunk)
        self.framework = framework
        self.saves_dir = saves_dir
        self.gap = gap
        self.events = events
        self.on_complete = on_complete

    def _fill(self, path: str, total: int) -> None:
        self._grow(path, _filler(total, self.chunk))

    def _event(self, document: dict[str, object]) -> None:
        if self.events is not None:
            append_event(self.events, document)

    def _completed(self, name: str) -> None:
        self._event({"save": name, "complete_at": time.time()})
        if self.on_complete is not None:
            self.on_complete(name)

    def write(self, spec: SaveSpec) -> None:
        """Write one save according to its kind."""
        name = spec.folder(self.framework)
        if self.framework == "hf":
            self._write_hf(spec, name)
        else:
            self._write_dcp(spec, name)
        if spec.completes:
            self._completed(name)
        else:
            self._event({"save": name, "complete": False})

    def _write_hf(self, spec: SaveSpec, name: str) -> None:
        kind, step = spec.kind, spec.step
        if kind == "runs":
            os.makedirs(os.path.join(self.saves_dir, "runs", "events"), exist_ok=True)
            self._fill(os.path.join(self.saves_dir, "runs", "events", "tfevents.1"), 2 * self.chunk)
            return
        staged = kind in ("staged", "abandoned_staged")
        folder = os.path.join(self.saves_dir, f"tmp-checkpoint-{step}" if staged else name)
        os.makedirs(folder, exist_ok=True)
        if kind in ("sentinel", "abandoned_sentinel"):
            self._put(os.path.join(folder, SENTINEL), b"")
        self._put(os.path.join(folder, "config.json"), b'{"model_type": "gpt2"}')
        self._fill(os.path.join(folder, "model.safetensors"), 4 * self.chunk)
        if kind == "abandoned_array_state":
            self._put(os.path.join(folder, TRAINER_STATE), b"[1, 2, 3]")
            return
        # NaN in the loss: what a diverged run writes, and JSON that Python reads but strict parsers do not.
        finish = self._half_state(os.path.join(folder, TRAINER_STATE), trainer_state(step, float("nan")))
        self._tick()
        finish(kind != "abandoned_partial_state")
        self._tick()
        if kind in ("late_rank", "sentinel", "abandoned_sentinel"):
            # Another rank still writing after the main process wrote trainer_state.json.
            self._fill(os.path.join(folder, "rng_state_1.pth"), 6 * self.chunk)
        self._fill(os.path.join(folder, "optimizer.pt"), 2 * self.chunk)
        if kind == "sentinel":
            os.unlink(os.path.join(folder, SENTINEL))
        if kind == "staged":
            os.rename(folder, os.path.join(self.saves_dir, name))

    def _write_dcp(self, spec: SaveSpec, name: str) -> None:
        if spec.kind == "runs":
            os.makedirs(os.path.join(self.saves_dir, "runs"), exist_ok=True)
            self._fill(os.path.join(self.saves_dir, "runs", "log.txt"), self.chunk)
            return
        folder = os.path.join(self.saves_dir, name)
        os.makedirs(folder, exist_ok=True)
        for rank in range(2):
            self._fill(os.path.join(folder, f"__{rank}_0.distcp"), 3 * self.chunk)
        self._put(os.path.join(folder, ".metadata.tmp"), b"pickled metadata")
        if spec.kind == "plain":
            os.rename(os.path.join(folder, ".metadata.tmp"), os.path.join(folder, ".metadata"))

    def run(self, plan: list[SaveSpec]) -> None:
        """Write every save of ``plan`` in order, ``gap`` seconds apart, then record ``done``."""
        os.makedirs(self.saves_dir, exist_ok=True)
        for spec in plan:
            self.write(spec)
            time.sleep(self.gap)
        self._event({"done": True})


# -- resumable saves with exact contents, for the POSIX crash rounds --------------------------------------

HF_KINDS = ("state_last", "sentinel", "staged")
CHUNK = 64  # bytes per write: tiny saves keep the rounds fast


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
        files[TRAINER_STATE] = trainer_state(step)
    else:
        files[".metadata"] = b"pickled metadata %d" % step
    return files


class ResumableTrainer(_FileWriter):
    """Writes the plan's saves, ``pace`` seconds between writes and ``gap`` between saves."""

    def __init__(self, framework: str, saves: str, events: str, *, pace: float, gap: float) -> None:
        super().__init__(pace=pace, chunk=CHUNK)
        self.framework = framework
        self.saves = saves
        self.events = events
        self.gap = gap

    def _event(self, **document: object) -> None:
        append_event(self.events, document)

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
        finish = self._half_state(os.path.join(folder, TRAINER_STATE), files[TRAINER_STATE])
        return lambda: finish(True)

    def _write_sentinel(self, name: str, files: dict[str, bytes]) -> Callable[[], None]:
        folder = os.path.join(self.saves, name)
        os.makedirs(folder)
        self._put(os.path.join(folder, SENTINEL), b"")
        self._put(os.path.join(folder, "config.json"), files["config.json"])
        self._ranks(folder, files, ("model.safetensors",))
        self._half_state(os.path.join(folder, TRAINER_STATE), files[TRAINER_STATE])(True)
        self._tick()
        self._ranks(folder, files, ("rng_state_1.pth", "optimizer.pt"))  # late ranks
        return lambda: os.unlink(os.path.join(folder, SENTINEL))

    def _write_staged(self, name: str, files: dict[str, bytes]) -> Callable[[], None]:
        staging = os.path.join(self.saves, f"tmp-{name}")
        os.makedirs(staging)
        self._put(os.path.join(staging, "config.json"), files["config.json"])
        self._ranks(staging, files, ("model.safetensors",))
        self._half_state(os.path.join(staging, TRAINER_STATE), files[TRAINER_STATE])(True)
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


# -- the plan into a bucket, object by object ------------------------------------------------------------

# (request kind, folder, object name, body); kinds: "put", "delete", "copy" (body is then the source folder),
# and "pause" (no request: a late rank still computing).
_Action = tuple[str, str, str, bytes | str]
LATE_RANK_PAUSE = 0.1  # far below the settle time the crash tests give hf watchers


class S3Trainer:
    """Writes saves under ``<bucket>/<saves>/`` one request at a time, ``pace`` seconds apart."""

    def __init__(
        self,
        framework: str,
        client: Any,
        bucket: str,
        saves: str,
        *,
        pace: float,
        gap: float,
        events: str,
    ) -> None:
        self.framework = framework
        self.client = client
        self.bucket = bucket
        self.saves = saves.strip("/")
        self.pace = pace
        self.gap = gap
        self.events = events

    # -- what each kind writes -------------------------------------------------------------------------

    def _hf_actions(self, spec: SaveSpec) -> tuple[list[_Action], int | None]:
        """The requests of one hf save, and the index of the one that completes it (``None``: never)."""
        kind, step, name = spec.kind, spec.step, spec.folder("hf")
        state = trainer_state(step)
        model = [
            ("put", name, "config.json", b'{"model_type": "gpt2"}'),
            ("put", name, "model.safetensors", b"w" * 4096),
        ]
        if kind == "plain":
            actions: list[_Action] = [
                *model,
                ("put", name, "optimizer.pt", b"o" * 2048),
                ("put", name, "rng_state_0.pth", b"r" * 64),
                ("put", name, TRAINER_STATE, state[: len(state) // 2]),
                ("put", name, TRAINER_STATE, state),
            ]
            return actions, len(actions) - 1
        if kind in ("sentinel", "abandoned_sentinel"):
            actions = [
                ("put", name, SENTINEL, b""),
                *model,
                ("put", name, TRAINER_STATE, state[: len(state) // 2]),
                ("put", name, TRAINER_STATE, state),
                ("put", name, "rng_state_1.pth", b"r" * 64),
                ("put", name, "optimizer.pt", b"o" * 2048),
            ]
            if kind == "abandoned_sentinel":
                return actions, None
            actions.append(("delete", name, SENTINEL, b""))
            return actions, len(actions) - 1
        if kind == "late_rank":
            # Other ranks still writing, a pause apart, after trainer_state.json: a watcher that did not
            # wait for the listing to settle would publish in this window.
            actions = [*model, ("put", name, TRAINER_STATE, state)]
            for rank in (1, 2, 3):
                actions += [("pause", name, "", b""), ("put", name, f"rng_state_{rank}.pth", b"r" * 64)]
            return actions, len(actions) - 1
        if kind in ("staged", "abandoned_staged"):
            staging = f"tmp-checkpoint-{step}"
            files = {"config.json": b"{}", "optimizer.pt": b"o" * 2048, TRAINER_STATE: state}
            actions = [("put", staging, file, data) for file, data in files.items()]
            if kind == "abandoned_staged":
                return actions, None
            # No rename on S3: copy object by object, trainer_state.json last, then drop the staging copy.
            actions += [("copy", name, file, staging) for file in files]
            completing = len(actions) - 1
            actions += [("delete", staging, file, b"") for file in files]
            return actions, completing
        if kind == "abandoned_partial_state":
            return [*model, ("put", name, TRAINER_STATE, state[: len(state) // 2])], None
        if kind == "abandoned_array_state":
            return [*model, ("put", name, TRAINER_STATE, b"[1, 2, 3]")], None
        if kind == "best":
            return [*model, ("put", name, TRAINER_STATE, state)], None
        if kind == "runs":
            return [
                ("put", "runs/events", "tfevents.1", b"e" * 64),
                ("put", "runs/events", "tfevents.1", b"e" * 128),
            ], None
        raise ValueError(f"unknown hf kind {kind!r}")

    def _dcp_actions(self, spec: SaveSpec) -> tuple[list[_Action], int | None]:
        name = spec.folder("dcp")
        if spec.kind == "runs":
            return [("put", "runs", "log.txt", b"l" * 64)], None
        actions: list[_Action] = [("put", name, f"__{rank}_0.distcp", b"s" * 1536) for rank in range(2)]
        if spec.kind == "abandoned":
            return actions, None
        actions.append(("put", name, ".metadata", b"pickled metadata"))
        return actions, len(actions) - 1

    # -- carrying them out -----------------------------------------------------------------------------

    def _key(self, folder: str, name: str) -> str:
        return f"{self.saves}/{folder}/{name}"

    def _do(self, action: _Action) -> None:
        kind, folder, name, body = action
        if kind == "put":
            self.client.put_object(Bucket=self.bucket, Key=self._key(folder, name), Body=body)
        elif kind == "delete":
            self.client.delete_object(Bucket=self.bucket, Key=self._key(folder, name))
        elif kind == "pause":
            time.sleep(LATE_RANK_PAUSE)
        else:
            source = {"Bucket": self.bucket, "Key": self._key(str(body), name)}
            self.client.copy_object(Bucket=self.bucket, Key=self._key(folder, name), CopySource=source)
        time.sleep(self.pace)

    def _event(self, document: dict[str, object]) -> None:
        append_event(self.events, document)

    def write(self, index: int, spec: SaveSpec) -> None:
        """Write plan item ``index``, recording when it started, when it completes, when it was written."""
        plan: Callable[[SaveSpec], tuple[list[_Action], int | None]] = (
            self._hf_actions if self.framework == "hf" else self._dcp_actions
        )
        actions, completing = plan(spec)
        self._event({"index": index, "save": spec.folder(self.framework), "started": time.time()})
        for position, action in enumerate(actions):
            if position == completing:
                self._event({"index": index, "completing_at": time.time()})
            self._do(action)
        self._event({"index": index, "written": time.time(), "complete": completing is not None})

    def run(self, plan: list[SaveSpec], start: int = 0) -> None:
        """Write plan items ``start`` onwards, ``gap`` seconds apart, then record ``finished``."""
        for index, spec in enumerate(plan):
            if index >= start:
                self.write(index, spec)
                time.sleep(self.gap)
        self._event({"finished": True})


# -- the command line ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    where = parser.add_subparsers(dest="where", required=True)

    posix = where.add_parser("posix", help="the plan into a folder, file by file")
    posix.add_argument("--pace", type=float, default=0.005)
    posix.add_argument("--gap", type=float, default=0.0)
    posix.add_argument("--rounds", type=int, default=2)

    resumable = where.add_parser("resumable", help="exact saves into a folder; resumes after a kill")
    resumable.add_argument("--pace", type=float, default=0.004)
    resumable.add_argument("--gap", type=float, default=0.01)
    resumable.add_argument("--count", type=int, default=100_000)

    s3 = where.add_parser("s3", help="the plan into a bucket, object by object")
    s3.add_argument("--endpoint", required=True)
    s3.add_argument("--bucket", required=True)
    s3.add_argument("--start", type=int, default=0)
    s3.add_argument("--pace", type=float, default=0.01)
    s3.add_argument("--gap", type=float, default=0.1)
    s3.add_argument("--rounds", type=int, default=2)

    for command in (posix, resumable, s3):
        command.add_argument("--framework", choices=("hf", "dcp"), required=True)
        command.add_argument("--saves", required=True, help="a folder; on S3 a key prefix")
        command.add_argument("--events", required=True)
    args = parser.parse_args(argv)

    if args.where == "posix":
        plan = hf_plan(args.rounds) if args.framework == "hf" else dcp_plan(args.rounds)
        SimulatedTrainer(args.framework, args.saves, pace=args.pace, gap=args.gap, events=args.events).run(
            plan
        )
    elif args.where == "resumable":
        ResumableTrainer(args.framework, args.saves, args.events, pace=args.pace, gap=args.gap).run(
            args.count
        )
    else:
        from support.s3_processes import direct_client  # botocore only where a bucket is written

        trainer = S3Trainer(
            args.framework,
            direct_client(args.endpoint),
            args.bucket,
            args.saves,
            pace=args.pace,
            gap=args.gap,
            events=args.events,
        )
        trainer.run(plan_for(args.framework, args.rounds), args.start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
