"""Rules from configuration: the ``[[frameworks]]`` tables of the configuration file (config.md §7).

A site whose trainer is none of the built-in frameworks describes its saves in a table::

    [[frameworks]]
    name = "mytrainer"            # what --framework takes
    pattern = "ckpt_{step}"        # the save's whole name; {step} stands for the step's digits
    kind = "folder"                # or "file": the save is one file
    required = ["model.pt", "DONE"]   # files that must exist in the save
    forbidden = ["WRITING"]           # files that must not
    json = ["state.json"]             # files that must parse as JSON
    zip = ["model.pt"]                # files that must be complete zips (torch.save)
    settle = 30                       # seconds the listing must stay unchanged (default: one interval)

Rules:

1. Validation is all here, pure, when the file is loaded: an unknown key, a wrong type, a pattern without
   exactly one ``{step}`` (or with ``/``, another brace, or a control character), a path that is not a
   plain relative path, a name that is not ``[a-z0-9][a-z0-9._-]*`` (at most 64) or is already taken (a
   built-in framework or an earlier table) is ``ConfigError`` naming ``frameworks[<i>].<key>``.
2. Paths in ``required``, ``forbidden``, ``json`` and ``zip`` are relative to the save folder. A ``file``
   rule has no folder: it takes only ``"."`` (the file itself) in ``json`` and ``zip``, and no
   ``required`` or ``forbidden``.
3. A save is complete when, in this order: every ``required`` file exists, no ``forbidden`` file exists,
   every ``json`` file exists and parses (at most 1 MiB is read), every ``zip`` file exists and ends with a
   zip end record; and in the watcher, once its listing has stayed unchanged for the settle time. With
   nothing required, the save must still hold something (``ckpt.domain.rules.presence``, for every rule).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ckpt.domain.durations import seconds_problem, shown_value
from ckpt.domain.errors import ConfigError
from ckpt.domain.ports import FileInfo
from ckpt.domain.room import longest_name
from ckpt.domain.rules.checks import select_saves, step_of, zip_reason
from ckpt.domain.rules.model import Item, Kind, Needs, Save, SaveView, in_save

__all__ = ["JSON_LIMIT", "CustomRule", "parse_custom_rules"]

JSON_LIMIT = 1024 * 1024
_KEYS = ("name", "pattern", "kind", "required", "forbidden", "json", "zip", "settle")
_RULE_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_STEP = "{step}"


@attrs.frozen
class CustomRule:
    """A rule built from one ``[[frameworks]]`` table (see the module docstring)."""

    name: str
    pattern: str
    kind: Kind = Kind.FOLDER
    required: tuple[str, ...] = ()
    forbidden: tuple[str, ...] = ()
    json_files: tuple[str, ...] = ()
    zip_files: tuple[str, ...] = ()
    settle: float | None = None

    @property
    def longest_name(self) -> str:
        """The longest save name (``ckpt.domain.room`` rule 1): the pattern at the largest step."""
        return longest_name(self.pattern)

    def _regex(self) -> re.Pattern[str]:
        before, _, after = self.pattern.partition(_STEP)
        return re.compile(f"{re.escape(before)}([0-9]+){re.escape(after)}")

    def step(self, item: Item) -> int | None:
        """The step of an item of this rule's kind whose whole name fits the pattern, else ``None``."""
        match = self._regex().fullmatch(item.name)
        if item.kind is not self.kind or match is None:
            return None
        return step_of(match.group(1))

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """Items matching the pattern, in step order."""
        return select_saves(items, self.step)

    def _path(self, save: Save, path: str) -> str:
        return save.name if path == "." else in_save(save, path)

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """A folder's listing; the ``json`` files' heads; the ``zip`` files' tails."""
        return Needs(
            listing=self.kind is Kind.FOLDER,
            heads=tuple((self._path(save, p), JSON_LIMIT) for p in self.json_files),
            tails=tuple(self._path(save, p) for p in self.zip_files),
        )

    def judge(self, view: SaveView) -> str | None:
        """Rule 3, in its order."""
        names = {f.path for f in view.files or ()}
        for path in self.required:
            if path not in names:
                return f"no {path}"
        for path in self.forbidden:
            if path in names:
                return f"{path} is present"
        for path in self.json_files:
            where = self._path(view.save, path)
            shown = view.save.name if path == "." else path
            data = view.heads.get(where)
            if data is None:
                return f"no {shown}"
            if len(data) > JSON_LIMIT:
                return f"{shown} is larger than {JSON_LIMIT} bytes"
            try:
                json.loads(data)
            except (ValueError, RecursionError):
                return f"{shown} does not parse as JSON"
        for path in self.zip_files:
            shown = view.save.name if path == "." else path
            reason = zip_reason(view, self._path(view.save, path), shown)
            if reason is not None:
                return reason
        return None

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """The time given (``--settle``), else the table's ``settle``, else one interval."""
        if given is not None:
            return given
        return interval if self.settle is None else self.settle


def _fail(where: str, key: str, message: str) -> ConfigError:
    return ConfigError(f"{where}.{key} {message}", key=f"{where}.{key}")


def _string(table: Mapping[str, Any], key: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value:
        raise _fail(where, key, f"must be a non-empty string, got {value!r}")
    return value


def _pattern(table: Mapping[str, Any], where: str) -> str:
    pattern = _string(table, "pattern", where)
    if pattern.count(_STEP) != 1:
        raise _fail(where, "pattern", f"must contain {_STEP} exactly once, got {pattern!r}")
    rest = pattern.replace(_STEP, "")
    if "/" in rest or "{" in rest or "}" in rest or _CONTROL.search(rest):
        raise _fail(where, "pattern", f"may not hold '/', another brace or a control character: {pattern!r}")
    if pattern in (".", "..") or rest in (".", ".."):
        raise _fail(where, "pattern", f"is not a name: {pattern!r}")
    return pattern


def _plain_path(path: str) -> bool:
    if not path or _CONTROL.search(path) or path.startswith("/") or path.endswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in path.split("/"))


def _paths(table: Mapping[str, Any], key: str, where: str, kind: Kind) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _fail(where, key, f"must be an array of strings, got {value!r}")
    for path in value:
        if kind is Kind.FILE:
            if key in ("required", "forbidden") or path != ".":
                raise _fail(where, key, f"of a file rule may only name '.', the file itself: {path!r}")
        elif not _plain_path(path):
            raise _fail(where, key, f"holds {path!r}, which is not a relative path inside the save")
    return tuple(value)


def _settle(table: Mapping[str, Any], where: str) -> float | None:
    if "settle" not in table:
        return None
    value = table["settle"]
    problem = seconds_problem(value, zero=True)
    if problem is not None:
        raise _fail(where, "settle", f"{problem}, got {shown_value(value)}")
    return float(value)


def parse_custom_rule(table: object, where: str, taken: set[str]) -> CustomRule:
    """Validate one ``[[frameworks]]`` table (rule 1); ``taken`` holds the names already in use."""
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where} must be a table", key=where)
    for key in table:
        if key not in _KEYS:
            raise ConfigError(f"unknown key {where}.{key!s} in the configuration file", key=f"{where}.{key}")
    name = _string(table, "name", where)
    if not _RULE_NAME.fullmatch(name):
        raise _fail(where, "name", f"must be lower-case letters, digits, '.', '_' or '-', got {name!r}")
    if name in taken:
        raise _fail(where, "name", f"{name!r} is already a framework")
    kind_text = table.get("kind", "folder")
    if kind_text not in ("folder", "file"):
        raise _fail(where, "kind", f"must be 'folder' or 'file', got {kind_text!r}")
    kind = Kind(kind_text)
    return CustomRule(
        name=name,
        pattern=_pattern(table, where),
        kind=kind,
        required=_paths(table, "required", where, kind),
        forbidden=_paths(table, "forbidden", where, kind),
        json_files=_paths(table, "json", where, kind),
        zip_files=_paths(table, "zip", where, kind),
        settle=_settle(table, where),
    )


def parse_custom_rules(tables: object, builtin: Sequence[str]) -> tuple[CustomRule, ...]:
    """Validate the ``frameworks`` array of tables; ``builtin`` are the names no table may take."""
    if not isinstance(tables, list):
        raise ConfigError("frameworks must be an array of tables ([[frameworks]])", key="frameworks")
    taken = set(builtin)
    rules = []
    for index, table in enumerate(tables):
        rule = parse_custom_rule(table, f"frameworks[{index}]", taken)
        taken.add(rule.name)
        rules.append(rule)
    return tuple(rules)
