"""The ``ckpt`` command line (spec/cli.md).

Rules:

1. Exit codes: 0 success; 1 operational failure (storage, network, credentials, timeout); 2 usage error or
   ``InvalidError``; 3 ``resolve`` found nothing; 4 ``publish`` found the entry already there; 5 a malformed
   name in the publication log.
2. An error is one line on stderr starting ``ckpt: ``; never a traceback. A value the user gave is quoted
   in it with ``repr`` (as saves always were), and ``Context.warn`` escapes any line break or control
   character left in a message, so no value (a root with a newline) can split the line or forge another.
3. ``--json`` prints exactly one JSON document on stdout, always valid UTF-8 (see ``output.print_json``).
   Text output writes a path that is not valid UTF-8 back as the bytes it came from.
4. Start-up stays cheap: command modules, boto3 and hvac are imported only by the commands that need them;
   logging and json too (benchmarks/README.md holds ``ckpt resolve`` to 1.5x ``python -c "import attrs"``).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, NoReturn

from ckpt.domain.entries import MAX_U64
from ckpt.domain.errors import CkptError, ExistsError, InvalidError, MalformedError

if TYPE_CHECKING:
    from ckpt.config import Config
    from ckpt.domain.ports import WatchStore

__all__ = ["Context", "main"]

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_NOTHING, EXIT_EXISTS, EXIT_MALFORMED = 0, 1, 2, 3, 4, 5
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a writer whose reader went away


# Rule 2: what would break an error line or hide in it: C0 and C1 controls (newline, carriage return,
# escape), the Unicode line and paragraph separators, and lone surrogates (bytes that were not UTF-8).
_NOT_IN_A_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def one_line(text: str) -> str:
    """``text`` with every character that could break or disguise a line escaped as ``repr`` would."""
    return _NOT_IN_A_LINE.sub(lambda m: repr(m.group())[1:-1], text)


class UsageError(Exception):
    """A command-line usage error (exit 2)."""


class _VersionRequested(Exception):  # noqa: N818 - a signal from the parser to main, not an error
    """``--version`` was given: print the version and run nothing."""


class _ShowVersion(argparse.Action):
    """``--version``: stop parsing at once (before the required COMMAND is checked) and say so to main."""

    def __call__(self, *_args: Any, **_kwargs: Any) -> NoReturn:
        raise _VersionRequested


def _terminal_columns() -> int:
    """The width ``shutil.get_terminal_size()`` gives (``COLUMNS``, else the terminal, else 80), found without
    importing shutil and the compression modules it brings, which is what argparse would do (rule 4)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, told the width up front (argparse would import shutil to find it out)."""

    def __init__(
        self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
    ):
        super().__init__(
            prog, indent_increment, max_help_position, _terminal_columns() - 2 if width is None else width
        )


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


class Context:
    """What a command needs: parsed arguments, the environment, the streams, and lazily the store."""

    def __init__(
        self, args: argparse.Namespace, environ: Mapping[str, str], stdout: IO[str], stderr: IO[str]
    ) -> None:
        self.args = args
        self.environ = environ
        self.stdout = stdout
        self.stderr = stderr
        self._config: Config | None = None
        self._store: WatchStore | None = None
        self._logging = False

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def config(self) -> Config:
        """The configuration file from ``--config`` or ``CKPT_CONFIG``, or an empty configuration."""
        if self._config is None:
            from ckpt.config import Config, load_config

            path = self._config_path()
            self._config = load_config(path) if path else Config()
        return self._config

    def _config_path(self) -> str | None:
        return self.args.config or self.environ.get("CKPT_CONFIG") or None

    def root(self) -> str:
        """``--root``, else ``CKPT_ROOT``, else the configuration file's ``root``."""
        root = self.args.root or self.environ.get("CKPT_ROOT") or self.config().root
        if not root:
            raise UsageError("no checkpoint root: pass --root, set CKPT_ROOT, or set root in the config file")
        return str(root)

    def store(self) -> WatchStore:
        """The store for the root (opened once)."""
        if self._store is None:
            from ckpt.store import open_store

            root = self.root()
            if not root.startswith("/"):
                self.start_logging()  # remote stores log (credential refreshes); see main()
            # Without a configuration file there is nothing to read: open_store makes the empty default
            # itself, and only for an S3 root, so a POSIX command never imports the configuration code.
            config = self.config() if self._config is not None or self._config_path() else None
            self._store = open_store(root, config=config, environ=self.environ)
        return self._store

    def start_logging(self) -> None:
        """Send the ``ckpt`` logger's records to stderr as ``--log-level`` and ``--log-format`` say (once)."""
        if not self._logging:
            from ckpt.cli.logs import configure_logging

            configure_logging(self.args.log_level, self.args.log_format, self.stderr)
            self._logging = True

    def save_location(self, save: str) -> str:
        """Turn a ``SAVE`` argument into a location: absolute paths and URLs as given, else under the root."""
        if save.startswith("/") or "://" in save:
            return save
        return self.store().root.rstrip("/") + "/" + save

    def say(self, line: str) -> None:
        self.stdout.write(line + "\n")

    def warn(self, line: str) -> None:
        self.stderr.write(f"ckpt: {one_line(line)}\n")


def whole_number(text: str, option: str, *, minimum: int = 0) -> int:
    """Parse a count given to ``option``: ASCII digits, ``minimum`` to 2**64 - 1; else ``InvalidError``.

    The length is checked before ``int()``, which refuses (with a ``ValueError`` of its own) to convert more
    than a few thousand digits.
    """
    if text.isascii() and text.isdigit() and len(text.lstrip("0")) <= len(str(MAX_U64)):
        value = int(text)
        if minimum <= value <= MAX_U64:
            return value
    shown = text if len(text) <= 40 else text[:40] + "..."
    raise InvalidError(f"{option} {shown!r} must be a whole number from {minimum} to {MAX_U64}")


# -- commands ----------------------------------------------------------------------------------------------


def _later(module: str, name: str) -> Callable[[Context], int]:
    """The command ``name`` of ``ckpt.cli.<module>``, imported only when it runs (rule 4): the publication
    commands (``resolve``, ``entries``, ``publish``, ``exec-dir``) and the retention ones (``prune``, ``pin``,
    ``unpin``)."""

    def handler(ctx: Context) -> int:
        command: Callable[[Context], int] = getattr(__import__(f"ckpt.cli.{module}", fromlist=[name]), name)
        return command(ctx)

    return handler


def _cmd_demo(ctx: Context) -> int:
    from ckpt.cli.demo import run_demo

    return run_demo(ctx)


def _not_empty(value: str) -> str:
    """An empty ``--root`` or ``--config`` is refused, never taken as absent: ``--root "$UNSET"`` falling
    through to ``CKPT_ROOT`` would make a prune remove another root's entries (cli.md §2.1)."""
    if not value:
        raise argparse.ArgumentTypeError("is empty: give a value or leave the option out")
    return value


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line.

    Given the arguments it is about to parse, it imports a module of ``_EXTRA_COMMANDS`` only when they may
    name its command or ask for help; any other extra command is a bare name, which is all argparse needs to
    refuse or list it. What parses is the same either way: only start-up time differs (rule 4).
    """
    parser = _Parser(
        prog="ckpt",
        description="Publish and resolve training checkpoints on POSIX and S3, fenced by scheduler epoch.",
    )
    _add_global_options(parser, defaults=True)
    parser.add_argument("--version", action=_ShowVersion, nargs=0, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    p = commands.add_parser("resolve", help="location of the latest save")
    p.add_argument(
        "--framework",
        metavar="NAME",
        help="verify the save against this framework's rule (hf, dcp, lightning, deepspeed, megatron, nemo, "
        "orbax, accelerate, a configured or a plugin rule)",
    )
    p.add_argument(
        "--world-size",
        metavar="N",
        help="processes that wrote the saves (hf, dcp, deepspeed, lightning): all their files must be there",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="also verify the save against its manifest (a tiered copy): every file there, sizes equal",
    )
    p.add_argument(
        "--digests", action="store_true", help="with --verify: read every file and check its SHA-256"
    )
    p.set_defaults(handler=_later("publication", "cmd_resolve"), store_command=True)

    p = commands.add_parser("entries", help="every entry, ascending: <epoch> <step> <location>")
    p.set_defaults(handler=_later("publication", "cmd_entries"), store_command=True)

    p = commands.add_parser("publish", help="publish a complete save")
    p.add_argument("--epoch", help="scheduler epoch (DISPATCH_EPOCH)")
    p.add_argument("--step", required=True, help="training step")
    p.add_argument("save", metavar="SAVE", help="path or s3:// URL under the root, or relative to it")
    p.set_defaults(handler=_later("publication", "cmd_publish"), store_command=True)

    p = commands.add_parser(
        "prune", help="keep the N latest, every K steps and the pinned entries; remove what only others need"
    )
    p.add_argument("--keep", required=True, help="how many of the latest entries to keep (>= 1)")
    p.add_argument("--keep-every", metavar="K", help="also keep every entry whose step is a multiple of K")
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    p.add_argument(
        "--durable",
        metavar="DURABLE",
        help="keep every entry not yet published on this durable root (tiered)",
    )
    p.add_argument("--force", action="store_true", help="with --durable: remove entries not yet durable too")
    p.set_defaults(handler=_later("retention", "cmd_prune"), store_command=True)

    for name, what in (
        ("pin", "protect an entry (and its folder) from every prune"),
        ("unpin", "remove an entry's pin (not an error when there is none)"),
    ):
        p = commands.add_parser(name, help=f"{what}: by SAVE, or by --epoch and --step")
        p.add_argument("save", metavar="SAVE", nargs="?", help="the entry's save: path, URL or relative")
        p.add_argument("--epoch", help="the entry's epoch (never taken from DISPATCH_EPOCH)")
        p.add_argument("--step", help="the entry's step")
        p.set_defaults(handler=_later("retention", f"cmd_{name}"), store_command=True)

    p = commands.add_parser("exec-dir", help="the folder one execution saves into")
    p.add_argument("--attempt", help="execution attempt (DISPATCH_ATTEMPT)")
    p.set_defaults(handler=_later("publication", "cmd_exec_dir"), store_command=True)

    # Help (-h, or --help and its abbreviations) lists every command with its own help text.
    wanted = None if argv is None or any(a == "-h" or a.startswith("--h") for a in argv) else set(argv)
    for module in _EXTRA_COMMANDS:
        if wanted is None or module in wanted:
            __import__(f"ckpt.cli.{module}", fromlist=["register"]).register(commands)
        else:
            commands.add_parser(module)

    p = commands.add_parser("demo", help="an end-to-end run on a temporary local root")
    p.add_argument("--s3", action="store_true", help="run the demo against an embedded S3 server (moto)")
    p.add_argument("--keep-root", action="store_true", help="leave the temporary root in place afterwards")
    p.set_defaults(handler=_cmd_demo)
    # Global options are accepted after the command too (cli.md §2.4): a command's parser knows them with no
    # default, so a value given there replaces the one given before the command, and none leaves it alone.
    # Only the parser of a command the arguments name pays for it (rule 4).
    for name, command in commands.choices.items():
        if wanted is None or name in wanted:
            _add_global_options(command, defaults=False)
    return parser


def _add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """Add the global options (cli.md §2) to ``parser``; without ``defaults``, one left out sets nothing."""
    unset: dict[str, Any] = {} if defaults else {"default": argparse.SUPPRESS}
    parser.add_argument(
        "--root",
        type=_not_empty,
        help="checkpoint root: absolute path or s3://BUCKET[/PREFIX] (CKPT_ROOT)",
        **unset,
    )
    parser.add_argument("--config", type=_not_empty, help="TOML configuration file (CKPT_CONFIG)", **unset)
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout", **unset)
    levels, formats = ("debug", "info", "warning", "error"), ("text", "json")
    parser.add_argument("--log-level", choices=levels, **({"default": "info"} if defaults else unset))
    parser.add_argument("--log-format", choices=formats, **({"default": "text"} if defaults else unset))


# Command modules with their own ``register(subparsers)`` and ``run(ctx)``; they import their heavy
# dependencies inside ``run``.
_EXTRA_COMMANDS: tuple[str, ...] = ("doctor", "follow", "watch", "resume", "replicate")


def main(
    argv: Sequence[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    """Run the command line; return the exit code."""
    if stdout is None and isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")  # rule 3: a non-UTF-8 path comes out as its bytes
    out, err = stdout or sys.stdout, stderr or sys.stderr
    env = os.environ if environ is None else environ
    arguments = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser(arguments).parse_args(arguments)
    except _VersionRequested:
        from ckpt import __version__

        out.write(f"ckpt {__version__}\n")
        return EXIT_OK
    except UsageError as exc:
        err.write(f"ckpt: {one_line(str(exc))} (see ckpt --help)\n")
        return EXIT_USAGE
    ctx = Context(args, env, out, err)
    # Importing logging costs a few milliseconds, and on a POSIX root nothing the store commands (those marked
    # ``store_command``) run logs: they start logging when they open another kind of store (Context.store).
    # Every other command, the watcher's above all, starts it here.
    if not getattr(args, "store_command", False):
        ctx.start_logging()
    try:
        code: int = args.handler(ctx)
        return code
    except UsageError as exc:
        ctx.warn(str(exc))
        return EXIT_USAGE
    except ExistsError as exc:
        ctx.warn(str(exc))
        return EXIT_EXISTS
    except MalformedError as exc:
        ctx.warn(str(exc))
        return EXIT_MALFORMED
    except InvalidError as exc:
        ctx.warn(str(exc))
        return EXIT_USAGE
    except CkptError as exc:
        ctx.warn(str(exc))
        return EXIT_FAILURE
    except BrokenPipeError:
        # The reader of our output went away (`ckpt follow | head -1`): nobody is left to tell. End as a shell
        # shows a process that SIGPIPE ended, with no error line, and keep the interpreter's final flush of
        # stdout from complaining on stderr (errors.md §2.1).
        if out is sys.stdout:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        ctx.warn(f"{exc.strerror or exc}" + (f": {exc.filename!r}" if exc.filename else ""))
        return EXIT_FAILURE
    except KeyboardInterrupt:
        ctx.warn("interrupted")
        return 130
