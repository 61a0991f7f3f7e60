"""Pins: the flows that pin, unpin and list pinned entries, written once over a store's pin log
(docs/spec/layout.md "Pins", docs/spec/operations.md "Pin and unpin").

A pin is an empty object ``<root>/pins/<entry name>``, created exclusively and as durably as an entry. Each
store provides the small :class:`PinLog` port; the stores' ``pin``, ``unpin`` and ``pinned`` methods call
the functions here.

Rules this module keeps:

1. Pinning an entry that is not in the publication log is ``NotFoundError``; nothing is created.
2. Pinning is: check the entry is listed, create the pin exclusively (a pin already there is fine: pinning
   twice is not an error), then list the entries again. If the entry is still there, the pin holds: every
   prune that removes the entry afterwards reads the pins after removing it, sees the pin, and its decision
   spares the entry (``ckpt.domain.journal`` rule 3), which that prune or the next puts back. If the entry
   is gone, a prune is removing it: when a prune journal's decision lists it as removed for good, that
   prune read the pins before this pin existed, so a pin this call created is removed again (no other
   pinner can have relied on it: they would have seen the entry present after it was made, and then every
   decision spares it), or when no journal lists it; when every journal that lists it is decided and spares
   it, it is put back here as a prune would, and the pin holds; otherwise (a journal not decided yet) the
   pin is left (it can only protect: the deciding prune spares and puts back the entry if it reads the
   pin) and ``NotFoundError`` says so.
3. Unpinning removes the pin if there is one; unpinning twice, or an entry never pinned, is not an error.
4. A name in ``pins/`` that is not an entry name, or anything there that is not a plain object (a folder),
   is ``MalformedError``, as in ``pub/``; ``prune`` then refuses to run (it cannot tell what is protected).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ckpt.domain.arguments import require_instance
from ckpt.domain.entries import PINS_DIR_NAME, Entry
from ckpt.domain.errors import MalformedError, NotFoundError
from ckpt.domain.journal import Journal
from ckpt.domain.names import format_entry_name, parse_entry_names

__all__ = ["PinLog", "parse_pin_names", "pin_entry", "pinned_entries", "unpin_entry"]


class PinLog(Protocol):
    """What the pin flows need from a store: its entries, and the names in ``pins/``."""

    def entries(self) -> list[Entry]:
        """Every entry, ascending (the Store port)."""
        ...

    def pin_names(self) -> list[str]:
        """Return every name in ``pins/``, any order; ``MalformedError`` for anything not a plain object.

        A missing ``pins/`` has no names.
        """
        ...

    def create_pin(self, name: str) -> bool:
        """Create the empty pin ``name`` exclusively: True when this call created it, False when it was there.

        Durable when it returns True, as a published entry is.
        """
        ...

    def remove_pins(self, names: Sequence[str]) -> None:
        """Remove the pins ``names``; an absent one is not an error. Durable when it returns."""
        ...

    def prune_journals(self) -> list[Journal]:
        """Return the prune journals left in the store, each with its decision (none without journals)."""
        ...

    def create_entry(self, name: str) -> bool:
        """Create the entry ``name`` in ``pub/`` exclusively and durably, as publish does (rule 2's put-back:
        an entry every decision spares); False when it was there."""
        ...


def parse_pin_names(names: Iterable[str]) -> list[Entry]:
    """Return the entries the pin ``names`` name, ascending; ``MalformedError`` for a bad one (rule 4)."""
    try:
        return parse_entry_names(list(names))
    except MalformedError as exc:
        message = f"malformed pin {exc.value!r} in {PINS_DIR_NAME}/: {exc.why}"
        raise MalformedError(message, value=exc.value, why=exc.why) from None


def pinned_entries(log: PinLog) -> list[Entry]:
    """Return the pinned entries, ascending, whether or not they are still published."""
    return parse_pin_names(log.pin_names())


def pin_entry(log: PinLog, entry: Entry) -> bool:
    """Pin ``entry`` (rules 1, 2); return True when this call created the pin, False when it was pinned."""
    name = format_entry_name(require_instance(entry, Entry, "entry"))
    what = f"epoch {entry.epoch} step {entry.step} save {entry.save}"
    if entry not in set(log.entries()):
        raise NotFoundError(f"cannot pin {what}: no such entry is published", location=name)
    created = log.create_pin(name)
    if entry in set(log.entries()):
        return created
    listing = [j for j in log.prune_journals() if entry in j.content.entries]
    if not listing or any(j.removed is not None and entry in j.removed for j in listing):
        if created:
            log.remove_pins([name])
        raise NotFoundError(
            f"cannot pin {what}: a prune removed the entry while it was being pinned", location=name
        )
    if all(j.removed is not None for j in listing):  # every decision spares it: put it back, as prune does
        log.create_entry(name)
        if entry in set(log.entries()):
            return created
    raise NotFoundError(
        f"cannot pin {what}: a prune is removing the entry ({listing[0].identifier}); the pin is left, and "
        "the prune puts the entry back if it reads the pin: once no prune runs, pin it again to know",
        location=name,
    )


def unpin_entry(log: PinLog, entry: Entry) -> bool:
    """Unpin ``entry`` (rule 3); return True when a pin was there."""
    name = format_entry_name(require_instance(entry, Entry, "entry"))
    there = name in set(log.pin_names())
    log.remove_pins([name])
    return there
