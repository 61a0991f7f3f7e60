"""``[[credentials]]`` tables of the configuration file (spec/config.md) into a
:class:`~ckpt.creds.chain.Chain`.

Every key is checked: an unknown key, a wrong type or a missing required key is a ``ConfigError`` whose
``key`` is the full path, counting tables from 0 in file order (``credentials[1].auth.role`` is the
``role`` in the ``[credentials.auth]`` of the second ``[[credentials]]``). Building a chain reads no file and
opens no connection, so validation is the same code as building.

No tables at all means botocore's default chain (spec/credentials.md). A kind listed twice gets names that say
which table it came from (``file (credentials[2])``), so messages stay unambiguous. A kind that is not built
in is looked up among the installed plugins (:mod:`ckpt.creds.plugins`), which validate their own keys.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ckpt.creds.aws_default import AwsDefaultSource
from ckpt.creds.chain import Chain
from ckpt.creds.env import EnvSource
from ckpt.creds.files import FileSource
from ckpt.creds.model import Source
from ckpt.creds.vault import (
    DEFAULT_JWT_FILE,
    AppRoleAuth,
    KubernetesAuth,
    VaultFields,
    VaultSource,
    vault_address_problem,
)
from ckpt.domain.durations import seconds_problem, shown_value
from ckpt.domain.errors import ConfigError
from ckpt.domain.redaction import redact_url

__all__ = ["KINDS", "chain_from_config", "validate_credentials_config"]

KINDS = ("env", "file", "vault", "aws-default")

_KEYS: Mapping[str, tuple[str, ...]] = {
    "env": ("source", "access_key_id_var", "secret_access_key_var", "session_token_var"),
    "file": ("source", "dir", "readable_by_others"),
    "vault": (
        "source",
        "address",
        "namespace",
        "ca_bundle",
        "client_cert",
        "client_key",
        "timeout",
        "allow_insecure_http",
        "mount",
        "path",
        "fields",
        "auth",
    ),
    "aws-default": ("source",),
}
_AUTH_KEYS: Mapping[str, tuple[str, ...]] = {
    "kubernetes": ("method", "mount", "role", "jwt_file"),
    "approle": ("method", "mount", "role_id", "role_id_file", "secret_id", "secret_id_file"),
}
_FIELD_KEYS = ("access_key_id", "secret_access_key", "session_token")


class _Table:
    """One TOML table and where it sits in the file, with typed getters that raise ``ConfigError``."""

    def __init__(self, table: object, where: str) -> None:
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where} must be a table", key=where)
        self.table: Mapping[str, object] = table
        self.where = where

    def key(self, name: str) -> str:
        return f"{self.where}.{name}"

    def only(self, allowed: Sequence[str], what: str) -> None:
        for name in self.table:
            if name not in allowed:
                raise ConfigError(
                    f"unknown key {self.key(str(name))!r} for {what} (allowed: {', '.join(allowed)})",
                    key=self.key(str(name)),
                )

    def string(self, name: str, *, required: bool = False, secret: bool = False) -> str | None:
        if name not in self.table:
            if required:
                raise ConfigError(f"missing required key {self.key(name)!r}", key=self.key(name))
            return None
        value = self.table[name]
        if not isinstance(value, str) or not value:
            shown = "a value" if secret else repr(value)
            raise ConfigError(f"{self.key(name)} must be a non-empty string, got {shown}", key=self.key(name))
        return value

    def required(self, name: str, *, secret: bool = False) -> str:
        value = self.string(name, required=True, secret=secret)
        if value is None:  # string(required=True) raised already; this keeps the type checker informed
            raise ConfigError(f"missing required key {self.key(name)!r}", key=self.key(name))
        return value

    def boolean(self, name: str) -> bool | None:
        if name not in self.table:
            return None
        value = self.table[name]
        if not isinstance(value, bool):
            raise ConfigError(f"{self.key(name)} must be true or false, got {value!r}", key=self.key(name))
        return value

    def choice(self, name: str, choices: Sequence[str], *, required: bool = False) -> str | None:
        value = self.string(name, required=required)
        if value is not None and value not in choices:
            raise ConfigError(
                f"{self.key(name)} must be one of {', '.join(choices)}, got {value!r}", key=self.key(name)
            )
        return value

    def sub(self, name: str) -> _Table | None:
        if name not in self.table:
            return None
        return _Table(self.table[name], self.key(name))

    def required_sub(self, name: str) -> _Table:
        if name not in self.table:
            raise ConfigError(f"missing required key {self.key(name)!r}", key=self.key(name))
        return _Table(self.table[name], self.key(name))


def _env(table: _Table, name: str, environ: Mapping[str, str]) -> EnvSource:
    variables: dict[str, str] = {}
    for key in ("access_key_id_var", "secret_access_key_var", "session_token_var"):
        value = table.string(key)
        if value is not None:
            if "=" in value or "\0" in value:
                raise ConfigError(
                    f"{table.key(key)} must be an environment variable name, got {value!r}",
                    key=table.key(key),
                )
            variables[key] = value
    return EnvSource(environ=environ, name=name, **variables)


def _file(table: _Table, name: str) -> FileSource:
    directory = table.required("dir")
    policy = table.choice("readable_by_others", ("warn", "refuse"))
    return FileSource(Path(directory), "refuse" if policy == "refuse" else "warn", name=name)


def _exactly_one(auth: _Table, value_key: str, file_key: str) -> tuple[str | None, str | None]:
    value = auth.string(value_key, secret=True)
    path = auth.string(file_key)
    if value is None and path is None:
        raise ConfigError(
            f"missing required key {auth.key(value_key)!r} (or {file_key})", key=auth.key(value_key)
        )
    if value is not None and path is not None:
        raise ConfigError(
            f"{auth.key(value_key)} and {auth.key(file_key)} are both set; set one", key=auth.key(file_key)
        )
    return value, path


def _auth(table: _Table) -> KubernetesAuth | AppRoleAuth:
    auth = table.required_sub("auth")
    method = auth.choice("method", tuple(_AUTH_KEYS), required=True) or ""
    auth.only(_AUTH_KEYS[method], f"auth method {method!r}")
    mount = auth.string("mount")
    if method == "kubernetes":
        role = auth.required("role")
        jwt_file = auth.string("jwt_file")
        return KubernetesAuth(
            role=role,
            jwt_file=Path(jwt_file) if jwt_file else DEFAULT_JWT_FILE,
            mount=mount or "kubernetes",
        )
    role_id, role_id_file = _exactly_one(auth, "role_id", "role_id_file")
    secret_id, secret_id_file = _exactly_one(auth, "secret_id", "secret_id_file")
    return AppRoleAuth(
        role_id=role_id,
        role_id_file=role_id_file,
        secret_id=secret_id,
        secret_id_file=secret_id_file,
        mount=mount or "approle",
    )


def _seconds(table: _Table, name: str, *, default: float) -> float:
    """Seconds above 0 and at most ``MAX_SECONDS`` (``ckpt.domain.durations``), or ``default``."""
    if name not in table.table:
        return default
    value = table.table[name]
    problem = seconds_problem(value)
    if problem is not None:
        key = table.key(name)
        raise ConfigError(f"{key} {problem}, got {shown_value(value)}", key=key)
    assert isinstance(value, int | float)  # seconds_problem says so
    return float(value)


def _vault(table: _Table, name: str, proxy_for: Callable[[str], str | None] | None) -> VaultSource:
    address = table.required("address")
    path = table.required("path")
    allow_insecure_http = bool(table.boolean("allow_insecure_http"))
    problem = vault_address_problem(address.rstrip("/"), allow_insecure_http=allow_insecure_http)
    if problem is not None:
        key = table.key("address")
        raise ConfigError(f"{key} {redact_url(address, keep_user=False)!r} is refused: {problem}", key=key)
    mount = table.string("mount") or "secret"
    if not path.strip("/") or not mount.strip("/"):
        key = table.key("path") if not path.strip("/") else table.key("mount")
        raise ConfigError(f"{key} must name a secret, not only slashes", key=key)
    fields = VaultFields()
    fields_table = table.sub("fields")
    if fields_table is not None:
        fields_table.only(_FIELD_KEYS, "fields")
        names = {key: fields_table.string(key) for key in _FIELD_KEYS}
        fields = VaultFields(**{key: value for key, value in names.items() if value is not None})
    auth = _auth(table)
    ca_bundle = table.string("ca_bundle")
    client_cert, client_key = table.string("client_cert"), table.string("client_key")
    if (client_cert is None) != (client_key is None):
        missing = table.key("client_key") if client_key is None else table.key("client_cert")
        raise ConfigError(
            f"missing required key {missing!r}: a client certificate and its key are set together",
            key=missing,
        )
    return VaultSource(
        address=address,
        path=path,
        auth=auth,
        mount=mount,
        namespace=table.string("namespace"),
        ca_bundle=Path(ca_bundle) if ca_bundle else None,
        client_cert=Path(client_cert) if client_cert else None,
        client_key=Path(client_key) if client_key else None,
        timeout=_seconds(table, "timeout", default=10.0),
        allow_insecure_http=allow_insecure_http,
        fields=fields,
        proxy_for=proxy_for,
        name=name,
    )


def _plugin(
    table: _Table,
    kind: str,
    name: str,
    environ: Mapping[str, str],
    proxy_for: Callable[[str], str | None] | None,
) -> Source:
    from ckpt.creds.plugins import SourceSettings, plugin_kinds, plugin_source

    own = {key: value for key, value in table.table.items() if key != "source"}
    source = plugin_source(SourceSettings(kind, name, own, table.where, environ, proxy_for))
    if source is None:
        key = table.key("source")
        known = ", ".join((*KINDS, *plugin_kinds(KINDS)))
        raise ConfigError(f"{key} must be one of {known}, got {kind!r}", key=key)
    return source


def chain_from_config(
    tables: Sequence[Mapping[str, object]],
    environ: Mapping[str, str] | None = None,
    *,
    proxy_for: Callable[[str], str | None] | None = None,
) -> Chain:
    """Build the chain the ``[[credentials]]`` tables describe, in order; raise ``ConfigError`` naming a key.

    ``environ`` is what the ``env`` source reads (default: ``os.environ``, read at every fetch).
    ``proxy_for`` is the proxy rule handed to Vault sources (default: direct).
    """
    if not tables:
        return Chain([AwsDefaultSource()])
    environ = os.environ if environ is None else environ
    checked = [_Table(raw, f"credentials[{index}]") for index, raw in enumerate(tables)]
    kinds = [table.required("source") for table in checked]
    repeated = {kind for kind, count in Counter(kinds).items() if count > 1}
    sources: list[Source] = []
    for table, kind in zip(checked, kinds, strict=True):
        name = f"{kind} ({table.where})" if kind in repeated else kind
        if kind not in KINDS:
            sources.append(_plugin(table, kind, name, environ, proxy_for))
            continue
        table.only(_KEYS[kind], f"source {kind!r}")
        if kind == "env":
            sources.append(_env(table, name, environ))
        elif kind == "file":
            sources.append(_file(table, name))
        elif kind == "vault":
            sources.append(_vault(table, name, proxy_for))
        else:
            sources.append(AwsDefaultSource(name=name))
    return Chain(sources)


def validate_credentials_config(tables: Sequence[Mapping[str, object]]) -> None:
    """Check the ``[[credentials]]`` tables without building anything that reads or connects."""
    chain_from_config(tables, environ={})
