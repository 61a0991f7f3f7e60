"""The ``aws-default`` credential source: botocore's own default chain.

botocore looks at ``AWS_*`` variables, ``~/.aws/credentials`` and ``~/.aws/config`` (profiles, SSO,
``credential_process``), web identity, the container and instance-metadata endpoints. This source is the
one place where ``ckpt`` lets botocore read the ambient environment, on purpose: it is what the operator
asked for by listing it (and what an empty chain means, spec/credentials.md).

Rules: botocore is imported lazily. A botocore session is kept while it holds refreshable credentials
(instance profile, web identity, SSO), so that they refresh themselves between our fetches; a session
holding static keys (``AWS_*`` variables, the shared credentials file) is dropped after the fetch, because
botocore would return those keys forever and a rotated file would never be read again. botocore
finding nothing is *absent*; any botocore error is *broken*, reported by its type (plus the message of the
few errors known to carry no secret: a missing profile, a partial key pair).
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

import attrs

from ckpt.creds.model import Credentials
from ckpt.domain.errors import CredentialsError

__all__ = ["AwsDefaultSource"]

# botocore errors whose text names a profile or a variable, never a value.
_SAFE_MESSAGES = ("ProfileNotFound", "PartialCredentialsError", "ConfigNotFound", "ConfigParseError")


@attrs.define
class AwsDefaultSource:
    """Credentials from botocore's default chain (instance profiles, web identity, ``~/.aws``, ``AWS_*``)."""

    name: str = "aws-default"
    _session: Any = attrs.field(default=None, init=False, repr=False, eq=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False, eq=False)

    def fetch(self) -> Credentials | None:
        """Ask botocore's chain now; ``None`` when it finds nothing."""
        import botocore.credentials
        import botocore.exceptions
        import botocore.session

        failure: CredentialsError | None = None
        with self._lock:
            try:
                if self._session is None:
                    self._session = botocore.session.Session()
                found = self._session.get_credentials()
                frozen = None if found is None else found.get_frozen_credentials()
                if not isinstance(found, botocore.credentials.RefreshableCredentials):
                    self._session = None  # static keys (or none): read the chain afresh next time
            except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
                kind = type(exc).__name__
                detail = f": {exc}" if kind in _SAFE_MESSAGES else ""
                failure = CredentialsError(
                    f"{self.name}: botocore's default credential chain failed ({kind}){detail}",
                    source=self.name,
                )
        if failure is not None:
            raise failure
        if found is None or frozen is None or not frozen.access_key or not frozen.secret_key:
            return None
        return Credentials(
            frozen.access_key,
            frozen.secret_key,
            frozen.token or None,
            expiry=_expiry(found),
            source=self.name,
        )


def _expiry(found: object) -> datetime | None:
    # botocore's refreshable credentials keep their expiry in a private attribute and offer no public
    # accessor; reading it lets our refresh schedule stop before botocore's keys expire.
    expiry = getattr(found, "_expiry_time", None)
    if isinstance(expiry, datetime) and expiry.utcoffset() is not None:
        return expiry
    return None
