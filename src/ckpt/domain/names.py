"""The entry-name wire format: one name in ``pub/`` per publication (spec/names.md).

Grammar (other ports must match it byte for byte)::

    name   = epoch "-" step "-" b32save          ; at most 255 bytes (NAME_MAX)
    epoch  = 20DIGIT                             ; zero-padded, value <= 18446744073709551615
    step   = 20DIGIT                             ; same
    b32save = RFC 4648 base32 of the save's UTF-8 bytes, alphabet A-Z 2-7, upper case, no padding

Rules this module enforces:

1. Parsing is exact: a name is accepted only when it is byte-for-byte what :func:`format_entry_name`
   produces for the entry it decodes to. That rules out lower case, padding, a 21-digit or overflowing
   number, extra separators, suffixes (``.tmp``), and base32 whose unused trailing bits are not zero.
2. The decoded save must itself be valid (spec/layout.md), else the name is malformed.
3. Two implementations live here on purpose. :func:`parse_entry_name` is the simple reference, one name at
   a time. :func:`parse_entry_names` and :func:`latest_entry_of_names` are the bulk paths used by
   ``entries`` and ``resolve``: they validate a whole listing with a few C-level passes (one translation of
   the joined number fields, one base-32 integer conversion, one translation of the decoded saves compared
   with their expected shape and one integer AND for the path rules; a regex over the saves only where
   those cannot decide) and fall back to the reference parser only to name the first bad name. Property
   tests hold the two to the same answers.

Pure: standard library and attrs only.
"""

from __future__ import annotations

import base64
import functools
import re
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import attrs

from ckpt.domain.arguments import require_instance, require_str
from ckpt.domain.entries import MAX_U64, NEVER_SAVES, RESERVED_PREFIX, Entry, save_error
from ckpt.domain.errors import InvalidError, MalformedError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_SAVE_BYTES",
    "LatestEntryScan",
    "decode_save",
    "encode_save",
    "format_entry_name",
    "latest_entry_name",
    "latest_entry_of_names",
    "parse_entry_name",
    "parse_entry_names",
]

MAX_NAME_BYTES = 255  # POSIX NAME_MAX
_NUMBER_DIGITS = 20  # an epoch or a step, zero-padded
_STEP_AT = _NUMBER_DIGITS + 1  # where a name's step starts, after "<epoch>-"
_PREFIX_LEN = 2 * _STEP_AT  # "<20 digits>-<20 digits>-"
MAX_B32_CHARS = MAX_NAME_BYTES - _PREFIX_LEN  # 213 characters of base32 ...
MAX_SAVE_BYTES = MAX_B32_CHARS * 5 // 8  # ... hold at most 133 bytes of save path

_MAX_U64_TEXT = f"{MAX_U64:020d}"


def _u64_pattern() -> str:
    """A regex for a 20-digit zero-padded decimal whose value is at most 2**64 - 1.

    Built from the digits of the maximum: for each position, the same prefix, a smaller digit, then any
    digits; or the maximum itself.
    """
    options = []
    for i, digit in enumerate(_MAX_U64_TEXT):
        if digit != "0":
            smaller = "0" if digit == "1" else f"0-{int(digit) - 1}"
            rest = _NUMBER_DIGITS - 1 - i
            options.append(f"{_MAX_U64_TEXT[:i]}[{smaller}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    options.append(_MAX_U64_TEXT)
    return "(?:" + "|".join(options) + ")"


def encode_save(save: str) -> str:
    """Return the unpadded upper-case RFC 4648 base32 of ``save``'s UTF-8 bytes.

    >>> encode_save("exec/a/ck-1")
    'MV4GKYZPMEXWG2ZNGE'
    """
    return base64.b32encode(save.encode("utf-8")).decode("ascii").rstrip("=")


def decode_save(text: str) -> bytes:
    """Decode unpadded base32 (no validation of canonical form: callers check that)."""
    return base64.b32decode(text + "=" * (-len(text) % 8))


def format_entry_name(entry: Entry) -> str:
    """Return the name of ``entry`` in ``pub/``; raise :class:`InvalidError` when it would exceed 255 bytes.

    >>> format_entry_name(Entry(2, 100, "exec/a/ck-1"))
    '00000000000000000002-00000000000000000100-MV4GKYZPMEXWG2ZNGE'
    """
    require_instance(entry, Entry, "entry")
    name = f"{entry.epoch:020d}-{entry.step:020d}-{encode_save(entry.save)}"
    if len(name) > MAX_NAME_BYTES:
        size = len(entry.save.encode("utf-8"))
        raise InvalidError(
            f"save {entry.save!r} is {size} bytes long; an entry name can carry at most {MAX_SAVE_BYTES}"
        )
    return name


def _malformed(name: str, why: str) -> MalformedError:
    return MalformedError(f"malformed entry name {name!r} in pub/: {why}", value=name, why=why)


def parse_entry_name(name: str) -> Entry:
    """Parse one name from ``pub/`` exactly; raise :class:`MalformedError` naming it otherwise.

    This is the reference implementation: simple, one name at a time.

    >>> parse_entry_name("00000000000000000002-00000000000000000100-MV4GKYZPMEXWG2ZNGE")
    Entry(epoch=2, step=100, save='exec/a/ck-1')
    """
    if not require_str(name, "entry name").isascii() or len(name) > MAX_NAME_BYTES:
        raise _malformed(name, "not an ASCII name of at most 255 bytes")
    parts = name.split("-", 2)
    if len(parts) != 3 or len(parts[0]) != _NUMBER_DIGITS or len(parts[1]) != _NUMBER_DIGITS:
        raise _malformed(name, "expected <20-digit epoch>-<20-digit step>-<base32 save>")
    epoch_text, step_text, b32 = parts
    for text, what in ((epoch_text, "epoch"), (step_text, "step")):
        if not (text.isdigit() and text.isascii()):
            raise _malformed(name, f"{what} is not 20 decimal digits")
        if int(text) > MAX_U64:
            raise _malformed(name, f"{what} does not fit in 64 bits")
    if not b32:
        raise _malformed(name, "the save part is empty")
    if re.fullmatch(r"[A-Z2-7]+", b32) is None:
        raise _malformed(name, "the save part is not upper-case unpadded base32 (A-Z, 2-7)")
    if len(b32) % 8 in (1, 3, 6):
        raise _malformed(name, "the save part has an impossible base32 length")
    raw = decode_save(b32)
    if encode_save_bytes(raw) != b32:
        raise _malformed(name, "the save part is not canonical base32 (non-zero trailing bits)")
    try:
        save = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(name, "the save is not valid UTF-8") from None
    reason = save_error(save)
    if reason is not None:
        raise _malformed(name, f"the save {save!r} {reason}")
    return Entry(int(epoch_text), int(step_text), save)


def encode_save_bytes(raw: bytes) -> str:
    """Return the unpadded base32 of raw bytes."""
    return base64.b32encode(raw).decode("ascii").rstrip("=")


# -- the bulk path (rule 3) -------------------------------------------------------------------------------
#
# Parsing name by name costs several times what listing pub/ does (benchmarks/README.md), so names are checked
# a chunk of a few thousand at a time, in a few passes that each run in C over the whole chunk:
#
# 1. The numbers: every name's first 42 characters, joined (_numbers). One translation of every digit to "0",
#    compared with "<20 zeros>-<20 zeros>-" repeated, proves the 20-digit fields and the separators (and, the
#    result being ASCII, that no other character hides there); a leading "0" in every number proves the
#    64-bit range, else the exact 64-bit pattern runs over the same string.
# 2. The saves: one base-32 integer conversion of every save part, each completed by a pad (_ROW_PADS) into a
#    *row* of whole bytes: <the save's bytes> <the byte holding the unused bits> <\x01 ...> <\n>. Characters
#    outside the alphabet become "!", and so does the pad of a part of impossible length (1, 3 or 6 characters
#    past a whole group), which stops the conversion; a part longer than 213 characters has no pad at all.
# 3. The rows, where every save is printable ASCII (the usual case; _rows_valid): one translation of every
#    such byte to "s", compared with the shape the parts' lengths alone give the rows (_ROW_SHAPES: "s" for
#    each save byte, then NUL, the \x01s and \n), proves the saves free of control characters and every part
#    canonical (its unused-bits byte is NUL). The path rules are then a property of neighbouring bytes:
#    a separator ('/', or a row's start) followed by '/', '.' or the row's end is an empty or dot-led element,
#    and a row that starts with 'p' may start with pub/ or pins/. One translation to role bits (_ROLES) and
#    one AND of the listing, as an integer, with itself shifted by a byte find any such pair; with none, the
#    rows are valid.
# 4. Otherwise (a save with other UTF-8, or with an element that starts with '.' or a row with 'p'): one
#    UTF-8 decode of all rows, then one regex over them (_ROWS): a valid save (spec/layout.md), then NUL,
#    which is what the unused-bits byte holds exactly when the part is canonical, then \x01s and \n. The rows
#    are delimited by their \n alone: each pad carries exactly one, so the newline count proves no save holds
#    one, and \x01 (never NUL, never part of a valid save) keeps a NUL inside a save from passing for a row's
#    end.
#
# When any check fails, the reference parser runs name by name to name the first bad one; property tests
# hold the two paths to the same answers.

# The numbers' first digit is "0" (below 10**19) in the usual case; the exact 64-bit pattern costs more to
# compile and to run.
_PREFIX = itemgetter(slice(0, _PREFIX_LEN))
_DIGITS_AS_ZERO = str.maketrans("123456789", "0" * 9)
_PREFIX_SHAPE = ("0" * _NUMBER_DIGITS + "-") * 2


@functools.cache
def _prefixes_u64() -> re.Pattern[str]:
    u64 = _u64_pattern()
    return re.compile(rf"(?:{u64}-{u64}-)*+")


_LISTING_SEP = "-\n"  # after every name, the last too; lets str.split("-") cut names into their three fields
_NUMBERS_LEN = _PREFIX_LEN - 1  # "<epoch>-<step>": compares as strings in numeric order (fixed width)
_B32_PART = itemgetter(slice(_PREFIX_LEN, None))
# Names per pass: enough that the passes' fixed costs vanish, few enough that their buffers stay in the CPU
# caches and are reused from chunk to chunk. Past ~2k names the buffers are big enough that malloc returns
# them to the kernel after each chunk and takes fresh pages for the next, which costs more than the passes.
_CHUNK = 1024
_CHUNK_PREFIX_SHAPE = _PREFIX_SHAPE * _CHUNK

# base32 alphabet -> digits of int(text, 32) (A-Z are 0-25, 2-7 are 26-31); any other ASCII -> "!".
_B32_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
_B32_DIGITS = str.maketrans(
    {chr(c): "!" for c in range(128)}
    | dict(zip(_B32_ALPHABET, "0123456789abcdefghijklmnopqrstuv", strict=True))
)
_ROW_FILL = b"\x01"


def _row_pad(length: int) -> tuple[str, bytes]:
    """Return the base32 characters that complete a save part of ``length`` characters into a row, and the
    row's shape (step 3).

    They depend on ``length % 8`` and the save's size only. A length no canonical encoding has gets ``"!"``,
    which ``int(..., 32)`` refuses, and a shape no row has.
    """
    if length % 8 in (1, 3, 6):
        return "!", b"!"
    size = length * 5 // 8  # whole bytes the part holds
    pad = 5 - size % 5  # bytes left in its last 5-byte (8-character) group ...
    if pad < 2:
        pad += 5  # ... and another group when there is no room for both the unused-bits byte and the \n
    tail = b"\x00" + _ROW_FILL * (pad - 2) + b"\n"
    # Characters past ``length`` carry only bits that follow the part's own, whatever the part is.
    return encode_save_bytes(bytes(size) + tail)[length:], b"s" * size + tail


# Indexed by the part's length: an empty part has no pad, and a part longer than MAX_B32_CHARS no entry.
_PADS_AND_SHAPES = [("!", b"!"), *map(_row_pad, range(1, MAX_B32_CHARS + 1))]
_ROW_PADS = tuple(pad for pad, _ in _PADS_AND_SHAPES)
_ROW_SHAPES = tuple(shape for _, shape in _PADS_AND_SHAPES)
# Step 3: printable ASCII -> "s"; the rows' own NUL, \x01 and \n stay; anything else -> "!".
_SHAPE = bytes(
    ord("s") if 0x20 <= c < 0x7F else c if c in (0x00, 0x01, 0x0A) else ord("!") for c in range(256)
)
# Step 3's role bits. A byte's low two bits say what it is to the byte after it: a separator ('/', and the \n
# that ends a row) or a row's start (\n). The next two, what it is to the byte before it: what must not follow
# a separator ('/', '.', and the NUL that ends a save), and what may begin pub/ or pins/ at a row's start.
_AFTER_SEP, _AFTER_ROW = 1, 2
_NOT_AFTER_SEP, _NOT_AT_ROW = 4, 8
_ROLE_SHIFT = 2  # moves the last two bits onto the first two
_ROLES_OF = {"/": _AFTER_SEP | _NOT_AFTER_SEP, "\n": _AFTER_SEP | _AFTER_ROW, "\x00": _NOT_AFTER_SEP}
_ROLES_OF |= {".": _NOT_AFTER_SEP} | {never[0]: _NOT_AT_ROW for never in NEVER_SAVES}
_ROLES = bytes(_ROLES_OF.get(chr(c), 0) for c in range(256))
# Rule 2 over decoded rows: elements free of '/' and control characters, none empty, '.' or '..', the first
# none of NEVER_SAVES (pub, pins: the list save_error uses) nor led by RESERVED_PREFIX (a save led by '.'
# is never decided by the role bits: '.' may not follow a row's start); a save ends at the NUL of its row.
_ELEMENT = r"(?!\.\.?[/\x00])[^/\x00-\x1f\x7f]++"
_NOT_A_SAVE = "|".join(map(re.escape, NEVER_SAVES))
_ROWS = re.compile(
    rf"(?:(?!(?:{_NOT_A_SAVE})[/\x00]|{re.escape(RESERVED_PREFIX)}){_ELEMENT}(?:/{_ELEMENT})*+\x00\x01*+\n)*+"
)

# Translating names with _ORDER makes string order equal entry order: digits keep their order, and base32
# characters sort by the value they encode (A-Z are 0-25, 2-7 are 26-31, so 2-7 must sort after Z), and the
# base32 of byte strings then sorts like the byte strings, which sort like the saves (UTF-8 keeps code-point
# order). _ORDER_BACK undoes it exactly on valid names; the characters it would turn into digits become "!"
# on the way there, so that no invalid name comes back valid.
_ORDER_KEYS = "[\\]^_`ab"
_ORDER = str.maketrans("23456789" + _ORDER_KEYS, _ORDER_KEYS + "!" * len(_ORDER_KEYS))
_ORDER_BACK = str.maketrans(_ORDER_KEYS, "23456789")


def _first_malformed(names: Sequence[str]) -> MalformedError:
    for name in names:
        try:
            parse_entry_name(name)
        except MalformedError as exc:
            return exc
    # The bulk and reference parsers disagree: a bug, which property tests exist to catch.
    raise AssertionError("bulk entry-name validation refused a listing the reference parser accepts")


def _chunks(names: Sequence[str]) -> Iterator[Sequence[str]]:
    return (names[start : start + _CHUNK] for start in range(0, len(names), _CHUNK))


def _numbers(names: Sequence[str]) -> str | None:
    """Check the numbers and separators of every name (step 1); return their prefixes joined, or ``None``."""
    prefixes = "".join(map(_PREFIX, names))
    count = len(names)
    shape = _CHUNK_PREFIX_SHAPE if count == _CHUNK else _PREFIX_SHAPE * count
    if prefixes.translate(_DIGITS_AS_ZERO) != shape:
        return None
    leading = prefixes[0::_PREFIX_LEN] + prefixes[_STEP_AT::_PREFIX_LEN]  # each number's first digit
    if leading.count("0") != 2 * count and _prefixes_u64().fullmatch(prefixes) is None:
        return None
    return prefixes


def _each(table: Sequence[Any], indices: tuple[int, ...]) -> tuple[Any, ...]:
    """``table[i]`` for every index, in one C loop (itemgetter given one index returns the item itself)."""
    found = itemgetter(*indices)(table)
    return found if len(indices) > 1 else (found,)


def _bulk_decode_saves(parts: Sequence[str]) -> bytes | None:
    """Decode and check the base32 parts of names whose numbers are checked (steps 2 to 4); ``None`` if any
    is bad.

    Returns the decoded rows: each save followed by NUL, ``\x01`` bytes and a newline.
    """
    if not parts:
        return b""
    lengths = tuple(map(len, parts))
    pieces = [""] * (2 * len(parts))
    pieces[0::2] = parts
    try:
        pieces[1::2] = _each(_ROW_PADS, lengths)
        text = "".join(pieces)
        if not text.isascii():  # int() reads other scripts' digits too
            return None
        value = int(text.translate(_B32_DIGITS), 32)
    except (IndexError, ValueError):  # too long a part; not base32, or of an impossible length
        return None
    rows = value.to_bytes(len(text) * 5 // 8, "big")
    return rows if _rows_valid(rows, lengths) else None


def _rows_valid(rows: bytes, lengths: tuple[int, ...]) -> bool:
    """Whether decoded rows hold valid saves from canonical parts of these lengths (steps 3 and 4)."""
    if rows.translate(_SHAPE) == b"".join(_each(_ROW_SHAPES, lengths)):
        roles = rows.translate(_ROLES)
        bits = int.from_bytes(roles, "big")
        if not roles[0] & (_NOT_AFTER_SEP | _NOT_AT_ROW) and not (bits >> _ROLE_SHIFT) & (bits >> 8):
            return True
        text = rows.decode("ascii")  # printable ASCII: the shape says so
    else:
        if rows.count(b"\n") != len(lengths):
            return False
        try:
            text = rows.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return _ROWS.fullmatch(text) is not None


def parse_entry_names(names: Sequence[str]) -> list[Entry]:
    """Parse a whole listing of ``pub/``; return its entries ascending.

    Raises :class:`MalformedError` naming the first name (in listing order) that does not parse.
    """
    # Sort the names as strings once (see _ORDER), then decode them in that order, a chunk at a time.
    keys: list[str] = []
    for chunk in _chunks(names):
        joined = _LISTING_SEP.join([*chunk, ""])
        # A newline inside a name would split it into two keys below.
        if _numbers(chunk) is None or joined.count("\n") != len(chunk):
            raise _first_malformed(names)
        keys += joined.translate(_ORDER).split(_LISTING_SEP)
        keys.pop()  # the empty string after the last separator
    keys.sort()
    entries: list[Entry] = []
    for chunk in _chunks(keys):
        fields = _LISTING_SEP.join(chunk).translate(_ORDER_BACK).split("-")
        rows = _bulk_decode_saves(fields[2::3]) if len(fields) == 3 * len(chunk) else None
        if rows is None:
            raise _first_malformed(names)
        saves = rows.replace(b"\x01", b"").replace(b"\x00", b"").decode("utf-8").split("\n")
        saves.pop()  # the empty string after the last row
        # int() skips the newline that starts every epoch but the first.
        entries += _new_entries(map(int, fields[0::3]), map(int, fields[1::3]), saves)
    return entries


def latest_entry_of_names(names: Sequence[str]) -> Entry | None:
    """Validate a whole listing of ``pub/`` and return its greatest entry, or ``None`` when empty.

    Every name is validated (a bad one raises :class:`MalformedError`), but only the names that share the
    greatest ``epoch-step`` prefix are compared further: fixed-width prefixes compare as strings in numeric
    order, and only ties need their saves.
    """
    scan = LatestEntryScan()
    for chunk in _chunks(names):
        scan.add(chunk)
    return scan.result()


# The old name, which read as if it returned a name: kept so that callers not yet renamed keep working.
latest_entry_name = latest_entry_of_names


class LatestEntryScan:
    """:func:`latest_entry_of_names` over a listing that arrives in chunks (a directory read, S3 pages).

    ``add`` validates every name of a chunk completely, raising :class:`MalformedError` naming the chunk's
    first bad name; ``result`` returns the greatest entry of all the chunks added, or ``None``. Feeding a
    listing chunk by chunk gives the answer :func:`latest_entry_of_names` gives for the whole, without
    holding it.
    """

    __slots__ = ("_numbers", "_ties")

    CHUNK = _CHUNK  # names per add() that suit it best (benchmarks/README.md)

    def __init__(self) -> None:
        self._numbers = ""  # the greatest "<epoch>-<step>" so far ...
        self._ties: list[str] = []  # ... and every name that starts with it

    def add(self, names: Sequence[str]) -> None:
        """Validate ``names`` and fold them into the result."""
        if not names:
            return
        prefixes = _numbers(names)
        if prefixes is None or _bulk_decode_saves(list(map(_B32_PART, names))) is None:
            raise _first_malformed(names)
        top = max(names)
        numbers = top[:_NUMBERS_LEN]
        if numbers < self._numbers:
            return
        # The prefixes are "<epoch>-<step>-" blocks; a match across two blocks only costs the exact filter.
        if prefixes.count(numbers + "-") > 1:
            ties = [name for name in names if name.startswith(numbers)]
        else:
            ties = [top]
        if numbers > self._numbers:
            self._numbers, self._ties = numbers, ties
        else:
            self._ties += ties

    def result(self) -> Entry | None:
        """Return the greatest entry of the names added so far, or ``None`` when there were none."""
        if len(self._ties) > 1:
            # The saves decide: compare the names as _ORDER makes them sort.
            best = max("\n".join(self._ties).translate(_ORDER).split("\n")).translate(_ORDER_BACK)
            return parse_entry_name(best)
        return parse_entry_name(self._ties[0]) if self._ties else None


# Entries built in bulk skip Entry's validators: every field was validated above, in bulk, and the validators
# would cost more than everything else (about 3 µs per entry). The slots are set with their descriptors, as
# attrs' own __init__ does; if Entry ever changes shape, entries are built the ordinary way.
def _entry_setters() -> tuple[Callable[[Entry, Any], None], ...] | None:
    slots = ("epoch", "step", "save")
    if tuple(a.name for a in attrs.fields(Entry)) != slots or any(
        hasattr(Entry, hook) for hook in ("__attrs_pre_init__", "__attrs_post_init__")
    ):
        return None
    setters = [getattr(Entry.__dict__.get(name), "__set__", None) for name in slots]
    return tuple(s for s in setters if s is not None) if all(setters) else None


_ENTRY_SETTERS = _entry_setters()


def _new_entries(epochs: Iterable[int], steps: Iterable[int], saves: Sequence[str]) -> list[Entry]:
    if _ENTRY_SETTERS is None:
        return list(map(Entry, epochs, steps, saves))
    entries: list[Entry] = list(map(object.__new__, repeat(Entry, len(saves))))
    for setter, values in zip(_ENTRY_SETTERS, (epochs, steps, saves), strict=True):
        deque(map(setter, entries, values), maxlen=0)
    return entries
