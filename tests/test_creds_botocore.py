"""The botocore session behind the S3 client, against a real S3 server (moto's, as a subprocess) seen
through a loopback relay that records the signing key of every request and can reject a key
(spec/credentials.md).

Covers: only our chain signs (ambient ``AWS_*`` settings change nothing), scheduled refresh, refresh before
expiry, last good keys kept up to the maximum staleness, one forced refresh plus one retry on an
authentication error (not on ``AccessDenied``), a Vault rotation reaching the wire without a new client,
and the secret-hygiene check over a whole failing run.
"""

from __future__ import annotations

import http.client
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import botocore.config
import botocore.exceptions
import botocore.session
import pytest

from ckpt.adapters.s3.client import create_s3_client
from ckpt.creds import AppRoleAuth, Chain, Credentials, FileSource, KubernetesAuth, VaultSource
from ckpt.creds.botocore_session import (
    AUTH_ERROR_CODES,
    make_botocore_session,
    next_refresh,
    stale_deadline,
)
from ckpt.domain.errors import CredentialsError, InvalidError
from support.fake_vault import Answer, FakeVault, RecordedRequest, RelayServer

SECRET = "s3-SECRET-KEY-f00d-4242"
TOKEN = "s3-SESSION-TOKEN-f00d-4242"
BUCKET = "ckpt-creds"
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


# -- loopback S3 ---------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/moto-api/data.json")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    """moto's S3 server in its own process, on a loopback port, with one bucket."""
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's server did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        setup = create_s3_client(
            make_botocore_session(StaticSource()),
            region_name="us-east-1",
            endpoint_url=url,
            config=s3_config(),
        )
        setup.create_bucket(Bucket=BUCKET)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


class Gate:
    """The relay in front of moto: records each request's access key id; rejects chosen keys."""

    def __init__(self, upstream: str) -> None:
        self.relay = RelayServer(upstream, intercept=self._intercept)
        self.reject: dict[str, tuple[int, str, int]] = {}  # key id -> (status, code, times left; -1: always)

    def __enter__(self) -> Gate:
        self.relay.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.relay.__exit__(*exc)

    @property
    def url(self) -> str:
        return self.relay.url

    @property
    def keys(self) -> list[str]:
        """The access key id that signed each request, in order."""
        found = []
        for request in self.relay.requests:
            match = re.search(r"Credential=([^/]+)/", request.headers.get("authorization", ""))
            found.append(match.group(1) if match else "")
        return found

    @property
    def requests(self) -> list[RecordedRequest]:
        return self.relay.requests

    def _intercept(self, request: RecordedRequest) -> Answer | None:
        match = re.search(r"Credential=([^/]+)/", request.headers.get("authorization", ""))
        key = match.group(1) if match else ""
        if key not in self.reject:
            return None
        status, code, left = self.reject[key]
        if left == 0:
            return None
        self.reject[key] = (status, code, left - 1 if left > 0 else left)
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>refused by the test gate</Message><RequestId>gate</RequestId></Error>"
        ).encode()
        return Answer(status, body, {"Content-Type": "application/xml"})


@pytest.fixture
def gate(moto_url: str) -> Iterator[Gate]:
    with Gate(moto_url) as relay:
        yield relay


# -- fakes ---------------------------------------------------------------------------------------------


class DateClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class StaticSource:
    name = "static"

    def fetch(self) -> Credentials:
        return Credentials("AKIDSTATIC", SECRET, source=self.name)


class RotatingSource:
    """Hands out the current key; the test rotates it, breaks it, or gives it an expiry."""

    name = "rotating"

    def __init__(self, key_id: str = "AKIDONE") -> None:
        self.key_id = key_id
        self.expiry: datetime | None = None
        self.broken = False
        self.fetches = 0

    def fetch(self) -> Credentials:
        self.fetches += 1
        if self.broken:
            raise CredentialsError(f"{self.name}: backend unavailable", source=self.name)
        return Credentials(self.key_id, SECRET, TOKEN, self.expiry, source=self.name)


def s3_config(max_attempts: int = 3) -> botocore.config.Config:
    return botocore.config.Config(
        proxies={},
        s3={"addressing_style": "path"},
        retries={"mode": "standard", "max_attempts": max_attempts},
        connect_timeout=5,
        read_timeout=10,
    )


def client_for(session: botocore.session.Session, gate: Gate, max_attempts: int = 3) -> Any:
    return create_s3_client(
        session, region_name="us-east-1", endpoint_url=gate.url, config=s3_config(max_attempts)
    )


def put(client: Any, key: str = "k") -> None:
    client.put_object(Bucket=BUCKET, Key=key, Body=b"payload")


@pytest.fixture(autouse=True)
def ckpt_logs_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI may have set the ckpt logger not to propagate; caplog listens at the root."""
    monkeypatch.setattr(logging.getLogger("ckpt"), "propagate", True)


@pytest.fixture
def clock() -> DateClock:
    return DateClock()


# -- the tests -----------------------------------------------------------------------------------------


class TestSession:
    def test_only_our_chain_signs(self, gate: Gate, monkeypatch: pytest.MonkeyPatch) -> None:
        """The resolver holds exactly our provider; AWS_* keys in the environment are never used."""
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDAMBIENT")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ambient-secret")
        session = make_botocore_session(RotatingSource())
        providers = session.get_component("credential_provider").providers
        assert [p.METHOD for p in providers] == ["ckpt-chain"]
        put(client_for(session, gate))
        assert gate.keys == ["AKIDONE"]
        assert gate.requests[0].headers["x-amz-security-token"] == TOKEN

    def test_nothing_is_fetched_before_the_first_request(self, gate: Gate, clock: DateClock) -> None:
        """Making the session and the client fetches nothing; requests within the schedule fetch once."""
        source = RotatingSource()
        client = client_for(make_botocore_session(source, clock=clock), gate)
        assert source.fetches == 0
        put(client)
        put(client)
        assert source.fetches == 1

    def test_ambient_settings_cannot_redirect_or_rekey(
        self, gate: Gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """AWS_PROFILE, endpoint and region variables and ~/.aws/config change nothing about the requests."""
        config = tmp_path / "aws-config"
        config.write_text(
            "[default]\nregion = eu-west-3\nendpoint_url = http://127.0.0.1:9\n"
            "s3 =\n    addressing_style = virtual\n"
        )
        monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
        monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
        monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "no-such-ca.pem"))
        session = make_botocore_session(RotatingSource())
        put(client_for(session, gate))
        (request,) = gate.requests
        assert request.path == f"/{BUCKET}/k"
        assert "/us-east-1/s3/aws4_request" in request.headers["authorization"]
        aws = create_s3_client(session, region_name="eu-central-1", endpoint_url=None, config=s3_config())
        assert aws.meta.endpoint_url == "https://s3.eu-central-1.amazonaws.com"

    def test_the_client_needs_explicit_proxies(self) -> None:
        """Without explicit proxies botocore would read HTTPS_PROXY behind the proxy rule's back."""
        session = make_botocore_session(RotatingSource())
        with pytest.raises(InvalidError, match="proxies"):
            create_s3_client(
                session,
                region_name="us-east-1",
                endpoint_url="http://127.0.0.1:9",
                config=botocore.config.Config(),
            )

    def test_the_client_needs_our_session(self) -> None:
        """A plain botocore session (with the default chain) is refused."""
        with pytest.raises(InvalidError, match="make_botocore_session"):
            create_s3_client(
                botocore.session.Session(),
                region_name="us-east-1",
                endpoint_url="http://127.0.0.1:9",
                config=s3_config(),
            )

    @pytest.mark.parametrize("setting", ["refresh_seconds", "max_staleness_seconds", "retry_seconds"])
    def test_settings_must_be_positive(self, setting: str) -> None:
        """Zero or negative durations are refused."""
        with pytest.raises(InvalidError, match=setting):
            make_botocore_session(RotatingSource(), **{setting: 0})  # type: ignore[arg-type]


class TestSchedule:
    def test_next_refresh_is_the_schedule_or_a_margin_before_expiry(self) -> None:
        """The earlier of now + refresh_seconds and 60 s (or half the remaining life) before expiry."""
        assert next_refresh(T0, None, 900) == T0 + timedelta(seconds=900)
        assert next_refresh(T0, T0 + timedelta(hours=1), 900) == T0 + timedelta(seconds=900)
        assert next_refresh(T0, T0 + timedelta(seconds=300), 900) == T0 + timedelta(seconds=240)
        assert next_refresh(T0, T0 + timedelta(seconds=40), 900) == T0 + timedelta(seconds=20)
        assert next_refresh(T0, T0 + timedelta(seconds=1), 900) == T0 + timedelta(seconds=1)

    def test_stale_deadline(self) -> None:
        """Last good keys are kept while younger than the maximum staleness and not expired."""
        good = Credentials("AKID", SECRET)
        expiring = Credentials("AKID", SECRET, expiry=T0 + timedelta(seconds=1000))
        settings = {"max_staleness_seconds": 3600, "retry_seconds": 60}
        at = T0 + timedelta(seconds=900)
        assert stale_deadline(at, None, None, **settings) is None
        assert stale_deadline(at, good, T0, **settings) == at + timedelta(seconds=60)
        assert stale_deadline(T0 + timedelta(seconds=3570), good, T0, **settings) == T0 + timedelta(
            seconds=3600
        )
        assert stale_deadline(T0 + timedelta(seconds=3600), good, T0, **settings) is None
        assert stale_deadline(T0 + timedelta(seconds=980), expiring, T0, **settings) == T0 + timedelta(
            seconds=1000
        )
        assert stale_deadline(T0 + timedelta(seconds=1000), expiring, T0, **settings) is None


class TestRefresh:
    def test_keys_are_refetched_on_schedule(self, gate: Gate, clock: DateClock) -> None:
        """A rotated key is used once refresh_seconds have passed, not before, by the same client."""
        source = RotatingSource("AKIDONE")
        client = client_for(make_botocore_session(source, refresh_seconds=900, clock=clock), gate)
        put(client)
        source.key_id = "AKIDTWO"
        clock.advance(899)
        put(client)
        clock.advance(2)
        put(client)
        assert gate.keys == ["AKIDONE", "AKIDONE", "AKIDTWO"]
        assert source.fetches == 2

    def test_keys_are_refetched_before_they_expire(self, gate: Gate, clock: DateClock) -> None:
        """Keys expiring before the schedule are refreshed 60 s before their expiry."""
        source = RotatingSource("AKIDONE")
        source.expiry = T0 + timedelta(seconds=300)
        client = client_for(make_botocore_session(source, refresh_seconds=900, clock=clock), gate)
        put(client)
        source.key_id, source.expiry = "AKIDTWO", T0 + timedelta(hours=2)
        clock.advance(239)
        put(client)
        clock.advance(2)
        put(client)
        assert gate.keys == ["AKIDONE", "AKIDONE", "AKIDTWO"]

    def test_already_expired_keys_are_an_error(self, gate: Gate, clock: DateClock) -> None:
        """A source returning expired keys (and no earlier good keys) fails the request."""
        source = RotatingSource()
        source.expiry = T0 - timedelta(seconds=1)
        client = client_for(make_botocore_session(source, clock=clock), gate)
        with pytest.raises(CredentialsError, match="expired"):
            put(client)
        assert gate.requests == []

    def test_last_good_keys_are_kept_up_to_the_maximum_staleness(
        self, gate: Gate, clock: DateClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A failed refresh keeps the last good keys with a warning, retries every retry_seconds, and fails
        once the keys are older than the maximum staleness."""
        source = RotatingSource("AKIDONE")
        session = make_botocore_session(
            source, refresh_seconds=900, max_staleness_seconds=3600, retry_seconds=60, clock=clock
        )
        client = client_for(session, gate)
        put(client)
        source.broken = True
        clock.advance(901)
        with caplog.at_level(logging.WARNING, logger="ckpt"):
            put(client)
        assert source.fetches == 2
        warnings = [r.getMessage() for r in caplog.records if r.name.startswith("ckpt")]
        assert len(warnings) == 1
        assert (
            "still signing with the keys from rotating fetched 901s ago (maximum staleness 3600s)"
            in warnings[0]
        )
        clock.advance(30)
        put(client)
        assert source.fetches == 2  # the next attempt is 60 s after the failure
        clock.advance(31)
        put(client)
        assert source.fetches == 3
        clock.advance(3600 - 901 - 61)  # exactly the maximum staleness
        with pytest.raises(CredentialsError, match="backend unavailable") as info:
            put(client)
        assert info.value.source == "rotating"
        assert gate.keys == ["AKIDONE"] * 4

    def test_a_healed_source_is_used_again(self, gate: Gate, clock: DateClock) -> None:
        """After an outage shorter than the maximum staleness, the next attempt picks up fresh keys."""
        source = RotatingSource("AKIDONE")
        client = client_for(make_botocore_session(source, retry_seconds=60, clock=clock), gate)
        put(client)
        source.broken = True
        clock.advance(901)
        put(client)
        source.broken, source.key_id = False, "AKIDTWO"
        clock.advance(61)
        put(client)
        assert gate.keys == ["AKIDONE", "AKIDONE", "AKIDTWO"]

    def test_a_first_fetch_failure_is_raised(self, gate: Gate, clock: DateClock) -> None:
        """With no good keys yet, a broken chain fails the request with the chain's error."""
        source = RotatingSource()
        source.broken = True
        with pytest.raises(CredentialsError, match="backend unavailable"):
            put(client_for(make_botocore_session(source, clock=clock), gate))
        assert gate.requests == []


class TestAuthRetry:
    @pytest.mark.parametrize(
        ("status", "code"),
        [
            (403, "InvalidAccessKeyId"),
            (403, "SignatureDoesNotMatch"),
            (400, "ExpiredToken"),
            (400, "InvalidToken"),
            (400, "TokenRefreshRequired"),
        ],
    )
    def test_an_auth_error_refreshes_once_and_retries_once(
        self, gate: Gate, clock: DateClock, status: int, code: str
    ) -> None:
        """S3 rejecting the key: one forced refresh (before the schedule) and one retry with the new key."""
        assert code in AUTH_ERROR_CODES
        source = RotatingSource("AKIDONE")
        client = client_for(make_botocore_session(source, clock=clock), gate, max_attempts=1)
        put(client)
        source.key_id = "AKIDTWO"
        gate.reject["AKIDONE"] = (status, code, -1)
        put(client, "k2")
        assert gate.keys == ["AKIDONE", "AKIDONE", "AKIDTWO"]
        assert source.fetches == 2

    def test_the_retry_happens_only_once(self, gate: Gate, clock: DateClock) -> None:
        """A key still rejected after the refresh fails with S3's error after exactly two attempts."""
        source = RotatingSource("AKIDONE")
        gate.reject["AKIDONE"] = (403, "InvalidAccessKeyId", -1)
        client = client_for(make_botocore_session(source, clock=clock), gate, max_attempts=5)
        with pytest.raises(botocore.exceptions.ClientError) as info:
            put(client)
        assert info.value.response["Error"]["Code"] == "InvalidAccessKeyId"
        assert gate.keys == ["AKIDONE", "AKIDONE"]
        assert source.fetches == 2

    def test_each_request_gets_its_own_retry(self, gate: Gate, clock: DateClock) -> None:
        """The once-only rule is per request, not per client."""
        source = RotatingSource("AKIDONE")
        client = client_for(make_botocore_session(source, clock=clock), gate, max_attempts=1)
        gate.reject["AKIDONE"] = (403, "InvalidAccessKeyId", 1)
        source.key_id = "AKIDTWO"
        put(client)  # first fetch gives AKIDTWO already; reject nothing
        gate.reject["AKIDTWO"] = (403, "InvalidAccessKeyId", 1)
        source.key_id = "AKIDTHREE"
        put(client, "k2")
        gate.reject["AKIDTHREE"] = (403, "ExpiredToken", 1)
        source.key_id = "AKIDFOUR"
        put(client, "k3")
        assert gate.keys == ["AKIDTWO", "AKIDTWO", "AKIDTHREE", "AKIDTHREE", "AKIDFOUR"]

    def test_access_denied_is_not_retried(self, gate: Gate, clock: DateClock) -> None:
        """AccessDenied is an authorization answer: no refresh, no retry."""
        source = RotatingSource("AKIDONE")
        gate.reject["AKIDONE"] = (403, "AccessDenied", -1)
        client = client_for(make_botocore_session(source, clock=clock), gate, max_attempts=1)
        with pytest.raises(botocore.exceptions.ClientError) as info:
            put(client)
        assert info.value.response["Error"]["Code"] == "AccessDenied"
        assert gate.keys == ["AKIDONE"]
        assert source.fetches == 1

    def test_a_failing_forced_refresh_does_not_fall_back_to_stale_keys(
        self, gate: Gate, clock: DateClock
    ) -> None:
        """Keys S3 just rejected are not kept: the forced refresh's error reaches the caller."""
        source = RotatingSource("AKIDONE")
        client = client_for(make_botocore_session(source, clock=clock), gate, max_attempts=1)
        put(client)
        source.broken = True
        gate.reject["AKIDONE"] = (403, "InvalidAccessKeyId", -1)
        with pytest.raises(CredentialsError, match="backend unavailable"):
            put(client, "k2")
        assert gate.keys == ["AKIDONE", "AKIDONE"]

    def test_concurrent_auth_errors_cause_one_refresh(self, gate: Gate, clock: DateClock) -> None:
        """Many threads rejected at once with the same key: one forced refresh, and every retry uses it."""
        threads = 8  # below botocore's connection pool (10), so every request is on the wire at once
        source = RotatingSource("AKIDONE")
        client = client_for(make_botocore_session(source, clock=clock), gate, max_attempts=1)
        put(client)  # the first fetch
        all_rejected = threading.Barrier(threads, timeout=30)
        rejected = 0

        def reject_once_all_arrived(request: RecordedRequest) -> Answer | None:
            nonlocal rejected
            if "Credential=AKIDONE/" not in request.headers.get("authorization", ""):
                return None
            all_rejected.wait()  # every thread's request is signed with AKIDONE before any is answered
            rejected += 1
            body = b"<Error><Code>InvalidAccessKeyId</Code><Message>rotated</Message></Error>"
            return Answer(403, body, {"Content-Type": "application/xml"})

        gate.relay.intercept = reject_once_all_arrived
        source.key_id = "AKIDTWO"
        failures: list[BaseException] = []

        def upload(index: int) -> None:
            try:
                put(client, f"k-{index}")
            except BaseException as exc:  # handed to the test thread
                failures.append(exc)

        workers = [threading.Thread(target=upload, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert failures == []
        assert rejected == threads
        assert source.fetches == 2  # the first fetch and exactly one refresh
        assert sorted(gate.keys) == sorted(["AKIDONE"] * (threads + 1) + ["AKIDTWO"] * threads)


ROLE = "ckpt-publisher"
JWT = "eyJhbGciOiJSUzI1NiJ9.HYGIENE-JWT-4242.sig"
ROLE_ID = "HYGIENE-ROLE-ID-4242"
SECRET_ID = "HYGIENE-SECRET-ID-4242"
VAULT_SECRET = "HYGIENE-S3-SECRET-KEY-4242"
VAULT_SESSION = "HYGIENE-S3-SESSION-TOKEN-4242"
ROTATED_SECRET = "HYGIENE-S3-ROTATED-SECRET-4242"
PROXY_PASSWORD = "HYGIENE-PROXY-PASSWORD-4242"
FILE_SECRET = "HYGIENE-FILE-SECRET-4242"


class MonotonicOf:
    """The Vault source's monotonic clock, driven by the same hand-moved wall clock."""

    def __init__(self, clock: DateClock) -> None:
        self.clock = clock

    def __call__(self) -> float:
        return (self.clock.now - T0).total_seconds()


class TestRotationThroughVault:
    def test_a_rotated_vault_secret_reaches_the_wire_without_a_new_client(
        self, gate: Gate, clock: DateClock, tmp_path: Path
    ) -> None:
        """Vault → chain → botocore: after the secret rotates, the next scheduled refresh signs with it."""
        jwt_file = tmp_path / "token"
        jwt_file.write_text(JWT)
        with FakeVault(clock=MonotonicOf(clock), token_ttl=3600) as vault:
            vault.allow_kubernetes(ROLE, JWT)
            vault.put_secret("s3/team-a", {"access_key_id": "AKIDVAULT1", "secret_access_key": VAULT_SECRET})
            source = VaultSource(
                address=vault.url,
                path="s3/team-a",
                auth=KubernetesAuth(ROLE, jwt_file),
                clock=MonotonicOf(clock),
            )
            client = client_for(make_botocore_session(Chain([source]), clock=clock), gate)
            put(client)
            vault.put_secret(
                "s3/team-a", {"access_key_id": "AKIDVAULT2", "secret_access_key": ROTATED_SECRET}
            )
            put(client)
            clock.advance(901)
            put(client)
            assert gate.keys == ["AKIDVAULT1", "AKIDVAULT1", "AKIDVAULT2"]
            assert len(vault.logins) == 1

    def test_a_revoked_key_picks_up_the_rotation_at_once(
        self, gate: Gate, clock: DateClock, tmp_path: Path
    ) -> None:
        """When S3 rejects the old key, the forced refresh reads the rotated secret before the schedule."""
        jwt_file = tmp_path / "token"
        jwt_file.write_text(JWT)
        with FakeVault(clock=MonotonicOf(clock)) as vault:
            vault.allow_kubernetes(ROLE, JWT)
            vault.put_secret("s3/team-a", {"access_key_id": "AKIDVAULT1", "secret_access_key": VAULT_SECRET})
            source = VaultSource(
                address=vault.url,
                path="s3/team-a",
                auth=KubernetesAuth(ROLE, jwt_file),
                clock=MonotonicOf(clock),
            )
            client = client_for(make_botocore_session(Chain([source]), clock=clock), gate)
            put(client)
            vault.put_secret(
                "s3/team-a", {"access_key_id": "AKIDVAULT2", "secret_access_key": ROTATED_SECRET}
            )
            gate.reject["AKIDVAULT1"] = (403, "InvalidAccessKeyId", -1)
            put(client)
            assert gate.keys == ["AKIDVAULT1", "AKIDVAULT1", "AKIDVAULT2"]


class TestSecretHygiene:
    def test_no_secret_appears_anywhere_in_a_failing_run(
        self,
        gate: Gate,
        clock: DateClock,
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """With debug logging on and every failure path taken, no secret is in any output, log record,
        exception text or repr; logins carry no token; a redirect carries no token elsewhere."""
        caplog.set_level(logging.DEBUG)
        # ckpt never turns botocore's debug logging on (it prints session tokens); the CLI configures only
        # the "ckpt" logger. Here the root is at DEBUG, so botocore is held at INFO the way the CLI leaves it.
        caplog.set_level(logging.INFO, logger="botocore")
        monotonic = MonotonicOf(clock)
        failures: list[BaseException] = []
        reprs: list[str] = []

        def expect_failure(action: Any) -> None:
            try:
                action()
            except (CredentialsError, botocore.exceptions.ClientError) as exc:
                failures.append(exc)
            else:
                pytest.fail("the action was expected to fail")

        secret_id_file = tmp_path / "secret-id"
        secret_id_file.write_text(SECRET_ID + "\n")
        secret_id_file.chmod(0o600)
        with FakeVault(clock=monotonic, token_ttl=600) as vault, RelayServer() as elsewhere:
            vault.echo_secrets = True
            vault.allow_approle(ROLE_ID, SECRET_ID)
            vault.put_secret(
                "s3/team-a",
                {
                    "access_key_id": "AKIDHYGIENE1",
                    "secret_access_key": VAULT_SECRET,
                    "session_token": VAULT_SESSION,
                },
            )
            source = VaultSource(
                address=vault.url,
                path="s3/team-a",
                auth=AppRoleAuth(role_id=ROLE_ID, secret_id_file=secret_id_file),
                clock=monotonic,
            )
            chain = Chain([source])
            session = make_botocore_session(
                chain, refresh_seconds=900, max_staleness_seconds=1800, clock=clock
            )
            client = client_for(session, gate, max_attempts=1)

            put(client)  # 1. a good run, with a session token on the wire
            vault.put_secret(
                "s3/team-a", {"access_key_id": "AKIDHYGIENE2", "secret_access_key": ROTATED_SECRET}
            )
            gate.reject["AKIDHYGIENE1"] = (403, "InvalidAccessKeyId", -1)
            put(client, "k2")  # 2. auth error: forced refresh, retry
            vault.sealed = True
            clock.advance(901)
            put(client, "k3")  # 3. Vault down: stale keys with a warning
            clock.advance(1800)
            expect_failure(lambda: put(client, "k4"))  # 4. past the maximum staleness
            vault.sealed = False
            vault.revoke_tokens()
            vault.revoke_secret_id(ROLE_ID, SECRET_ID)
            expect_failure(source.fetch)  # 5. re-login refused, Vault echoing the secret id
            vault.allow_approle(ROLE_ID, SECRET_ID)
            vault.redirect_to = elsewhere.url
            expect_failure(source.fetch)  # 6. a redirect on the login
            vault.redirect_to = None
            source.fetch()
            vault.redirect_to = elsewhere.url
            expect_failure(source.fetch)  # 7. a redirect on a token-bearing read
            proxied = VaultSource(
                address=vault.url,
                path="s3/team-a",
                auth=AppRoleAuth(role_id=ROLE_ID, secret_id=SECRET_ID),
                proxy_for=lambda _url: f"http://ckpt:{PROXY_PASSWORD}@127.0.0.1:{_free_port()}",
            )
            expect_failure(proxied.fetch)  # 8. a dead proxy with a password
            folder = tmp_path / "s3"
            folder.mkdir()
            (folder / "access_key_id").write_text("AKIDFILE")
            (folder / "secret_access_key").write_text(FILE_SECRET)
            (folder / "secret_access_key").chmod(0o666)
            expect_failure(FileSource(folder).fetch)  # 9. a refused secret file
            reprs += [repr(chain), repr(source), repr(proxied), repr(session.get_credentials()), repr(client)]
            issued = list(vault.issued_tokens)
            logins = vault.logins

        secrets = [
            SECRET,
            TOKEN,
            JWT,
            ROLE_ID,
            SECRET_ID,
            VAULT_SECRET,
            VAULT_SESSION,
            ROTATED_SECRET,
            PROXY_PASSWORD,
            FILE_SECRET,
            *issued,
        ]
        formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
        seen = {
            "stdout/stderr": "".join(capsys.readouterr()),
            "log records": "\n".join(formatter.format(record) for record in caplog.records),
            "exceptions": "\n".join(
                f"{exc}\n{exc!r}\n{''.join(traceback.format_exception(exc))}" for exc in failures
            ),
            "reprs": "\n".join(reprs),
        }
        for where, text in seen.items():
            leaked = [secret for secret in secrets if secret in text]
            assert leaked == [], f"{where} contains {leaked}"
        assert len(failures) == 6
        assert any("maximum staleness" in record.getMessage() for record in caplog.records)
        assert any("AKIDHYGIENE1" in record.getMessage() for record in caplog.records)  # key ids may show
        assert len(issued) >= 2
        assert logins
        assert all("x-vault-token" not in login.headers for login in logins)
        assert elsewhere.requests == []
