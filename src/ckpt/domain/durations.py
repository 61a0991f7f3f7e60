"""The bound of every duration ckpt accepts, and the one check of a number of seconds in a setting.

Every seconds value of a configuration file, an option, a credential source or a framework rule is held
to :data:`MAX_SECONDS`. A TOML integer has no size limit and Python compares it with a float exactly, so
the check never converts a value before it is known to be in range (``math.isfinite`` of a 400-digit
integer raises ``OverflowError``).

Pure: the standard library only.
"""

from __future__ import annotations

import math

__all__ = ["MAX_SECONDS", "seconds_problem", "shown_value"]

#: The longest duration, in seconds, that any setting or option accepts (about 115 days): far beyond any
#: sensible timeout or interval, and far below what the platform can wait for (``threading.TIMEOUT_MAX``,
#: socket timeouts), so a huge value is refused up front instead of overflowing at the first wait.
MAX_SECONDS = 10_000_000


def seconds_problem(value: object, *, zero: bool = False) -> str | None:
    """Why ``value`` is not a number of seconds above 0 (from 0 with ``zero``) and at most
    :data:`MAX_SECONDS`, or ``None`` when it is one. A ``bool`` is not a number.

    >>> seconds_problem(10**400)
    'must be a number of seconds above 0 and at most 10000000'
    >>> seconds_problem(0, zero=True) is None
    True
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "must be a number"
    span = f"from 0 to {MAX_SECONDS}" if zero else f"above 0 and at most {MAX_SECONDS}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number of seconds {span}"
    if value > MAX_SECONDS or value < 0 or (value == 0 and not zero):
        return f"must be a number of seconds {span}"
    return None


def shown_value(value: object) -> str:
    """``repr(value)`` for an error message, cut short: of a 400-digit number its start says enough.

    >>> shown_value(10**50)
    '100000000000000000000000... (51 characters)'
    """
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:24]}... ({len(text)} characters)"
