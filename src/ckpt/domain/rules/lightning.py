"""The ``lightning`` rule: PyTorch Lightning ``ModelCheckpoint`` saves, single files and sharded folders.

What Lightning does (reference §1.4): a single-file save is ``torch.save`` (a zip) into a temporary file
that fsspec then moves onto ``<dirpath>/<filename>.ckpt``; the move is a rename on one filesystem, but a
copy that grows the final file in place when ``$TMPDIR`` is elsewhere. Nothing is fsynced. Sharded
strategies (FSDP, ModelParallel) write a *folder* named like the file: DCP shards and ``.metadata``, then
``meta.pt`` last; the DeepSpeed strategy writes DeepSpeed's layout into the folder with the tag
``checkpoint``.

Rules:

1. A save is an item named ``<stem>.ckpt`` whose stem carries ``step=<S>`` as one of its ``-``
   separated parts (Lightning's default ``epoch=<e>-step=<S>``, a ``-v<n>`` version suffix allowed). A
   name without a step is not a save. ``last.ckpt`` and any name whose stem is ``last`` or ends with
   ``-last`` (optionally versioned) duplicate another save and are never saves; neither are links (the
   store never lists them as files or folders).
2. A single-file save (a regular file) is complete when it ends with a zip end record (zipend.py), and, in the
   watcher, once its size has stayed unchanged for the settle time (default: one interval), which covers a
   file growing in place.
3. A sharded save (a folder) is complete when it holds ``.metadata`` and ``meta.pt``, and ``meta.pt`` is a
   complete zip; a DeepSpeed-strategy save (a folder holding ``latest``) follows the ``deepspeed`` rule with
   the tag ``checkpoint``: ``latest`` inside the folder names it, every shard under ``checkpoint/`` is
   present and every ``.pt`` there is a complete zip.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves, step_of, zip_reason
from ckpt.domain.rules.dcp import METADATA
from ckpt.domain.rules.deepspeed import LATEST, latest_reason, pt_files, shards_reason
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["META", "LightningRule", "lightning_step"]

META = "meta.pt"
_DEEPSPEED_TAG = "checkpoint"
_STEP = re.compile(r"(?:^|-)step=([0-9]+)(?=-|$)")
_LAST = re.compile(r"(?:^|.*-)last(?:-v[0-9]+)?")


def lightning_step(item: Item) -> int | None:
    """The step of a ``…step=<S>….ckpt`` file or folder (rule 1), else ``None``."""
    if not item.name.endswith(".ckpt"):
        return None
    stem = item.name[: -len(".ckpt")]
    if _LAST.fullmatch(stem):
        return None
    match = _STEP.search(stem)
    return None if match is None else step_of(match.group(1))


@attrs.frozen
class LightningRule:
    """The ``lightning`` rule; ``world_size`` applies to a DeepSpeed-strategy save's shards."""

    world_size: int | None = None
    name: str = "lightning"
    pattern: str = "<…>step=<step><…>.ckpt"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``step=<step>.ckpt`` at the largest step
        (the ``<…>`` parts are the trainer's)."""
        return longest_name("step={step}.ckpt")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``.ckpt`` files and folders with a step in the name, in step order."""
        return select_saves(items, lightning_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """A file: its tail. A folder: its listing, then ``meta.pt``'s tail or DeepSpeed's files."""
        if save.kind is Kind.FILE:
            return Needs(tails=(save.name,))
        if files is None:
            return Needs(listing=True)
        names = {f.path for f in files}
        if LATEST in names and META not in names:
            shards = pt_files(f for f in files if f.path.startswith(f"{_DEEPSPEED_TAG}/"))
            return Needs(
                listing=True,
                heads=((in_save(save, LATEST), 4096),),
                tails=tuple(in_save(save, p) for p in shards),
            )
        return Needs(listing=True, tails=(in_save(save, META),) if META in names else ())

    def judge(self, view: SaveView) -> str | None:
        """Rule 2 for a file, rule 3 for a folder."""
        save = view.save
        if save.kind is Kind.FILE:
            return zip_reason(view, save.name)
        names = {f.path for f in view.files or ()}
        if LATEST in names and META not in names:
            return self._deepspeed_reason(view, names)
        if METADATA not in names:
            return f"no {METADATA} (a sharded save) nor {LATEST} (a DeepSpeed-strategy save)"
        return zip_reason(view, in_save(save, META), META)

    def _deepspeed_reason(self, view: SaveView, names: set[str]) -> str | None:
        save = view.save
        reason = latest_reason(view.heads.get(in_save(save, LATEST)), _DEEPSPEED_TAG, None)
        if reason is not None:
            return reason
        prefix = f"{_DEEPSPEED_TAG}/"
        inner = [n[len(prefix) :] for n in names if n.startswith(prefix)]
        reason = shards_reason(inner, self.world_size)
        if reason is not None:
            return f"{reason} in {_DEEPSPEED_TAG}/"
        for path in sorted(n for n in names if n.startswith(prefix) and n.endswith(".pt")):
            reason = zip_reason(view, in_save(save, path), path)
            if reason is not None:
                return reason
        return None

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """One interval: a single file may grow in place while Lightning copies it (rule 2)."""
        return interval if given is None else given
