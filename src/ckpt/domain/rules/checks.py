"""Small checks every rule shares: a step from a name, a JSON object, a complete zip, reasons.

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from ckpt.domain.entries import parse_step
from ckpt.domain.errors import InvalidError
from ckpt.domain.rules.model import Item, Save, SaveView
from ckpt.domain.rules.zipend import zip_problem

__all__ = [
    "json_object",
    "select_saves",
    "step_of",
    "zip_reason",
]


def step_of(digits: str) -> int | None:
    """The step ``digits`` stands for (names.md §3.2), or ``None`` when it is not one."""
    try:
        return parse_step(digits)
    except InvalidError:
        return None


def select_saves(items: Iterable[Item], step: Callable[[Item], int | None]) -> list[Save]:
    """The items ``step`` gives a step for, as saves in step order (ties by name)."""
    found = []
    for item in items:
        value = step(item)
        if value is not None:
            found.append(Save(value, item.name, item.kind))
    return sorted(found, key=lambda s: s.key)


def json_object(data: bytes | None) -> dict[str, object] | None:
    """``data`` parsed as a JSON object, or ``None`` when it is absent, not JSON, or not an object.

    Python's parser admits the ``NaN`` and ``Infinity`` some frameworks write; invalid UTF-8, truncated
    text and nesting too deep all mean "not an object".
    """
    if data is None:
        return None
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def zip_reason(view: SaveView, path: str, shown: str | None = None) -> str | None:
    """Why the file at ``path`` is not a complete zip (missing, or its end does not hold), or ``None``.

    The reason says what failed (spec/watcher.md §2.4): most often the end record is missing (still being
    written or cut short), or the offsets it holds do not agree with the file (a zip inside the file).
    """
    shown = path if shown is None else shown
    tail = view.tails.get(path)
    if tail is None:
        return f"no {shown}"
    problem = zip_problem(tail)
    if problem is not None:
        return f"{shown} is not a complete zip ({problem})"
    return None
