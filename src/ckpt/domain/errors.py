"""Every error `ckpt` raises, in one tree.

::

    CkptError                                   root: catch this to catch everything of ours
    ├── InvalidError(ValueError)                an argument or setting the operation refuses (exit 2)
    │   ├── InvalidTypeError(TypeError)         an argument of the wrong type through the Python API (exit 2)
    │   ├── SaveNotFoundError(FileNotFoundError)  the save to publish does not exist (exit 2)
    │   ├── ConfigError                         the configuration file or its values (exit 2)
    │   └── ProxyConfigError                    a proxy value or NO_PROXY rule, or the CGI guard (exit 2)
    ├── MalformedError(ValueError)              a stored value that does not parse: an entry name (exit 5)
    ├── ExistsError(FileExistsError)            the entry is already published; carries it (exit 4)
    ├── StorageError(OSError)                   the storage failed or refused (exit 1)
    │   ├── NotFoundError(FileNotFoundError)    the root or the bucket does not exist (exit 1)
    │   └── PruneIncompleteError                a prune failed half way: says what it left (exit 1)
    ├── CredentialsError(PermissionError)       a credential source is broken or refused (exit 1)
    └── ScanTimeoutError(TimeoutError)          a watcher scan exceeded its timeout (exit 1)

A save that does not exist is the caller's mistake, not the storage's (spec/operations.md): publishing it is
an ``InvalidError`` like a save outside the root, so ``SaveNotFoundError`` sits under ``InvalidError`` and not
under ``NotFoundError``, which is kept for a root or bucket that is gone (an operational failure).

Each leaf also derives from the nearest builtin so that callers who only know the standard library still
catch it sensibly. Messages say what failed, why, and the offending value; a message never contains a
secret (keys, tokens, passwords, proxy user-info): the code that raises is responsible for redacting.

This module is pure: it imports nothing but the standard library's typing support.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt.domain.entries import Entry

__all__ = [
    "CkptError",
    "ConfigError",
    "CredentialsError",
    "ExistsError",
    "InvalidError",
    "InvalidTypeError",
    "MalformedError",
    "NotFoundError",
    "ProxyConfigError",
    "PruneIncompleteError",
    "SaveNotFoundError",
    "ScanTimeoutError",
    "StorageError",
]


class CkptError(Exception):
    """The root of every error `ckpt` raises on purpose."""


class InvalidError(CkptError, ValueError):
    """An argument the operation refuses: a bad epoch, step, attempt, save path or setting."""


class InvalidTypeError(InvalidError, TypeError):
    """An argument of the wrong type, such as ``None`` for a location or ``"2"`` for a count.

    Raised by the boundary checks of the public API (``ckpt.domain.arguments``), so that a wrong type is
    one of our errors (``CkptError``), and still the ``TypeError`` a caller who only knows Python expects.
    """


class SaveNotFoundError(InvalidError, FileNotFoundError):
    """The save to publish does not exist (no folder; on S3 no object under its prefix).

    ``location`` is the save's location. The root and the bucket existing is what tells this apart from
    ``NotFoundError``.
    """

    def __init__(self, message: str, *, location: str | None = None) -> None:
        super().__init__(message)
        self.location = location

    def __str__(self) -> str:
        return str(self.args[0])


class ConfigError(InvalidError):
    """The configuration file, or a value in it, is wrong. ``key`` names the offending key when known."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class ProxyConfigError(InvalidError):
    """A proxy URL or ``NO_PROXY`` value is malformed, or the CGI guard refused a proxy."""


class MalformedError(CkptError, ValueError):
    """A stored value does not parse, such as a name in ``pub/``. ``value`` is the offending value.

    ``why`` is what is wrong with it, without the value or where it was found (``None`` when the message
    says no more), so that a caller parsing the same format elsewhere (a pin in ``pins/``) can say where.
    """

    def __init__(self, message: str, *, value: str | None = None, why: str | None = None) -> None:
        super().__init__(message)
        self.value = value
        self.why = why


class ExistsError(CkptError, FileExistsError):
    """The entry is already published; it was left untouched. ``entry`` is that entry."""

    def __init__(self, message: str, *, entry: Entry) -> None:
        super().__init__(message)
        self.entry = entry

    def __str__(self) -> str:
        # FileExistsError formats itself from errno/strerror when given several arguments; we give one.
        return str(self.args[0])


class StorageError(CkptError, OSError):
    """The storage failed or refused an operation. ``location`` names the path or URL involved."""

    def __init__(self, message: str, *, location: str | None = None) -> None:
        super().__init__(message)
        self.location = location

    def __str__(self) -> str:
        return str(self.args[0])


class VerificationError(StorageError):
    """A copy that does not verify: the bytes stored are not the bytes sent (spec/tiered.md §4)."""


class NotFoundError(StorageError, FileNotFoundError):
    """The root, bucket, folder or save the operation needs does not exist."""


class PruneIncompleteError(StorageError):
    """A prune failed after it began to change the store (docs/spec/operations.md §5.12).

    ``journal`` names the journal it left (the next prune finishes the job), ``removed_entries`` the entries
    it had removed for good, ``removed_folders`` the folders it had removed (locations), and ``restored`` the
    entries it had put back; the message says the same. ``__cause__`` is the failure itself.
    """

    def __init__(
        self,
        message: str,
        *,
        location: str | None = None,
        journal: str | None = None,
        removed_entries: tuple[Entry, ...] = (),
        removed_folders: tuple[str, ...] = (),
        restored: tuple[Entry, ...] = (),
    ) -> None:
        super().__init__(message, location=location)
        self.journal = journal
        self.removed_entries = removed_entries
        self.removed_folders = removed_folders
        self.restored = restored


class CredentialsError(CkptError, PermissionError):
    """A credential source is present but broken, refused, or no source had credentials.

    ``source`` is the name of the source (never its secrets).
    """

    def __init__(self, message: str, *, source: str | None = None) -> None:
        super().__init__(message)
        self.source = source

    def __str__(self) -> str:
        return str(self.args[0])


class ScanTimeoutError(CkptError, TimeoutError):
    """A watcher scan took longer than its timeout (the store stopped answering, or is too slow)."""

    def __str__(self) -> str:
        return str(self.args[0])
