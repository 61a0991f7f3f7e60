"""A Vault token's lifetime: when to reuse, renew or replace it (spec/credentials.md §5.3).

Pure decisions on values; the source (:mod:`ckpt.creds.vault.source`) makes the calls they ask for. Times
are seconds on the source's monotonic clock.
"""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["TokenAction", "VaultToken", "plan_token", "token_from_auth"]

#: Renew (or log in again) once no more than this fraction of the token's lease is left.
_RENEW_FRACTION = 1 / 3
#: A token with fewer seconds than this left is not used at all: a new login is cheaper than a 403.
_MIN_REMAINING_SECONDS = 5.0


@attrs.frozen
class VaultToken:
    """A Vault client token and its lease, as of ``obtained_at`` (on the source's monotonic clock).

    ``lease_seconds == 0`` means the token does not expire.
    """

    value: str = attrs.field(repr=False)
    obtained_at: float
    lease_seconds: float
    renewable: bool

    @property
    def expires_at(self) -> float:
        return self.obtained_at + self.lease_seconds


TokenAction = Literal["login", "renew", "reuse"]


def plan_token(token: VaultToken | None, now: float) -> TokenAction:
    """Decide what to do with the current token before a read.

    >>> t = VaultToken("s.x", obtained_at=0.0, lease_seconds=300.0, renewable=True)
    >>> plan_token(None, 0.0), plan_token(t, 100.0), plan_token(t, 250.0), plan_token(t, 299.0)
    ('login', 'reuse', 'renew', 'login')
    """
    if token is None:
        return "login"
    if token.lease_seconds <= 0:
        return "reuse"
    remaining = token.expires_at - now
    if remaining <= _MIN_REMAINING_SECONDS:
        return "login"
    if remaining <= token.lease_seconds * _RENEW_FRACTION:
        return "renew" if token.renewable else "login"
    return "reuse"


def token_from_auth(response: object, *, now: float, previous: VaultToken | None) -> VaultToken | None:
    """Return the token in a login or renewal answer's ``auth`` block, or ``None`` if it holds none.

    A renewal may leave out the token itself: then it is ``previous``'s. A renewal that does not extend
    the expiry (the lease reached its maximum TTL) gives a token marked not renewable, to be replaced by a
    login when it runs low.

    >>> old = VaultToken("s.x", obtained_at=0.0, lease_seconds=300.0, renewable=True)
    >>> token_from_auth({"auth": {"lease_duration": 100, "renewable": True}}, now=150.0, previous=old)
    VaultToken(obtained_at=150.0, lease_seconds=100.0, renewable=False)
    """
    auth = response.get("auth") if isinstance(response, dict) else None
    if not isinstance(auth, dict):
        return None
    value = auth.get("client_token")
    if value is None and previous is not None:
        value = previous.value
    lease = auth.get("lease_duration")
    renewable = auth.get("renewable", False)
    if (
        not isinstance(value, str)
        or not value
        or isinstance(lease, bool)
        or not isinstance(lease, int | float)
        or lease < 0
        or not isinstance(renewable, bool)
    ):
        return None
    token = VaultToken(value, obtained_at=now, lease_seconds=float(lease), renewable=renewable)
    if previous is not None and token.expires_at <= previous.expires_at:
        return attrs.evolve(token, renewable=False)
    return token
