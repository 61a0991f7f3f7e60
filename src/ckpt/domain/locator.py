"""Where a save lives: the one mapping between save paths and locations (docs/spec/operations.md §6).

A *save path* is relative to the root (``exec/2.4102.0/checkpoint-600``); a *location* is the same save in
the store's own form: an absolute POSIX path, an ``s3://`` URL, or a ``memory://`` URL. Every store turns
one into the other the same way, so the rules live here once:

1. A save's location is the root, ``/``, and the save path (the POSIX root ``/`` adds no second slash).
2. A location names a save only when it lies lexically under the root; one trailing ``/`` is allowed. The
   save path that remains must be a valid save (``validate_save``): anything else is ``InvalidError``,
   whose message shows the location with any user-info redacted.
3. A *folder path* is a save path or ``""`` for the root itself: listing the folders of the root is allowed,
   publishing the root is not.

Pure: no I/O. The adapters normalise their root text before they build a :class:`Locator`.
"""

from __future__ import annotations

import attrs

from ckpt.domain.arguments import require_str
from ckpt.domain.entries import exec_save_prefix, validate_save
from ckpt.domain.errors import InvalidError
from ckpt.domain.redaction import redact_url

__all__ = ["Locator"]


@attrs.frozen
class Locator:
    """The save/location mapping of one root.

    ``root`` is the canonical root (``/mnt/run``, ``/``, ``s3://bucket/prefix``, ``memory://name``);
    ``scheme`` is how every location of this kind of store starts (``/``, ``s3://``, ``memory://``) and
    ``form`` says in messages what such a location is ("an absolute path").

    >>> loc = Locator("s3://b/run", scheme="s3://", form="an s3:// URL")
    >>> loc.location("exec/a/ck-1"), loc.save_of("s3://b/run/exec/a/ck-1/")
    ('s3://b/run/exec/a/ck-1', 'exec/a/ck-1')
    """

    root: str
    scheme: str
    form: str

    @property
    def base(self) -> str:
        """The root with exactly one trailing ``/``: every location under the root starts with it."""
        return self.root if self.root.endswith("/") else self.root + "/"

    def location(self, save: str) -> str:
        """Return the location of the save path ``save`` (rule 1)."""
        return self.base + save

    def exec_dir(self, attempt: str) -> str:
        """Return the location of ``exec/<attempt>``; ``InvalidError`` for a bad attempt."""
        return self.location(exec_save_prefix(attempt))

    def save_of(self, location: str) -> str:
        """Return the save path a location names, or raise ``InvalidError`` saying why not (rule 2)."""
        require_str(location, "save location")
        shown = redact_url(location, keep_user=False)
        if not location.startswith(self.scheme):
            raise InvalidError(f"save location {shown!r} is not {self.form} under the root {self.root}")
        base = self.base
        candidate = location[:-1] if location.endswith("/") and location != base else location
        if not candidate.startswith(base):
            raise InvalidError(f"save location {shown!r} is not under the root {self.root}")
        try:
            return validate_save(candidate[len(base) :])
        except InvalidError as exc:
            raise InvalidError(f"save location {shown!r}: {exc}") from None

    def folder_of(self, location: str) -> str:
        """Return the folder path of a location: ``""`` for the root itself, else its save path (rule 3)."""
        if isinstance(location, str) and location.rstrip("/") == self.root.rstrip("/"):
            return ""
        return self.save_of(location)
