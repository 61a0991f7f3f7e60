"""The zip end check for the rules: is a file a complete zip, judged from its size and its last bytes.

``torch.save`` writes a zip (the default since torch 1.6, and what DeepSpeed, Lightning and the Trainer's
``rng_state_<i>.pth`` use), and writes its end last. The check itself lives in ``ckpt.domain.zip_end``
(spec/watcher.md §2.4): an end-of-central-directory record ends the file exactly, and the central
directory it describes (through the ZIP64 end record and locator when there are some) lies inside the file,
ends exactly where those records begin, and starts with a directory header. So a file cut short anywhere,
and a file cut right after a zip stored inside it, both fail. It needs the last :data:`TAIL_BYTES` bytes and,
when the directory starts before them, 4 bytes more (``Tail.span``; ``ckpt.application.inspection`` reads
them).

Pure: the domain only.
"""

from __future__ import annotations

from ckpt.domain.rules.model import Tail
from ckpt.domain.zip_end import ZIP_TAIL_BYTES, zip_end_problem

__all__ = ["TAIL_BYTES", "is_complete_zip", "zip_problem"]

TAIL_BYTES = ZIP_TAIL_BYTES
"""How many bytes from the end of a file the check reads first: the end records and the longest comment."""


def zip_problem(tail: Tail) -> str | None:
    """Why the file ``tail`` was read from is not a complete zip, or ``None`` when it is."""
    return zip_end_problem(tail.size, tail.data, tail.span)


def is_complete_zip(tail: bytes | Tail) -> bool:
    """Whether ``tail`` is a complete zip: a :class:`Tail` as read, or bytes that are the whole file.

    >>> record = b"PK\\x05\\x06" + bytes(16) + (2).to_bytes(2, "little") + b"hi"
    >>> is_complete_zip(record), is_complete_zip(record[:-1]), is_complete_zip(b"data" + record)
    (True, False, False)
    """
    if isinstance(tail, bytes):
        tail = Tail(len(tail), tail)
    return zip_problem(tail) is None
