"""Entries, the values that validate them, and their order.

An :class:`Entry` is one publication: a save, named by its slash-separated path relative to the checkpoint
root, published at a scheduler epoch and a training step. Entries order by ``(epoch, step, save)``; the latest
entry is the greatest. Everything here is pure: validation of saves and attempts, ``parse_epoch`` and
``parse_step``, ``latest``.

Rules (spec/layout.md, §3):

* epoch and step are unsigned 64-bit integers.
* a save is clean, relative, slash-separated, valid UTF-8 without NUL or ASCII control characters (C0 and
  DEL), not the root itself, and not ``pub`` or ``pins`` or anything inside them.
* an attempt is exactly one path element: non-empty, not ``.``/``..``, no ``/``, no control character, at most
  255 UTF-8 bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from ckpt.domain.arguments import require_int, require_items, require_str
from ckpt.domain.errors import InvalidError

__all__ = [
    "EXEC_DIR_NAME",
    "MAX_U64",
    "NEVER_SAVES",
    "PINS_DIR_NAME",
    "PUB_DIR_NAME",
    "RESERVED_PREFIX",
    "Entry",
    "latest",
    "parse_epoch",
    "parse_step",
    "save_error",
    "validate_attempt",
    "validate_save",
]

EXEC_DIR_NAME = "exec"
PUB_DIR_NAME = "pub"
PINS_DIR_NAME = "pins"  # the pins (docs/spec/layout.md): like pub/, never a save
#: The first path elements no save may have (spec/names.md §1.1 rule 5), each with why. The bulk name parser
#: (``ckpt.domain.names``) builds its check from this too, so the two parsers cannot disagree.
NEVER_SAVES = {
    PUB_DIR_NAME: "is pub/ or inside it (the publication log is not a save)",
    PINS_DIR_NAME: "is pins/ or inside it (the pins are not a save)",
}
#: What no save's first element may start with: ckpt's own files and folders at the top of a root (prune
#: journals and their decisions, doctor's probes), which prune and doctor remove as theirs.
RESERVED_PREFIX = ".ckpt-"
RESERVED = f"starts with {RESERVED_PREFIX} (ckpt's own files at the root: prune journals, doctor's probes)"
MAX_U64 = 2**64 - 1

# ASCII control characters: C0 (0x00-0x1f) and DEL (0x7f). NUL is among them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# parse_epoch / parse_step: ASCII digits only. re's \d would admit Unicode digits, so spell the class out.
_DECIMAL = re.compile(r"[0-9]+")


def _check_u64(value: int, what: str) -> int:
    require_int(value, what)
    if not 0 <= value <= MAX_U64:
        raise InvalidError(f"{what} {value} is outside 0..{MAX_U64} (an unsigned 64-bit integer)")
    return value


def _epoch_validator(_instance: object, _attribute: object, value: int) -> None:
    _check_u64(value, "epoch")


def _step_validator(_instance: object, _attribute: object, value: int) -> None:
    _check_u64(value, "step")


def _save_validator(_instance: object, _attribute: object, value: str) -> None:
    validate_save(value)


@attrs.frozen(order=False)
class Entry:
    """One publication: ``save`` (relative to the root) published at ``epoch`` and ``step``.

    Entries compare by :attr:`key`, ``(epoch, step, save)``; the save compares as a string, in code-point
    order, which is also UTF-8 byte order.

    >>> Entry(2, 100, "exec/2.4102.0/checkpoint-100") > Entry(1, 900, "exec/1.4101.0/checkpoint-900")
    True
    """

    epoch: int = attrs.field(validator=_epoch_validator)
    step: int = attrs.field(validator=_step_validator)
    save: str = attrs.field(validator=_save_validator)

    @property
    def key(self) -> tuple[int, int, str]:
        """The one ordering key: ``(epoch, step, save)``."""
        return (self.epoch, self.step, self.save)

    def __lt__(self, other: Entry) -> bool:
        return self.key < other.key

    def __le__(self, other: Entry) -> bool:
        return self.key <= other.key

    def __gt__(self, other: Entry) -> bool:
        return self.key > other.key

    def __ge__(self, other: Entry) -> bool:
        return self.key >= other.key


def _entry_key(entry: Entry) -> tuple[int, int, str]:
    return entry.key


def latest(entries: Iterable[Entry]) -> Entry | None:
    """Return the greatest entry, or ``None`` when there is none."""
    return max(require_items(entries, Entry, "entries"), key=_entry_key, default=None)


def sort_entries(entries: Iterable[Entry]) -> list[Entry]:
    """Return ``entries`` ascending by ``(epoch, step, save)``."""
    return sorted(require_items(entries, Entry, "entries"), key=_entry_key)


def _parse_u64(text: str, what: str) -> int:
    if _DECIMAL.fullmatch(require_str(text, what)) is None:
        raise InvalidError(
            f"{what} {text!r} is not a decimal number (ASCII digits only: no sign, spaces or underscores)"
        )
    # Leading zeros are allowed, so the length says nothing until they are gone; and int() refuses decimal
    # strings over 4300 digits with a bare ValueError, so an overlong value is refused before it gets there.
    significant = text.lstrip("0") or "0"
    value = int(significant) if len(significant) <= 20 else MAX_U64 + 1
    if value > MAX_U64:
        raise InvalidError(f"{what} {text!r} does not fit in 64 bits (maximum {MAX_U64})")
    return value


def parse_epoch(text: str) -> int:
    """Parse a scheduler epoch (``DISPATCH_EPOCH``): ASCII decimal digits that fit in 64 bits.

    >>> parse_epoch("0002000000")
    2000000
    """
    return _parse_u64(text, "epoch")


def parse_step(text: str) -> int:
    """Parse a training step: ASCII decimal digits that fit in 64 bits."""
    return _parse_u64(text, "step")


def save_error(save: object) -> str | None:
    """Return why ``save`` is not a valid save path, or ``None`` when it is.

    The reasons are stable phrases; the JSON vectors and other ports rely on their meaning, not their text.
    """
    if not isinstance(save, str):
        return "is not a string"
    if save == "":
        return "is empty (the root itself is not a save)"
    if _CONTROL.search(save):
        return "contains NUL or an ASCII control character"
    try:
        save.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (contains a lone surrogate)"
    if save.startswith("/"):
        return "is absolute (a save is relative to the root)"
    if save.endswith("/"):
        return "ends with '/'"
    elements = save.split("/")
    if "" in elements:
        return "has an empty path element ('//')"
    if "." in elements or ".." in elements:
        return "has a '.' or '..' path element (not clean)"
    if elements[0].startswith(RESERVED_PREFIX):
        return RESERVED
    return NEVER_SAVES.get(elements[0])


def validate_save(save: str) -> str:
    """Return ``save`` when it is a valid save path (spec/layout.md); raise :class:`InvalidError`
    otherwise."""
    require_str(save, "save")
    reason = save_error(save)
    if reason is not None:
        raise InvalidError(f"save {save!r} {reason}")
    return save


def attempt_error(attempt: object) -> str | None:
    """Return why ``attempt`` cannot name an execution folder, or ``None`` when it can."""
    if not isinstance(attempt, str):
        return "is not a string"
    if attempt == "":
        return "is empty"
    if attempt in {".", ".."}:
        return "is '.' or '..'"
    if "/" in attempt:
        return "contains '/' (an attempt is one path element)"
    if _CONTROL.search(attempt):
        return "contains NUL or an ASCII control character"
    try:
        size = len(attempt.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8 (contains a lone surrogate)"
    if size > 255:
        return f"is {size} bytes long (at most 255)"
    return None


def validate_attempt(attempt: str) -> str:
    """Return ``attempt`` when it can be one path element (spec/layout.md); raise :class:`InvalidError`
    otherwise."""
    require_str(attempt, "attempt")
    reason = attempt_error(attempt)
    if reason is not None:
        raise InvalidError(f"attempt {attempt!r} {reason}")
    return attempt


def exec_save_prefix(attempt: str) -> str:
    """Return the save path of an execution's folder, ``exec/<attempt>``, after validating the attempt."""
    return f"{EXEC_DIR_NAME}/{validate_attempt(attempt)}"
