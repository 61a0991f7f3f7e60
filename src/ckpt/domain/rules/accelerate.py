"""The ``accelerate`` rule: ``Accelerator.save_state`` folders ``step-<N>`` (the integration's naming).

What Accelerate writes (``accelerator.py`` ``save_state``, ``checkpointing.py``; reference §1.6), in this
order, with no barrier anywhere: on the main process the model (``model.safetensors``, ``model_<i>``… for
more models, or ``pytorch_model*.bin``), ``optimizer*.bin``, ``scheduler*.bin``, ``sampler*.bin``; on
every process ``dl_state_dict*.bin`` and ``scaler.pt`` when there are some, then its own
``random_states_<process>.pkl``; then, on the main process, ``custom_checkpoint_<i>.pkl`` for every object
registered with ``register_for_checkpointing``. ``torch.save`` (a zip) writes every ``.bin``/``.pt``/
``.pkl``; nothing is fsynced. So the last file of process ``p > 0`` is ``random_states_<p>.pkl``, and the
main process's is its last ``custom_checkpoint_<i>.pkl``, or ``random_states_0.pkl`` with none registered.

Rules (their home, with what they prove and what not, is docs/spec/watcher.md §2.12):

1. A save is a folder ``step-<N>`` (the whole name). Accelerate's own ``checkpoint_<i>`` counts saves, not
   steps, and is not a save.
2. Every process's commit file: ``random_states_<p>.pkl`` for p in 0 … N-1 with the world size N of the
   run that wrote the save known; with N unknown, ``random_states_0.pkl`` and no gap below the greatest
   listed one.
3. The main process's commit file: ``custom_checkpoint_<i>.pkl`` with no gap from 0; with the manifest
   ``.ckpt-accelerate.json`` (``{"custom_objects": k}``, written by ckpt's integration before
   ``save_state``), exactly i = 0 … k-1.
4. Every ``.bin``, ``.pt`` and ``.pkl`` file directly in the save is whole: a complete zip (§2.4), or one
   plain pickle of at most :data:`PICKLE_LIMIT` bytes whose opcodes, walked from the first byte (never
   executed), end with STOP at the file's last byte.

Settle: one interval (without the manifest, a custom object's file may still come).
"""

from __future__ import annotations

import pickletools
import re
from collections.abc import Iterable, Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import json_object, select_saves, step_of
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save
from ckpt.domain.rules.zipend import zip_problem

__all__ = ["MANIFEST", "PICKLE_LIMIT", "AccelerateRule", "pickle_problem"]

MANIFEST = ".ckpt-accelerate.json"
PICKLE_LIMIT = 64 * 1024
"""The largest plain pickle the rule reads whole (an RNG state pickle is a few KiB)."""
_MANIFEST_LIMIT = 4096
_NAME = re.compile(r"step-([0-9]+)")
_RANDOM = re.compile(r"random_states_([0-9]+)\.pkl")
_CUSTOM = re.compile(r"custom_checkpoint_([0-9]+)\.pkl")
_WHOLE_FILE_SUFFIXES = (".bin", ".pt", ".pkl")


def accelerate_step(item: Item) -> int | None:
    """The step of a ``step-<N>`` folder (rule 1), else ``None``."""
    match = _NAME.fullmatch(item.name)
    if item.kind is not Kind.FOLDER or match is None:
        return None
    return step_of(match.group(1))


def pickle_problem(data: bytes) -> str | None:
    """Why ``data`` (a whole file) is not exactly one complete pickle, or ``None`` when it is (rule 4).

    The opcodes are walked from the first byte, as the unpickler reads them, without building anything: a
    file cut anywhere ends inside an opcode or before STOP, and a STOP byte inside an argument is never
    read as one. A legacy ``torch.save`` file (several pickles, then raw storage bytes) is refused.

    >>> pickle_problem(b"\\x80\\x04K\\x01."), pickle_problem(b"\\x80\\x04C\\x01.") is not None
    (None, True)
    """
    end = -1
    try:
        for opcode, _arg, position in pickletools.genops(data):
            if opcode.name == "STOP":
                end = (position or 0) + 1
    except ValueError:
        return "a pickle cut short"
    if end != len(data):
        return "bytes after the pickle's STOP"
    return None


def _indices(names: Iterable[str], pattern: re.Pattern[str]) -> set[int]:
    return {int(m.group(1)) for n in names if (m := pattern.fullmatch(n))}


def _first_gap(found: set[int], count: int) -> int | None:
    return next((i for i in range(count) if i not in found), None)


@attrs.frozen
class AccelerateRule:
    """The ``accelerate`` rule; ``world_size``: the processes of the run that wrote the saves (rule 2)."""

    world_size: int | None = None
    name: str = "accelerate"
    pattern: str = "step-<step>"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): ``step-`` at the largest step."""
        return longest_name("step-{step}")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """``step-<N>`` folders, in step order."""
        return select_saves(items, accelerate_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """The listing; then the manifest, the tail of every file rule 4 checks, and the head of the small
        ones (a plain pickle is read whole)."""
        if files is None:
            return Needs(listing=True)
        checked = [f for f in files if "/" not in f.path and f.path.endswith(_WHOLE_FILE_SUFFIXES)]
        heads = [(in_save(save, f.path), PICKLE_LIMIT) for f in checked if f.size <= PICKLE_LIMIT]
        if any(f.path == MANIFEST for f in files):
            heads.append((in_save(save, MANIFEST), _MANIFEST_LIMIT))
        return Needs(listing=True, heads=tuple(heads), tails=tuple(in_save(save, f.path) for f in checked))

    def judge(self, view: SaveView) -> str | None:
        """Rules 2-4, in that order."""
        save = view.save
        files = view.files or ()
        names = {f.path for f in files}
        reason = self._ranks_reason(names)
        if reason is None:
            reason = self._custom_reason(view, names)
        if reason is not None:
            return reason
        for info in sorted(files, key=lambda f: f.path):
            if "/" not in info.path and info.path.endswith(_WHOLE_FILE_SUFFIXES):
                reason = _whole_reason(view, save, info.path)
                if reason is not None:
                    return reason
        return None

    def _ranks_reason(self, names: set[str]) -> str | None:
        found = _indices(names, _RANDOM)
        if self.world_size is not None:
            count = self.world_size
            extra = sorted(i for i in found if i >= count)
            if extra:
                return f"random_states_{extra[0]}.pkl for a world size of {count}"
        else:
            count = 1 + max(found, default=0)
        gap = _first_gap(found, count)
        return None if gap is None else f"no random_states_{gap}.pkl (process {gap} has not finished)"

    def _custom_reason(self, view: SaveView, names: set[str]) -> str | None:
        found = _indices(names, _CUSTOM)
        count = 1 + max(found, default=-1)
        if MANIFEST in names:
            manifest = json_object(view.heads.get(in_save(view.save, MANIFEST)))
            expected = None if manifest is None else manifest.get("custom_objects")
            if not isinstance(expected, int) or isinstance(expected, bool) or expected < 0:
                return f"{MANIFEST} does not hold a count custom_objects"
            if count > expected:
                return f"custom_checkpoint_{count - 1}.pkl beyond the {expected} object(s) of {MANIFEST}"
            count = expected
        gap = _first_gap(found, count)
        if gap is None:
            return None
        return f"no custom_checkpoint_{gap}.pkl (the main process writes it last)"

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """One interval: without the manifest, a custom object's file may still come (rule 3)."""
        return interval if given is None else given


def _whole_reason(view: SaveView, save: Save, name: str) -> str | None:
    """Rule 4 for the file ``name`` of ``save``: a complete zip, else a complete small plain pickle."""
    path = in_save(save, name)
    tail = view.tails.get(path)
    if tail is None:
        return f"no {name}"
    zip_failure = zip_problem(tail)
    if zip_failure is None:
        return None
    head = view.heads.get(path)
    if head is not None and len(head) == tail.size and not head.startswith(b"PK"):
        problem = pickle_problem(head)
        return None if problem is None else f"{name} is neither a complete zip nor a whole pickle ({problem})"
    return f"{name} is not a complete zip ({zip_failure})"
