"""One call given at most a number of seconds: how watcher scans and follower listings are bounded.

A store call can hang (an NFS server gone, an S3 endpoint that accepts and never answers, a proxy that
trickles bytes). The call runs in a daemon thread; past the timeout the caller gets a ``ScanTimeoutError``
and the thread is abandoned (it cannot be cancelled; it ends when the call does, or with the process).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from ckpt.domain.errors import ScanTimeoutError

__all__ = ["call_within"]

_T = TypeVar("_T")


def call_within(
    work: Callable[[], _T],
    timeout: float | None,
    *,
    what: str,
    thread_name: str,
    on_timeout: Callable[[], None] | None = None,
) -> _T:
    """``work()``, or ``ScanTimeoutError`` naming ``what`` when it takes longer than ``timeout`` seconds.

    ``timeout`` ``None`` runs ``work`` in this thread, unbounded. An exception ``work`` raises is raised here.
    ``on_timeout`` runs once, just before the timeout is raised (the watcher records the scan it gave up).
    """
    if timeout is None:
        return work()
    outcome: list[tuple[_T] | Exception] = []

    def run() -> None:
        try:
            outcome.append((work(),))
        except Exception as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
            outcome.append(exc)

    worker = threading.Thread(target=run, name=thread_name, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        if on_timeout is not None:
            on_timeout()
        raise ScanTimeoutError(
            f"{what} took longer than {timeout:g}s (the store is too slow or stopped answering)"
        )
    if not outcome:  # the thread died of a BaseException, which Python has already reported
        raise ScanTimeoutError(f"{what} ended without a result")
    result = outcome[0]
    if isinstance(result, Exception):
        raise result
    return result[0]
