"""Each framework's save, written file by file in the framework's own order (reference: frameworks-on-disk).

A sequence is a list of :class:`Op`; :func:`states` plays it one file boundary at a time: every plain
write shows first as an empty file, then half written, then whole (a crash, or a scan, can fall between
any two), while renames, removals and ``torch.save``-then-rename writes happen at once. Each state says
whether the save is complete by then, from the sequence's own ``complete_after`` mark, which the tests
compare with the rule's verdict. The same states can be played onto a real folder
(:func:`apply_to_folder`) for the watcher.

The steps are the trainer's :class:`~support.trainer.plan.Op`; where the trainer plays a save in time through
a sink, these sequences are played state by state, so that every state can be judged.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import attrs

from support.rule_layouts import zip_bytes
from support.trainer.plan import Op  # the trainer's steps: here a ``write`` shows as empty, half, then whole

ZIP = zip_bytes(300)
SHARD = bytes(range(256)) * 2


def write(path: str, data: bytes) -> Op:
    return Op("write", path, data)


def put(path: str, data: bytes) -> Op:
    return Op("put", path, data)


def rename(path: str, to: str) -> Op:
    return Op("rename", path, to=to)


def remove(path: str) -> Op:
    return Op("remove", path)


@attrs.frozen
class Sequence:
    """A framework's save: the rule name and options, the ops, the save's name, and after how many ops the
    save is complete (``complete_after``); ``prior`` is what the location holds before the save starts."""

    rule: str
    save: str
    ops: tuple[Op, ...]
    complete_after: int
    options: Mapping[str, object] = attrs.field(factory=dict)
    prior: Mapping[str, bytes] = attrs.field(factory=dict)


def states(seq: Sequence) -> Iterator[tuple[str, dict[str, bytes | None], bool]]:
    """Every state the location passes through: a label, the layout, whether the save is complete."""
    layout: dict[str, bytes | None] = dict(seq.prior)
    yield "before anything", dict(layout), False
    for index, op in enumerate(seq.ops, start=1):
        if op.action == "write":
            parent = op.path.rpartition("/")[0]
            for cut, what in ((0, "created"), (len(op.data) // 2, "half written")):
                layout[op.path] = op.data[:cut]
                layout.pop(f"{parent}/", None)
                # a write still under way completes the save only if it comes after the commit point
                yield f"op {index}: {op.path} {what}", dict(layout), index > seq.complete_after
            layout[op.path] = op.data
        elif op.action == "put":
            layout[op.path] = op.data
        elif op.action == "rename":
            moved = {p: b for p, b in layout.items() if p == op.path or p.startswith(f"{op.path}/")}
            for p in moved:
                del layout[p]
            layout.update({op.to + p[len(op.path) :]: b for p, b in moved.items()})
        elif op.action == "remove":
            layout.pop(op.path)
        elif op.action == "mkdir":
            layout[f"{op.path}/"] = None
        else:
            raise AssertionError(op)
        yield f"op {index}: {op.action} {op.path} done", dict(layout), index >= seq.complete_after


def mkdir(path: str) -> Op:
    return Op("mkdir", path)


def apply_to_folder(layout: Mapping[str, bytes | None], base: Path) -> None:
    """Make the real folder ``base`` hold exactly ``layout`` (files written in place, extras removed)."""
    wanted_files = {p: b for p, b in layout.items() if b is not None}
    wanted_dirs = {p.rstrip("/") for p, b in layout.items() if b is None}
    for path in wanted_files:
        parts = path.split("/")
        wanted_dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    for root, dirs, files in os.walk(base, topdown=False):
        rel = os.path.relpath(root, base)
        for name in files:
            p = name if rel == "." else f"{rel}/{name}"
            if p not in wanted_files:
                os.unlink(os.path.join(root, name))
        for name in dirs:
            p = name if rel == "." else f"{rel}/{name}"
            if p not in wanted_dirs:
                os.rmdir(os.path.join(root, name))
    for d in sorted(wanted_dirs):
        (base / d).mkdir(parents=True, exist_ok=True)
    for p, data in wanted_files.items():
        target = base / p
        if not target.exists() or target.read_bytes() != data:
            target.write_bytes(data)


def _ds(tag: str, world: int) -> list[Op]:
    return [write(f"{tag}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt", ZIP) for r in range(1, world)]


SEQUENCES: dict[str, Sequence] = {
    # torch FileSystemWriter: each rank writes its shards in place, the coordinator writes .metadata.tmp and
    # renames it to .metadata once all are written.
    "dcp": Sequence(
        "dcp",
        "step-10",
        (
            mkdir("step-10"),
            write("step-10/__0_0.distcp", SHARD),
            write("step-10/__1_0.distcp", SHARD),
            write("step-10/.metadata.tmp", SHARD),
            rename("step-10/.metadata.tmp", "step-10/.metadata"),
        ),
        complete_after=5,
    ),
    # torchtitan's torch_checkpointing backend: everything under tmp_step-N, then rank 0 renames the folder.
    "dcp-torchtitan-staged": Sequence(
        "dcp",
        "step-10",
        (
            write("tmp_step-10/__0_0.distcp", SHARD),
            write("tmp_step-10/.metadata.tmp", SHARD),
            rename("tmp_step-10/.metadata.tmp", "tmp_step-10/.metadata"),
            rename("tmp_step-10", "step-10"),
        ),
        complete_after=4,
    ),
    # use_collectives=False: each rank renames its own __<rank>.metadata into place; no global .metadata.
    "dcp-no-collectives": Sequence(
        "dcp",
        "step-10",
        (
            write("step-10/__0_0.distcp", SHARD),
            write("step-10/__0.metadata.tmp", SHARD),
            rename("step-10/__0.metadata.tmp", "step-10/__0.metadata"),
            write("step-10/__1_0.distcp", SHARD),
            write("step-10/__1.metadata.tmp", SHARD),
            rename("step-10/__1.metadata.tmp", "step-10/__1.metadata"),
        ),
        complete_after=6,
        options={"world_size": 2},
    ),
    # DeepSpeed, 3 ranks, ZeRO-2: rank 0 writes its files and then `latest`, while ranks 1 and 2 are
    # still writing their optimizer shards (no barrier before `latest`).
    "deepspeed": Sequence(
        "deepspeed",
        "global_step10",
        (
            mkdir("global_step10"),
            write("global_step10/mp_rank_00_model_states.pt", ZIP),
            write("global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt", ZIP),
            write("latest", b"global_step10"),
            *_ds("global_step10", 3),
            put("zero_to_fp32.py", b"# script"),
        ),
        complete_after=6,
        options={"world_size": 3},
        prior={"latest": b"global_step5"},
    ),
    # DeepSpeed, ZeRO 0 (fp16), tensor-parallel 2, one data-parallel rank: each rank writes its own
    # mp_rank file and nothing else; rank 0 writes `latest` while rank 1 has not created mp_rank_01 yet.
    # With N = 2 known and no settle, only rank 1's whole file completes it (watcher.md §2.7; issue 20).
    "deepspeed-zero0-tp2": Sequence(
        "deepspeed",
        "global_step10",
        (
            mkdir("global_step10"),
            write("global_step10/mp_rank_00_model_states.pt", ZIP),
            write("latest", b"global_step10"),
            write("global_step10/mp_rank_01_model_states.pt", ZIP),
        ),
        complete_after=4,
        options={"world_size": 2},
        prior={"latest": b"global_step5"},
    ),
    # DeepSpeed, ZeRO-1, tensor-parallel 2 x data-parallel 2 (N = 4): dp rank 0 of each mp group writes the
    # model file, every rank its optimizer shard; data-parallel rank 1 finishes last, after `latest`.
    "deepspeed-zero1-tp2-dp2": Sequence(
        "deepspeed",
        "global_step10",
        (
            mkdir("global_step10"),
            write("global_step10/mp_rank_00_model_states.pt", ZIP),
            write("global_step10/zero_pp_rank_0_mp_rank_00_optim_states.pt", ZIP),
            write("latest", b"global_step10"),
            write("global_step10/mp_rank_01_model_states.pt", ZIP),
            write("global_step10/zero_pp_rank_0_mp_rank_01_optim_states.pt", ZIP),
            write("global_step10/zero_pp_rank_1_mp_rank_00_optim_states.pt", ZIP),
            write("global_step10/zero_pp_rank_1_mp_rank_01_optim_states.pt", ZIP),
        ),
        complete_after=8,
        options={"world_size": 4},
        prior={"latest": b"global_step5"},
    ),
    # Megatron torch_dist, 2 ranks: shards (fsynced), .metadata (tmp + rename), metadata.json (plain write),
    # then rank 0 rewrites the tracker; tokenizer assets may follow into the folder.
    "megatron": Sequence(
        "megatron",
        "iter_0002000",
        (
            mkdir("iter_0002000"),
            write("iter_0002000/__0_0.distcp", SHARD),
            write("iter_0002000/__1_0.distcp", SHARD),
            put("iter_0002000/.metadata", SHARD),
            write("iter_0002000/metadata.json", b'{"sharded_backend": "torch_dist"}'),
            write("latest_checkpointed_iteration.txt", b"2000"),
            write("iter_0002000/tokenizer/tokenizer.json", b'{"model": "bpe"}'),
        ),
        complete_after=6,
        prior={"latest_checkpointed_iteration.txt": b"1000"},
    ),
    # Lightning single file, $TMPDIR on another filesystem: shutil.move copies, the .ckpt grows in place.
    "lightning-file-copied": Sequence(
        "lightning",
        "epoch=0-step=100.ckpt",
        (write("epoch=0-step=100.ckpt", ZIP),),
        complete_after=1,
    ),
    # Lightning single file, same filesystem: the move is a rename, the file appears whole.
    "lightning-file-renamed": Sequence(
        "lightning",
        "epoch=0-step=100.ckpt",
        (put("epoch=0-step=100.ckpt", ZIP), put("last.ckpt", ZIP)),
        complete_after=1,
    ),
    # Lightning FSDP / ModelParallel: DCP into a folder named like the file, then rank 0 writes meta.pt.
    "lightning-sharded": Sequence(
        "lightning",
        "epoch=0-step=100.ckpt",
        (
            mkdir("epoch=0-step=100.ckpt"),
            write("epoch=0-step=100.ckpt/__0_0.distcp", SHARD),
            write("epoch=0-step=100.ckpt/__1_0.distcp", SHARD),
            write("epoch=0-step=100.ckpt/.metadata.tmp", SHARD),
            rename("epoch=0-step=100.ckpt/.metadata.tmp", "epoch=0-step=100.ckpt/.metadata"),
            write("epoch=0-step=100.ckpt/meta.pt", ZIP),
        ),
        complete_after=6,
    ),
    # NeMo 2 with Megatron: marker first, then the distributed checkpoint and context, then the marker goes.
    "nemo": Sequence(
        "nemo",
        "run--val_loss=2.0000-step=100-consumed_samples=800.0",
        (
            put("run--val_loss=2.0000-step=100-consumed_samples=800.0-unfinished", b""),
            mkdir("run--val_loss=2.0000-step=100-consumed_samples=800.0"),
            write("run--val_loss=2.0000-step=100-consumed_samples=800.0/weights/__0_0.distcp", SHARD),
            put("run--val_loss=2.0000-step=100-consumed_samples=800.0/weights/.metadata", SHARD),
            write("run--val_loss=2.0000-step=100-consumed_samples=800.0/weights/metadata.json", b"{}"),
            write("run--val_loss=2.0000-step=100-consumed_samples=800.0/context/model.yaml", b"model: x"),
            remove("run--val_loss=2.0000-step=100-consumed_samples=800.0-unfinished"),
        ),
        complete_after=7,
    ),
    # Orbax, rename mode: all in <step>.orbax-checkpoint-tmp, the marker, then the rename.
    "orbax-rename": Sequence(
        "orbax",
        "100",
        (
            mkdir("100.orbax-checkpoint-tmp"),
            write("100.orbax-checkpoint-tmp/_CHECKPOINT_METADATA", b'{"init_timestamp_nsecs": 1}'),
            write("100.orbax-checkpoint-tmp/default/array/0", SHARD),
            write("100.orbax-checkpoint-tmp/commit_success.txt", b"Checkpoint commit was successful"),
            rename("100.orbax-checkpoint-tmp", "100"),
        ),
        complete_after=5,
    ),
    # Orbax, commit-file mode: the final name from the start, the marker last.
    "orbax-commit-file": Sequence(
        "orbax",
        "100",
        (
            mkdir("100"),
            write("100/_CHECKPOINT_METADATA", b'{"init_timestamp_nsecs": 1}'),
            write("100/default/array/0", SHARD),
            write("100/_CHECKPOINT_METADATA", b'{"init_timestamp_nsecs": 1, "commit_timestamp_nsecs": 2}'),
            # The marker's creation is the commit (Orbax writes it after everything else); what it holds
            # is never read, so it counts from the moment it exists.
            put("100/commit_success.txt", b"Checkpoint commit was successful"),
        ),
        complete_after=5,
    ),
}
