"""The ``file`` credential source, and the one careful way ``ckpt`` reads a secret from a file.

Rules for reading a secret file (``read_secret_file``; the Vault source uses it for the JWT and AppRole ids):

- Open it anew at every read. Kubernetes secret volumes expose each key as a symbolic link through
  ``..data``, and swap ``..data`` atomically on rotation; a file handle kept open would pin the old value.
- Read through ``ckpt.small_files.read_small_file``: decide on what was opened (``fstat`` of the open
  descriptor, after every link was resolved), opened non-blocking so a FIFO cannot hang us, and at most
  ``MAX_SECRET_BYTES`` (64 KiB) read: a larger file is refused.
- Refuse anything but a regular file, and a file that is group- or world-*writable* (someone else could
  plant keys). A group- or world-*readable* file is logged as a warning (once per file per source), or
  refused when the policy says ``refuse``: Kubernetes mounts secrets 0644 unless told otherwise.
- Strip exactly one trailing ``\\n`` (``echo`` and editors add one). Anything else that is whitespace or a
  control character is refused rather than sent to S3, where it would fail as a baffling signature error.
- Messages name the file and its mode, never its content.

The ``file`` source reads ``access_key_id``, ``secret_access_key`` and optional ``session_token`` in a
folder. Folder missing, or neither key file present: absent. One key file without the other, or a session
token alone: broken.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Literal

import attrs

from ckpt.creds.model import Credentials
from ckpt.domain.errors import CredentialsError
from ckpt.small_files import read_small_file

__all__ = ["MAX_SECRET_BYTES", "FileSource", "ReadablePolicy", "read_secret_file"]

_log = logging.getLogger(__name__)

#: What to do with a secret file that the group or others may read.
ReadablePolicy = Literal["warn", "refuse", "allow"]

#: The most a secret file may hold: a key, a token or a JWT; anything bigger is not one.
MAX_SECRET_BYTES = 64 * 1024
_GROUP_OR_WORLD_WRITABLE = stat.S_IWGRP | stat.S_IWOTH
_GROUP_OR_WORLD_READABLE = stat.S_IRGRP | stat.S_IROTH


def _refuse(source: str, path: Path, why: str) -> CredentialsError:
    return CredentialsError(f"{source}: refusing secret file {path}: {why}", source=source)


def _decode(source: str, path: Path, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(source, path, "it is not valid UTF-8") from None
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise _refuse(source, path, "it is empty")
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise _refuse(
            source, path, "it contains whitespace or a control character (more than one trailing newline?)"
        )
    return text


def read_secret_file(
    path: Path,
    *,
    source: str,
    readable_by_others: ReadablePolicy = "warn",
    warned: set[str] | None = None,
) -> str | None:
    """Return the secret in ``path`` as the module rules say, or ``None`` when the file does not exist.

    ``warned`` remembers which files were already warned about (pass one set per source, so a refresh every
    few minutes does not repeat the warning). Raises ``CredentialsError(source=source)`` on refusal.
    """

    def refuse(reason: str) -> CredentialsError:
        return _refuse(source, path, reason)

    def inspect(info: os.stat_result) -> None:
        mode = stat.S_IMODE(info.st_mode)
        if mode & _GROUP_OR_WORLD_WRITABLE:
            raise refuse(f"it is group- or world-writable (mode {mode:04o})")
        if mode & _GROUP_OR_WORLD_READABLE and readable_by_others != "allow":
            if readable_by_others == "refuse":
                raise refuse(f"it is group- or world-readable (mode {mode:04o})")
            key = str(path)
            if warned is None or key not in warned:
                _log.warning(
                    "%s: secret file %s is group- or world-readable (mode %04o); consider defaultMode 0400",
                    source,
                    path,
                    mode,
                )
                if warned is not None:
                    warned.add(key)

    try:
        data = read_small_file(path, limit=MAX_SECRET_BYTES, refuse=refuse, inspect=inspect)
    except FileNotFoundError:
        return None
    except CredentialsError:
        raise  # a refusal above (CredentialsError is a PermissionError, hence an OSError)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(source, path, "too many levels of symbolic links") from None
        raise CredentialsError(
            f"{source}: cannot read secret file {path}: {exc.strerror or type(exc).__name__}", source=source
        ) from None
    return _decode(source, path, data)


@attrs.define
class FileSource:
    """Credentials from a mounted secret folder, one file per field, re-read at every fetch."""

    directory: Path = attrs.field(converter=Path)
    readable_by_others: Literal["warn", "refuse"] = "warn"
    name: str = "file"
    _warned: set[str] = attrs.field(factory=set, init=False, repr=False, eq=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False, eq=False)

    def fetch(self) -> Credentials | None:
        """Read the folder now; see the module rules."""
        try:
            folder = os.stat(self.directory)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CredentialsError(
                f"{self.name}: cannot open secret folder {self.directory}: {exc.strerror}", source=self.name
            ) from None
        if not stat.S_ISDIR(folder.st_mode):
            raise CredentialsError(f"{self.name}: {self.directory} is not a folder", source=self.name)
        with self._lock:
            key_id = self._read("access_key_id")
            secret = self._read("secret_access_key")
            token = self._read("session_token")
        if key_id is None and secret is None:
            if token is not None:
                raise CredentialsError(
                    f"{self.name}: {self.directory} holds session_token but no access_key_id and"
                    " secret_access_key",
                    source=self.name,
                )
            return None
        if key_id is None or secret is None:
            missing = "access_key_id" if key_id is None else "secret_access_key"
            raise CredentialsError(
                f"{self.name}: {self.directory / missing} is missing while its pair is present",
                source=self.name,
            )
        return Credentials(key_id, secret, token, source=self.name)

    def _read(self, field: str) -> str | None:
        return read_secret_file(
            self.directory / field,
            source=self.name,
            readable_by_others=self.readable_by_others,
            warned=self._warned,
        )
