"""A simulated trainer that writes saves file by file, the way Hugging Face ``Trainer`` and PyTorch DCP do.

Used in-process (``SimulatedTrainer(...).run(plan)`` in a thread) and as a script run as a subprocess::

    python -m support.trainer --framework hf --saves DIR --events FILE [--pace S] [--gap S]

Every save is written in small steps with ``pace`` seconds between them, so a watcher can catch it half-way:

* ``hf``: ``plain`` (model in chunks, ``trainer_state.json`` written in two halves with a pause between, so a
  reader can see invalid JSON), ``sentinel`` (``checkpoint-is-incomplete.txt`` first, removed last),
  ``late_rank`` (``trainer_state.json`` complete, then another rank's file keeps growing: only settle
  protects), ``staged`` (written as ``tmp-checkpoint-N`` and renamed into place). Never complete:
  ``abandoned_sentinel``, ``abandoned_partial_state`` (truncated JSON), ``abandoned_array_state``
  (``trainer_state.json`` is a JSON array), ``abandoned_staged`` (``tmp-checkpoint-N`` never renamed),
  ``best`` (``checkpoint-best``, complete files but not a save name), ``runs`` (a log folder).
* ``dcp``: ``plain`` (rank shards in chunks, then ``.metadata.tmp`` renamed to ``.metadata``), never complete:
  ``abandoned`` (shards and ``.metadata.tmp`` only), ``runs``.

Steps are written out of order. The events file gets one JSON line per save: ``{"save": name, "complete_at":
time.time()}`` right after the save became complete, or ``{"save": name, "complete": false}`` for a save
that never will; then ``{"done": true}``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass

TRAINER_STATE = "trainer_state.json"
SENTINEL = "checkpoint-is-incomplete.txt"

HF_COMPLETE = ("plain", "sentinel", "late_rank", "staged")
HF_NEVER = ("abandoned_sentinel", "abandoned_partial_state", "abandoned_array_state", "abandoned_staged")
DCP_COMPLETE = ("plain",)
DCP_NEVER = ("abandoned",)


def rng_state_bytes(rank: int = 0) -> bytes:
    """A small complete zip standing in for ``rng_state_<rank>.pth`` (``torch.save`` writes a zip)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("rng_state/data.pkl", bytes([rank]) * 512)
    return buffer.getvalue()


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


class SimulatedTrainer:
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
        self.framework = framework
        self.saves_dir = saves_dir
        self.pace = pace
        self.gap = gap
        self.chunk = chunk
        self.events = events
        self.on_complete = on_complete

    # -- small steps -----------------------------------------------------------------------------------

    def _tick(self) -> None:
        time.sleep(self.pace)

    def _grow(self, path: str, total: int) -> None:
        """Write ``total`` bytes into ``path`` a chunk at a time, each chunk visible before the next."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            written = 0
            while written < total:
                n = min(self.chunk, total - written)
                os.write(fd, bytes([written % 251]) * n)
                written += n
                self._tick()
        finally:
            os.close(fd)

    def _write(self, path: str, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)
        self._tick()

    def _trainer_state(self, path: str, step: int, *, finish: bool = True) -> None:
        text = json.dumps({"global_step": step, "log_history": [{"loss": float("nan"), "step": step}]})
        half = len(text) // 2
        with open(path, "w") as f:
            f.write(text[:half])
            f.flush()
            self._tick()
            self._tick()
            if finish:
                f.write(text[half:])
        self._tick()

    def _event(self, document: dict[str, object]) -> None:
        if self.events is not None:
            with open(self.events, "a") as f:
                f.write(json.dumps(document) + "\n")

    def _completed(self, name: str) -> None:
        self._event({"save": name, "complete_at": time.time()})
        if self.on_complete is not None:
            self.on_complete(name)

    # -- saves -----------------------------------------------------------------------------------------

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
            self._grow(os.path.join(self.saves_dir, "runs", "events", "tfevents.1"), 2 * self.chunk)
            return
        staged = kind in ("staged", "abandoned_staged")
        folder = os.path.join(self.saves_dir, f"tmp-checkpoint-{step}" if staged else name)
        os.makedirs(folder, exist_ok=True)
        if kind in ("sentinel", "abandoned_sentinel"):
            self._write(os.path.join(folder, SENTINEL), b"")
        self._write(os.path.join(folder, "config.json"), b'{"model_type": "gpt2"}')
        self._grow(os.path.join(folder, "model.safetensors"), 4 * self.chunk)
        if kind == "abandoned_array_state":
            self._write(os.path.join(folder, TRAINER_STATE), b"[1, 2, 3]")
            return
        self._trainer_state(
            os.path.join(folder, TRAINER_STATE), step, finish=kind != "abandoned_partial_state"
        )
        if kind in ("late_rank", "sentinel", "abandoned_sentinel"):
            # Another rank still writing after the main process wrote trainer_state.json.
            self._grow(os.path.join(folder, "rng_state_1.pth"), 6 * self.chunk)
        self._grow(os.path.join(folder, "optimizer.pt"), 2 * self.chunk)
        if kind == "sentinel":
            os.unlink(os.path.join(folder, SENTINEL))
        if kind == "staged":
            os.rename(folder, os.path.join(self.saves_dir, name))

    def _write_dcp(self, spec: SaveSpec, name: str) -> None:
        if spec.kind == "runs":
            os.makedirs(os.path.join(self.saves_dir, "runs"), exist_ok=True)
            self._grow(os.path.join(self.saves_dir, "runs", "log.txt"), self.chunk)
            return
        folder = os.path.join(self.saves_dir, name)
        os.makedirs(folder, exist_ok=True)
        for rank in range(2):
            self._grow(os.path.join(folder, f"__{rank}_0.distcp"), 3 * self.chunk)
        self._write(os.path.join(folder, ".metadata.tmp"), b"pickled metadata")
        if spec.kind == "plain":
            os.rename(os.path.join(folder, ".metadata.tmp"), os.path.join(folder, ".metadata"))

    def run(self, plan: list[SaveSpec]) -> None:
        """Write every save of ``plan`` in order, ``gap`` seconds apart, then record ``done``."""
        os.makedirs(self.saves_dir, exist_ok=True)
        for spec in plan:
            self.write(spec)
            time.sleep(self.gap)
        self._event({"done": True})


def complete_folders(framework: str, plan: list[SaveSpec]) -> set[str]:
    """The folder names of the saves in ``plan`` that end up complete."""
    return {spec.folder(framework) for spec in plan if spec.completes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("hf", "dcp"), required=True)
    parser.add_argument("--saves", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--pace", type=float, default=0.005)
    parser.add_argument("--gap", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    plan = hf_plan(args.rounds) if args.framework == "hf" else dcp_plan(args.rounds)
    SimulatedTrainer(args.framework, args.saves, pace=args.pace, gap=args.gap, events=args.events).run(plan)
    return 0


if __name__ == "__main__":
    sys.exit(main())
