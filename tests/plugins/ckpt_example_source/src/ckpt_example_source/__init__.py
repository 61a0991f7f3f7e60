"""An example ckpt credential source: S3 keys read from a JSON document, ``{"key_id": ..., "secret": ...}``.

Registered as the kind ``json-document``::

    [[credentials]]
    source = "json-document"
    path = "/var/run/secrets/team/s3.json"   # required
    required = false                         # optional: a missing document is "absent" (the default)

It shows the three things a plugin owes ckpt: it validates its own keys with ``ConfigError`` naming the
full key, it reads nothing until ``fetch``, and ``fetch`` returns ``None`` for absent, raises
``CredentialsError`` (never with a secret in it) for broken, and otherwise returns ``Credentials``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckpt import ConfigError, CredentialsError
from ckpt.creds import Credentials, SourceSettings

_KEYS = ("path", "required")


class JsonDocumentSource:
    """A ``ckpt.creds.Source`` reading a JSON document at every fetch (so a rotated file is picked up)."""

    def __init__(self, path: Path, *, required: bool, name: str) -> None:
        self.path = path
        self.required = required
        self._name = name

    def __repr__(self) -> str:
        return f"JsonDocumentSource({str(self.path)!r}, required={self.required}, name={self._name!r})"

    @property
    def name(self) -> str:
        return self._name

    def fetch(self) -> Credentials | None:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.required:
                raise CredentialsError(f"{self.path} does not exist", source=self.name) from None
            return None
        except OSError as exc:
            raise CredentialsError(f"cannot read {self.path}: {exc.strerror}", source=self.name) from None
        try:
            document: Any = json.loads(text)
            key_id, secret = document["key_id"], document["secret"]
        except (ValueError, TypeError, KeyError):
            # Never quote the document: it holds the secret.
            raise CredentialsError(
                f"{self.path} is not a JSON object with key_id and secret", source=self.name
            ) from None
        if not (isinstance(key_id, str) and key_id and isinstance(secret, str) and secret):
            raise CredentialsError(
                f"{self.path}: key_id and secret must be non-empty strings", source=self.name
            )
        return Credentials(key_id, secret, source=self.name)


def make_source(settings: SourceSettings) -> JsonDocumentSource:
    """The entry point: build the source from its ``[[credentials]]`` table, validating every key."""
    for key in settings.table:
        if key not in _KEYS:
            raise ConfigError(
                f"unknown key {settings.key(key)!r} for source {settings.kind!r} "
                "(allowed: source, path, required)",
                key=settings.key(key),
            )
    path = settings.table.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ConfigError(f"{settings.key('path')} must be an absolute path", key=settings.key("path"))
    required = settings.table.get("required", False)
    if not isinstance(required, bool):
        raise ConfigError(f"{settings.key('required')} must be true or false", key=settings.key("required"))
    return JsonDocumentSource(Path(path), required=required, name=settings.name)
