"""The ``vault`` credential source against the fake Vault (support/fake_vault.py) on loopback
(spec/credentials.md).

Covers: Kubernetes and AppRole logins (the JWT and secret id re-read at every login, no token on a login),
token reuse, renewal and re-login, KV v2 reads with rotated, deleted and destroyed versions, and the
transport rules: no ambient ``VAULT_TOKEN``, no proxy from the environment, the injected proxy rule, no
redirects, no plain ``http://`` off loopback, and errors that never carry a body or a secret.
"""

from __future__ import annotations

import logging
import socket
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckpt.creds import AppRoleAuth, Credentials, KubernetesAuth, VaultFields, VaultSource
from ckpt.creds.vault.source import vault_address_problem
from ckpt.creds.vault.token import VaultToken, plan_token, token_from_auth
from ckpt.domain.errors import ConfigError, CredentialsError
from support.fake_vault import FakeVault, RecordingServer, RelayServer

ROLE = "ckpt-publisher"
JWT = "eyJhbGciOiJSUzI1NiJ9.JWT-ONE-c0ffee.sig"
JWT_ROTATED = "eyJhbGciOiJSUzI1NiJ9.JWT-TWO-c0ffee.sig"
ROLE_ID = "ROLE-ID-1d3a-4242"
SECRET_ID = "SECRET-ID-5e4b-4242"
SECRET_ID_ROTATED = "SECRET-ID-ROTATED-9a8b-4242"
KEY_ID = "AKIDVAULT0001"
SECRET_KEY = "vault-SECRET-KEY-4242-beef"
SESSION_TOKEN = "vault-SESSION-TOKEN-4242-beef"
SECRET_DATA = {"access_key_id": KEY_ID, "secret_access_key": SECRET_KEY, "session_token": SESSION_TOKEN}


class Clock:
    """A monotonic clock the test moves by hand, shared by the fake Vault and the source."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def vault(clock: Clock) -> Iterator[FakeVault]:
    with FakeVault(clock=clock, token_ttl=300, token_max_ttl=3000) as fake:
        fake.allow_kubernetes(ROLE, JWT)
        fake.allow_approle(ROLE_ID, SECRET_ID)
        fake.put_secret("s3/team-a", SECRET_DATA)
        yield fake


@pytest.fixture
def jwt_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(JWT + "\n")
    path.chmod(0o644)  # how Kubernetes mounts it
    return path


def kube_source(vault: FakeVault, jwt_file: Path, clock: Clock, **changes: object) -> VaultSource:
    settings: dict[str, object] = {
        "address": vault.url,
        "path": "s3/team-a",
        "auth": KubernetesAuth(ROLE, jwt_file),
        "clock": clock,
    }
    settings.update(changes)
    return VaultSource(**settings)  # type: ignore[arg-type]


def all_text(error: BaseException, caplog: pytest.LogCaptureFixture) -> str:
    """Everything a user could see about a failure: message, repr, traceback, and every log record."""
    rendered = "".join(traceback.format_exception(error))
    logs = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    return f"{error}\n{error!r}\n{rendered}\n{logs}"


class TestKubernetesAuth:
    def test_logs_in_and_reads_the_secret(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """The keys come from the KV v2 secret, read with the token the Kubernetes login returned."""
        found = kube_source(vault, jwt_file, clock).fetch()
        assert found == Credentials(KEY_ID, SECRET_KEY, SESSION_TOKEN, source="vault")
        login, read = vault.requests
        assert (login.method, login.path) == ("POST", "/v1/auth/kubernetes/login")
        assert login.json() == {"role": ROLE, "jwt": JWT}
        assert (read.method, read.path) == ("GET", "/v1/secret/data/s3/team-a")
        assert read.headers["x-vault-token"] == vault.issued_tokens[0]

    def test_the_login_carries_no_token(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """No login request carries X-Vault-Token, also a re-login after the old token was refused."""
        source = kube_source(vault, jwt_file, clock)
        source.fetch()
        vault.expire_tokens()
        source.fetch()
        assert len(vault.logins) == 2
        assert all("x-vault-token" not in r.headers for r in vault.logins)

    def test_the_token_is_reused_while_valid(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """Three fetches well inside the lease: one login, three reads."""
        source = kube_source(vault, jwt_file, clock)
        for _ in range(3):
            source.fetch()
            clock.advance(30)
        assert len(vault.logins) == 1
        assert len(vault.calls("/data/s3/team-a")) == 3

    def test_the_jwt_is_read_again_at_every_login(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """After the service-account token rotates, the next login sends the new JWT."""
        source = kube_source(vault, jwt_file, clock)
        source.fetch()
        jwt_file.write_text(JWT_ROTATED + "\n")
        vault.allow_kubernetes(ROLE, JWT_ROTATED)
        vault.revoke_jwt(ROLE, JWT)
        vault.expire_tokens()
        assert source.fetch().access_key_id == KEY_ID
        assert [r.json()["jwt"] for r in vault.logins] == [JWT, JWT_ROTATED]

    def test_an_unknown_role_is_broken(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """Vault's 400 on a login is an error naming the source, the role and the status."""
        source = kube_source(vault, jwt_file, clock, auth=KubernetesAuth("nobody", jwt_file))
        with pytest.raises(CredentialsError) as info:
            source.fetch()
        assert info.value.source == "vault"
        assert "HTTP 400" in str(info.value)
        assert "'nobody'" in str(info.value)

    def test_a_rejected_jwt_is_never_printed(
        self, vault: FakeVault, jwt_file: Path, clock: Clock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Vault may echo the JWT in its error body; the body is dropped, so the JWT appears nowhere."""
        vault.echo_secrets = True
        vault.revoke_jwt(ROLE, JWT)
        with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsError) as info:
            kube_source(vault, jwt_file, clock).fetch()
        assert "HTTP 403 permission denied" in str(info.value)
        assert JWT not in all_text(info.value, caplog)

    def test_a_missing_jwt_file_is_broken_not_absent(
        self, vault: FakeVault, tmp_path: Path, clock: Clock
    ) -> None:
        """A configured Vault source is never absent: no JWT file is an error."""
        with pytest.raises(CredentialsError, match=r"JWT file .* does not exist"):
            kube_source(vault, tmp_path / "missing", clock).fetch()
        assert vault.requests == []

    def test_mounts_namespace_and_field_names_are_configurable(self, clock: Clock, jwt_file: Path) -> None:
        """Auth mount, KV mount, namespace and field names all reach the wire as configured."""
        with FakeVault(clock=clock, kubernetes_mount="k8s-east", namespace="ml/team-a") as fake:
            fake.allow_kubernetes(ROLE, JWT)
            fake.put_secret("team-a", {"ak": "AKIDCUSTOM", "sk": SECRET_KEY}, mount="kv")
            source = kube_source(
                fake,
                jwt_file,
                clock,
                path="/team-a/",
                mount="kv",
                namespace="ml/team-a",
                auth=KubernetesAuth(ROLE, jwt_file, mount="k8s-east"),
                fields=VaultFields(access_key_id="ak", secret_access_key="sk", session_token="st"),
            )
            assert source.fetch() == Credentials("AKIDCUSTOM", SECRET_KEY, None, source="vault")
            assert [r.path for r in fake.requests] == ["/v1/auth/k8s-east/login", "/v1/kv/data/team-a"]
            assert all(r.headers["x-vault-namespace"] == "ml/team-a" for r in fake.requests)


class TestAppRoleAuth:
    def test_logs_in_with_values(self, vault: FakeVault, clock: Clock) -> None:
        """Role id and secret id given as values are sent to the AppRole login."""
        source = VaultSource(
            address=vault.url,
            path="s3/team-a",
            auth=AppRoleAuth(role_id=ROLE_ID, secret_id=SECRET_ID),
            clock=clock,
        )
        assert source.fetch().access_key_id == KEY_ID
        (login,) = vault.logins
        assert login.path == "/v1/auth/approle/login"
        assert login.json() == {"role_id": ROLE_ID, "secret_id": SECRET_ID}
        assert "x-vault-token" not in login.headers

    def test_the_secret_id_file_is_read_again_at_every_login(
        self, vault: FakeVault, clock: Clock, tmp_path: Path
    ) -> None:
        """A rotated secret id file is used by the next login."""
        role_id_file, secret_id_file = tmp_path / "role-id", tmp_path / "secret-id"
        role_id_file.write_text(ROLE_ID + "\n")
        secret_id_file.write_text(SECRET_ID + "\n")
        role_id_file.chmod(0o600)
        secret_id_file.chmod(0o600)
        source = VaultSource(
            address=vault.url,
            path="s3/team-a",
            auth=AppRoleAuth(role_id_file=role_id_file, secret_id_file=secret_id_file),
            clock=clock,
        )
        source.fetch()
        secret_id_file.write_text(SECRET_ID_ROTATED + "\n")
        vault.allow_approle(ROLE_ID, SECRET_ID_ROTATED)
        vault.revoke_secret_id(ROLE_ID, SECRET_ID)
        vault.expire_tokens()
        assert source.fetch().access_key_id == KEY_ID
        assert [r.json()["secret_id"] for r in vault.logins] == [SECRET_ID, SECRET_ID_ROTATED]

    def test_a_rejected_secret_id_is_never_printed(
        self, vault: FakeVault, clock: Clock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Vault echoing the secret id in its 400 body changes nothing: the body is dropped."""
        vault.echo_secrets = True
        source = VaultSource(
            address=vault.url,
            path="s3/team-a",
            auth=AppRoleAuth(role_id=ROLE_ID, secret_id="WRONG-SECRET-ID-4242"),
            clock=clock,
        )
        with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsError) as info:
            source.fetch()
        text = all_text(info.value, caplog)
        assert "HTTP 400" in str(info.value)
        assert "WRONG-SECRET-ID-4242" not in text
        assert ROLE_ID not in text

    def test_exactly_one_of_value_and_file(self) -> None:
        """Both or neither of secret_id and secret_id_file is a configuration error."""
        with pytest.raises(ConfigError, match="secret_id"):
            AppRoleAuth(role_id=ROLE_ID)
        with pytest.raises(ConfigError, match="role_id"):
            AppRoleAuth(role_id=ROLE_ID, role_id_file=Path("/r"), secret_id=SECRET_ID)


class TestTokenLifecycle:
    @pytest.mark.parametrize(
        ("token", "now", "action"),
        [
            (None, 0.0, "login"),
            (VaultToken("t", 0.0, 300.0, True), 100.0, "reuse"),
            (VaultToken("t", 0.0, 300.0, True), 199.0, "reuse"),
            (VaultToken("t", 0.0, 300.0, True), 201.0, "renew"),
            (VaultToken("t", 0.0, 300.0, False), 201.0, "login"),
            (VaultToken("t", 0.0, 300.0, True), 296.0, "login"),
            (VaultToken("t", 0.0, 300.0, True), 400.0, "login"),
            (VaultToken("t", 0.0, 0.0, False), 1e9, "reuse"),
        ],
    )
    def test_plan(self, token: VaultToken | None, now: float, action: str) -> None:
        """Reuse while more than a third of the lease is left, then renew (or log in), log in near the end."""
        assert plan_token(token, now) == action

    @pytest.mark.parametrize(
        ("response", "previous", "expected"),
        [
            (
                {"auth": {"client_token": "n", "lease_duration": 60, "renewable": True}},
                None,
                ("n", 60.0, True),
            ),
            (
                {"auth": {"lease_duration": 400, "renewable": True}},
                VaultToken("t", 0.0, 300.0, True),
                ("t", 400.0, True),
            ),
            (
                {"auth": {"lease_duration": 100, "renewable": True}},
                VaultToken("t", 0.0, 300.0, True),
                ("t", 100.0, False),
            ),
            ({"auth": {"client_token": "n", "lease_duration": 0}}, None, ("n", 0.0, False)),
        ],
    )
    def test_token_from_an_auth_block(
        self, response: object, previous: VaultToken | None, expected: tuple[str, float, bool]
    ) -> None:
        """A renewal keeps the old token; one that does not extend the expiry is marked not renewable."""
        token = token_from_auth(response, now=150.0, previous=previous)
        assert token is not None
        assert (token.value, token.obtained_at, token.lease_seconds, token.renewable) == (
            *expected[:1],
            150.0,
            *expected[1:],
        )

    @pytest.mark.parametrize(
        "response",
        [
            None,
            {"auth": None},
            {"auth": {"lease_duration": 60}},  # no token, and no previous one
            {"auth": {"client_token": "", "lease_duration": 60}},
            {"auth": {"client_token": "n", "lease_duration": -1}},
            {"auth": {"client_token": "n", "lease_duration": True}},
            {"auth": {"client_token": "n", "lease_duration": "60"}},
            {"auth": {"client_token": "n", "lease_duration": 60, "renewable": "yes"}},
        ],
    )
    def test_no_token_from_a_bad_auth_block(self, response: object) -> None:
        """An answer without a usable auth block gives no token (the source reports it as unexpected)."""
        assert token_from_auth(response, now=0.0, previous=None) is None

    def test_the_token_is_renewed_before_it_expires(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """Two thirds into the lease the token is renewed with renew-self, not replaced by a login."""
        source = kube_source(vault, jwt_file, clock)
        source.fetch()
        clock.advance(210)
        source.fetch()
        clock.advance(210)  # past the original expiry: only the renewal keeps the token alive
        source.fetch()
        assert len(vault.logins) == 1
        renewals = vault.calls("/auth/token/renew-self")
        assert len(renewals) == 2
        assert all(r.headers["x-vault-token"] == vault.issued_tokens[0] for r in renewals)

    def test_a_non_renewable_token_is_replaced_by_a_login(self, clock: Clock, jwt_file: Path) -> None:
        """When the token cannot be renewed, a new login replaces it before it expires."""
        with FakeVault(clock=clock, token_ttl=300, renewable=False) as fake:
            fake.allow_kubernetes(ROLE, JWT)
            fake.put_secret("s3/team-a", SECRET_DATA)
            source = kube_source(fake, jwt_file, clock)
            source.fetch()
            clock.advance(210)
            source.fetch()
            assert len(fake.logins) == 2
            assert fake.calls("/auth/token/renew-self") == []
            assert fake.calls("/data/s3/team-a")[-1].headers["x-vault-token"] == fake.issued_tokens[1]

    def test_a_token_at_its_maximum_ttl_is_replaced(self, clock: Clock, jwt_file: Path) -> None:
        """Once renewing gains nothing (maximum TTL), the source logs in again instead."""
        with FakeVault(clock=clock, token_ttl=300, token_max_ttl=330) as fake:
            fake.allow_kubernetes(ROLE, JWT)
            fake.put_secret("s3/team-a", SECRET_DATA)
            source = kube_source(fake, jwt_file, clock)
            source.fetch()  # t=0, expires at 300, max 330
            clock.advance(210)
            source.fetch()  # renewed: expires at 330 (capped), 120 left
            clock.advance(90)
            source.fetch()  # 30 left <= 120/3: renewal gains nothing -> marked, and still usable
            clock.advance(21)
            source.fetch()  # 9 left: log in
            assert len(fake.logins) == 2

    def test_a_refused_token_is_replaced_at_once(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """Vault's 403 on a read (token revoked) triggers one new login and the read is retried."""
        source = kube_source(vault, jwt_file, clock)
        source.fetch()
        vault.revoke_tokens()
        assert source.fetch().access_key_id == KEY_ID
        assert len(vault.logins) == 2
        assert vault.calls("/data/s3/team-a")[-1].headers["x-vault-token"] == vault.issued_tokens[1]

    def test_a_failed_renewal_falls_back_to_a_login(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """A renewal Vault refuses is not fatal: the source logs in again."""
        source = kube_source(vault, jwt_file, clock)
        source.fetch()
        vault.revoke_tokens()
        clock.advance(210)
        assert source.fetch().access_key_id == KEY_ID
        assert len(vault.calls("/auth/token/renew-self")) == 1
        assert len(vault.logins) == 2

    def test_a_policy_denial_fails_after_one_fresh_login(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """403 with a fresh token too means the policy denies the path: an error, after exactly one retry."""
        vault.denied_paths.add("s3/team-a")
        with pytest.raises(CredentialsError, match="also with a fresh token"):
            kube_source(vault, jwt_file, clock).fetch()
        assert len(vault.logins) == 2
        assert len(vault.calls("/data/s3/team-a")) == 2


class TestSecretVersions:
    def test_a_rotated_secret_is_read_at_the_next_fetch(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """Every fetch reads the latest version."""
        source = kube_source(vault, jwt_file, clock)
        assert source.fetch().access_key_id == KEY_ID
        vault.put_secret("s3/team-a", {"access_key_id": "AKIDROTATED", "secret_access_key": SECRET_KEY})
        rotated = source.fetch()
        assert (rotated.access_key_id, rotated.session_token) == ("AKIDROTATED", None)

    @pytest.mark.parametrize(
        ("arrange", "message"),
        [
            ("delete", "the latest version 1 was deleted"),
            ("destroy", "the latest version 1 was destroyed"),
            ("missing", "no such secret"),
        ],
    )
    def test_deleted_destroyed_and_missing_secrets_are_broken(
        self, vault: FakeVault, jwt_file: Path, clock: Clock, arrange: str, message: str
    ) -> None:
        """A 404 says which: a deleted version, a destroyed version, or no secret at all."""
        path = "s3/team-a"
        if arrange == "delete":
            vault.delete_latest(path)
        elif arrange == "destroy":
            vault.destroy_latest(path)
        else:
            path = "s3/nobody"
        with pytest.raises(CredentialsError) as info:
            kube_source(vault, jwt_file, clock, path=path).fetch()
        assert "HTTP 404" in str(info.value)
        assert message in str(info.value)

    def test_a_missing_field_is_broken(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """A secret without the access key field is an error naming the field."""
        vault.put_secret("s3/team-a", {"secret_access_key": SECRET_KEY})
        with pytest.raises(CredentialsError, match="no field 'access_key_id'"):
            kube_source(vault, jwt_file, clock).fetch()

    def test_a_field_of_the_wrong_type_is_broken(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """A non-string field is refused without echoing the secret."""
        vault.put_secret("s3/team-a", {"access_key_id": KEY_ID, "secret_access_key": [SECRET_KEY]})  # type: ignore[dict-item]
        with pytest.raises(CredentialsError, match="not a string") as info:
            kube_source(vault, jwt_file, clock).fetch()
        assert SECRET_KEY not in str(info.value)


class TestTransport:
    def test_ambient_vault_settings_are_ignored(
        self, vault: FakeVault, jwt_file: Path, clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """VAULT_TOKEN, ~/.vault-token and VAULT_ADDR are ignored; the first request is a tokenless login."""
        monkeypatch.setenv("VAULT_TOKEN", "hvs.AMBIENT-ENV-TOKEN")
        monkeypatch.setenv("VAULT_ADDR", f"http://127.0.0.1:{closed_port()}")
        monkeypatch.setenv("HOME", str(tmp_path))
        (tmp_path / ".vault-token").write_text("hvs.AMBIENT-FILE-TOKEN")
        source = kube_source(vault, jwt_file, clock)
        assert source.fetch().access_key_id == KEY_ID
        assert vault.requests[0].path == "/v1/auth/kubernetes/login"
        sent = [r.headers.get("x-vault-token", "") for r in vault.requests]
        assert not any("AMBIENT" in token for token in sent)

    def test_proxy_variables_are_ignored(
        self, vault: FakeVault, jwt_file: Path, clock: Clock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """HTTP(S)_PROXY pointing at a dead port changes nothing: the session does not trust the env."""
        dead = f"http://127.0.0.1:{closed_port()}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(name, dead)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        assert kube_source(vault, jwt_file, clock).fetch().access_key_id == KEY_ID

    def test_the_injected_proxy_rule_is_used(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """``proxy_for`` is asked for every request's own URL (the session is ``adapters.proxy``'s), and
        every request goes through its answer."""
        asked: list[str] = []
        with RelayServer() as proxy:

            def proxy_for(url: str) -> str | None:
                asked.append(url)
                return proxy.url

            assert kube_source(vault, jwt_file, clock, proxy_for=proxy_for).fetch().access_key_id == KEY_ID
        assert asked == [
            vault.url,  # the debug line saying which way Vault is reached
            f"{vault.url}/v1/auth/kubernetes/login",
            f"{vault.url}/v1/secret/data/s3/team-a",
        ]
        assert [r.path for r in proxy.requests] == [
            f"{vault.url}/v1/auth/kubernetes/login",
            f"{vault.url}/v1/secret/data/s3/team-a",
        ]

    def test_a_proxy_password_is_never_printed(
        self, vault: FakeVault, jwt_file: Path, clock: Clock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A failing proxy with user-info in its URL: the password appears in no message or log."""
        proxy = f"http://ckpt:PROXY-PASSWORD-4242@127.0.0.1:{closed_port()}"
        with caplog.at_level(logging.DEBUG), pytest.raises(CredentialsError) as info:
            kube_source(vault, jwt_file, clock, proxy_for=lambda _url: proxy).fetch()
        assert "proxy" in str(info.value)
        assert "PROXY-PASSWORD-4242" not in all_text(info.value, caplog)

    def test_a_redirect_is_never_followed(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """A 307 on a token-bearing read is an error; the other host never sees a request (nor the token)."""
        source = kube_source(vault, jwt_file, clock)
        source.fetch()
        with RecordingServer("localhost") as elsewhere:
            vault.redirect_to = elsewhere.url
            with pytest.raises(CredentialsError, match="redirect") as info:
                source.fetch()
            assert elsewhere.requests == []
        assert vault.requests[-1].headers["x-vault-token"] == vault.issued_tokens[0]
        assert vault.issued_tokens[0] not in str(info.value)

    def test_a_redirected_login_is_never_followed(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """A 307 on the login is an error too: the JWT is not re-posted elsewhere."""
        with RecordingServer("localhost") as elsewhere:
            vault.redirect_to = elsewhere.url
            with pytest.raises(CredentialsError, match="HTTP 307"):
                kube_source(vault, jwt_file, clock).fetch()
            assert elsewhere.requests == []

    @pytest.mark.parametrize(
        ("address", "allowed", "problem"),
        [
            ("https://vault.example.internal:8200", False, None),
            ("http://127.0.0.1:8200", False, None),
            ("http://127.8.9.10:8200", False, None),
            ("http://[::1]:8200", False, None),
            ("http://[::ffff:127.0.0.1]:8200", False, None),
            ("http://LocalHost:8200", False, None),
            ("http://vault.example.internal:8200", True, None),
            ("http://vault.example.internal:8200", False, "plain http:// is refused"),
            ("http://10.0.0.1:8200", False, "plain http:// is refused"),
            ("http://localhost.example.com", False, "plain http:// is refused"),
            ("ftp://vault.example", False, "https:// URL"),
            ("https://user:pw@vault.example", False, "user-info"),
            ("https://vault.example/v1/", False, "without a path"),
            ("https://vault.example?x=1", False, "without a path"),
            ("https://vault.example:99999", False, "not a valid URL"),
            ("vault.example:8200", False, "https:// URL"),
        ],
    )
    def test_address_rules(self, address: str, allowed: bool, problem: str | None) -> None:
        """https anywhere; plain http only to loopback or when allowed; no user-info, path or query."""
        found = vault_address_problem(address, allow_insecure_http=allowed)
        if problem is None:
            assert found is None
        else:
            assert found is not None
            assert problem in found

    def test_a_refused_address_fails_before_any_request(self) -> None:
        """Constructing a source with plain http to a remote host raises at once."""
        with pytest.raises(ConfigError, match="plain http"):
            VaultSource(address="http://vault.example.internal:8200", path="p", auth=KubernetesAuth(ROLE))

    def test_a_sealed_vault_is_reported(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """A 503 says Vault is sealed or unavailable."""
        vault.sealed = True
        with pytest.raises(CredentialsError, match="HTTP 503 Vault is sealed"):
            kube_source(vault, jwt_file, clock).fetch()

    def test_an_unreachable_vault_is_reported(self, jwt_file: Path, clock: Clock) -> None:
        """A refused connection is 'cannot connect', with the address and nothing else."""
        address = f"http://127.0.0.1:{closed_port()}"
        source = VaultSource(address=address, path="p", auth=KubernetesAuth(ROLE, jwt_file), clock=clock)
        with pytest.raises(CredentialsError) as info:
            source.fetch()
        assert str(info.value) == (
            f"vault: logging in (kubernetes auth, role {ROLE!r}) at {address} failed: cannot connect"
        )

    def test_tls_to_a_plain_server_is_reported(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """https to a server that does not speak TLS fails as a TLS error."""
        address = vault.url.replace("http://", "https://")
        source = VaultSource(address=address, path="p", auth=KubernetesAuth(ROLE, jwt_file), clock=clock)
        with pytest.raises(CredentialsError, match="TLS"):
            source.fetch()

    def test_errors_carry_no_library_exception(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """The hvac exception (with the full URL and body) is neither cause nor context of ours."""
        vault.echo_secrets = True
        vault.revoke_jwt(ROLE, JWT)
        with pytest.raises(CredentialsError) as info:
            kube_source(vault, jwt_file, clock).fetch()
        assert info.value.__cause__ is None
        assert info.value.__context__ is None

    def test_repr_shows_no_secret(self, vault: FakeVault, jwt_file: Path, clock: Clock) -> None:
        """After a login, the source's repr holds neither the token nor AppRole secrets."""
        source = VaultSource(
            address=vault.url,
            path="s3/team-a",
            auth=AppRoleAuth(role_id=ROLE_ID, secret_id=SECRET_ID),
            clock=clock,
        )
        source.fetch()
        text = repr(source)
        assert vault.issued_tokens[0] not in text
        assert SECRET_ID not in text
        assert ROLE_ID not in text


class TestFakeVault:
    def test_lookup_self_reports_the_remaining_ttl(
        self, vault: FakeVault, jwt_file: Path, clock: Clock
    ) -> None:
        """The fake's token lookup answers as Vault does, and refuses an expired token with a 403."""
        import hvac
        import hvac.exceptions

        kube_source(vault, jwt_file, clock).fetch()
        client = hvac.Client(url=vault.url, token=vault.issued_tokens[0], cert=(), verify=True)
        clock.advance(100)
        data = client.auth.token.lookup_self()["data"]
        assert (data["ttl"], data["renewable"]) == (200, True)
        vault.expire_tokens()
        with pytest.raises(hvac.exceptions.Forbidden):
            client.auth.token.lookup_self()
