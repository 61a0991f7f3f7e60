"""The one loopback check: whether a host name or address never leaves the machine.

Two rules rely on it and must agree: the proxy rule never proxies such a host (spec/proxy.md §5.3), and
the Vault source accepts plain ``http://`` to it (spec/credentials.md §5.4).
Nothing else here; pure (``ipaddress`` only).
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback_host"]


def is_loopback_host(host: str) -> bool:
    """Return whether ``host`` is ``localhost`` (any case) or a loopback IP address.

    ``host`` is a URL's host without brackets: a name, an IPv4 address, or an IPv6 address, which may
    carry a zone (``::1%eth0``; the zone plays no part). Loopback addresses are 127.0.0.0/8, ``::1`` and
    the IPv4-mapped ``::ffff:127.0.0.0/104``. Only the name ``localhost`` itself counts, not its
    subdomains nor ``localhost.`` (resolving names is not this check's business).

    >>> is_loopback_host("LocalHost"), is_loopback_host("127.8.0.1"), is_loopback_host("::ffff:127.0.0.1")
    (True, True, True)
    >>> is_loopback_host("10.0.0.1"), is_loopback_host("localhost.example")
    (False, False)
    """
    if host.lower() == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
