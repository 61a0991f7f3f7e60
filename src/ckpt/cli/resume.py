"""``ckpt resume``: where a job starting now should resume from, after catching up earlier executions.

Rules:

1. Arguments: ``--framework NAME`` (any rule ``watch`` accepts: built-in, a configured ``[[frameworks]]``
   table or a plugin's); the epoch from ``--epoch | DISPATCH_EPOCH`` and the attempt from
   ``--attempt | DISPATCH_ATTEMPT`` (both required: the command records this execution's epoch);
   ``--settle`` (seconds; default: the rule's settle time for a 10 s interval, so 10 for ``hf``, 0 for
   ``dcp``) and ``--scan-timeout`` (120) as for ``watch``; ``--no-catch-up`` makes it a verified resolve
   that prints nothing on a first run. ``--saves LOCATION`` is where this execution's saves lie when that
   is a sub-folder of its folder: exactly the value ``ckpt watch --saves`` takes (a path relative to the
   root, or an absolute path or URL under it), which must lie inside ``exec/<attempt>``; the part below
   ``exec/<attempt>`` is the sub-folder the catch-up looks into in every execution's folder
   (``ckpt.domain.catchup`` rule 7). Anywhere else is ``InvalidError``.
2. It records this execution's epoch in ``exec/<attempt>/.ckpt-epoch``, publishes the complete saves earlier
   executions never published (under their own epochs), then resolves against the framework's rule.
3. Output: the location to resume from and a newline, or **nothing**, with exit 0 either way, so a job
   script needs no branch on the exit code: ``R=$(ckpt resume --framework hf)``. Each caught-up save and each
   execution folder passed over is a log line on stderr (``--log-level``), and each entry the verified
   resolve skipped is a ``ckpt: skipped ...`` line, as for ``resolve --framework``.
4. ``--json``: ``{"location": str | null, "entry": entry | null, "caught_up": [entry],
   "passed": [{"attempt": str, "reason": str}], "skipped": [{"entry": entry, "reason": str}]}``.
5. Errors (storage, credentials, a malformed log) end it with the CLI's usual one line and exit code: a job
   must not silently start from scratch because the store could not be read.
6. ``--durable DURABLE`` (spec/tiered.md §6): after all of the above on the fast root, the newest durable
   entry greater than the fast one that is complete under the rule and verifies against its manifest is
   restored into the fast root and published there; its fast location is the output. Each durable entry
   passed over is a ``ckpt: skipped <durable location>: <reason>`` line. A missing fast root is created.
   ``--json`` adds ``"restored": entry | null`` (at its durable location) and ``"durable_skipped"``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import IO, TYPE_CHECKING, Any, Protocol

from ckpt.domain.errors import InvalidError
from ckpt.domain.ports import WatchStore

if TYPE_CHECKING:
    from ckpt.config import Config
    from ckpt.domain.entries import Entry

__all__ = ["register"]

# Rule 1: a plain decimal number of seconds (no sign, exponent, inf or nan).


class _Context(Protocol):
    """What the CLI core hands a command (``ckpt.cli.Context``), as far as ``resume`` uses it."""

    args: argparse.Namespace
    environ: Mapping[str, str]
    stdout: IO[str]
    stderr: IO[str]

    def store(self) -> WatchStore: ...

    def root(self) -> str: ...

    def config(self) -> Config: ...

    def say(self, line: str) -> None: ...

    def warn(self, line: str) -> None: ...


def register(commands: Any) -> None:
    """Add the ``resume`` sub-command to the CLI's sub-parsers."""
    p: argparse.ArgumentParser = commands.add_parser(
        "resume",
        help="catch up earlier executions, then print where to resume from (nothing on a first run)",
        description=(
            "Record this execution's epoch, publish the complete saves earlier executions never published, "
            "and print the location of the newest complete save, or nothing when there is none (exit 0)."
        ),
    )
    p.add_argument(
        "--framework",
        required=True,
        metavar="NAME",
        help="save layout and rule: hf, dcp, lightning, deepspeed, megatron, nemo, orbax, accelerate, a "
        "configured or plugin rule",
    )
    p.add_argument("--attempt", help="this execution's attempt (DISPATCH_ATTEMPT)")
    p.add_argument("--epoch", help="this execution's epoch (DISPATCH_EPOCH)")
    p.add_argument("--settle", metavar="SECONDS", help="settle time for saves a zombie may still write")
    p.add_argument(
        "--scan-timeout", metavar="SECONDS", help="give up on a scan after this long (default 120)"
    )
    p.add_argument(
        "--world-size", metavar="N", help="processes that wrote the saves (hf, dcp, deepspeed, lightning)"
    )
    p.add_argument(
        "--saves",
        metavar="LOCATION",
        help="this execution's saves folder, as given to watch --saves (inside exec/<attempt>); the catch-up "
        "looks into the same sub-folder of every execution",
    )
    p.add_argument("--no-catch-up", action="store_true", help="only resolve (verified); publish nothing")
    p.add_argument(
        "--durable",
        metavar="DURABLE",
        help="a durable root (s3:// or a path) replicated from this one: restore its newest verified save "
        "when it is newer than this root's",
    )
    p.set_defaults(handler=_handle)


def _seconds(text: str | None, option: str, *, allow_zero: bool) -> float | None:
    from ckpt.cli.watch import parse_seconds  # one parser for every seconds option (cli.md)

    return None if text is None else parse_seconds(text, option, allow_zero=allow_zero)


def _required(args: argparse.Namespace, environ: Mapping[str, str], name: str, variable: str) -> str:
    value = getattr(args, name)
    if value is None:
        value = environ.get(variable)
    if value is None:
        raise InvalidError(f"no {name}: pass --{name} or set {variable}")
    return str(value)


def _sub_folder(store: WatchStore, saves: str, attempt: str) -> str:
    """Rule 1: the sub-folder of ``exec/<attempt>`` that ``--saves`` names (as ``watch --saves`` reads it)."""
    from ckpt.cli.watch import saves_folder
    from ckpt.domain.catchup import sub_folder_of
    from ckpt.domain.redaction import redact_url

    folder = saves_folder(store, saves)  # its errors name --saves already
    try:
        return sub_folder_of(folder, attempt)
    except InvalidError as exc:
        shown = redact_url(saves, keep_user=False)
        raise InvalidError(f"--saves {shown!r}: {exc}") from exc


def _handle(ctx: _Context) -> int:
    from ckpt.application.rulebook import find_rule
    from ckpt.catchup import DEFAULT_SCAN_TIMEOUT, resume
    from ckpt.domain.entries import parse_epoch, validate_attempt
    from ckpt.domain.frameworks import parse_world_size

    args = ctx.args
    # As for resolve: the size of the run that wrote the saves, only when given (never WORLD_SIZE).
    world_size = None if args.world_size is None else parse_world_size(args.world_size)
    rule = find_rule(args.framework, world_size=world_size, configured=ctx.config().frameworks)
    epoch = parse_epoch(_required(args, ctx.environ, "epoch", "DISPATCH_EPOCH"))
    attempt = validate_attempt(_required(args, ctx.environ, "attempt", "DISPATCH_ATTEMPT"))
    settle = _seconds(args.settle, "--settle", allow_zero=True)
    timeout = _seconds(args.scan_timeout, "--scan-timeout", allow_zero=False)
    if args.durable is not None and ctx.root().startswith("/"):
        from ckpt.adapters.posix.tiered import make_dirs

        make_dirs(ctx.root())  # rule 6: the node lost its disk (spec/tiered.md §6.5)
    store = ctx.store()
    sub_folder = "" if args.saves is None else _sub_folder(store, args.saves, attempt)
    resumed = resume(
        store,
        rule,
        attempt=attempt,
        epoch=epoch,
        settle=settle,
        catch_up_first=not args.no_catch_up,
        scan_timeout=DEFAULT_SCAN_TIMEOUT if timeout is None else timeout,
        sub_folder=sub_folder,
    )
    caught = resumed.caught_up  # each caught-up save and each folder passed over was logged (stderr)
    for entry, reason in resumed.skipped:
        ctx.warn(f"skipped {store.location(entry)}: {reason}")
    location, newest = resumed.location, resumed.entry
    restored: Entry | None = None
    durable_skipped: tuple[tuple[Entry, str], ...] = ()
    durable: WatchStore | None = None
    if args.durable is not None:  # rule 6
        from ckpt.application.replication import restore_newer
        from ckpt.cli.replicate import open_tier

        fast, fast_files, durable, durable_files = open_tier(ctx, args.durable)
        outcome = restore_newer(fast, fast_files, durable, durable_files, rule, than=resumed.entry)
        durable_skipped = outcome.skipped
        for entry, reason in durable_skipped:
            ctx.warn(f"skipped {durable.location(entry)}: {reason}")
        if outcome.entry is not None:
            location, newest, restored = outcome.location, outcome.entry, outcome.entry
    if args.json:
        from ckpt.cli.output import entry_document, print_json

        print_json(
            {
                "location": location,
                "entry": None if newest is None else entry_document(store, newest),
                "caught_up": [] if caught is None else [entry_document(store, e) for e in caught.published],
                "passed": []
                if caught is None
                else [{"attempt": p.attempt, "reason": p.reason} for p in caught.passed],
                "skipped": [{"entry": entry_document(store, e), "reason": r} for e, r in resumed.skipped],
                **(
                    {}
                    if durable is None
                    else {
                        "restored": None if restored is None else entry_document(durable, restored),
                        "durable_skipped": [
                            {"entry": entry_document(durable, e), "reason": r} for e, r in durable_skipped
                        ],
                    }
                ),
            },
            ctx.stdout,
        )
    elif location is not None:
        ctx.say(location)
    return 0
