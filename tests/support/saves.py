"""Saves as the tests arrange them: one ``make_save`` for a folder, one ``put_save`` for objects.

A save arranged here appears whole, beside the store under test. The trainer (``support.trainer``) is for
saves that must be seen while they are being written.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_FILES",
    "SENTINEL",
    "TRAINER_STATE",
    "make_save",
    "put_save",
    "read_files",
    "rng_state_bytes",
]

TRAINER_STATE = "trainer_state.json"
SENTINEL = "checkpoint-is-incomplete.txt"
# What a save holds when a test does not say.
DEFAULT_FILES: Mapping[str, bytes] = {"model.bin": b"weights"}


def make_save(root: str | os.PathLike[str], save: str, files: Mapping[str, bytes] | None = None) -> str:
    """Create the folder ``save`` under ``root`` (with its parents) holding ``files``; return its path.

    ``files`` maps a path inside the save (``sub/shard.bin`` makes ``sub/``) to its bytes; it defaults to
    :data:`DEFAULT_FILES`. A folder that already exists gets the files added.
    """
    folder = Path(root, save)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in (DEFAULT_FILES if files is None else files).items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return str(folder)


def put_save(client: Any, bucket: str, key: str, files: Mapping[str, bytes] | None = None) -> None:
    """Put the save whose key prefix is ``key`` (no trailing slash) into ``bucket``: one object per file."""
    for name, data in (DEFAULT_FILES if files is None else files).items():
        client.put_object(Bucket=bucket, Key=f"{key}/{name}", Body=data)


def read_files(folder: Path) -> dict[str, bytes]:
    """Every regular file under ``folder``, by path relative to it, with its bytes (``{}`` if missing)."""
    files: dict[str, bytes] = {}
    for dirpath, _dirnames, filenames in os.walk(folder):
        for name in filenames:
            path = Path(dirpath, name)
            try:
                files[path.relative_to(folder).as_posix()] = path.read_bytes()
            except FileNotFoundError:
                files[path.relative_to(folder).as_posix()] = b"<vanished while read>"
    return files


def rng_state_bytes(rank: int = 0) -> bytes:
    """A small complete zip standing in for ``rng_state_<rank>.pth`` (``torch.save`` writes a zip)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("rng_state/data.pkl", bytes([rank]) * 512)
    return buffer.getvalue()
