"""Parsing for the proxy rule: proxy values and target URLs (spec/proxy.md §2 and §5).

Both are split by hand rather than with ``urllib.parse``: URL parsers disagree on odd input (urllib3 ends
the authority at a backslash, ``urllib.parse`` does not; ``urllib.parse`` silently drops tabs and
newlines), and the client must not reach a host other than the one the rule decided on, so such input is
refused instead of guessed at. No ``NO_PROXY`` parsing and no decision here.

Every message shows a value only through :func:`~ckpt.domain.redaction.redact_url` and quotes no other
piece of it (not its "scheme" when that is not a well-formed scheme, not its port): in a malformed value
such a piece may be the password (§8).

Pure: the standard library's ``ipaddress`` and ``re`` and its ``idna`` codec, ``attrs``, and
:mod:`ckpt.domain.redaction`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

import attrs

from ckpt.domain.errors import ProxyConfigError
from ckpt.domain.redaction import redact_url

__all__ = [
    "SCHEME",
    "UNSAFE_CHARS",
    "IPAddress",
    "Target",
    "parse_port",
    "parse_proxy_url",
    "parse_target",
    "unmap",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_PROXY_SCHEMES: Final = frozenset({"http", "https"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}

# §2.2, §5.1: whitespace, C0 controls and DEL make a URL ambiguous between parsers (urllib.parse silently
# drops tabs and newlines; requests strips leading spaces), so they are refused outright.
UNSAFE_CHARS: Final = re.compile(r"[\x00-\x20\x7f]")
# §5.1: the WHATWG "forbidden domain code points" that survive UNSAFE_CHARS, plus "%" (a percent-escape
# in a host name would be decoded by some clients and not others).
_FORBIDDEN_HOST_CHARS: Final = re.compile(r"[#%/:<>?@\[\\\]^|]")
# RFC 3986 §3.1: a scheme is a letter followed by letters, digits, "+", "-" and ".".
SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_PORT: Final = re.compile(r"[0-9]{1,5}")


def parse_proxy_url(value: str, *, source: str = "proxy") -> str:
    """Check a proxy value and return its canonical form (§2); ``source`` names it in errors.

    The canonical form is ``scheme://[user-info@]host[:port]``, scheme and host in lower case, the host in
    IDNA form; parsing the canonical form returns it unchanged.

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
    if UNSAFE_CHARS.search(value):
        raise refuse("it contains whitespace or a control character")
    if "\\" in value:
        raise refuse("it contains a backslash")
    if "://" in value:
        scheme_text, _, rest = value.partition("://")
        scheme = scheme_text.lower()
        if scheme not in _PROXY_SCHEMES:
            if not SCHEME.fullmatch(scheme_text + ":"):
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
    return host, parse_port(port_text)


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
    if UNSAFE_CHARS.search(ascii_name) or _FORBIDDEN_HOST_CHARS.search(ascii_name):
        raise ValueError("its host's IDNA form contains a character no host name may contain")
    return ascii_name


def parse_port(text: str) -> int:
    """Parse a decimal port 1-65535, or raise ValueError."""
    if not _PORT.fullmatch(text) or not 0 < int(text) <= 65535:
        # The port text is not quoted: in a malformed value it may be a password ("http://alice:s3cr3t").
        raise ValueError("its port is not a number from 1 to 65535")
    return int(text)


@attrs.frozen
class Target:
    """A target: host (lower case, IDNA form; IPv6 without brackets or zone), its IP if it is one, port."""

    host: str
    ip: IPAddress | None
    port: int


def unmap(ip: IPAddress) -> IPAddress:
    """Return the IPv4 address behind an IPv4-mapped IPv6 address, else ``ip`` itself (§5.2)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def parse_target(url: str, scheme: str) -> Target:
    """Parse an http(s) target URL (§5.1, §5.2), or raise ValueError saying why it is malformed.

    ``scheme`` is the URL's scheme in lower case, ``http`` or ``https``; the caller has already refused
    whitespace and control characters.
    """
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
            ip: IPAddress | None = unmap(ipaddress.IPv6Address(address))
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
    port = parse_port(port_text) if port_text else _DEFAULT_PORTS[scheme]
    return Target(host=host, ip=ip, port=port)
