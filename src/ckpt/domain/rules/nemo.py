"""The ``nemo`` rule: NVIDIA NeMo checkpoints and their ``-unfinished`` markers.

What NeMo does (reference §1.5): before a save, global rank 0 touches a *sibling* marker
``<checkpoint path minus .ckpt minus -EMA>-unfinished`` and all ranks meet at a barrier; the marker is
removed only after a barrier once the save is finalized (for async saves, in the finalize callback).
Removing a checkpoint also sets the marker first. NeMo's own startup deletes every marked checkpoint.

Rules:

1. A save is a ``.ckpt`` file, or a folder (NeMo 2's distributed checkpoints drop the ``.ckpt``), whose
   name carries ``step=<S>``; failing that, ``consumed_samples=<n>`` (NeMo 2 with Megatron names
   checkpoints by samples): the step is then n divided by ``samples_per_step`` when that is configured,
   else n itself (it grows with the step, which is all the log's order needs). A ``-unfinished`` marker is
   never a save; links never are.
2. ``<name>-last`` is the same step as ``<name>``: when both are present, only ``<name>`` is a save; a
   ``-last`` with no twin is a save.
3. A save is complete when its marker does not exist (looked up after the save was listed; the marker is
   created before any of the save's files, so a save seen without it is finished). The default settle is
   0; on a filesystem whose listings may lag (NFS), a settle time makes the marker's absence hold for that
   long. A missing marker says nothing of a checkpoint that is gone: that a save holds something is
   checked for every rule, after its verdict (``ckpt.domain.rules.presence``, spec/watcher.md §2.6).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import step_of
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView

__all__ = ["UNFINISHED", "NemoRule", "unfinished_marker"]

UNFINISHED = "-unfinished"
_STEP = re.compile(r"(?:^|-)step=([0-9]+)(?=-|$)")
_SAMPLES = re.compile(r"(?:^|-)consumed_samples=([0-9]+)(?:\.0+)?(?=-|$)")


def _base(name: str) -> str:
    return name.removesuffix(".ckpt").removesuffix("-EMA")


def unfinished_marker(name: str) -> str:
    """The marker NeMo sets beside the checkpoint ``name`` while it is written (or removed)."""
    return _base(name) + UNFINISHED


def _twin(name: str) -> str | None:
    """``name`` without its ``-last`` suffix, or ``None`` when it has none."""
    stem = name.removesuffix(".ckpt")
    if not stem.endswith("-last"):
        return None
    return stem.removesuffix("-last") + name[len(stem) :]


@attrs.frozen
class NemoRule:
    """The ``nemo`` rule; ``samples_per_step`` turns ``consumed_samples`` into a step (rule 1)."""

    samples_per_step: int | None = None
    name: str = "nemo"
    pattern: str = "<…>step=<step><…>[.ckpt]"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``step=<step>`` at the largest step (the
        ``<…>`` parts are the trainer's)."""
        return longest_name("step={step}")

    def step(self, item: Item) -> int | None:
        """The step of a checkpoint item (rule 1), else ``None``."""
        name = item.name
        if name.endswith(UNFINISHED) or (item.kind is Kind.FILE and not name.endswith(".ckpt")):
            return None
        stem = _base(name)
        if match := _STEP.search(stem):
            return step_of(match.group(1))
        if match := _SAMPLES.search(stem):
            samples = step_of(match.group(1))
            if samples is None or self.samples_per_step is None:
                return samples
            return samples // self.samples_per_step
        return None

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """Checkpoints with a step, ``-last`` twins dropped (rule 2), in step order."""
        names = {item.name for item in items}
        found = []
        for item in items:
            twin = _twin(item.name)
            if twin is not None and twin in names:
                continue
            value = self.step(item)
            if value is not None:
                found.append(Save(value, item.name, item.kind))
        return sorted(found, key=lambda s: s.key)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """Whether the marker beside the save exists."""
        return Needs(exists=(unfinished_marker(save.name),))

    def judge(self, view: SaveView) -> str | None:
        """Complete when the marker is absent (rule 3)."""
        marker = unfinished_marker(view.save.name)
        if view.exists(marker):
            return f"{marker} is present (NeMo is still writing, or removing, it)"
        return None

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """The marker decides: no settle by default (rule 3)."""
        return 0.0 if given is None else given
