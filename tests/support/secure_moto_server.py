"""moto's S3 server (atomic ``PutObject``, as ``atomic_moto_server``) with two checks S3 makes and moto omits.

Run from ``tests/`` as ``python -m support.secure_moto_server -H 127.0.0.1 -p PORT``.

Why: moto 5 stores and reports the server-side encryption, KMS key and storage class a write asks for, but

* it ignores ``x-amz-expected-bucket-owner``: S3 answers ``403 AccessDenied`` to any request whose expected
  owner is not the account that owns the bucket (every bucket moto makes is owned by its account
  ``123456789012``). Here every request that names a bucket is checked so;
* it evaluates a bucket policy without its ``Condition``: the documented policy that refuses an unencrypted
  ``PutObject`` (``Deny s3:PutObject`` when ``Null s3:x-amz-server-side-encryption`` is ``true``, or when
  ``StringNotEquals`` its value) refuses every put on moto, encrypted or not. Here such statements are taken
  out of moto's evaluation and judged on the request's ``x-amz-server-side-encryption`` header, for the
  requests that create an object (``PutObject``, ``CopyObject``, ``CreateMultipartUpload``), with S3's
  answer: ``403 AccessDenied``.

Nothing else changes; a bucket without such a policy and a request without the owner header behave as on
moto's own server.
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import urlsplit

from support.atomic_moto_server import _serialize_put_object

_SSE_KEY = "s3:x-amz-server-side-encryption"
_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)


def _listed(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value or ())


def _sse_condition(statement: dict[str, Any]) -> bool:
    """Whether ``statement`` is conditioned on the encryption header (and so judged here, not by moto)."""
    condition = statement.get("Condition") or {}
    return any(_SSE_KEY in (keys or {}) for keys in condition.values())


def _refuses_write(policy: bytes | None, sse: str | None) -> bool:
    """Whether a ``Deny`` of ``policy`` conditioned on the encryption refuses a write with ``sse``."""
    if not policy:
        return False
    statements = json.loads(policy).get("Statement", [])
    for statement in statements if isinstance(statements, list) else [statements]:
        if statement.get("Effect") != "Deny" or not _sse_condition(statement):
            continue
        if not {"s3:PutObject", "s3:*", "*"} & set(_listed(statement.get("Action"))):
            continue
        condition = statement["Condition"]
        null = condition.get("Null", {}).get(_SSE_KEY)
        if null is not None and (str(null).lower() == "true") == (sse is None):
            return True
        unequal = condition.get("StringNotEquals", {}).get(_SSE_KEY)
        if unequal is not None and sse not in _listed(unequal):
            return True
    return False


def _creates_object(request: Any, full_url: str) -> bool:
    query = urlsplit(full_url).query
    if request.method == "PUT":
        return query == "" or query.startswith(("x-id=PutObject", "x-id=CopyObject"))
    return request.method == "POST" and "uploads" in query.split("&")


def _install_checks() -> None:
    from moto.s3.models import FakeBucket
    from moto.s3.responses import S3Response

    get_permission = FakeBucket.get_permission

    def get_permission_without_sse(self: Any, action: str, resource: str) -> Any:
        from moto.iam.access_control import PermissionResult

        if self.policy is None:
            return get_permission(self, action, resource)
        document = json.loads(self.policy)
        statements = document.get("Statement", [])
        kept = [
            s for s in (statements if isinstance(statements, list) else [statements]) if not _sse_condition(s)
        ]
        if not kept:
            return PermissionResult.NEUTRAL
        saved = self.policy
        self.policy = json.dumps({**document, "Statement": kept}).encode()
        try:
            return get_permission(self, action, resource)
        finally:
            self.policy = saved

    FakeBucket.get_permission = get_permission_without_sse  # type: ignore[method-assign]

    def refusal(self: Any, request: Any, full_url: str, *, key: bool) -> Any:
        name = self.parse_bucket_name_from_url(request, full_url)
        bucket = self.backend.buckets.get(name) if name else None
        if bucket is None:
            return None
        expected = request.headers.get("x-amz-expected-bucket-owner")
        denied = expected is not None and expected != bucket.account_id
        if key and not denied and _creates_object(request, full_url):
            denied = _refuses_write(bucket.policy, request.headers.get("x-amz-server-side-encryption"))
        return (403, {"content-type": "application/xml"}, _DENIED) if denied else None

    bucket_response, key_response = S3Response._bucket_response, S3Response._key_response

    def checked_bucket_response(self: Any, request: Any, full_url: str) -> Any:
        return refusal(self, request, full_url, key=False) or bucket_response(self, request, full_url)

    def checked_key_response(self: Any, request: Any, full_url: str) -> Any:
        return refusal(self, request, full_url, key=True) or key_response(self, request, full_url)

    S3Response._bucket_response = checked_bucket_response  # type: ignore[method-assign]
    S3Response._key_response = checked_key_response  # type: ignore[method-assign]


def main() -> None:
    """Start moto's server (same arguments as ``python -m moto.server``) with the checks installed."""
    from moto import server

    _serialize_put_object()
    _install_checks()
    server.main(sys.argv[1:])


if __name__ == "__main__":
    main()
