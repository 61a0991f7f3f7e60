"""The ``lightning`` rule: PyTorch Lightning saves, single files and sharded folders, in two layouts.

What Lightning does (reference §1.4; ``lightning/pytorch/strategies/{fsdp,model_parallel}.py``): a
single-file save is ``torch.save`` (a zip) into a temporary file that fsspec then moves onto
``<dirpath>/<filename>.ckpt``; the move is a rename on one filesystem, but a copy that grows the final file
in place when ``$TMPDIR`` is elsewhere. Nothing is fsynced. The sharded strategies (FSDP with
``state_dict_type="sharded"``, ModelParallel) make a *folder* named like the file: every rank writes its
DCP shard ``__<rank>_<i>.distcp``, DCP's coordinator then writes ``.metadata.tmp`` and renames it to
``.metadata`` once every rank's write is done, and global rank 0 then ``torch.save``\\ s ``meta.pt`` (the
rest of the state) in place, last. The DeepSpeed strategy writes DeepSpeed's layout into the folder with
the tag ``checkpoint``. The spec's home for all of this is docs/spec/watcher.md §2.8.

Rules:

1. A save is, in the saves location, either
   a. an item named ``<stem>.ckpt`` whose stem carries ``step=<S>`` as one of its ``-`` separated parts
      (Lightning's default ``epoch=<e>-step=<S>``, a ``-v<n>`` version suffix allowed): the *checkpoint*
      is the item itself; or
   b. a folder named exactly ``step-<S>`` (``ckpt.integrations.lightning``'s ``CkptModelCheckpoint``,
      whose ``filename`` is ``step-{step}/model``): the checkpoint is ``model.ckpt`` inside it, a file or
      a sharded folder.
   A ``.ckpt`` name without a step is not a save. ``last.ckpt`` and any name whose stem is ``last`` or ends
   with ``-last`` (optionally versioned) duplicate another save and are never saves; neither are links (the
   store never lists them as files or folders).
2. A checkpoint that is a regular file is complete when it is a complete zip (``ckpt.domain.zip_end``,
   watcher.md §2.4), and, in the watcher, once its size has stayed unchanged for the settle time (default:
   one interval), which covers a file growing in place.
3. A checkpoint that is a folder holding ``latest`` and no ``meta.pt`` is a DeepSpeed-strategy save and
   follows the ``deepspeed`` rule with the tag ``checkpoint``: ``latest`` inside the folder names it, the
   shards under ``checkpoint/`` form whole grids and account for the world size when it is known, and every
   ``.pt`` there is a complete zip.
4. Any other checkpoint folder is sharded: complete when DCP's metadata rule holds in it (``dcp`` rules 2-3:
   ``.metadata``, or with the world size N known and no ``.metadata`` every ``__<r>.metadata`` for r < N)
   and ``meta.pt`` is a complete zip. ``meta.pt`` comes after ``.metadata``, so every file boundary of the
   save before the last byte of ``meta.pt`` fails one of the two.
5. A ``step-<S>`` folder that holds no ``model.ckpt`` file and no file under ``model.ckpt/`` is not
   complete (the reason says so, and says when the folder holds a DCP save of its own, which
   ``--framework dcp`` takes).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves, step_of, zip_reason
from ckpt.domain.rules.dcp import METADATA, metadata_reason
from ckpt.domain.rules.deepspeed import LATEST, latest_reason, pt_files, shards_reason
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["CHECKPOINT", "META", "LightningRule", "lightning_step"]

META = "meta.pt"
CHECKPOINT = "model.ckpt"
"""The checkpoint inside a ``step-<S>`` folder (rule 1b)."""
_DEEPSPEED_TAG = "checkpoint"
_LATEST_LIMIT = 4096
_STEP = re.compile(r"(?:^|-)step=([0-9]+)(?=-|$)")
_LAST = re.compile(r"(?:^|.*-)last(?:-v[0-9]+)?")
_FOLDER = re.compile(r"step-([0-9]+)")


def lightning_step(item: Item) -> int | None:
    """The step of a ``…step=<S>….ckpt`` file or folder, or of a ``step-<S>`` folder (rule 1), or ``None``."""
    folder = _FOLDER.fullmatch(item.name)
    if folder is not None:
        return step_of(folder.group(1)) if item.kind is Kind.FOLDER else None
    if not item.name.endswith(".ckpt"):
        return None
    stem = item.name[: -len(".ckpt")]
    if _LAST.fullmatch(stem):
        return None
    match = _STEP.search(stem)
    return None if match is None else step_of(match.group(1))


def _checkpoint(save: Save) -> str:
    """Where the checkpoint of ``save`` is, relative to the save (``""``: the save itself, rule 1a)."""
    return f"{CHECKPOINT}/" if _FOLDER.fullmatch(save.name) else ""


@attrs.frozen
class LightningRule:
    """The ``lightning`` rule; ``world_size`` applies to a sharded save's per-rank DCP metadata (when it has
    no ``.metadata``) and to a DeepSpeed-strategy save's shards."""

    world_size: int | None = None
    name: str = "lightning"
    pattern: str = "<…>step=<step><…>.ckpt or step-<step>/model.ckpt"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``step=<step>.ckpt`` at the largest step
        (the ``<…>`` parts are the trainer's; ``step-<step>`` is shorter)."""
        return longest_name("step={step}.ckpt")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``.ckpt`` files and folders with a step in the name, and ``step-<S>`` folders, in step order."""
        return select_saves(items, lightning_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """A ``.ckpt`` file: its tail. A folder: its listing, then the checkpoint's tail (a file), or
        ``meta.pt``'s tail (sharded), or ``latest`` and the ``.pt`` tails (DeepSpeed)."""
        if save.kind is Kind.FILE:
            return Needs(tails=(save.name,))
        if files is None:
            return Needs(listing=True)
        inner = _checkpoint(save)
        names = {f.path for f in files}
        if inner and CHECKPOINT in names:
            return Needs(listing=True, tails=(in_save(save, CHECKPOINT),))
        if f"{inner}{LATEST}" in names and f"{inner}{META}" not in names:
            tag = f"{inner}{_DEEPSPEED_TAG}/"
            shards = pt_files(f for f in files if f.path.startswith(tag))
            return Needs(
                listing=True,
                heads=((in_save(save, f"{inner}{LATEST}"), _LATEST_LIMIT),),
                tails=tuple(in_save(save, p) for p in shards),
            )
        meta = f"{inner}{META}"
        return Needs(listing=True, tails=(in_save(save, meta),) if meta in names else ())

    def judge(self, view: SaveView) -> str | None:
        """Rule 2 for a file checkpoint, rule 3 or 4 for a folder, rule 5 for a ``step-<S>`` folder."""
        save = view.save
        if save.kind is Kind.FILE:
            return zip_reason(view, save.name)
        inner = _checkpoint(save)
        names = {f.path for f in view.files or ()}
        if inner and CHECKPOINT in names:
            return zip_reason(view, in_save(save, CHECKPOINT), CHECKPOINT)
        if inner and not any(n.startswith(inner) for n in names):
            if METADATA in names:
                return f"no {CHECKPOINT} (this is a DCP save, not Lightning's: --framework dcp takes it)"
            return f"no {CHECKPOINT} file, nor any file in a {CHECKPOINT}/ folder"
        if f"{inner}{LATEST}" in names and f"{inner}{META}" not in names:
            return self._deepspeed_reason(view, names, inner)
        reason = metadata_reason(names, self.world_size, inner)
        if reason is not None:
            if f"{inner}{METADATA}" not in names and not any(n.startswith(f"{inner}__") for n in names):
                return f"{reason} (a sharded save) nor {inner}{LATEST} (a DeepSpeed-strategy save)"
            return reason
        return zip_reason(view, in_save(save, f"{inner}{META}"), f"{inner}{META}")

    def _deepspeed_reason(self, view: SaveView, names: set[str], inner: str) -> str | None:
        save = view.save
        latest = f"{inner}{LATEST}"
        reason = latest_reason(view.heads.get(in_save(save, latest)), _DEEPSPEED_TAG, None, latest)
        if reason is not None:
            return reason
        prefix = f"{inner}{_DEEPSPEED_TAG}/"
        shards = [n[len(prefix) :] for n in names if n.startswith(prefix)]
        reason = shards_reason(shards, self.world_size)
        if reason is not None:
            return f"{reason} in {prefix}"
        for path in sorted(n for n in names if n.startswith(prefix) and n.endswith(".pt")):
            reason = zip_reason(view, in_save(save, path), path)
            if reason is not None:
                return reason
        return None

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """One interval: a single file may grow in place while Lightning copies it (rule 2)."""
        return interval if given is None else given
