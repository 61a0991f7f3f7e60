"""The verdict of ``doctor``'s exclusive-create probe: N concurrent creates of one new name.

spec/layout.md §6.

Pure: the adapters run the creates (all at once, from N threads) and hand the outcomes here.

Rules:

1. Honoured means exactly one create succeeded and every other one was refused because the name exists.
2. More than one success is the failure that silently breaks the log: two publishers would both believe they
   published the same entry. A storage that ignores the condition (or a proxy that strips it) shows as N
   successes; a storage that checks and then writes, with other requests free to run in between, shows as
   two or more.
3. A storage that refuses the condition as not implemented does not honour exclusive create either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import attrs

__all__ = ["CreateOutcome", "ExclusiveCreateVerdict", "judge_exclusive_creates"]

#: What one exclusive create of the probe name came to.
CreateOutcome = Literal["created", "exists", "unsupported"]


@attrs.frozen
class ExclusiveCreateVerdict:
    """Whether exclusive create is honoured, why, and the numbers (``doctor --json`` shows them)."""

    honoured: bool
    detail: str
    writers: int
    created: int
    refused: int
    unsupported: int


def judge_exclusive_creates(outcomes: Iterable[CreateOutcome], what: str) -> ExclusiveCreateVerdict:
    """Judge the outcomes of concurrent exclusive creates of one new name (rules 1-3).

    ``what`` names the operation in the detail (``If-None-Match: * create``, ``O_EXCL create``).

    >>> judge_exclusive_creates(["created", "exists", "exists"], "create").honoured
    True
    >>> judge_exclusive_creates(["created", "created", "exists"], "create").detail.split(":")[0]
    '2 of 3 concurrent create of one new name succeeded'
    """
    seen = list(outcomes)
    writers = len(seen)
    created, refused, unsupported = (seen.count(kind) for kind in ("created", "exists", "unsupported"))
    numbers = {"writers": writers, "created": created, "refused": refused, "unsupported": unsupported}
    if unsupported:
        return ExclusiveCreateVerdict(
            False,
            f"the storage does not implement the {what} ({unsupported} of {writers} refused it)",
            **numbers,
        )
    if created == 1 and refused == writers - 1:
        detail = (
            f"of {writers} concurrent {what} of one new name exactly 1 succeeded and {refused} were refused "
            "as existing"
        )
        return ExclusiveCreateVerdict(True, detail, **numbers)
    if created == writers > 1:
        detail = (
            f"all {writers} concurrent {what} of one new name succeeded: the storage (or a proxy on the way) "
            "ignores the condition, so two publishers could both believe they published the same entry"
        )
        return ExclusiveCreateVerdict(False, detail, **numbers)
    if created > 1:
        detail = (
            f"{created} of {writers} concurrent {what} of one new name succeeded: the storage lets "
            "concurrent writers both win, so two publishers could both believe they published the same entry "
            "(expected exactly 1 success and the rest refused)"
        )
        return ExclusiveCreateVerdict(False, detail, **numbers)
    detail = (
        f"none of {writers} concurrent {what} of one new name succeeded ({refused} refused as existing): "
        "the storage refuses to create a fresh name"
    )
    return ExclusiveCreateVerdict(False, detail, **numbers)
