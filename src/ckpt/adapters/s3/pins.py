"""The pins of an S3 root: the keys under ``<prefix>pins/`` (docs/spec/layout.md §7).

The same rules as the publication log (``ckpt.adapters.s3.store``): a pin is created with ``PutObject`` and
``If-None-Match: *`` (412: it was already there, unless it holds this pin's writer token), listed with
``ListObjectsV2`` and a delimiter (a common prefix under ``pins/`` is malformed; the zero-byte ``pins/``
marker is ignored), removed with ``DeleteObjects``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ckpt.adapters.s3.objects import Bucket
from ckpt.domain.entries import PINS_DIR_NAME
from ckpt.domain.errors import MalformedError, StorageError

__all__ = ["S3Pins"]


class S3Pins:
    """The ``PublicationLog`` port over the keys under ``<prefix>pins/``."""

    __slots__ = ("_bucket", "_pins")

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket
        self._pins = bucket.key(f"{PINS_DIR_NAME}/")

    def list_names(self) -> list[str]:
        """Return the names under ``pins/``; ``MalformedError`` for a sub-folder."""
        names: list[str] = []
        for page in self._bucket.pages(self._pins, delimiter=True, action="list the pins"):
            folders = sorted(page.prefixes)
            if folders:
                raise MalformedError(
                    f"malformed pin {self._bucket.url(folders[0])!r} in {PINS_DIR_NAME}/: a folder",
                    value=folders[0][len(self._pins) : -1],
                )
            names.extend(key[len(self._pins) :] for key in page.keys)
        return [name for name in names if name]  # "" is the pins/ marker object

    def create(self, name: str) -> bool:
        """Create ``pins/<name>`` with ``If-None-Match: *``; False when it already exists."""
        return self._bucket.create_new(self._pins + name, action="pin")

    def remove(self, names: Sequence[str]) -> list[str]:
        """Delete the pins ``names``; absent ones are fine."""
        location = self._bucket.url(self._pins)
        refused = self._bucket.delete_keys([self._pins + n for n in names], action="unpin", location=location)
        if refused:
            shown = ", ".join(f"{self._bucket.url(key)} ({code})" for key, code in refused[:10])
            raise StorageError(f"cannot remove {len(refused)} pins: {shown}", location=location)
        return list(names)
