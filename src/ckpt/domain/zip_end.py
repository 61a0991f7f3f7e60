"""The zip end check: is a file a whole zip, judged from its size, its last bytes and at most 4 bytes more.

``torch.save`` writes a zip (PyTorch's serialization format since torch 1.6), and writes its end last: the
central directory (one header per member, each starting ``PK\\x01\\x02``), then for a large archive the
ZIP64 end record (``PK\\x06\\x06``) and its locator (``PK\\x06\\x07``), then the end-of-central-directory
record (EOCD, ``PK\\x05\\x06``, 22 bytes and a comment). spec/watcher.md §2.4 owns the rule; in short, a
file is a complete zip when:

1. an EOCD ends exactly at the end of the file (its comment length included);
2. it describes one disk, and as many entries on it as in all;
3. when a ZIP64 locator sits right before it (or a field of the EOCD is saturated, ``0xFFFF`` or
   ``0xFFFFFFFF``, which says "see the ZIP64 record"), the locator points at a ZIP64 end record that ends
   exactly where the locator begins, and every EOCD field is either saturated or equal to the record's;
4. the central directory it describes lies inside the file and ends exactly where the EOCD (or the ZIP64
   end record) begins, is at least 46 bytes an entry, and is empty only with no entries;
5. the central directory's first 4 bytes are ``PK\\x01\\x02`` (when it has entries).

Offsets in a zip count from the start of the archive, so a zip stored *inside* the file (a checkpoint holding
a zip member, cut right after it) fails rule 4: its offsets do not agree with the outer file's size.

Reading: the last :data:`ZIP_TAIL_BYTES` bytes (the longest comment, the EOCD, the locator and a ZIP64 record
without extensible data) and, only when the central directory starts before them, :data:`SIGNATURE_BYTES`
more at the offset :func:`zip_second_read` names. Nothing else of the file is read.

Pure: standard library and attrs only.
"""

from __future__ import annotations

import attrs

__all__ = ["SIGNATURE_BYTES", "ZIP_TAIL_BYTES", "Span", "zip_end_problem", "zip_second_read"]

_EOCD = b"PK\x05\x06"
_EOCD_SIZE = 22
_LOCATOR = b"PK\x06\x07"
_LOCATOR_SIZE = 20
_ZIP64_END = b"PK\x06\x06"
_ZIP64_END_SIZE = 56  # without its extensible data sector
_CENTRAL_HEADER = b"PK\x01\x02"
_CENTRAL_HEADER_SIZE = 46  # the fixed part of one central directory header
_MAX_COMMENT = 0xFFFF
_U16, _U32 = 0xFFFF, 0xFFFFFFFF

ZIP_TAIL_BYTES = _EOCD_SIZE + _MAX_COMMENT + _LOCATOR_SIZE + _ZIP64_END_SIZE
"""How many bytes from the end the check reads first (65,633): everything but the directory's start."""

SIGNATURE_BYTES = len(_CENTRAL_HEADER)
"""How many bytes the second read takes, at the central directory's offset."""

NO_END_RECORD = "no end-of-central-directory record at its end"


@attrs.frozen
class Span:
    """``data`` read at byte ``offset`` of a file (the zip check's second read)."""

    offset: int
    data: bytes


@attrs.frozen
class _Directory:
    """Where one candidate end says its central directory is, or why that end does not hold."""

    problem: str | None
    offset: int = 0
    entries: int = 0


class _File:
    """The bytes known of one file: its last bytes, and maybe a span read elsewhere."""

    def __init__(self, size: int, tail: bytes, span: Span | None) -> None:
        self.size = size
        self.tail = tail
        self.start = size - len(tail)  # the file offset of tail[0]
        self.span = span

    def get(self, offset: int, length: int) -> bytes | None:
        """The ``length`` bytes at ``offset`` when known, else ``None``."""
        if offset < 0 or offset + length > self.size:
            return None
        if offset >= self.start:
            return self.tail[offset - self.start : offset - self.start + length]
        span = self.span
        if span is not None and span.offset <= offset and offset + length <= span.offset + len(span.data):
            return span.data[offset - span.offset : offset - span.offset + length]
        return None


def _le(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "little")


def _ends(tail: bytes) -> list[int]:
    """Where, in ``tail``, an EOCD signature sits whose comment length makes it end the file (rule 1)."""
    found = []
    lowest = max(0, len(tail) - _EOCD_SIZE - _MAX_COMMENT)
    limit = len(tail) - _EOCD_SIZE + len(_EOCD)  # the signature starts 22 bytes or more before the end
    while (at := tail.rfind(_EOCD, lowest, limit)) >= 0:
        if at + _EOCD_SIZE + _le(tail, at + 20, 2) == len(tail):
            found.append(at)
        limit = at + len(_EOCD) - 1  # look further back, past this match
    return found


def _directory(file: _File, at: int) -> _Directory:
    """Rules 2-4 for the EOCD at ``tail[at:]``: where the central directory is, or why it cannot be."""
    record = file.tail[at : at + _EOCD_SIZE]
    end = file.start + at  # the EOCD's file offset
    disk, cd_disk, on_disk, entries = (_le(record, i, 2) for i in (4, 6, 8, 10))
    cd_size, cd_offset = _le(record, 12, 4), _le(record, 16, 4)
    saturated = _U16 in (disk, cd_disk, on_disk, entries) or _U32 in (cd_size, cd_offset)
    locator = file.get(end - _LOCATOR_SIZE, _LOCATOR_SIZE)
    directory_end = end
    if locator is not None and locator.startswith(_LOCATOR):
        zip64 = _zip64(file, end - _LOCATOR_SIZE, locator)
        if isinstance(zip64, str):
            return _Directory(zip64)
        directory_end, fields = zip64
        values = (disk, cd_disk, on_disk, entries, cd_size, cd_offset)
        for value, full, saturation in zip(values, fields, (_U16,) * 4 + (_U32,) * 2, strict=True):
            if value not in (saturation, full):
                return _Directory("its end record and its ZIP64 end record disagree")
        disk, cd_disk, on_disk, entries, cd_size, cd_offset = fields
    elif saturated:
        return _Directory("its end record points to ZIP64 records that are not before it")
    if disk != 0 or cd_disk != 0 or on_disk != entries:
        return _Directory("its end record describes more than one disk")
    if cd_offset + cd_size != directory_end:
        return _Directory(
            f"its central directory ({cd_size} bytes at offset {cd_offset}) does not end where its end "
            f"record begins (offset {directory_end} of {file.size} bytes): a zip inside the file, or not a "
            "zip"
        )
    if cd_size < _CENTRAL_HEADER_SIZE * entries or (entries == 0) != (cd_size == 0):
        return _Directory(f"its central directory of {cd_size} bytes cannot hold {entries} entries")
    return _Directory(None, cd_offset, entries)


def _zip64(file: _File, locator_at: int, locator: bytes) -> str | tuple[int, tuple[int, ...]]:
    """Rule 3: where the ZIP64 end record begins and its six fields (as the EOCD's), or why not."""
    record_at, disks = _le(locator, 8, 8), _le(locator, 16, 4)
    if _le(locator, 4, 4) != 0 or disks > 1:
        return "its ZIP64 locator describes more than one disk"
    record = file.get(record_at, _ZIP64_END_SIZE)
    if record is None:
        return f"its ZIP64 end record (offset {record_at}) is not in the file's last {ZIP_TAIL_BYTES} bytes"
    if not record.startswith(_ZIP64_END):
        return f"no ZIP64 end record where its locator points (offset {record_at})"
    if record_at + 12 + _le(record, 4, 8) != locator_at:
        return "its ZIP64 end record does not end where its locator begins"
    fields = (_le(record, 16, 4), _le(record, 20, 4), _le(record, 24, 8), _le(record, 32, 8))
    return record_at, (*fields, _le(record, 40, 8), _le(record, 48, 8))


def zip_second_read(size: int, tail: bytes) -> tuple[int, int] | None:
    """The one more read the check needs, ``(offset, length)``, or ``None`` when ``tail`` is enough.

    It is the central directory's first :data:`SIGNATURE_BYTES` bytes, when they lie before ``tail`` (a
    directory larger than the tail: an archive of some thousand members) for the end nearest the file's end
    that holds by rules 1-4.

    >>> zip_second_read(100, b"PK\\x05\\x06" + bytes(18))
    """
    file = _File(size, tail, None)
    for at in _ends(tail) if len(tail) <= size else ():
        directory = _directory(file, at)
        if directory.problem is None:
            if directory.entries and file.get(directory.offset, SIGNATURE_BYTES) is None:
                return directory.offset, SIGNATURE_BYTES
            return None
    return None


def zip_end_problem(size: int, tail: bytes, span: Span | None = None) -> str | None:
    """Why the file of ``size`` bytes ending with ``tail`` is not a complete zip, or ``None`` when it is.

    ``span`` is the second read (:func:`zip_second_read`), when one was needed. The reason is that of the
    end nearest the file's end (a comment may hold a signature too).

    >>> zip_end_problem(22, b"PK\\x05\\x06" + bytes(18))
    >>> zip_end_problem(4, b"PK\\x03\\x04")
    'no end-of-central-directory record at its end'
    """
    if len(tail) > size:
        return "its tail is longer than the file"
    file = _File(size, tail, span)
    first: str | None = None
    for at in _ends(tail):
        directory = _directory(file, at)
        problem = directory.problem
        if problem is None and directory.entries:
            header = file.get(directory.offset, SIGNATURE_BYTES)
            if header is None:
                problem = f"its central directory (offset {directory.offset}) was not read"
            elif header != _CENTRAL_HEADER:
                problem = (
                    f"no central directory header at offset {directory.offset}: the directory was not "
                    "written (written out of order, or cut)"
                )
        if problem is None:
            return None
        first = problem if first is None else first
    return NO_END_RECORD if first is None else first
