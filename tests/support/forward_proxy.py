"""A recording HTTP forward proxy on loopback, for tests that must see what a client sends to its proxy.

::

    with ForwardProxy(resolve={"s3.unresolvable.test": ("127.0.0.1", moto_port)}) as proxy:
        ...  # point a client at proxy.url
        assert [r.host for r in proxy.requests] == ["s3.unresolvable.test"]

What it does:

* Listens on ``127.0.0.1`` on a free port, serving from background threads until the ``with`` ends.
* Absolute-URI requests (``GET http://host:port/path``) are forwarded to the target and the answer relayed;
  ``CONNECT host:port`` opens a byte tunnel. Origin-form requests and ``https://`` absolute URIs get 400,
  unless the proxy was given an ``upstream`` (a loopback ``(address, port)``): then it is also a relay in
  front of that one server, and a client whose endpoint is :attr:`ForwardProxy.url` has its origin-form
  requests forwarded there, under the same rules, recorded with the upstream as their host.
* Records every request it receives, before it answers, as a :class:`RecordedRequest`: method, target
  host and port, path, headers (without ``Proxy-Authorization``, whose presence is a flag), and outcome.
* Optional Basic proxy authentication (``credentials=("user", "password")``): a missing or wrong
  ``Proxy-Authorization`` gets 407, recorded with outcome ``"unauthorized"``.
* Never forwards off the machine and never uses DNS: a target is reached only if it is a loopback IP
  literal, ``localhost``, or a name in ``resolve`` that maps to a loopback address; anything else is
  refused with 403 (``"refused"``). ``resolve`` lets tests use names that do not resolve
  (``s3.unresolvable.test``), which proves a client reached the target through the proxy and no other way.
* :attr:`ForwardProxy.rules`, a list of :class:`Rule` objects, runs in order on every request after
  authentication. A rule may rewrite the request (:class:`StripRequestHeader`) or decide its fate:
  answer instead of forwarding (:class:`Respond`, :func:`slow_down`, :func:`internal_error`), or forward
  and then answer with an error all the same (``after_forwarding=True``: the server applied the request,
  the client sees a failure), drop the connection before or after forwarding (:class:`DropConnection`),
  wait first (:class:`Delay`), or cut the response body short (:class:`TruncateResponse`). Each rule takes
  a :class:`Match` saying which requests, and how many, it applies to (the n-th one, every n-th one, the
  first few). :class:`RewriteResponse` relays the target's answer with its body rewritten (a listing
  made to say what no conforming server says). For CONNECT, only answering (at once), dropping before
  forwarding and delaying apply: a tunnel's bytes are opaque.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import enum
import http.client
import ipaddress
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Protocol
from urllib.parse import quote, urlsplit

__all__ = [
    "Delay",
    "DropConnection",
    "Exchange",
    "ForwardProxy",
    "Match",
    "RecordedRequest",
    "Respond",
    "RewriteResponse",
    "Rule",
    "StripRequestHeader",
    "TruncateResponse",
    "internal_error",
    "slow_down",
]

# RFC 9110 §7.6.1 hop-by-hop fields, plus the proxy-specific ones; never forwarded in either direction.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",  # the proxy already answered "100 Continue" itself
    }
)
_UPSTREAM_TIMEOUT = 10.0
_TUNNEL_POLL = 0.2


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the proxy received it.

    ``outcome`` is one of ``"forwarded"``, ``"tunnelled"``, ``"replied"`` (a rule answered),
    ``"replied-after-forwarding"`` (the target answered, a rule's answer replaced it),
    ``"dropped"`` (before forwarding), ``"dropped-after-forwarding"``, ``"truncated"``, ``"rewritten"``,
    ``"refused"`` (not loopback, or unknown name), ``"unreachable"`` (loopback target not listening),
    ``"unauthorized"`` and ``"rejected"`` (not a proxy request). ``received_at`` comes before the target
    could have seen the request, so whatever the request did at the target happened after it.
    """

    method: str
    host: str
    port: int
    path: str
    headers: tuple[tuple[str, str], ...]
    proxy_authorization: bool
    outcome: str
    received_at: float = 0.0  # time.time() when the proxy began handling it (before any rule's delay)

    @property
    def target(self) -> str:
        """``host:port`` as the client asked for it (IPv6 in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)


class Drop(enum.Enum):
    """When a :class:`DropConnection` rule closes the client's connection without an answer."""

    BEFORE_FORWARDING = "before"
    AFTER_FORWARDING = "after"


@dataclass(frozen=True)
class Reply:
    """A canned answer a rule gives instead of forwarding, or instead of the target's answer."""

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    after_forwarding: bool = False


@dataclass
class Exchange:
    """One request on its way through the proxy. Rules may edit ``headers`` and ``body`` and set decisions.

    Decisions, applied in this order: ``delay`` seconds of sleep; ``reply`` answers without forwarding
    (or, when it is ``after_forwarding``, once the target has answered); ``drop`` closes the connection
    (before or after forwarding); ``truncate_to`` relays at most that many bytes of the response body, then
    closes; ``rewrite`` turns the target's response body into the one relayed.
    """

    method: str
    host: str
    port: int
    path: str
    headers: list[tuple[str, str]]
    body: bytes = b""
    delay: float = 0.0
    reply: Reply | None = None
    drop: Drop | None = None
    truncate_to: int | None = None
    rewrite: Callable[[bytes], bytes] | None = None

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or ``None``."""
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), None)

    def remove_header(self, name: str) -> None:
        """Remove every header called ``name`` (case-insensitive)."""
        wanted = name.lower()
        self.headers = [(key, value) for key, value in self.headers if key.lower() != wanted]


class Rule(Protocol):
    """A rewrite or fault applied to requests passing through the proxy."""

    def apply(self, exchange: Exchange) -> None:
        """Edit ``exchange`` (headers, body) or set one of its decisions; or leave it alone."""


@dataclass
class Match:
    """Which requests a rule applies to: all criteria given must hold; then ``skip``, ``every``, ``times``.

    Among the requests meeting the criteria (counted in ``seen``), the first ``skip`` are left alone; of
    the rest, every ``every``-th one is taken (``None``: each one), at most ``times`` in all. So
    ``Match(skip=k - 1, times=1)`` is the k-th request and ``Match(every=3)`` the 3rd, 6th, 9th...
    ``hits`` counts the requests the rule was applied to, so tests can check a fault actually fired.
    Not thread-safe by itself: the proxy applies rules under its lock.
    """

    method: str | None = None
    host: str | None = None
    path_prefix: str | None = None
    header: str | None = None
    times: int | None = None
    skip: int = 0
    every: int | None = None
    hits: int = field(default=0, init=False)
    seen: int = field(default=0, init=False)

    def take(self, exchange: Exchange) -> bool:
        """Return whether the rule applies to ``exchange``, and count it if so."""
        if self.times is not None and self.hits >= self.times:
            return False
        if self.method is not None and exchange.method.upper() != self.method.upper():
            return False
        if self.host is not None and exchange.host.lower() != self.host.lower():
            return False
        if self.path_prefix is not None and not exchange.path.startswith(self.path_prefix):
            return False
        if self.header is not None and exchange.header(self.header) is None:
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        if self.every is not None and (self.seen - self.skip) % self.every != 0:
            return False
        self.hits += 1
        return True


@dataclass
class StripRequestHeader:
    """Remove a request header before forwarding (e.g. ``If-None-Match``, to play a non-conforming S3)."""

    name: str
    when: Match = field(default_factory=Match)

    def apply(self, exchange: Exchange) -> None:
        if self.when.take(exchange):
            exchange.remove_header(self.name)


@dataclass
class Respond:
    """Answer with a canned response instead of forwarding.

    With ``after_forwarding``, the request is forwarded first and the target's answer thrown away: the
    server applied the request, and the client is told it failed (S3's "InternalError after commit").
    """

    status: int
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    when: Match = field(default_factory=Match)
    after_forwarding: bool = False

    def apply(self, exchange: Exchange) -> None:
        if exchange.reply is None and self.when.take(exchange):
            exchange.reply = Reply(self.status, self.body, self.headers, self.after_forwarding)


def _s3_error(code: str, message: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
        "<RequestId>forward-proxy</RequestId></Error>"
    ).encode()


def slow_down(when: Match | None = None, *, after_forwarding: bool = False) -> Respond:
    """A rule answering S3's ``503 SlowDown`` error (the throttling answer clients must retry)."""
    body = _s3_error("SlowDown", "Please reduce your request rate.")
    return Respond(503, body, (("Content-Type", "application/xml"),), when or Match(), after_forwarding)


def internal_error(when: Match | None = None, *, after_forwarding: bool = False) -> Respond:
    """A rule answering S3's ``500 InternalError`` (which S3 documents as "retry the request")."""
    body = _s3_error("InternalError", "We encountered an internal error. Please try again.")
    return Respond(500, body, (("Content-Type", "application/xml"),), when or Match(), after_forwarding)


@dataclass
class DropConnection:
    """Close the client's connection without an answer, before forwarding or after the target answered."""

    after_forwarding: bool = False
    when: Match = field(default_factory=Match)

    def apply(self, exchange: Exchange) -> None:
        if exchange.drop is None and self.when.take(exchange):
            exchange.drop = Drop.AFTER_FORWARDING if self.after_forwarding else Drop.BEFORE_FORWARDING


@dataclass
class Delay:
    """Wait before forwarding (or answering)."""

    seconds: float
    when: Match = field(default_factory=Match)

    def apply(self, exchange: Exchange) -> None:
        if self.when.take(exchange):
            exchange.delay += self.seconds


@dataclass
class TruncateResponse:
    """Relay the full headers but only the first ``keep_bytes`` of the response body, then close."""

    keep_bytes: int
    when: Match = field(default_factory=Match)

    def apply(self, exchange: Exchange) -> None:
        if self.when.take(exchange):
            exchange.truncate_to = self.keep_bytes


@dataclass
class RewriteResponse:
    """Relay the target's answer (status and headers) with its body passed through ``rewrite``."""

    rewrite: Callable[[bytes], bytes]
    when: Match = field(default_factory=Match)

    def apply(self, exchange: Exchange) -> None:
        if exchange.rewrite is None and self.when.take(exchange):
            exchange.rewrite = self.rewrite


class _RefusedError(Exception):
    """The proxy will not, or cannot, reach a target. ``status`` is the answer and ``outcome`` the record."""

    def __init__(self, status: int, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.outcome = outcome


class ForwardProxy:
    """A recording forward proxy on ``127.0.0.1``; use it as a context manager (see the module docstring)."""

    def __init__(
        self,
        *,
        resolve: Mapping[str, tuple[str, int]] | None = None,
        credentials: tuple[str, str] | None = None,
        rules: Iterable[Rule] = (),
        upstream: tuple[str, int] | None = None,
    ) -> None:
        self.resolve = {name.lower(): address for name, address in (resolve or {}).items()}
        self.upstream = upstream
        self.credentials = credentials
        self.rules: list[Rule] = list(rules)
        self._lock = threading.Lock()
        self._requests: list[RecordedRequest] = []
        self._server: _ProxyServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------------

    def __enter__(self) -> ForwardProxy:
        server = _ProxyServer(("127.0.0.1", 0), _ProxyHandler)
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="forward-proxy", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.stopping.set()
        server.shutdown()
        server.close_client_connections()
        server.server_close()  # joins the handler threads
        thread.join()
        self._server = self._thread = None

    # -- what tests use ---------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port the proxy listens on."""
        return self._running().server_address[1]

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``, without credentials."""
        return f"http://127.0.0.1:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        """The proxy URL carrying ``user:password`` (percent-encoded) as user-info."""
        return f"http://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{self.port}"

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of the requests received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def clear(self) -> None:
        """Forget the recorded requests."""
        with self._lock:
            self._requests.clear()

    # -- used by the handler ----------------------------------------------------------------------------

    def _running(self) -> _ProxyServer:
        if self._server is None:
            raise RuntimeError("the forward proxy is not running; use it in a with statement")
        return self._server

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)

    def _apply_rules(self, exchange: Exchange) -> None:
        with self._lock:
            for rule in self.rules:
                rule.apply(exchange)

    def _authorized(self, header: str | None) -> bool:
        if self.credentials is None:
            return True
        if header is None:
            return False
        kind, _, token = header.partition(" ")
        if kind.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        user, _, password = decoded.partition(":")
        return (user, password) == self.credentials

    def _address_for(self, host: str, port: int) -> tuple[str, int]:
        """Where to connect for ``host:port``: loopback only, no DNS."""
        name = host.lower()
        if name in self.resolve:
            address, mapped_port = self.resolve[name]
        elif name == "localhost":
            address, mapped_port = "127.0.0.1", port
        else:
            address, mapped_port = name, port
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            raise _RefusedError(403, "refused", f"{host!r} is not in the proxy's resolve map") from None
        if not ip.is_loopback:
            raise _RefusedError(403, "refused", f"{host} is not a loopback address")
        return str(ip), mapped_port


class _ProxyServer(ThreadingHTTPServer):
    """The listening server; tracks client connections so that stopping can close idle keep-alives."""

    daemon_threads = False
    block_on_close = True
    proxy: ForwardProxy

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.stopping = threading.Event()
        self._clients: set[socket.socket] = set()
        self._clients_lock = threading.Lock()

    def process_request(self, request: socket.socket, client_address: tuple[str, int]) -> None:  # type: ignore[override]
        with self._clients_lock:
            self._clients.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:  # type: ignore[override]
        with self._clients_lock:
            self._clients.discard(request)
        super().shutdown_request(request)

    def close_client_connections(self) -> None:
        with self._clients_lock:
            clients = list(self._clients)
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: object, client_address: object) -> None:
        # A client hanging up mid-answer is routine in fault-injection tests; stay quiet.
        pass


class _ProxyHandler(BaseHTTPRequestHandler):
    """Serves one client connection: absolute-URI requests, CONNECT, and the rules."""

    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _ProxyServer
    _received_at = 0.0  # when the request now being served arrived (set per request)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        pass

    # BaseHTTPRequestHandler dispatches on do_<METHOD>.
    def do_CONNECT(self) -> None:
        self._tunnel()

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def do_PUT(self) -> None:
        self._forward()

    def do_POST(self) -> None:
        self._forward()

    def do_DELETE(self) -> None:
        self._forward()

    def do_PATCH(self) -> None:
        self._forward()

    def do_OPTIONS(self) -> None:
        self._forward()

    # -- the two kinds of proxy request -----------------------------------------------------------------

    def _forward(self) -> None:
        self._received_at = time.time()
        proxy = self.server.proxy
        parts = urlsplit(self.path)
        if proxy.upstream is not None and self.path.startswith("/"):  # the relay in front of one server
            (host, port), path = proxy.upstream, self.path
        elif parts.scheme.lower() != "http" or not parts.hostname:
            self._record_and_reply("", 0, "rejected", 400, b"not an absolute http:// request")
            return
        else:
            host = parts.hostname
            port = parts.port or 80
            path = parts.path or "/"
            if parts.query:
                path = f"{path}?{parts.query}"
        body = self._read_body()
        if not proxy._authorized(self.headers.get("Proxy-Authorization")):
            self._record_and_reply(host, port, "unauthorized", 407, b"proxy authentication required", path)
            return
        exchange = Exchange(self.command, host, port, path, self._forwardable_headers(), body)
        proxy._apply_rules(exchange)
        if exchange.delay:
            time.sleep(exchange.delay)
        reply = exchange.reply
        if reply is not None and not reply.after_forwarding:
            self._record(host, port, path, "replied")
            self._send(reply.status, reply.headers, reply.body)
            return
        if exchange.drop is Drop.BEFORE_FORWARDING:
            self._record(host, port, path, "dropped")
            self._hang_up()
            return
        try:
            address = proxy._address_for(host, port)
            status, reason, headers, data = self._ask_upstream(address, exchange)
        except _RefusedError as refused:
            self._record_and_reply(host, port, refused.outcome, refused.status, str(refused).encode(), path)
            return
        if reply is not None:
            self._record(host, port, path, "replied-after-forwarding")
            self._send(reply.status, reply.headers, reply.body)
            return
        if exchange.drop is Drop.AFTER_FORWARDING:
            self._record(host, port, path, "dropped-after-forwarding")
            self._hang_up()
            return
        if exchange.rewrite is not None:
            data = exchange.rewrite(data)
        truncated = exchange.truncate_to is not None and exchange.truncate_to < len(data)
        outcome = "rewritten" if exchange.rewrite is not None else "forwarded"
        self._record(host, port, path, "truncated" if truncated else outcome)
        self._relay(status, reason, headers, data, exchange.truncate_to if truncated else None)

    def _tunnel(self) -> None:
        self._received_at = time.time()
        proxy = self.server.proxy
        host, _, port_text = self.path.rpartition(":")
        host = host.strip("[]")
        if not host or not port_text.isdigit():
            self._record_and_reply(host, 0, "rejected", 400, b"CONNECT needs host:port")
            return
        port = int(port_text)
        if not proxy._authorized(self.headers.get("Proxy-Authorization")):
            self._record_and_reply(host, port, "unauthorized", 407, b"proxy authentication required")
            return
        exchange = Exchange("CONNECT", host, port, "", self._forwardable_headers())
        proxy._apply_rules(exchange)
        if exchange.delay:
            time.sleep(exchange.delay)
        if exchange.reply is not None:
            self._record(host, port, "", "replied")
            self._send(exchange.reply.status, exchange.reply.headers, exchange.reply.body)
            return
        if exchange.drop is Drop.BEFORE_FORWARDING:
            self._record(host, port, "", "dropped")
            self._hang_up()
            return
        try:
            address = proxy._address_for(host, port)
            upstream = self._connect(address)
        except _RefusedError as refused:
            self._record_and_reply(host, port, refused.outcome, refused.status, str(refused).encode())
            return
        with upstream:
            self._record(host, port, "", "tunnelled")
            self.send_response_only(200, "Connection established")
            self.end_headers()
            self.wfile.flush()
            self._pump(self.connection, upstream)
        self.close_connection = True

    # -- pieces -----------------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailer fields
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forwardable_headers(self) -> list[tuple[str, str]]:
        return [(key, value) for key, value in self.headers.items() if key.lower() not in _HOP_BY_HOP]

    def _connect(self, address: tuple[str, int]) -> socket.socket:
        try:
            return socket.create_connection(address, timeout=_UPSTREAM_TIMEOUT)
        except OSError as exc:
            raise _RefusedError(502, "unreachable", f"cannot connect to {address}: {exc}") from None

    def _ask_upstream(
        self, address: tuple[str, int], exchange: Exchange
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*address, timeout=_UPSTREAM_TIMEOUT)
        try:
            connection.putrequest(exchange.method, exchange.path, skip_host=True, skip_accept_encoding=True)
            for key, value in exchange.headers:
                if key.lower() != "content-length":
                    connection.putheader(key, value)
            if exchange.body or exchange.method in {"POST", "PUT", "PATCH"}:
                connection.putheader("Content-Length", str(len(exchange.body)))
            connection.endheaders(exchange.body or None)
            response = connection.getresponse()
            data = response.read()
            return response.status, response.reason, response.getheaders(), data
        except OSError as exc:
            raise _RefusedError(502, "unreachable", f"upstream {address} failed: {exc}") from None
        finally:
            connection.close()

    def _relay(
        self, status: int, reason: str, headers: list[tuple[str, str]], data: bytes, truncate_to: int | None
    ) -> None:
        self.send_response_only(status, reason)
        bodiless = self.command == "HEAD" or status in {204, 304} or 100 <= status < 200
        for key, value in headers:
            lowered = key.lower()
            if lowered in _HOP_BY_HOP or (lowered == "content-length" and not bodiless):
                continue
            self.send_header(key, value)
        if not bodiless:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if truncate_to is None:
            self.wfile.write(data)
            self.wfile.flush()
        else:
            self.wfile.write(data[:truncate_to])
            self._hang_up()

    def _send(self, status: int, headers: Iterable[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status)
        for key, value in headers:
            self.send_header(key, value)
        if status == 407:
            self.send_header("Proxy-Authenticate", 'Basic realm="forward-proxy"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _hang_up(self) -> None:
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        sockets = [client, upstream]
        while not self.server.stopping.is_set():
            readable, _, _ = select.select(sockets, [], [], _TUNNEL_POLL)
            for source in readable:
                try:
                    data = source.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                try:
                    (upstream if source is client else client).sendall(data)
                except OSError:
                    return

    def _record(self, host: str, port: int, path: str, outcome: str) -> None:
        self.server.proxy._record(
            RecordedRequest(
                method=self.command,
                host=host,
                port=port,
                path=path,
                headers=tuple(
                    (key, value)
                    for key, value in self.headers.items()
                    if key.lower() != "proxy-authorization"
                ),
                proxy_authorization="Proxy-Authorization" in self.headers,
                outcome=outcome,
                received_at=self._received_at,
            )
        )

    def _record_and_reply(
        self, host: str, port: int, outcome: str, status: int, body: bytes, path: str = ""
    ) -> None:
        self._record(host, port, path, outcome)
        self._send(status, (("Content-Type", "text/plain"),), body)
