"""The ``vault`` credential source (spec/credentials.md §5), in four modules:

* :mod:`ckpt.creds.vault.auth`: the auth methods (Kubernetes, AppRole) and the login each makes;
* :mod:`ckpt.creds.vault.token`: the token's lifetime (reuse, renew, log in again);
* :mod:`ckpt.creds.vault.failures`: how a failed call becomes a ``CredentialsError`` without leaking;
* :mod:`ckpt.creds.vault.source`: :class:`VaultSource` itself and the check of its address.

The public names are importable from here. Importing this package imports neither ``hvac`` nor
``requests``.
"""

from __future__ import annotations

from ckpt.creds.vault.auth import DEFAULT_JWT_FILE, AppRoleAuth, KubernetesAuth
from ckpt.creds.vault.source import VaultFields, VaultSource, vault_address_problem
from ckpt.creds.vault.token import TokenAction, VaultToken, plan_token

__all__ = [
    "DEFAULT_JWT_FILE",
    "AppRoleAuth",
    "KubernetesAuth",
    "TokenAction",
    "VaultFields",
    "VaultSource",
    "VaultToken",
    "plan_token",
    "vault_address_problem",
]
