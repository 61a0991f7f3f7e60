"""Writes Hugging Face-style saves file by file and freezes at one file boundary, to be killed there.

``python -m support.integ_kill_writer --saves DIR --steps 10,20 --stop-after N --ready FILE`` writes, for
each step, ``checkpoint-<step>/`` with ``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``,
``rng_state.pth`` and then ``trainer_state.json`` in two halves (so a reader can find half a JSON text).
Each of those six writes is a boundary; after boundary ``N`` (1-based; 0: before the first) it creates
``FILE`` and sleeps until killed. :func:`complete_steps` says which saves are complete at boundary ``N``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

__all__ = ["BOUNDARIES_PER_SAVE", "complete_steps"]

BOUNDARIES_PER_SAVE = 6


def complete_steps(steps: list[int], stop_after: int) -> list[int]:
    """The steps whose save is complete once ``stop_after`` boundaries are written."""
    return [step for i, step in enumerate(steps) if stop_after >= (i + 1) * BOUNDARIES_PER_SAVE]


def _writes(step: int) -> list[tuple[str, bytes, str]]:
    state = json.dumps({"global_step": step, "log_history": []}).encode()
    half = len(state) // 2
    return [
        ("model.safetensors", b"m" * 4096, "wb"),
        ("optimizer.pt", b"o" * 8192, "wb"),
        ("scheduler.pt", b"s" * 512, "wb"),
        ("rng_state.pth", b"r" * 1024, "wb"),
        ("trainer_state.json", state[:half], "wb"),
        ("trainer_state.json", state[half:], "ab"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--saves", required=True)
    parser.add_argument("--steps", required=True)
    parser.add_argument("--stop-after", type=int, required=True)
    parser.add_argument("--ready", required=True)
    options = parser.parse_args()
    boundary = 0
    for step in (int(s) for s in options.steps.split(",")):
        folder = os.path.join(options.saves, f"checkpoint-{step}")
        for name, data, mode in _writes(step):
            if boundary == options.stop_after:
                break
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, name), mode) as f:
                f.write(data)
            boundary += 1
    with open(options.ready, "w") as f:
        f.write(str(boundary))
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
