"""The zip end-of-central-directory check: is a file a complete zip, judged from its last bytes.

``torch.save`` writes a zip (the default since torch 1.6, and what DeepSpeed, Lightning and the Trainer's
``rng_state_<i>.pth`` use). A zip ends with its end-of-central-directory record: the signature
``PK\\x05\\x06``, 18 more bytes whose last two are the length ``c`` of a trailing comment, then the comment.
A file is complete when that record ends exactly at the end of the file, that is, the signature sits at
``size - 22 - c``. A file cut short anywhere before its last byte has no such record at its end (the record
is the last thing written), so the check needs only the last ``22 + 65535`` bytes. A zip64 file still ends
with the classic record (its fields saturated), so the same check holds.

Pure: the domain only.
"""

from __future__ import annotations

from ckpt.domain.frameworks import ZIP_TAIL_BYTES, FileTail, check_zip_tail

__all__ = ["TAIL_BYTES", "is_complete_zip"]

TAIL_BYTES = ZIP_TAIL_BYTES
"""How many bytes from the end of a file the check may need: the record plus the longest comment."""


def is_complete_zip(tail: bytes) -> bool:
    """Whether ``tail`` (a file's last bytes, or all of it) ends with a zip end-of-central-directory record.

    The one check is ``ckpt.domain.frameworks.check_zip_tail`` (the ``hf`` rank rule's); this is its
    yes-or-no form for the other rules.

    >>> record = b"PK\\x05\\x06" + bytes(16) + (2).to_bytes(2, "little") + b"hi"
    >>> is_complete_zip(b"data" + record), is_complete_zip(b"data" + record[:-1])
    (True, False)
    """
    return check_zip_tail(FileTail(len(tail), tail)) is None
