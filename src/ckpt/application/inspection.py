"""Gathering what a framework rule needs to see of a save, through a small reader port.

A rule (``ckpt.domain.rules``) is pure: it says what it needs (:class:`~ckpt.domain.rules.Needs`) and
judges a :class:`~ckpt.domain.rules.SaveView`. This module is the one place that turns the first into the
second, by asking a :class:`TreeReader` (a store seen from one saves location). The watcher and verified
resolve both use it, so a rule reads the same way everywhere.

Rules:

1. ``needs`` is asked without a listing; when it wants one, the save is listed (a folder save only) and
   ``needs`` is asked again with the listing, so what is read can depend on what is there.
2. Heads are read with one byte over the rule's limit, so the rule can tell "larger than the limit"; the
   tail of a file larger than its limit is read too (one more read, only then), so that the rule can judge
   a file too large to read whole by its two ends.
3. Tails are read at most ``TAIL_BYTES`` from the end (a ranged read on S3, ``pread`` on POSIX). When the
   reader can run reads side by side (``map_concurrently``), the tails go through it (S3 bounds the
   concurrency), else one after the other. A tail the rule asked for that ends as a zip whose central
   directory starts before it gets one more read, of 4 bytes there (``zip_end.zip_second_read``, spec/
   watcher.md §2.4), the same way: at most two reads a file.
4. A save the rule finds complete must hold something (``ckpt.domain.rules.presence``, spec/watcher.md
   §2.6): when what the rule read does not show it, the folder is listed (or the file's first byte read)
   once more. :func:`judge` and :func:`judge_for_watch` both apply it, so verified resolve, the watcher and
   catch-up never hand out a save that is gone or empty, whatever the rule; :func:`gather_view` alone does
   not (it only reads what the rule asks for).
5. A folder save that a restore is filling (it holds :data:`~ckpt.domain.manifest.RESTORING_NAME`, spec/
   tiered.md §6.3) is never complete, whatever the rule found: checked after the rule passes, by one
   ``is_file``, and only through a reader that says it ``holds_restores`` (POSIX: a restore writes only
   into a fast root, never into S3), so that no request is spent where no restore can be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import attrs

from ckpt.domain.manifest import RESTORING, RESTORING_NAME
from ckpt.domain.ports import FileInfo, WatchStore
from ckpt.domain.rules import TAIL_BYTES, Item, Kind, Rule, Save, SaveView, Tail
from ckpt.domain.rules.presence import absence_reason, shows_content
from ckpt.domain.rules.settle import Look, Settled, settle_verdict
from ckpt.domain.saves_reader import ReadsSaves, TreeReader
from ckpt.domain.zip_end import Span, zip_second_read

__all__ = ["StoreSaves", "TreeReader", "gather_view", "judge", "judge_for_watch", "saves_reader"]

_T = TypeVar("_T")
_R = TypeVar("_R")


def _serially(function: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    return [function(item) for item in items]


def gather_view(rule: Rule, save: Save, items: Sequence[Item], reader: TreeReader) -> SaveView:
    """Read what ``rule`` needs of ``save`` (rules 1-3) and return the view to judge."""
    needs = rule.needs(save, None)
    files: tuple[FileInfo, ...] | None = None
    if needs.listing:
        files = tuple(reader.files(save.name)) if save.kind is Kind.FOLDER else ()
        needs = rule.needs(save, files)
    present = {path: reader.is_file(path) for path in needs.exists}
    heads = {path: reader.head(path, limit + 1) for path, limit in needs.heads}
    larger = [path for path, limit in needs.heads if len(heads[path] or b"") > limit]
    tail_paths = (*needs.tails, *(path for path in larger if path not in needs.tails))
    mapper: Callable[[Callable[[str], Tail | None], Iterable[str]], list[Tail | None]] = getattr(
        reader, "map_concurrently", _serially
    )
    tails = dict(zip(tail_paths, mapper(lambda p: reader.tail(p, TAIL_BYTES), tail_paths), strict=True))
    return SaveView(save, tuple(items), files, present, heads, _with_second_reads(tails, needs.tails, reader))


def _with_second_reads(
    tails: dict[str, Tail | None], paths: Iterable[str], reader: TreeReader
) -> dict[str, Tail | None]:
    """``tails`` with the zip check's second read added where it asks for one (rule 3)."""
    wanted = []
    for path in paths:
        tail = tails.get(path)
        where = None if tail is None else zip_second_read(tail.size, tail.data)
        if where is not None:
            wanted.append((path, where))
    if not wanted:
        return tails
    mapper: Callable[..., list[Any]] = getattr(reader, "map_concurrently", _serially)
    read = mapper(lambda job: reader.read_range(job[0], *job[1]), wanted)
    added = dict(tails)
    for (path, (offset, _)), data in zip(wanted, read, strict=True):
        tail = added[path]
        if data is not None and tail is not None:
            added[path] = attrs.evolve(tail, span=Span(offset, data))
    return added


def _judged(rule: Rule, save: Save, items: Sequence[Item], reader: TreeReader) -> tuple[SaveView, str | None]:
    """Gather and judge one save, then check that a save the rule passes is not being restored (rule 5) and
    holds something (rule 4)."""
    view = gather_view(rule, save, items, reader)
    reason = rule.judge(view)
    if reason is not None:
        return view, reason
    restorable = save.kind is Kind.FOLDER and getattr(reader, "holds_restores", False)
    if restorable and reader.is_file(f"{save.name}/{RESTORING_NAME}"):
        return view, RESTORING
    if shows_content(view) is None:
        if save.kind is Kind.FOLDER:
            view = attrs.evolve(view, files=tuple(reader.files(save.name)))
        else:
            view = attrs.evolve(view, heads={**view.heads, save.name: reader.head(save.name, 1)})
    return view, absence_reason(view)


def judge(rule: Rule, save: Save, items: Sequence[Item], reader: TreeReader) -> str | None:
    """Gather and judge one save: ``None`` when complete and holding something (rule 4), else why not."""
    return _judged(rule, save, items, reader)[1]


def judge_for_watch(
    rule: Rule,
    save: Save,
    items: Sequence[Item],
    reader: TreeReader,
    *,
    settle: float,
    since: Look | None,
    clock: Callable[[], float],
) -> Settled:
    """Judge one save for the watcher: the rule's verdict and rule 4, then settle (``rules.settle``).

    The look settle compares is the save's listing (files and sizes), or for a single-file save its name and
    size; it is taken only when the save is complete and ``settle > 0``. When the rule (or rule 4) already
    listed the save, that listing serves (timed around the whole gathering, which only makes the wait
    longer, never shorter).
    """
    before = clock()
    view, reason = _judged(rule, save, items, reader)
    after = clock()
    look = None
    if reason is None and settle > 0 and view.files is not None and save.kind is Kind.FOLDER:
        look = Look(view.files, before, after)
    elif reason is None and settle > 0:
        started = clock()
        if save.kind is Kind.FOLDER:
            files = tuple(reader.files(save.name))
        else:
            tail = reader.tail(save.name, 1)
            files = () if tail is None else (FileInfo(save.name, tail.size),)
        look = Look(files, started, clock())
    return settle_verdict(reason, settle=settle, look=look, since=since)


class StoreSaves:
    """A :class:`TreeReader` over any :class:`~ckpt.domain.ports.WatchStore`, for stores without their own.

    It sees folders only (the port lists no files beside them, so single-file saves are invisible), and it
    reads whole files to cut heads and tails: right for the in-memory fake, not for a real store.
    """

    def __init__(self, store: WatchStore, location: str) -> None:
        self._store = store
        self._base = location.rstrip("/")

    def items(self) -> list[Item]:
        return [Item(folder.name, Kind.FOLDER) for folder in self._store.folders(self._base)]

    def files(self, path: str) -> list[FileInfo]:
        return self._store.files(f"{self._base}/{path}")

    def is_file(self, path: str) -> bool:
        return self._store.exists(self._base, path)

    def head(self, path: str, limit: int) -> bytes | None:
        data = self._store.read_file(self._base, path)
        return None if data is None else data[:limit]

    def tail(self, path: str, size: int) -> Tail | None:
        data = self._store.read_file(self._base, path)
        return None if data is None else Tail(len(data), data[-size:] if size else b"")

    def read_range(self, path: str, offset: int, length: int) -> bytes | None:
        data = self._store.read_file(self._base, path)
        return None if data is None else data[max(0, offset) : max(0, offset) + max(0, length)]


def saves_reader(store: WatchStore, location: str) -> TreeReader:
    """The reader for the saves location ``location`` of ``store``: the store's own where it offers one
    (``ReadsSaves``: POSIX ``pread`` tails, S3 ranged reads and one delimited listing), else
    :class:`StoreSaves` through its ``WatchStore`` port. Only a store whose class defines the capability
    counts: a wrapper that forwards unknown attributes to another store (a spy) is read through its own
    port, so what it overrides is honoured."""
    if isinstance(store, ReadsSaves) and hasattr(type(store), "saves_reader"):
        return store.saves_reader(location)
    return StoreSaves(store, location)
