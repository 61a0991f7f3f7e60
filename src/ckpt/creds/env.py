"""The ``env`` credential source: a key pair (and optional session token) in environment variables.

Rules: an empty variable counts as unset (as in the proxy rule). Both key variables unset: absent. One key
variable set without the other, or a session token without keys: broken, naming the variables (never their
values). The environment mapping is read at every fetch, so it may be ``os.environ`` itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

from ckpt.creds.model import Credentials
from ckpt.domain.errors import CredentialsError

__all__ = ["EnvSource"]


def _environ() -> Mapping[str, str]:
    return os.environ


@attrs.frozen
class EnvSource:
    """Credentials from environment variables; the variable names are configurable."""

    # The whole environment holds secrets: never in repr.
    environ: Mapping[str, str] = attrs.field(factory=_environ, repr=False)
    access_key_id_var: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_var: str = "AWS_SECRET_ACCESS_KEY"  # noqa: S105 - a variable's name, not a secret
    session_token_var: str = "AWS_SESSION_TOKEN"  # noqa: S105 - a variable's name, not a secret
    name: str = "env"

    def fetch(self) -> Credentials | None:
        """Read the variables now; see the module rules."""
        key_id = self.environ.get(self.access_key_id_var) or None
        secret = self.environ.get(self.secret_access_key_var) or None
        token = self.environ.get(self.session_token_var) or None
        if key_id is None and secret is None:
            if token is not None:
                raise CredentialsError(
                    f"{self.name}: {self.session_token_var} is set but {self.access_key_id_var} and"
                    f" {self.secret_access_key_var} are not",
                    source=self.name,
                )
            return None
        if key_id is None or secret is None:
            have, missing = (
                (self.access_key_id_var, self.secret_access_key_var)
                if key_id is not None
                else (self.secret_access_key_var, self.access_key_id_var)
            )
            raise CredentialsError(
                f"{self.name}: {have} is set but {missing} is not (half a key pair)", source=self.name
            )
        return Credentials(key_id, secret, token, source=self.name)
