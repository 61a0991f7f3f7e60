"""What happens to the incomplete multipart uploads under an S3 root (``ckpt doctor --durable``, cli.md §9.2).

A replicator killed mid-upload leaves the parts it sent as an incomplete multipart upload (spec/tiered.md
§5.2): invisible to listings and to ``ckpt``, stored (and billed) until the upload is aborted. ``ckpt``
leaves aborting them to the bucket's lifecycle, the one place that also knows how long an upload may take,
and ``doctor`` says whether a rule there does it.

Rules:

1. A lifecycle rule aborts the root's uploads when it is ``Enabled``, has ``AbortIncompleteMultipartUpload``
   with ``DaysAfterInitiation``, and its filter covers every key under the root: no filter, an empty one, or
   a prefix the root's prefix starts with (``Filter.Prefix``, ``Filter.And.Prefix``, the older top-level
   ``Prefix``). A filter on tags or object sizes never covers them (an upload has neither yet), so such a
   rule is passed over.
2. One ``ListMultipartUploads`` (at most 1000) counts the root's incomplete uploads; one
   ``GetBucketLifecycleConfiguration`` reads the rules (``NoSuchLifecycleConfiguration``: none). A refusal
   of either (``AccessDenied``: a replicator's narrow role may lack ``s3:GetLifecycleConfiguration``)
   leaves that part unknown instead of failing; any other error raises as every request's does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ckpt.adapters.s3.errors import botocore_errors, client_error_code
from ckpt.adapters.s3.objects import Bucket

__all__ = ["MultipartCleanup", "aborting_rule", "multipart_cleanup"]

_MAX_UPLOADS = 1000  # one ListMultipartUploads page


@attrs.frozen(slots=True)
class MultipartCleanup:
    """The facts ``doctor`` judges: the rule that aborts the root's uploads, and how many there are."""

    location: str  #: the root's s3:// URL
    rule: tuple[str, int] | None  #: (its ID, DaysAfterInitiation), or None when no rule covers the root
    rules_known: bool  #: False when the lifecycle could not be read (rule 2)
    incomplete: int | None  #: incomplete uploads under the root (None: could not be listed)
    more: bool  #: the listing stopped at _MAX_UPLOADS


def aborting_rule(rules: Iterable[Mapping[str, Any]], prefix: str) -> tuple[str, int] | None:
    """The first rule that aborts every incomplete upload under ``prefix`` (rule 1): its ID and days."""
    for rule in rules:
        days = (rule.get("AbortIncompleteMultipartUpload") or {}).get("DaysAfterInitiation")
        if rule.get("Status") != "Enabled" or not isinstance(days, int):
            continue
        covered = _covered_prefix(rule)
        if covered is not None and prefix.startswith(covered):
            return str(rule.get("ID") or "(no ID)"), days
    return None


def _covered_prefix(rule: Mapping[str, Any]) -> str | None:
    """The prefix a rule's filter selects by, or None when it selects by anything else too."""
    if "Filter" not in rule:
        return str(rule.get("Prefix", ""))
    selected = rule["Filter"] or {}
    if set(selected) <= {"Prefix"}:
        return str(selected.get("Prefix", ""))
    if set(selected) == {"And"} and set(selected["And"]) <= {"Prefix"}:
        return str(selected["And"].get("Prefix", ""))
    return None


def multipart_cleanup(bucket: Bucket) -> MultipartCleanup:
    """Read the root's incomplete uploads and the bucket's lifecycle rules (rule 2)."""
    prefix = bucket.root.prefix
    location = bucket.url(prefix)
    listed = _unless_denied(
        bucket,
        "list the incomplete multipart uploads under",
        lambda: bucket.client.list_multipart_uploads(**bucket.params(Prefix=prefix, MaxUploads=_MAX_UPLOADS)),
    )
    lifecycle = _unless_denied(
        bucket,
        "read the lifecycle rules of the bucket of",
        lambda: bucket.client.get_bucket_lifecycle_configuration(**bucket.params()),
        absent="NoSuchLifecycleConfiguration",
    )
    return MultipartCleanup(
        location=location,
        rule=None if lifecycle is None else aborting_rule(lifecycle.get("Rules", []), prefix),
        rules_known=lifecycle is not None,
        incomplete=None if listed is None else len(listed.get("Uploads", [])),
        more=bool(listed and listed.get("IsTruncated")),
    )


def _unless_denied(bucket: Bucket, action: str, call: Any, absent: str = "") -> dict[str, Any] | None:
    """``call()``'s answer; ``{}`` when the error code is ``absent``; None when the request was refused."""
    client_error = botocore_errors().ClientError
    with bucket.errors(action, bucket.url(bucket.root.prefix)):
        try:
            answer: dict[str, Any] = call()
        except client_error as exc:
            code, _ = client_error_code(exc)
            if absent and code == absent:
                return {}
            if code == "AccessDenied":
                return None
            raise
    return answer
