"""The S3 root URL, ``s3://BUCKET[/PREFIX]``: its grammar and its parser (docs/spec/layout.md §1.3; vectors in
``tests/vectors/s3_roots.json``).

Rules:

1. The bucket follows S3's naming rules for general-purpose buckets (3-63 characters of ``a-z 0-9 . -``,
   starting and ending with a letter or digit, no ``..``, not an IPv4 address, no reserved prefix or
   suffix). Directory buckets (``--x-s3``) are accepted.
2. The prefix is clean: no empty, ``.`` or ``..`` element, no control character, valid UTF-8, and short
   enough that ``<prefix>/pub/<entry name>`` still fits S3's 1024-byte key limit. One trailing ``/`` is
   dropped.
3. User-info, a port, a query or a fragment is refused; user-info never appears in the message.

Pure: standard library and attrs only.
"""

from __future__ import annotations

import ipaddress
import re

import attrs

from ckpt.domain.entries import PUB_DIR_NAME
from ckpt.domain.errors import InvalidError
from ckpt.domain.names import MAX_NAME_BYTES
from ckpt.domain.redaction import redact_url

__all__ = ["MAX_KEY_BYTES", "MAX_PREFIX_BYTES", "S3Root", "parse_s3_root"]

MAX_KEY_BYTES = 1024  # S3's limit on a key
# The longest prefix that still leaves room for "/pub/" and a 255-byte entry name inside one key.
MAX_PREFIX_BYTES = MAX_KEY_BYTES - len(f"/{PUB_DIR_NAME}/") - MAX_NAME_BYTES

# Rule 1: 3-63 characters of a-z 0-9 . -, starting and ending with a letter or digit.
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
    try:
        ipaddress.IPv4Address(bucket)
    except ValueError:
        pass
    else:
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
