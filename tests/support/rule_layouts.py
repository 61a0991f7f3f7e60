"""Save layouts as plain data, for the framework-rule vectors and the killed-save simulations.

A *layout* is the saves location as a mapping of slash-separated paths to file contents; a path ending in
``/`` is an empty folder. :class:`LayoutReader` is a :class:`ckpt.application.inspection.TreeReader` over one,
so the rules are gathered and judged exactly as the watcher does it, without a store. :func:`content` turns a
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

from ckpt.application.inspection import judge
from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import BUILTIN, Item, Kind, Rule, Tail, builtin_rule, parse_custom_rules

Layout = Mapping[str, bytes | None]


def zip_bytes(size: int, comment: bytes = b"") -> bytes:
    """A complete zip of ``size`` deterministic bytes, stored uncompressed as ``torch.save`` does."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", bytes(i % 251 for i in range(size)))
        archive.comment = comment
    return buffer.getvalue()


def torch_zip(tensors: int, *, zip64: str = "plain", inner: bytes | None = None) -> bytes:
    """A zip laid out as ``torch.save`` writes one, built with the standard library's ``zipfile``.

    Members, stored: ``archive/data.pkl``, ``archive/byteorder``, ``archive/data/<i>`` for each of
    ``tensors`` tensors (64 deterministic bytes each; ``inner`` in place of tensor 0 when given),
    ``archive/version``, ``archive/.data/serialization_id``. ``zip64``: ``"plain"`` ends it as torch (miniz)
    does, with a ZIP64 end record and locator before an end record that holds the same values (each under
    its limit); ``"saturated"`` as for an archive past 4 GiB, the end record's fields all ``0xFFFF`` /
    ``0xFFFFFFFF``; ``"none"`` leaves zipfile's classic end.
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", bytes(range(64)))
        archive.writestr("archive/byteorder", b"little")
        for i in range(tensors):
            data = inner if i == 0 and inner is not None else bytes((i + j) % 251 for j in range(64))
            archive.writestr(f"archive/data/{i}", data)
        archive.writestr("archive/version", b"3\n")
        archive.writestr("archive/.data/serialization_id", b"0123456789")
    data = buffer.getvalue()
    return data if zip64 == "none" else with_zip64_end(data, saturated=zip64 == "saturated")


def with_zip64_end(data: bytes, *, saturated: bool) -> bytes:
    """``data`` (a zip with a classic end and no comment) ended with ZIP64 records instead, as miniz does."""
    end = len(data) - 22
    assert data[end : end + 4] == b"PK\x05\x06", "a classic end record without a comment"
    entries = int.from_bytes(data[end + 10 : end + 12], "little")
    size = int.from_bytes(data[end + 12 : end + 16], "little")
    offset = int.from_bytes(data[end + 16 : end + 20], "little")

    def le(value: int, size: int) -> bytes:
        return value.to_bytes(size, "little")

    record = b"PK\x06\x06" + le(44, 8) + le(45, 2) + le(45, 2) + le(0, 4) + le(0, 4)
    record += le(entries, 8) + le(entries, 8) + le(size, 8) + le(offset, 8)
    locator = b"PK\x06\x07" + le(0, 4) + le(end, 8) + le(1, 4)
    if saturated:
        entries, size, offset = 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF
    classic = b"PK\x05\x06" + le(0, 2) + le(0, 2) + le(entries, 2) + le(entries, 2) + le(size, 4)
    classic += le(offset, 4) + le(0, 2)
    return data[:end] + record + locator + classic


def inner_zip_cut(payload: int) -> bytes:
    """A torch-like zip whose first tensor is itself a complete zip, cut right after that member's data."""
    inner = zip_bytes(payload)
    outer = torch_zip(3, inner=inner)
    return outer[: outer.index(inner) + len(inner)]


def zeroed_zip(tensors: int, keep: str) -> bytes:
    """A torch-like zip whose middle was never written: zeros, all but the end records (``keep="end"``) or
    all but the central directory and the end records (``keep="directory"``)."""
    data = torch_zip(tensors)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        directory = archive.start_dir  # where the central directory begins
    zip64_end = data.rindex(b"PK\x06\x06")
    kept = directory if keep == "directory" else zip64_end
    return bytes(kept) + data[kept:]


def content(spec: Any) -> bytes | None:
    """The bytes a vector's file description stands for.

    ``{"text": s}`` UTF-8 text; ``{"json": v}`` v as JSON; ``{"zip": n}`` a complete zip of n payload bytes;
    ``{"cut_zip": n}`` the same zip without its last byte; ``{"torch_zip": {"tensors": n, "zip64": z}}``
    a zip laid out as torch.save writes one (:func:`torch_zip`); ``{"inner_zip_cut": n}`` one cut right
    after a zip stored inside it (:func:`inner_zip_cut`); ``{"zeroed_zip": {"tensors": n, "keep": k}}`` one
    whose middle is zeros (:func:`zeroed_zip`); ``{"bytes": n}`` n zero bytes; ``{"hex": h}`` raw bytes;
    ``null`` an empty folder.
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
    if kind == "torch_zip":
        return torch_zip(int(value["tensors"]), zip64=str(value.get("zip64", "plain")))
    if kind == "inner_zip_cut":
        return inner_zip_cut(int(value))
    if kind == "zeroed_zip":
        return zeroed_zip(int(value["tensors"]), str(value["keep"]))
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

    def read_range(self, path: str, offset: int, length: int) -> bytes | None:
        data = self._files.get(path)
        return None if data is None else data[offset : offset + length]


def verdict(rule: Rule, files: Mapping[str, bytes | None], name: str) -> tuple[bool, str | None]:
    """Whether ``name`` is a save under ``rule`` here, and if so why it is not complete (or None).

    Judged as the watcher and verified resolve judge (``ckpt.application.inspection.judge``): the rule's own
    verdict, then spec/watcher.md §2.6 (a save that holds nothing is never complete).
    """
    reader = LayoutReader(files)
    items = reader.items()
    saves = [s for s in rule.saves(items) if s.name == name]
    if not saves:
        return False, None
    return True, judge(rule, saves[0], items, reader)


VECTORS = Path(__file__).parent.parent / "vectors" / "frameworks"
RULE_FILES = ("hf", "dcp", "lightning", "deepspeed", "megatron", "nemo", "orbax", "accelerate", "custom")


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
