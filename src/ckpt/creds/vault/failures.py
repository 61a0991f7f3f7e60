"""How a failed Vault call is reported: every ``hvac``/``requests`` error becomes a ``CredentialsError``.

The new error is built from a fixed table (a phrase per HTTP status, a phrase per transport failure) and
raised outside the ``except`` block: the response body, which Vault may fill with the very secret it
rejected, and the library's message, which carries the full URL, are dropped, and the library exception
is not attached as the new error's context either (spec/credentials.md §5.4).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from ckpt.domain.errors import CkptError, CredentialsError

__all__ = ["PermissionDeniedError", "call_vault"]

_T = TypeVar("_T")

# What we say about each Vault answer: a fixed phrase per status, never the body.
_STATUS_PHRASES: Mapping[int, str] = {
    400: "bad request (for a login: unknown role or invalid credentials)",
    401: "unauthorized",
    403: "permission denied",
    404: "not found",
    405: "method not allowed",
    412: "precondition failed",
    429: "rate limited (or a performance standby)",
    500: "internal server error",
    501: "Vault is not initialized",
    502: "bad gateway",
    503: "Vault is sealed or unavailable",
}
# hvac raises one class per status and keeps no status code; this maps them back (by class name, since
# hvac is imported lazily).
_HVAC_STATUS: Mapping[str, int] = {
    "InvalidRequest": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "InvalidPath": 404,
    "UnsupportedOperation": 405,
    "PreconditionFailed": 412,
    "RateLimitExceeded": 429,
    "InternalServerError": 500,
    "VaultNotInitialized": 501,
    "BadGateway": 502,
    "VaultDown": 503,
}


class PermissionDeniedError(CredentialsError):
    """Vault answered 403 to a read: the token is unknown, expired or revoked (or the policy denies it)."""


def call_vault(
    operation: Callable[[], _T], *, what: str, source: str, address: str, reading: bool = False
) -> _T:
    """Run one ``hvac`` call and return its answer, translating every library error.

    ``what`` says what the call does ("reading secret ..."), ``source`` names the credential source and
    ``address`` the Vault server, for the message; with ``reading``, a 403 is
    :class:`PermissionDeniedError` and a 404 says whether the secret's latest version was deleted.

    Raises:
        CredentialsError: the call failed; ``CkptError`` raised inside the call passes unchanged.
    """
    import hvac.exceptions
    import requests

    failure: CredentialsError
    try:
        return operation()
    except CkptError:
        raise
    except hvac.exceptions.VaultError as exc:
        failure = _from_vault_error(exc, f"{source}: {what} at {address} failed", source, reading=reading)
    except requests.RequestException as exc:
        failure = CredentialsError(
            f"{source}: {what} at {address} failed: {_transport_reason(exc)}", source=source
        )
    except ValueError as exc:  # a body that is not JSON, a URL requests refuses
        failure = CredentialsError(
            f"{source}: {what} at {address} failed: unexpected answer ({type(exc).__name__})", source=source
        )
    raise failure


def _from_vault_error(exc: Exception, failed: str, source: str, *, reading: bool) -> CredentialsError:
    status = _HVAC_STATUS.get(type(exc).__name__)
    phrase = _STATUS_PHRASES.get(status, "unexpected answer") if status else "unexpected answer"
    prefix = f"{failed}: HTTP {status or '?'} {phrase}"
    if status == 404 and reading:
        return CredentialsError(f"{prefix}{_deleted_detail(exc)}", source=source)
    if status == 403 and reading:
        return PermissionDeniedError(prefix, source=source)
    return CredentialsError(prefix, source=source)


def _deleted_detail(exc: Exception) -> str:
    """Say whether a 404 on a KV v2 read is a deleted or destroyed version; only metadata is looked at."""
    body = getattr(exc, "json", None)
    data = body.get("data") if isinstance(body, dict) else None
    metadata = data.get("metadata") if isinstance(data, dict) else None
    if not isinstance(metadata, dict):
        return " (no such secret)"
    version = metadata.get("version")
    shown = f" {version}" if isinstance(version, int) and not isinstance(version, bool) else ""
    if metadata.get("destroyed") is True:
        return f" (the latest version{shown} was destroyed)"
    if metadata.get("deletion_time"):
        return f" (the latest version{shown} was deleted)"
    return " (no such secret)"


def _transport_reason(exc: Exception) -> str:
    import requests

    if isinstance(exc, requests.exceptions.SSLError):
        return "TLS handshake or certificate verification failed"
    if isinstance(exc, requests.exceptions.ProxyError):
        return "the proxy refused or failed the connection"
    if isinstance(exc, requests.exceptions.Timeout):
        return "timed out"
    if isinstance(exc, requests.exceptions.ConnectionError):
        return "cannot connect"
    if isinstance(exc, requests.exceptions.TooManyRedirects):
        return "redirected (redirects are never followed)"
    return f"request failed ({type(exc).__name__})"
