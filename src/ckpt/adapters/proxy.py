"""Carry the proxy rule's answer to the two HTTP clients: botocore (S3) and ``requests`` (Vault),
spec/proxy.md.

The decision is :meth:`ckpt.domain.proxy.ProxyRule.proxy_for`; this module only translates it into each
client's settings, so that neither library consults the environment behind the rule's back:

* botocore: the client is built with ``Config(proxies={})`` (``None`` would make botocore read
  ``HTTP(S)_PROXY`` and ``NO_PROXY`` itself), and then :func:`route_botocore_client` makes its HTTP session
  ask the rule for the URL of every request it sends. botocore's own ``proxies`` setting is keyed by
  scheme only, so it could only carry one decision taken for the endpoint URL, and with virtual-hosted
  addressing (or after a region redirect) the client contacts another host, ``<bucket>.<endpoint host>``,
  which ``NO_PROXY`` may treat differently. :class:`ProxyRoutes` remembers each origin's route, for
  ``ckpt doctor``.
* ``requests`` (the Vault credential source's ``hvac`` client) gets a session with ``trust_env=False``
  that asks the rule again for every request it sends, redirects included. Proxy credentials travel
  only in the proxy URL, which urllib3 turns into a ``Proxy-Authorization`` header for the proxy alone;
  a ``Proxy-Authorization`` header on the request itself is always removed, so that it can never reach
  an origin server (requests adds one on redirects, and inside a CONNECT tunnel it would go to the
  origin).

Nothing is created at import time and no vendor module is imported here at module level.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ckpt.domain.errors import InvalidError
from ckpt.domain.proxy import ProxyRule
from ckpt.domain.redaction import redact_url

if TYPE_CHECKING:
    import requests

__all__ = [
    "ProxyChoice",
    "ProxyRoutes",
    "probe_proxy",
    "proxies_for",
    "requests_session",
    "route_botocore_client",
]

_PROXY_AUTHORIZATION = "Proxy-Authorization"


#: What decides a request's proxy: a rule, or its ``proxy_for`` (or a stand-in with the same contract).
ProxyChoice = ProxyRule | Callable[[str], str | None]


def proxies_for(rule: ProxyChoice, url: str) -> dict[str, str]:
    """Return the scheme-keyed proxies mapping for ``url``: ``{}`` to go direct, else ``{scheme: proxy}``.

    Raises:
        ProxyConfigError: from :meth:`ProxyRule.proxy_for` (the CGI guard, or a malformed URL); its
            message never shows proxy user-info.
    """
    proxy = rule.proxy_for(url) if isinstance(rule, ProxyRule) else rule(url)
    if proxy is None:
        return {}
    # proxy_for only answers a proxy for a well-formed http or https URL, so this split cannot fail.
    return {urlsplit(url).scheme.lower(): proxy}


def _origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, without user-info, path or query."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.rpartition('@')[2].lower()}"


class ProxyRoutes:
    """The rule's decisions for one HTTP client, request by request, and the route each origin got.

    :meth:`decide` is what the client calls; :meth:`seen` reports, for every origin (``scheme://host[:port]``)
    it was asked about, the proxy of the latest decision (user-info included) or ``None`` for direct.
    Thread-safe.
    """

    def __init__(self, rule: ProxyRule) -> None:
        self.rule = rule
        self._lock = threading.Lock()
        self._seen: dict[str, str | None] = {}

    def __repr__(self) -> str:
        return f"ProxyRoutes({self.rule!r})"

    def decide(self, url: str) -> str | None:
        """Return the proxy for ``url`` (``None``: direct) and remember it for its origin.

        Raises:
            ProxyConfigError: from :meth:`ProxyRule.proxy_for`.
        """
        proxy = self.rule.proxy_for(url)
        with self._lock:
            self._seen[_origin(url)] = proxy
        return proxy

    def seen(self) -> dict[str, str | None]:
        """Each origin decided on so far and its proxy (in clear: redact before showing it)."""
        with self._lock:
            return dict(self._seen)


def route_botocore_client(client: Any, routes: ProxyRoutes) -> None:
    """Make a botocore client choose its proxy by ``routes`` for the URL of every request it sends.

    botocore's HTTP session asks a ``ProxyConfiguration`` for each request's proxy; it is replaced by one
    that answers from the rule, for the request's own URL (virtual-hosted bucket hosts and redirected
    regions included). Build the client with ``Config(proxies={})`` all the same.

    Raises:
        InvalidError: the client has no botocore HTTP session to route (an incompatible botocore); the
            client must not be used then, as it would route by scheme alone.
    """
    from botocore.httpsession import ProxyConfiguration  # lazily: botocore only for S3

    http_session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    current = getattr(http_session, "_proxy_config", None)
    if not isinstance(current, ProxyConfiguration):
        raise InvalidError("this botocore version's S3 client cannot be routed by the proxy rule")
    http_session._proxy_config = _rule_proxy_configuration_class()(routes, current.settings)  # type: ignore[union-attr]


@functools.cache
def _rule_proxy_configuration_class() -> Callable[[ProxyRoutes, Any], Any]:
    """Define the botocore proxy configuration on first use: importing this module imports no botocore."""
    from botocore.httpsession import ProxyConfiguration

    class RuleProxyConfiguration(ProxyConfiguration):  # type: ignore[misc]
        """botocore's per-request proxy lookup, answered by a :class:`ProxyRoutes`."""

        def __init__(self, routes: ProxyRoutes, proxies_settings: Any) -> None:
            super().__init__(proxies={}, proxies_settings=proxies_settings)
            self.routes = routes

        def proxy_url_for(self, url: str) -> str | None:
            return self.routes.decide(url)

    return RuleProxyConfiguration


def probe_proxy(proxy: str, timeout: float) -> str | None:
    """Open (and close) a TCP connection to ``proxy``'s host and port; ``None`` if it answers, else why not.

    The reason never holds the proxy's user-info. Only the connection is tried: no request is sent.
    """
    try:
        parts = urlsplit(proxy)
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"{redact_url(proxy)!r} is not a proxy URL"
    if not host:
        return f"{redact_url(proxy)!r} has no host"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror:
        return "its name does not resolve"
    except TimeoutError:
        return f"no connection within {timeout:g} s"
    except ConnectionRefusedError:
        return "the connection was refused (nothing listens there)"
    except OSError as exc:
        return f"cannot connect ({type(exc).__name__})"


def requests_session(rule: ProxyChoice) -> requests.Session:
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
def _rule_session_class() -> Callable[[ProxyChoice], requests.Session]:
    """Define the session class on first use, so that importing this module does not import requests."""
    import requests

    class RuleSession(requests.Session):
        """A session whose proxy choice comes from a :class:`ProxyRule` alone, request by request."""

        def __init__(self, rule: ProxyChoice) -> None:
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
