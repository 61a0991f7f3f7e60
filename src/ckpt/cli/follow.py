"""``ckpt follow``: print each entry as it is published (docs/spec/cli.md).

Rules:

1. Arguments: ``--interval`` (10) and ``--scan-timeout`` (120) are seconds as ``ckpt watch`` takes them
   (plain decimals, > 0, at most ``ckpt.config.MAX_SECONDS``); ``--from-start`` also prints what is already
   published. Anything invalid is ``InvalidError`` (exit 2).
2. One line per entry, flushed at once so a pipe reader sees it: in text ``latest <epoch> <step> <location>``
   or ``not-latest <epoch> <step> <location>``; with ``--json`` one JSON document per line, the entry's
   document plus ``"latest": true|false``. (``follow`` is the one command whose ``--json`` prints a stream.)
3. One log line on stderr once following has started (after the listing of "now"), through the ``ckpt``
   logger. SIGTERM and SIGINT end the follow after the current listing's entries are printed: exit 0. The
   handlers are installed before the configuration is read or the store opened.
4. A failed or timed-out listing is raised; ``main`` turns it into one ``ckpt: ...`` line and exit 1 (5 for a
   malformed log).
"""

from __future__ import annotations

import argparse
import logging
import threading
from typing import Any

from ckpt.cli.watch import parse_seconds
from ckpt.stopping import stop_on_signals

__all__ = ["register", "run"]

_log = logging.getLogger("ckpt.follow")


def register(commands: Any) -> None:
    """Add the ``follow`` sub-command to the CLI's sub-parsers."""
    p: argparse.ArgumentParser = commands.add_parser(
        "follow",
        help="print each entry as it is published (one line, or one JSON document, per entry)",
        description="Print each entry of the publication log once, as it is published, until stopped.",
    )
    p.add_argument("--interval", metavar="SECONDS", help="time between listings (default 10)")
    p.add_argument(
        "--scan-timeout", metavar="SECONDS", help="give up on a listing after this long (default 120)"
    )
    p.add_argument("--from-start", action="store_true", help="also print the entries already published")
    p.set_defaults(handler=_handle)


def _handle(ctx: Any) -> int:
    stop = threading.Event()
    with stop_on_signals(stop):  # rule 3: before the configuration is read and the store opened
        return run(ctx, stop)


def run(ctx: Any, stop: threading.Event) -> int:
    """Follow the store of ``ctx`` (``ckpt.cli.Context``) until ``stop`` is set; return the exit code."""
    from ckpt.application.following import DEFAULT_INTERVAL, DEFAULT_SCAN_TIMEOUT, follow
    from ckpt.cli.output import entry_document, entry_line, json_text

    args = ctx.args
    interval = (
        DEFAULT_INTERVAL
        if args.interval is None
        else parse_seconds(args.interval, "--interval", allow_zero=False)
    )
    scan_timeout = (
        DEFAULT_SCAN_TIMEOUT
        if args.scan_timeout is None
        else parse_seconds(args.scan_timeout, "--scan-timeout", allow_zero=False)
    )
    store = ctx.store()
    out = ctx.stdout
    followed_entries = follow(
        store, interval=interval, from_start=args.from_start, scan_timeout=scan_timeout, stop=stop
    )
    _log.info(
        "following %s from %s every %gs (scan timeout %gs)",
        store.root,
        "the start" if args.from_start else "now",
        interval,
        scan_timeout,
    )
    for followed in followed_entries:
        if ctx.json:
            document = entry_document(store, followed.entry)
            document["latest"] = followed.latest
            out.write(json_text(document) + "\n")
        else:
            mark = "latest" if followed.latest else "not-latest"
            out.write(f"{mark} {entry_line(store, followed.entry)}\n")
        out.flush()
    return 0
