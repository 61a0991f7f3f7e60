"""The configuration file (spec/config.md): TOML read with the standard library, every key validated.

An unknown key, a wrong type or a missing required key is a :class:`ConfigError` (exit 2) that names the key
with its full path (``s3.read_timeout``, ``credentials[2].auth.role``). The ``[proxy]`` and
``[[credentials]]`` tables are kept as validated raw tables here and turned into a ``ProxyRule`` and a
credential chain by their own modules, which own their keys. The ``[[frameworks]]`` tables become rules
(``ckpt.domain.rules.custom``), which ``--framework`` can name.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import attrs

from ckpt.domain.durations import MAX_SECONDS, seconds_problem, shown_value
from ckpt.domain.errors import ConfigError
from ckpt.domain.redaction import redact_url

if TYPE_CHECKING:
    from ckpt.domain.rules.custom import CustomRule

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_CONFIG_BYTES",
    "MAX_SECONDS",
    "Config",
    "S3Settings",
    "endpoint_url_problem",
    "load_config",
    "parse_config",
]

_ADDRESSING = ("path", "virtual", "auto")
#: The most attempts per request ``[s3] max_attempts`` accepts: with the standard mode's backoff (at most
#: 20 s apart) a request that keeps failing gives up within about half an hour, not never.
MAX_ATTEMPTS = 100
#: The largest configuration file read; a real one is a few hundred bytes.
MAX_CONFIG_BYTES = 1024 * 1024


def _url_repr(url: str | None) -> str:
    """A root or an endpoint as a repr may show it: any user-info hidden (an access key id is secret too)."""
    return repr(None if url is None else redact_url(url, keep_user=False))


@attrs.frozen
class S3Settings:
    """The ``[s3]`` table: how the S3 client reaches the endpoint."""

    endpoint_url: str | None = attrs.field(default=None, repr=_url_repr)
    region: str | None = None
    addressing_style: str = "auto"
    ca_bundle: str | None = None
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    max_attempts: int = 5
    refresh_seconds: float = 900.0
    max_staleness_seconds: float = 3600.0
    #: What every object ckpt writes carries, and what every request expects (spec/layout.md §9).
    sse: str | None = None
    sse_kms_key_id: str | None = None
    expected_bucket_owner: str | None = None
    storage_class: str | None = None


def _proxy_repr(table: Mapping[str, Any] | None) -> str:
    """The ``[proxy]`` table as a repr may show it: every URL's user-info secret hidden (errors.md §3.2)."""
    if table is None:
        return "None"
    shown = {key: redact_url(value) if isinstance(value, str) else value for key, value in table.items()}
    return repr(shown)


def _credentials_repr(tables: tuple[Mapping[str, Any], ...]) -> str:
    """The ``[[credentials]]`` tables as a repr may show them: each source's kind and its keys, no value
    (a role id, a secret id, a key, a token, a path to one: none belongs in a repr)."""
    shown = (f"{table.get('source', '?')}({', '.join(sorted(map(str, table)))})" for table in tables)
    return repr(tuple(shown))


@attrs.frozen
class Config:
    """A whole configuration file. ``proxy`` is ``None`` when the file has no ``[proxy]`` table.

    Its repr hides what may be secret: the proxy URLs' user-info and every value of the credential tables.
    """

    root: str | None = attrs.field(default=None, repr=_url_repr)
    s3: S3Settings = S3Settings()
    proxy: Mapping[str, Any] | None = attrs.field(default=None, repr=_proxy_repr)
    credentials: tuple[Mapping[str, Any], ...] = attrs.field(default=(), repr=_credentials_repr)
    path: str | None = None
    frameworks: tuple[CustomRule, ...] = ()


def _number(table: Mapping[str, Any], key: str, where: str, *, positive: bool = True) -> float | None:
    if key not in table:
        return None
    value = table[key]
    problem = seconds_problem(value, zero=not positive)
    if problem is not None:
        raise ConfigError(f"{where}.{key} {problem}, got {shown_value(value)}", key=f"{where}.{key}")
    return float(value)


def _string(table: Mapping[str, Any], key: str, where: str) -> str | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key} must be a non-empty string, got {value!r}", key=f"{where}.{key}")
    return value


def _unknown(table: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in allowed:
            full = f"{where}.{key}" if where else key
            raise ConfigError(f"unknown key {full!r} in the configuration file", key=full)


def endpoint_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an S3 endpoint, or ``None`` when it can.

    Accepted: ``http://`` or ``https://``, a host, an optional port 1..65535 and an optional path (a
    gateway may serve S3 under a prefix). Refused, because they cannot work or would be silently dropped:
    another scheme, no host, a bad port, user-info (botocore never sends it; keys come from the credential
    chain), a query or a fragment, whitespace or control characters.
    """
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in url):
        return "it contains whitespace or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number or out of range, unbalanced brackets
        return "its host or port is not valid (a port is a number from 1 to 65535)"
    if parts.scheme.lower() not in ("http", "https") or not url.lower().startswith(("http://", "https://")):
        return "it must start with http:// or https://"
    if "@" in parts.netloc:
        return "it must not carry user-info (credentials come from [[credentials]])"
    if not parts.hostname:
        return "it has no host"
    if port == 0:
        return "its port is not a number from 1 to 65535"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "it must not have a query or a fragment"
    return None


def _check_endpoint_url(url: str) -> None:
    from ckpt.domain.redaction import redact_url  # the one place user-info is hidden for display

    problem = endpoint_url_problem(url)
    if problem is not None:
        raise ConfigError(
            f"s3.endpoint_url {redact_url(url, keep_user=False)!r} cannot be used: {problem}",
            key="s3.endpoint_url",
        )


def _parse_s3(table: object) -> S3Settings:
    if not isinstance(table, Mapping):
        raise ConfigError("s3 must be a table", key="s3")
    fields = tuple(a.name for a in attrs.fields(S3Settings))
    _unknown(table, fields, "s3")
    kwargs: dict[str, Any] = {}
    for key in ("endpoint_url", "region", "ca_bundle", "addressing_style"):
        value = _string(table, key, "s3")
        if value is not None:
            kwargs[key] = value
    if "endpoint_url" in kwargs:
        _check_endpoint_url(kwargs["endpoint_url"])
    if kwargs.get("addressing_style", "auto") not in _ADDRESSING:
        raise ConfigError(
            f"s3.addressing_style must be one of {', '.join(_ADDRESSING)},"
            f" got {kwargs['addressing_style']!r}",
            key="s3.addressing_style",
        )
    for key in ("connect_timeout", "read_timeout", "refresh_seconds", "max_staleness_seconds"):
        number = _number(table, key, "s3")
        if number is not None:
            kwargs[key] = number
    if "max_attempts" in table:
        value = table["max_attempts"]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
            raise ConfigError(
                f"s3.max_attempts must be an integer from 1 to {MAX_ATTEMPTS}, got {shown_value(value)}",
                key="s3.max_attempts",
            )
        kwargs["max_attempts"] = value
    kwargs.update(_bucket_settings(table))
    return S3Settings(**kwargs)


def _bucket_settings(table: Mapping[str, Any]) -> dict[str, str]:
    """The keys every write carries (spec/config.md §3.1), each checked as S3 would take it."""
    from ckpt.domain.bucket_settings import (
        expected_owner_problem,
        kms_key_id_problem,
        sse_problem,
        storage_class_problem,
    )

    found: dict[str, str] = {}
    checks = (
        ("sse", sse_problem),
        ("sse_kms_key_id", kms_key_id_problem),
        ("expected_bucket_owner", expected_owner_problem),
        ("storage_class", storage_class_problem),
    )
    for key, problem_of in checks:
        if key not in table:
            continue
        value = table[key]
        if not isinstance(value, str) or not value:
            quote = " (quote it: an account id's leading zeros count)" if isinstance(value, int) else ""
            raise ConfigError(f"s3.{key} must be a non-empty string{quote}, got {value!r}", key=f"s3.{key}")
        problem = problem_of(value)
        if problem is not None:
            raise ConfigError(f"s3.{key} {value!r} cannot be used: {problem}", key=f"s3.{key}")
        found[key] = value
    if "sse_kms_key_id" in found and found.get("sse") != "aws:kms":
        raise ConfigError(
            's3.sse_kms_key_id needs s3.sse = "aws:kms" (a KMS key encrypts only with aws:kms), '
            f"got s3.sse = {found.get('sse')!r}",
            key="s3.sse_kms_key_id",
        )
    return found


def parse_config(document: Mapping[str, Any], *, path: str | None = None) -> Config:
    """Validate a parsed TOML document and return the :class:`Config`."""
    _unknown(document, ("root", "s3", "proxy", "credentials", "frameworks"), "")
    root = document.get("root")
    if root is not None and (not isinstance(root, str) or not root):
        raise ConfigError(f"root must be a non-empty string, got {root!r}", key="root")
    s3 = _parse_s3(document["s3"]) if "s3" in document else S3Settings()
    proxy = document.get("proxy")
    if proxy is not None and not isinstance(proxy, Mapping):
        raise ConfigError("proxy must be a table", key="proxy")
    credentials = document.get("credentials", [])
    if not isinstance(credentials, list) or not all(isinstance(t, Mapping) for t in credentials):
        raise ConfigError("credentials must be an array of tables ([[credentials]])", key="credentials")
    if proxy is not None:
        _validate_proxy(proxy)
    if credentials:
        _validate_credentials(credentials)
    frameworks = _parse_frameworks(document["frameworks"]) if "frameworks" in document else ()
    return Config(
        root=root, s3=s3, proxy=proxy, credentials=tuple(credentials), path=path, frameworks=frameworks
    )


def _parse_frameworks(tables: object) -> tuple[CustomRule, ...]:
    from ckpt.domain.rules import BUILTIN
    from ckpt.domain.rules.custom import parse_custom_rules

    return parse_custom_rules(tables, BUILTIN)


def _validate_proxy(table: Mapping[str, Any]) -> None:
    from ckpt.domain.proxy import ProxyRule

    ProxyRule.from_config(table, cgi=False)


def _validate_credentials(tables: list[Mapping[str, Any]]) -> None:
    from ckpt.creds.config import validate_credentials_config

    validate_credentials_config(tables)


def load_config(path: str) -> Config:
    """Read and validate the TOML file at ``path`` (a regular file of at most ``MAX_CONFIG_BYTES``, UTF-8)."""
    from ckpt.small_files import read_small_file

    def refuse(reason: str) -> ConfigError:
        return ConfigError(f"configuration file {path!r} is refused: {reason}")

    try:
        data = read_small_file(path, limit=MAX_CONFIG_BYTES, refuse=refuse)
    except FileNotFoundError:
        raise ConfigError(f"configuration file {path!r} does not exist", key=None) from None
    except OSError as exc:
        raise ConfigError(f"cannot read configuration file {path!r}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"configuration file {path!r} is not valid UTF-8 (byte {exc.start}); TOML files are UTF-8"
        ) from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {path!r} is not valid TOML: {exc}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"configuration file {path!r} nests arrays or tables too deeply to read") from None
    return parse_config(document, path=path)
