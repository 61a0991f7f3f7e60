"""Every botocore error translated, at one boundary, into ``ckpt.domain.errors`` (the S3 adapter's rule 4).

The S3 error code table (:data:`_CLIENT_CODES`) picks our error class and says what the code means for the
operator; :func:`s3_errors` is the one context manager every request runs in. Messages name the action, the
``s3://`` location and the S3 error code. The response body (S3's message, and for a signature mismatch the
canonical request, which carries the session token) is dropped and the vendor exception is not chained: no
``ClientError`` leaves the adapter.

botocore is imported on first use only, never when this module is imported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from ckpt.domain.errors import CkptError, CredentialsError, NotFoundError, StorageError
from ckpt.domain.redaction import redact_url

__all__ = [
    "ACCESS_DENIED_CODES",
    "CONDITIONAL_CONFLICT",
    "MISSING_OBJECT_CODES",
    "NOT_IMPLEMENTED",
    "PRECONDITION_FAILED",
    "botocore_errors",
    "client_error_code",
    "endpoint_of",
    "s3_errors",
]

PRECONDITION_FAILED = "PreconditionFailed"
CONDITIONAL_CONFLICT = "ConditionalRequestConflict"
NOT_IMPLEMENTED = "NotImplemented"
MISSING_OBJECT_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
#: What S3 answers a refused request with (a HEAD has no body: its code is the status, "403").
ACCESS_DENIED_CODES = frozenset({"AccessDenied", "403"})


def botocore_errors() -> Any:
    """Return ``botocore.exceptions``, imported on first use (never when this module is imported)."""
    import botocore.exceptions  # lazily: botocore only when an S3 store is used

    return botocore.exceptions


def client_error_code(exc: Any) -> tuple[str, int]:
    """Return the S3 error code and HTTP status of a ``ClientError`` (``""``/``0`` when absent)."""
    response = exc.response if isinstance(getattr(exc, "response", None), dict) else {}
    code = str(response.get("Error", {}).get("Code", "") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return code, status if isinstance(status, int) else 0


# S3 error code -> (kind, why). The kind picks our error class; the text says what it means for the operator.
_CLIENT_CODES: dict[str, tuple[str, str]] = {
    "NoSuchBucket": ("missing-bucket", "the bucket does not exist"),
    "NoSuchKey": ("missing", "no such object"),
    "NotFound": ("missing", "not found"),
    "404": ("missing", "not found"),
    "AccessDenied": ("storage", "access denied"),
    "403": ("storage", "access denied"),
    "AllAccessDisabled": ("storage", "all access to the bucket is disabled"),
    "AccountProblem": ("storage", "the account has a problem that prevents the operation"),
    "InvalidAccessKeyId": ("credentials", "S3 does not know the access key id"),
    "SignatureDoesNotMatch": (
        "credentials",
        "S3 refused the request signature: a wrong secret key, or something on the way changed the signed request",  # noqa: E501
    ),
    "ExpiredToken": ("credentials", "the session token has expired"),
    "TokenRefreshRequired": ("credentials", "the session token must be refreshed"),
    "InvalidToken": ("credentials", "the session token is malformed or invalid"),
    "RequestTimeTooSkewed": (
        "storage",
        "clock skew: this machine's clock is too far from the server's (S3 allows 15 minutes; set it by NTP)",
    ),
    "PermanentRedirect": ("storage", "the bucket is served elsewhere (set s3.region or s3.endpoint_url)"),
    "AuthorizationHeaderMalformed": (
        "storage",
        "the request was signed for another region (set s3.region)",
    ),
    PRECONDITION_FAILED: ("storage", "the object already exists"),
    CONDITIONAL_CONFLICT: ("storage", "a concurrent conditional write to the same key kept conflicting"),
    NOT_IMPLEMENTED: ("storage", "the storage does not implement this request"),
    "SlowDown": ("storage", "the storage kept throttling the requests"),
    "ServiceUnavailable": ("storage", "the storage is unavailable"),
    "InternalError": ("storage", "the storage failed internally"),
    "RequestTimeout": ("storage", "the storage timed out reading the request"),
}

_CREDENTIAL_ERRORS = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "NoAuthTokenError",
    "TokenRetrievalError",
    "SSOError",
    "RefreshWithMFAUnsupportedError",
    "MetadataRetrievalError",
)


def endpoint_of(url: object) -> str:
    """Return ``scheme://host[:port]`` of a URL: no user-info, path or query (they may carry request data)."""
    if not isinstance(url, str) or not url:
        return "the S3 endpoint"
    # Redacted first: a scheme-less "key:secret@host" would otherwise pass its user name off as a scheme.
    url = redact_url(url, keep_user=False)
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # an unparsable port: show no more than the scheme
        return f"{url.partition(':')[0]}://?"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}"


def _signing_source(exc: Any) -> str | None:
    """The name of the credential source whose keys S3 refused, as the auth hook recorded it (or ``None``)."""
    from ckpt.creds.model import SIGNING_SOURCE_FIELD

    response = exc.response if isinstance(getattr(exc, "response", None), dict) else {}
    error = response.get("Error")
    source = error.get(SIGNING_SOURCE_FIELD) if isinstance(error, dict) else None
    return source if isinstance(source, str) and source else None


def _translate_client_error(
    exc: Any, action: str, location: str, bucket: str, *, hint: str, kms_hint: str
) -> CkptError:
    code, status = client_error_code(exc)
    kind, why = _CLIENT_CODES.get(code) or _CLIENT_CODES.get(str(status)) or ("storage", "S3 refused it")
    if kind == "storage" and code not in _CLIENT_CODES and status >= 500:
        why = "the storage failed"
    if hint and (code in ACCESS_DENIED_CODES or (not code and status == 403)):
        why = f"{why}: {hint}"
    if kms_hint and code == "InvalidAccessKeyId":
        why = f"{why}, {kms_hint}"
    detail = f"{code or 'no error code'}, HTTP {status or '?'}"
    if kind == "missing-bucket":
        return NotFoundError(
            f"cannot {action} {location}: the bucket {bucket!r} does not exist ({detail})",
            location=f"s3://{bucket}",
        )
    if kind == "missing":
        return NotFoundError(f"cannot {action} {location}: {why} ({detail})", location=location)
    if kind == "credentials":
        # The auth hook (ckpt.creds.botocore_session) names the source whose keys were refused; never a key.
        source = _signing_source(exc)
        named = f"; the keys came from the credential source {source!r}" if source else ""
        return CredentialsError(f"cannot {action} {location}: {why} ({detail}){named}", source=source)
    return StorageError(f"cannot {action} {location}: {why} ({detail})", location=location)


def _translate_botocore_error(exc: Any, errors: Any, action: str, location: str) -> CkptError:
    name = type(exc).__name__
    kwargs = getattr(exc, "kwargs", {}) or {}
    prefix = f"cannot {action} {location}"
    if any(isinstance(exc, getattr(errors, n, ())) for n in _CREDENTIAL_ERRORS):
        return CredentialsError(f"{prefix}: no usable S3 credentials ({name})", source=None)
    if isinstance(exc, errors.ProxyConnectionError):
        # urllib3 reports any failure on a plain-HTTP proxied connection this way, a connection the proxy
        # dropped mid-request as well as one it refused: say both.
        proxy = endpoint_of(kwargs.get("proxy_url"))
        return StorageError(
            f"{prefix}: cannot connect to the proxy {proxy}, or it closed the connection ({name})",
            location=location,
        )
    endpoint = endpoint_of(kwargs.get("endpoint_url"))
    if isinstance(exc, errors.SSLError):
        # The TLS reason (such as CERTIFICATE_VERIFY_FAILED) is what an operator needs; it holds no secret.
        reason = str(kwargs.get("error", "")).splitlines()[0] if kwargs.get("error") else ""
        return StorageError(f"{prefix}: TLS with {endpoint} failed ({name}: {reason})", location=location)
    if isinstance(exc, errors.ConnectTimeoutError):
        why = f"connecting to {endpoint} timed out"
    elif isinstance(exc, errors.ReadTimeoutError):
        why = f"{endpoint} did not answer in time"
    elif isinstance(exc, errors.EndpointConnectionError):
        why = f"cannot connect to {endpoint}"
    elif isinstance(exc, errors.ConnectionClosedError):
        why = f"{endpoint} closed the connection"
    elif isinstance(exc, errors.ResponseStreamingError | errors.IncompleteReadError):
        why = "the storage's answer was cut short"
    elif isinstance(exc, errors.ParamValidationError):
        why = "botocore refused the request parameters"
    else:
        why = "the S3 client failed"
    return StorageError(f"{prefix}: {why} ({name})", location=location)


@contextlib.contextmanager
def s3_errors(action: str, location: str, bucket: str, hint: str = "", kms_hint: str = "") -> Iterator[None]:
    """Translate every botocore error raised inside into ours (the module's rule).

    ``action`` is a verb phrase ("publish", "list the publication log"), ``location`` the ``s3://`` URL the
    request was about; ``hint`` is what an access denied may mean, added to its message (the bucket
    settings', ``BucketSettings.denied_hint``), ``kms_hint`` what an unknown access key id may mean on a
    write (``BucketSettings.kms_hint``). Our own errors (such as a credential chain's
    ``CredentialsError`` raised during a refresh) pass through untouched.
    """
    errors = botocore_errors()
    try:
        yield
    except errors.ClientError as exc:
        translated = _translate_client_error(exc, action, location, bucket, hint=hint, kms_hint=kms_hint)
    except errors.BotoCoreError as exc:
        translated = _translate_botocore_error(exc, errors, action, location)
    else:
        return
    # The vendor exception (and its response, which may echo the signed request) must not ride along: not as
    # __cause__ (no `from`), and not as __context__, which Python sets because a `with` block's exception is
    # still being handled while this generator runs; it is cleared as the error leaves.
    try:
        raise translated
    finally:
        translated.__context__ = None
