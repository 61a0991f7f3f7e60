"""The public API's type checks at its boundary: the one place that decides what a wrong-typed argument is.

Every top-level function of ``ckpt`` and every method of a store (the POSIX and S3 adapters and the
in-memory fake alike) checks the types of its arguments with these functions before it does anything else.
So ``publish(1, 1, None)``, ``prune("2")`` or ``location(None)`` raises :class:`InvalidTypeError` on every
store, an ``InvalidError`` (exit 2, a ``CkptError``) that is also the ``TypeError`` Python callers expect,
instead of an ``AttributeError`` from somewhere inside one implementation.

Rules:

1. ``bool`` is not an integer here: ``publish(True, 1, save)`` is a mistake, not epoch 1.
2. A ``str`` (or a subclass) is a string; ``bytes`` and path objects are not.
3. Only types are checked here. Values (ranges, path rules) are checked by the functions that own them.

Pure: the standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from ckpt.domain.errors import InvalidTypeError

__all__ = ["require_bool", "require_instance", "require_int", "require_items", "require_str"]

_T = TypeVar("_T")


def _wrong(what: str, expected: str, value: object) -> InvalidTypeError:
    return InvalidTypeError(f"{what} must be {expected}, got {type(value).__name__} {value!r}")


def require_int(value: object, what: str) -> int:
    """Return ``value`` when it is an ``int`` (not a ``bool``); raise :class:`InvalidTypeError` otherwise.

    >>> require_int(3, "step")
    3
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(what, "an integer", value)
    return value


def require_str(value: object, what: str) -> str:
    """Return ``value`` when it is a ``str``; raise :class:`InvalidTypeError` otherwise."""
    if not isinstance(value, str):
        raise _wrong(what, "a string", value)
    return value


def require_bool(value: object, what: str) -> bool:
    """Return ``value`` when it is a ``bool``; raise :class:`InvalidTypeError` otherwise."""
    if not isinstance(value, bool):
        raise _wrong(what, "True or False", value)
    return value


def require_instance(value: _T, cls: type[Any], what: str) -> _T:
    """Return ``value`` when it is an instance of ``cls``; raise :class:`InvalidTypeError` otherwise.

    ``value`` keeps its declared type: the check is for callers who ignored it. ``cls`` may be a
    runtime-checkable Protocol or an ABC such as ``Mapping``.
    """
    if not isinstance(value, cls):
        raise _wrong(what, f"a {cls.__name__}", value)
    return value


def require_items(values: object, cls: type[_T], what: str) -> list[_T]:
    """Return the items of the iterable ``values`` as a list when every one is a ``cls``.

    A string, a non-iterable, or an item of another type raises :class:`InvalidTypeError`.
    """
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise _wrong(what, f"an iterable of {cls.__name__}", values)
    items = list(values)
    for item in items:
        if not isinstance(item, cls):
            raise _wrong(f"each of {what}", f"a {cls.__name__}", item)
    return items
