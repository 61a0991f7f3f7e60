"""Every credential source passes the public ``Source`` contract (``ckpt.testing.source_contract``).

Each class below gives the contract a present, an absent and a broken instance of one source, and a way
to rotate its secret: env, file, vault (against the project's fake Vault on 127.0.0.1), aws-default (a
credentials file in a temporary HOME, instance metadata switched off), a chain, and
``ckpt.testing.StaticCredentialSource``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from ckpt.creds import (
    AwsDefaultSource,
    Chain,
    Credentials,
    EnvSource,
    FileSource,
    KubernetesAuth,
    Source,
    VaultSource,
)
from ckpt.domain.errors import CredentialsError
from ckpt.testing import StaticCredentialSource
from ckpt.testing.source_contract import SourceContract
from support.fake_vault import FakeVault

KEY_ID = "AKIDCONTRACT0001"
SECRET = "contract-SECRET-4242-beef"
TOKEN = "contract-TOKEN-4242-beef"
ROTATED_KEY_ID = "AKIDCONTRACT0002"
ROTATED_SECRET = "contract-ROTATED-SECRET-4242-beef"
EXPECTED = Credentials(KEY_ID, SECRET, TOKEN)
ROTATED = Credentials(ROTATED_KEY_ID, ROTATED_SECRET)


class TestStaticCredentialSource(SourceContract):
    def present(self) -> tuple[Source, Credentials]:
        return StaticCredentialSource(EXPECTED), EXPECTED

    def absent(self) -> Source:
        return StaticCredentialSource(None)

    def broken(self) -> Source:
        return StaticCredentialSource(EXPECTED, broken=True)

    def rotate(self, source: Source) -> Credentials:
        cast(StaticCredentialSource, source).credentials = ROTATED
        return ROTATED


class TestEnvSource(SourceContract):
    def present(self) -> tuple[Source, Credentials]:
        environ = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": TOKEN}
        return EnvSource(environ), EXPECTED

    def absent(self) -> Source:
        return EnvSource({"HOME": "/home/trainer"})

    def broken(self) -> Source:
        return EnvSource({"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SESSION_TOKEN": TOKEN})  # half a key pair

    def rotate(self, source: Source) -> Credentials:
        environ = cast(dict[str, str], cast(EnvSource, source).environ)
        environ.update(AWS_ACCESS_KEY_ID=ROTATED_KEY_ID, AWS_SECRET_ACCESS_KEY=ROTATED_SECRET)
        del environ["AWS_SESSION_TOKEN"]
        return ROTATED


def _write_secret(folder: Path, name: str, value: str) -> None:
    path = folder / name
    path.write_text(value + "\n")
    path.chmod(0o600)


class TestFileSource(SourceContract):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    def present(self) -> tuple[Source, Credentials]:
        folder = self.folder / "present"
        if not folder.exists():
            folder.mkdir(mode=0o700)
            _write_secret(folder, "access_key_id", KEY_ID)
            _write_secret(folder, "secret_access_key", SECRET)
            _write_secret(folder, "session_token", TOKEN)
        return FileSource(folder), EXPECTED

    def absent(self) -> Source:
        return FileSource(self.folder / "not-mounted")

    def broken(self) -> Source:
        folder = self.folder / "broken"
        folder.mkdir(mode=0o700)
        _write_secret(folder, "access_key_id", KEY_ID)  # and no secret_access_key
        return FileSource(folder)

    def rotate(self, source: Source) -> Credentials:
        folder = cast(FileSource, source).directory
        _write_secret(folder, "access_key_id", ROTATED_KEY_ID)
        _write_secret(folder, "secret_access_key", ROTATED_SECRET)
        (folder / "session_token").unlink()
        return ROTATED


ROLE = "ckpt-contract"
JWT = "eyJhbGciOiJSUzI1NiJ9.JWT-CONTRACT-c0ffee.sig"


class TestVaultSource(SourceContract):
    @pytest.fixture(autouse=True)
    def _vault(self, tmp_path: Path) -> Iterator[None]:
        self.jwt_file = tmp_path / "token"
        self.jwt_file.write_text(JWT + "\n")
        self.jwt_file.chmod(0o644)
        with FakeVault() as fake:
            fake.allow_kubernetes(ROLE, JWT)
            fake.put_secret(
                "s3/contract", {"access_key_id": KEY_ID, "secret_access_key": SECRET, "session_token": TOKEN}
            )
            fake.put_secret("s3/half", {"access_key_id": KEY_ID})
            self.vault = fake
            yield

    def _source(self, path: str) -> VaultSource:
        return VaultSource(address=self.vault.url, path=path, auth=KubernetesAuth(ROLE, self.jwt_file))

    def present(self) -> tuple[Source, Credentials]:
        return self._source("s3/contract"), EXPECTED

    def broken(self) -> Source:
        return self._source("s3/half")

    def rotate(self, source: Source) -> Credentials:
        self.vault.put_secret(
            "s3/contract", {"access_key_id": ROTATED_KEY_ID, "secret_access_key": ROTATED_SECRET}
        )
        return ROTATED

    def secrets(self) -> tuple[str, ...]:
        return (SECRET, TOKEN, JWT, *self.vault.issued_tokens)

    def test_absent_source_returns_none(self) -> None:
        """A Vault source is never absent (spec/credentials.md §5.1): a missing secret is broken."""
        with pytest.raises(CredentialsError) as caught:
            self._source("s3/no-such-secret").fetch()
        assert caught.value.source == "vault"


AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)


def _aws_credentials(key_id: str, secret: str, token: str | None = None) -> str:
    lines = ["[default]", f"aws_access_key_id = {key_id}", f"aws_secret_access_key = {secret}"]
    if token is not None:
        lines.append(f"aws_session_token = {token}")
    return "\n".join(lines) + "\n"


class TestAwsDefaultSource(SourceContract):
    """botocore's chain, kept to a temporary HOME: a credentials file, no instance metadata, no network."""

    @pytest.fixture(autouse=True)
    def _home(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in AWS_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HOME", str(tmp_path))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        self.credentials_file = tmp_path / "aws-credentials"
        self.monkeypatch = monkeypatch

    def present(self) -> tuple[Source, Credentials]:
        self.credentials_file.write_text(_aws_credentials(KEY_ID, SECRET, TOKEN))
        return AwsDefaultSource(), EXPECTED

    def absent(self) -> Source:
        return AwsDefaultSource()

    def broken(self) -> Source:
        self.monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
        return AwsDefaultSource()

    def rotate(self, source: Source) -> Credentials:
        self.credentials_file.write_text(_aws_credentials(ROTATED_KEY_ID, ROTATED_SECRET))
        return ROTATED


class TestChain(SourceContract):
    """A chain answers with its first present member; it is never absent (nothing found is an error)."""

    def present(self) -> tuple[Source, Credentials]:
        return Chain([StaticCredentialSource(None, name="first"), StaticCredentialSource(EXPECTED)]), EXPECTED

    def broken(self) -> Source:
        return Chain([StaticCredentialSource(None, name="first"), StaticCredentialSource(None, broken=True)])

    def broken_name(self, source: Source) -> str:
        return "static"  # the member that broke, not the chain

    def rotate(self, source: Source) -> Credentials:
        member = cast(StaticCredentialSource, cast(Chain, source).sources[1])
        member.credentials = ROTATED
        return ROTATED

    def test_absent_source_returns_none(self) -> None:
        """A chain whose members are all absent raises CredentialsError naming them, never returns None."""
        chain = Chain([StaticCredentialSource(None, name="first"), StaticCredentialSource(None)])
        with pytest.raises(CredentialsError, match="sources tried: first, static"):
            chain.fetch()
