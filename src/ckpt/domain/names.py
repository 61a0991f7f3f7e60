"""The entry-name wire format: one name in ``pub/`` per publication (SPEC §3).

Grammar (other ports must match it byte for byte)::

    name   = epoch "-" step "-" b32save          ; at most 255 bytes (NAME_MAX)
    epoch  = 20DIGIT                             ; zero-padded, value <= 18446744073709551615
    step   = 20DIGIT                             ; same
    b32save = RFC 4648 base32 of the save's UTF-8 bytes, alphabet A-Z 2-7, upper case, no padding

Rules this module enforces:

1. Parsing is exact: a name is accepted only when it is byte-for-byte what :func:`format_entry_name`
   produces for the entry it decodes to. That rules out lower case, padding, a 21-digit or overflowing
   number, extra separators, suffixes (``.tmp``), and base32 whose unused trailing bits are not zero.
2. The decoded save must itself be valid (SPEC §2), else the name is malformed.
3. Two implementations live here on purpose. :func:`parse_entry_name` is the simple reference, one name at
   a time. :func:`parse_entry_names` and :func:`latest_entry_name` are the bulk paths used by ``entries`` and
   ``resolve``: they validate a whole listing with a few C-level passes (one regex over the joined names,
   one base-32 integer conversion, one UTF-8 decode, one regex over the joined saves) and fall back to the
   reference parser only to name the first bad name. Property tests hold the two to the same answers.

Pure: standard library only.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence

from ckpt.domain.entries import MAX_U64, Entry, save_error, sort_entries
from ckpt.domain.errors import InvalidError, MalformedError

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_SAVE_BYTES",
    "decode_save",
    "encode_save",
    "format_entry_name",
    "latest_entry_name",
    "parse_entry_name",
    "parse_entry_names",
]

MAX_NAME_BYTES = 255  # POSIX NAME_MAX
_PREFIX_LEN = 42  # "<20 digits>-<20 digits>-"
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
            rest = 19 - i
            options.append(f"{_MAX_U64_TEXT[:i]}[{smaller}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    options.append(_MAX_U64_TEXT)
    return "(?:" + "|".join(options) + ")"


# Canonical unpadded base32 (rule 1): whole 8-character groups, then an optional tail whose length is 2, 4,
# 5 or 7 characters (1, 2, 3 or 4 bytes) and whose last character leaves the unused low bits zero:
#   2 chars = 10 bits, 2 unused -> value % 4 == 0;   4 chars = 20 bits, 4 unused -> value % 16 == 0
#   5 chars = 25 bits, 1 unused -> value % 2 == 0;   7 chars = 35 bits, 3 unused -> value % 8 == 0
_B32 = (
    r"(?:[A-Z2-7]{8})*"
    r"(?:[A-Z2-7][AEIMQUY4]|[A-Z2-7]{3}[AQ]|[A-Z2-7]{4}[ACEGIKMOQSUWY246]|[A-Z2-7]{6}[AIQY])?"
)
# One name: the numbers, then non-empty base32 of at most MAX_B32_CHARS characters (rule 1, NAME_MAX).
_NAME_BODY = rf"({_u64_pattern()})-({_u64_pattern()})-(?=[A-Z2-7]{{1,{MAX_B32_CHARS}}}$)({_B32})"
_NAME = re.compile(_NAME_BODY + r"\Z")
# The same, once per line of a joined listing (bulk path).
_NAME_LINES = re.compile(r"^" + _NAME_BODY.replace("$)", r"(?:\n|\Z))") + r"$", re.MULTILINE)
# A valid save per line of joined saves (rule 2, SPEC §2): elements free of '/' and control characters,
# none empty, '.' or '..', the first not 'pub'. Saves are joined with '\n', which no valid save contains.
_ELEMENT = r"(?!\.\.?(?:/|$))[^/\x00-\x1f\x7f]+"
_SAVE_LINES = re.compile(rf"^(?!pub(?:/|$)){_ELEMENT}(?:/{_ELEMENT})*$", re.MULTILINE)

# base32 alphabet -> digits of int(text, 32): A-Z are 0-25, 2-7 are 26-31.
_B32_TO_DIGITS = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567",
    "0123456789abcdefghijklmnopqrstuv",
)


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
    name = f"{entry.epoch:020d}-{entry.step:020d}-{encode_save(entry.save)}"
    if len(name) > MAX_NAME_BYTES:
        size = len(entry.save.encode("utf-8"))
        raise InvalidError(
            f"save {entry.save!r} is {size} bytes long; an entry name can carry at most {MAX_SAVE_BYTES}"
        )
    return name


def _malformed(name: str, why: str) -> MalformedError:
    return MalformedError(f"malformed entry name {name!r} in pub/: {why}", value=name)


def parse_entry_name(name: str) -> Entry:
    """Parse one name from ``pub/`` exactly; raise :class:`MalformedError` naming it otherwise.

    This is the reference implementation: simple, one name at a time.

    >>> parse_entry_name("00000000000000000002-00000000000000000100-MV4GKYZPMEXWG2ZNGE")
    Entry(epoch=2, step=100, save='exec/a/ck-1')
    """
    if not name.isascii() or len(name) > MAX_NAME_BYTES:
        raise _malformed(name, "not an ASCII name of at most 255 bytes")
    parts = name.split("-", 2)
    if len(parts) != 3 or len(parts[0]) != 20 or len(parts[1]) != 20:
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


def _bulk_decode_saves(b32_parts: Sequence[str]) -> list[str] | None:
    """Decode many canonical base32 strings with one integer conversion; ``None`` if any save is bad.

    Each part is padded with 'A' (value 0) to a whole number of 8-character groups, so every part decodes
    to its own bytes followed by zero bytes. Saves never contain NUL, so those are cut by length.
    """
    if not b32_parts:
        return []
    padded = [p + "A" * (-len(p) % 8) for p in b32_parts]
    joined = "".join(padded).translate(_B32_TO_DIGITS)
    raw = int(joined, 32).to_bytes(len(joined) * 5 // 8, "big")
    saves_bytes = []
    offset = 0
    for part, pad in zip(b32_parts, padded, strict=True):
        size = len(part) * 5 // 8
        saves_bytes.append(raw[offset : offset + size])
        offset += len(pad) * 5 // 8
    try:
        text = b"\n".join(saves_bytes).decode("utf-8")
    except UnicodeDecodeError:
        return None
    saves = text.split("\n")
    if len(saves) != len(b32_parts) or len(_SAVE_LINES.findall(text)) != len(b32_parts):
        return None
    return saves


def _first_malformed(names: Sequence[str]) -> MalformedError:
    for name in names:
        try:
            parse_entry_name(name)
        except MalformedError as exc:
            return exc
    # The bulk and reference parsers disagree: a bug, which property tests exist to catch.
    raise AssertionError("bulk entry-name validation refused a listing the reference parser accepts")


def _bulk_match(names: Sequence[str]) -> list[tuple[str, str, str]]:
    """Match every name, or raise :class:`MalformedError` naming the first bad one."""
    if any("\n" in name for name in names):
        raise _first_malformed(names)
    joined = "\n".join(names)
    matches: list[tuple[str, str, str]] = _NAME_LINES.findall(joined)
    if len(matches) != len(names):
        raise _first_malformed(names)
    return matches


def parse_entry_names(names: Sequence[str]) -> list[Entry]:
    """Parse a whole listing of ``pub/``; return its entries ascending.

    Raises :class:`MalformedError` naming the first name (in listing order) that does not parse.
    """
    matches = _bulk_match(names)
    saves = _bulk_decode_saves([m[2] for m in matches])
    if saves is None:
        raise _first_malformed(names)
    return sort_entries(
        Entry(int(epoch), int(step), save) for (epoch, step, _), save in zip(matches, saves, strict=True)
    )


def latest_entry_name(names: Sequence[str]) -> Entry | None:
    """Validate a whole listing of ``pub/`` and return its greatest entry, or ``None`` when empty.

    Every name is validated (a bad one raises :class:`MalformedError`), but only the names that share the
    greatest ``epoch-step`` prefix are turned into entries: fixed-width prefixes compare as strings in
    numeric order, and only ties need the decoded saves.
    """
    if not names:
        return None
    matches = _bulk_match(names)
    saves = _bulk_decode_saves([m[2] for m in matches])
    if saves is None:
        raise _first_malformed(names)
    top = max(names)[: _PREFIX_LEN - 1]
    epoch, step = int(top[:20]), int(top[21:41])
    best = max(
        (save for name, save in zip(names, saves, strict=True) if name.startswith(top)),
    )
    return Entry(epoch, step, best)
