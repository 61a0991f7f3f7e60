"""The ``dcp`` rule: PyTorch Distributed Checkpoint saves in torchtitan's ``step-<N>`` folders.

Rules:

1. A save is a folder whose whole name is ``step-<N>`` (``<N>`` per names.md §3.2). torchtitan's newer
   ``torch_checkpointing`` backend stages a save as ``tmp_step-<N>`` and renames it when every rank is done;
   the staging folder never matches, and neither does anything else around the name.
2. A save is complete when ``.metadata`` is present: DCP's coordinator renames it into place once every rank
   has written its shards.
3. A save written with ``use_collectives=False`` has no global ``.metadata``: each rank renames its own
   ``__<rank>.metadata`` into place when its part is written (and torch's loader falls back to it). Such a
   save is complete only when the world size N is known and ``__0.metadata`` … ``__<N-1>.metadata`` are
   all present; with N unknown it is never complete, because a rank that has not finished leaves no trace
   to wait for.
4. Cost: with N unknown a save costs one existence check (``.metadata``); with N known, one listing of the
   save (which answers both questions).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves, step_of
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["METADATA", "DcpRule"]

METADATA = ".metadata"
_NAME = re.compile(r"step-([0-9]+)")
_RANK_METADATA = re.compile(r"__([0-9]+)\.metadata")


def dcp_step(item: Item) -> int | None:
    """The step of a ``step-<N>`` folder (rule 1), else ``None``."""
    match = _NAME.fullmatch(item.name)
    if item.kind is not Kind.FOLDER or match is None:
        return None
    return step_of(match.group(1))


@attrs.frozen
class DcpRule:
    """The ``dcp`` rule; ``world_size`` (when known) lets a ``use_collectives=False`` save complete."""

    world_size: int | None = None
    name: str = "dcp"
    pattern: str = "step-<step>"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``step-`` at the largest step."""
        return longest_name("step-{step}")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``step-<N>`` folders, in step order."""
        return select_saves(items, dcp_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """Whether ``.metadata`` exists; with N known, the save's listing instead (rule 4)."""
        if self.world_size is None:
            return Needs(exists=(in_save(save, METADATA),))
        return Needs(listing=True)

    def judge(self, view: SaveView) -> str | None:
        """Complete with ``.metadata``, or with every rank's ``__<rank>.metadata`` when N is known."""
        if view.files is None:
            return None if view.exists(in_save(view.save, METADATA)) else f"no {METADATA}"
        return metadata_reason({f.path for f in view.files}, self.world_size)

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """``.metadata`` alone decides: never any settle, whatever is given."""
        return 0.0


def metadata_reason(names: set[str], world_size: int | None, prefix: str = "") -> str | None:
    """Why a DCP folder whose files are ``names`` (relative to it) is not complete (rules 2 and 3)."""
    if f"{prefix}{METADATA}" in names:
        return None
    ranks = set()
    for name in names:
        if not name.startswith(prefix):
            continue
        match = _RANK_METADATA.fullmatch(name[len(prefix) :])
        if match is not None:
            ranks.add(int(match.group(1)))
    if not ranks:
        return f"no {prefix}{METADATA}"
    if world_size is None:
        return (
            f"no {prefix}{METADATA}, only per-rank __<rank>.metadata files (a use_collectives=False save):"
            " give the world size to accept it once every rank's file is present"
        )
    missing = [rank for rank in range(world_size) if rank not in ranks]
    if missing:
        return f"no {prefix}{METADATA} and no {prefix}__{missing[0]}.metadata (world size {world_size})"
    return None
