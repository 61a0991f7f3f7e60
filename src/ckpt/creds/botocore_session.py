"""A botocore session that signs with our credential chain, refreshed through botocore's own mechanism.

Rules for this module:

- The session is *hermetic*: botocore reads no environment variable and no ``~/.aws`` file for it (every
  session variable is reduced to its built-in default, the config and credentials files point at
  ``os.devnull``, configured endpoint URLs are ignored). So ``AWS_PROFILE``, ``AWS_DEFAULT_REGION``,
  ``AWS_ENDPOINT_URL_S3``, ``AWS_CA_BUNDLE`` or a ``[profile]`` in ``~/.aws/config`` cannot redirect, re-key
  or weaken signed requests. Region, endpoint, CA bundle and proxies are passed explicitly by the S3 adapter
  (``ckpt.adapters.s3.client.create_s3_client`` insists on explicit proxies, then routes every request by the
  proxy rule). ``BOTOCORE_EXPERIMENTAL__PLUGINS`` is the one ambient knob botocore offers no way to switch off
  per session.
- The credential resolver holds exactly one provider, backed by our chain. Its credentials are a
  ``DeferredRefreshableCredentials``: nothing is fetched until the first request is signed; afterwards
  botocore asks for a refresh when the *deadline* we gave it passes. The deadline is the earlier of "now +
  ``refresh_seconds``" (the schedule) and a margin before the keys' own expiry.
- When a refresh fails and the last good keys are younger than ``max_staleness_seconds`` (and not expired),
  they are kept, a warning is logged, and the next attempt is ``retry_seconds`` later. Past that, the
  failure is raised to the request that needed the keys.
- ``install_auth_retry``: when S3 answers with an *authentication* error, the credentials are refreshed once
  (forced, with no staleness fallback: the old keys were just rejected) and the request is retried once.
  ``AccessDenied`` is an *authorization* answer (valid keys, a policy says no) and is not retried: new keys
  rarely change a policy decision and retrying every denial would double the traffic of a permanent error.
  A ``HEAD`` answer has no body, so its auth errors carry no code and are not retried either.
- The forced refresh is *single-flight*: each request remembers which generation of keys signed it; when
  several requests are rejected at once, the first forces one refresh and the others, finding that the keys
  changed since they were signed, retry with the new keys instead of refreshing again. So N concurrent
  authentication errors cost one fetch from the chain (one Vault login), not N.
- botocore's debug logging is never switched on here (it prints session tokens).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import botocore.configprovider
import botocore.credentials
import botocore.session

from ckpt.creds.model import SIGNING_SOURCE_FIELD, Credentials, Source
from ckpt.domain.errors import CredentialsError, InvalidError

__all__ = [
    "AUTH_ERROR_CODES",
    "METHOD",
    "ChainCredentials",
    "install_auth_retry",
    "make_botocore_session",
    "next_refresh",
    "stale_deadline",
]

_log = logging.getLogger(__name__)

#: botocore's name for our provider (``Credentials.method``).
METHOD = "ckpt-chain"

#: S3 error codes meaning "these keys are not (or no longer) good": refresh once and retry once.
AUTH_ERROR_CODES = frozenset(
    {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "TokenRefreshRequired"}
)

# Refresh this long before the keys' own expiry (or half their remaining life, if shorter).
_EXPIRY_MARGIN = timedelta(seconds=60)
# Never schedule the next refresh sooner than this after the last one.
_MIN_INTERVAL = timedelta(seconds=1)
# The request-context flag that makes the auth retry happen at most once per request.
_RETRIED = "ckpt_auth_retried"
_SIGNED_GENERATION = "ckpt_signed_generation"  # request context: the key generation that signed it


def _utc_now() -> datetime:
    return datetime.now(UTC)


# -- the decisions (pure) --------------------------------------------------------------------------------


def next_refresh(now: datetime, expiry: datetime | None, refresh_seconds: float) -> datetime:
    """When keys fetched at ``now`` (expiring at ``expiry``, if known) must be fetched again.

    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> next_refresh(t, None, 900) - t, next_refresh(t, t + timedelta(minutes=5), 900) - t
    (datetime.timedelta(seconds=900), datetime.timedelta(seconds=240))
    """
    deadline = now + timedelta(seconds=refresh_seconds)
    if expiry is not None:
        margin = min(_EXPIRY_MARGIN, (expiry - now) / 2)
        deadline = min(deadline, expiry - margin)
    return max(deadline, now + _MIN_INTERVAL)


def stale_deadline(
    now: datetime,
    last_good: Credentials | None,
    last_good_at: datetime | None,
    *,
    max_staleness_seconds: float,
    retry_seconds: float,
) -> datetime | None:
    """After a failed refresh: until when the last good keys may still be used, or ``None`` (they may not).

    They may while they are younger than the maximum staleness and not expired; the returned deadline is
    also the next refresh attempt (no later than ``retry_seconds`` from now).
    """
    if last_good is None or last_good_at is None:
        return None
    limit = last_good_at + timedelta(seconds=max_staleness_seconds)
    if last_good.expiry is not None:
        limit = min(limit, last_good.expiry)
    if now >= limit:
        return None
    return min(now + timedelta(seconds=retry_seconds), limit)


# -- the shell -------------------------------------------------------------------------------------------


@attrs.define
class _Refresher:
    """Fetches from the chain for botocore, remembering the last good keys for the staleness rule."""

    chain: Source
    refresh_seconds: float
    max_staleness_seconds: float
    retry_seconds: float
    clock: Callable[[], datetime]
    last_good: Credentials | None = None
    last_good_at: datetime | None = None

    def metadata(self, *, forced: bool) -> dict[str, Any]:
        now = self.clock()
        failure: CredentialsError | None = None
        found: Credentials | None = None
        try:
            found = self.chain.fetch()
        except CredentialsError as exc:
            failure = exc
        if failure is None:
            if found is None:
                failure = CredentialsError(f"credential source {self.chain.name!r} found no credentials")
            elif found.expiry is not None and found.expiry <= now:
                failure = CredentialsError(
                    f"{found.source}: the credentials it returned expired at {found.expiry.isoformat()}",
                    source=found.source,
                )
        if failure is not None or found is None:
            return self._keep_last_good(now, failure, forced=forced)
        fresh = self.last_good is None or self.last_good.access_key_id != found.access_key_id
        self.last_good, self.last_good_at = found, now
        deadline = next_refresh(now, found.expiry, self.refresh_seconds)
        _log.log(
            logging.INFO if fresh else logging.DEBUG,
            "credentials from %s (access key id %s); next refresh at %s",
            found.source,
            found.access_key_id,
            deadline.isoformat(timespec="seconds"),
        )
        return _botocore_metadata(found, deadline)

    def _keep_last_good(
        self, now: datetime, failure: CredentialsError | None, *, forced: bool
    ) -> dict[str, Any]:
        error = failure or CredentialsError("credential refresh failed")
        until = None
        if not forced:
            until = stale_deadline(
                now,
                self.last_good,
                self.last_good_at,
                max_staleness_seconds=self.max_staleness_seconds,
                retry_seconds=self.retry_seconds,
            )
        if until is None or self.last_good is None or self.last_good_at is None:
            raise error
        _log.warning(
            "credential refresh failed (%s); still signing with the keys from %s fetched %ds ago"
            " (maximum staleness %ds); next attempt at %s",
            error,
            self.last_good.source,
            int((now - self.last_good_at).total_seconds()),
            int(self.max_staleness_seconds),
            until.isoformat(timespec="seconds"),
        )
        return _botocore_metadata(self.last_good, until)


def _botocore_metadata(credentials: Credentials, deadline: datetime) -> dict[str, Any]:
    # botocore's refresh contract: these four keys; the expiry we give is our refresh deadline.
    return {
        "access_key": credentials.access_key_id,
        "secret_key": credentials.secret_access_key,
        "token": credentials.session_token,
        "expiry_time": deadline.isoformat(),
    }


class ChainCredentials(botocore.credentials.DeferredRefreshableCredentials):  # type: ignore[misc]
    """botocore refreshable credentials backed by our chain, with a forced refresh for the auth retry.

    botocore refreshes when the deadline passes (its advisory and mandatory windows are zero here: the
    margin before the keys' real expiry is already in our deadline). Obtain it with
    ``session.get_credentials()`` on a session from :func:`make_botocore_session`.
    """

    _advisory_refresh_timeout = 0
    _mandatory_refresh_timeout = 0

    def __init__(self, refresher: _Refresher, time_fetcher: Callable[[], datetime]) -> None:
        self._refresher = refresher
        self._forced = threading.Event()
        self._single_flight = threading.Lock()
        self._generation = 0  # how many times keys were fetched; a request remembers the one that signed it
        super().__init__(refresh_using=self._refresh_from_chain, method=METHOD, time_fetcher=time_fetcher)

    @property
    def generation(self) -> int:
        """Counts the fetches from the chain: keys signed at one generation are replaced at the next."""
        return self._generation

    def refresh_needed(self, refresh_in: float | None = None) -> bool:
        """botocore's question "refresh now?"; always yes while a forced refresh is pending."""
        if self._forced.is_set():
            return True
        return bool(super().refresh_needed(refresh_in))

    @property
    def source(self) -> str | None:
        """The name of the source the current keys came from, or ``None`` before the first fetch."""
        last = self._refresher.last_good
        return last.source if last is not None else None

    def force_refresh(self, rejected_generation: int | None = None) -> None:
        """Fetch from the chain now (no staleness fallback); raise ``CredentialsError`` when that fails.

        ``rejected_generation`` is the generation of the keys S3 rejected: when the keys were refreshed since
        (another thread's forced refresh, or the schedule), nothing is fetched (module rules: single flight).
        """
        with self._single_flight:
            if rejected_generation is not None and rejected_generation != self._generation:
                return
            self._forced.set()
            try:
                self.get_frozen_credentials()
            finally:
                self._forced.clear()

    def _refresh_from_chain(self) -> dict[str, Any]:
        # Called by botocore under its refresh lock. Clear the flag first: botocore checks
        # refresh_needed(0) right after this returns, to detect keys that are still expired.
        forced = self._forced.is_set()
        self._forced.clear()
        metadata = self._refresher.metadata(forced=forced)
        self._generation += 1
        return metadata


class _ChainProvider(botocore.credentials.CredentialProvider):  # type: ignore[misc]
    METHOD = METHOD
    CANONICAL_NAME = "custom-ckpt-chain"  # botocore asks third-party providers to start with "custom"

    def __init__(self, credentials: ChainCredentials) -> None:
        super().__init__()
        self._credentials = credentials

    def load(self) -> ChainCredentials:
        return self._credentials


def _hermetic_session_vars() -> dict[str, tuple[Any, Any, Any, Any]]:
    # Each session variable is (config-file name, environment variable(s), default, conversion). Keeping
    # only the default means neither the environment nor a config file is consulted.
    variables: Mapping[str, tuple[Any, Any, Any, Any]] = botocore.session.Session.SESSION_VARIABLES
    hermetic = {name: (None, None, spec[2], spec[3]) for name, spec in variables.items()}
    hermetic["config_file"] = (None, None, os.devnull, None)
    hermetic["credentials_file"] = (None, None, os.devnull, None)
    return hermetic


def make_botocore_session(
    chain: Source,
    *,
    refresh_seconds: float = 900.0,
    max_staleness_seconds: float = 3600.0,
    retry_seconds: float = 60.0,
    clock: Callable[[], datetime] = _utc_now,
) -> botocore.session.Session:
    """Return a hermetic botocore session whose only credential provider is ``chain`` (see module rules).

    ``clock`` returns timezone-aware "now" (tests inject one); it drives both our schedule and botocore's
    expiry checks. Nothing is fetched until the first request is signed.
    """
    for label, value in (
        ("refresh_seconds", refresh_seconds),
        ("max_staleness_seconds", max_staleness_seconds),
        ("retry_seconds", retry_seconds),
    ):
        if value <= 0:
            raise InvalidError(f"{label} must be greater than 0, got {value!r}")
    session = botocore.session.Session(session_vars=_hermetic_session_vars())
    session.set_config_variable("ignore_configured_endpoint_urls", True)
    store = session.get_component("config_store")
    # The [s3] and proxies sections read AWS_S3_* variables and the config file; the adapter passes a Config.
    store.set_config_provider("s3", botocore.configprovider.ConstantProvider(None))
    store.set_config_provider("proxies_config", botocore.configprovider.ConstantProvider(None))
    refresher = _Refresher(
        chain=chain,
        refresh_seconds=refresh_seconds,
        max_staleness_seconds=max_staleness_seconds,
        retry_seconds=retry_seconds,
        clock=clock,
    )
    credentials = ChainCredentials(refresher, time_fetcher=clock)
    session.register_component(
        "credential_provider", botocore.credentials.CredentialResolver([_ChainProvider(credentials)])
    )
    return session


def install_auth_retry(client: Any, refreshable: ChainCredentials) -> None:
    """Make ``client`` refresh ``refreshable`` once and retry once when S3 rejects the keys (module rules)."""

    def on_request_created(request: Any = None, **_kwargs: Any) -> None:
        # Runs after the signer (registered last): the generation of the keys that just signed the request.
        # A refresh racing in between only makes the number newer, and then the retry uses the newer keys.
        context = getattr(request, "context", None)
        if isinstance(context, dict):
            context[_SIGNED_GENERATION] = refreshable.generation

    def on_needs_retry(
        response: Any = None,
        caught_exception: BaseException | None = None,
        request_dict: dict[str, Any] | None = None,
        operation: Any = None,
        **_kwargs: Any,
    ) -> int | None:
        if caught_exception is not None or response is None or request_dict is None:
            return None
        http_response, parsed = response
        error = parsed.get("Error") if isinstance(parsed, dict) else None
        code = error.get("Code") if isinstance(error, dict) else None
        if http_response.status_code not in (400, 403) or code not in AUTH_ERROR_CODES:
            return None
        source = refreshable.source
        if source is not None and isinstance(error, dict):
            error[SIGNING_SOURCE_FIELD] = source  # which source's keys S3 refused, for the error to name
        context = request_dict.setdefault("context", {})
        if context.get(_RETRIED):
            return None
        context[_RETRIED] = True
        _log.warning(
            "S3 answered %s to %s; refreshing the credentials and retrying once",
            code,
            getattr(operation, "name", "a request"),
        )
        refreshable.force_refresh(context.get(_SIGNED_GENERATION))
        return 0  # retry now; botocore re-signs the retried request with the refreshed keys

    client.meta.events.register_last(
        "request-created.s3", on_request_created, unique_id="ckpt-signed-generation"
    )
    client.meta.events.register("needs-retry.s3", on_needs_retry, unique_id="ckpt-auth-retry")
