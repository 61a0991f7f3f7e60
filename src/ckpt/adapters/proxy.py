"""Carry the proxy rule's answer to the two HTTP clients: botocore (S3) and ``requests`` (Vault), SPEC §7.

The decision is :meth:`ckpt.domain.proxy.ProxyRule.proxy_for`; this module only translates it into each
client's settings, so that neither library consults the environment behind the rule's back:

* botocore gets an explicit ``proxies`` dict for ``botocore.config.Config``. ``{}`` means direct, and it
  matters that it is ``{}`` and not ``None``: botocore reads ``HTTP(S)_PROXY`` and ``NO_PROXY`` itself when
  the setting is ``None``. botocore keys its proxies by scheme only, so the decision is taken once, for
  the endpoint URL.
* ``requests`` gets a session with ``trust_env=False`` that asks the rule again for every request it
  sends, redirects included. Proxy credentials travel only in the proxy URL, which urllib3 turns into a
  ``Proxy-Authorization`` header for the proxy alone; a ``Proxy-Authorization`` header on the request
  itself is always removed, so that it can never reach an origin server (requests adds one on
  redirects, and inside a CONNECT tunnel it would go to the origin).

Nothing is created at import time and no vendor module is imported here at module level.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ckpt.domain.proxy import ProxyRule

if TYPE_CHECKING:
    import requests

__all__ = ["botocore_proxies", "proxies_for", "requests_session"]

_PROXY_AUTHORIZATION = "Proxy-Authorization"


def proxies_for(rule: ProxyRule, url: str) -> dict[str, str]:
    """Return the scheme-keyed proxies mapping for ``url``: ``{}`` to go direct, else ``{scheme: proxy}``.

    Raises:
        ProxyConfigError: from :meth:`ProxyRule.proxy_for` (the CGI guard, or a malformed URL); its
            message never shows proxy user-info.
    """
    proxy = rule.proxy_for(url)
    if proxy is None:
        return {}
    # proxy_for only answers a proxy for a well-formed http or https URL, so this split cannot fail.
    return {urlsplit(url).scheme.lower(): proxy}


def botocore_proxies(rule: ProxyRule, endpoint_url: str) -> dict[str, str]:
    """Return the ``proxies`` value for ``botocore.config.Config`` for a client of ``endpoint_url``.

    ``{}`` (not ``None``) for direct, so botocore does not fall back to the environment.

    Raises:
        ProxyConfigError: as :func:`proxies_for`.
    """
    return proxies_for(rule, endpoint_url)


def requests_session(rule: ProxyRule) -> requests.Session:
    """Return a ``requests.Session`` that never reads the environment and routes every request by ``rule``.

    Each request, and each redirect it follows, goes through the proxy the rule picks for its own URL, or
    direct. Proxies passed to ``Session.request`` or set on ``session.proxies`` are ignored: the rule is
    the only source. ``trust_env`` is off, so ``.netrc`` and ``REQUESTS_CA_BUNDLE`` are not read either;
    pass ``verify=`` explicitly.

    Raises (when a request is sent):
        ProxyConfigError: as :func:`proxies_for`, before any connection is opened.
    """
    session: requests.Session = _rule_session_class()(rule)
    return session


@functools.cache
def _rule_session_class() -> Callable[[ProxyRule], requests.Session]:
    """Define the session class on first use, so that importing this module does not import requests."""
    import requests

    class RuleSession(requests.Session):
        """A session whose proxy choice comes from a :class:`ProxyRule` alone, request by request."""

        def __init__(self, rule: ProxyRule) -> None:
            super().__init__()
            self.trust_env = False
            self.proxy_rule = rule

        def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
            # Session.request and resolve_redirects both end here; replacing "proxies" unconditionally
            # makes the rule win over session.proxies and any per-call proxies.
            kwargs["proxies"] = proxies_for(self.proxy_rule, str(request.url))
            request.headers.pop(_PROXY_AUTHORIZATION, None)
            return super().send(request, **kwargs)

        def rebuild_proxies(
            self, prepared_request: requests.PreparedRequest, proxies: dict[str, str] | None
        ) -> dict[str, str]:
            # The base class copies the previous hop's proxies and may add a Proxy-Authorization header
            # to the redirected request, which would leak to a server reached directly.
            prepared_request.headers.pop(_PROXY_AUTHORIZATION, None)
            return proxies_for(self.proxy_rule, str(prepared_request.url))

    RuleSession.__qualname__ = "RuleSession"
    return RuleSession
