"""The credential value and the ``Source`` port every credential source satisfies.

Rules for this module:

- ``Credentials`` is a frozen value; the secret key and the session token are ``repr=False``, so neither
  ``repr`` nor ``str`` (attrs' ``str`` is its ``repr``) ever shows them. Nothing here logs.
- A source *fetches*: ``None`` means absent (the chain moves on); a ``CredentialsError`` naming the source
  means present but broken (the chain stops). A source never returns half a key pair.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

__all__ = ["SIGNING_SOURCE_FIELD", "Credentials", "Source"]

#: The field the S3 client's auth hook adds to a parsed S3 error that refused the keys: the name of the
#: credential source that signed the refused request (never a secret), so the error can name it.
SIGNING_SOURCE_FIELD = "CkptSigningSource"


def _non_empty(_instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not value:
        # The attribute's name, never its value: the value may be a secret.
        raise ValueError(f"Credentials.{attribute.name} must not be empty")


def _aware(_instance: object, _attribute: attrs.Attribute[datetime | None], value: datetime | None) -> None:
    if value is not None and value.utcoffset() is None:
        raise ValueError("Credentials.expiry must be timezone-aware")


@attrs.frozen
class Credentials:
    """S3 signing keys and where they came from.

    ``expiry`` is when the keys stop working (timezone-aware), or ``None`` when the source does not say.
    ``source`` is the name of the source that produced them. ``repr`` shows the access key id (which S3
    prints in its own logs and error messages) but never the secret key or the session token:

    >>> Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI", source="env")
    Credentials(access_key_id='AKIDEXAMPLE', expiry=None, source='env')
    """

    access_key_id: str = attrs.field(validator=_non_empty)
    secret_access_key: str = attrs.field(validator=_non_empty, repr=False)
    session_token: str | None = attrs.field(default=None, repr=False)
    expiry: datetime | None = attrs.field(default=None, validator=_aware)
    source: str = attrs.field(default="", kw_only=True)


@runtime_checkable
class Source(Protocol):
    """Somewhere S3 credentials may be found: environment variables, a secret folder, Vault, botocore."""

    @property
    def name(self) -> str:
        """A short name for messages and logs (``env``, ``file``, ``vault``, ``aws-default``); no secret."""
        ...

    def fetch(self) -> Credentials | None:
        """Read the credentials now; called again at every refresh, so a rotated secret is picked up.

        Returns ``None`` when the source is *absent* (its variables are unset, its folder missing): the chain
        then asks the next source. Raises ``CredentialsError`` with ``source=self.name`` when the source is
        present but broken (half a key pair, a refused file, Vault denying the login); the message names
        what failed and never contains a secret. Safe to call from several threads.
        """
        ...
