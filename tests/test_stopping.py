"""ckpt.stop_on_signals: real signals set the stop event, even while the main thread holds the event's
lock; the handlers, the relay thread and the pipe are gone afterwards (ADR 0018).

Each case runs in its own interpreter: a handler that deadlocks hangs that process, which the timeout
turns into a failure instead of a hung suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

import ckpt

# A generous bound for a process that should end in well under a second; reached only by a hang.
TIMEOUT = 60


def run_script(source: str) -> str:
    """Run ``source`` in a new interpreter; return its stdout, failing on a non-zero exit or a hang."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(source)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the process hung for {TIMEOUT} s (a signal handler waiting on a lock its thread holds)")
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_signal_while_the_main_thread_holds_the_events_lock_still_stops() -> None:
    """The handler runs between two bytecodes of the `with` block below, with the lock held: it must not
    wait for that lock (calling stop.set() there hangs this process for good)."""
    out = run_script(
        """
        import os, signal, threading
        import ckpt

        stop = threading.Event()
        with ckpt.stop_on_signals(stop):
            with stop._cond:  # the lock Event.wait holds on its way in and out
                os.kill(os.getpid(), signal.SIGTERM)
                held = True  # the handler has run by here
            print("stopped", stop.wait(30))
        """
    )
    assert out.split() == ["stopped", "True"]


def test_sigint_stops_too_and_the_first_signal_is_announced_once() -> None:
    out = run_script(
        """
        import os, signal, threading
        import ckpt

        stop = threading.Event()
        with ckpt.stop_on_signals(stop, announce=lambda s: print("announced", s.name, flush=True)):
            os.kill(os.getpid(), signal.SIGINT)
            print("stopped", stop.wait(30), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        print("done")
        """
    )
    assert out.split("\n")[:3] == ["announced SIGINT", "stopped True", "done"]


def test_afterwards_the_handlers_thread_and_pipe_are_gone() -> None:
    out = run_script(
        """
        import os, signal, threading
        import ckpt

        def mine(signum, frame):
            print("mine", signum)

        signal.signal(signal.SIGTERM, mine)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # not inherited SIG_IGN (a background job)
        fds = sorted(os.listdir("/proc/self/fd"))
        stop = threading.Event()
        with ckpt.stop_on_signals(stop):
            inside = len(os.listdir("/proc/self/fd")) - len(fds)
            relays = [t.name for t in threading.enumerate() if t.name == "ckpt-signal-relay"]
        print("inside", inside, relays)
        print(
            "restored",
            signal.getsignal(signal.SIGTERM) is mine,
            signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        )
        print("threads", [t.name for t in threading.enumerate()])
        print("fds", sorted(os.listdir("/proc/self/fd")) == fds)
        print("stop", stop.is_set())
        """
    )
    assert out.splitlines() == [
        "inside 2 ['ckpt-signal-relay']",
        "restored True True",
        "threads ['MainThread']",
        "fds True",
        "stop False",
    ]


def test_a_child_forked_inside_does_not_keep_the_relay_alive() -> None:
    """The forked child holds a copy of the pipe's write end: leaving must not wait for end-of-file."""
    out = run_script(
        """
        import os, threading
        import ckpt

        stop = threading.Event()
        with ckpt.stop_on_signals(stop):
            reader, writer = os.pipe()
            child = os.fork()
            if child == 0:
                os.close(writer)
                os.read(reader, 1)  # lives until the parent has left the block
                os._exit(0)
            os.close(reader)
        print("left", [t.name for t in threading.enumerate()])
        os.close(writer)
        os.waitpid(child, 0)
        """
    )
    assert out.split("\n")[0] == "left ['MainThread']"


def test_in_a_child_forked_inside_a_signal_does_what_it_did_before_and_never_stops_the_parent() -> None:
    """A forked worker inherits the handler: SIGTERM must end it (the default action), and SIGINT raise
    KeyboardInterrupt there, as without ckpt; neither may reach the parent's relay. Leaving the block drains
    the pipe up to the end mark, so ``stop`` tells for certain whether a child wrote to it."""
    out = run_script(
        """
        import os, signal, threading
        import ckpt

        # What the child falls back to, whatever this process inherited (a background job ignores SIGINT).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stop = threading.Event()
        with ckpt.stop_on_signals(stop):
            child = os.fork()
            if child == 0:
                os.kill(os.getpid(), signal.SIGTERM)
                os._exit(3)  # not reached: SIGTERM's default action ends the child
            _, status = os.waitpid(child, 0)
            print("sigterm", os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
            child = os.fork()
            if child == 0:
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    os._exit(3)
                except KeyboardInterrupt:
                    os._exit(4)
            _, status = os.waitpid(child, 0)
            print("sigint", os.WIFEXITED(status) and os.WEXITSTATUS(status) == 4)
        print("parent stopped", stop.is_set())
        """
    )
    assert out.splitlines() == ["sigterm True", "sigint True", "parent stopped False"]


def test_outside_the_main_thread_nothing_is_installed() -> None:
    out = run_script(
        """
        import signal, threading
        import ckpt

        def inside():
            stop = threading.Event()
            with ckpt.stop_on_signals(stop):
                print("default", signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
                print("threads", len(threading.enumerate()))

        worker = threading.Thread(target=inside)
        worker.start()
        worker.join()
        """
    )
    assert out.splitlines() == ["default True", "threads 2"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((None,), "stop"),
        ((threading.Event(), ["SIGTERM"]), "signals"),
        ((threading.Event(), "SIGTERM"), "signals"),
        ((threading.Event(),), "announce"),
    ],
)
def test_wrong_arguments_are_refused_on_entry(args: tuple[object, ...], named: str) -> None:
    """A wrong type is an InvalidTypeError naming the argument, before any handler is installed."""
    extra = {"announce": "log it"} if named == "announce" else {}
    with pytest.raises(ckpt.InvalidTypeError, match=named), ckpt.stop_on_signals(*args, **extra):  # type: ignore[arg-type]
        pass


def test_a_failing_announce_still_stops() -> None:
    """The relay sets ``stop`` even when the caller's callback raises (the error goes to stderr)."""
    out = run_script(
        """
        import os, signal, threading
        import ckpt

        def broken(_signum):
            raise RuntimeError("announce failed")

        stop = threading.Event()
        with ckpt.stop_on_signals(stop, announce=broken):
            os.kill(os.getpid(), signal.SIGTERM)
            print("stopped", stop.wait(30))
        """
    )
    assert out.split() == ["stopped", "True"]
