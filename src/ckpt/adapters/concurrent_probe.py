"""Run one create N times at once, from N threads (``doctor``'s exclusive-create probe).

The threads start together behind a barrier, so their requests are in flight at the same time: a storage
that checks and then writes gets its chance to let two of them win. The first error a create raised is
raised after every thread finished (the caller cleans up first, in its ``finally``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from ckpt.domain.errors import StorageError

__all__ = ["DEFAULT_WRITERS", "run_at_once"]

#: How many creates the probe sends at once: enough to meet a race window, below the S3 client's
#: connection pool (10), so none waits for a connection.
DEFAULT_WRITERS = 8

_T = TypeVar("_T")


def run_at_once(
    create: Callable[[], _T], writers: int = DEFAULT_WRITERS, *, timeout: float = 120.0
) -> list[_T]:
    """Call ``create`` from ``writers`` threads released together; return the results (in thread order)."""
    start = threading.Barrier(writers)
    results: list[_T | None] = [None] * writers
    errors: list[BaseException] = []
    errors_lock = threading.Lock()

    def one(index: int) -> None:
        try:
            start.wait(timeout)
            results[index] = create()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread, which raises it
            with errors_lock:
                errors.append(exc)

    threads = [
        threading.Thread(target=one, args=(i,), name=f"ckpt-probe-{i}", daemon=True) for i in range(writers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    if errors:
        raise errors[0]
    if any(thread.is_alive() for thread in threads):
        raise StorageError(f"the concurrent probe creates did not finish within {timeout:g}s")
    return [result for result in results if result is not None]
