"""The requests the S3 store makes on one bucket, each inside the error boundary (the adapter's rules 1-6).

:class:`Bucket` knows the root's bucket and prefix and speaks to the injected client: paged listings
(1000 keys a page, following continuation tokens), the exclusive create with ``If-None-Match: *`` (409
conflicts retried a bounded number of times; a 412 tells its own earlier success from another writer's by
the writer token, docs/spec/operations.md §2.6), quiet ``DeleteObjects`` 1000 keys a request reporting the
keys S3 refused, and a ``GetObject`` whose body is asked for again when it breaks off mid-stream (botocore
retries every request whose answer fails, but not a body it already handed over).

Every request carries the bucket settings (docs/spec/layout.md §9) from one place: :meth:`Bucket.params`
adds ``ExpectedBucketOwner`` to each, and :meth:`Bucket.put_object`, the one function every write goes
through, adds the encryption and the storage class too.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

from ckpt.adapters.s3.bucket_settings import NO_SETTINGS, BucketSettings
from ckpt.adapters.s3.errors import (
    ACCESS_DENIED_CODES,
    CONDITIONAL_CONFLICT,
    MISSING_OBJECT_CODES,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
    botocore_errors,
    client_error_code,
    s3_errors,
)
from ckpt.adapters.s3.listing import ListingPage, list_page
from ckpt.domain.errors import StorageError
from ckpt.domain.s3_root import S3Root
from ckpt.domain.saves import too_large

__all__ = ["PAGE_SIZE", "WRITER_METADATA", "Bucket", "CreateOutcome", "S3Client"]

PAGE_SIZE = 1000  # ListObjectsV2 returns at most 1000 keys a page; DeleteObjects takes at most 1000 keys
# 409 ConditionalRequestConflict: another conditional write to the key is in flight; it settles quickly.
_CONFLICT_ATTEMPTS = 4
_CONFLICT_BACKOFF_SECONDS = 0.1  # doubled after every conflict: 0.1, 0.2, 0.4
# A GetObject whose body breaks off mid-stream is sent again, this many times in all.
_BODY_ATTEMPTS = 3

CreateOutcome = Literal["created", "exists", "unsupported"]

#: The user metadata an exclusive create carries (header ``x-amz-meta-ckpt-writer``): a fresh random token
#: per create, so that a 412 met by botocore's retry of our own landed put is told from another writer's.
WRITER_METADATA = "ckpt-writer"
_WRITER_TOKEN_BYTES = 16  # 32 hex digits: two creates never draw the same token


class S3Client(Protocol):
    """The calls the store makes on a boto3 S3 client (keyword arguments and answers as boto3 has them)."""

    def list_objects_v2(self, **kwargs: Any) -> dict[str, Any]: ...
    def put_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_objects(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def get_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def head_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def list_multipart_uploads(self, **kwargs: Any) -> dict[str, Any]: ...
    def get_bucket_lifecycle_configuration(self, **kwargs: Any) -> dict[str, Any]: ...


class Bucket:
    """The root's bucket and prefix, and the requests on it, each carrying ``settings``."""

    __slots__ = ("client", "root", "settings")

    def __init__(self, root: S3Root, client: S3Client, settings: BucketSettings = NO_SETTINGS) -> None:
        self.root = root
        self.client = client
        self.settings = settings

    def params(self, **params: Any) -> dict[str, Any]:
        """A request's parameters: the bucket, ``params`` and what every request carries (the owner)."""
        return {"Bucket": self.root.bucket, **params, **self.settings.request_params()}

    def put_object(self, key: str, body: bytes, **params: Any) -> dict[str, Any]:
        """Send one ``PutObject`` of ``key`` with the write settings: every object ckpt writes goes here."""
        write = self.settings.write_params()  # what every request carries, and the encryption and class
        return self.client.put_object(Bucket=self.root.bucket, Key=key, Body=body, **params, **write)

    def key(self, path: str) -> str:
        """The key of a path relative to the root."""
        return self.root.prefix + path

    def url(self, key: str) -> str:
        """The ``s3://`` URL of a key."""
        return f"s3://{self.root.bucket}/{key}"

    def errors(
        self, action: str, location: str, *, write: bool = False
    ) -> contextlib.AbstractContextManager[None]:
        """The error boundary for one request about ``location`` (``write``: one that creates an object)."""
        settings = self.settings
        hints = settings.denied_hint(write=write), settings.kms_hint(write=write)
        return s3_errors(action, location, self.root.bucket, *hints)

    def pages(self, prefix: str, *, delimiter: bool, action: str) -> Iterator[ListingPage]:
        """Yield the ``ListObjectsV2`` pages under ``prefix``, 1000 keys each, following continuation
        (each read by :func:`~ckpt.adapters.s3.listing.list_page`)."""
        params: dict[str, Any] = self.params(Prefix=prefix, MaxKeys=PAGE_SIZE)
        if delimiter:
            params["Delimiter"] = "/"
        location = self.url(prefix)
        while True:
            with self.errors(action, location):
                page = list_page(self.client, params)
            yield page
            if not page.truncated:
                return
            token = page.token
            if not token:
                raise StorageError(
                    f"cannot {action} {location}: the storage truncated the listing without a continuation "
                    "token",
                    location=location,
                )
            params["ContinuationToken"] = token

    def objects(self, prefix: str, *, action: str) -> list[tuple[str, int]]:
        """Return every object (its key and size) under ``prefix``, recursively."""
        pages = self.pages(prefix, delimiter=False, action=action)
        return [obj for page in pages for obj in zip(page.keys, page.sizes, strict=True)]

    def any_object_under(self, prefix: str, *, action: str) -> bool:
        """Return True when at least one object's key starts with ``prefix`` (one request)."""
        params = self.params(Prefix=prefix, MaxKeys=1)
        with self.errors(action, self.url(prefix)):
            page = list_page(self.client, params)
        return bool(page.keys or page.key_count)

    def create_exclusive(self, key: str, *, action: str, body: bytes = b"") -> CreateOutcome:
        """Create the object ``key`` (empty, or holding ``body``) with ``If-None-Match: *``; say whether this
        call created it.

        The put carries a fresh writer token as user metadata (:data:`WRITER_METADATA`). ``412
        PreconditionFailed`` is answered by one ``HeadObject`` of the key: the object holding our token is
        ours, created by an earlier attempt of this call whose answer was lost ("created"); any other object,
        or none left, is another writer's ("exists"). ``"unsupported"`` is a storage that refuses the
        condition as not implemented. 409 ConditionalRequestConflict is retried with a doubling pause, and
        raised (translated) after the last attempt. docs/spec/operations.md §2.6.
        """
        errors = botocore_errors()
        location = self.url(key)
        token = secrets.token_hex(_WRITER_TOKEN_BYTES)  # one per call: every attempt carries the same
        pause = _CONFLICT_BACKOFF_SECONDS
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            with self.errors(action, location, write=True):
                try:
                    self.put_object(key, body, IfNoneMatch="*", Metadata={WRITER_METADATA: token})
                except errors.ClientError as exc:
                    code, status = client_error_code(exc)
                    if code == NOT_IMPLEMENTED or status == 501:
                        return "unsupported"
                    refused = code == PRECONDITION_FAILED
                    if not refused and (code != CONDITIONAL_CONFLICT or attempt == _CONFLICT_ATTEMPTS):
                        raise
                else:
                    return "created"
            if refused:  # asked outside the handler: no botocore error rides along
                return "created" if self._writer_of(key, action=action) == token else "exists"
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable: the last conflicting attempt raises")

    def create_new(self, key: str, *, action: str, body: bytes = b"", needs: str = "") -> bool:
        """:meth:`create_exclusive`, True when this call created the object; a storage that does not
        implement the condition is ``StorageError`` ("cannot <action> <url>: ...<needs>")."""
        outcome = self.create_exclusive(key, action=action, body=body)
        if outcome == "unsupported":
            url = self.url(key)
            refusal = f"the storage does not implement If-None-Match: *{needs} ({NOT_IMPLEMENTED})"
            raise StorageError(f"cannot {action} {url}: {refusal}", location=url)
        return outcome == "created"

    def _writer_of(self, key: str, *, action: str) -> str | None:
        """The writer token the object ``key`` carries (one ``HeadObject``); ``None`` for none, or no object.

        A failing ``HeadObject`` raises (translated): after a 412 the object exists, but whether this call
        created it cannot be told, and "exists" could be false.
        """
        errors = botocore_errors()
        with self.errors(f"tell who created (a 412 answered {action})", self.url(key)):
            try:
                answer = self.client.head_object(**self.params(Key=key))
            except errors.ClientError as exc:
                if client_error_code(exc)[0] in MISSING_OBJECT_CODES:
                    return None  # removed since the 412: someone else's create happened, not this one
                raise
        metadata = answer.get("Metadata")
        token = metadata.get(WRITER_METADATA) if isinstance(metadata, dict) else None
        return token if isinstance(token, str) else None

    def put(self, key: str, data: bytes, *, action: str) -> None:
        """Write the object ``key`` (an acknowledged put is durable)."""
        with self.errors(action, self.url(key), write=True):
            self.put_object(key, data)

    def delete_keys(self, keys: Sequence[str], *, action: str, location: str) -> list[tuple[str, str]]:
        """Delete ``keys`` with ``DeleteObjects`` (quiet), 1000 a request; return the refused (key, code)."""
        refused: list[tuple[str, str]] = []
        for start in range(0, len(keys), PAGE_SIZE):
            batch = keys[start : start + PAGE_SIZE]
            with self.errors(action, location):
                answer = self.client.delete_objects(
                    **self.params(Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True})
                )
            for error in answer.get("Errors", ()):
                code = str(error.get("Code") or "unknown error")
                if code not in MISSING_OBJECT_CODES:  # already gone is what a delete asks for
                    refused.append((str(error.get("Key", "?")), code))
        return refused

    def delete_object(self, key: str, *, action: str) -> None:
        """Delete one object (deleting a missing key succeeds)."""
        with self.errors(action, self.url(key)):
            self.client.delete_object(**self.params(Key=key))

    def get(self, key: str, *, action: str, limit: int) -> bytes | None:
        """Return the object's content, or ``None`` when there is none; over ``limit`` bytes is ``too_large``.

        A body that breaks off mid-stream is asked for again (``_BODY_ATTEMPTS`` in all).
        """
        errors = botocore_errors()
        location = self.url(key)
        with self.errors(action, location):
            for attempt in range(1, _BODY_ATTEMPTS + 1):
                try:
                    answer = self.client.get_object(**self.params(Key=key))
                except errors.ClientError as exc:
                    if client_error_code(exc)[0] in MISSING_OBJECT_CODES:
                        return None
                    raise
                body = answer["Body"]
                try:
                    size = answer.get("ContentLength")
                    if isinstance(size, int) and size > limit:
                        raise too_large(location, size)
                    data = bytearray()
                    # Read to the end (the empty read is where botocore checks the length it was promised),
                    # but never more than one byte past the cap.
                    while chunk := body.read(min(1 << 20, limit + 1 - len(data))):
                        data += chunk
                        if len(data) > limit:
                            raise too_large(location)
                except (errors.HTTPClientError, errors.IncompleteReadError):
                    # The body broke off (cut short, connection reset, read timeout): botocore cannot retry
                    # a body it already handed over, so the request is sent again.
                    if attempt == _BODY_ATTEMPTS:
                        raise
                else:
                    return bytes(data)
                finally:
                    body.close()
        raise AssertionError("unreachable: the last failed attempt raises")

    def head(self, key: str, *, action: str) -> bool:
        """Return True when the object ``key`` exists (one ``HeadObject``)."""
        return self.head_answer(key, action=action) is not None

    def owner_checked(self, key: str, *, action: str) -> bool:
        """Whether the server refuses a ``HeadObject`` of ``key`` expecting another owner than the bucket
        settings' (``BucketSettings.other_owner``): ``False`` when it answers it, so ignores the header."""
        errors = botocore_errors()
        other = self.settings.other_owner()
        with self.errors(action, self.url(key)):
            try:
                self.client.head_object(**{**self.params(Key=key), "ExpectedBucketOwner": other})
            except errors.ClientError as exc:
                code, status = client_error_code(exc)
                if code in ACCESS_DENIED_CODES or (not code and status == 403):
                    return True
                raise
        return False

    def head_answer(self, key: str, *, action: str) -> dict[str, Any] | None:
        """The ``HeadObject`` answer of ``key``, or ``None`` when there is no such object."""
        errors = botocore_errors()
        with self.errors(action, self.url(key)):
            try:
                return self.client.head_object(**self.params(Key=key))
            except errors.ClientError as exc:
                if client_error_code(exc)[0] in MISSING_OBJECT_CODES:
                    return None
                raise
