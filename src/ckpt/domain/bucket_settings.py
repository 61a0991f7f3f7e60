"""What the ``[s3]`` keys for secure buckets accept (docs/spec/config.md §3.1): pure checks of each value.

Each ``*_problem`` function says why a value cannot be used, or returns ``None`` when it can:

* ``sse``: ``"AES256"`` (S3-managed keys) or ``"aws:kms"`` (a KMS key), exactly as S3 spells them.
* ``sse_kms_key_id``: a KMS key id, key ARN, alias name or alias ARN; printable ASCII without spaces, at most
  2048 characters (KMS's own limit). It is not a secret (an ARN names a key, it does not unlock it).
* ``expected_bucket_owner``: an AWS account id, exactly 12 decimal digits (what S3 accepts).
* ``storage_class``: a storage class name (letters, digits, ``_``, ``-`` and ``.``, at most 64); S3's own
  classes in S3's spelling; never an archive class (``GLACIER``, ``DEEP_ARCHIVE``), whose objects cannot
  be read without a restore, while ``ckpt`` reads back what it writes (journals, decisions, records).

Pure: standard library only.
"""

from __future__ import annotations

import re

__all__ = [
    "ARCHIVE_STORAGE_CLASSES",
    "S3_STORAGE_CLASSES",
    "SSE_MODES",
    "expected_owner_problem",
    "kms_key_id_problem",
    "sse_problem",
    "storage_class_problem",
]

SSE_MODES = ("AES256", "aws:kms")
MAX_KMS_KEY_ID = 2048
#: The storage classes S3 defines (servers such as Ceph RGW may define more of their own).
S3_STORAGE_CLASSES = frozenset(
    {
        "STANDARD",
        "REDUCED_REDUNDANCY",
        "STANDARD_IA",
        "ONEZONE_IA",
        "INTELLIGENT_TIERING",
        "GLACIER",
        "DEEP_ARCHIVE",
        "OUTPOSTS",
        "GLACIER_IR",
        "SNOW",
        "EXPRESS_ONEZONE",
    }
)
ARCHIVE_STORAGE_CLASSES = frozenset({"GLACIER", "DEEP_ARCHIVE"})
_ACCOUNT_ID = re.compile(r"[0-9]{12}")
_STORAGE_CLASS = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def sse_problem(value: str) -> str | None:
    """Why ``value`` is no ``sse`` mode, or ``None``."""
    if value in SSE_MODES:
        return None
    return 'it must be "AES256" or "aws:kms" (as S3 spells them)'


def kms_key_id_problem(value: str) -> str | None:
    """Why ``value`` is no KMS key id, ARN or alias, or ``None``."""
    if len(value) > MAX_KMS_KEY_ID:
        return f"it is longer than {MAX_KMS_KEY_ID} characters"
    if not all("!" <= ch <= "~" for ch in value):
        return "it must be printable ASCII without spaces (a key id, key ARN, alias name or alias ARN)"
    return None


def expected_owner_problem(value: str) -> str | None:
    """Why ``value`` is no account id S3 accepts as the expected bucket owner, or ``None``."""
    if _ACCOUNT_ID.fullmatch(value):
        return None
    return "it must be the bucket owner's account id, exactly 12 decimal digits"


def storage_class_problem(value: str) -> str | None:
    """Why ``value`` cannot be the storage class of what ``ckpt`` writes, or ``None``."""
    if not _STORAGE_CLASS.fullmatch(value):
        return "it must be 1 to 64 letters, digits, '_', '-' or '.'"
    upper = value.upper()
    if upper in S3_STORAGE_CLASSES and value != upper:
        return f"S3 spells it {upper!r}"
    if upper in ARCHIVE_STORAGE_CLASSES:
        return (
            "an archive class: its objects cannot be read without a restore, and ckpt reads back the "
            "journals, decisions and records it writes"
        )
    return None
