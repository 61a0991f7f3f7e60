"""The ``deepspeed`` rule: DeepSpeed's ``global_step<N>/`` folders and the ``latest`` file beside them.

What DeepSpeed does (reference §1.2, ``DeepSpeedEngine.save_checkpoint``): every rank writes its files into
``<save_dir>/<tag>/`` with ``torch.save`` (a zip, no fsync); global rank 0 then writes ``<save_dir>/latest``
holding the tag, **without waiting for the other ranks** (the only barrier comes after that write). So
``latest`` says rank 0 is done, not that the save is.

Rules:

1. A save is a folder named ``global_step<N>`` (DeepSpeed's default tag), ``<N>`` per names.md §3.2.
2. ``latest`` beside the save names its tag, or a later ``global_step<M>`` (M >= N): a later save can only
   have started after this one's final barrier.
3. Every expected shard is present: a model-states file for every model-parallel rank ``0 … max``
   (``mp_rank_XX_model_states.pt``, or ``zero_pp_rank_<dp>_mp_rank_XX_model_states.pt`` under ZeRO-3, then for
   every data-parallel rank too), and when there are optimizer-states files
   (``[bf16_]zero_pp_rank_<dp>_mp_rank_XX_optim_states.pt``) one for every (dp, mp) pair of the grid the files
   span. When the world size N is known, that grid has exactly N cells (each rank writes one optimizer shard).
4. Every ``.pt`` file in the save is a complete zip (its end record is written last).
5. Settle: a rank that has not yet created its file leaves no trace; rule 3 catches it only within the grid
   the other files span, or with N known. So with N unknown the default settle time is one interval
   (the listing must stay unchanged that long); with N known it is 0.
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
    """The step of a ``global_step<N>`` folder (rule 1), else ``None``."""
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


def shards_reason(names: Iterable[str], world_size: int | None) -> str | None:
    """Why the shard files ``names`` (relative to the tag folder) are not every expected shard (rule 3)."""
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
        if world_size is not None and dps * mps != world_size:
            return f"{dps * mps} optimizer shard(s) for a world size of {world_size}"
    return None


def latest_reason(latest: bytes | None, tag: str, step: int | None, where: str = LATEST) -> str | None:
    """Why ``latest`` (its content) does not name ``tag`` or a later ``global_step<M>`` (rule 2)."""
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
    """The ``deepspeed`` rule; ``world_size`` (when known) fixes the number of optimizer shards."""

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
        """Rules 2-4, in that order."""
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
        """One interval when the world size is unknown, else 0 (rule 5)."""
        if given is not None:
            return given
        return interval if self.world_size is None else 0.0
