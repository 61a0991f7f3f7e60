"""The publication log on S3-compatible object storage (SPEC §4), through an injected boto3 client.

A root is ``s3://BUCKET`` or ``s3://BUCKET/PREFIX``; every key below lives under ``PREFIX/`` (or at the top of
the bucket). The layout is the POSIX one: ``exec/<attempt>/...`` for saves, ``pub/<entry name>`` for entries.

Rules this adapter keeps:

1. Publish is two requests: one ``ListObjectsV2`` (``MaxKeys=1``) under ``<save>/`` proves the save exists
   (when it finds nothing, one ``HeadObject`` of ``<save>`` tells a file, which is not a save, from nothing),
   then ``PutObject`` of an empty body with ``If-None-Match: *`` creates the entry exclusively. ``412
   PreconditionFailed`` means the entry exists: ``ExistsError``. ``409 ConditionalRequestConflict`` (a
   concurrent conditional write to the same key) is retried a bounded number of times. A ``PutObject`` that
   S3 acknowledged is durable, so nothing more is needed. docs/adr/0007-s3-conditional-create.md explains why
   a retried put meeting its own earlier success, reported as ``ExistsError``, is safe.
2. Reads list ``pub/`` with ``Delimiter='/'``, 1000 keys a page, and nothing else: ``resolve`` over n entries
   costs ceil(n/1000) requests (at least one). A common prefix inside ``pub/`` is a sub-folder: malformed. The
   zero-byte ``pub/`` marker some consoles create is ``pub/`` itself, not a name inside it, and is ignored.
   Listing order is never trusted; the bulk parsers of ``ckpt.domain.names`` order and validate.
3. Prune carries out the domain's plan: ``DeleteObjects`` (quiet, at most 1000 keys a request) for the
   entries, a fresh listing of ``pub/``, then for each candidate folder no remaining entry overlaps, a listing
   of ``<folder>/`` and ``DeleteObjects`` of what it found. A folder with no object left is skipped as
   "already gone". Keys S3 refuses inside a ``DeleteObjects`` answer are never hidden: refused entries stop
   the prune before any folder is touched (they are still published, so they still protect their folders);
   refused objects of a folder are collected while the other folders are still removed, then raised together
   as one ``StorageError`` listing them. A key reported ``NoSuchKey`` is gone, which is what was asked.
   Every planned entry is reported removed: S3 deletes are idempotent and do not say whether a key existed
   (POSIX can leave out an entry another pruner removed first; here it is listed).
4. Every botocore error is translated at one boundary (:func:`_s3_errors`, with the code table
   ``_CLIENT_CODES``) into ``ckpt.domain.errors``, naming the action, the ``s3://`` location and the S3 error
   code. The response body (S3's message, and for a signature mismatch the canonical request, which carries
   the session token) is dropped and the vendor exception is not chained. No ``ClientError`` leaves here.
5. boto3 and botocore are imported inside functions only, so importing this module costs nothing; the store
   itself receives its client ready-made (:class:`S3Store`), and :func:`open_s3_store` builds one from the
   configuration with region, endpoint, retries, proxies and CA bundle all explicit, so neither the ambient
   ``AWS_*`` variables nor ``~/.aws/config`` can redirect a signed request. botocore's debug logging is never
   switched on here.
6. Retries are botocore's (standard mode, ``max_attempts`` in total) for every request whose answer fails:
   5xx, throttling, a dropped connection, a read timeout, an answer cut short. The one answer botocore cannot
   retry is a ``GetObject`` body, read after the call has returned, so ``read_file`` sends the request again
   itself when the body breaks off (``_BODY_ATTEMPTS`` in all).
7. A file inside a save is the object at exactly its key (``ckpt.domain.saves``): objects under ``name/``
   make a folder, not the file ``name``. ``read_file`` reads at most 64 MiB: the size S3 announces is
   checked before the body is read, and the body is read no further than one byte past the cap.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import attrs

from ckpt.adapters.proxy import ProxyRoutes
from ckpt.domain.arguments import require_bool, require_instance, require_int, require_str
from ckpt.domain.entries import PINS_DIR_NAME, PUB_DIR_NAME, Entry, exec_save_prefix, validate_save
from ckpt.domain.errors import (
    CkptError,
    CredentialsError,
    ExistsError,
    InvalidError,
    MalformedError,
    NotFoundError,
    StorageError,
)
from ckpt.domain.names import MAX_NAME_BYTES, format_entry_name, latest_entry_name, parse_entry_names
from ckpt.domain.ports import FileInfo, Folder, PruneResult, SkippedFolder
from ckpt.domain.proxy import ProxyRule, is_cgi
from ckpt.domain.prune import Overlap
from ckpt.domain.redaction import redact_url
from ckpt.domain.retention import SKIP_PINNED, SKIP_PUBLISHED, plan_retention
from ckpt.domain.saves import MAX_READ_BYTES, SaveKind, check_save_kind, too_large, validate_file_name
from ckpt.pins import pin_entry, pinned_entries, unpin_entry

if TYPE_CHECKING:
    from ckpt.config import Config
    from ckpt.domain.follow import Followed, StopSignal

__all__ = [
    "MAX_PREFIX_BYTES",
    "PAGE_SIZE",
    "ExclusiveCreateProbe",
    "S3Client",
    "S3Root",
    "S3Store",
    "make_s3_client",
    "open_s3_store",
    "parse_s3_root",
]

PAGE_SIZE = 1000  # ListObjectsV2 returns at most 1000 keys a page; DeleteObjects takes at most 1000 keys
_MAX_KEY_BYTES = 1024  # S3's limit on a key
# The longest prefix that still leaves room for "/pub/" and a 255-byte entry name inside one key.
MAX_PREFIX_BYTES = _MAX_KEY_BYTES - len(f"/{PUB_DIR_NAME}/") - MAX_NAME_BYTES
# Outside pub/ and exec/, so a probe object can never look like an entry or a save.
_PROBE_DIR = ".ckpt-doctor"
_DEFAULT_REGION = "us-east-1"
# 409 ConditionalRequestConflict: another conditional write to the key is in flight; it settles quickly.
_CONFLICT_ATTEMPTS = 4
_CONFLICT_BACKOFF_SECONDS = 0.1  # doubled after every conflict: 0.1, 0.2, 0.4
_MAX_KEYS_IN_MESSAGE = 10
# A GetObject whose body breaks off mid-stream is sent again, this many times in all (module rule 6).
_BODY_ATTEMPTS = 3

_PRECONDITION_FAILED = "PreconditionFailed"
_CONDITIONAL_CONFLICT = "ConditionalRequestConflict"
_NOT_IMPLEMENTED = "NotImplemented"
_CreateOutcome = Literal["created", "exists", "unsupported"]
_MISSING_OBJECT_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


# -- the root URL ----------------------------------------------------------------------------------------

# General-purpose bucket names: 3-63 characters of a-z 0-9 . -, starting and ending with a letter or digit.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
# Directory buckets end in "--x-s3" and are accepted; these suffixes name access points and aliases instead.
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--table-s3")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@attrs.frozen
class S3Root:
    """A parsed root: the bucket and the key prefix (``""``, or ending in ``/``) every key starts with."""

    bucket: str
    prefix: str

    @property
    def url(self) -> str:
        """The root in its canonical form: ``s3://bucket`` or ``s3://bucket/prefix``."""
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")


def _bucket_error(bucket: str) -> str | None:
    if not 3 <= len(bucket) <= 63:
        return f"bucket name {bucket!r} must be 3 to 63 characters long"
    if _BUCKET.fullmatch(bucket) is None:
        return (
            f"bucket name {bucket!r} may hold only lower-case letters, digits, '.' and '-', "
            "and must start and end with a letter or digit"
        )
    if ".." in bucket:
        return f"bucket name {bucket!r} has two adjacent periods"
    with contextlib.suppress(ValueError):
        ipaddress.IPv4Address(bucket)
        return f"bucket name {bucket!r} is formatted as an IP address"
    if bucket.startswith(_BUCKET_RESERVED_PREFIXES) or bucket.endswith(_BUCKET_RESERVED_SUFFIXES):
        return f"bucket name {bucket!r} uses a prefix or suffix S3 reserves"
    return None


def _prefix_error(prefix: str) -> str | None:
    if _CONTROL.search(prefix):
        return "the prefix contains NUL or an ASCII control character"
    try:
        size = len(prefix.encode("utf-8"))
    except UnicodeEncodeError:
        return "the prefix is not valid UTF-8"
    if size > MAX_PREFIX_BYTES:
        return f"the prefix is {size} bytes long; at most {MAX_PREFIX_BYTES} leave room for entry keys"
    elements = prefix.split("/")
    if "" in elements:
        return "the prefix has an empty path element ('//')"
    if "." in elements or ".." in elements:
        return "the prefix has a '.' or '..' path element (not clean)"
    return None


def parse_s3_root(root: str) -> S3Root:
    """Parse ``s3://BUCKET`` or ``s3://BUCKET/PREFIX`` strictly; raise :class:`InvalidError` naming the URL.

    The bucket must follow S3's naming rules; the prefix must be clean (no empty, ``.`` or ``..`` element, no
    control character). One trailing ``/`` is allowed and dropped. A query, a fragment, user-info or a port
    is refused; user-info is redacted from the message.

    >>> parse_s3_root("s3://ml-checkpoints/team-a/run-42")
    S3Root(bucket='ml-checkpoints', prefix='team-a/run-42/')
    """
    if not isinstance(root, str) or not root.startswith("s3://"):
        quoted = redact_url(root, keep_user=False) if isinstance(root, str) else root
        raise InvalidError(f"root {quoted!r} is not an s3:// URL")
    shown = redact_url(root, keep_user=False)

    def invalid(why: str) -> InvalidError:
        return InvalidError(f"root {shown!r} is not a valid S3 root: {why}")

    rest = root[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if "@" in bucket:
        raise invalid("user-info is not allowed (credentials never go into the root URL)")
    if "?" in root or "#" in root:
        raise invalid("a query or fragment is not allowed")
    if not bucket:
        raise invalid("the bucket name is empty")
    if ":" in bucket:
        raise invalid("a port is not allowed (set s3.endpoint_url in the configuration file)")
    reason = _bucket_error(bucket)
    if reason is not None:
        raise invalid(reason)
    if prefix.endswith("/"):
        prefix = prefix[:-1]
    if prefix:
        reason = _prefix_error(prefix)
        if reason is not None:
            raise invalid(reason)
        prefix += "/"
    return S3Root(bucket, prefix)


# -- the client port and the error boundary --------------------------------------------------------------


class S3Client(Protocol):
    """The calls the store makes on a boto3 S3 client (keyword arguments and answers as boto3 has them)."""

    def list_objects_v2(self, **kwargs: Any) -> dict[str, Any]: ...
    def put_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_objects(self, **kwargs: Any) -> dict[str, Any]: ...
    def delete_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def get_object(self, **kwargs: Any) -> dict[str, Any]: ...
    def head_object(self, **kwargs: Any) -> dict[str, Any]: ...


def _botocore_errors() -> Any:
    """Return ``botocore.exceptions``, imported on first use (never when this module is imported)."""
    import botocore.exceptions  # lazily: botocore only when an S3 store is used

    return botocore.exceptions


def _client_error_code(exc: Any) -> tuple[str, int]:
    """Return the S3 error code and HTTP status of a ``ClientError`` (``""``/``0`` when absent)."""
    response = exc.response if isinstance(getattr(exc, "response", None), dict) else {}
    code = str(response.get("Error", {}).get("Code", "") or "")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return code, status if isinstance(status, int) else 0


# S3 error code -> (kind, why). The kind picks our error class; the text says what it means for the operator.
_CLIENT_CODES: dict[str, tuple[str, str]] = {
    "NoSuchBucket": ("missing-bucket", "the bucket does not exist"),
    "NoSuchKey": ("missing", "no such object"),
    "NotFound": ("missing", "not found"),
    "404": ("missing", "not found"),
    "AccessDenied": ("storage", "access denied"),
    "403": ("storage", "access denied"),
    "AllAccessDisabled": ("storage", "all access to the bucket is disabled"),
    "AccountProblem": ("storage", "the account has a problem that prevents the operation"),
    "InvalidAccessKeyId": ("credentials", "S3 does not know the access key id"),
    "SignatureDoesNotMatch": ("credentials", "S3 refused the request signature (wrong secret key?)"),
    "ExpiredToken": ("credentials", "the session token has expired"),
    "TokenRefreshRequired": ("credentials", "the session token must be refreshed"),
    "InvalidToken": ("credentials", "the session token is malformed or invalid"),
    "RequestTimeTooSkewed": ("storage", "the local clock is too far from the server's"),
    "PermanentRedirect": ("storage", "the bucket is served elsewhere (set s3.region or s3.endpoint_url)"),
    "AuthorizationHeaderMalformed": (
        "storage",
        "the request was signed for another region (set s3.region)",
    ),
    _PRECONDITION_FAILED: ("storage", "the object already exists"),
    _CONDITIONAL_CONFLICT: ("storage", "a concurrent conditional write to the same key kept conflicting"),
    _NOT_IMPLEMENTED: ("storage", "the storage does not implement this request"),
    "SlowDown": ("storage", "the storage kept throttling the requests"),
    "ServiceUnavailable": ("storage", "the storage is unavailable"),
    "InternalError": ("storage", "the storage failed internally"),
    "RequestTimeout": ("storage", "the storage timed out reading the request"),
}

_CREDENTIAL_ERRORS = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "NoAuthTokenError",
    "TokenRetrievalError",
    "SSOError",
    "RefreshWithMFAUnsupportedError",
    "MetadataRetrievalError",
)


def _endpoint_of(url: object) -> str:
    """Return ``scheme://host[:port]`` of a URL: no user-info, path or query (they may carry request data)."""
    if not isinstance(url, str) or not url:
        return "the S3 endpoint"
    # Redacted first: a scheme-less "key:secret@host" would otherwise pass its user name off as a scheme.
    url = redact_url(url, keep_user=False)
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # an unparsable port: show no more than the scheme
        return f"{url.partition(':')[0]}://?"
    if ":" in host:
        host = f"[{host}]"
    return f"{parts.scheme}://{host}{port}"


def _translate_client_error(exc: Any, action: str, location: str, bucket: str) -> CkptError:
    code, status = _client_error_code(exc)
    kind, why = _CLIENT_CODES.get(code) or _CLIENT_CODES.get(str(status)) or ("storage", "S3 refused it")
    if kind == "storage" and code not in _CLIENT_CODES and status >= 500:
        why = "the storage failed"
    detail = f"{code or 'no error code'}, HTTP {status or '?'}"
    if kind == "missing-bucket":
        return NotFoundError(
            f"cannot {action} {location}: the bucket {bucket!r} does not exist ({detail})",
            location=f"s3://{bucket}",
        )
    if kind == "missing":
        return NotFoundError(f"cannot {action} {location}: {why} ({detail})", location=location)
    if kind == "credentials":
        return CredentialsError(f"cannot {action} {location}: {why} ({detail})", source=None)
    return StorageError(f"cannot {action} {location}: {why} ({detail})", location=location)


def _translate_botocore_error(exc: Any, errors: Any, action: str, location: str) -> CkptError:
    name = type(exc).__name__
    kwargs = getattr(exc, "kwargs", {}) or {}
    prefix = f"cannot {action} {location}"
    if any(isinstance(exc, getattr(errors, n, ())) for n in _CREDENTIAL_ERRORS):
        return CredentialsError(f"{prefix}: no usable S3 credentials ({name})", source=None)
    if isinstance(exc, errors.ProxyConnectionError):
        # urllib3 reports any failure on a plain-HTTP proxied connection this way, a connection the proxy
        # dropped mid-request as well as one it refused: say both.
        proxy = _endpoint_of(kwargs.get("proxy_url"))
        return StorageError(
            f"{prefix}: cannot connect to the proxy {proxy}, or it closed the connection ({name})",
            location=location,
        )
    endpoint = _endpoint_of(kwargs.get("endpoint_url"))
    if isinstance(exc, errors.SSLError):
        # The TLS reason (such as CERTIFICATE_VERIFY_FAILED) is what an operator needs; it holds no secret.
        reason = str(kwargs.get("error", "")).splitlines()[0] if kwargs.get("error") else ""
        return StorageError(f"{prefix}: TLS with {endpoint} failed ({name}: {reason})", location=location)
    if isinstance(exc, errors.ConnectTimeoutError):
        why = f"connecting to {endpoint} timed out"
    elif isinstance(exc, errors.ReadTimeoutError):
        why = f"{endpoint} did not answer in time"
    elif isinstance(exc, errors.EndpointConnectionError):
        why = f"cannot connect to {endpoint}"
    elif isinstance(exc, errors.ConnectionClosedError):
        why = f"{endpoint} closed the connection"
    elif isinstance(exc, errors.ResponseStreamingError | errors.IncompleteReadError):
        why = "the storage's answer was cut short"
    elif isinstance(exc, errors.ParamValidationError):
        why = "botocore refused the request parameters"
    else:
        why = "the S3 client failed"
    return StorageError(f"{prefix}: {why} ({name})", location=location)


@contextlib.contextmanager
def _s3_errors(action: str, location: str, bucket: str) -> Iterator[None]:
    """Translate every botocore error raised inside into ours (module rule 4).

    ``action`` is a verb phrase ("publish", "list the publication log"), ``location`` the ``s3://`` URL the
    request was about. Our own errors (such as a credential chain's ``CredentialsError`` raised during a
    refresh) pass through untouched.
    """
    errors = _botocore_errors()
    try:
        yield
    except errors.ClientError as exc:
        translated = _translate_client_error(exc, action, location, bucket)
    except errors.BotoCoreError as exc:
        translated = _translate_botocore_error(exc, errors, action, location)
    else:
        return
    # The vendor exception (and its response, which may echo the signed request) must not ride along: not as
    # __cause__ (no `from`), and not as __context__, which Python sets because a `with` block's exception is
    # still being handled while this generator runs; it is cleared as the error leaves.
    try:
        raise translated
    finally:
        translated.__context__ = None


# -- the store -------------------------------------------------------------------------------------------


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


@attrs.frozen
class ExclusiveCreateProbe:
    """What :meth:`S3Store.probe_exclusive_create` found: whether exclusive create is honoured, and why."""

    honoured: bool
    location: str
    detail: str


def _failed_keys_text(failed: Sequence[tuple[str, str]], url_of: Callable[[str], str]) -> str:
    """Return "url (code), ..." for the first few refused keys, and how many more there are."""
    shown = ", ".join(f"{url_of(key)} ({code})" for key, code in failed[:_MAX_KEYS_IN_MESSAGE])
    more = len(failed) - _MAX_KEYS_IN_MESSAGE
    return shown + (f", and {more} more" if more > 0 else "")


class S3Store:
    """A checkpoint root in a bucket, ``s3://BUCKET`` or ``s3://BUCKET/PREFIX``, through a boto3 S3 client.

    The client is injected (see :func:`open_s3_store` for one built from the configuration); the store never
    creates one. Safe to share across threads when the client is (boto3 clients are).
    """

    __slots__ = ("_client", "_root", "connection")

    def __init__(self, root: str, client: S3Client, *, connection: S3Connection | None = None) -> None:
        self._root = parse_s3_root(root)
        self._client = client
        #: How the client was built (endpoint, proxy, credentials), when :func:`open_s3_store` built it.
        self.connection = connection

    def __repr__(self) -> str:
        return f"S3Store({self._root.url!r})"

    @property
    def root(self) -> str:
        """The root in canonical form: ``s3://bucket`` or ``s3://bucket/prefix`` (no trailing ``/``)."""
        return self._root.url

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._root.bucket

    @property
    def prefix(self) -> str:
        """The key prefix under which the root lives: ``""`` or ``"some/prefix/"``."""
        return self._root.prefix

    # -- locations -------------------------------------------------------------------------------------

    def _key(self, save: str) -> str:
        return self._root.prefix + save

    def _url(self, key: str) -> str:
        return f"s3://{self._root.bucket}/{key}"

    def _pub_prefix(self) -> str:
        return f"{self._root.prefix}{PUB_DIR_NAME}/"

    def location(self, entry: Entry) -> str:
        """Return ``s3://bucket/prefix/<save>``."""
        return self._url(self._key(require_instance(entry, Entry, "entry").save))

    def exec_dir(self, attempt: str) -> str:
        """Return ``s3://bucket/prefix/exec/<attempt>``."""
        return self._url(self._key(exec_save_prefix(attempt)))

    def save_of(self, location: str) -> str:
        """Return the save path (relative to the root) of an ``s3://`` location under the root.

        One trailing ``/`` is allowed. A location elsewhere, or naming an invalid save, is ``InvalidError``.
        """
        shown = redact_url(require_str(location, "save location"), keep_user=False)
        if not location.startswith("s3://"):
            raise InvalidError(f"save location {shown!r} is not an s3:// URL under the root {self.root}")
        candidate = location[:-1] if location.endswith("/") else location
        base = self.root + "/"
        if not candidate.startswith(base):
            raise InvalidError(f"save location {shown!r} is not under the root {self.root}")
        try:
            return validate_save(candidate[len(base) :])
        except InvalidError as exc:
            raise InvalidError(f"save location {shown!r}: {exc}") from None

    def _folder_prefix(self, location: str) -> str:
        """Return the key prefix (ending in ``/``, or the root's own prefix) of a location under the root."""
        if isinstance(location, str) and location.rstrip("/") == self.root:
            return self._root.prefix
        return self._key(self.save_of(location)) + "/"

    # -- requests --------------------------------------------------------------------------------------

    def _errors(self, action: str, location: str) -> contextlib.AbstractContextManager[None]:
        return _s3_errors(action, location, self._root.bucket)

    def _pages(self, prefix: str, *, delimiter: bool, action: str) -> Iterator[dict[str, Any]]:
        """Yield the ``ListObjectsV2`` pages under ``prefix``, 1000 keys each, following continuation."""
        params: dict[str, Any] = {"Bucket": self._root.bucket, "Prefix": prefix, "MaxKeys": PAGE_SIZE}
        if delimiter:
            params["Delimiter"] = "/"
        location = self._url(prefix)
        while True:
            with self._errors(action, location):
                page = self._client.list_objects_v2(**params)
            yield page
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")
            if not token:
                raise StorageError(
                    f"cannot {action} {location}: the storage truncated the listing without a continuation "
                    "token",
                    location=location,
                )
            params["ContinuationToken"] = token

    def _objects(self, prefix: str, *, action: str) -> list[dict[str, Any]]:
        """Return every object (``Key``, ``Size``, ...) under ``prefix``, recursively."""
        pages = self._pages(prefix, delimiter=False, action=action)
        return [obj for page in pages for obj in page.get("Contents", ())]

    def _any_object_under(self, prefix: str, *, action: str) -> bool:
        params = {"Bucket": self._root.bucket, "Prefix": prefix, "MaxKeys": 1}
        with self._errors(action, self._url(prefix)):
            page = self._client.list_objects_v2(**params)
        return bool(page.get("Contents") or page.get("KeyCount"))

    def _create_exclusive(self, key: str, *, action: str) -> _CreateOutcome:
        """Create the empty object ``key`` with ``If-None-Match: *``; say whether it was created.

        ``"exists"`` is 412 PreconditionFailed; ``"unsupported"`` is a storage that refuses the condition as
        not implemented. 409 ConditionalRequestConflict is retried with a doubling pause, and raised
        (translated) after the last attempt.
        """
        errors = _botocore_errors()
        location = self._url(key)
        pause = _CONFLICT_BACKOFF_SECONDS
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            with self._errors(action, location):
                try:
                    self._client.put_object(Bucket=self._root.bucket, Key=key, Body=b"", IfNoneMatch="*")
                except errors.ClientError as exc:
                    code, status = _client_error_code(exc)
                    if code == _PRECONDITION_FAILED:
                        return "exists"
                    if code == _NOT_IMPLEMENTED or status == 501:
                        return "unsupported"
                    if code != _CONDITIONAL_CONFLICT or attempt == _CONFLICT_ATTEMPTS:
                        raise
                else:
                    return "created"
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable: the last conflicting attempt raises")

    def _delete_keys(self, keys: Sequence[str], *, action: str, location: str) -> list[tuple[str, str]]:
        """Delete ``keys`` with ``DeleteObjects`` (quiet), 1000 a request; return the refused (key, code)."""
        refused: list[tuple[str, str]] = []
        for start in range(0, len(keys), PAGE_SIZE):
            batch = keys[start : start + PAGE_SIZE]
            with self._errors(action, location):
                answer = self._client.delete_objects(
                    Bucket=self._root.bucket,
                    Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True},
                )
            for error in answer.get("Errors", ()):
                code = str(error.get("Code") or "unknown error")
                if code not in _MISSING_OBJECT_CODES:  # already gone is what a delete asks for
                    refused.append((str(error.get("Key", "?")), code))
        return refused

    # -- publish ---------------------------------------------------------------------------------------

    def publish(self, epoch: int, step: int, save_location: str) -> Entry:
        """Publish the save at ``save_location`` (see the Store port): two requests on the normal path."""
        entry = Entry(require_int(epoch, "epoch"), require_int(step, "step"), self.save_of(save_location))
        name = format_entry_name(entry)  # InvalidError for a save too long, before any request
        if not self._any_object_under(self._key(entry.save) + "/", action="check the save"):
            is_file = self._object_exists(self._key(entry.save), action="check the save")
            check_save_kind(SaveKind.FILE if is_file else SaveKind.MISSING, self.location(entry))
        key = self._pub_prefix() + name
        outcome = self._create_exclusive(key, action="publish")
        if outcome == "exists":
            raise ExistsError(
                f"already published: epoch {epoch} step {step} save {entry.save} ({self._url(key)})",
                entry=entry,
            )
        if outcome == "unsupported":
            raise StorageError(
                f"cannot publish {self._url(key)}: the storage does not implement If-None-Match: *, so it "
                f"cannot hold a publication log ({_NOT_IMPLEMENTED})",
                location=self._url(key),
            )
        return entry

    # -- reads -----------------------------------------------------------------------------------------

    def _names(self) -> list[str]:
        """Return the names in ``pub/``; ``MalformedError`` for a sub-folder of ``pub/``."""
        pub = self._pub_prefix()
        names: list[str] = []
        for page in self._pages(pub, delimiter=True, action="list the publication log"):
            folders = sorted(p["Prefix"] for p in page.get("CommonPrefixes", ()))
            if folders:
                name = folders[0][len(pub) : -1]
                raise MalformedError(
                    f"malformed entry {self._url(folders[0])!r} in pub/: a folder", value=name
                )
            names.extend(obj["Key"][len(pub) :] for obj in page.get("Contents", ()))
        return [name for name in names if name]  # "" is the pub/ marker object (module rule 2)

    def entries(self) -> list[Entry]:
        """Return every entry, ascending (see the Store port)."""
        return parse_entry_names(self._names())

    def resolve(self) -> Entry | None:
        """Return the greatest entry, or ``None``: ceil(n/1000) list requests and nothing else."""
        return latest_entry_name(self._names())

    # -- prune -----------------------------------------------------------------------------------------

    # -- pins (ckpt.pins) ------------------------------------------------------------------------------

    def _pins_prefix(self) -> str:
        return f"{self._root.prefix}{PINS_DIR_NAME}/"

    def pin_names(self) -> list[str]:
        """Return the names under ``pins/`` (the PinLog port); a sub-folder is ``MalformedError``."""
        prefix = self._pins_prefix()
        names: list[str] = []
        for page in self._pages(prefix, delimiter=True, action="list the pins"):
            folders = sorted(p["Prefix"] for p in page.get("CommonPrefixes", ()))
            if folders:
                raise MalformedError(
                    f"malformed pin {self._url(folders[0])!r} in {PINS_DIR_NAME}/: a folder",
                    value=folders[0][len(prefix) : -1],
                )
            names.extend(obj["Key"][len(prefix) :] for obj in page.get("Contents", ()))
        return [name for name in names if name]

    def create_pin(self, name: str) -> bool:
        """Create the pin ``name`` with ``If-None-Match: *``; False when it was there."""
        key = self._pins_prefix() + name
        outcome = self._create_exclusive(key, action="pin")
        if outcome == "unsupported":
            raise StorageError(
                f"cannot pin {self._url(key)}: the storage does not implement If-None-Match: * "
                f"({_NOT_IMPLEMENTED})",
                location=self._url(key),
            )
        return outcome == "created"

    def remove_pins(self, names: Sequence[str]) -> None:
        """Remove the pins ``names`` with ``DeleteObjects``; absent ones are fine."""
        location = self._url(self._pins_prefix())
        keys = [self._pins_prefix() + name for name in names]
        refused = self._delete_keys(keys, action="unpin", location=location)
        if refused:
            raise StorageError(
                f"cannot remove {len(refused)} pins: {_failed_keys_text(refused, self._url)}",
                location=location,
            )

    def pin(self, entry: Entry) -> bool:
        """Pin a published entry; True when this call pinned it (see ``ckpt.pins``)."""
        return pin_entry(self, entry)

    def unpin(self, entry: Entry) -> bool:
        """Unpin an entry; True when it was pinned. Unpinning twice is not an error."""
        return unpin_entry(self, entry)

    def pinned(self) -> list[Entry]:
        """Return the pinned entries, ascending."""
        return pinned_entries(self)

    def follow(
        self,
        *,
        interval: float = 10.0,
        from_start: bool = False,
        scan_timeout: float | None = 120.0,
        stop: StopSignal | None = None,
    ) -> Iterator[Followed]:
        """Yield each entry as it is published, once, marked as the latest or not (``ckpt.following``)."""
        from ckpt.following import follow

        return follow(self, interval=interval, from_start=from_start, scan_timeout=scan_timeout, stop=stop)

    def prune(self, keep: int, *, keep_every: int | None = None, dry_run: bool = False) -> PruneResult:
        """Remove the entries no retention tier keeps, then the folders only they named (module rule 3).

        Pinned entries are kept, and every folder a pin names; pins are read again after the removals and
        an entry pinned meanwhile is put back (``ckpt.pins``).
        """
        require_int(keep, "keep")
        if keep_every is not None:
            require_int(keep_every, "keep_every")
        require_bool(dry_run, "dry_run")
        retention = plan_retention(self.entries(), keep, keep_every=keep_every, pinned=pinned_entries(self))
        plan = retention.prune_plan
        folders = [(folder, self._url(self._key(folder))) for folder in plan.folders]
        if dry_run:
            return PruneResult(
                plan.remove,
                tuple(location for _, location in folders),
                (),
                dry_run=True,
                kept=retention.kept,
            )
        pub_url = self._url(self._pub_prefix())
        entry_keys = [self._pub_prefix() + format_entry_name(entry) for entry in plan.remove]
        refused = self._delete_keys(entry_keys, action="remove entries from", location=pub_url)
        if refused:
            raise StorageError(
                f"prune could not remove {len(refused)} of {len(entry_keys)} entries, so no folder was "
                f"removed: {_failed_keys_text(refused, self._url)}",
                location=pub_url,
            )
        # Read again: an entry published or pinned since the plan was made still protects its folder, and
        # an entry pinned meanwhile is put back (ckpt.pins rule 2).
        pins = pinned_entries(self)
        restored = set(plan.remove) & set(pins)
        for entry in sorted(restored, key=lambda e: e.key):
            self._create_exclusive(self._pub_prefix() + format_entry_name(entry), action="put back")
        removed = tuple(e for e in plan.remove if e not in restored)
        needed = Overlap(entry.save for entry in self.entries())
        pinned_now = Overlap(p.save for p in pins)
        removed_folders: list[str] = []
        skipped: list[SkippedFolder] = []
        refused_objects: list[tuple[str, str]] = []
        for folder, location in folders:
            if needed(folder) or pinned_now(folder):
                skipped.append(SkippedFolder(location, SKIP_PINNED if pinned_now(folder) else SKIP_PUBLISHED))
                continue
            keys = [obj["Key"] for obj in self._objects(self._key(folder) + "/", action="list the folder")]
            if not keys:
                skipped.append(SkippedFolder(location, "already gone"))
                continue
            refused = self._delete_keys(keys, action="remove the folder", location=location)
            if refused:
                refused_objects.extend(refused)
            else:
                removed_folders.append(location)
        if refused_objects:
            raise StorageError(
                f"prune removed {len(removed)} entries and {len(removed_folders)} folders, but the "
                f"storage refused to delete {len(refused_objects)} objects: "
                + _failed_keys_text(refused_objects, self._url),
                location=self._url(refused_objects[0][0]),
            )
        return PruneResult(removed, tuple(removed_folders), tuple(skipped), kept=retention.kept)

    # -- what the watcher needs ------------------------------------------------------------------------

    def folders(self, location: str) -> list[Folder]:
        """Return the folders directly inside ``location`` (the root or a location under it)."""
        prefix = self._folder_prefix(location)
        base = location.rstrip("/")
        found: list[Folder] = []
        for page in self._pages(prefix, delimiter=True, action="list the folders of"):
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(prefix) : -1]
                if name:  # "a//b" has an empty element: no folder a location could name
                    found.append(Folder(name, f"{base}/{name}"))
        return found

    def read_file(self, save_location: str, name: str) -> bytes | None:
        """Return the content of ``name`` inside the save, or ``None`` when there is no such object.

        A body that breaks off mid-stream is asked for again (module rule 6); at most 64 MiB (rule 7).
        """
        key = self._file_key(save_location, name)
        errors = _botocore_errors()
        with self._errors("read", self._url(key)):
            for attempt in range(1, _BODY_ATTEMPTS + 1):
                try:
                    answer = self._client.get_object(Bucket=self._root.bucket, Key=key)
                except errors.ClientError as exc:
                    if _client_error_code(exc)[0] in _MISSING_OBJECT_CODES:
                        return None
                    raise
                body = answer["Body"]
                try:
                    size = answer.get("ContentLength")
                    if isinstance(size, int) and size > MAX_READ_BYTES:
                        raise too_large(self._url(key), size)
                    data = bytearray()
                    # Read to the end (the empty read is where botocore checks the length it was promised),
                    # but never more than one byte past the cap.
                    while chunk := body.read(min(1 << 20, MAX_READ_BYTES + 1 - len(data))):
                        data += chunk
                        if len(data) > MAX_READ_BYTES:
                            raise too_large(self._url(key))
                except (errors.HTTPClientError, errors.IncompleteReadError):
                    # The body broke off (cut short, connection reset, read timeout): botocore cannot retry
                    # a body it already handed over, so the request is sent again (module rule 6).
                    if attempt == _BODY_ATTEMPTS:
                        raise
                else:
                    return bytes(data)
                finally:
                    body.close()
        raise AssertionError("unreachable: the last failed attempt raises")

    def exists(self, save_location: str, name: str) -> bool:
        """Return True when the object ``name`` exists inside the save (one ``HeadObject``, rule 7)."""
        key = self._file_key(save_location, name)
        return self._object_exists(key, action="check")

    def _file_key(self, save_location: str, name: str) -> str:
        """The key of file ``name`` inside the save; ``InvalidError`` for a location or name leaving it."""
        return self._key(self.save_of(save_location)) + "/" + validate_file_name(name)

    def _object_exists(self, key: str, *, action: str) -> bool:
        """Return True when an object has exactly the key ``key`` (one ``HeadObject``)."""
        errors = _botocore_errors()
        with self._errors(action, self._url(key)):
            try:
                self._client.head_object(Bucket=self._root.bucket, Key=key)
            except errors.ClientError as exc:
                if _client_error_code(exc)[0] in _MISSING_OBJECT_CODES:
                    return False
                raise
        return True

    def sync_save(self, save_location: str) -> None:
        """Check the location only: an object S3 acknowledged is durable (the WatchStore port)."""
        self.save_of(save_location)

    def files(self, save_location: str) -> list[FileInfo]:
        """Return every object inside the save with its size, recursively, sorted by relative path.

        Keys ending in ``/`` are folder markers, not files, and are left out.
        """
        prefix = self._key(self.save_of(save_location)) + "/"
        found = [
            FileInfo(obj["Key"][len(prefix) :], int(obj.get("Size", 0)))
            for obj in self._objects(prefix, action="list the files of")
            if not obj["Key"].endswith("/")
        ]
        return sorted(found, key=lambda info: info.path)

    # -- doctor ----------------------------------------------------------------------------------------

    def probe_exclusive_create(self) -> ExclusiveCreateProbe:
        """Check that the storage refuses a second ``If-None-Match: *`` create of a key (``ckpt doctor``).

        Creates ``<root>/.ckpt-doctor/<random>`` (outside ``pub/`` and ``exec/``), creates it again, expects
        412, and deletes it. A storage that refuses the header as unsupported (``NotImplemented``) does not
        honour exclusive create; any other failure (access denied, unreachable) raises as usual.
        """
        key = f"{self._root.prefix}{_PROBE_DIR}/{secrets.token_hex(8)}"
        location = self._url(key)
        action = "probe exclusive create at"
        first = self._create_exclusive(key, action=action)
        if first == "unsupported":
            return ExclusiveCreateProbe(False, location, "the storage does not implement If-None-Match: *")
        if first == "exists":
            return ExclusiveCreateProbe(
                False, location, "the storage refused to create a fresh random key with If-None-Match: *"
            )
        try:
            second = self._create_exclusive(key, action=action)
        finally:
            self._delete_object(key, action="remove the probe object")
        if second == "exists":
            return ExclusiveCreateProbe(True, location, "a second If-None-Match: * create was refused (412)")
        return ExclusiveCreateProbe(
            False,
            location,
            "a second create with If-None-Match: * succeeded: the storage ignores the condition, so two "
            "publishers could both believe they published the same entry",
        )

    def _delete_object(self, key: str, *, action: str) -> None:
        with self._errors(action, self._url(key)):
            self._client.delete_object(Bucket=self._root.bucket, Key=key)


# -- building the client from the configuration ----------------------------------------------------------


def _proxy_rule(config: Config, environ: Mapping[str, str]) -> ProxyRule:
    """The one proxy rule (SPEC §7): the ``[proxy]`` table when present (it replaces the environment), else
    the environment. The CGI guard always reads ``environ``."""
    if config.proxy is not None:
        return ProxyRule.from_config(config.proxy, cgi=is_cgi(environ))
    return ProxyRule.from_environment(environ)


def _botocore_session(config: Config, environ: Mapping[str, str], rule: ProxyRule) -> Any:
    """Return the hermetic botocore session the S3 client signs with: its only credential provider is the
    configured chain (SPEC §6), refreshed on schedule and at expiry. With no ``[[credentials]]`` tables the
    chain is botocore's own default chain behind the same refresh logic. The Vault source, if any, reaches
    Vault through the same proxy rule as S3.
    """
    from ckpt.creds.botocore_session import make_botocore_session  # botocore only for S3 roots
    from ckpt.creds.config import chain_from_config

    chain = chain_from_config(list(config.credentials), environ, proxy_for=rule.proxy_for)
    return make_botocore_session(
        chain,
        refresh_seconds=config.s3.refresh_seconds,
        max_staleness_seconds=config.s3.max_staleness_seconds,
    )


def connect_s3(config: Config, environ: Mapping[str, str]) -> tuple[Any, S3Connection]:
    """Build the S3 client from ``config`` and say how it connects (see :func:`make_s3_client`)."""
    import botocore.config  # lazily: botocore only when an S3 store is opened

    from ckpt.creds.botocore_session import create_s3_client

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
    session = _botocore_session(config, environ, rule)
    errors = _botocore_errors()
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
        failure = InvalidError(f"s3.endpoint_url {_endpoint_of(endpoint)!r} is not a valid endpoint URL")
    else:
        return client, S3Connection(_endpoint_of(effective_endpoint), routes, session.get_credentials())
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


def open_s3_store(root: str, *, config: Config, environ: Mapping[str, str]) -> S3Store:
    """Return the :class:`S3Store` for ``root``, its client built from ``config`` by :func:`make_s3_client`.

    The root is validated before any client is built, so a bad URL costs no credential lookup.
    """
    parse_s3_root(root)
    client, connection = connect_s3(config, environ)
    return S3Store(root, client, connection=connection)
