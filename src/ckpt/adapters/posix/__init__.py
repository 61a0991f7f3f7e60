"""The checkpoint store on a POSIX filesystem (docs/spec/layout.md): the small store ports over one root.

The modules, one reason to change each:

* :mod:`~ckpt.adapters.posix.syscalls`: the injectable system-call layer and what the others share;
* :mod:`~ckpt.adapters.posix.log`: the publication log, ``pub/``;
* :mod:`~ckpt.adapters.posix.tree`: the saves (kind, folders, marker files, listings, syncs);
* :mod:`~ckpt.adapters.posix.removal`: descriptor-based removal of a save's folder;
* :mod:`~ckpt.adapters.posix.journal`: the prune journal files;
* :mod:`~ckpt.adapters.posix.small_files`: one small file beside the saves (an execution's epoch record).

Every flow (publish, resolve, prune, ...) is ``ckpt.application.CheckpointStore``'s; :class:`PosixStore` only
assembles the ports for a root.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import TYPE_CHECKING

from ckpt.adapters.posix.journal import PosixJournal
from ckpt.adapters.posix.log import PosixLog
from ckpt.adapters.posix.pins import PosixPins
from ckpt.adapters.posix.small_files import write_small_file
from ckpt.adapters.posix.syscalls import CREATE_FLAGS, PosixRoot, Syscalls
from ckpt.adapters.posix.tree import PosixTree
from ckpt.application.checkpoint_store import CheckpointStore
from ckpt.domain.arguments import require_str
from ckpt.domain.errors import InvalidError
from ckpt.domain.journal import JOURNAL_PREFIX
from ckpt.domain.locator import Locator
from ckpt.domain.ports import ExclusiveCreateProbe

if TYPE_CHECKING:
    from ckpt.domain.saves_reader import TreeReader

__all__ = ["JOURNAL_PREFIX", "PosixStore", "Syscalls"]


def _normalized_root(root: str) -> str:
    """Return the canonical form of an absolute root path; ``InvalidError`` for anything else.

    The root is taken as the kernel resolves it: a ``.`` or ``..`` element is refused, never normalised as
    text (``/a/link/../root`` is not ``/a/root`` when ``link`` is a symbolic link); only repeated and
    trailing slashes go, as they change nothing.
    """
    if not require_str(root, "root").startswith("/"):
        raise InvalidError(f"root {root!r} is not an absolute path")
    if "\x00" in root:
        raise InvalidError(f"root {root!r} contains NUL")
    elements = [element for element in root.split("/") if element]
    if "." in elements or ".." in elements:
        raise InvalidError(
            f"root {root!r} has a '.' or '..' path element: give the folder's own path, as the kernel "
            "would resolve it differently from the text"
        )
    return "/" + "/".join(elements)


class PosixStore(CheckpointStore):
    """A checkpoint root on a POSIX filesystem: an absolute path to a directory that already exists.

    ``syscalls`` replaces the system-call layer (tests fail chosen calls through it).
    """

    __slots__ = ("_at",)

    def __init__(self, root: str, *, syscalls: Syscalls | None = None) -> None:
        normalized = _normalized_root(root)
        self._at = PosixRoot(normalized, syscalls if syscalls is not None else Syscalls())
        locator = Locator(normalized, scheme="/", form="an absolute path")
        tree = PosixTree(self._at)
        pins = PosixPins(normalized, self._at.sys)
        super().__init__(PosixLog(self._at), tree, locator, PosixJournal(self._at), pins)

    def saves_reader(self, location: str) -> TreeReader:
        """The ``ReadsSaves`` capability: ``pread`` tails and one ``scandir`` per listing.

        A subclass, or a store given its own system calls (a test's fault injection), is read through the
        ``WatchStore`` port instead, so whatever it overrides is honoured. Both readers come with the rules
        they serve, which a ``resolve`` never needs: they are imported here, not with the store.
        """
        from ckpt.adapters.posix_saves import PosixSaves
        from ckpt.application.inspection import StoreSaves

        if type(self) is PosixStore and type(self._at.sys) is Syscalls:
            return PosixSaves(location, root=self.root)
        return StoreSaves(self, location)

    def write_file(self, location: str, name: str, data: bytes) -> None:
        """The ``WritesSmallFiles`` capability: write ``name`` inside the folder at ``location``, creating
        folders, atomically and durably (:mod:`~ckpt.adapters.posix.small_files`)."""
        write_small_file(self._at, *self.small_file_of(location, name, data))

    def probe_exclusive_create(self) -> ExclusiveCreateProbe:
        """Create a probe file twice with ``O_EXCL`` beside ``pub/``; the second create must fail with EEXIST.

        Also proves the root is writable and that fsync works on it. The probe is removed afterwards.
        """
        at = self._at
        calls = at.sys
        path = os.path.join(at.root, f".ckpt-doctor-{os.getpid()}-{os.urandom(4).hex()}")
        try:
            calls.close(calls.open(path, CREATE_FLAGS, 0o600))
        except OSError as exc:
            return ExclusiveCreateProbe(False, path, f"cannot create a file in {at.root}: {exc.strerror}")
        try:
            try:
                calls.close(calls.open(path, CREATE_FLAGS, 0o600))
            except FileExistsError:
                pass
            else:
                detail = f"a second O_EXCL create of {path} succeeded: exclusive create is not honoured"
                return ExclusiveCreateProbe(False, path, detail)
            try:
                at.sync_dir(at.root)
            except OSError as exc:
                return ExclusiveCreateProbe(False, path, f"fsync of {at.root} failed: {exc.strerror}")
            return ExclusiveCreateProbe(True, path, f"O_EXCL honoured and fsync works in {at.root}")
        finally:
            with suppress(OSError):
                calls.unlink(path)
