"""An S3 root as the durable root of the tiered mode (docs/spec/tiered.md §4.1).

Rules:

1. A file is uploaded with boto3's managed transfer (``S3Transfer.upload_file`` with a ``TransferConfig``:
   multipart above the threshold, parts in parallel; no part scheduler here), asking for the additional
   checksum ``checksum`` (default :data:`CHECKSUM_ALGORITHM`) so that S3 checks every part as it arrives,
   and carrying the file's SHA-256 as the metadata ``ckpt-sha256``. ``CRC32`` and ``SHA256`` are what
   botocore computes by itself; ``CRC32C`` and ``CRC64NVME`` need ``awscrt`` (the ``crt`` extra), whose
   absence is an ``InvalidError`` when the files are made, never at the first upload.
2. The upload is verified by the ETag the server computed from the bytes it received, which must be the
   one the file's bytes give (:func:`expected_etag`: the MD5 of the file, or for a multipart upload the MD5
   of its parts' MD5s and ``-<parts>``, with the parts boto3's transfer cuts), else ``VerificationError``:
   the ETag is the one digest every S3 server computes itself, so a body changed on the way is found even
   where the server ignores or does not know the additional checksum (moto 5, Ceph RGW 16). The ETag is
   taken from the answer to the upload's last request (``PutObject``, or ``CompleteMultipartUpload``),
   which :class:`_UploadAnswers` records from the client's own events; only where that answer carries no
   MD5 ETag (SSE-KMS and SSE-C objects have none, AWS's documented rule; Ceph RGW 16.2 completes a multipart
   upload with an empty one; or no answer was recorded) is the
   object checked by one ``HeadObject``: its ``ContentLength`` and ``ckpt-sha256`` must be the fast
   file's, and its ETag, when it is an MD5, the expected one (under SSE-KMS or SSE-C only the server's
   checksum check verifies the bytes). The expected ETag also rides as the metadata ``ckpt-etag``, so that
   :meth:`S3DurableFiles.stored` trusts the recorded SHA-256 only of an object whose ETag is what the
   uploader expected.
3. ``stored`` is one ``HeadObject``; ``listing`` one recursive ``ListObjectsV2`` (sizes only); ``fetch`` the
   managed download; small files (the manifest) one ``PutObject`` or ``GetObject``; ``digest`` one
   ``GetObject`` whose body is hashed as it streams (1 MiB reads, nothing kept), its size counted.
4. Every failure is a ``ckpt`` error (``s3_errors``); a failed managed upload, which boto3 reports in its
   own exception, is translated from the ``ClientError`` it hides (so a refusal carries the settings'
   hints, layout.md §9.2), else a ``StorageError`` naming the object.
5. Every request carries the root's bucket settings (docs/spec/layout.md §9.1), from the root's
   :class:`~ckpt.adapters.s3.objects.Bucket`: the managed upload's ``extra_args`` hold
   ``BucketSettings.write_params`` (boto3 hands the encryption, KMS key, class and owner to the
   ``PutObject`` or ``CreateMultipartUpload``, and the owner to every part and the completion), the manifest
   goes through ``Bucket.put_object``, and the heads, listings, reads and the managed download carry
   ``ExpectedBucketOwner``.
6. ``concurrency`` is the transfer's ``max_concurrency`` (parts in flight per file); ``max_bandwidth``
   (bytes per second) its ``max_bandwidth``, boto3's own bound, on uploads only: a restore, which a job
   waits for, is never slowed (spec/tiered.md §12).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from ckpt.adapters.s3.errors import botocore_errors
from ckpt.adapters.s3.objects import Bucket
from ckpt.domain.errors import InvalidError, StorageError, VerificationError
from ckpt.domain.manifest import MAX_MANIFEST_BYTES, Listed
from ckpt.domain.tiered_ports import NEEDS_CRT, Stored

__all__ = ["CHECKSUM_ALGORITHM", "DIGEST_METADATA", "ETAG_METADATA", "S3DurableFiles", "expected_etag"]

CHECKSUM_ALGORITHM = "CRC32"
DIGEST_METADATA = "ckpt-sha256"
ETAG_METADATA = "ckpt-etag"
_MiB = 1 << 20
_MD5_ETAG = re.compile(r"[0-9a-f]{32}(-[1-9][0-9]*)?")


def expected_etag(local_path: str, size: int, *, threshold: int, part_size: int) -> str:
    """The ETag an S3 server gives the file uploaded by boto3's transfer with these settings (rule 2)."""
    from s3transfer.utils import ChunksizeAdjuster  # boto3's own rule for the size of each part

    if size < threshold:
        with open(local_path, "rb") as f:
            return hashlib.file_digest(f, "md5").hexdigest()
    chunk = ChunksizeAdjuster().adjust_chunksize(part_size, size)
    parts = []
    with open(local_path, "rb") as f:
        while block := f.read(chunk):
            parts.append(hashlib.md5(block, usedforsecurity=False).digest())
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"


def _comparable_etag(head: dict[str, Any]) -> str | None:
    """The object's ETag when it is an MD5 of its bytes (no SSE-KMS, no SSE-C), else ``None``."""
    if head.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or head.get("SSECustomerAlgorithm"):
        return None
    etag = str(head.get("ETag", "")).strip('"').lower()
    return etag if _MD5_ETAG.fullmatch(etag) else None


class _UploadAnswers:
    """The answer to the last request of each upload being awaited, by (bucket, key), as the client's events
    report it (rule 2): ``before-parameter-build`` notes which key a request is for in its context, and
    ``after-call`` keeps the parsed answer of a successful one whose key is awaited. One per client."""

    __slots__ = ("__weakref__", "_answers", "_lock")
    _OPERATIONS = ("PutObject", "CompleteMultipartUpload")
    _CONTEXT = "ckpt-upload-key"

    def __init__(self) -> None:
        self._answers: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: Any) -> _UploadAnswers:
        """The one recorder of ``client``, registered on its events the first time."""
        with _RECORDERS_LOCK:
            answers = _RECORDERS.get(client)
            if answers is None:
                answers = _RECORDERS[client] = cls()
                for operation in cls._OPERATIONS:
                    client.meta.events.register(f"before-parameter-build.s3.{operation}", answers._note)
                    client.meta.events.register(f"after-call.s3.{operation}", answers._keep)
            return answers

    def expect(self, bucket: str, key: str) -> None:
        with self._lock:
            self._answers[(bucket, key)] = None

    def take(self, bucket: str, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._answers.pop((bucket, key), None)

    def _note(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context[self._CONTEXT] = (params.get("Bucket"), params.get("Key"))

    def _keep(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        where = context.get(self._CONTEXT)
        if getattr(http_response, "status_code", 500) < 300:
            with self._lock:
                if where in self._answers:
                    self._answers[where] = parsed


_RECORDERS: weakref.WeakKeyDictionary[Any, _UploadAnswers] = weakref.WeakKeyDictionary()  # by client
_RECORDERS_LOCK = threading.Lock()


class S3DurableFiles:
    """The ``DurableFiles`` port over one S3 root (rules 1-5)."""

    __slots__ = (
        "_answers",
        "_bucket",
        "_checksum",
        "_concurrency",
        "_max_bandwidth",
        "_part_size",
        "_transfers",
    )

    def __init__(
        self,
        bucket: Bucket,
        *,
        concurrency: int = 8,
        part_size: int = 8 * _MiB,
        max_bandwidth: int | None = None,
        checksum: str = CHECKSUM_ALGORITHM,
    ) -> None:
        if checksum in NEEDS_CRT:
            import importlib.util

            if importlib.util.find_spec("awscrt") is None:
                raise InvalidError(
                    f"checksum {checksum}: botocore computes it only with awscrt "
                    "(pip install 'ckpt-log[crt]'), or use CRC32 or SHA256"
                )
        self._checksum = checksum
        self._bucket = bucket
        self._concurrency = concurrency
        self._max_bandwidth = max_bandwidth
        self._transfers: dict[bool, Any] = {}
        self._part_size = part_size
        self._answers: _UploadAnswers | None = None

    def transfer_config(self, *, upload: bool = True) -> Any:
        """The ``TransferConfig`` boto3's transfer runs with (rule 6): the uploads (replication) with the
        root's concurrency and bandwidth bound, the downloads (restores) with its concurrency only."""
        from boto3.s3.transfer import TransferConfig  # lazily: only a tiered S3 root

        return TransferConfig(
            multipart_threshold=self._part_size,
            multipart_chunksize=self._part_size,
            max_concurrency=self._concurrency,
            max_bandwidth=self._max_bandwidth if upload else None,
            use_threads=True,
        )

    def _s3transfer(self, *, upload: bool = True) -> Any:
        if upload not in self._transfers:
            from boto3.s3.transfer import S3Transfer

            self._transfers[upload] = S3Transfer(
                client=self._bucket.client, config=self.transfer_config(upload=upload)
            )
        return self._transfers[upload]

    def _key(self, save: str, path: str) -> str:
        return self._bucket.key(f"{save}/{path}")

    def stored(self, save: str, path: str) -> Stored | None:
        head = self._bucket.head_answer(self._key(save, path), action="read")
        if head is None:
            return None
        return Stored(int(head.get("ContentLength", -1)), _trusted_digest(head))

    def put(self, local_path: str, save: str, path: str, sha256: str, size: int) -> None:
        from boto3.exceptions import S3UploadFailedError

        key = self._key(save, path)
        url = self._bucket.url(key)
        with _local_read(local_path):
            etag = expected_etag(local_path, size, threshold=self._part_size, part_size=self._part_size)
        extra = {
            "ChecksumAlgorithm": self._checksum,
            "Metadata": {DIGEST_METADATA: sha256, ETAG_METADATA: etag},
            **self._bucket.settings.write_params(),  # rule 5
        }
        if self._answers is None:
            self._answers = _UploadAnswers.of(self._bucket.client)
        self._answers.expect(self._bucket.root.bucket, key)
        try:
            with self._bucket.errors("upload", url, write=True):
                try:
                    self._s3transfer().upload_file(
                        local_path, self._bucket.root.bucket, key, extra_args=extra
                    )
                except S3UploadFailedError as exc:
                    refused = exc.__context__  # boto3 raises it while handling the request's ClientError
                    if isinstance(refused, botocore_errors().ClientError):
                        raise refused from None  # the boundary translates it, with the settings' hints
                    raise StorageError(f"cannot upload {url}: {exc}", location=url) from None
        finally:
            answer = self._answers.take(self._bucket.root.bucket, key)
        answered = None if answer is None else _comparable_etag(answer)
        if answered is not None:  # rule 2: the server's own MD5 of what it received
            _same_etag(url, answered, etag)
            return
        head = self._bucket.head_answer(key, action="read")  # rule 2: no MD5 in the answer
        if head is None:
            raise VerificationError(f"cannot verify {url}: the storage holds nothing there", location=url)
        held, digest = int(head.get("ContentLength", -1)), (head.get("Metadata") or {}).get(DIGEST_METADATA)
        if held != size or digest != sha256:
            raise VerificationError(
                f"cannot verify {url}: expected {size} bytes, sha256 {sha256}; the storage holds {held} "
                f"bytes, sha256 {digest}",
                location=url,
            )
        stored_etag = _comparable_etag(head)
        if stored_etag is not None:
            _same_etag(url, stored_etag, etag)

    def fetch(self, save: str, path: str, local_path: str) -> None:
        key = self._key(save, path)
        with self._bucket.errors("download", self._bucket.url(key)):
            self._s3transfer(upload=False).download_file(
                self._bucket.root.bucket, key, local_path, extra_args=self._bucket.settings.request_params()
            )

    def digest(self, save: str, path: str) -> Listed:
        key = self._key(save, path)
        url = self._bucket.url(key)
        with self._bucket.errors("read", url):
            answer = self._bucket.client.get_object(**self._bucket.params(Key=key))
            body = answer["Body"]
            digest, size = hashlib.sha256(), 0
            try:
                while chunk := body.read(_MiB):
                    digest.update(chunk)
                    size += len(chunk)
            finally:
                body.close()
        return Listed(path, size, digest.hexdigest())

    def listing(self, save: str) -> list[Listed] | None:
        prefix = self._bucket.key(f"{save}/")
        objects = self._bucket.objects(prefix, action="list the save")
        found = [Listed(key[len(prefix) :], size) for key, size in objects if not key.endswith("/")]
        return sorted(found, key=lambda item: item.path) if found else None

    def read_small(self, save: str, path: str) -> bytes | None:
        return self._bucket.get(self._key(save, path), action="read", limit=MAX_MANIFEST_BYTES)

    def write_small(self, save: str, path: str, data: bytes) -> None:
        key = self._key(save, path)
        with self._bucket.errors("write", self._bucket.url(key), write=True):
            self._bucket.put_object(key, data, ChecksumAlgorithm=self._checksum)  # rule 5


def _same_etag(url: str, stored: str, expected: str) -> None:
    if stored != expected:
        raise VerificationError(
            f"cannot verify {url}: the storage computed ETag {stored} from the bytes it received, "
            f"the file's bytes give {expected}: the upload was changed on the way",
            location=url,
        )


def _trusted_digest(head: dict[str, Any]) -> str | None:
    """The recorded SHA-256 of an object whose ETag is what its uploader expected (rule 2), else ``None``."""
    metadata = head.get("Metadata") or {}
    digest, etag = metadata.get(DIGEST_METADATA), metadata.get(ETAG_METADATA)
    if not isinstance(digest, str):
        return None
    stored_etag = _comparable_etag(head)
    if stored_etag is not None and stored_etag != etag:
        return None  # changed on the way: its bytes are not the ones the digest was recorded for
    return digest


@contextlib.contextmanager
def _local_read(path: str) -> Iterator[None]:
    """The error boundary for reading a fast file to upload: ``StorageError`` naming it."""
    try:
        yield
    except OSError as exc:
        raise StorageError(f"cannot read {path}: {exc.strerror or exc}", location=path) from None
