"""The ``deepspeed`` rule: DeepSpeed's ``global_step<N>/`` folders and the ``latest`` file beside them.

What DeepSpeed does (reference §1.2, ``DeepSpeedEngine.save_checkpoint``): every rank writes its files into
``<save_dir>/<tag>/`` with ``torch.save`` (a zip, no fsync); global rank 0 then writes ``<save_dir>/latest``
holding the tag, **without waiting for the other ranks** (the only barrier comes after that write). So
``latest`` says rank 0 is done, not that the save is.

Rules (their home, with what they prove and what not, is docs/spec/watcher.md §2.7; numbered as there):

1. ``latest`` beside the save names its tag, or a ``global_step<M>`` of a step at least as great: a later
   save can only have started after this one's final barrier. (A save is a folder ``global_step<S>``, §1.)
2. The shard names form whole grids: a model-states file for every model-parallel rank ``0 … max``
   (``mp_rank_XX_model_states.pt``, or ``zero_pp_rank_<dp>_mp_rank_XX_model_states.pt`` under ZeRO-3, then
   for every data-parallel rank too), and with optimizer shards
   (``[bf16_]zero_pp_rank_<dp>_mp_rank_XX_optim_states.pt``) one for every (dp, mp) of the grid all span.
3. With the world size N known, the files account for N ranks: N optimizer shards, else N ZeRO-3 model
   shards, else (no ZeRO shards: a data-parallel rank then writes nothing, so only dp = 1 is provable)
   N ``mp_rank`` files.
4. Every ``.pt`` file in the save is a complete zip (its end record is written last).

Settle: one interval with N unknown (a rank that has not created its file leaves no trace), 0 with N
known (rules 2-3 account for every rank's file).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves, step_of, zip_reason
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["LATEST", "DeepSpeedRule", "shards_reason"]

LATEST = "latest"
_LATEST_LIMIT = 4096
_NAME = re.compile(r"global_step([0-9]+)")
_MODEL = re.compile(r"mp_rank_([0-9]+)_model_states\.pt")
_ZERO_MODEL = re.compile(r"zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_model_states\.pt")
_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_([0-9]+)_mp_rank_([0-9]+)_optim_states\.pt")


def deepspeed_step(item: Item) -> int | None:
    """The step of a ``global_step<N>`` folder (watcher.md §1), else ``None``."""
    match = _NAME.fullmatch(item.name)
    if item.kind is not Kind.FOLDER or match is None:
        return None
    return step_of(match.group(1))


def _first_gap(cells: set[tuple[int, int]], dps: int, mps: int) -> tuple[int, int] | None:
    for dp in range(dps):
        for mp in range(mps):
            if (dp, mp) not in cells:
                return (dp, mp)
    return None


def _world_reason(
    model: set[int], zero_model: set[tuple[int, int]], optim: set[tuple[int, int]], world_size: int
) -> str | None:
    """Why files that already form whole grids (rule 2) do not account for ``world_size`` ranks (rule 3).

    Each rank writes one optimizer shard (ZeRO 1-3, and bf16 at any stage), and under ZeRO-3 one model
    shard; without either only data-parallel rank 0 of each model-parallel group writes (its mp_rank file).
    """
    if optim:
        if len(optim) != world_size:
            return f"{len(optim)} optimizer shard(s) for a world size of {world_size}"
    elif zero_model:
        if len(zero_model) != world_size:
            shards = f"{len(zero_model)} ZeRO-3 model shard(s) and no optimizer shards"
            return f"{shards} for a world size of {world_size}"
    elif len(model) != world_size:
        # A data-parallel rank writes nothing here, so names cannot tell dp > 1 from a missing top mp rank.
        return f"{len(model)} mp_rank_XX_model_states.pt and no ZeRO shards for a world size of {world_size}"
    return None


def shards_reason(names: Iterable[str], world_size: int | None) -> str | None:
    """Why the shard files ``names`` (relative to the tag folder) are not every expected shard (rules 2-3).

    >>> shards_reason(["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"], 2) is None
    True
    >>> shards_reason(["mp_rank_00_model_states.pt"], 2)
    '1 mp_rank_XX_model_states.pt and no ZeRO shards for a world size of 2'
    """
    model: set[int] = set()
    zero_model: set[tuple[int, int]] = set()
    optim: set[tuple[int, int]] = set()
    for name in names:
        if match := _ZERO_MODEL.fullmatch(name):
            zero_model.add((int(match.group(1)), int(match.group(2))))
        elif match := _MODEL.fullmatch(name):
            model.add(int(match.group(1)))
        elif match := _OPTIM.fullmatch(name):
            optim.add((int(match.group(1)), int(match.group(2))))
    if not model and not zero_model:
        return "no *_model_states.pt"
    mps = 1 + max([*model, *(mp for _, mp in zero_model), *(mp for _, mp in optim)])
    dps = 1 + max([0, *(dp for dp, _ in zero_model), *(dp for dp, _ in optim)])
    if zero_model:
        gap = _first_gap(zero_model, dps, mps)
        if gap is not None:
            return f"no zero_pp_rank_{gap[0]}_mp_rank_{gap[1]:02d}_model_states.pt"
    else:
        missing = [mp for mp in range(mps) if mp not in model]
        if missing:
            return f"no mp_rank_{missing[0]:02d}_model_states.pt"
    if optim:
        gap = _first_gap(optim, dps, mps)
        if gap is not None:
            return f"no zero_pp_rank_{gap[0]}_mp_rank_{gap[1]:02d}_optim_states.pt"
    return None if world_size is None else _world_reason(model, zero_model, optim, world_size)


def latest_reason(latest: bytes | None, tag: str, step: int | None, where: str = LATEST) -> str | None:
    """Why ``latest`` (its content) does not name ``tag`` or a later ``global_step<M>`` (rule 1)."""
    if latest is None:
        return f"no {where} (DeepSpeed's rank 0 writes it when its part is saved)"
    try:
        named = latest.decode("utf-8").strip()
    except UnicodeDecodeError:
        return f"{where} is not text"
    if named == tag:
        return None
    match = _NAME.fullmatch(named)
    if match is not None and step is not None:
        later = step_of(match.group(1))
        if later is not None and later >= step:
            return None
    return f"{where} names {named[:64]!r}, not {tag!r} or a later step"


def pt_files(files: Iterable[FileInfo]) -> list[str]:
    """The ``.pt`` files of a listing, in listing order."""
    return [f.path for f in files if f.path.endswith(".pt")]


@attrs.frozen
class DeepSpeedRule:
    """The ``deepspeed`` rule; ``world_size`` (when known): the number of ranks the files must account for."""

    world_size: int | None = None
    name: str = "deepspeed"
    pattern: str = "global_step<step>"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``global_step`` at the largest step."""
        return longest_name("global_step{step}")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``global_step<N>`` folders, in step order."""
        return select_saves(items, deepspeed_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """``latest`` beside the save, the save's listing, then the tail of every ``.pt`` file."""
        tails = () if files is None else tuple(in_save(save, p) for p in pt_files(files))
        return Needs(listing=True, heads=((LATEST, _LATEST_LIMIT),), tails=tails)

    def judge(self, view: SaveView) -> str | None:
        """Rules 1-4, in that order."""
        save = view.save
        reason = latest_reason(view.heads.get(LATEST), save.name, save.step)
        if reason is not None:
            return reason
        files = view.files or ()
        reason = shards_reason((f.path for f in files), self.world_size)
        if reason is not None:
            return reason
        for path in pt_files(files):
            reason = zip_reason(view, in_save(save, path), path)
            if reason is not None:
                return reason
        return None

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """One interval when the world size is unknown, else 0 (watcher.md §2.7, settle)."""
        if given is not None:
            return given
        return interval if self.world_size is None else 0.0
