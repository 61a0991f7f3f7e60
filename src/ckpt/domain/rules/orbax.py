"""The ``orbax`` rule: Orbax ``CheckpointManager`` step folders (JAX).

What Orbax does (reference §1.1): a step is saved as ``<step>`` or ``<prefix>_<step>``. Off Google Cloud
Storage the default is *rename mode*: write into ``<name>.orbax-checkpoint-tmp`` (older releases add
``-<timestamp>`` or ``-<counter>``), the primary host writes ``commit_success.txt`` into it (since
2026-08), then renames it to ``<name>``. In *commit-file mode* (the default on ``gs://``, or chosen) the
folder has its final name from the start and ``commit_success.txt`` is written last. Deleted steps may be
moved to a to-delete folder first.

Rules:

1. A save is a folder named ``<step>`` or ``<prefix>_<step>`` with ``<step>`` in Orbax's own form (no
   leading zero unless it is ``0``); a name containing ``.orbax-checkpoint-tmp`` never is, and neither is
   the to-delete folder (it carries no step; saves moved inside it are not in the listing).
2. A save is complete when ``<name>/commit_success.txt`` is present. This is what commit-file mode needs,
   and current Orbax writes the file in rename mode too, so one rule serves both roots. A root written by
   an older Orbax in rename mode has no such file: a configured rule (``[[frameworks]]`` with pattern
   ``{step}`` and nothing required) serves it, since there the final name alone means complete.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves, step_of
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["COMMIT_SUCCESS", "TMP_SUFFIX", "OrbaxRule", "orbax_step"]

COMMIT_SUCCESS = "commit_success.txt"
TMP_SUFFIX = ".orbax-checkpoint-tmp"
_NAME = re.compile(r"(?:[^/]+_)?(0|[1-9][0-9]*)")


def orbax_step(item: Item) -> int | None:
    """The step of a ``<step>`` or ``<prefix>_<step>`` folder (rule 1), else ``None``."""
    match = _NAME.fullmatch(item.name)
    if item.kind is not Kind.FOLDER or match is None or TMP_SUFFIX in item.name:
        return None
    return step_of(match.group(1))


@attrs.frozen
class OrbaxRule:
    """The ``orbax`` rule."""

    name: str = "orbax"
    pattern: str = "[<prefix>_]<step>"

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): the largest step alone (the prefix is the
        trainer's)."""
        return longest_name("{step}")

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """Step folders with final names, in step order."""
        return select_saves(items, orbax_step)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """Whether ``commit_success.txt`` is inside the save."""
        return Needs(exists=(in_save(save, COMMIT_SUCCESS),))

    def judge(self, view: SaveView) -> str | None:
        """Complete with ``commit_success.txt`` (rule 2)."""
        if view.exists(in_save(view.save, COMMIT_SUCCESS)):
            return None
        return f"no {COMMIT_SUCCESS} (Orbax writes it when the step is committed)"

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """The marker decides: no settle."""
        return 0.0 if given is None else given
