"""``ckpt replicate --to DURABLE``: copy the fast root's published saves to a durable root (spec/tiered.md).

Rules:

1. The fast root is the global root (``--root``, ``CKPT_ROOT``, the configuration file) and MUST be an
   absolute POSIX path; ``--to`` is the durable root, an ``s3://`` URL or another absolute path, not the
   fast root, not inside it nor containing it (spec/tiered.md §1.1). Both are opened with the same
   configuration file (its ``[s3]`` and ``[[credentials]]`` serve an S3 durable root).
2. ``--once`` runs one pass (``ckpt.application.replication.replicate``); otherwise a pass every
   ``--interval`` seconds (default 10) until SIGTERM or SIGINT. A signal lets the file being copied finish,
   publishes nothing more and ends the command with exit 0.
3. Each entry published on the durable root is one stdout line, its durable location. On the way out
   every fast entry not yet durable is one ``ckpt: not yet durable: <location>`` line on stderr, and each
   save passed over one ``ckpt: passed over <location>: <reason>`` line.
4. A failed pass (storage, verification) is a warning naming the entry and the reason; with ``--once`` the
   command then exits 1, otherwise the next pass starts again from that entry.
5. ``--json``: one document at the end, ``{"published": [entry], "passed": [{"entry": entry, "reason":
   str}], "pending": [entry], "failure": str | null, "files_copied": int, "bytes_copied": int,
   "files_present": int, "lag_steps": int}`` (published entries at their durable locations, the others at
   their fast ones; ``lag_steps`` as spec/tiered.md §11.1 after the last pass).
6. ``--concurrency N`` (1 to 64, default 8) is the parallel transfers per file on an S3 durable root;
   ``--max-bandwidth RATE`` (``ckpt.domain.tiered_ports.parse_rate``) bounds the bytes per second of all
   the copies into the durable root (spec/tiered.md §12); ``--checksum`` names the S3 additional checksum
   of every upload (§12.5); ``--files N`` (1 to 64, default 4) how many files of one save are copied at
   once (§12.1). Anything else is exit 2.
7. ``--metrics-port PORT`` [``--metrics-address ADDR``] serve the replicator's metrics
   (``ckpt.adapters.prometheus`` rule 3a) as ``watch`` serves its own (``ckpt.cli.watch`` rule 7); the URL
   is one stderr line before the first pass.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
from typing import Any

from ckpt.domain.errors import CkptError, InvalidError

__all__ = ["open_tier", "register"]


def register(commands: Any) -> None:
    """Add the ``replicate`` sub-command to the CLI's sub-parsers."""
    p: argparse.ArgumentParser = commands.add_parser(
        "replicate",
        help="copy every published save to a durable root, verify it, and publish it there",
        description=(
            "Copy the fast root's published saves, in order, to the same paths under DURABLE (S3 or POSIX), "
            "verify every file, write a manifest and publish each at its epoch and step."
        ),
    )
    p.add_argument(
        "--to", required=True, metavar="DURABLE", help="the durable root: s3://BUCKET[/PREFIX] or a path"
    )
    p.add_argument("--once", action="store_true", help="run one pass, then exit")
    p.add_argument("--framework", metavar="NAME", help="copy only saves complete under this rule")
    p.add_argument("--interval", metavar="SECONDS", help="seconds between passes (default 10)")
    p.add_argument(
        "--concurrency", metavar="N", help="parallel transfers per file on an S3 durable root (default 8)"
    )
    p.add_argument(
        "--max-bandwidth",
        metavar="RATE",
        help="bytes per second the copies may take in all (200M, 1Gi; default: no bound)",
    )
    p.add_argument("--files", metavar="N", help="files of one save copied at once (default 4)")
    p.add_argument(
        "--checksum",
        metavar="ALGORITHM",
        help="S3 additional checksum of every upload: CRC32 (default), SHA256, CRC32C or CRC64NVME (awscrt)",
    )
    from ckpt.cli.watch import add_metrics_options

    add_metrics_options(p)
    p.set_defaults(handler=_handle)


def _limits(args: Any) -> Any:
    """Rule 6: ``--concurrency`` and ``--max-bandwidth`` (spec/tiered.md §12)."""
    from ckpt.domain.tiered_ports import TransferSettings, parse_checksum, parse_rate

    def count(text: str | None, option: str, default: int) -> int:
        if text is None:
            return default
        if not (text.isascii() and text.isdigit()):
            raise InvalidError(f"{option} {text!r}: give an integer from 1 to 64")
        return int(text)

    concurrency = count(args.concurrency, "--concurrency", 8)
    files = count(args.files, "--files", 4)
    bandwidth = None if args.max_bandwidth is None else parse_rate(args.max_bandwidth, "--max-bandwidth")
    checksum = "CRC32" if args.checksum is None else parse_checksum(args.checksum, "--checksum")
    try:
        return TransferSettings(concurrency, bandwidth, checksum, files)
    except InvalidError as exc:
        raise InvalidError(f"--{exc}") from None


def open_tier(ctx: Any, durable: str, limits: Any = None) -> tuple[Any, Any, Any, Any]:
    """The fast store and files, and the durable store and files (rule 1; ``ckpt.store.open_tiers``)."""
    from ckpt.store import open_store, open_tiers

    if not durable:
        raise InvalidError("--to is empty: give the durable root")
    fast = ctx.store()
    config = ctx.config() if ctx.args.config or ctx.environ.get("CKPT_CONFIG") else None
    tiers = open_tiers(fast, open_store(durable, config=config, environ=ctx.environ), limits)
    return tiers.fast, tiers.fast_files, tiers.durable, tiers.durable_files


def _handle(ctx: Any) -> int:
    from ckpt.application.replication import Replicated, pending_after, pending_between, replicate
    from ckpt.cli.watch import metrics_endpoint, parse_seconds
    from ckpt.stopping import stop_on_signals

    args = ctx.args
    interval = 10.0 if args.interval is None else parse_seconds(args.interval, "--interval", allow_zero=False)
    stop = threading.Event()
    with stop_on_signals(stop), contextlib.ExitStack() as cleanup:  # rule 2: before anything is opened
        metrics = None
        endpoint = metrics_endpoint(args)  # rule 7
        rule = None
        if args.framework is not None:
            from ckpt.application.rulebook import find_rule

            rule = find_rule(args.framework, configured=ctx.config().frameworks)
        limits = _limits(args)
        fast, fast_files, durable, durable_files = open_tier(ctx, args.to, limits)
        if endpoint is not None:
            from ckpt import __version__
            from ckpt.adapters.prometheus import serve_replication_metrics

            metrics, server = serve_replication_metrics(*endpoint, version=__version__)
            cleanup.callback(server.close)
            ctx.warn(f"serving metrics at {server.url}")
        published: list[Any] = []
        totals = [0, 0, 0]
        last = Replicated()
        while True:
            try:
                last = replicate(
                    fast,
                    fast_files,
                    durable,
                    durable_files,
                    rule=rule,
                    stop=stop.is_set,
                    files_in_flight=limits.files_in_flight,
                )
            except CkptError as exc:  # rule 4: a log that cannot be read ends only a --once run
                if metrics is not None:
                    metrics.passed(None)
                if args.once:
                    raise
                ctx.warn(f"replication failed: {exc}")
                if stop.wait(interval):
                    break
                continue
            published += last.published
            if metrics is not None:
                try:
                    metrics.passed(last, tuple(pending_after(fast, last)))
                except CkptError as exc:
                    ctx.warn(f"cannot tell which entries are not yet durable: {exc}")
                    metrics.passed(last, last.pending)
            totals = [
                totals[0] + last.files_copied,
                totals[1] + last.bytes_copied,
                totals[2] + last.files_present,
            ]
            for entry in last.published if not args.json else ():
                ctx.say(durable.location(entry))
            if last.failure is not None:
                ctx.warn(f"replication failed: {last.failure}")
            if args.once or stop.is_set() or stop.wait(interval):
                break
        pending = list(last.pending)
        if not pending:  # entries published on the fast root since the last pass (rule 3)
            passed = {entry for entry, _ in last.passed}
            try:
                pending = [e for e in pending_between(fast, durable) if e not in passed]  # tiered.md §2.1
            except CkptError as exc:
                ctx.warn(f"cannot tell which entries are not yet durable: {exc}")
    for entry, reason in last.passed:
        ctx.warn(f"passed over {fast.location(entry)}: {reason}")
    for entry in pending:
        ctx.warn(f"not yet durable: {fast.location(entry)}")
    if args.json:
        from ckpt.cli.output import entry_document, print_json

        print_json(
            {
                "published": [entry_document(durable, e) for e in published],
                "passed": [{"entry": entry_document(fast, e), "reason": r} for e, r in last.passed],
                "pending": [entry_document(fast, e) for e in pending],
                "failure": last.failure,
                "files_copied": totals[0],
                "bytes_copied": totals[1],
                "files_present": totals[2],
                "lag_steps": last.lag_steps,
            },
            ctx.stdout,
        )
    return 1 if args.once and last.failure is not None else 0
