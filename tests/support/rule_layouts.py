"""Save layouts as plain data, for the framework-rule vectors and the killed-save simulations.

A *layout* is the saves location as a mapping of slash-separated paths to file contents; a path ending in
``/`` is an empty folder. :class:`LayoutReader` is a :class:`ckpt.inspection.TreeReader` over one, so the
rules are gathered and judged exactly as the watcher does it, without a store. :func:`content` turns a
vector's file description into bytes.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import BUILTIN, Item, Kind, Rule, Tail, builtin_rule, parse_custom_rules
from ckpt.inspection import judge

Layout = Mapping[str, bytes | None]


def zip_bytes(size: int, comment: bytes = b"") -> bytes:
    """A complete zip of ``size`` deterministic bytes, stored uncompressed as ``torch.save`` does."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", bytes(i % 251 for i in range(size)))
        archive.comment = comment
    return buffer.getvalue()


def content(spec: Any) -> bytes | None:
    """The bytes a vector's file description stands for.

    ``{"text": s}`` UTF-8 text; ``{"json": v}`` v as JSON; ``{"zip": n}`` a complete zip of n payload bytes;
    ``{"cut_zip": n}`` the same zip without its last byte; ``{"bytes": n}`` n zero bytes; ``{"hex": h}`` raw
    bytes; ``null`` an empty folder.
    """
    if spec is None:
        return None
    (kind, value), *rest = spec.items()
    assert not rest, spec
    if kind == "text":
        return str(value).encode("utf-8")
    if kind == "json":
        return json.dumps(value).encode("utf-8")
    if kind == "zip":
        return zip_bytes(int(value))
    if kind == "cut_zip":
        return zip_bytes(int(value))[:-1]
    if kind == "bytes":
        return bytes(int(value))
    if kind == "hex":
        return bytes.fromhex(str(value))
    raise AssertionError(f"unknown file description {spec!r}")


class LayoutReader:
    """A saves location held in memory: ``files`` maps paths to bytes, folders are implied by paths."""

    def __init__(self, files: Mapping[str, bytes | None]) -> None:
        self._files = {p: b for p, b in files.items() if b is not None}
        self._folders = {p.rstrip("/") for p, b in files.items() if b is None}
        for path in files:
            parts = path.rstrip("/").split("/")
            self._folders.update("/".join(parts[:i]) for i in range(1, len(parts)))

    def items(self) -> tuple[Item, ...]:
        """The names directly inside the location."""
        top = {p for p in self._folders if "/" not in p}
        found = [Item(n, Kind.FOLDER) for n in top]
        found += [Item(p, Kind.FILE) for p in self._files if "/" not in p]
        return tuple(sorted(found, key=lambda i: i.name))

    def files(self, path: str) -> list[FileInfo]:
        prefix = f"{path}/"
        return sorted(
            (FileInfo(p[len(prefix) :], len(b)) for p, b in self._files.items() if p.startswith(prefix)),
            key=lambda f: f.path,
        )

    def is_file(self, path: str) -> bool:
        return path in self._files

    def head(self, path: str, limit: int) -> bytes | None:
        data = self._files.get(path)
        return None if data is None else data[:limit]

    def tail(self, path: str, size: int) -> Tail | None:
        data = self._files.get(path)
        return None if data is None else Tail(len(data), data[-size:])


def verdict(rule: Rule, files: Mapping[str, bytes | None], name: str) -> tuple[bool, str | None]:
    """Whether ``name`` is a save under ``rule`` here, and if so why it is not complete (or None).

    Judged as the watcher and verified resolve judge (``ckpt.inspection.judge``): the rule's own verdict,
    then spec/watcher.md §2.6 (a save that holds nothing is never complete).
    """
    reader = LayoutReader(files)
    items = reader.items()
    saves = [s for s in rule.saves(items) if s.name == name]
    if not saves:
        return False, None
    return True, judge(rule, saves[0], items, reader)


VECTORS = Path(__file__).parent.parent / "vectors" / "frameworks"
RULE_FILES = ("dcp", "lightning", "deepspeed", "megatron", "nemo", "orbax", "custom")


@cache
def load_vectors(name: str) -> dict[str, Any]:
    """The vector file of rule ``name``."""
    with open(VECTORS / f"{name}.json", encoding="utf-8") as f:
        document: dict[str, Any] = json.load(f)
    return document


def vector_cases() -> list[Any]:
    """Every vector case of every rule, as pytest parameters ``(rule name, case)``."""
    return [
        pytest.param(name, case, id=f"{name}/{case['id']}")
        for name in RULE_FILES
        for case in load_vectors(name)["cases"]
    ]


def vector_rule(name: str, case: dict[str, Any]) -> Rule:
    """The rule a vector case is judged by: built in with the case's options, or its own table."""
    if name == "custom":
        return parse_custom_rules([case["config"]], BUILTIN)[0]
    rule = builtin_rule(name, **case.get("options", {}))
    assert rule is not None
    return rule
