"""The proxy rule itself: which proxy, if any, carries a request to a URL (spec/proxy.md).

:class:`ProxyRule` is one pure value deciding for both HTTP clients (botocore for S3, ``requests`` for
Vault); :mod:`ckpt.adapters.proxy` only carries its answer to them. It reads its settings from a mapping
the shell passes in (§1), checks the proxy values when it is built (§2, parsed in
:mod:`ckpt.domain.proxy.urls`), and decides by the target's scheme (§3), the CGI guard (§4), the target's
syntax (§5), the loopback exemption (§5.3, :func:`ckpt.domain.loopback.is_loopback_host`) and
``NO_PROXY`` (§6, :mod:`ckpt.domain.proxy.no_proxy`), in that order. Semantics follow Go's
``golang.org/x/net/http/httpproxy`` after the CVE-2025-22870 fix; the spec marks the deviations.

Secrets (§8): ``repr()`` and every message show a proxy URL only through
:func:`~ckpt.domain.redaction.redact_url`; only :meth:`ProxyRule.proxy_for` returns a password in clear,
for the client.

Pure: ``attrs``, ``collections.abc``, ``typing`` and the domain modules named above.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from ckpt.domain.arguments import require_instance, require_str
from ckpt.domain.errors import ConfigError, ProxyConfigError
from ckpt.domain.loopback import is_loopback_host
from ckpt.domain.proxy.no_proxy import NoProxy, parse_no_proxy
from ckpt.domain.proxy.urls import SCHEME, UNSAFE_CHARS, parse_proxy_url, parse_target
from ckpt.domain.redaction import redact_url

__all__ = ["ProxyRule", "is_cgi"]

_CONFIG_KEYS: Final = ("http_proxy", "https_proxy", "no_proxy")


_READ_VARIABLES: Final = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "REQUEST_METHOD")


def is_cgi(environ: Mapping[str, str]) -> bool:
    """Return whether the process runs as a CGI handler: ``REQUEST_METHOD`` is set and non-empty (§1.3)."""
    return environ.get("REQUEST_METHOD", "") != ""


def _optional_proxy(value: str | None, source: str) -> str | None:
    """The converter behind the two proxy fields: ``None`` and ``""`` mean unset, else the canonical form."""
    if value is None or value == "":
        return None
    return parse_proxy_url(value, source=source)


def _http_proxy_field(value: str | None) -> str | None:
    return _optional_proxy(value, "http_proxy")


def _https_proxy_field(value: str | None) -> str | None:
    return _optional_proxy(value, "https_proxy")


def _no_proxy_field(value: str | None) -> str | None:
    return value or None


def _redacted_repr(value: str | None) -> str:
    return "None" if value is None else repr(redact_url(value))


@attrs.frozen
class ProxyRule:
    """Which proxy carries a request to a URL: one rule for the S3 client and the Vault client.

    Build it with :meth:`from_environment` or :meth:`from_config`, or directly; proxy values are checked
    and put in canonical form on construction (an empty string means unset). ``repr()`` redacts
    passwords.

    >>> rule = ProxyRule(https_proxy="proxy.example:3128", no_proxy=".example.internal")
    >>> rule.proxy_for("https://s3.amazonaws.com/bucket")
    'http://proxy.example:3128'
    >>> rule.proxy_for("https://objects.example.internal:9000/bucket") is None
    True
    """

    http_proxy: str | None = attrs.field(default=None, converter=_http_proxy_field, repr=_redacted_repr)
    https_proxy: str | None = attrs.field(default=None, converter=_https_proxy_field, repr=_redacted_repr)
    no_proxy: str | None = attrs.field(default=None, converter=_no_proxy_field)
    cgi: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    _no_proxy_list: NoProxy = attrs.field(init=False, repr=False, eq=False)

    @_no_proxy_list.default
    def _parse_own_no_proxy(self) -> NoProxy:
        return parse_no_proxy(self.no_proxy or "")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ProxyRule:
        """Build the rule from process environment variables (§1.1), e.g. ``os.environ``.

        Raises:
            ProxyConfigError: a proxy variable that is read holds a malformed or non-http(s) value.
        """

        require_instance(environ, Mapping, "the proxy environment")
        for name in _READ_VARIABLES:
            for spelled in (name, name.lower()):
                if spelled in environ:
                    require_str(environ[spelled], f"the environment variable {spelled}")

        def pick(upper: str) -> tuple[str, str | None]:
            for name in (upper, upper.lower()):
                value = environ.get(name, "")
                if value:
                    return name, value
            return upper, None

        http_name, http_value = pick("HTTP_PROXY")
        https_name, https_value = pick("HTTPS_PROXY")
        return cls(
            http_proxy=None if http_value is None else parse_proxy_url(http_value, source=http_name),
            https_proxy=None if https_value is None else parse_proxy_url(https_value, source=https_name),
            no_proxy=pick("NO_PROXY")[1],
            cgi=is_cgi(environ),
        )

    @classmethod
    def from_config(cls, table: object, *, cgi: bool) -> ProxyRule:
        """Build the rule from the configuration file's ``[proxy]`` table, which replaces the environment.

        ``table`` is the parsed value of the ``proxy`` key (typed ``object`` because TOML values are
        checked here); ``cgi`` still comes from the environment: pass ``is_cgi(os.environ)``.

        Raises:
            ConfigError: ``table`` is not a table, has an unknown key, or a value that is not a string;
                ``key`` names it (``proxy.<key>``).
            ProxyConfigError: a proxy value is malformed or not http(s).
        """
        if not isinstance(table, Mapping):
            raise ConfigError(f"[proxy] must be a table, not {type(table).__name__}", key="proxy")
        values: dict[str, str] = {}
        for key, value in table.items():
            if key not in _CONFIG_KEYS:
                raise ConfigError(
                    f"unknown key {key!r} in [proxy]; expected one of {', '.join(_CONFIG_KEYS)}",
                    key=f"proxy.{key}",
                )
            if not isinstance(value, str):
                raise ConfigError(
                    f"proxy.{key} must be a string, not {type(value).__name__}", key=f"proxy.{key}"
                )
            values[key] = value
        http_value, https_value = values.get("http_proxy", ""), values.get("https_proxy", "")
        return cls(
            http_proxy=parse_proxy_url(http_value, source="proxy.http_proxy") if http_value else None,
            https_proxy=parse_proxy_url(https_value, source="proxy.https_proxy") if https_value else None,
            no_proxy=values.get("no_proxy"),
            cgi=cgi,
        )

    @property
    def ignored_no_proxy_entries(self) -> tuple[str, ...]:
        """The ``NO_PROXY`` entries, as written, that are malformed and so never match (§6.4)."""
        return self._no_proxy_list.ignored

    def proxy_for(self, url: str) -> str | None:
        """Return the proxy URL (user-info included) to reach ``url`` through, or ``None`` to go direct.

        A rule without any proxy sends everything direct. Otherwise the checks run in this order:
        whitespace or control characters in ``url``, scheme, CGI guard, the rest of the target's syntax,
        localhost and loopback, ``NO_PROXY`` (§3 to §6).

        Raises:
            ProxyConfigError: the CGI guard refused the HTTP proxy, or ``url`` is an http(s) URL that
                needs a decision and is malformed.
        """
        if self.http_proxy is None and self.https_proxy is None:
            return None
        if UNSAFE_CHARS.search(url):
            raise ProxyConfigError(
                f"cannot choose a proxy for {redact_url(url)!r}: "
                "it contains whitespace or a control character"
            )
        scheme_match = SCHEME.match(url)
        scheme = scheme_match.group(1).lower() if scheme_match else ""
        if scheme == "https":
            proxy = self.https_proxy
        elif scheme == "http":
            proxy = self.http_proxy
            if proxy is not None and self.cgi:
                raise ProxyConfigError(
                    f"refusing the HTTP proxy for {redact_url(url)!r}: REQUEST_METHOD is set, so this is a "
                    "CGI process, where a client can set HTTP_PROXY through its Proxy header (httpoxy)"
                )
        else:
            return None
        if proxy is None:
            return None
        try:
            target = parse_target(url, scheme)
        except ValueError as exc:
            raise ProxyConfigError(f"cannot choose a proxy for {redact_url(url)!r}: {exc}") from None
        if is_loopback_host(target.host) or self._no_proxy_list.bypasses(target):
            return None
        return proxy
