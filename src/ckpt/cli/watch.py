"""``ckpt watch``: the publication sidecar (spec/watcher.md, §8).

Rules:

1. Arguments: ``--framework NAME`` (a built-in rule: ``hf``, ``dcp``, ``lightning``, ``deepspeed``,
   ``megatron``, ``nemo``, ``orbax``, ``accelerate``; a ``[[frameworks]]`` rule of the configuration file;
   or an installed plugin's, ``ckpt.application.rulebook``; anything else is ``InvalidError`` listing them);
   the saves folder from ``--saves LOCATION`` (absolute path, ``s3://`` URL, or a path relative to the root)
   or else
   ``exec_dir(--attempt | DISPATCH_ATTEMPT)``; the epoch from ``--epoch | DISPATCH_EPOCH``. ``--interval``
   (10), ``--settle`` (the rule's: the interval for ``hf``, ``lightning``, a ``deepspeed`` of unknown world
   size and configured rules, else 0; ``dcp`` never settles) and ``--scan-timeout`` (120) are seconds,
   fractions allowed: plain decimals only (no sign, exponent, ``inf`` or ``nan``); interval and scan timeout
   must be > 0. ``--world-size N`` (default ``WORLD_SIZE`` from the environment the sidecar shares with the
   trainer; unset: unknown) is the number of training processes (``hf`` above 1: every rank's
   ``rng_state_<i>.pth`` must be complete; ``dcp``: a save without collectives is complete with every rank's
   ``__<i>.metadata``; ``deepspeed``: as many optimizer shards). Anything invalid is
   ``InvalidError`` (exit 2).
2. One log line per publication through the ``ckpt`` logger (text or JSON lines, as ``--log-format`` set it).
3. SIGTERM and SIGINT stop the watcher: it drains (at most the settle time) and the command exits 0.
   ``--once`` is a watch stopped right after its first scan. The command installs its handlers before it
   reads the configuration or opens the store (which imports botocore, and may take a while), so a signal
   that lands during start-up still ends in one drained scan and exit 0, not in the default death (143).
4. A scan error is raised; the CLI's ``main`` turns it into one ``ckpt: ...`` line and the exit code
   (storage and timeout 1, malformed log 5).
5. ``--json`` prints ``{"published": [entry, ...]}`` once the watch ends normally.
6. No seconds option (rule 1) exceeds ``ckpt.config.MAX_SECONDS`` (10,000,000, about 115 days): far below
   what the platform can wait for, so a huge value is refused (exit 2) instead of overflowing a wait.
7. ``--metrics-port PORT`` (0 to 65535; 0 picks a free port) serves the Prometheus text format at
   ``/metrics`` on ``--metrics-address`` (an IP address, default ``127.0.0.1``) for as long as the watch
   runs (``ckpt.adapters.prometheus``); the URL is logged before the first scan. ``--metrics-address``
   without ``--metrics-port`` is an ``InvalidError``; so is a missing ``prometheus_client`` (the
   ``metrics`` extra); an address that cannot be bound fails the command (exit 1).
8. Watching ``exec_dir`` of an attempt, or a ``--saves`` folder inside one (``exec/<attempt>/<sub-folder>``,
   ``ckpt.domain.catchup`` rule 7), the sidecar first records the execution's epoch in
   ``exec/<attempt>/.ckpt-epoch`` (spec/layout.md §8), so that a catch-up at the next start knows the epoch
   of an execution that died before it published anything, within the scan timeout; with a world size
   (``--world-size`` or ``WORLD_SIZE``) it records that too, in ``exec/<attempt>/.ckpt-world-size``
   (spec/layout.md §8.5), so that the catch-up and verified resolve judge the saves by it. A record that
   cannot be written is a warning: publishing is the sidecar's job, the records only help the catch-up.
9. A saves folder too long for the rule's longest save name (``ckpt.domain.room``, spec/names.md §4.5:
   ``<folder>/checkpoint-18446744073709551615`` for ``hf`` must fit in the 133 bytes of save path an entry
   name carries) is an ``InvalidError`` at start-up, before the epoch record: its saves would fail at their
   first publication, hours later.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import IO, TYPE_CHECKING, Any, Protocol

from ckpt.adapters.prometheus import DEFAULT_ADDRESS as DEFAULT_METRICS_ADDRESS
from ckpt.config import MAX_SECONDS
from ckpt.domain.catchup import attempt_of_saves
from ckpt.domain.entries import Entry, exec_save_prefix, parse_epoch, validate_save
from ckpt.domain.errors import InvalidError
from ckpt.domain.frameworks import parse_world_size
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import WatchStore
from ckpt.domain.redaction import redact_url
from ckpt.domain.room import require_rule_room
from ckpt.stopping import stop_on_signals

if TYPE_CHECKING:
    from ckpt.application.watcher import WatchObserver
    from ckpt.config import Config
    from ckpt.domain.rules import Rule
    from ckpt.domain.rules.custom import CustomRule

__all__ = ["add_metrics_options", "metrics_endpoint", "register", "run"]

_log = logging.getLogger("ckpt.watch")

DEFAULT_INTERVAL = 10.0
DEFAULT_SCAN_TIMEOUT = 120.0
# Rule 1: a plain decimal number of seconds. float() alone would also take "-1", "1e3", "inf", "nan", "1_0".
_SECONDS = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


class _Context(Protocol):
    """What the CLI core hands a command (``ckpt.cli.Context``), as far as ``watch`` uses it."""

    args: argparse.Namespace
    environ: Mapping[str, str]
    stdout: IO[str]

    def store(self) -> WatchStore: ...

    def config(self) -> Config: ...


def register(commands: Any) -> None:
    """Add the ``watch`` sub-command to the CLI's sub-parsers."""
    p: argparse.ArgumentParser = commands.add_parser(
        "watch",
        help="publish a framework's complete saves as they appear (the sidecar)",
        description="Publish every complete save a framework writes into one execution's folder.",
    )
    p.add_argument(
        "--framework",
        required=True,
        metavar="NAME",
        help="save layout: hf, dcp, lightning, deepspeed, megatron, nemo, orbax, accelerate, a configured or "
        "plugin rule",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--attempt", help="execution attempt; watches exec/<attempt> (DISPATCH_ATTEMPT)")
    where.add_argument(
        "--saves", metavar="LOCATION", help="the folder to watch instead (path, URL or relative)"
    )
    p.add_argument("--epoch", help="scheduler epoch to publish at (DISPATCH_EPOCH)")
    p.add_argument("--interval", metavar="SECONDS", help=f"time between scans (default {DEFAULT_INTERVAL:g})")
    p.add_argument(
        "--settle",
        metavar="SECONDS",
        help="how long a listing must stay unchanged (default: hf the interval, dcp 0)",
    )
    p.add_argument(
        "--scan-timeout",
        metavar="SECONDS",
        help=f"give up on a scan after this long (default {DEFAULT_SCAN_TIMEOUT:g})",
    )
    p.add_argument(
        "--world-size",
        metavar="N",
        help="hf: number of training processes; each rank's files must be complete (WORLD_SIZE)",
    )
    p.add_argument(
        "--once", action="store_true", help="scan once (waiting at most the settle time), then exit"
    )
    add_metrics_options(p)
    p.set_defaults(handler=_handle)


def add_metrics_options(p: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-address`` (rule 7), for every command that serves metrics."""
    p.add_argument(
        "--metrics-port",
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (0: any free port; the metrics extra)",
    )
    p.add_argument(
        "--metrics-address",
        metavar="ADDR",
        help=f"IP address the metrics endpoint listens on (default {DEFAULT_METRICS_ADDRESS})",
    )


def _handle(ctx: _Context) -> int:
    stop = threading.Event()
    with _stop_on_signals(stop):  # rule 3: before the configuration is read and the store opened
        configured = ctx.config().frameworks
        return run(ctx.args, ctx.store(), ctx.stdout, environ=ctx.environ, stop=stop, configured=configured)


def parse_seconds(text: str, option: str, *, allow_zero: bool) -> float:
    """Parse a number of seconds given to ``option`` (rules 1, 6); ``InvalidError`` names the option."""
    if not isinstance(text, str) or _SECONDS.fullmatch(text) is None:
        shown = text if not isinstance(text, str) or len(text) <= 40 else text[:40] + "..."
        raise InvalidError(f"{option} {shown!r} is not a number of seconds (such as 10 or 0.5)")
    value = float(text)
    if value > MAX_SECONDS:
        shown = text if len(text) <= 40 else text[:40] + "..."
        raise InvalidError(f"{option} {shown!r} is more than the longest wait ckpt accepts ({MAX_SECONDS} s)")
    if value == 0 and not allow_zero:
        raise InvalidError(f"{option} {text!r} must be greater than 0")
    return value


def saves_folder(store: WatchStore, saves: str) -> str:
    """The save path (relative to the root) of a ``--saves LOCATION``: a path relative to the root, or an
    absolute path or URL under it (rule 1); ``InvalidError`` otherwise. ``ckpt resume --saves`` shares it.
    """
    if not (saves.startswith("/") or "://" in saves):
        return validate_save(saves.rstrip("/"))
    # Refuse a folder outside the root now, not at the first publication (which may be hours away).
    prefix = store.root.rstrip("/") + "/"
    if not saves.startswith(prefix):
        shown = redact_url(saves, keep_user=False)
        raise InvalidError(f"--saves {shown!r} is not under the root {store.root}")
    return validate_save(saves[len(prefix) :].rstrip("/"))


def saves_location(
    store: WatchStore, args: argparse.Namespace, environ: Mapping[str, str], rule: Rule
) -> str:
    """The folder to watch: ``--saves`` (under the root), else ``exec_dir`` of the attempt (rules 1 and 9).

    ``rule``'s longest save name must fit inside it (rule 9).
    """
    saves: str | None = getattr(args, "saves", None)
    if saves:
        folder = saves_folder(store, saves)
        require_rule_room(folder, rule, what=f"--saves {redact_url(saves, keep_user=False)!r}")
        return store.location(Entry(0, 0, folder))
    attempt = _attempt(args, environ)
    if attempt is None:
        raise InvalidError("nothing to watch: pass --attempt or --saves, or set DISPATCH_ATTEMPT")
    require_rule_room(exec_save_prefix(attempt), rule, what=f"attempt {attempt!r}")
    return store.exec_dir(attempt)


def _attempt(args: argparse.Namespace, environ: Mapping[str, str]) -> str | None:
    """The attempt whose ``exec_dir`` is watched, or ``None`` without one.

    With ``--saves`` it is the execution whose folder holds the saves folder, if any (rule 8).
    """
    if getattr(args, "saves", None):
        return None
    return args.attempt if getattr(args, "attempt", None) is not None else environ.get("DISPATCH_ATTEMPT")


def _record_epoch(
    store: WatchStore, attempt: str, epoch: int, timeout: float, world_size: int | None = None
) -> None:
    """Rule 8: record this execution's epoch (and world size, when known), within the scan timeout; a
    failure is a warning, never the end of the sidecar (a store that stopped answering ends it at the first
    scan instead, rule 4)."""
    from ckpt.application.bounded import call_within
    from ckpt.application.catchup import record_epoch, record_world_size
    from ckpt.domain.errors import CkptError

    folder = store.exec_dir(attempt)
    records: list[tuple[str, int, Callable[[], object]]] = [
        ("epoch", epoch, lambda: record_epoch(store, attempt, epoch))
    ]
    if world_size is not None:
        size = world_size
        records.append(("world size", size, lambda: record_world_size(store, attempt, size)))
    for what, value, record in records:
        try:
            call_within(
                record,
                timeout,
                what=f"recording the {what} in {folder}",
                thread_name=f"ckpt-{what.replace(' ', '-')}-record",
            )
        except CkptError as exc:
            _log.warning("cannot record %s %d in %s: %s", what, value, folder, exc)


def _epoch(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    text = args.epoch if getattr(args, "epoch", None) is not None else environ.get("DISPATCH_EPOCH")
    if text is None:
        raise InvalidError("no epoch: pass --epoch or set DISPATCH_EPOCH")
    return parse_epoch(text)


def _world_size(args: argparse.Namespace, environ: Mapping[str, str]) -> int | None:
    """``--world-size``, else ``WORLD_SIZE`` from the environment, else ``None`` (unknown)."""
    text = getattr(args, "world_size", None)
    if text is not None:
        return parse_world_size(text)
    text = environ.get("WORLD_SIZE") or None
    if text is None:
        return None
    try:
        return parse_world_size(text)
    except InvalidError as exc:
        raise InvalidError(f"WORLD_SIZE in the environment: {exc}") from exc


def metrics_endpoint(args: argparse.Namespace) -> tuple[str, int] | None:
    """``(address, port)`` from ``--metrics-address`` and ``--metrics-port``, or ``None`` (rule 7)."""
    from ckpt.adapters.prometheus import parse_endpoint

    return parse_endpoint(
        getattr(args, "metrics_port", None),
        getattr(args, "metrics_address", None),
        port_name="--metrics-port",
        address_name="--metrics-address",
    )


def _stop_on_signals(stop: threading.Event) -> AbstractContextManager[None]:
    """Set ``stop`` on SIGTERM and SIGINT while inside, and log the first (``ckpt.stopping``)."""

    def announce(signum: signal.Signals) -> None:
        _log.info("stopping on %s: publishing what settles within the settle time", signum.name)

    return stop_on_signals(stop, announce=announce)


def run(
    args: argparse.Namespace,
    store: WatchStore,
    out: IO[str],
    *,
    environ: Mapping[str, str] | None = None,
    stop: threading.Event | None = None,
    configured: Sequence[CustomRule] = (),
) -> int:
    """Run ``ckpt watch`` with parsed ``args`` on ``store``; print the ``--json`` document on ``out``.

    ``stop`` is the caller's event, set by signal handlers it already installed (rule 3); without one,
    ``run`` installs its own for the duration of the watch. ``configured`` are the configuration file's
    ``[[frameworks]]`` rules, which ``--framework`` may name.

    Returns 0 when the watch ends normally (stopped by a signal, or ``--once``). Invalid arguments raise
    ``InvalidError``; a failed or timed-out scan raises its error (rules 3, 4).
    """
    from ckpt import __version__
    from ckpt.application.rulebook import find_rule
    from ckpt.application.watcher import Watcher  # imported here: keeps ``ckpt --help`` light

    env = os.environ if environ is None else environ
    interval = (
        DEFAULT_INTERVAL
        if args.interval is None
        else parse_seconds(args.interval, "--interval", allow_zero=False)
    )
    settle = None if args.settle is None else parse_seconds(args.settle, "--settle", allow_zero=True)
    scan_timeout = (
        DEFAULT_SCAN_TIMEOUT
        if args.scan_timeout is None
        else parse_seconds(args.scan_timeout, "--scan-timeout", allow_zero=False)
    )
    epoch = _epoch(args, env)
    world_size = _world_size(args, env)
    framework = find_rule(args.framework, world_size=world_size, configured=configured)
    location = saves_location(store, args, env, framework)  # rule 9: before the epoch record
    endpoint = metrics_endpoint(args)
    attempt = _attempt(args, env)
    if attempt is None and getattr(args, "saves", None):
        attempt = attempt_of_saves(store.save_of(location))  # rule 8: exec/<attempt>/<sub-folder>
    if attempt is not None:
        _record_epoch(store, attempt, epoch, scan_timeout, world_size)

    def published(entry: Entry) -> None:
        # The entry's fields go in as structured fields: the text format prints them as key=value, the
        # JSON format as keys of the record.
        _log.info(
            "published",
            extra={
                "epoch": entry.epoch,
                "step": entry.step,
                "location": store.location(entry),
                "entry": format_entry_name(entry),  # "name" is taken by LogRecord itself
            },
        )

    own_handlers = stop is None
    stop = threading.Event() if stop is None else stop
    if args.once:
        stop.set()
    with ExitStack() as cleanup:
        observer: WatchObserver | None = None
        if endpoint is not None:  # rule 7
            from ckpt.adapters.prometheus import serve_watch_metrics

            observer, server = serve_watch_metrics(*endpoint, version=__version__)
            cleanup.callback(server.close)
            _log.info("serving metrics at %s", server.url)
        watcher = Watcher(
            store,
            framework,
            location,
            epoch,
            interval,
            settle=settle,
            scan_timeout=scan_timeout,
            world_size=world_size,
            on_published=published,
            observer=observer,
        )
        cleanup.enter_context(_stop_on_signals(stop) if own_handlers else nullcontext())
        # The version is a field of this line (``version=...`` in text, a key in JSON), so a platform team
        # can tell which build a pod runs.
        _log.info(
            "watching %s for %s saves at epoch %d every %gs (settle %gs, scan timeout %gs, world size %s)%s",
            location,
            framework.name,
            epoch,
            watcher.interval,
            watcher.settle,
            scan_timeout,
            "unknown" if world_size is None else world_size,
            " once" if args.once else "",
            extra={"version": __version__},
        )
        created = watcher.watch(stop)
    _log.info("stopped; published %d save(s)", len(created))
    if getattr(args, "json", False):
        from ckpt.cli.output import entry_document, print_json

        print_json({"published": [entry_document(store, e) for e in created]}, out)
    return 0
