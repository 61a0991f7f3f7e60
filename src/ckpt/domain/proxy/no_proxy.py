"""``NO_PROXY`` for the proxy rule: parsing the list and matching a target against it (spec/proxy.md §6).

Parsing never raises: a malformed entry never matches, and :attr:`NoProxy.ignored` keeps it, as written,
for the shell to warn about (§6.4). Domain entries never match an IP target, which is the
CVE-2025-22870 fix (§6.3). No proxy values and no decision here.

Pure: the standard library's ``ipaddress`` and ``re`` and its ``idna`` codec, ``attrs``, and
:mod:`ckpt.domain.proxy.urls`.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final

import attrs

from ckpt.domain.proxy.urls import IPAddress, Target, parse_port, unmap

__all__ = ["NoProxy", "parse_no_proxy"]

_IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# §6.2: a domain entry, after the leading "." or "*." is removed and IDNA is applied.
_DOMAIN_ENTRY: Final = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\.?")
# §6.2: "[2001:db8::1]:443" or "[2001:db8::1]:" (any port), the only bracketed entry forms.
_BRACKETED_ENTRY: Final = re.compile(r"\[([^\[\]]+)\]:([0-9]*)")


@attrs.frozen
class _Everything:
    """``*``: every target bypasses the proxy."""

    def matches(self, target: Target) -> bool:
        return True


@attrs.frozen
class _Network:
    """``10.0.0.0/8``: IP targets inside the network."""

    network: _IPNetwork

    def matches(self, target: Target) -> bool:
        return (
            target.ip is not None and target.ip.version == self.network.version and target.ip in self.network
        )


@attrs.frozen
class _Address:
    """``1.2.3.4`` or ``1.2.3.4:80``: one IP, on any port or on one port."""

    address: IPAddress
    port: int | None

    def matches(self, target: Target) -> bool:
        return target.ip == self.address and (self.port is None or self.port == target.port)


@attrs.frozen
class _Domain:
    """``example.com`` (``include_self``), ``.example.com`` or ``*.example.com``, maybe with ``:port``."""

    name: str
    port: int | None
    include_self: bool

    def matches(self, target: Target) -> bool:
        if target.ip is not None:
            return False
        named = (self.include_self and target.host == self.name) or target.host.endswith("." + self.name)
        return named and (self.port is None or self.port == target.port)


_Entry = _Everything | _Network | _Address | _Domain


@attrs.frozen
class NoProxy:
    """A parsed ``NO_PROXY`` list: the entries that can match, and the malformed ones, as written."""

    entries: tuple[_Entry, ...]
    ignored: tuple[str, ...]

    def bypasses(self, target: Target) -> bool:
        """Whether an entry matches ``target``, which then goes direct (§6.1)."""
        return any(entry.matches(target) for entry in self.entries)


def parse_no_proxy(text: str) -> NoProxy:
    """Parse a ``NO_PROXY`` value (§6.1): comma-separated, trimmed, lower-cased, empty entries skipped.

    >>> parse_no_proxy(" .example.com, , :443").ignored
    (':443',)
    """
    entries: list[_Entry] = []
    ignored: list[str] = []
    for raw in text.split(","):
        trimmed = raw.strip()
        if not trimmed:
            continue
        entry = _parse_entry(trimmed.lower())
        if entry is None:
            ignored.append(trimmed)
        else:
            entries.append(entry)
    return NoProxy(entries=tuple(entries), ignored=tuple(ignored))


def _parse_entry(entry: str) -> _Entry | None:
    """Parse one trimmed, lower-cased, non-empty entry (§6.2); ``None`` if malformed (§6.4)."""
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
        return _Address(unmap(ipaddress.ip_address(entry)), None)
    except ValueError:
        pass
    bracketed = _BRACKETED_ENTRY.fullmatch(entry)
    if bracketed is not None:
        try:
            address = ipaddress.IPv6Address(bracketed.group(1))
            port_text = bracketed.group(2)
            return _Address(unmap(address), parse_port(port_text) if port_text else None)
        except ValueError:
            return None
    name, _, port_text = entry.partition(":")
    if ":" in port_text:  # several colons, yet not an IPv6 address
        return None
    try:
        # "host:" (an empty port) means any port, as Go's net.SplitHostPort reads it.
        port = parse_port(port_text) if port_text else None
    except ValueError:
        return None
    try:
        return _Address(ipaddress.IPv4Address(name), port)
    except ValueError:
        pass
    return _parse_domain_entry(name, port)


def _parse_domain_entry(name: str, port: int | None) -> _Domain | None:
    """Parse the name part of a domain entry (§6.2); ``None`` if malformed."""
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
