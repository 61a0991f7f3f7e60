"""Vault auth methods: the settings of each login and the request it makes (spec/credentials.md §5.2).

A login sends no ``X-Vault-Token`` (the caller clears the client's token first), and the secrets it needs
from files (the Kubernetes JWT, the AppRole ids) are read again at every login, because they rotate. A new
auth method is a new value class here plus its branch in :func:`login_request`; the token's lifetime is in
:mod:`ckpt.creds.vault.token`, the source in :mod:`ckpt.creds.vault.source`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs

from ckpt.domain.errors import ConfigError

__all__ = [
    "DEFAULT_JWT_FILE",
    "AppRoleAuth",
    "KubernetesAuth",
    "SecretFileReader",
    "VaultAuth",
    "login_request",
]

DEFAULT_JWT_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


def _optional_path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


@attrs.frozen
class KubernetesAuth:
    """Kubernetes auth: the service-account JWT in ``jwt_file`` (re-read at every login) and a Vault role."""

    role: str
    jwt_file: Path = attrs.field(default=DEFAULT_JWT_FILE, converter=Path)
    mount: str = "kubernetes"

    @property
    def method(self) -> str:
        return "kubernetes"


@attrs.frozen
class AppRoleAuth:
    """AppRole auth: exactly one of ``role_id``/``role_id_file`` and of ``secret_id``/``secret_id_file``.

    Files are re-read at every login, so a rotated secret id is picked up.
    """

    role_id: str | None = attrs.field(default=None, repr=False)
    role_id_file: Path | None = attrs.field(default=None, converter=_optional_path)
    secret_id: str | None = attrs.field(default=None, repr=False)
    secret_id_file: Path | None = attrs.field(default=None, converter=_optional_path)
    mount: str = "approle"

    def __attrs_post_init__(self) -> None:
        if (self.role_id is None) == (self.role_id_file is None):
            raise ConfigError("AppRole auth needs exactly one of role_id and role_id_file")
        if (self.secret_id is None) == (self.secret_id_file is None):
            raise ConfigError("AppRole auth needs exactly one of secret_id and secret_id_file")

    @property
    def method(self) -> str:
        return "approle"


VaultAuth = KubernetesAuth | AppRoleAuth

#: Reads one secret from a file: ``(path, what it holds, "warn" or "allow" when others can read it)``.
#: It returns the secret, or raises ``CredentialsError`` (a missing file included).
SecretFileReader = Callable[[Path, str, Literal["warn", "allow"]], str]


def login_request(
    auth: VaultAuth, client: Any, read_file: SecretFileReader
) -> tuple[str, Callable[[], object]]:
    """Return what a login with ``auth`` is called in messages, and the ``hvac`` call that makes it.

    The secrets in files are read now, when the login is about to be made. The call is returned, not
    made, so that the caller runs it through its one error translation. The Kubernetes JWT file may be
    readable by others (the kubelet mounts it so); the AppRole files only with a warning.

    Raises:
        CredentialsError: from ``read_file``.
    """
    if isinstance(auth, KubernetesAuth):
        jwt = read_file(auth.jwt_file, "the Kubernetes service-account JWT", "allow")
        return (
            f"logging in (kubernetes auth, role {auth.role!r})",
            lambda: client.auth.kubernetes.login(
                role=auth.role, jwt=jwt, use_token=False, mount_point=auth.mount
            ),
        )
    role_id = auth.role_id
    if role_id is None and auth.role_id_file is not None:
        role_id = read_file(auth.role_id_file, "the AppRole role id", "warn")
    secret_id = auth.secret_id
    if secret_id is None and auth.secret_id_file is not None:
        secret_id = read_file(auth.secret_id_file, "the AppRole secret id", "warn")
    return (
        "logging in (approle auth)",
        lambda: client.auth.approle.login(
            role_id=role_id, secret_id=secret_id, use_token=False, mount_point=auth.mount
        ),
    )
