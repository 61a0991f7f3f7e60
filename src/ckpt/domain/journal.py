"""The prune journal and its decision: their formats and the rule that decides which entries stay removed
(docs/spec/layout.md §5; vectors: tests/vectors/journal.json, tests/vectors/decision.json).

Before a prune removes anything, it records the folders and the entries it is about to remove in a journal
object beside the log (POSIX: ``<root>/.ckpt-prune-<16 hex>``; S3: the key ``<prefix>.ckpt-prune-<16 hex>``).
A later prune reads every journal, removes the folders they list that no entry needs, and drops them. So a
prune that fails or is killed after removing entries leaks no folder.

After removing its entries, a prune reads the entries and then the pins and *decides* its journal: it creates,
exclusively, the journal's **decision** (``<journal>.decided``), which lists the entries removed for good:
those of the journal absent from that listing and named by no pin. Every other entry of the journal is
*spared*: it must exist, and whoever finds it absent (any later prune, or a pinner) creates it again. Whoever
creates the decision first decides for everyone (the prune, a later prune taking over a journal whose prune
died, a pinner that found its entry gone); the others read it and follow it. That is what makes a pin that
returned hold its entry whatever single fault or kill hits a prune (docs/adr/0019, "Pins that hold").

The formats, byte for byte::

    ckpt prune journal 2\\n              ckpt prune decision 1\\n
    folder <save path>\\n                 <entry name>\\n     (removed for good)
    entry <entry name>\\n                 end\\n
    end\\n

A journal of version 1 (``ckpt prune journal 1``, then one save path a line, then ``end``) lists folders
and no entry; it is still read.

Rules:

1. A journal without its last line (``end``) was being written when its prune stopped, before that prune
   removed anything: it lists nothing. A decision is created whole (the stores create it atomically), so an
   unfinished one is malformed.
2. A finished journal or decision must be UTF-8, start with its header, and list only valid save paths and
   entry names; anything else is ``MalformedError`` naming it. Never decoded leniently: a byte replaced by
   U+FFFD would name another folder, and prune would remove that one.
3. :func:`decide`: removed for good are the journal's entries absent from a listing of the entries read
   *before* the pins, and named by no pin of that reading. (A pin that returned read its entry present after
   creating the pin; if the entry was then absent from the decider's listing, the pin was there before the
   decider read the pins.)
4. :func:`read_control` pairs each journal with its decision; a decision whose journal is gone is an orphan,
   dropped by the next prune, and so is a decision's temporary object (a name holding
   :data:`TEMPORARY_MARK`, which a store may write before it makes the decision visible whole).
   Journals are dropped before their decisions, never the other way round: a journal whose decision
   vanished would be decided again, and a stray pin could then spare an entry whose folder is gone.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import attrs

from ckpt.domain.entries import Entry, save_error, sort_entries
from ckpt.domain.errors import MalformedError
from ckpt.domain.names import format_entry_name, parse_entry_name

__all__ = [
    "DECISION_SUFFIX",
    "JOURNAL_PREFIX",
    "TEMPORARY_MARK",
    "Journal",
    "JournalContent",
    "decide",
    "format_decision",
    "format_journal",
    "parse_decision",
    "parse_journal",
    "read_control",
    "read_journal",
]

#: How every journal's name starts (the rest is 16 lower-case hex digits).
JOURNAL_PREFIX = ".ckpt-prune-"
#: A journal's decision is named as the journal, with this after it.
DECISION_SUFFIX = ".decided"
#: In the name of a decision's temporary object (``<journal>.decided.tmp-<hex>``): never read, always dropped.
TEMPORARY_MARK = ".tmp-"
_HEADER_1 = "ckpt prune journal 1"
_HEADER = "ckpt prune journal 2"
_DECISION_HEADER = "ckpt prune decision 1"
_FOOTER = "end"
_FOLDER = "folder "
_ENTRY = "entry "


@attrs.frozen
class JournalContent:
    """What a journal lists: the folders to remove and the entries being removed (names)."""

    folders: tuple[str, ...] = ()
    entries: tuple[Entry, ...] = ()


@attrs.frozen
class Journal:
    """One journal as read, with its decision: ``removed`` is ``None`` while undecided."""

    identifier: str
    content: JournalContent
    removed: frozenset[Entry] | None = None
    decision: str | None = None  # the decision's identifier, when there is one

    @property
    def spared(self) -> tuple[Entry, ...]:
        """The journal's entries that must exist (not removed for good); none while undecided."""
        if self.removed is None:
            return ()
        return tuple(e for e in self.content.entries if e not in self.removed)

    @property
    def folders(self) -> tuple[str, ...]:
        return self.content.folders


def format_journal(folders: Iterable[str], entries: Iterable[Entry] = ()) -> bytes:
    """Return the journal listing ``folders`` (save paths) and ``entries``, each in the order given.

    >>> text = format_journal(["exec/a/ck-1"], [Entry(2, 100, "exec/a/ck-1")])
    >>> text.decode().splitlines()  # doctest: +NORMALIZE_WHITESPACE
    ['ckpt prune journal 2', 'folder exec/a/ck-1',
     'entry 00000000000000000002-00000000000000000100-MV4GKYZPMEXWG2ZNGE', 'end']
    """
    lines = [_HEADER, *(_FOLDER + f for f in folders), *(_ENTRY + format_entry_name(e) for e in entries)]
    return "\n".join((*lines, _FOOTER, "")).encode("utf-8")


def _lines(kind: str, name: str, data: bytes) -> list[str] | None:
    """The lines between header and footer, header first; ``None`` when the footer is missing (rule 1)."""
    ends = data.split(b"\n")
    if len(ends) < 3 or ends[-2:] != [_FOOTER.encode(), b""]:
        return None
    try:
        return data.decode("utf-8").split("\n")[:-2]
    except UnicodeDecodeError as exc:
        # Never decoded leniently: a replaced byte would name another folder, which prune would remove.
        raise MalformedError(
            f"prune {kind} {name!r} is not UTF-8 (byte {exc.start} of {len(data)})", value=name
        ) from None


def _folder(name: str, folder: str) -> str:
    reason = save_error(folder)
    if reason is not None:
        raise MalformedError(
            f"prune journal {name!r} lists a bad folder: save {folder!r} {reason}", value=name
        )
    return folder


def _entry(kind: str, name: str, text: str) -> Entry:
    try:
        return parse_entry_name(text)
    except MalformedError as exc:
        raise MalformedError(f"prune {kind} {name!r} lists a bad entry: {exc.why}", value=name) from None


def read_journal(name: str, data: bytes) -> JournalContent:
    """Return what the journal ``name`` lists (nothing for an unfinished one); ``MalformedError`` else.

    >>> read_journal("j", b"ckpt prune journal 1\\nexec/a/ck-1\\nend\\n")
    JournalContent(folders=('exec/a/ck-1',), entries=())
    """
    lines = _lines("journal", name, data)
    if lines is None:
        return JournalContent()  # rule 1: never finished, so its prune removed nothing
    header, body = lines[0], lines[1:]
    if header == _HEADER_1:
        return JournalContent(tuple(_folder(name, f) for f in body))
    if header != _HEADER:
        raise MalformedError(f"prune journal {name!r} does not start with {_HEADER!r}", value=name)
    folders: list[str] = []
    entries: list[Entry] = []
    for line in body:
        if line.startswith(_FOLDER):
            folders.append(_folder(name, line[len(_FOLDER) :]))
        elif line.startswith(_ENTRY):
            entries.append(_entry("journal", name, line[len(_ENTRY) :]))
        else:
            raise MalformedError(
                f"prune journal {name!r} has a line that is neither 'folder ...' nor 'entry ...': {line!r}",
                value=name,
            )
    return JournalContent(tuple(folders), tuple(entries))


def parse_journal(name: str, data: bytes) -> list[str]:
    """Return the folders the journal ``name`` lists (``[]`` for an unfinished one); ``MalformedError`` else.

    >>> parse_journal("j", b"ckpt prune journal 2\\nfolder exec/a/ck-1\\n")
    []
    """
    return list(read_journal(name, data).folders)


def format_decision(removed: Iterable[Entry]) -> bytes:
    """Return the decision listing the entries ``removed`` for good, ascending.

    >>> format_decision([])
    b'ckpt prune decision 1\\nend\\n'
    """
    names = [format_entry_name(e) for e in sort_entries(removed)]
    return "\n".join((_DECISION_HEADER, *names, _FOOTER, "")).encode("utf-8")


def parse_decision(name: str, data: bytes) -> frozenset[Entry]:
    """Return the entries the decision ``name`` removed for good; ``MalformedError`` for anything else."""
    lines = _lines("decision", name, data)
    if lines is None:
        raise MalformedError(f"prune decision {name!r} does not end with {_FOOTER!r}", value=name)
    if lines[0] != _DECISION_HEADER:
        raise MalformedError(f"prune decision {name!r} does not start with {_DECISION_HEADER!r}", value=name)
    return frozenset(_entry("decision", name, line) for line in lines[1:])


def decide(
    content: JournalContent, present: Collection[Entry], pinned: Collection[Entry]
) -> frozenset[Entry]:
    """Return the entries of a journal removed for good (rule 3): absent from ``present`` (read first) and
    named by none of ``pinned`` (read after).

    >>> a, b = Entry(1, 1, "exec/a/ck-1"), Entry(1, 2, "exec/a/ck-2")
    >>> sorted(decide(JournalContent((), (a, b)), present=[], pinned=[b]), key=lambda e: e.key)
    [Entry(epoch=1, step=1, save='exec/a/ck-1')]
    """
    there, kept = set(present), set(pinned)
    return frozenset(e for e in content.entries if e not in there and e not in kept)


def read_control(objects: Sequence[tuple[str, bytes]]) -> tuple[list[Journal], list[str]]:
    """Return the journals among ``objects`` (as a store lists them, identifier and content), each with its
    decision, in identifier order, and the identifiers of orphan decisions (rule 4)."""
    temporary = [name for name, _ in objects if TEMPORARY_MARK in name.rpartition("/")[2]]
    decisions = {name: data for name, data in objects if name.endswith(DECISION_SUFFIX)}
    journals: list[Journal] = []
    for name, data in sorted(objects):
        if name.endswith(DECISION_SUFFIX) or name in temporary:
            continue
        decision = name + DECISION_SUFFIX
        found = decisions.pop(decision, None)
        removed = None if found is None else parse_decision(decision, found)
        journals.append(
            Journal(name, read_journal(name, data), removed, decision if found is not None else None)
        )
    return journals, sorted([*decisions, *temporary])
