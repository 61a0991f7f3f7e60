"""The ``megatron`` rule: Megatron-LM / Megatron-Core ``iter_<NNNNNNN>/`` folders and their tracker.

What Megatron does (reference §1.3): ranks write ``iter_<N>/``; for the ``torch_dist`` format the shards
(fsynced), then ``.metadata`` (DCP's tmp + fsync + rename), then rank 0 writes ``metadata.json`` (format
and version, not atomic); only once every rank has finished (a barrier for sync saves, an all-reduce for
async ones) does rank 0 overwrite ``latest_checkpointed_iteration.txt`` beside the folders with N.

Rules:

1. A save is a folder named ``iter_<N>`` with at least seven digits (``iter_{:07d}``), ``<N>`` per
   names.md §3.2. ``release/`` carries no iteration and is not a save.
2. The tracker ``latest_checkpointed_iteration.txt`` beside the save holds an iteration >= N. The tracker
   may move *backwards* (a rerun, or a zombie, writes an older number): a save the tracker passed once was
   complete then, and fencing such writers is the epoch's job, not the tracker's; the rule only ever asks
   "has the tracker reached N".
3. The format's own marker: when ``metadata.json`` is present it parses as a JSON object, and for the
   DCP-based backends (``torch_dist``, ``torch_dcp``, ``fsdp_dtensor``, or no backend named) ``.metadata``
   is present. Without ``metadata.json``, ``.metadata`` alone will do; otherwise the legacy format's
   ``mp_rank_*/model_optim_rng.pt`` files must exist and be complete zips (as must ``distrib_optim.pt``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import json_object, select_saves, step_of, zip_reason
from ckpt.domain.rules.dcp import METADATA
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["FORMAT_FILE", "TRACKER", "MegatronRule"]

TRACKER = "latest_checkpointed_iteration.txt"
FORMAT_FILE = "metadata.json"
_TRACKER_LIMIT = 1024
_FORMAT_LIMIT = 64 * 1024
_NAME = re.compile(r"iter_([0-9]{7,})")
_LEGACY = re.compile(r"mp_rank_[0-9]+(?:_[0-9]+){0,2}/(?:model_optim_rng|distrib_optim)\.pt")
_DCP_BACKENDS = ("torch_dist", "torch_dcp", "fsdp_dtensor")


def megatron_step(item: Item) -> int | None:
    """The iteration of an ``iter_<NNNNNNN>`` folder (rule 1), else ``None``."""
    match = _NAME.fullmatch(item.name)
    if item.kind is not Kind.FOLDER or match is None:
        return None
    return step_of(match.group(1))


def tracker_reason(tracker: bytes | None, step: int) -> str | None:
    """Why the tracker's content does not say iteration ``step`` is saved (rule 2)."""
    if tracker is None:
        return f"no {TRACKER} beside the save"
    try:
        text = tracker.decode("ascii").strip()
    except UnicodeDecodeError:
        text = ""
    value = step_of(text) if text else None
    if value is None:
        return f"{TRACKER} does not hold an iteration number: {tracker[:32]!r}"
    if value < step:
        return f"{TRACKER} names iteration {value}, before {step}"
    return None


@attrs.frozen
class MegatronRule:
    """The ``megatron`` rule."""

    name: str = "megatron"
    pattern: str = "iter_<step, 7+ digits>"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``iter_`` at the largest step."""
        return longest_name("iter_{step}")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``iter_<NNNNNNN>`` folders, in step order."""
        return select_saves(items, megatron_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """The tracker, the save's listing, then ``metadata.json`` or the legacy files' tails."""
        heads: tuple[tuple[str, int], ...] = ((TRACKER, _TRACKER_LIMIT),)
        if files is None:
            return Needs(listing=True, heads=heads)
        names = {f.path for f in files}
        if FORMAT_FILE in names:
            return Needs(listing=True, heads=(*heads, (in_save(save, FORMAT_FILE), _FORMAT_LIMIT)))
        legacy = tuple(in_save(save, n) for n in sorted(names) if _LEGACY.fullmatch(n))
        return Needs(listing=True, heads=heads, tails=legacy)

    def judge(self, view: SaveView) -> str | None:
        """Rule 2, then rule 3."""
        save = view.save
        reason = tracker_reason(view.heads.get(TRACKER), save.step)
        if reason is not None:
            return reason
        names = {f.path for f in view.files or ()}
        if FORMAT_FILE in names:
            document = json_object(view.heads.get(in_save(save, FORMAT_FILE)))
            if document is None:
                return f"{FORMAT_FILE} is not a JSON object"
            backend = document.get("sharded_backend")
            if (backend is None or backend in _DCP_BACKENDS) and METADATA not in names:
                return f"no {METADATA} (sharded_backend {backend or 'not named'})"
            return None
        if METADATA in names:
            return None
        legacy = sorted(n for n in names if _LEGACY.fullmatch(n))
        if not legacy:
            return f"no {FORMAT_FILE}, {METADATA} or mp_rank_*/model_optim_rng.pt"
        for path in legacy:
            reason = zip_reason(view, in_save(save, path), path)
            if reason is not None:
                return reason
        return None

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """The tracker moves only after every rank is done: no settle."""
        return 0.0 if given is None else given
