"""Vault over TLS with a client certificate (mTLS), and the request timeout, from ``[[credentials]]``.

The fake Vault (``tests/fake_vault.py``) is served over TLS by a server that *requires* a client certificate
signed by the test CA; certificates are made at test time with ``cryptography`` (installed with moto).
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from ckpt.creds import chain_from_config
from ckpt.creds.config import validate_credentials_config
from ckpt.domain.errors import ConfigError, CredentialsError
from support.fake_vault import FakeVault, _ServerWithApp

ROLE = "ckpt-publisher"
JWT = "eyJhbGciOiJSUzI1NiJ9.MTLS-TEST-JWT.sig"
SECRET = {"access_key_id": "AKIDMTLS", "secret_access_key": "mtls-secret-key"}
NOW = datetime.datetime.now(datetime.UTC)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)
    return path


def _issue(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None, signer: Any, *, ca: bool
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer is not None else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - datetime.timedelta(minutes=5))
        .not_valid_after(NOW + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files under ``folder``."""

    def __init__(self, folder: Path) -> None:
        ca_key = _key()
        ca = _issue("ckpt test CA", ca_key, None, ca_key, ca=True)
        self.ca = folder / "ca.pem"
        self.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        self.server_cert, self.server_key = self._leaf(folder, "server", ca, ca_key)
        self.client_cert, self.client_key = self._leaf(folder, "client", ca, ca_key)

    @staticmethod
    def _leaf(folder: Path, name: str, ca: x509.Certificate, ca_key: Any) -> tuple[Path, Path]:
        key = _key()
        cert = _issue(f"ckpt test {name}", key, ca, ca_key, ca=False)
        cert_path = folder / f"{name}.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cert_path, _write_key(key, folder / f"{name}-key.pem")


class MutualTlsVault(FakeVault):
    """The fake Vault served over TLS, refusing every connection without a client certificate from the CA."""

    def __init__(self, pki: Pki) -> None:
        super().__init__()
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(pki.server_cert, pki.server_key)
        self.context.load_verify_locations(pki.ca)
        self.context.verify_mode = ssl.CERT_REQUIRED

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._server = _ServerWithApp(self._respond)
        self._server.socket = self.context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self.port = self._server.server_address[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki(tmp_path)


@pytest.fixture
def vault(pki: Pki) -> Iterator[MutualTlsVault]:
    with MutualTlsVault(pki) as fake:
        fake.allow_kubernetes(ROLE, JWT)
        fake.put_secret("s3/team-a", SECRET)
        yield fake


@pytest.fixture
def jwt_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(JWT + "\n")
    return path


def vault_table(address: str, jwt_file: Path, **extra: object) -> dict[str, object]:
    return {
        "source": "vault",
        "address": address,
        "path": "s3/team-a",
        "auth": {"method": "kubernetes", "role": ROLE, "jwt_file": str(jwt_file)},
        **extra,
    }


class TestMutualTls:
    def test_the_client_certificate_is_presented(
        self, vault: MutualTlsVault, pki: Pki, jwt_file: Path
    ) -> None:
        """With client_cert and client_key, the login and the read succeed over TLS requiring a cert."""
        table = vault_table(
            vault.url,
            jwt_file,
            ca_bundle=str(pki.ca),
            client_cert=str(pki.client_cert),
            client_key=str(pki.client_key),
        )
        credentials = chain_from_config([table]).fetch()
        assert (credentials.access_key_id, credentials.source) == ("AKIDMTLS", "vault")
        assert [r.path.split("?")[0] for r in vault.requests][:2] == [
            "/v1/auth/kubernetes/login",
            "/v1/secret/data/s3/team-a",
        ]

    def test_without_a_client_certificate_the_handshake_fails(
        self, vault: MutualTlsVault, pki: Pki, jwt_file: Path
    ) -> None:
        """The same Vault without client_cert: a CredentialsError saying TLS failed; nothing was answered."""
        chain = chain_from_config([vault_table(vault.url, jwt_file, ca_bundle=str(pki.ca))])
        with pytest.raises(CredentialsError, match="TLS"):
            chain.fetch()
        assert vault.requests == []

    @pytest.mark.parametrize(
        ("extra", "key"),
        [
            ({"client_cert": "/etc/ckpt/client.pem"}, "credentials[0].client_key"),
            ({"client_key": "/etc/ckpt/client-key.pem"}, "credentials[0].client_cert"),
            ({"timeout": 0}, "credentials[0].timeout"),
            ({"timeout": -1.5}, "credentials[0].timeout"),
            ({"timeout": "10"}, "credentials[0].timeout"),
            ({"timeout": True}, "credentials[0].timeout"),
            ({"timeout": 10**9}, "credentials[0].timeout"),
        ],
    )
    def test_settings_are_validated(self, tmp_path: Path, extra: dict[str, object], key: str) -> None:
        """A certificate without its key (or the reverse), or a timeout not seconds > 0: ConfigError."""
        with pytest.raises(ConfigError) as caught:
            validate_credentials_config([vault_table("https://vault.example:8200", tmp_path / "t", **extra)])
        assert caught.value.key == key


class TestTimeout:
    def test_a_vault_that_never_answers_fails_within_the_timeout(self, jwt_file: Path) -> None:
        """``timeout = 0.5``: a Vault that accepts and never answers fails in about that long."""
        with socket.socket() as silent:
            silent.bind(("127.0.0.1", 0))
            silent.listen(8)
            address = f"http://127.0.0.1:{silent.getsockname()[1]}"
            chain = chain_from_config([vault_table(address, jwt_file, timeout=0.5)])
            started = time.monotonic()
            with pytest.raises(CredentialsError) as caught:
                chain.fetch()
            elapsed = time.monotonic() - started
        assert elapsed < 5, elapsed  # the default (10 s) would take longer
        assert "vault" in str(caught.value)
