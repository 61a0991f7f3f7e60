"""The proxy rule: which proxy, if any, carries a request to a given URL (SPEC §7).

One pure value, :class:`ProxyRule`, decides for both HTTP clients (botocore for S3, ``requests`` for Vault);
the adapters in :mod:`ckpt.adapters.proxy` only carry its answer to them. Nothing here reads the
environment: the shell passes a mapping in. Semantics follow Go's ``golang.org/x/net/http/httpproxy`` after
the CVE-2025-22870 fix, with the deviations marked *(deviation)*.

Rules:

1. Sources. :meth:`ProxyRule.from_environment` reads ``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY``; for
   each, the upper-case name wins over the lower-case one and an empty value counts as unset (so an empty
   ``HTTP_PROXY`` lets ``http_proxy`` through). ``ALL_PROXY`` is never read. :meth:`ProxyRule.from_config`
   reads the ``[proxy]`` table instead, and then the environment's proxy variables are not read at all.
   The CGI flag always comes from the environment (``REQUEST_METHOD`` set and non-empty, see :func:`is_cgi`).
2. Proxy values are checked when the rule is built, not when it is first used. A value without ``://``
   means ``http://``. Only ``http`` and ``https`` proxies are accepted; another scheme (``socks5``) or a
   malformed value (no host, a bad port, whitespace, a backslash, a path, a query) raises
   :class:`ProxyConfigError` *(deviation: Go ignores both)*. The canonical form is
   ``scheme://[user-info@]host[:port]``, scheme and host in lower case, the host in IDNA form; parsing
   the canonical form returns it unchanged.
3. Scheme. An ``https`` target uses the HTTPS proxy only (no fall-back to the HTTP proxy); an ``http``
   target uses the HTTP proxy; any other scheme, or none, is never proxied.
4. CGI guard, checked first (before ``NO_PROXY`` and the loopback exemption): in a CGI process an ``http``
   target with an HTTP proxy configured raises :class:`ProxyConfigError`, because a CGI client controls
   ``HTTP_PROXY`` through its ``Proxy:`` header ("httpoxy").
5. Target URLs are split by hand: the authority ends at the first ``/``, ``?`` or ``#``; the host follows
   its last ``@``. When the rule has a proxy that could apply, a URL with whitespace or a control
   character anywhere, a backslash in its authority, no host, a bad port, a character no host name may
   contain (``%``, ``<``, ``|``...), or a non-ASCII name without an IDNA form raises
   :class:`ProxyConfigError` rather than be guessed at: URL parsers disagree on such input (urllib3
   ends the authority at a backslash, ``urllib.parse`` does not), and the client must not reach a host
   other than the one decided on. The port defaults from the scheme (80, 443); ports compare as
   numbers; host names compare in lower case and IDNA form.
6. Never proxied: the host ``localhost`` in any case *(deviation: Go matches exactly)*, and loopback IPs
   (127.0.0.0/8, ``::1``, IPv4-mapped loopback), whatever their IPv6 zone.
7. ``NO_PROXY`` is a comma-separated list; entries are trimmed and lower-cased; empty entries are skipped.

   * ``*`` as a whole entry, anywhere in the list, bypasses the proxy for every target.
   * ``10.0.0.0/8``, ``2001:db8::/32``: a network (host bits may be set); matches IP targets in it.
   * ``1.2.3.4``, ``2001:db8::1``: one address, any port. ``1.2.3.4:80``, ``[2001:db8::1]:443``: that
     address and port. IPv4-mapped IPv6 addresses compare as their IPv4 address; zones are ignored.
   * An empty port (``example.com:``, ``1.2.3.4:``, ``[2001:db8::1]:``) means any port, as in Go, whose
     ``net.SplitHostPort`` splits such an entry into the host and an empty port that matches every port.
   * ``example.com``: that name and its subdomains on a label boundary (not ``notexample.com``).
     ``.example.com`` and ``*.example.com``: subdomains only. Any of them may end in ``:port``.
     Labels are letters, digits, ``-`` and ``_``, with an optional final dot; non-ASCII names are compared
     in IDNA form.
   * Domain entries never match an IP target. So ``*.example.com`` does not bypass the proxy for
     ``http://[fe80::1%25.example.com]/`` (the zone is not a domain): the CVE-2025-22870 fix.
   * Every other entry is malformed and never matches (``:443``, ``:``, ``https://example.com``,
     ``*:80``, ``[2001:db8::1]`` without a port, a zone in an entry). It does not raise: the rule
     reports it in :attr:`ProxyRule.ignored_no_proxy_entries` for the shell to warn about.

8. Secrets. A proxy URL may carry a password. ``repr()`` and every message here show it redacted by
   :func:`~ckpt.domain.redaction.redact_url` (``user:***@``), the project's one redaction helper, and
   quote no other piece of a value (not its "scheme" when that is not a well-formed scheme, not its
   port): in a malformed value such a piece may be the password. Only :meth:`ProxyRule.proxy_for`
   returns a password in clear, for the client.

Pure: the standard library's ``ipaddress`` and ``re`` and its ``idna`` codec, ``attrs``, and
:mod:`ckpt.domain.redaction`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Final

import attrs

from ckpt.domain.errors import ConfigError, ProxyConfigError
from ckpt.domain.redaction import redact_url

__all__ = [
    "ProxyRule",
    "is_cgi",
    "parse_proxy_url",
    "redact_url",
]

_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_PROXY_SCHEMES: Final = frozenset({"http", "https"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_CONFIG_KEYS: Final = ("http_proxy", "https_proxy", "no_proxy")

# Rule 5: whitespace, C0 controls and DEL make a URL ambiguous between parsers (urllib.parse silently
# drops tabs and newlines; requests strips leading spaces), so they are refused outright.
_UNSAFE_CHARS: Final = re.compile(r"[\x00-\x20\x7f]")
# Rule 5: the WHATWG "forbidden domain code points" that survive _UNSAFE_CHARS, plus "%" (a percent-escape
# in a host name would be decoded by some clients and not others).
_FORBIDDEN_HOST_CHARS: Final = re.compile(r"[#%/:<>?@\[\\\]^|]")
# RFC 3986 §3.1: a scheme is a letter followed by letters, digits, "+", "-" and ".".
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
# Rule 7: a domain entry, after the leading "." or "*." is removed and IDNA is applied.
_DOMAIN_ENTRY: Final = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")
# Rule 7: "[2001:db8::1]:443" or "[2001:db8::1]:" (any port), the only bracketed entry forms.
_BRACKETED_ENTRY: Final = re.compile(r"\[([^\[\]]+)\]:([0-9]*)")
_PORT: Final = re.compile(r"[0-9]{1,5}")


def is_cgi(environ: Mapping[str, str]) -> bool:
    """Return whether the process runs as a CGI handler: ``REQUEST_METHOD`` is set and non-empty."""
    return environ.get("REQUEST_METHOD", "") != ""


def parse_proxy_url(value: str, *, source: str = "proxy") -> str:
    """Check a proxy value and return its canonical form (rule 2); ``source`` names it in errors.

    >>> parse_proxy_url("Proxy.Example:3128")
    'http://proxy.example:3128'

    Raises:
        ProxyConfigError: the value is malformed or its scheme is not ``http`` or ``https``. The message
            shows the value redacted.
    """

    def refuse(reason: str) -> ProxyConfigError:
        return ProxyConfigError(f"{source} value {redact_url(value)!r} is not a usable proxy URL: {reason}")

    if not value:
        raise refuse("it is empty")
    if _UNSAFE_CHARS.search(value):
        raise refuse("it contains whitespace or a control character")
    if "\\" in value:
        raise refuse("it contains a backslash")
    if "://" in value:
        scheme_text, _, rest = value.partition("://")
        scheme = scheme_text.lower()
        if scheme not in _PROXY_SCHEMES:
            if not _SCHEME.fullmatch(scheme_text + ":"):
                # Not a scheme, so possibly user-info (":p%40ss@://"): never quote it on its own.
                raise refuse("the text before '://' is not a URL scheme (use http:// or https://)")
            raise refuse(f"scheme {scheme!r} is not supported (use http:// or https://)")
    else:
        scheme, rest = "http", value
    # Split the authority from the rest by hand rather than with urlsplit: a missing "/" before a query
    # or fragment must not be silently tolerated.
    netloc, separator, tail = _split_authority(rest)
    if separator and (separator != "/" or tail):
        raise refuse("a proxy URL has no path, query or fragment")
    userinfo, at, hostport = netloc.rpartition("@")
    try:
        host, port = _split_host_port(hostport)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    port_text = "" if port is None else f":{port}"
    return f"{scheme}://{userinfo}{at}{host}{port_text}"


def _split_authority(rest: str) -> tuple[str, str, str]:
    """Split ``rest`` (what follows ``scheme://``) at the first ``/``, ``?`` or ``#``."""
    match = re.search(r"[/?#]", rest)
    if match is None:
        return rest, "", ""
    return rest[: match.start()], match.group(), rest[match.end() :]


def _split_host_port(hostport: str) -> tuple[str, int | None]:
    """Parse ``host[:port]`` of a proxy URL into the canonical host text and the port, or raise ValueError."""
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise ValueError("its IPv6 address has no closing bracket")
        inside, after = hostport[1:close], hostport[close + 1 :]
        if after and not after.startswith(":"):
            raise ValueError("text follows its IPv6 address")
        address, _, zone = inside.partition("%")
        try:
            ip = ipaddress.IPv6Address(address)
        except ValueError:
            raise ValueError("its bracketed host is not an IPv6 address") from None
        host = f"[{ip.compressed}{'%' if zone else ''}{zone}]"
        port_text = after[1:] if after else None
    else:
        name, colon, port_text_or_empty = hostport.partition(":")
        port_text = port_text_or_empty if colon else None
        host = _canonical_name(name)
    if port_text is None or port_text == "":
        return host, None
    return host, _parse_port(port_text)


def _canonical_name(name: str) -> str:
    """Lower-case a host name (or IPv4 address) and give it in IDNA form, or raise ValueError."""
    if not name:
        raise ValueError("it has no host")
    if _FORBIDDEN_HOST_CHARS.search(name):
        raise ValueError("its host contains a character no host name may contain")
    name = name.lower()
    if name.isascii():
        return name
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError:
        raise ValueError("its host has no IDNA form") from None
    # IDNA 2003 maps some characters to ASCII that no host may contain ("\u00af" becomes " \u0304").
    if _UNSAFE_CHARS.search(ascii_name) or _FORBIDDEN_HOST_CHARS.search(ascii_name):
        raise ValueError("its host's IDNA form contains a character no host name may contain")
    return ascii_name


def _parse_port(text: str) -> int:
    """Parse a decimal port 1-65535, or raise ValueError."""
    if not _PORT.fullmatch(text) or not 0 < int(text) <= 65535:
        # The port text is not quoted: in a malformed value it may be a password ("http://alice:s3cr3t").
        raise ValueError("its port is not a number from 1 to 65535")
    return int(text)


@attrs.frozen
class _Target:
    """A target: host (lower case, IDNA form; IPv6 without brackets or zone), its IP if it is one, port."""

    host: str
    ip: _IPAddress | None
    port: int


def _unmap(ip: _IPAddress) -> _IPAddress:
    """Return the IPv4 address behind an IPv4-mapped IPv6 address, else ``ip`` itself."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def _parse_target(url: str, scheme: str) -> _Target:
    """Parse an http(s) target URL (rule 5), or raise ValueError saying why it is malformed."""
    rest = url[len(scheme) + 1 :]
    if not rest.startswith("//"):
        raise ValueError("it has no host")
    authority, _, _ = _split_authority(rest[2:])
    if "\\" in authority:
        # urllib3 and WHATWG parsers end the authority at a backslash, urllib.parse does not: refuse.
        raise ValueError("its authority contains a backslash")
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise ValueError("its IPv6 address has no closing bracket")
        inside, after = hostport[1:close], hostport[close + 1 :]
        if after and not after.startswith(":"):
            raise ValueError("text follows its IPv6 address")
        # RFC 6874 writes the zone "%25eth0"; some write "%eth0". Either way the zone plays no part.
        address = inside.partition("%")[0]
        try:
            ip: _IPAddress | None = _unmap(ipaddress.IPv6Address(address))
        except ValueError:
            raise ValueError("its bracketed host is not an IPv6 address") from None
        host = str(ip)
        port_text = after[1:]
    else:
        name, _, port_text = hostport.partition(":")
        host = _canonical_name(name)
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            ip = None
    port = _parse_port(port_text) if port_text else _DEFAULT_PORTS[scheme]
    return _Target(host=host, ip=ip, port=port)


def _never_proxied(target: _Target) -> bool:
    """Rule 6: ``localhost`` and loopback addresses always go direct."""
    return target.host == "localhost" or (target.ip is not None and target.ip.is_loopback)


@attrs.frozen
class _Everything:
    """``*``: every target bypasses the proxy."""

    def matches(self, target: _Target) -> bool:
        return True


@attrs.frozen
class _Network:
    """``10.0.0.0/8``: IP targets inside the network."""

    network: _IPNetwork

    def matches(self, target: _Target) -> bool:
        return (
            target.ip is not None and target.ip.version == self.network.version and target.ip in self.network
        )


@attrs.frozen
class _Address:
    """``1.2.3.4`` or ``1.2.3.4:80``: one IP, on any port or on one port."""

    address: _IPAddress
    port: int | None

    def matches(self, target: _Target) -> bool:
        return target.ip == self.address and (self.port is None or self.port == target.port)


@attrs.frozen
class _Domain:
    """``example.com`` (``include_self``), ``.example.com`` or ``*.example.com``, maybe with ``:port``."""

    name: str
    port: int | None
    include_self: bool

    def matches(self, target: _Target) -> bool:
        if target.ip is not None:
            return False
        named = (self.include_self and target.host == self.name) or target.host.endswith("." + self.name)
        return named and (self.port is None or self.port == target.port)


_Entry = _Everything | _Network | _Address | _Domain


def _parse_no_proxy_entry(entry: str) -> _Entry | None:
    """Parse one trimmed, lower-cased, non-empty ``NO_PROXY`` entry (rule 7); ``None`` if malformed."""
    if entry == "*":
        return _Everything()
    if "%" in entry:  # a zone, or a percent-escape: neither belongs in an entry
        return None
    if "/" in entry:
        try:
            return _Network(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            return None
    try:
        return _Address(_unmap(ipaddress.ip_address(entry)), None)
    except ValueError:
        pass
    bracketed = _BRACKETED_ENTRY.fullmatch(entry)
    if bracketed is not None:
        try:
            address = ipaddress.IPv6Address(bracketed.group(1))
            port_text = bracketed.group(2)
            return _Address(_unmap(address), _parse_port(port_text) if port_text else None)
        except ValueError:
            return None
    name, _, port_text = entry.partition(":")
    if ":" in port_text:  # several colons, yet not an IPv6 address
        return None
    try:
        # "host:" (an empty port) means any port, as Go's net.SplitHostPort reads it.
        port = _parse_port(port_text) if port_text else None
    except ValueError:
        return None
    try:
        return _Address(ipaddress.IPv4Address(name), port)
    except ValueError:
        pass
    return _parse_domain_entry(name, port)


def _parse_domain_entry(name: str, port: int | None) -> _Domain | None:
    """Parse the name part of a domain entry (rule 7); ``None`` if malformed."""
    include_self = True
    if name.startswith("*."):
        name, include_self = name[2:], False
    elif name.startswith("."):
        name, include_self = name[1:], False
    if not name.isascii():
        try:
            name = name.encode("idna").decode("ascii")
        except UnicodeError:
            return None
    if not _DOMAIN_ENTRY.fullmatch(name):
        return None
    return _Domain(name=name, port=port, include_self=include_self)


@attrs.frozen
class _NoProxy:
    """A parsed ``NO_PROXY`` list: the entries that can match, and the malformed ones, as written."""

    entries: tuple[_Entry, ...]
    ignored: tuple[str, ...]

    def bypasses(self, target: _Target) -> bool:
        return any(entry.matches(target) for entry in self.entries)


def _parse_no_proxy(text: str) -> _NoProxy:
    """Parse a ``NO_PROXY`` value. It never raises: a malformed entry never matches (rule 7)."""
    entries: list[_Entry] = []
    ignored: list[str] = []
    for raw in text.split(","):
        trimmed = raw.strip()
        if not trimmed:
            continue
        entry = _parse_no_proxy_entry(trimmed.lower())
        if entry is None:
            ignored.append(trimmed)
        else:
            entries.append(entry)
    return _NoProxy(entries=tuple(entries), ignored=tuple(ignored))


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
    """Which proxy carries a request to a URL: one rule for the S3 client and the Vault client (SPEC §7).

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
    _no_proxy_list: _NoProxy = attrs.field(init=False, repr=False, eq=False)

    @_no_proxy_list.default
    def _parse_own_no_proxy(self) -> _NoProxy:
        return _parse_no_proxy(self.no_proxy or "")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> ProxyRule:
        """Build the rule from process environment variables (rule 1), e.g. ``os.environ``.

        Raises:
            ProxyConfigError: a proxy variable that is read holds a malformed or non-http(s) value.
        """

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
        """The ``NO_PROXY`` entries, as written, that are malformed and so never match (rule 7)."""
        return self._no_proxy_list.ignored

    def proxy_for(self, url: str) -> str | None:
        """Return the proxy URL (user-info included) to reach ``url`` through, or ``None`` to go direct.

        A rule without any proxy sends everything direct. Otherwise the checks run in this order:
        whitespace or control characters in ``url``, scheme, CGI guard, the rest of the target's syntax,
        localhost and loopback, ``NO_PROXY`` (rules 3 to 7).

        Raises:
            ProxyConfigError: the CGI guard refused the HTTP proxy, or ``url`` is an http(s) URL that
                needs a decision and is malformed.
        """
        if self.http_proxy is None and self.https_proxy is None:
            return None
        if _UNSAFE_CHARS.search(url):
            raise ProxyConfigError(
                f"cannot choose a proxy for {redact_url(url)!r}: "
                "it contains whitespace or a control character"
            )
        scheme_match = _SCHEME.match(url)
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
            target = _parse_target(url, scheme)
        except ValueError as exc:
            raise ProxyConfigError(f"cannot choose a proxy for {redact_url(url)!r}: {exc}") from None
        if _never_proxied(target) or self._no_proxy_list.bypasses(target):
            return None
        return proxy
