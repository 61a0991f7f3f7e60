"""The ``vault`` credential source: a KV v2 secret read through ``hvac`` (spec/credentials.md §5).

The auth methods are in :mod:`ckpt.creds.vault.auth`, the token's lifetime in :mod:`ckpt.creds.vault.token`
and the translation of failures in :mod:`ckpt.creds.vault.failures`; this module holds the source itself
and the check of its address. Rules for it (each one closes a way a Vault token or secret could leak or be
misused):

- ``hvac`` and ``requests`` are imported inside functions: importing ``ckpt.creds`` needs neither.
- The HTTP session is the project's one proxy wiring, :func:`ckpt.adapters.proxy.requests_session`:
  ``trust_env=False`` (no ``*_PROXY``, ``REQUESTS_CA_BUNDLE`` or ``.netrc`` from the environment), and the
  proxy of every request decided by the injected ``proxy_for`` rule for that request's own URL; TLS
  verified against the configured CA bundle (or the system default). ``hvac.Client`` is always given an
  explicit token, URL, CA and client certificate, so it never reads ``VAULT_TOKEN``, ``~/.vault-token``,
  ``VAULT_ADDR``, ``VAULT_CACERT`` or ``VAULT_CLIENT_CERT``.
- Redirects are never followed: a 3xx answer is an error before anything is sent elsewhere. A Vault standby
  answers 307 to the active node, and ``requests`` would carry ``X-Vault-Token`` (not an ``Authorization``
  header, so not stripped) to wherever ``Location`` points.
- Plain ``http://`` is refused unless the host is loopback (:func:`ckpt.domain.loopback.is_loopback_host`)
  or ``allow_insecure_http`` says so; an address carrying user-info, a path, a query or a fragment is
  refused.
- The token is reused, renewed or replaced as :func:`~ckpt.creds.vault.token.plan_token` decides, and
  replaced at once when Vault answers 403 (then the read is retried once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import attrs

from ckpt.creds.files import read_secret_file
from ckpt.creds.model import Credentials
from ckpt.creds.vault.auth import VaultAuth, login_request
from ckpt.creds.vault.failures import PermissionDeniedError, call_vault
from ckpt.creds.vault.token import VaultToken, plan_token, token_from_auth
from ckpt.domain.durations import MAX_SECONDS
from ckpt.domain.errors import ConfigError, CredentialsError
from ckpt.domain.loopback import is_loopback_host
from ckpt.domain.redaction import redact_url

__all__ = ["VaultFields", "VaultSource", "vault_address_problem"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def vault_address_problem(address: str, *, allow_insecure_http: bool) -> str | None:
    """Return why ``address`` is refused as a Vault address, or ``None`` when it is acceptable.

    >>> vault_address_problem("https://vault.example.internal:8200", allow_insecure_http=False) is None
    True
    >>> vault_address_problem("http://127.0.0.1:8200", allow_insecure_http=False) is None
    True
    """
    try:
        parts = urlsplit(address)
        host = parts.hostname
        parts.port  # noqa: B018 - parsing the port validates it
    except ValueError:
        return "it is not a valid URL"
    if parts.scheme not in ("https", "http") or not host:
        return "it must be an https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "it must not contain user-info (credentials belong in the auth settings)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "it must be scheme://host[:port] without a path, query or fragment"
    if parts.scheme == "http" and not allow_insecure_http and not is_loopback_host(host):
        return (
            "plain http:// is refused for a host that is not loopback (the token would cross the network"
            " in clear); use https:// or set allow_insecure_http = true"
        )
    return None


def _optional_path(value: str | Path | None) -> Path | None:
    return None if value is None else Path(value)


@attrs.frozen
class VaultFields:
    """The names of the fields inside the KV secret."""

    access_key_id: str = "access_key_id"
    secret_access_key: str = "secret_access_key"  # noqa: S105 - a field's name, not a secret
    session_token: str = "session_token"  # noqa: S105 - a field's name, not a secret


def _no_proxy(_url: str) -> str | None:
    return None


def _proxy_rule(rule: Callable[[str], str | None] | None) -> Callable[[str], str | None]:
    return _no_proxy if rule is None else rule


def _strip_slash(address: str) -> str:
    return address.rstrip("/")


@attrs.define
class VaultSource:
    """S3 credentials in a Vault KV v2 secret; see the module rules.

    ``proxy_for(url)`` returns the proxy URL for a target URL, or ``None`` for a direct connection (the
    project's proxy rule, spec/proxy.md; ``None``: always direct). ``clock`` is monotonic seconds; tests
    inject one.
    """

    address: str = attrs.field(converter=_strip_slash)
    path: str
    auth: VaultAuth
    mount: str = "secret"
    namespace: str | None = None
    ca_bundle: Path | None = attrs.field(default=None, converter=_optional_path)
    allow_insecure_http: bool = False
    fields: VaultFields = VaultFields()
    proxy_for: Callable[[str], str | None] = attrs.field(default=None, converter=_proxy_rule, repr=False)
    timeout: float = 10.0
    client_cert: Path | None = attrs.field(default=None, converter=_optional_path)
    client_key: Path | None = attrs.field(default=None, converter=_optional_path)
    clock: Callable[[], float] = attrs.field(default=time.monotonic, repr=False)
    name: str = "vault"
    _token: VaultToken | None = attrs.field(default=None, init=False, repr=False, eq=False)
    _client: Any = attrs.field(default=None, init=False, repr=False, eq=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False, eq=False)
    _warned: set[str] = attrs.field(factory=set, init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        problem = vault_address_problem(self.address, allow_insecure_http=self.allow_insecure_http)
        if problem is not None:
            shown = redact_url(self.address, keep_user=False)
            raise ConfigError(f"Vault address {shown!r} is refused: {problem}")
        if (self.client_cert is None) != (self.client_key is None):
            raise ConfigError("a Vault client certificate needs its key, and a key its certificate: set both")
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not (0 < self.timeout <= MAX_SECONDS)
        ):
            raise ConfigError(f"the Vault timeout must be a number of seconds above 0, at most {MAX_SECONDS}")
        self.path = self.path.strip("/")
        self.mount = self.mount.strip("/")
        if not self.path or not self.mount:
            raise ConfigError("the Vault secret path and mount must not be empty")

    # -- the Source port ---------------------------------------------------------------------------------

    def fetch(self) -> Credentials:
        """Log in (or reuse, renew) as needed, read the secret, return its keys. Never absent."""
        with self._lock:
            client = self._client_or_new()
            token = self._usable_token(client)
            denied = False
            try:
                data = self._read(client, token)
            except PermissionDeniedError:
                denied = True
            if denied:
                _log.info("%s: Vault refused the token; logging in again", self.name)
                self._token = None
                token = self._login(client)
                retry_denied = False
                try:
                    data = self._read(client, token)
                except PermissionDeniedError:
                    retry_denied = True
                if retry_denied:
                    raise CredentialsError(
                        f"{self.name}: reading {self._where()} at {self.address} failed: HTTP 403 permission"
                        " denied, also with a fresh token (does the role's policy allow reading it?)",
                        source=self.name,
                    )
        return self._credentials(data)

    def close(self) -> None:
        """Close the HTTP session (the source may still be used: a new one is opened)."""
        with self._lock:
            if self._client is not None:
                self._client.adapter.close()
                self._client = None

    # -- token lifecycle ---------------------------------------------------------------------------------

    def _usable_token(self, client: Any) -> VaultToken:
        action = plan_token(self._token, self.clock())
        if action == "reuse" and self._token is not None:
            return self._token
        if action == "renew" and self._token is not None:
            renewed = self._renew(client, self._token)
            if renewed is not None:
                return renewed
        return self._login(client)

    def _login(self, client: Any) -> VaultToken:
        # No X-Vault-Token on a login: the old token (if any) is not sent along.
        client.token = ""
        self._token = None
        what, login = login_request(self.auth, client, self._secret_from_file)
        token = self._token_from(self._call(what, login), what, previous=None)
        _log.debug(
            "%s: logged in with %s auth; token lease %ss, renewable %s",
            self.name,
            self.auth.method,
            int(token.lease_seconds),
            token.renewable,
        )
        self._token = token
        return token

    def _renew(self, client: Any, token: VaultToken) -> VaultToken | None:
        client.token = token.value
        failure: CredentialsError | None = None
        try:
            response = self._call("renewing the token", client.auth.token.renew_self)
            renewed = self._token_from(response, "renewing the token", previous=token)
        except CredentialsError as exc:
            failure = exc
        if failure is not None:
            _log.info("%s: token renewal failed (%s); logging in again", self.name, failure)
            return None
        _log.debug("%s: renewed the token; lease %ss", self.name, int(renewed.lease_seconds))
        self._token = renewed
        return renewed

    def _token_from(self, response: object, what: str, *, previous: VaultToken | None) -> VaultToken:
        token = token_from_auth(response, now=self.clock(), previous=previous)
        if token is None:
            raise CredentialsError(
                f"{self.name}: {what} at {self.address} returned an unexpected answer (no usable auth block)",
                source=self.name,
            )
        return token

    # -- reading the secret ------------------------------------------------------------------------------

    def _where(self) -> str:
        return f"secret {self.mount}/{self.path}"

    def _read(self, client: Any, token: VaultToken) -> Mapping[str, object]:
        client.token = token.value
        response = self._call(
            f"reading {self._where()}",
            lambda: client.secrets.kv.v2.read_secret_version(
                path=self.path, mount_point=self.mount, raise_on_deleted_version=True
            ),
            reading=True,
        )
        data = response.get("data") if isinstance(response, dict) else None
        secret = data.get("data") if isinstance(data, dict) else None
        if not isinstance(secret, dict):
            raise CredentialsError(
                f"{self.name}: reading {self._where()} at {self.address} returned an unexpected answer"
                " (not a KV v2 secret?)",
                source=self.name,
            )
        metadata = data.get("metadata") if isinstance(data, dict) else None
        version = metadata.get("version") if isinstance(metadata, dict) else None
        _log.debug("%s: read %s version %s", self.name, self._where(), version)
        return secret

    def _credentials(self, secret: Mapping[str, object]) -> Credentials:
        key_id = self._field(secret, self.fields.access_key_id)
        secret_key = self._field(secret, self.fields.secret_access_key)
        if key_id is None or secret_key is None:
            missing = self.fields.access_key_id if key_id is None else self.fields.secret_access_key
            raise CredentialsError(f"{self.name}: {self._where()} has no field {missing!r}", source=self.name)
        token = self._field(secret, self.fields.session_token)
        return Credentials(key_id, secret_key, token, source=self.name)

    def _field(self, secret: Mapping[str, object], key: str) -> str | None:
        value = secret.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            raise CredentialsError(
                f"{self.name}: field {key!r} of {self._where()} is not a string", source=self.name
            )
        return value

    # -- plumbing ----------------------------------------------------------------------------------------

    def _secret_from_file(self, path: Path, what: str, policy: Literal["warn", "allow"]) -> str:
        value = read_secret_file(path, source=self.name, readable_by_others=policy, warned=self._warned)
        if value is None:
            raise CredentialsError(f"{self.name}: {what} file {path} does not exist", source=self.name)
        return value

    def _client_or_new(self) -> Any:
        if self._client is None:
            self._client = self._new_client()
        return self._client

    def _new_client(self) -> Any:
        import hvac

        from ckpt.adapters.proxy import requests_session

        proxy = self.proxy_for(self.address)
        verify: bool | str = str(self.ca_bundle) if self.ca_bundle is not None else True
        # mTLS: the certificate and key files are handed to the TLS library, which reads them at connect.
        cert: tuple[str, str] | tuple[()] = (
            (str(self.client_cert), str(self.client_key))
            if self.client_cert is not None and self.client_key is not None
            else ()
        )
        # The rule decides each request's proxy (whatever proxies hvac passes along); trust_env is off.
        session = requests_session(self.proxy_for)
        session.verify = verify
        if cert:
            session.cert = cert
        session.max_redirects = 0
        session.hooks["response"].append(self._refuse_redirect)
        if proxy:
            _log.debug("%s: reaching %s through proxy %s", self.name, self.address, redact_url(proxy))
        return hvac.Client(
            url=self.address,
            token="",  # never None: hvac would read VAULT_TOKEN or ~/.vault-token
            cert=cert,  # never None: hvac would read VAULT_CLIENT_CERT
            verify=verify,  # never None: hvac would read VAULT_CACERT
            timeout=self.timeout,
            proxies={},  # ignored by the session, which asks the rule; never None
            allow_redirects=False,
            session=session,
            namespace=self.namespace,
        )

    def _refuse_redirect(self, response: Any, *_args: object, **_kwargs: object) -> None:
        status = int(response.status_code)
        if 300 <= status < 400:
            response.close()
            raise CredentialsError(
                f"{self.name}: Vault at {self.address} answered with a redirect (HTTP {status}); redirects"
                " are never followed with a token: set address to the active node or a load balancer",
                source=self.name,
            )

    def _call(self, what: str, operation: Callable[[], _T], *, reading: bool = False) -> _T:
        return call_vault(operation, what=what, source=self.name, address=self.address, reading=reading)
