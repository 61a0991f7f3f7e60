"""What a framework rule sees of a save, and what it answers: the values every rule shares.

A rule never reads anything. It works in three pure steps, and the caller (the watcher, verified resolve)
does the reading in between:

1. :meth:`Rule.saves` takes the listing of the *saves location* (the folder the framework saves into: its
   folders and regular files, never links) and returns the items that are saves, each with its step, in
   step order;
2. :meth:`Rule.needs` says what the rule must see of one save: a listing of its files, whether some files
   exist, the first bytes of a few (bounded), the tail of a few (for the zip end record). It is asked once
   without a listing and, when it wants one, again with it, so what it reads can depend on what is there;
3. :meth:`Rule.judge` takes the :class:`SaveView` the caller gathered and returns ``None`` when the save is
   complete, else the reason it is not.

Paths in :class:`Needs` and :class:`SaveView` are relative to the saves location and slash-separated:
``global_step5/mp_rank_00_model_states.pt`` is inside the save ``global_step5``, ``latest`` is a file
beside it, and a single-file save (a Lightning ``.ckpt``) is read under its own name.

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from ckpt.domain.ports import FileInfo
from ckpt.domain.zip_end import Span

__all__ = [
    "HEAD_LIMIT",
    "Item",
    "Kind",
    "Needs",
    "Rule",
    "Save",
    "SaveView",
    "Tail",
    "in_save",
]

HEAD_LIMIT = 64 * 1024
"""The default cap on the bytes a rule reads from the start of a marker file."""


class Kind(enum.Enum):
    """What a name in the saves location is: a folder or a regular file (links are never saves)."""

    FOLDER = "folder"
    FILE = "file"

    def __str__(self) -> str:
        return self.value


@attrs.frozen
class Item:
    """One name directly inside the saves location, and whether it is a folder or a regular file."""

    name: str
    kind: Kind = Kind.FOLDER


@attrs.frozen
class Save:
    """An item that is a save under a rule: its name, kind and the step it stands for."""

    step: int
    name: str
    kind: Kind = Kind.FOLDER

    @property
    def key(self) -> tuple[int, str]:
        """Step order, ties by name (code-point order)."""
        return (self.step, self.name)


@attrs.frozen
class Tail:
    """The last bytes of a file (at most what was asked for) and the file's whole size.

    ``span`` is the zip check's second read (a few bytes at the central directory's offset), which the
    caller makes only when ``ckpt.domain.zip_end.zip_second_read`` asks for it (spec/watcher.md §2.4).
    """

    size: int
    data: bytes
    span: Span | None = None


@attrs.frozen
class Needs:
    """What a rule must see of one save before it can judge it (paths relative to the saves location).

    ``listing``: every file inside the save (names and sizes, recursively). ``exists``: whether each path
    is a regular file. ``heads``: the first bytes of each path, at most its limit (the caller reads one
    byte more, so the rule can tell "larger than the limit"). ``tails``: the last
    :data:`~ckpt.domain.rules.zipend.TAIL_BYTES` bytes of each path and its size, and, when the zip
    check asks for it, a few bytes more at its central directory (``Tail.span``).
    """

    listing: bool = False
    exists: tuple[str, ...] = ()
    heads: tuple[tuple[str, int], ...] = ()
    tails: tuple[str, ...] = ()


@attrs.frozen
class SaveView:
    """Everything the caller gathered about one save, as its rule's :class:`Needs` asked.

    ``items`` is the listing of the saves location the save was found in. ``files`` is the save's own
    listing (paths relative to the save), or ``None`` when none was asked for. ``present`` answers the
    ``exists`` questions; ``heads`` and ``tails`` map each asked path to what was read, ``None`` when the
    path is not a regular file.
    """

    save: Save
    items: tuple[Item, ...] = ()
    files: tuple[FileInfo, ...] | None = None
    present: Mapping[str, bool] = attrs.field(factory=dict)
    heads: Mapping[str, bytes | None] = attrs.field(factory=dict)
    tails: Mapping[str, Tail | None] = attrs.field(factory=dict)

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a regular file, from whichever fact the caller gathered about it."""
        if path in self.present:
            return self.present[path]
        if self.heads.get(path) is not None or self.tails.get(path) is not None:
            return True
        prefix = f"{self.save.name}/"
        if self.files is not None and path.startswith(prefix):
            inner = path[len(prefix) :]
            return any(f.path == inner for f in self.files)
        return any(i.name == path and i.kind is Kind.FILE for i in self.items)


def in_save(save: Save, path: str) -> str:
    """The path of ``path`` (relative to the save) relative to the saves location."""
    return f"{save.name}/{path}"


class Rule(Protocol):
    """A framework rule: which names are saves, what to read of one, and whether it is complete.

    A rule may also have ``longest_name`` (a property, a str): its save name at the largest step, which
    every entry point checks fits in an entry name at start-up (``ckpt.domain.room``). Every built-in and
    configured rule has one; it is not a member of this protocol, so that a plugin without one still is a
    rule (held to the one-byte name ``x``).
    """

    @property
    def name(self) -> str:
        """The name ``--framework`` takes (``dcp``, ``lightning``, a configured or plugin name)."""
        ...

    @property
    def pattern(self) -> str:
        """The shape of a save name, for messages: ``step-<step>``, ``…step=<step>….ckpt``."""
        ...

    def saves(self, items: Sequence[Item]) -> list[Save]:
        """Return the items that are saves, in step order (ties by name); everything else is ignored."""
        ...

    def needs(self, save: Save, files: tuple[FileInfo, ...] | None) -> Needs:
        """Return what must be read of ``save``; ``files`` is its listing once one was asked for."""
        ...

    def judge(self, view: SaveView) -> str | None:
        """Return ``None`` when the save is complete, else why not (one short sentence)."""
        ...

    def settle_time(self, interval: float, given: float | None = None) -> float:
        """The settle time in the watcher for a scan interval of ``interval`` and the ``given`` one (``None``:
        none given). Most rules take a given time and default to one of their own; a rule whose markers alone
        decide may ignore it."""
        ...
