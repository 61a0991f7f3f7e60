"""End a watch or a follow on SIGTERM and SIGINT without taking a lock inside a signal handler (ADR 0018).

CPython runs a Python signal handler in the main thread, between two bytecodes of whatever that thread is
doing. When it is inside ``threading.Event.wait`` (where a watch or a follow spends its idle time), it may
hold the event's internal lock at that moment; a handler that calls ``Event.set`` then waits for a lock its
own thread holds, and the process never ends: SIGTERM is ignored until the kubelet's SIGKILL, and the
drain's publications are lost. So the handler here only writes the signal's number to a pipe (one system
call, no lock), and a relay thread reads the pipe and sets the event.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

from ckpt.domain.arguments import require_instance, require_items
from ckpt.domain.errors import InvalidTypeError

# Not a signal number: written once on the way out, it ends the relay thread.
_END = 0


@contextmanager
def stop_on_signals(
    stop: threading.Event,
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
    *,
    announce: Callable[[signal.Signals], None] | None = None,
) -> Iterator[None]:
    """Set ``stop`` when one of ``signals`` arrives while inside; restore the previous handlers after.

    ``announce`` is called with the first signal, before ``stop`` is set, from the relay thread (so it may
    log, which a signal handler must not). Handlers can only be installed from the main thread; elsewhere
    (an embedder's thread) this does nothing and the caller stops through its own means. A child forked
    inside (a DataLoader worker) inherits the handlers but not the relay: there a signal does what the
    previous handler would have done (SIGTERM's default: the child ends), and never stops this process.
    """
    require_instance(stop, threading.Event, "stop")
    if announce is not None and not callable(announce):
        raise InvalidTypeError(f"announce must be callable, got {type(announce).__name__} {announce!r}")
    callback = announce
    wanted = require_items(signals, signal.Signals, "signals")
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)  # a handler must never block: a full pipe already holds a wake-up

    owner = os.getpid()
    previous: dict[int, Any] = {}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:  # a child forked inside (a DataLoader worker): not ours to stop
            _pass_on(previous.get(signum), signum, frame)
            return
        with suppress(BlockingIOError):
            os.write(write_end, bytes((signum,)))

    def relay() -> None:
        while True:
            chunk = os.read(read_end, 64)
            for signum in chunk:
                if signum == _END:
                    return
                try:
                    if callback is not None and not stop.is_set():
                        callback(signal.Signals(signum))
                finally:  # a failing callback must not leave the process deaf to the signal
                    stop.set()
            if not chunk:
                return

    relay_thread = threading.Thread(target=relay, name="ckpt-signal-relay", daemon=True)
    relay_thread.start()
    try:
        for sig in wanted:
            previous[sig] = signal.signal(sig, on_signal)
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler installed outside Python, which Python cannot put back; the default action
            # is the nearest, and ours must not stay behind a closed pipe.
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        # No handler of this process writes any more: a blocking write of the end mark cannot race one. An
        # end mark rather than closing the pipe, because a child forked meanwhile still holds the write end.
        os.set_blocking(write_end, True)
        os.write(write_end, bytes((_END,)))
        relay_thread.join()
        os.close(write_end)
        os.close(read_end)


def _pass_on(handler: Any, signum: int, frame: FrameType | None) -> None:
    """In a forked child, do what the handler before ours would have done with the signal."""
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:  # the default action (SIG_DFL, or None: set outside Python)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
