"""What a save is and what a store may read inside one: the rules every store applies alike
(spec/operations.md).

Rules (each store asks the storage a small question and lets these functions decide):

1. A save is a folder or a single regular file (Lightning's ``.ckpt``, Composer's ``.pt``; on S3 an object
   at exactly the save's key). :func:`check_save_kind` is the one place that says so: a location with
   nothing there is :class:`SaveNotFoundError`, one that names a FIFO, a socket or a device is
   ``InvalidError``. Prune removes a single-file save as it removes a folder; the watcher syncs it before
   publishing it.
2. A file inside a save is named by a clean relative path (:func:`validate_file_name`): no empty, ``.`` or
   ``..`` element, not absolute, no trailing ``/``, no NUL or control character. ``../x`` never leaves the
   save, on any store.
3. A file a store reads or checks inside a save is a *regular file*: on POSIX never a folder, a link (dangling
   or not, and no path element may be one), a FIFO or a device; on S3 the object at exactly that key (objects
   under ``name/`` make a folder, not a file). A marker (``trainer_state.json``, ``.metadata``, the hf
   sentinel) is present exactly when such a file is.
4. ``read_file`` reads at most :data:`MAX_READ_BYTES` (64 MiB) and raises :func:`too_large` beyond it. Real
   ``trainer_state.json`` files reach several MB with a long ``log_history``; 64 MiB leaves an order of
   magnitude of room while bounding what a hostile or broken file can make the watcher hold in memory.

Pure: the standard library and ``ckpt.domain`` only.
"""

from __future__ import annotations

import enum
import re

from ckpt.domain.arguments import require_str
from ckpt.domain.errors import InvalidError, SaveNotFoundError, StorageError

__all__ = ["MAX_READ_BYTES", "SaveKind", "check_save_kind", "too_large", "validate_file_name"]

MAX_READ_BYTES = 64 * 1024 * 1024

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class SaveKind(enum.Enum):
    """What a store found at a save's location."""

    FOLDER = "folder"
    FILE = "file"  # a regular file, or on S3 an object at exactly the save's key
    OTHER = "other"  # a FIFO, socket or device
    MISSING = "missing"


def check_save_kind(kind: SaveKind, location: str) -> None:
    """Raise unless ``kind`` is something a save can be (rule 1): a folder or a regular file."""
    if kind in (SaveKind.FOLDER, SaveKind.FILE):
        return
    if kind is SaveKind.MISSING:
        raise SaveNotFoundError(f"save {location} does not exist", location=location)
    raise InvalidError(f"save {location} is neither a folder nor a regular file")


def validate_file_name(name: str) -> str:
    """Return ``name`` when it is a clean relative path of a file inside a save (rule 2), else raise.

    >>> validate_file_name("sub/trainer_state.json")
    'sub/trainer_state.json'
    """
    require_str(name, "file name")
    reason = None
    if name == "":
        reason = "is empty"
    elif _CONTROL.search(name):
        reason = "contains NUL or an ASCII control character"
    elif name.startswith("/"):
        reason = "is absolute (a file is named relative to its save)"
    elif name.endswith("/"):
        reason = "ends with '/'"
    else:
        elements = name.split("/")
        if "" in elements:
            reason = "has an empty path element ('//')"
        elif "." in elements or ".." in elements:
            reason = "has a '.' or '..' path element (a file is named inside its save)"
        else:
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                reason = "is not valid UTF-8 (contains a lone surrogate)"
    if reason is not None:
        raise InvalidError(f"file name {name!r} {reason}")
    return name


def too_large(location: str, size: int | None = None) -> StorageError:
    """The error for a file over :data:`MAX_READ_BYTES` (rule 4); ``size`` when the storage told it."""
    told = f" ({size} bytes)" if size is not None else ""
    return StorageError(
        f"cannot read {location}: the file is larger{told} than {MAX_READ_BYTES} bytes (64 MiB), the most a "
        "store reads from a file inside a save",
        location=location,
    )
