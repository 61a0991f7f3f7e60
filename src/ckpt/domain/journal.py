"""The prune journal's format (docs/spec/layout.md §5; vectors: tests/vectors/journal.json).

Before a prune removes anything, it records the folders it is about to remove in a journal object beside the
log (POSIX: ``<root>/.ckpt-prune-<16 hex>``; S3: the key ``<prefix>.ckpt-prune-<16 hex>``). A later prune
reads every journal, removes the folders they list that no entry needs, and drops them. So a prune that
fails or is killed after removing entries leaks no folder.

The format, byte for byte::

    ckpt prune journal 1\\n
    <folder>\\n            one save path per line, zero or more
    end\\n

Rules:

1. A journal without its last line (``end``) was being written when its prune stopped, before that prune
   removed anything: it lists nothing.
2. A finished journal must be UTF-8, start with the header, and list only valid save paths; anything else
   is ``MalformedError`` naming the journal. It is never decoded leniently: a byte replaced by U+FFFD would
   name another folder, and prune would remove that one.

Pure: standard library and attrs only.
"""

from __future__ import annotations

from collections.abc import Iterable

from ckpt.domain.entries import save_error
from ckpt.domain.errors import MalformedError

__all__ = ["JOURNAL_PREFIX", "format_journal", "parse_journal"]

#: How every journal's name starts (the rest is 16 lower-case hex digits).
JOURNAL_PREFIX = ".ckpt-prune-"
_HEADER = "ckpt prune journal 1"
_FOOTER = "end"


def format_journal(folders: Iterable[str]) -> bytes:
    """Return the journal listing ``folders`` (save paths), in the order given.

    >>> format_journal(["exec/a/ck-1"])
    b'ckpt prune journal 1\\nexec/a/ck-1\\nend\\n'
    """
    return "\n".join((_HEADER, *folders, _FOOTER, "")).encode("utf-8")


def parse_journal(name: str, data: bytes) -> list[str]:
    """Return the folders the journal ``name`` lists (``[]`` for an unfinished one); ``MalformedError`` else.

    >>> parse_journal("j", b"ckpt prune journal 1\\nexec/a/ck-1\\n")
    []
    """
    # Rule 1 on the bytes: an unfinished journal may end inside a multi-byte character.
    ends = data.split(b"\n")
    if len(ends) < 3 or ends[-2:] != [_FOOTER.encode(), b""]:
        return []  # rule 1: never finished, so its prune removed nothing
    try:
        lines = data.decode("utf-8").split("\n")
    except UnicodeDecodeError as exc:
        # Never decoded leniently: a replaced byte would name another folder, which prune would remove.
        raise MalformedError(
            f"prune journal {name!r} is not UTF-8 (byte {exc.start} of {len(data)})", value=name
        ) from None
    if lines[0] != _HEADER:
        raise MalformedError(f"prune journal {name!r} does not start with {_HEADER!r}", value=name)
    folders = lines[1:-2]
    for folder in folders:
        reason = save_error(folder)
        if reason is not None:
            raise MalformedError(
                f"prune journal {name!r} lists a bad folder: save {folder!r} {reason}", value=name
            )
    return folders
