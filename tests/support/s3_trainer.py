"""A simulated trainer that writes saves into S3 object by object: the S3 twin of ``support/trainer.py``.

Run as a subprocess from ``tests/`` (``python -m support.s3_trainer --endpoint URL --bucket B --saves
exec/<attempt> --framework hf|dcp --events FILE [--start N] [--pace S] [--gap S] [--rounds R]``). It writes
the plan of ``support_trainer`` (``hf_plan`` / ``dcp_plan``: every kind of save, steps out of order) with
one request per object and ``pace`` seconds between requests, the way a framework saving to object storage
does. On S3 an object appears whole, so "partly written" means "some objects are there":

* ``hf``: ``plain`` (model, optimizer, rng state, then ``trainer_state.json`` first as half a JSON text and
  then whole: it completes the save), ``sentinel`` (``checkpoint-is-incomplete.txt`` first, deleted last),
  ``late_rank`` (``trainer_state.json`` whole, then three more ranks' files a pause apart: only settle
  protects; the hf plan has two of these a round),
  ``staged`` (written under ``tmp-checkpoint-N``, then copied object by object with ``trainer_state.json``
  last, then the staging objects deleted). Never complete: ``abandoned_sentinel``,
  ``abandoned_partial_state``, ``abandoned_array_state``, ``abandoned_staged``, ``best``, ``runs``.
* ``dcp``: ``plain`` (two rank shards, then ``.metadata`` last); never complete: ``abandoned``, ``runs``.

A trainer killed mid-save leaves that save as it was; a trainer started with ``--start N`` resumes the plan
at item N (the crash tests pass the item after the interrupted one), so no save is ever written twice.

The events file gets one JSON line per event, each written with a single ``write`` (a kill never leaves
half a line): ``{"index": i, "save": name, "started": t}`` before the first request of item i,
``{"index": i, "completing_at": t}`` just before the request that completes a save (so the save cannot have
been complete before ``t``), ``{"index": i, "written": t, "complete": bool}`` after its last request, and
``{"finished": true}`` at the end of the plan. Times are ``time.time()``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from support.s3_processes import direct_client
from support.trainer import SENTINEL, TRAINER_STATE, SaveSpec, dcp_plan, hf_plan

__all__ = ["S3Trainer", "main"]

# (request kind, folder, object name, body); kinds: "put", "delete", "copy" (body is then the source folder),
# and "pause" (no request: a late rank still computing).
_Action = tuple[str, str, str, bytes | str]
LATE_RANK_PAUSE = 0.1  # far below the settle time the crash tests give hf watchers


def _state(step: int) -> bytes:
    return json.dumps({"global_step": step, "log_history": [{"loss": 0.5, "step": step}]}).encode()


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
        state = _state(step)
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
        line = (json.dumps(document) + "\n").encode()
        fd = os.open(self.events, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)  # one write: a kill cannot leave half a line
        finally:
            os.close(fd)

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


def plan_for(framework: str, rounds: int) -> list[SaveSpec]:
    """The plan the trainer writes: ``support_trainer``'s, with a second late-rank save beside each hf one
    (the kind only settle protects, so the one that shows a watcher publishing early)."""
    if framework == "dcp":
        return dcp_plan(rounds)
    plan: list[SaveSpec] = []
    for spec in hf_plan(rounds):
        plan.append(spec)
        if spec.kind == "late_rank":
            plan.append(SaveSpec("late_rank", spec.step + 5))
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--saves", required=True, help="key prefix of the saves folder, e.g. exec/<attempt>")
    parser.add_argument("--framework", choices=("hf", "dcp"), required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--pace", type=float, default=0.01)
    parser.add_argument("--gap", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
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
