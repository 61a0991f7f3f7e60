"""Where a trainer's saves go: a folder, file by file, or a bucket, object by object.

A :class:`Sink` carries out one :class:`~support.trainer.plan.Op` step at a time; paths are relative to the
saves location and slash-separated. On a bucket an object appears whole, so a file that grows is put again,
longer, at every step; a rename is a copy of each object (in the order they were written) and then the
deletion of the originals, and folders do not exist.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

__all__ = ["BucketSink", "FolderSink", "Sink"]


class Sink(Protocol):
    """The few things a trainer does to a saves location."""

    def append(self, path: str, data: bytes) -> None:
        """Make the file ``path`` longer by ``data`` (creating it)."""

    def put(self, path: str, data: bytes) -> None:
        """Make the file ``path`` hold ``data``."""

    def rename(self, path: str, to: str) -> None:
        """Move the file or folder ``path`` to ``to``."""

    def remove(self, path: str) -> None:
        """Delete the file ``path``."""

    def mkdir(self, path: str) -> None:
        """Make the folder ``path`` (and its parents)."""


class FolderSink:
    """A saves folder on a local file system."""

    def __init__(self, saves_dir: str | os.PathLike[str]) -> None:
        self.saves_dir = os.fspath(saves_dir)
        os.makedirs(self.saves_dir, exist_ok=True)

    def _path(self, path: str) -> str:
        return os.path.join(self.saves_dir, *path.split("/"))

    def _write(self, path: str, data: bytes, flags: int) -> None:
        fd = os.open(self._path(path), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | flags, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def append(self, path: str, data: bytes) -> None:
        self._write(path, data, os.O_APPEND)

    def put(self, path: str, data: bytes) -> None:
        self._write(path, data, os.O_TRUNC)

    def rename(self, path: str, to: str) -> None:
        os.rename(self._path(path), self._path(to))

    def remove(self, path: str) -> None:
        os.unlink(self._path(path))

    def mkdir(self, path: str) -> None:
        os.makedirs(self._path(path), exist_ok=True)


class BucketSink:
    """Saves under ``<bucket>/<prefix>/``, through a botocore S3 ``client``, one request at a time."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._written: dict[str, bytes] = {}  # what this process has put: a growing object's bytes so far

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}"

    def append(self, path: str, data: bytes) -> None:
        self.put(path, self._written.get(path, b"") + data)

    def put(self, path: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(path), Body=data)
        self._written[path] = data

    def rename(self, path: str, to: str) -> None:
        moved = {p: to + p[len(path) :] for p in self._written if p == path or p.startswith(f"{path}/")}
        for old, new in moved.items():
            source = {"Bucket": self.bucket, "Key": self._key(old)}
            self.client.copy_object(Bucket=self.bucket, Key=self._key(new), CopySource=source)
            self._written[new] = self._written[old]
        for old in moved:
            self.remove(old)

    def remove(self, path: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(path))
        self._written.pop(path, None)

    def mkdir(self, path: str) -> None:
        """Nothing: a bucket has no folders."""
