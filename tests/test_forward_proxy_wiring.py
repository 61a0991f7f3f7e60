"""The proxy rule wired into real clients, over real HTTP on loopback (spec/proxy.md).

A recording forward proxy (``tests/support/forward_proxy.py``) sits between the clients and loopback
servers: a tiny origin server (plain and TLS) for ``requests``, and moto's S3 server for botocore. Names
under ``unresolvable.test`` resolve nowhere: the test resolver below refuses every name it was not told
about, and never queries DNS, so a request to such a name can only succeed through the proxy, whose own
``resolve`` map points the name at a loopback port.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import botocore.config
import botocore.exceptions
import botocore.session
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from ckpt.adapters.proxy import ProxyRoutes, proxies_for, requests_session, route_botocore_client
from ckpt.adapters.s3 import S3Store, open_s3_store
from ckpt.config import Config, S3Settings
from ckpt.creds.vault import KubernetesAuth, VaultSource
from ckpt.domain.errors import ProxyConfigError
from ckpt.domain.proxy import ProxyRule
from support.fake_vault import FakeVault
from support.forward_proxy import (
    Delay,
    DropConnection,
    ForwardProxy,
    Match,
    RecordedRequest,
    StripRequestHeader,
    TruncateResponse,
    slow_down,
)
from support.s3 import FAKE_ENV, new_bucket_name, raw_client

PROXY_USER = "alice"
PROXY_PASSWORD = "s3cr3t-p@ss"  # an "@" to make redaction and encoding work for it


# -- a resolver that never leaves the machine --------------------------------------------------------------


@pytest.fixture(autouse=True)
def hosts(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Replace the OS resolver: IP literals and the names in the returned dict resolve, nothing else.

    Every client here (requests/urllib3, botocore, the proxy's own upstream connections) looks names up
    through ``socket.getaddrinfo``; an unknown name fails at once, without DNS.
    """
    names = {"localhost": "127.0.0.1"}
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(
        host: bytes | str | None, port: bytes | str | int | None, *args: Any, **kwargs: Any
    ) -> Any:
        text = host.decode("ascii") if isinstance(host, bytes) else host
        if text is not None:
            text = names.get(text.lower(), text)
            try:
                ipaddress.ip_address(text)
            except ValueError:
                raise socket.gaierror(socket.EAI_NONAME, f"test resolver: unknown host {text!r}") from None
        return real_getaddrinfo(text, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return names


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Start every test from an environment without proxy variables (the tests that want some set them)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


# -- a loopback origin server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OriginRequest:
    """What the origin server saw: method, path and headers (names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]


class Origin:
    """A loopback HTTP (or HTTPS) server that records requests.

    ``/redirect?to=URL`` answers 302 to ``URL``; any other path answers 200 with ``origin saw <path>``.
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.tls = tls
        self.requests: list[OriginRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Origin:
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
                pass

            def do_GET(self) -> None:
                with origin._lock:
                    origin.requests.append(
                        OriginRequest(
                            self.command, self.path, {k.lower(): v for k, v in self.headers.items()}
                        )
                    )
                parts = urlsplit(self.path)
                if parts.path == "/redirect":
                    self.send_response(302)
                    self.send_header("Location", parse_qs(parts.query)["to"][0])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = f"origin saw {self.path}".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            server.socket = self.tls.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="origin", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        assert self._server is not None
        assert self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def paths(self) -> list[str]:
        with self._lock:
            return [request.path for request in self.requests]


@pytest.fixture
def origin() -> Iterator[Origin]:
    with Origin() as server:
        yield server


@pytest.fixture
def proxy(origin: Origin) -> Iterator[ForwardProxy]:
    """A proxy that can reach the origin as ``app.unresolvable.test`` on any port."""
    with ForwardProxy(resolve={"app.unresolvable.test": ("127.0.0.1", origin.port)}) as forward_proxy:
        yield forward_proxy


@pytest.fixture
def environment_proxy(origin: Origin, monkeypatch: pytest.MonkeyPatch) -> Iterator[ForwardProxy]:
    """A second recording proxy, named by every proxy variable in ``os.environ``; ours must ignore it."""
    with ForwardProxy(resolve={"app.unresolvable.test": ("127.0.0.1", origin.port)}) as forward_proxy:
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            monkeypatch.setenv(name, forward_proxy.url)
            monkeypatch.setenv(name.lower(), forward_proxy.url)
        yield forward_proxy


def summary(recorded: list[RecordedRequest]) -> list[tuple[str, str, str, str]]:
    """The recorded requests as (method, host:port, path, outcome), easy to compare and to read."""
    return [(r.method, r.target, r.path, r.outcome) for r in recorded]


# -- TLS material for the CONNECT tests -----------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    """A throw-away CA and a server certificate for ``secure.unresolvable.test``, as PEM files."""

    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    directory = tmp_path_factory.mktemp("tls")
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ckpt test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "secure.unresolvable.test")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("secure.unresolvable.test")]), critical=False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    files = TlsFiles(ca=directory / "ca.pem", cert=directory / "cert.pem", key=directory / "key.pem")
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return files


@pytest.fixture
def tls_origin(tls_files: TlsFiles) -> Iterator[Origin]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tls_files.cert, tls_files.key)
    with Origin(tls=context) as server:
        yield server


# -- moto's S3 server, in a subprocess ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as connection:
            connection.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return connection.recv(16).startswith(b"HTTP/1.")
    except OSError:
        return False


@pytest.fixture(scope="module")
def moto_port() -> Iterator[int]:
    """Run ``python -m moto.server`` on a loopback port for the module; yield the port once it answers."""
    port = _free_port()
    environment = {
        key: value
        for key, value in os.environ.items()
        if "proxy" not in key.lower() and key != "REQUEST_METHOD"
    }
    # Path-style addressing for any host name: "s3.unresolvable.test" is not a bucket's virtual host.
    environment["S3_IGNORE_SUBDOMAIN_BUCKETNAME"] = "true"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=environment,
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"moto server did not start on port {port} (exit code {process.poll()})")
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def aws_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Keep botocore away from the user's AWS configuration and credentials."""
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))


def s3_client(endpoint_url: str, rule: ProxyRule | None) -> Any:
    """A botocore S3 client for moto routed by ``rule``; ``None`` leaves botocore to the environment."""
    config = botocore.config.Config(
        proxies=None if rule is None else {},
        s3={"addressing_style": "path"},
        retries={"max_attempts": 1, "mode": "standard"},
        connect_timeout=5,
        read_timeout=10,
    )
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=config,
    )
    if rule is not None:
        route_botocore_client(client, ProxyRoutes(rule))
    return client


# -- the tests ------------------------------------------------------------------------------------------


class TestRequestsSession:
    """``requests_session(rule)`` sends each request the way the rule says, and only that way."""

    def test_http_request_goes_through_the_proxy(self, origin: Origin, proxy: ForwardProxy) -> None:
        """An http request the rule proxies reaches the origin only through the proxy, as an absolute URI."""
        rule = ProxyRule(http_proxy=proxy.url)
        with requests_session(rule) as session:
            response = session.get("http://app.unresolvable.test/hello?x=1", timeout=10)
        assert (response.status_code, response.text) == (200, "origin saw /hello?x=1")
        assert summary(proxy.requests) == [("GET", "app.unresolvable.test:80", "/hello?x=1", "forwarded")]
        assert origin.requests[0].headers["host"] == "app.unresolvable.test"

    def test_no_proxy_entry_sends_the_request_direct(
        self, origin: Origin, proxy: ForwardProxy, hosts: dict[str, str]
    ) -> None:
        """A host matched by NO_PROXY is reached directly; the proxy sees nothing."""
        hosts["direct.unresolvable.test"] = "127.0.0.1"
        rule = ProxyRule(http_proxy=proxy.url, no_proxy="example.org, .unresolvable.test")
        with requests_session(rule) as session:
            response = session.get(f"http://direct.unresolvable.test:{origin.port}/direct", timeout=10)
        assert (response.status_code, proxy.requests) == (200, [])
        assert origin.paths() == ["/direct"]

    def test_the_same_host_without_a_no_proxy_entry_is_proxied(
        self, origin: Origin, proxy: ForwardProxy, hosts: dict[str, str]
    ) -> None:
        """The contrast to the bypass test: without the NO_PROXY entry the request goes through the proxy."""
        hosts["direct.unresolvable.test"] = "127.0.0.1"
        rule = ProxyRule(http_proxy=proxy.url, no_proxy="example.org")
        with requests_session(rule) as session:
            response = session.get(f"http://direct.unresolvable.test:{origin.port}/direct", timeout=10)
        assert response.status_code == 403  # the proxy refuses a name outside its resolve map
        assert summary(proxy.requests) == [
            ("GET", f"direct.unresolvable.test:{origin.port}", "/direct", "refused")
        ]
        assert origin.paths() == []

    def test_localhost_and_loopback_are_never_proxied(self, origin: Origin, proxy: ForwardProxy) -> None:
        """localhost in any case and loopback IPs go direct even with a proxy and no NO_PROXY."""
        rule = ProxyRule(http_proxy=proxy.url, https_proxy=proxy.url)
        with requests_session(rule) as session:
            for host in ("localhost", "LOCALHOST", "127.0.0.1"):
                assert session.get(f"http://{host}:{origin.port}/{host}", timeout=10).status_code == 200
        assert proxy.requests == []
        assert origin.paths() == ["/localhost", "/LOCALHOST", "/127.0.0.1"]

    def test_https_goes_through_a_connect_tunnel_with_proxy_credentials(
        self, tls_origin: Origin, tls_files: TlsFiles
    ) -> None:
        """An https request opens an authenticated CONNECT tunnel; the origin never sees proxy credentials."""
        resolve = {"secure.unresolvable.test": ("127.0.0.1", tls_origin.port)}
        with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, PROXY_PASSWORD)) as proxy:
            rule = ProxyRule(https_proxy=proxy.url_with(PROXY_USER, PROXY_PASSWORD))
            with requests_session(rule) as session:
                response = session.get(
                    "https://secure.unresolvable.test/tls", verify=str(tls_files.ca), timeout=10
                )
            recorded = proxy.requests
        assert (response.status_code, response.text) == (200, "origin saw /tls")
        assert summary(recorded) == [("CONNECT", "secure.unresolvable.test:443", "", "tunnelled")]
        assert recorded[0].proxy_authorization
        assert "proxy-authorization" not in tls_origin.requests[0].headers

    def test_wrong_proxy_credentials_fail_without_showing_the_password(
        self, tls_origin: Origin, tls_files: TlsFiles
    ) -> None:
        """A 407 from the proxy surfaces as an error whose text does not contain the proxy password."""
        resolve = {"secure.unresolvable.test": ("127.0.0.1", tls_origin.port)}
        with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, "the-right-one")) as proxy:
            rule = ProxyRule(https_proxy=proxy.url_with(PROXY_USER, PROXY_PASSWORD))
            with requests_session(rule) as session, pytest.raises(requests.exceptions.ProxyError) as caught:
                session.get("https://secure.unresolvable.test/tls", verify=str(tls_files.ca), timeout=10)
            recorded = proxy.requests
        assert summary(recorded) == [("CONNECT", "secure.unresolvable.test:443", "", "unauthorized")]
        assert "s3cr3t" not in str(caught.value)
        assert "s3cr3t" not in repr(rule)

    def test_redirect_to_a_direct_host_drops_the_proxy_and_its_credentials(self, origin: Origin) -> None:
        """A redirect to a loopback URL is followed directly, without a Proxy-Authorization header."""
        resolve = {"app.unresolvable.test": ("127.0.0.1", origin.port)}
        with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, PROXY_PASSWORD)) as proxy:
            rule = ProxyRule(http_proxy=proxy.url_with(PROXY_USER, PROXY_PASSWORD))
            landing = f"http://127.0.0.1:{origin.port}/landing"
            with requests_session(rule) as session:
                response = session.get(
                    "http://app.unresolvable.test/redirect", params={"to": landing}, timeout=10
                )
            recorded = proxy.requests
        assert (response.status_code, response.text) == (200, "origin saw /landing")
        assert [(r.path.split("?")[0], r.outcome, r.proxy_authorization) for r in recorded] == [
            ("/redirect", "forwarded", True)
        ]
        assert [r.path for r in origin.requests][1:] == ["/landing"]
        assert "proxy-authorization" not in origin.requests[1].headers

    def test_redirect_from_a_direct_host_to_a_proxied_host_uses_the_proxy(
        self, origin: Origin, proxy: ForwardProxy
    ) -> None:
        """Each hop is decided by the rule for its own URL: direct first, then through the proxy."""
        rule = ProxyRule(http_proxy=proxy.url)
        start = f"http://127.0.0.1:{origin.port}/redirect"
        with requests_session(rule) as session:
            response = session.get(start, params={"to": "http://app.unresolvable.test/after"}, timeout=10)
        assert (response.status_code, response.text) == (200, "origin saw /after")
        assert summary(proxy.requests) == [("GET", "app.unresolvable.test:80", "/after", "forwarded")]

    def test_proxies_given_per_call_or_on_the_session_are_ignored(
        self, origin: Origin, proxy: ForwardProxy
    ) -> None:
        """Only the rule chooses: proxies passed to get() or set on session.proxies have no effect."""
        with ForwardProxy() as other:
            with requests_session(ProxyRule(http_proxy=proxy.url)) as session:
                session.proxies = {"http": other.url}
                response = session.get(
                    "http://app.unresolvable.test/a", proxies={"http": other.url}, timeout=10
                )
            assert (response.status_code, other.requests) == (200, [])
        assert summary(proxy.requests) == [("GET", "app.unresolvable.test:80", "/a", "forwarded")]

    def test_cgi_guard_refuses_before_any_connection(self, proxy: ForwardProxy) -> None:
        """In a CGI process an http request with an HTTP proxy raises ProxyConfigError and sends nothing."""
        rule = ProxyRule(http_proxy=proxy.url, cgi=True)
        with requests_session(rule) as session, pytest.raises(ProxyConfigError, match="CGI"):
            session.get("http://app.unresolvable.test/", timeout=10)
        assert proxy.requests == []


class TestEnvironmentIsIgnored:
    """Proxy variables in ``os.environ`` never steer the clients configured from the rule."""

    def test_control_plain_requests_follows_the_environment(
        self, origin: Origin, environment_proxy: ForwardProxy
    ) -> None:
        """The control: a default requests.Session does use HTTP_PROXY, so the fixture is effective."""
        with requests.Session() as session:
            response = session.get("http://app.unresolvable.test/env", timeout=10)
        assert response.status_code == 200
        assert summary(environment_proxy.requests) == [
            ("GET", "app.unresolvable.test:80", "/env", "forwarded")
        ]

    def test_requests_session_without_a_proxy_goes_direct(
        self, origin: Origin, environment_proxy: ForwardProxy
    ) -> None:
        """A rule without proxies sends requests direct although HTTP_PROXY and ALL_PROXY are set."""
        with requests_session(ProxyRule()) as session:
            response = session.get(f"http://127.0.0.1:{origin.port}/direct", timeout=10)
            with pytest.raises(requests.exceptions.ConnectionError):
                session.get("http://app.unresolvable.test/unreachable-direct", timeout=10)
        assert response.status_code == 200
        assert environment_proxy.requests == []

    def test_requests_session_uses_the_rules_proxy_not_the_environments(
        self, proxy: ForwardProxy, environment_proxy: ForwardProxy
    ) -> None:
        """A rule with a proxy uses it, not the one named in the environment."""
        with requests_session(ProxyRule(http_proxy=proxy.url)) as session:
            assert session.get("http://app.unresolvable.test/rule", timeout=10).status_code == 200
        assert (len(proxy.requests), environment_proxy.requests) == (1, [])

    @pytest.mark.usefixtures("aws_files")
    def test_control_botocore_defaults_follow_the_environment(
        self, moto_port: int, environment_proxy: ForwardProxy
    ) -> None:
        """The control: botocore with proxies=None reads HTTP_PROXY, so the fixture is effective."""
        client = s3_client(f"http://127.0.0.1:{moto_port}", rule=None)
        try:
            client.list_buckets()
        finally:
            client.close()
        assert [(r.method, r.target) for r in environment_proxy.requests] == [
            ("GET", f"127.0.0.1:{moto_port}")
        ]

    @pytest.mark.usefixtures("aws_files")
    def test_botocore_with_the_rules_empty_proxies_goes_direct(
        self, moto_port: int, environment_proxy: ForwardProxy
    ) -> None:
        """A client routed by a rule without proxies goes direct; botocore then ignores HTTP_PROXY."""
        client = s3_client(f"http://127.0.0.1:{moto_port}", ProxyRule())
        try:
            client.list_buckets()
        finally:
            client.close()
        assert environment_proxy.requests == []


@pytest.mark.usefixtures("aws_files")
class TestBotocoreThroughTheProxy:
    """A botocore S3 client routed by ``route_botocore_client`` talks to S3 through the rule's proxy."""

    ENDPOINT = "http://s3.unresolvable.test"

    def test_s3_traffic_reaches_moto_only_through_the_proxy(self, moto_port: int) -> None:
        """Bucket and object calls to an unresolvable endpoint succeed, each one recorded by the proxy."""
        resolve = {"s3.unresolvable.test": ("127.0.0.1", moto_port)}
        with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, PROXY_PASSWORD)) as proxy:
            rule = ProxyRule(http_proxy=proxy.url_with(PROXY_USER, PROXY_PASSWORD))
            client = s3_client(self.ENDPOINT, rule)
            try:
                client.create_bucket(Bucket="wiring")
                client.put_object(Bucket="wiring", Key="a/b.txt", Body=b"through the proxy")
                body = client.get_object(Bucket="wiring", Key="a/b.txt")["Body"].read()
            finally:
                client.close()
            recorded = proxy.requests
        assert body == b"through the proxy"
        assert summary(recorded) == [
            ("PUT", "s3.unresolvable.test:80", "/wiring", "forwarded"),
            ("PUT", "s3.unresolvable.test:80", "/wiring/a/b.txt", "forwarded"),
            ("GET", "s3.unresolvable.test:80", "/wiring/a/b.txt", "forwarded"),
        ]
        assert all(r.proxy_authorization for r in recorded)

    def test_control_the_endpoint_is_unreachable_direct(self, moto_port: int) -> None:
        """The control: without the proxy the same endpoint cannot be reached at all."""
        client = s3_client(self.ENDPOINT, ProxyRule())
        try:
            with pytest.raises(botocore.exceptions.EndpointConnectionError):
                client.list_buckets()
        finally:
            client.close()

    def test_no_proxy_makes_botocore_go_direct(self, moto_port: int, hosts: dict[str, str]) -> None:
        """An endpoint matched by NO_PROXY is reached directly; the proxy sees nothing."""
        hosts["s3.internal.test"] = "127.0.0.1"
        endpoint = f"http://s3.internal.test:{moto_port}"
        with ForwardProxy() as proxy:
            rule = ProxyRule(http_proxy=proxy.url, no_proxy=".internal.test")
            client = s3_client(endpoint, rule)
            try:
                client.list_buckets()
            finally:
                client.close()
            assert proxy.requests == []


@pytest.mark.usefixtures("aws_files")
class TestS3StoreDecidesForTheHostItContacts:
    """The production S3 client (``open_s3_store``) asks the rule for the URL of each request it sends.

    moto's server reads the bucket from the Host header when the host has a subdomain, so virtual-hosted
    requests to ``<bucket>.unresolvable-s3`` and path-style ones to ``unresolvable-s3`` (no dot) both work.
    Neither name resolves here except through the proxy's map, or the test resolver when a case says so.
    """

    @pytest.fixture
    def bucket(self, moto_server: str) -> str:
        name = new_bucket_name()
        raw_client(moto_server).create_bucket(Bucket=name)
        return name

    @staticmethod
    def open(moto_server: str, bucket: str, style: str, proxy: dict[str, str]) -> S3Store:
        port = urlsplit(moto_server).port
        settings = S3Settings(
            endpoint_url=f"http://unresolvable-s3:{port}", region="us-east-1", addressing_style=style,
            connect_timeout=2, read_timeout=10, max_attempts=1,
        )  # fmt: skip
        config = Config(s3=settings, proxy=proxy, credentials=({"source": "env"},))
        return open_s3_store(f"s3://{bucket}", config=config, environ=FAKE_ENV)

    @staticmethod
    def recording_proxy(moto_server: str, bucket: str) -> ForwardProxy:
        port = urlsplit(moto_server).port
        assert port is not None
        hosts = ("unresolvable-s3", f"{bucket}.unresolvable-s3")
        return ForwardProxy(resolve=dict.fromkeys(hosts, ("127.0.0.1", port)))

    def test_path_style_requests_are_decided_for_the_endpoint_host(
        self, moto_server: str, bucket: str
    ) -> None:
        """Path style: the client contacts the endpoint host; an entry for the bucket's host is no match."""
        with self.recording_proxy(moto_server, bucket) as proxy:
            no_proxy = f"{bucket}.unresolvable-s3"
            store = self.open(moto_server, bucket, "path", {"http_proxy": proxy.url, "no_proxy": no_proxy})
            assert store.entries() == []
            recorded = proxy.requests
        assert [(r.method, r.host, r.path.split("?")[0]) for r in recorded] == [
            ("GET", "unresolvable-s3", f"/{bucket}")
        ]

    def test_virtual_style_requests_go_through_the_proxy_to_the_bucket_host(
        self, moto_server: str, bucket: str
    ) -> None:
        """Virtual style: the request the proxy sees is for ``<bucket>.<endpoint host>``."""
        with self.recording_proxy(moto_server, bucket) as proxy:
            store = self.open(moto_server, bucket, "virtual", {"http_proxy": proxy.url})
            assert store.entries() == []
            recorded = proxy.requests
        assert [(r.method, r.host, r.outcome) for r in recorded] == [
            ("GET", f"{bucket}.unresolvable-s3", "forwarded")
        ]

    def test_virtual_style_honours_a_no_proxy_entry_for_the_bucket_host(
        self, moto_server: str, bucket: str, hosts: dict[str, str]
    ) -> None:
        """NO_PROXY naming the bucket's host sends virtual-hosted requests direct; the proxy sees nothing."""
        hosts[f"{bucket}.unresolvable-s3"] = "127.0.0.1"  # reachable direct, but only under this name
        with self.recording_proxy(moto_server, bucket) as proxy:
            no_proxy = f"{bucket}.unresolvable-s3"
            store = self.open(moto_server, bucket, "virtual", {"http_proxy": proxy.url, "no_proxy": no_proxy})
            assert store.entries() == []
            recorded = proxy.requests
        assert recorded == []
        assert store.connection is not None
        origin = f"http://{bucket}.unresolvable-s3:{urlsplit(moto_server).port}"
        assert store.connection.routes() == {origin: None}


class TestVaultSourceThroughTheRule:
    """The Vault credential source sends its requests through ``adapters.proxy.requests_session``.

    The fake Vault is reached as ``vault.unresolvable.test``, a name only the recording proxy resolves
    (or the test resolver, when a case puts it there), and over plain http, which a non-loopback Vault
    address may use only with ``allow_insecure_http``.
    """

    @pytest.fixture
    def vault(self) -> Iterator[FakeVault]:
        with FakeVault() as fake:
            fake.allow_kubernetes("publisher", "the-jwt")
            fake.put_secret("s3/team-a", {"access_key_id": "AKIDVIAPROXY", "secret_access_key": "sk"})
            yield fake

    @staticmethod
    def fetch(address: str, rule: ProxyRule, tmp_path: Path) -> str:
        jwt = tmp_path / "jwt"
        jwt.write_text("the-jwt")
        jwt.chmod(0o600)
        source = VaultSource(
            address=address,
            path="s3/team-a",
            auth=KubernetesAuth("publisher", jwt),
            allow_insecure_http=True,
            proxy_for=rule.proxy_for,
        )
        try:
            return source.fetch().access_key_id
        finally:
            source.close()

    def test_vault_requests_go_through_the_recording_proxy(self, vault: FakeVault, tmp_path: Path) -> None:
        """Login and read reach the fake Vault only through the proxy, with proxy credentials."""
        port = urlsplit(vault.url).port
        assert port is not None
        resolve = {"vault.unresolvable.test": ("127.0.0.1", port)}
        with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, PROXY_PASSWORD)) as proxy:
            rule = ProxyRule(http_proxy=proxy.url_with(PROXY_USER, PROXY_PASSWORD))
            key = self.fetch(f"http://vault.unresolvable.test:{port}", rule, tmp_path)
            recorded = proxy.requests
        assert key == "AKIDVIAPROXY"
        assert summary(recorded) == [
            ("POST", f"vault.unresolvable.test:{port}", "/v1/auth/kubernetes/login", "forwarded"),
            ("GET", f"vault.unresolvable.test:{port}", "/v1/secret/data/s3/team-a", "forwarded"),
        ]
        assert all(r.proxy_authorization for r in recorded)
        assert all("proxy-authorization" not in r.headers for r in vault.requests)

    def test_no_proxy_sends_vault_requests_direct(
        self, vault: FakeVault, tmp_path: Path, hosts: dict[str, str]
    ) -> None:
        """A NO_PROXY entry for the Vault host sends both requests direct; the proxy sees nothing."""
        hosts["vault.unresolvable.test"] = "127.0.0.1"
        port = urlsplit(vault.url).port
        with ForwardProxy() as proxy:
            rule = ProxyRule(http_proxy=proxy.url, no_proxy=".unresolvable.test")
            key = self.fetch(f"http://vault.unresolvable.test:{port}", rule, tmp_path)
            assert (key, proxy.requests) == ("AKIDVIAPROXY", [])
        assert [r.path for r in vault.requests] == ["/v1/auth/kubernetes/login", "/v1/secret/data/s3/team-a"]

    def test_a_loopback_vault_is_reached_direct(self, vault: FakeVault, tmp_path: Path) -> None:
        """A loopback Vault address is never proxied, even with a proxy and no NO_PROXY."""
        with ForwardProxy() as proxy:
            key = self.fetch(vault.url, ProxyRule(http_proxy=proxy.url, https_proxy=proxy.url), tmp_path)
            assert (key, proxy.requests) == ("AKIDVIAPROXY", [])

    def test_the_vault_session_is_the_rule_session(self, vault: FakeVault, tmp_path: Path) -> None:
        """Production code builds its session with requests_session: same class, environment not trusted."""
        source = VaultSource(
            address=vault.url, path="s3/team-a", auth=KubernetesAuth("publisher", tmp_path / "jwt")
        )
        session = source._client_or_new().session
        try:
            assert type(session) is type(requests_session(ProxyRule()))
            assert session.trust_env is False
        finally:
            source.close()


class TestProxiesMapping:
    """``proxies_for`` maps the target's scheme to the rule's proxy; ``ProxyRoutes`` remembers each origin."""

    def test_https_endpoint_maps_https_to_the_https_proxy(self) -> None:
        """An https endpoint gets {"https": <HTTPS proxy>}."""
        rule = ProxyRule(http_proxy="http-proxy:3128", https_proxy="https://tls-proxy:3129")
        assert proxies_for(rule, "https://s3.example.com") == {"https": "https://tls-proxy:3129"}

    def test_http_endpoint_maps_http_to_the_http_proxy(self) -> None:
        """An http endpoint gets {"http": <HTTP proxy>}, keeping the proxy's user-info for the client."""
        rule = ProxyRule(http_proxy="http://u:p@http-proxy:3128")
        assert proxies_for(rule, "HTTP://S3.Example.com:9000/") == {"http": "http://u:p@http-proxy:3128"}

    def test_direct_endpoint_maps_to_an_empty_dict(self) -> None:
        """A bypassed endpoint gets {} (never None, which would let botocore read the environment)."""
        rule = ProxyRule(https_proxy="proxy:3128", no_proxy="example.com")
        assert proxies_for(rule, "https://s3.example.com") == {}

    def test_routes_remember_the_latest_decision_per_origin(self) -> None:
        """ProxyRoutes answers like the rule and keeps one entry per scheme://host[:port], no user-info."""
        routes = ProxyRoutes(ProxyRule(https_proxy="u:pw@proxy:3128", no_proxy="direct.example"))
        assert routes.decide("https://a.example/x?y") == "http://u:pw@proxy:3128"
        assert routes.decide("https://who@DIRECT.example:9000/") is None
        assert routes.decide("https://a.example/other") == "http://u:pw@proxy:3128"
        assert routes.seen() == {
            "https://a.example": "http://u:pw@proxy:3128",
            "https://direct.example:9000": None,
        }
        assert "pw" not in repr(routes)

    def test_the_adapter_module_imports_no_client_library(self) -> None:
        """Importing ckpt.adapters.proxy imports neither requests nor botocore."""
        code = "import sys, ckpt.adapters.proxy; print(sorted({'requests', 'botocore'} & set(sys.modules)))"
        completed = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        )
        assert completed.stdout.strip() == "[]"


class TestForwardProxyDouble:
    """The recording proxy itself behaves as the tests above (and the S3 fault tests) rely on."""

    def test_refuses_targets_off_the_machine_without_connecting(self, origin: Origin) -> None:
        """A non-loopback IP or a name outside the resolve map gets 403 and is recorded as refused."""
        with ForwardProxy() as proxy, requests_session(ProxyRule(http_proxy=proxy.url)) as session:
            statuses = [
                session.get(url, timeout=10).status_code for url in ("http://192.0.2.1/", "http://a.test/")
            ]
            recorded = proxy.requests
        assert statuses == [403, 403]
        assert [(r.target, r.outcome) for r in recorded] == [
            ("192.0.2.1:80", "refused"),
            ("a.test:80", "refused"),
        ]

    def test_requires_proxy_credentials_when_configured(self, origin: Origin) -> None:
        """Without Proxy-Authorization the proxy answers 407 and forwards nothing."""
        resolve = {"app.unresolvable.test": ("127.0.0.1", origin.port)}
        with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, PROXY_PASSWORD)) as proxy:
            with requests_session(ProxyRule(http_proxy=proxy.url)) as session:
                response = session.get("http://app.unresolvable.test/", timeout=10)
            recorded = proxy.requests
        assert response.status_code == 407
        assert [(r.outcome, r.proxy_authorization) for r in recorded] == [("unauthorized", False)]
        assert origin.requests == []

    def test_strip_request_header_hides_it_from_the_target_only(
        self, origin: Origin, proxy: ForwardProxy
    ) -> None:
        """The origin does not get the stripped header; the record still shows what the client sent."""
        proxy.rules.append(StripRequestHeader("If-None-Match"))
        with requests_session(ProxyRule(http_proxy=proxy.url)) as session:
            session.get("http://app.unresolvable.test/x", headers={"If-None-Match": "*"}, timeout=10)
        assert proxy.requests[0].header("if-none-match") == "*"
        assert "if-none-match" not in origin.requests[0].headers

    def test_slow_down_answers_503_as_often_as_asked(self, origin: Origin, proxy: ForwardProxy) -> None:
        """A slow_down rule limited to one request answers S3's SlowDown once, then lets requests through."""
        rule = slow_down(Match(times=1))
        proxy.rules.append(rule)
        with requests_session(ProxyRule(http_proxy=proxy.url)) as session:
            first = session.get("http://app.unresolvable.test/1", timeout=10)
            second = session.get("http://app.unresolvable.test/2", timeout=10)
        assert (first.status_code, "<Code>SlowDown</Code>" in first.text, second.status_code) == (
            503,
            True,
            200,
        )
        assert ([r.outcome for r in proxy.requests], rule.when.hits) == (["replied", "forwarded"], 1)
        assert origin.paths() == ["/2"]

    @pytest.mark.parametrize(("after_forwarding", "origin_paths"), [(False, []), (True, ["/drop"])])
    def test_drop_connection_before_or_after_forwarding(
        self, origin: Origin, proxy: ForwardProxy, after_forwarding: bool, origin_paths: list[str]
    ) -> None:
        """The client sees a dropped connection; the origin got the request only when dropped after."""
        proxy.rules.append(DropConnection(after_forwarding=after_forwarding))
        with (
            requests_session(ProxyRule(http_proxy=proxy.url)) as session,
            pytest.raises(requests.exceptions.ConnectionError),
        ):
            session.get("http://app.unresolvable.test/drop", timeout=10)
        assert origin.paths() == origin_paths

    def test_truncate_response_cuts_the_body_short(self, origin: Origin, proxy: ForwardProxy) -> None:
        """The client gets the full headers but fewer body bytes than announced, and fails reading."""
        proxy.rules.append(TruncateResponse(keep_bytes=5, when=Match(path_prefix="/long")))
        with (
            requests_session(ProxyRule(http_proxy=proxy.url)) as session,
            pytest.raises(requests.exceptions.RequestException),
        ):
            session.get("http://app.unresolvable.test/long-body", timeout=10)
        assert [r.outcome for r in proxy.requests] == ["truncated"]

    def test_delay_holds_the_request_back(self, origin: Origin, proxy: ForwardProxy) -> None:
        """A Delay rule makes the answer arrive no sooner than the delay."""
        proxy.rules.append(Delay(0.3))
        with requests_session(ProxyRule(http_proxy=proxy.url)) as session:
            started = time.monotonic()
            response = session.get("http://app.unresolvable.test/slow", timeout=10)
            elapsed = time.monotonic() - started
        assert response.status_code == 200
        assert elapsed >= 0.3
