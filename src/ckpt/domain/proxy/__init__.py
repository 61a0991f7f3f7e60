"""The proxy rule (spec/proxy.md): which proxy, if any, carries a request to a given URL.

Three modules, one reason to change each:

* :mod:`ckpt.domain.proxy.urls`: parsing proxy values and target URLs (§2, §5);
* :mod:`ckpt.domain.proxy.no_proxy`: parsing ``NO_PROXY`` and matching a target against it (§6);
* :mod:`ckpt.domain.proxy.rule`: :class:`ProxyRule`, where the settings come from and the decision
  (§1, §3, §4, §5.3, §7.1).

The public names are importable from here. Pure: nothing here reads the environment or does I/O.
"""

from __future__ import annotations

from ckpt.domain.proxy.rule import ProxyRule, is_cgi
from ckpt.domain.proxy.urls import parse_proxy_url
from ckpt.domain.redaction import redact_url

__all__ = [
    "ProxyRule",
    "is_cgi",
    "parse_proxy_url",
    "redact_url",
]
