"""An example plugin rule, installed for the tests as the distribution ``ckpt-done-marker``.

A trainer that saves into ``run-<step>/`` and writes ``DONE`` last. The distribution registers it with::

    [project.entry-points."ckpt.frameworks"]
    done-marker = "ckpt_done_marker:DoneMarkerRule"

``ckpt`` calls the class with ``world_size=`` (this rule ignores it) and uses the instance as a rule.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import Item, Kind, Needs, Save, SaveView

_NAME = re.compile(r"run-([0-9]{1,19})")


class DoneMarkerRule:
    name = "done-marker"
    pattern = "run-<step>"

    def __init__(self, *, world_size: int | None = None) -> None:
        self.world_size = world_size

    def saves(self, items: Sequence[Item]) -> list[Save]:
        found = []
        for item in items:
            match = _NAME.fullmatch(item.name)
            if match and item.kind is Kind.FOLDER:
                found.append(Save(int(match.group(1)), item.name, item.kind))
        return sorted(found, key=lambda s: s.key)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        return Needs(exists=(f"{save.name}/DONE",))

    def judge(self, view: SaveView) -> str | None:
        return None if view.exists(f"{view.save.name}/DONE") else "no DONE"

    def settle_time(self, interval: float, given: float | None = None) -> float:
        return 0.0 if given is None else given
