"""A fake HashiCorp Vault on 127.0.0.1, speaking the slice of Vault's HTTP API that ``ckpt`` calls.

Endpoints (answers are ``application/json``; errors are Vault-shaped, ``{"errors": [...]}``):

- ``POST /v1/auth/<kubernetes mount>/login``  ``{"role", "jwt"}``        -> an ``auth`` block with a new token
- ``POST /v1/auth/<approle mount>/login``     ``{"role_id", "secret_id"}`` -> the same
- ``GET  /v1/<kv mount>/data/<path>``         the latest version (404 with ``data.metadata`` when that version
  is deleted or destroyed, 404 ``{"errors": []}`` when there is no secret)
- ``GET  /v1/auth/token/lookup-self``, ``POST /v1/auth/token/renew-self``

Tokens are checked on every non-login call (unknown, expired or revoked: 403 ``permission denied``) and
expire on the fake's clock, which a test may share with the code under test. Knobs: accepted roles and JWTs,
AppRole ids, token TTL / max TTL / renewability, secrets with versions (rotate, delete, destroy), paths the
policy denies, ``sealed`` (503), ``redirect_to`` (every answer a 307 to another server), ``echo_secrets``
(error bodies repeat the JWT, secret id or token they rejected, as careless servers do: the code under test
must never print a body). Every request is recorded with its headers, for assertions.

State lives in the instance (no class-level state): two fakes never share anything.
"""

from __future__ import annotations

import http.client
import json
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

__all__ = ["Answer", "FakeVault", "RecordedRequest", "RecordingServer", "RelayServer"]

_STAMP = "2026-01-02T03:04:05.000000Z"


@dataclass
class RecordedRequest:
    """One request as it arrived: method, path (with query), headers (names lower-cased), body."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class _Version:
    data: dict[str, str] | None
    deletion_time: str = ""
    destroyed: bool = False


@dataclass
class _Token:
    value: str
    expires_at: float
    max_expires_at: float
    renewable: bool
    ttl: float
    revoked: bool = False


@dataclass
class Answer:
    """What a loopback server sends back: a JSON-able body (or raw bytes), and extra headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def _errors(status: int, *messages: str) -> Answer:
    return Answer(status, {"errors": list(messages)})


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class _Handler(BaseHTTPRequestHandler):
    """Hands every request to the server's ``respond`` callable; writes its answer."""

    server: _ServerWithApp
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered as clients expect

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """Silence the default per-request stderr line."""

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        request = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        answer = self.server.respond(request)
        if isinstance(answer.body, bytes):
            payload = answer.body
        else:
            payload = b"" if answer.body is None else json.dumps(answer.body).encode()
        self.send_response(answer.status)
        headers = dict(answer.headers)
        if not any(name.lower() == "content-type" for name in headers):
            headers["Content-Type"] = "application/json"
        if not any(name.lower() == "content-length" for name in headers):
            headers["Content-Length"] = str(len(payload))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _serve  # noqa: N815 - the stdlib's naming


class _ServerWithApp(_Server):
    def __init__(self, respond: Callable[[RecordedRequest], Answer]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.respond = respond


@contextmanager
def _serving(respond: Callable[[RecordedRequest], Answer]) -> Iterator[_ServerWithApp]:
    server = _ServerWithApp(respond)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


class RecordingServer:
    """A loopback server that answers every request ``200 {}`` and records it (a redirect's target)."""

    def __init__(self, host: str = "localhost") -> None:
        self.host = host
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    def _respond(self, request: RecordedRequest) -> Answer:
        with self._lock:
            self.requests.append(request)
        return Answer(200, {})

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> RecordingServer:
        self._stack = _serving(self._respond)
        self.port = self._stack.__enter__().server_address[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(None, None, None)


_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "upgrade",
    "content-length",
}


class _LoopbackServer:
    """Serves ``_respond`` on a free ``127.0.0.1`` port while used as a context manager."""

    def __init__(self) -> None:
        self._stack: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _respond(self, request: RecordedRequest) -> Answer:
        raise TypeError(f"{type(self).__name__} must define _respond")

    def __enter__(self) -> Self:
        self._stack = _serving(self._respond)
        self.port = self._stack.__enter__().server_address[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(None, None, None)


class RelayServer(_LoopbackServer):
    """A loopback relay that records every request and passes it on, unless ``intercept`` answers it.

    With ``upstream`` (``http://127.0.0.1:PORT``) it is a reverse proxy in front of that server (the S3
    tests' window on the wire); without, it is a forward HTTP proxy for absolute-URI requests (the Vault
    tests' proxy). ``intercept(request)`` may return an :class:`Answer` to send instead of relaying.
    """

    def __init__(
        self,
        upstream: str | None = None,
        intercept: Callable[[RecordedRequest], Answer | None] | None = None,
    ) -> None:
        super().__init__()
        self.upstream = upstream
        self.intercept = intercept
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()

    def _respond(self, request: RecordedRequest) -> Answer:
        with self._lock:
            self.requests.append(request)
        if self.intercept is not None:
            answer = self.intercept(request)
            if answer is not None:
                return answer
        target = urlsplit(self.upstream + request.path if self.upstream else request.path)
        path = target.path + (f"?{target.query}" if target.query else "")
        headers = {k: v for k, v in request.headers.items() if k not in _HOP_BY_HOP and k != "expect"}
        connection = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, timeout=30)
        try:
            connection.request(request.method, path, body=request.body or None, headers=headers)
            response = connection.getresponse()
            body = response.read()
            kept = {k: v for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP}
            if request.method == "HEAD" and response.getheader("Content-Length") is not None:
                kept["Content-Length"] = response.getheader("Content-Length", "0")
        finally:
            connection.close()
        return Answer(response.status, body, kept)


class FakeVault(_LoopbackServer):
    """The fake Vault; use as a context manager. ``url`` is its ``http://127.0.0.1:PORT`` address."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        token_ttl: float = 3600.0,
        token_max_ttl: float = 86400.0,
        renewable: bool = True,
        kubernetes_mount: str = "kubernetes",
        approle_mount: str = "approle",
        namespace: str | None = None,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.token_ttl = token_ttl
        self.token_max_ttl = token_max_ttl
        self.renewable = renewable
        self.kubernetes_mount = kubernetes_mount
        self.approle_mount = approle_mount
        self.namespace = namespace
        self.kubernetes_roles: dict[str, set[str]] = {}
        self.approles: dict[str, set[str]] = {}
        self.denied_paths: set[str] = set()
        self.secrets: dict[tuple[str, str], list[_Version]] = {}
        self.requests: list[RecordedRequest] = []
        self.issued_tokens: list[str] = []
        self.redirect_to: str | None = None
        self.echo_secrets = False
        self.sealed = False
        self._tokens: dict[str, _Token] = {}
        self._lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------------------------

    # -- knobs ---------------------------------------------------------------------------------------------

    def allow_kubernetes(self, role: str, jwt: str) -> None:
        """Accept ``jwt`` for Kubernetes logins to ``role`` (several JWTs may be accepted at once)."""
        with self._lock:
            self.kubernetes_roles.setdefault(role, set()).add(jwt)

    def revoke_jwt(self, role: str, jwt: str) -> None:
        with self._lock:
            self.kubernetes_roles.get(role, set()).discard(jwt)

    def allow_approle(self, role_id: str, secret_id: str) -> None:
        with self._lock:
            self.approles.setdefault(role_id, set()).add(secret_id)

    def revoke_secret_id(self, role_id: str, secret_id: str) -> None:
        with self._lock:
            self.approles.get(role_id, set()).discard(secret_id)

    def put_secret(self, path: str, data: dict[str, str], *, mount: str = "secret") -> int:
        """Write a new version (a rotation, when the path already had one); return its number."""
        with self._lock:
            versions = self.secrets.setdefault((mount, path), [])
            versions.append(_Version(dict(data)))
            return len(versions)

    def delete_latest(self, path: str, *, mount: str = "secret") -> None:
        with self._lock:
            self.secrets[(mount, path)][-1].deletion_time = _STAMP

    def destroy_latest(self, path: str, *, mount: str = "secret") -> None:
        with self._lock:
            latest = self.secrets[(mount, path)][-1]
            latest.destroyed = True
            latest.data = None

    def expire_tokens(self) -> None:
        """Every token issued so far expires now (as if its TTL ran out)."""
        with self._lock:
            for token in self._tokens.values():
                token.expires_at = self.clock() - 1

    def revoke_tokens(self) -> None:
        with self._lock:
            for token in self._tokens.values():
                token.revoked = True

    # -- what was asked ------------------------------------------------------------------------------------

    def calls(self, suffix: str) -> list[RecordedRequest]:
        """The recorded requests whose path (without query) ends with ``suffix``."""
        with self._lock:
            return [r for r in self.requests if urlsplit(r.path).path.endswith(suffix)]

    @property
    def logins(self) -> list[RecordedRequest]:
        return self.calls("/login")

    # -- the API -------------------------------------------------------------------------------------------

    def _respond(self, request: RecordedRequest) -> Answer:
        with self._lock:
            self.requests.append(request)
            return self._answer(request)

    def _answer(self, request: RecordedRequest) -> Answer:
        path = urlsplit(request.path).path
        if self.redirect_to is not None:
            return Answer(307, None, {"Location": f"{self.redirect_to}{request.path}"})
        if self.sealed:
            return _errors(503, "Vault is sealed")
        if self.namespace is not None and request.headers.get("x-vault-namespace") != self.namespace:
            return _errors(404, "no handler for route")
        if request.method == "POST" and path == f"/v1/auth/{self.kubernetes_mount}/login":
            return self._kubernetes_login(request.json() or {})
        if request.method == "POST" and path == f"/v1/auth/{self.approle_mount}/login":
            return self._approle_login(request.json() or {})
        token = self._token(request)
        if token is None:
            presented = request.headers.get("x-vault-token", "")
            if self.echo_secrets:
                return _errors(403, f"permission denied: token {presented!r} is not valid")
            return _errors(403, "permission denied")
        if request.method == "GET" and path == "/v1/auth/token/lookup-self":
            return self._lookup(token)
        if request.method in ("POST", "PUT") and path == "/v1/auth/token/renew-self":
            return self._renew(token)
        for mount, secret_path in self.secrets:
            if path == f"/v1/{mount}/data/{secret_path}" and request.method == "GET":
                return self._read(mount, secret_path)
        if request.method == "GET" and "/data/" in path:
            mount, _, secret_path = path.removeprefix("/v1/").partition("/data/")
            if secret_path in self.denied_paths:
                return _errors(403, "permission denied")
            return _errors(404)
        return _errors(404, "no handler for route")

    def _token(self, request: RecordedRequest) -> _Token | None:
        token = self._tokens.get(request.headers.get("x-vault-token", ""))
        if token is None or token.revoked or token.expires_at <= self.clock():
            return None
        return token

    def _issue(self, metadata: dict[str, str]) -> Answer:
        now = self.clock()
        value = f"hvs.FAKE{secrets.token_hex(12)}"
        token = _Token(
            value=value,
            expires_at=now + self.token_ttl,
            max_expires_at=now + self.token_max_ttl,
            renewable=self.renewable,
            ttl=self.token_ttl,
        )
        self._tokens[value] = token
        self.issued_tokens.append(value)
        return Answer(200, self._auth_block(token, metadata))

    def _auth_block(self, token: _Token, metadata: dict[str, str]) -> dict[str, Any]:
        return {
            "request_id": secrets.token_hex(8),
            "lease_id": "",
            "renewable": False,
            "lease_duration": 0,
            "data": None,
            "wrap_info": None,
            "warnings": None,
            "auth": {
                "client_token": token.value,
                "accessor": f"acc-{secrets.token_hex(4)}",
                "policies": ["default", "ckpt-publisher"],
                "token_policies": ["default", "ckpt-publisher"],
                "metadata": metadata,
                "lease_duration": max(0, round(token.expires_at - self.clock())),
                "renewable": token.renewable,
                "entity_id": "",
                "token_type": "service",
                "orphan": True,
            },
        }

    def _kubernetes_login(self, body: dict[str, Any]) -> Answer:
        role, jwt = body.get("role"), body.get("jwt")
        if role not in self.kubernetes_roles:
            return _errors(400, f'invalid role name "{role}"')
        if jwt not in self.kubernetes_roles[role]:
            if self.echo_secrets:
                return _errors(403, f"permission denied: JWT {jwt} was not accepted")
            return _errors(403, "permission denied")
        return self._issue({"role": str(role), "service_account_name": "ckpt"})

    def _approle_login(self, body: dict[str, Any]) -> Answer:
        role_id, secret_id = body.get("role_id"), body.get("secret_id")
        if role_id not in self.approles or secret_id not in self.approles[role_id]:
            if self.echo_secrets:
                return _errors(400, f"invalid role or secret ID: {role_id}/{secret_id}")
            return _errors(400, "invalid role or secret ID")
        return self._issue({"role_name": "ckpt"})

    def _lookup(self, token: _Token) -> Answer:
        ttl = max(0, round(token.expires_at - self.clock()))
        return Answer(
            200,
            {
                "data": {
                    "id": token.value,
                    "ttl": ttl,
                    "creation_ttl": int(token.ttl),
                    "renewable": token.renewable,
                    "policies": ["default", "ckpt-publisher"],
                },
                "auth": None,
                "lease_duration": 0,
                "renewable": False,
                "warnings": None,
            },
        )

    def _renew(self, token: _Token) -> Answer:
        if not token.renewable:
            return _errors(400, "lease is not renewable")
        token.expires_at = min(self.clock() + token.ttl, token.max_expires_at)
        return Answer(200, self._auth_block(token, {}))

    def _read(self, mount: str, path: str) -> Answer:
        if path in self.denied_paths:
            return _errors(403, "permission denied")
        versions = self.secrets[(mount, path)]
        latest = versions[-1]
        metadata = {
            "created_time": _STAMP,
            "custom_metadata": None,
            "deletion_time": latest.deletion_time,
            "destroyed": latest.destroyed,
            "version": len(versions),
        }
        if latest.destroyed or latest.deletion_time:
            body = {"request_id": "r", "data": {"data": None, "metadata": metadata}, "errors": []}
            return Answer(404, body)
        return Answer(
            200,
            {
                "request_id": secrets.token_hex(8),
                "lease_id": "",
                "renewable": False,
                "lease_duration": 0,
                "data": {"data": dict(latest.data or {}), "metadata": metadata},
                "wrap_info": None,
                "warnings": None,
                "auth": None,
            },
        )
