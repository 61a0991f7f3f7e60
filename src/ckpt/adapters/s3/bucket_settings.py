"""The one place the ``[s3]`` settings of secure buckets become request parameters (docs/spec/layout.md §9).

:class:`BucketSettings` holds ``sse``, ``sse_kms_key_id``, ``expected_bucket_owner`` and ``storage_class``
(validated by ``ckpt.config``, spec/config.md §3.1) and produces:

* :meth:`~BucketSettings.request_params`: what every request carries (``ExpectedBucketOwner``), reads,
  listings, heads and deletes included;
* :meth:`~BucketSettings.write_params`: what every request that creates an object carries on top
  (``ServerSideEncryption``, ``SSEKMSKeyId``, ``StorageClass``). The names are the same for ``PutObject``,
  ``CopyObject`` and ``CreateMultipartUpload``, so a write of any kind takes them as they are;
* :meth:`~BucketSettings.denied_hint`: what an ``AccessDenied`` may mean under these settings (a bucket
  owned by another account, a bucket that requires encryption), for the error message;
* :meth:`~BucketSettings.kms_hint`: what an ``InvalidAccessKeyId`` on a write may mean with a KMS key set;
* :meth:`~BucketSettings.check_written`: whether a ``HeadObject`` answer shows an object written as asked
  (``ckpt doctor``).

Nothing here is secret: a KMS key id or ARN names a key, it does not unlock it. The settings are never
logged with a request: only the messages built here show them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from ckpt.config import S3Settings

__all__ = ["NO_SETTINGS", "BucketSettings"]

_STANDARD = "STANDARD"  # HeadObject leaves StorageClass out for STANDARD objects


@attrs.frozen
class BucketSettings:
    """The ``[s3]`` keys every write and every request carries; all ``None`` is S3's own defaults."""

    sse: str | None = None
    sse_kms_key_id: str | None = None
    expected_bucket_owner: str | None = None
    storage_class: str | None = None

    @classmethod
    def from_s3_settings(cls, s3: S3Settings) -> BucketSettings:
        """The settings of a validated ``[s3]`` table."""
        return cls(s3.sse, s3.sse_kms_key_id, s3.expected_bucket_owner, s3.storage_class)

    def request_params(self) -> dict[str, str]:
        """The parameters every request carries: ``ExpectedBucketOwner`` when it is set."""
        if self.expected_bucket_owner is None:
            return {}
        return {"ExpectedBucketOwner": self.expected_bucket_owner}

    def write_params(self) -> dict[str, str]:
        """The parameters every request that creates an object carries (those of every request included)."""
        params = self.request_params()
        if self.sse is not None:
            params["ServerSideEncryption"] = self.sse
        if self.sse_kms_key_id is not None:
            params["SSEKMSKeyId"] = self.sse_kms_key_id
        if self.storage_class is not None:
            params["StorageClass"] = self.storage_class
        return params

    def other_owner(self) -> str:
        """An account id that is not ``expected_bucket_owner`` (doctor asks whether the server checks it)."""
        return "000000000001" if self.expected_bucket_owner == "000000000000" else "000000000000"

    def denied_hint(self, *, write: bool) -> str:
        """What an ``AccessDenied`` may mean under these settings ("" when nothing more can be said)."""
        hints = []
        if self.expected_bucket_owner is not None:
            hints.append(
                "S3 refuses every request when the bucket is not owned by the account in [s3] "
                f"expected_bucket_owner ({self.expected_bucket_owner})"
            )
        if write and self.sse is None:
            hints.append(
                "the bucket may require server-side encryption: set [s3] sse "
                '("AES256", or "aws:kms" with sse_kms_key_id)'
            )
        return "; ".join(hints)

    def kms_hint(self, *, write: bool) -> str:
        """What an ``InvalidAccessKeyId`` on a write may mean with a KMS key set ("" otherwise): Ceph RGW
        answers so when its KMS backend has no key ``sse_kms_key_id``."""
        if not write or self.sse_kms_key_id is None:
            return ""
        return (
            "or the server has no KMS key [s3] sse_kms_key_id "
            f"({self.sse_kms_key_id}): Ceph RGW answers so for a key it cannot find"
        )

    def described(self) -> str:
        """The settings in one line, for ``ckpt doctor``."""
        shown = [
            f"{name} {value}"
            for name, value in (
                ("sse", self.sse),
                ("sse_kms_key_id", self.sse_kms_key_id),
                ("storage_class", self.storage_class),
                ("expected_bucket_owner", self.expected_bucket_owner),
            )
            if value is not None
        ]
        return ", ".join(shown) if shown else "no sse, storage_class or expected_bucket_owner set"

    def check_written(self, head: Mapping[str, Any]) -> list[str]:
        """What a ``HeadObject`` answer shows written otherwise than asked (empty: as asked).

        A KMS key given as a bare key id matches the key ARN S3 reports when the ARN ends in ``/<id>``; an
        alias cannot be told from the ARN and is not compared.
        """
        problems = []
        got_sse = head.get("ServerSideEncryption")
        if self.sse is not None and got_sse != self.sse:
            problems.append(f"encryption {got_sse or 'none'} (asked for {self.sse})")
        wanted, got_key = self.sse_kms_key_id, head.get("SSEKMSKeyId")
        key = got_key if isinstance(got_key, str) else ""
        comparable = wanted is not None and not wanted.startswith("alias/") and ":alias/" not in wanted
        if comparable and wanted is not None and key != wanted and not key.endswith("/" + wanted):
            problems.append(f"KMS key {key or 'none'} (asked for {wanted})")
        got_class = head.get("StorageClass") or _STANDARD
        if self.storage_class is not None and got_class != self.storage_class:
            problems.append(f"storage class {got_class} (asked for {self.storage_class})")
        return problems


NO_SETTINGS = BucketSettings()
