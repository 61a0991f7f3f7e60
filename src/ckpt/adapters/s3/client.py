"""Building the S3 client from the configuration, with nothing left to the environment (docs/spec/config.md).

Region (default ``us-east-1``), endpoint, addressing style, timeouts, retries (botocore's standard mode,
``max_attempts`` in total, for every request whose answer fails: 5xx, throttling, a dropped connection, a
read timeout, an answer cut short), CA bundle and proxies are all explicit, so neither the ambient ``AWS_*``
variables nor ``~/.aws/config`` can redirect a signed request. The client signs with the configured
credential chain through the hermetic session of :mod:`ckpt.creds.botocore_session`, which also retries a
request once after a forced refresh when S3 rejects the keys. botocore's debug logging is never switched on.

boto3 and botocore are imported inside functions only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ckpt.adapters.proxy import ProxyRoutes, route_botocore_client
from ckpt.adapters.s3.errors import botocore_errors, endpoint_of
from ckpt.domain.errors import CkptError, InvalidError
from ckpt.domain.proxy import ProxyRule, is_cgi
from ckpt.domain.redaction import redact_url

if TYPE_CHECKING:
    import botocore.config
    import botocore.session

    from ckpt.config import Config
    from ckpt.creds.model import Source

__all__ = ["S3Connection", "connect_s3", "create_s3_client", "make_s3_client"]

_DEFAULT_REGION = "us-east-1"


class S3Connection:
    """How :func:`make_s3_client` connected: the endpoint, the proxy routes taken, the signing credentials.

    ``doctor`` reports from it; nothing here shows a secret (proxy URLs are redacted, the routes' rule has a
    redacted repr, and the credentials object only names its source).
    """

    __slots__ = ("_credentials", "_routes", "endpoint")

    def __init__(self, endpoint: str, routes: ProxyRoutes, credentials: Any) -> None:
        self.endpoint = endpoint
        self._routes = routes
        self._credentials = credentials

    def __repr__(self) -> str:
        return f"S3Connection(endpoint={self.endpoint!r}, routes={self.routes()!r})"

    def routes(self) -> dict[str, str | None]:
        """Each origin the client has sent a request to, and its proxy (redacted) or ``None`` for direct."""
        return {origin: redact_url(p) if p else None for origin, p in self._routes.seen().items()}

    def proxy_for(self, url: str) -> str | None:
        """The proxy (in clear: for a connection, not for display) the client would take to ``url``."""
        return self._routes.rule.proxy_for(url)

    @property
    def credentials_source(self) -> str | None:
        """The name of the credential source that answered last (``None`` before the first request)."""
        source: str | None = getattr(self._credentials, "source", None)
        return source


def create_s3_client(
    session: botocore.session.Session,
    *,
    region_name: str,
    endpoint_url: str | None,
    config: botocore.config.Config,
    verify: bool | str | None = None,
    proxy_routes: ProxyRoutes | None = None,
) -> Any:
    """Create an S3 client on a :func:`make_botocore_session` session, with the auth retry installed.

    ``region_name`` and ``endpoint_url`` are explicit (``None`` means AWS's own endpoint for the region,
    never one from the environment). ``config.proxies`` must be set (``{}``): left unset, botocore would
    read ``HTTPS_PROXY`` behind the proxy rule's back. Every request then takes the route
    ``proxy_routes`` decides for its own URL (:func:`ckpt.adapters.proxy.route_botocore_client`);
    ``None`` sends every request direct.
    """
    from ckpt.creds.botocore_session import ChainCredentials, install_auth_retry

    if config.proxies is None:
        raise InvalidError("the S3 client's proxies must be explicit (use {} for a direct connection)")
    credentials = session.get_credentials()
    if not isinstance(credentials, ChainCredentials):
        raise InvalidError("create_s3_client needs a session made by make_botocore_session")
    client = session.create_client(
        "s3", region_name=region_name, endpoint_url=endpoint_url, config=config, verify=verify
    )
    route_botocore_client(client, proxy_routes or ProxyRoutes(ProxyRule()))
    install_auth_retry(client, credentials)
    return client


def _proxy_rule(config: Config, environ: Mapping[str, str]) -> ProxyRule:
    """The one proxy rule (docs/spec/proxy.md): the ``[proxy]`` table when present (it replaces the
    environment), else the environment. The CGI guard always reads ``environ``."""
    if config.proxy is not None:
        return ProxyRule.from_config(config.proxy, cgi=is_cgi(environ))
    return ProxyRule.from_environment(environ)


def _botocore_session(
    config: Config, environ: Mapping[str, str], rule: ProxyRule, credentials: Source | None = None
) -> Any:
    """Return the hermetic botocore session the S3 client signs with: its only credential provider is the
    configured chain (docs/spec/credentials.md), refreshed on schedule and at expiry. With no
    ``[[credentials]]`` tables the chain is botocore's own default chain behind the same refresh logic. The
    Vault source, if any, reaches Vault through the same proxy rule as S3.
    """
    from ckpt.creds.botocore_session import make_botocore_session  # botocore only for S3 roots
    from ckpt.creds.config import chain_from_config

    # A source built in code (open_store(credentials=...)) replaces the [[credentials]] chain.
    chain = (
        credentials
        if credentials is not None
        else chain_from_config(list(config.credentials), environ, proxy_for=rule.proxy_for)
    )
    return make_botocore_session(
        chain,
        refresh_seconds=config.s3.refresh_seconds,
        max_staleness_seconds=config.s3.max_staleness_seconds,
    )


def connect_s3(
    config: Config, environ: Mapping[str, str], credentials: Source | None = None
) -> tuple[Any, S3Connection]:
    """Build the S3 client from ``config`` and say how it connects (see :func:`make_s3_client`)."""
    import botocore.config  # lazily: botocore only when an S3 store is opened

    s3 = config.s3
    region = s3.region or _DEFAULT_REGION
    endpoint = s3.endpoint_url
    effective_endpoint = endpoint or f"https://s3.{region}.amazonaws.com"
    rule = _proxy_rule(config, environ)
    # Every request is decided for its own URL (route_botocore_client); asking once for the endpoint now
    # makes a CGI refusal or a malformed endpoint fail here, before any credential lookup.
    rule.proxy_for(effective_endpoint)
    routes = ProxyRoutes(rule)
    client_config = botocore.config.Config(
        region_name=region,
        connect_timeout=s3.connect_timeout,
        read_timeout=s3.read_timeout,
        retries={"total_max_attempts": s3.max_attempts, "mode": "standard"},
        s3={
            "addressing_style": s3.addressing_style,
            "use_accelerate_endpoint": False,
            "use_dualstack_endpoint": False,
        },
        proxies={},  # never None: botocore would read HTTP(S)_PROXY; the rule routes every request
        ignore_configured_endpoint_urls=True,
        use_fips_endpoint=False,
        use_dualstack_endpoint=False,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = _botocore_session(config, environ, rule, credentials)
    errors = botocore_errors()
    try:
        client = create_s3_client(
            session,
            region_name=region,
            endpoint_url=endpoint,
            config=client_config,
            verify=s3.ca_bundle or True,
            proxy_routes=routes,
        )
    except CkptError:
        raise  # ours (InvalidError is a ValueError too): already says what is wrong, keep it as it is
    except errors.BotoCoreError as exc:
        failure = InvalidError(f"cannot build the S3 client from the [s3] settings ({type(exc).__name__})")
    except ValueError:  # botocore refuses a malformed endpoint URL with ValueError (its text shows the URL)
        failure = InvalidError(f"s3.endpoint_url {endpoint_of(endpoint)!r} is not a valid endpoint URL")
    else:
        return client, S3Connection(endpoint_of(effective_endpoint), routes, session.get_credentials())
    raise failure


def make_s3_client(config: Config, environ: Mapping[str, str]) -> Any:
    """Return a boto3-compatible S3 client built from ``config.s3``, with nothing left to the environment.

    Region (default ``us-east-1``), endpoint, addressing style, timeouts, retries (standard mode,
    ``max_attempts`` in total), CA bundle and proxies are all explicit; configured endpoint URLs from
    ``AWS_ENDPOINT_URL*`` or ``~/.aws/config`` are ignored, as are FIPS, dual-stack and acceleration
    switches. Request checksums are sent only where S3 requires them, which S3-compatible stores accept.
    It signs with the credential chain (:func:`_botocore_session`) and retries once after a forced refresh
    when S3 rejects the keys.
    """
    return connect_s3(config, environ)[0]
