"""The one way a URL is shown in a message or a log line: with its user-info hidden.

Every error and log line that quotes a URL, or a value that was meant to be one (a proxy value, a target
URL, an S3 root, the S3 endpoint, the Vault address), shows it through :func:`redact_url` and quotes no
other piece of it: a piece cut out by some other parser (a "scheme", a "port") can be the password when the
value is malformed. Nothing else here; pure (``re`` only).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["redact_url"]

# RFC 3986 §3.1: a scheme is a letter followed by letters, digits, "+", "-" and "."; here with its "://".
_SCHEME_AND_SLASHES: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def redact_url(url: str, *, keep_user: bool = True) -> str:
    """Return ``url`` with the secret part of its user-info replaced by ``***``.

    Works on malformed values too, so error messages can show them. Everything after a leading ``scheme://``
    (a well-formed scheme only), or from the start, up to the *last* ``@`` counts as user-info, so a password
    with an unescaped ``/``, ``@`` or ``://`` is still hidden; a URL with ``@`` only in its path is
    over-redacted, which is the safe way to be wrong. With ``keep_user`` (proxy URLs, spec/proxy.md) a user
    name followed by a password stays visible (``user:***@``); a user name alone is hidden either way (it is
    often a token). Without it (S3 roots, endpoints, the Vault address, where any user-info is a mistake and
    the user name may be an access key id) all of it becomes ``***@``.

    >>> redact_url("http://alice:s3cr3t@proxy.example:3128")
    'http://alice:***@proxy.example:3128'
    >>> redact_url("http://token@proxy.example")
    'http://***@proxy.example'
    >>> redact_url("s3://AKID:secret@bucket/run", keep_user=False)
    's3://***@bucket/run'
    """
    scheme = _SCHEME_AND_SLASHES.match(url)
    start = scheme.end() if scheme else 0
    at = url.rfind("@", start)
    if at < 0:
        return url
    user, colon, _password = url[start:at].partition(":")
    shown = f"{user}:***" if colon and keep_user else "***"
    return f"{url[:start]}{shown}{url[at:]}"
