"""Reading a saves location in S3 for the framework rules (``ckpt.application.inspection.TreeReader``).

Rules:

1. The location's items come from one delimited listing (``ListObjectsV2`` with ``Delimiter=/``, 1,000
   names a request): common prefixes are folders, objects are files. A key ending in ``/`` (a console's
   folder marker) is never a file. Listings are paged by the store's own lister (``Bucket.pages``): a page
   cut short without a continuation token is a ``StorageError`` naming the location, never the end of
   the listing (a marker on the missing pages must not look absent).
2. A head is one ranged ``GetObject`` of ``bytes=0-<limit-1>``; a tail is one ranged ``GetObject`` of the
   last bytes (``bytes=-<n>``), whose ``Content-Range`` gives the object's size; a range (the zip check's
   second read, spec/watcher.md §2.4) is one ranged ``GetObject`` of ``bytes=<a>-<b>``. Nothing reads a
   whole shard. An empty object answers a ranged read with ``InvalidRange``: it is an empty head or tail.
3. Tails of many files are read side by side, at most ``concurrency`` at a time (``map_concurrently``).
4. A missing object or prefix is an answer (``None``, ``False``, nothing listed); every other failure is
   translated at the boundary into ``StorageError`` and friends, as the S3 store does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from ckpt.adapters.s3.bucket_settings import NO_SETTINGS, BucketSettings
from ckpt.adapters.s3.errors import (
    MISSING_OBJECT_CODES as _MISSING_OBJECT_CODES,
)
from ckpt.adapters.s3.errors import (
    botocore_errors as _botocore_errors,
)
from ckpt.adapters.s3.errors import (
    client_error_code as _client_error_code,
)
from ckpt.adapters.s3.listing import ListingPage
from ckpt.adapters.s3.objects import Bucket, S3Client
from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import Item, Kind, Tail
from ckpt.domain.s3_root import S3Root

__all__ = ["DEFAULT_CONCURRENCY", "S3Saves"]

DEFAULT_CONCURRENCY = 16
_BODY_ATTEMPTS = 3  # a body that breaks off is asked for again, as the store's own reads do
_CONTENT_RANGE = re.compile(r"bytes [0-9]+-[0-9]+/([0-9]+)")
_T = TypeVar("_T")
_R = TypeVar("_R")


class S3Saves:
    """The saves location at key prefix ``prefix`` (ending in ``/``) of ``bucket``, through ``client``."""

    def __init__(
        self,
        client: S3Client,
        bucket: str,
        prefix: str,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        settings: BucketSettings = NO_SETTINGS,
    ) -> None:
        self._client = client
        # Keys below are whole keys (no root prefix); every request carries the bucket settings' parameters.
        self._bucket = Bucket(S3Root(bucket, ""), client, settings)
        self.bucket = bucket
        self.prefix = prefix if prefix.endswith("/") or not prefix else prefix + "/"
        self.concurrency = max(1, concurrency)

    def __repr__(self) -> str:
        return f"S3Saves('s3://{self.bucket}/{self.prefix}')"

    def _url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _pages(self, prefix: str, *, delimiter: bool) -> Iterator[ListingPage]:
        return self._bucket.pages(prefix, delimiter=delimiter, action="list")

    def items(self) -> list[Item]:
        """Folders and files directly inside the location (rule 1)."""
        found: list[Item] = []
        for page in self._pages(self.prefix, delimiter=True):
            for common in page.prefixes:
                name = common[len(self.prefix) : -1]
                if name:
                    found.append(Item(name, Kind.FOLDER))
            for key in page.keys:
                name = key[len(self.prefix) :]
                if name and not name.endswith("/"):
                    found.append(Item(name, Kind.FILE))
        return found

    def files(self, path: str) -> list[FileInfo]:
        """Every object under the folder ``path``, recursively, with its size, sorted by path."""
        prefix = f"{self.prefix}{path}/"
        found = [
            FileInfo(key[len(prefix) :], size)
            for page in self._pages(prefix, delimiter=False)
            for key, size in zip(page.keys, page.sizes, strict=True)
            if not key.endswith("/")
        ]
        return sorted(found, key=lambda f: f.path)

    def is_file(self, path: str) -> bool:
        """Whether the object ``path`` exists (one ``HeadObject``)."""
        key = self.prefix + path
        errors = _botocore_errors()
        with self._bucket.errors("check", self._url(key)):
            try:
                self._client.head_object(**self._bucket.params(Key=key))
            except errors.ClientError as exc:
                if _client_error_code(exc)[0] in _MISSING_OBJECT_CODES:
                    return False
                raise
        return True

    def _ranged(self, path: str, byte_range: str) -> tuple[bytes, int] | None:
        """One ranged ``GetObject``: the bytes and the object's size, or ``None`` when there is no object."""
        key = self.prefix + path
        errors = _botocore_errors()
        with self._bucket.errors("read", self._url(key)):
            for attempt in range(1, _BODY_ATTEMPTS + 1):
                try:
                    answer = self._client.get_object(**self._bucket.params(Key=key, Range=byte_range))
                except errors.ClientError as exc:
                    code = _client_error_code(exc)[0]
                    if code in _MISSING_OBJECT_CODES:
                        return None
                    if code == "InvalidRange":
                        return b"", 0  # an empty object has no byte to give (rule 2)
                    raise
                body = answer["Body"]
                try:
                    data: bytes = body.read()
                except (errors.HTTPClientError, errors.IncompleteReadError):
                    if attempt == _BODY_ATTEMPTS:
                        raise
                    continue  # the body broke off: ask again
                finally:
                    body.close()
                match = _CONTENT_RANGE.fullmatch(str(answer.get("ContentRange", "")))
                return data, int(match.group(1)) if match else len(data)
        raise AssertionError("unreachable: the last failed attempt raises")

    def head(self, path: str, limit: int) -> bytes | None:
        """The first ``limit`` bytes of the object ``path``, or ``None`` (rule 2)."""
        if limit <= 0:
            return b"" if self.is_file(path) else None
        got = self._ranged(path, f"bytes=0-{limit - 1}")
        return None if got is None else got[0][:limit]

    def tail(self, path: str, size: int) -> Tail | None:
        """The last ``size`` bytes of the object ``path`` and its size, or ``None`` (rule 2)."""
        if size <= 0:
            return None if not self.is_file(path) else Tail(0, b"")
        got = self._ranged(path, f"bytes=-{size}")
        return None if got is None else Tail(got[1], got[0][-size:])

    def read_range(self, path: str, offset: int, length: int) -> bytes | None:
        """At most ``length`` bytes of the object ``path`` from ``offset``: one ranged GET (rule 2)."""
        if length <= 0:
            return b"" if self.is_file(path) else None
        got = self._ranged(path, f"bytes={max(0, offset)}-{max(0, offset) + length - 1}")
        return None if got is None else got[0][:length]

    def map_concurrently(self, function: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
        """``function`` over ``items``, at most ``concurrency`` at a time, results in order (rule 3)."""
        work = list(items)
        if len(work) <= 1 or self.concurrency == 1:
            return [function(item) for item in work]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(work))) as pool:
            return list(pool.map(function, work))
