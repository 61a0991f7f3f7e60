"""Whether a saves location leaves room for its rule's saves in an entry name (spec/names.md §4.5).

An entry name carries at most :data:`~ckpt.domain.names.MAX_SAVE_BYTES` (133) bytes of save path. A
saves location too long for the saves its framework writes there is a mistake found only at the first
publication, hours later, and then on one rank or in one sidecar only; so every entry point (``ckpt watch``,
``ckpt resume``, the integrations' constructors and resume helpers) asks this module first, before it
saves, records, waits at a barrier or joins a collective.

Rules:

1. The step in a save name is a decimal number of at most 20 digits (2**64 - 1, spec/names.md §3) when
   written without leading zeros. A rule's *longest save name* is its name at that step, with any part the
   trainer chooses freely left out: ``checkpoint-18446744073709551615`` for ``hf``,
   ``step=18446744073709551615.ckpt`` for ``lightning`` (whose ``<…>`` parts are the trainer's). A rule
   declares it as its ``longest_name``; a configured rule's is its pattern with ``{step}`` at that step.
2. A plugin rule without ``longest_name`` is held to the one-byte name ``x``: nothing shorter is a save.
3. The *longest save* of a saves location ``F`` (its save path relative to the root, ``exec/<attempt>``)
   is ``F/<longest save name>``. It must be at most 133 UTF-8 bytes; otherwise :func:`require_room`
   raises ``InvalidError`` naming the location (the attempt), the longest save name and the limit.
4. What rule 1 leaves out can still make one save too long (a leading zero, a metric in a Lightning file
   name): that save alone is refused when it is published (spec/names.md §4.4).

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt.domain.entries import MAX_U64
from ckpt.domain.errors import InvalidError
from ckpt.domain.names import MAX_SAVE_BYTES

if TYPE_CHECKING:
    from ckpt.domain.rules.model import Rule

__all__ = [
    "LONGEST_STEP",
    "SHORTEST_NAME",
    "longest_name",
    "longest_save",
    "longest_save_name",
    "require_room",
    "require_rule_room",
    "room_problem",
]

LONGEST_STEP = f"{MAX_U64}"
"""The longest step a save name holds without leading zeros: ``18446744073709551615`` (rule 1)."""
SHORTEST_NAME = "x"
"""The save name a rule that declares no longest one is held to (rule 2)."""


def longest_name(template: str) -> str:
    """The name ``template`` gives at the largest step: ``{step}`` replaced by :data:`LONGEST_STEP`.

    >>> longest_name("checkpoint-{step}")
    'checkpoint-18446744073709551615'
    """
    return template.replace("{step}", LONGEST_STEP)


def longest_save_name(rule: Rule | object) -> str:
    """The longest save name of ``rule`` (rules 1, 2): its ``longest_name``, else :data:`SHORTEST_NAME`.

    ``InvalidError`` when the rule declares one that is not a single non-empty path element.

    >>> from ckpt.domain.rules import builtin_rule
    >>> longest_save_name(builtin_rule("dcp"))
    'step-18446744073709551615'
    """
    name = getattr(rule, "longest_name", None)
    if name is None:
        return SHORTEST_NAME
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        shown = getattr(rule, "name", rule)
        raise InvalidError(f"rule {shown!r} declares longest_name {name!r}, which is not one path element")
    return name


def longest_save(folder: str, name: str) -> str:
    """The save path of the save called ``name`` inside the saves location ``folder`` (rule 3).

    >>> longest_save("exec/2.4102.0", "checkpoint-18446744073709551615")
    'exec/2.4102.0/checkpoint-18446744073709551615'
    """
    return f"{folder.rstrip('/')}/{name}"


def room_problem(folder: str, name: str) -> str | None:
    """Why the save ``name`` inside ``folder`` cannot be published, or ``None`` when it fits (rule 3).

    >>> room_problem("exec/a", "checkpoint-18446744073709551615") is None
    True
    >>> room_problem("exec/" + "a" * 120, "checkpoint-500")
    "the save 'exec/aaa...aaa/checkpoint-500' is 140 bytes, and an entry name carries at most 133 bytes of..."
    """
    save = longest_save(folder, name)
    size = len(save.encode("utf-8"))
    if size <= MAX_SAVE_BYTES:
        return None
    return (
        f"the save {save!r} is {size} bytes, and an entry name carries at most {MAX_SAVE_BYTES} bytes "
        f"of save path"
    )


def require_room(folder: str, name: str, *, what: str, saves: str) -> None:
    """Raise ``InvalidError`` unless ``name``, the longest save name of ``saves``, fits inside ``folder``.

    ``what`` names the location for the message (``attempt '2.4102.0'``, ``--saves 'runs/a'``); ``saves``
    says whose saves these are (``hf saves``).
    """
    problem = room_problem(folder, name)
    if problem is not None:
        raise InvalidError(f"{what} is too long for {saves}: with their longest name, {name!r}, {problem}")


def require_rule_room(folder: str, rule: Rule | object, *, what: str) -> None:
    """:func:`require_room` with ``rule``'s longest save name (rules 1-3)."""
    require_room(folder, longest_save_name(rule), what=what, saves=f"{getattr(rule, 'name', rule)} saves")
