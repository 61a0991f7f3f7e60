"""The plan model: which saves a trainer writes, the operations each is made of, and what it holds at the end.

A save is a :class:`SaveSpec` (framework, kind, step). :func:`operations` spells it as :class:`Op` values that
any sink can carry out; :func:`manifest` replays them, so a complete save holds exactly those names and bytes.
The last operation of a kind that completes is the one that completes it: before it, the framework's markers
(or, for ``late_rank``, the still-changing listing) say "incomplete".

hf kinds (``checkpoint-<step>``):

* ``plain``: config, model, ``rng_state_1.pth``, optimizer, then ``trainer_state.json`` in two halves (in
  between a reader sees invalid JSON); the second half completes it.
* ``sentinel``: ``checkpoint-is-incomplete.txt`` first, ``trainer_state.json`` mid-way, a late rank and the
  optimizer after it; removing the sentinel completes it.
* ``late_rank``: ``trainer_state.json`` complete, then three more ranks' files, each after a pause of a few
  paces: only a watcher's settle time protects it.
* ``staged``: a ``plain`` save written as ``tmp-checkpoint-<step>`` and renamed into place.
* never complete: ``abandoned_sentinel``, ``abandoned_partial_state`` (truncated JSON),
  ``abandoned_array_state`` (``trainer_state.json`` is a JSON array), ``abandoned_staged`` (never renamed),
  ``best`` (``checkpoint-best``: complete files, not a save name), ``runs`` (a log folder).

dcp kinds (``step-<step>``): ``plain`` (two rank shards, ``.metadata.tmp``, then its rename to
``.metadata``), never complete: ``abandoned`` (no rename), ``runs``.

Plans: :func:`mixed_plan` (every kind, complete and never-complete interleaved, steps out of order) and
:func:`endless_plan` (only kinds that complete, step ``10 * (index + 1)``, for runs killed and resumed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import attrs

from support.saves import SENTINEL, TRAINER_STATE

__all__ = [
    "CHUNK",
    "KINDS",
    "Op",
    "SaveSpec",
    "complete_folders",
    "endless_plan",
    "manifest",
    "mixed_plan",
    "operations",
    "replay",
    "spec_at",
    "trainer_state",
]

CHUNK = 64  # bytes a file grows by per write, unless a trainer is told otherwise
# Every kind, and whether it ends up complete under its framework's rule.
KINDS: dict[str, dict[str, bool]] = {
    "hf": {
        **dict.fromkeys(("plain", "sentinel", "late_rank", "staged"), True),
        **dict.fromkeys(("abandoned_sentinel", "abandoned_partial_state", "abandoned_array_state"), False),
        **dict.fromkeys(("abandoned_staged", "best", "runs"), False),
    },
    "dcp": {"plain": True, "abandoned": False, "runs": False},
}
ENDLESS_KINDS = {"hf": ("plain", "sentinel", "staged"), "dcp": ("plain",)}
LATE_RANK_PAUSE = 4  # paces between a late rank's files: far below any settle time the tests give hf watchers


@attrs.frozen
class Op:
    """One step of a save. ``write`` appends ``data`` (creating the file) in ``pieces`` writes, each visible
    before the next; ``put`` makes the file hold ``data`` at once; ``rename`` moves a file or folder
    ``path`` to ``to``; ``remove`` deletes a file; ``mkdir`` makes a folder; ``pause`` waits ``pieces``
    paces (a rank still computing)."""

    action: str
    path: str
    data: bytes = b""
    to: str = ""
    pieces: int = 1


def trainer_state(step: int) -> bytes:
    """The text of ``trainer_state.json`` at ``step``; the loss is NaN, as a diverged run writes it (JSON
    that Python reads and strict parsers do not)."""
    return json.dumps({"global_step": step, "log_history": [{"loss": float("nan"), "step": step}]}).encode()


def _pattern(name: str, size: int, step: int) -> bytes:
    """The bytes of file ``name`` of the save at ``step``: distinct per file and per save."""
    seed = sum(name.encode()) + step
    return bytes((seed + i) % 251 for i in range(size))


@attrs.frozen
class SaveSpec:
    """One save a trainer writes: its framework, how (``kind``) and at which step."""

    framework: str = attrs.field(validator=attrs.validators.in_(KINDS))
    kind: str
    step: int

    def __attrs_post_init__(self) -> None:
        if self.kind not in KINDS[self.framework]:
            raise ValueError(f"unknown {self.framework} kind {self.kind!r}")

    @property
    def folder(self) -> str:
        """The folder the save ends up under."""
        if self.kind in ("best", "runs"):
            return "checkpoint-best" if self.kind == "best" else "runs"
        if self.kind == "abandoned_staged":
            return f"tmp-checkpoint-{self.step}"
        return f"checkpoint-{self.step}" if self.framework == "hf" else f"step-{self.step}"

    @property
    def completes(self) -> bool:
        """True when the save ends up complete under its framework's rule."""
        return KINDS[self.framework][self.kind]


def _write(path: str, data: bytes, chunk: int) -> Op:
    return Op("write", path, data, pieces=max(1, -(-len(data) // chunk)))


def _hf(spec: SaveSpec, chunk: int) -> list[Op]:
    kind, step = spec.kind, spec.step
    if kind == "runs":
        return [Op("mkdir", "runs/events"), _write("runs/events/tfevents.1", b"e" * 2 * chunk, chunk)]
    folder = f"tmp-checkpoint-{step}" if kind in ("staged", "abandoned_staged") else spec.folder

    def file(name: str, chunks: int) -> Op:
        return _write(f"{folder}/{name}", _pattern(name, chunks * chunk, step), chunk)

    state = trainer_state(step)
    halves = [
        Op("write", f"{folder}/{TRAINER_STATE}", part)
        for part in (state[: len(state) // 2], state[len(state) // 2 :])
    ]
    ops = [
        Op("mkdir", folder),
        Op("put", f"{folder}/config.json", b'{"model_type": "gpt2"}'),
        file("model.safetensors", 4),
    ]
    if kind in ("sentinel", "abandoned_sentinel"):
        ops.insert(1, Op("put", f"{folder}/{SENTINEL}"))
        ops += [*halves, file("rng_state_1.pth", 3), file("optimizer.pt", 2)]
        return [*ops, Op("remove", f"{folder}/{SENTINEL}")] if kind == "sentinel" else ops
    if kind == "late_rank":
        ops += [file("optimizer.pt", 2), *halves]
        for rank in (1, 2, 3):
            ops += [Op("pause", "", pieces=LATE_RANK_PAUSE), file(f"rng_state_{rank}.pth", 2)]
        return ops
    if kind == "abandoned_partial_state":
        return [*ops, halves[0]]
    if kind == "abandoned_array_state":
        return [*ops, Op("put", f"{folder}/{TRAINER_STATE}", b"[1, 2, 3]")]
    ops += [file("rng_state_1.pth", 3), file("optimizer.pt", 2), *halves]  # plain, staged, best
    return [*ops, Op("rename", folder, to=spec.folder)] if kind == "staged" else ops


def _dcp(spec: SaveSpec, chunk: int) -> list[Op]:
    if spec.kind == "runs":
        return [Op("mkdir", "runs"), _write("runs/log.txt", b"l" * chunk, chunk)]
    folder = spec.folder
    ops = [Op("mkdir", folder)]
    ops += [
        _write(f"{folder}/__{rank}_0.distcp", _pattern(f"__{rank}_0", 3 * chunk, spec.step), chunk)
        for rank in range(2)
    ]
    ops.append(Op("put", f"{folder}/.metadata.tmp", b"pickled metadata %d" % spec.step))
    if spec.kind == "plain":
        ops.append(Op("rename", f"{folder}/.metadata.tmp", to=f"{folder}/.metadata"))
    return ops


def operations(spec: SaveSpec, chunk: int = CHUNK) -> list[Op]:
    """The operations that write ``spec``, paths relative to the saves location; files grow ``chunk`` bytes
    a write. For a kind that completes, the last operation completes it."""
    return _hf(spec, chunk) if spec.framework == "hf" else _dcp(spec, chunk)


def replay(ops: list[Op]) -> dict[str, bytes]:
    """Every file the operations leave behind, by path, with its bytes."""
    files: dict[str, bytes] = {}
    for op in ops:
        if op.action == "write":
            files[op.path] = files.get(op.path, b"") + op.data
        elif op.action == "put":
            files[op.path] = op.data
        elif op.action == "remove":
            del files[op.path]
        elif op.action == "rename":
            moved = [p for p in files if p == op.path or p.startswith(f"{op.path}/")]
            files.update({op.to + p[len(op.path) :]: files.pop(p) for p in moved})
    return files


def manifest(spec: SaveSpec, chunk: int = CHUNK) -> dict[str, bytes]:
    """Every file of the finished save, by path inside its folder, with its exact bytes."""
    prefix = f"{spec.folder}/"
    return {p[len(prefix) :]: b for p, b in replay(operations(spec, chunk)).items() if p.startswith(prefix)}


def mixed_plan(framework: str, rounds: int = 2) -> list[SaveSpec]:
    """Every kind ``rounds`` times, complete and never-complete interleaved, steps out of order.

    hf rounds have two ``late_rank`` saves (the kind only settle protects); the first round also writes
    ``best`` and ``runs``. dcp rounds are two complete saves around an abandoned one, then ``runs``."""
    plan: list[SaveSpec] = []
    for r in range(rounds):
        base = 100 * (rounds - r)  # later rounds write lower steps
        if framework == "dcp":
            plan += [
                SaveSpec("dcp", kind, base + at)
                for kind, at in (("plain", 20), ("abandoned", 30), ("plain", 10))
            ]
            continue
        kinds: tuple[str, ...] = (
            "plain",
            "abandoned_sentinel",
            "sentinel",
            "late_rank",
            "abandoned_partial_state",
        )
        kinds += ("staged", "abandoned_array_state", "abandoned_staged")
        plan += [SaveSpec("hf", kind, base + 10 * i) for i, kind in enumerate(kinds)]
        plan.insert(len(plan) - 4, SaveSpec("hf", "late_rank", base + 35))
        if r == 0:
            plan += [SaveSpec("hf", "best", 0), SaveSpec("hf", "runs", 0)]
    if framework == "dcp":
        return [*plan, SaveSpec("dcp", "runs", 0)]
    for i in range(0, len(plan) - 1, 3):  # swap neighbours: even within a round the steps do not rise
        plan[i], plan[i + 1] = plan[i + 1], plan[i]
    return plan


def spec_at(framework: str, index: int) -> SaveSpec:
    """Item ``index`` of :func:`endless_plan`: step ``10 * (index + 1)``, kinds in turn."""
    kinds = ENDLESS_KINDS[framework]
    return SaveSpec(framework, kinds[index % len(kinds)], 10 * (index + 1))


def endless_plan(framework: str) -> Iterator[SaveSpec]:
    """Saves that all complete, at rising steps, without end (a run's length is its ``count``)."""
    index = 0
    while True:
        yield spec_at(framework, index)
        index += 1


def complete_folders(plan: list[SaveSpec]) -> set[str]:
    """The folders of the saves in ``plan`` that end up complete."""
    return {spec.folder for spec in plan if spec.completes}
