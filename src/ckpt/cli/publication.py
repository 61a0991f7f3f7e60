"""The publication commands: ``resolve``, ``entries``, ``publish`` and ``exec-dir`` (spec/cli.md).

Imported by :mod:`ckpt.cli` only when one of them runs; what they import beyond the store, they import
inside the command that needs it (start-up, rule 4 of :mod:`ckpt.cli`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckpt.cli import EXIT_NOTHING, EXIT_OK, Context, UsageError

if TYPE_CHECKING:
    from ckpt.domain.entries import Entry

__all__ = ["attempt_arg", "cmd_entries", "cmd_exec_dir", "cmd_publish", "cmd_resolve", "epoch_arg"]


def epoch_arg(ctx: Context) -> int:
    from ckpt.domain.entries import parse_epoch

    text = ctx.args.epoch if ctx.args.epoch is not None else ctx.environ.get("DISPATCH_EPOCH")
    if text is None:
        raise UsageError("no epoch: pass --epoch or set DISPATCH_EPOCH")
    return parse_epoch(text)


def attempt_arg(ctx: Context) -> str:
    attempt = ctx.args.attempt if ctx.args.attempt is not None else ctx.environ.get("DISPATCH_ATTEMPT")
    if attempt is None:
        raise UsageError("no attempt: pass --attempt or set DISPATCH_ATTEMPT")
    return str(attempt)


def cmd_resolve(ctx: Context) -> int:
    if ctx.args.digests and not ctx.args.verify:
        raise UsageError("--digests applies to --verify: pass --verify as well")
    store = ctx.store()
    skipped: list[dict[str, Any]] = []
    if ctx.args.framework:
        from ckpt.application.rulebook import find_rule
        from ckpt.application.verify import resolve_verified
        from ckpt.cli.output import entry_document
        from ckpt.domain.frameworks import parse_world_size

        # The world size of the run that *wrote* the saves: given explicitly, never taken from WORLD_SIZE,
        # which describes the resuming run (docs/adr/0008-watcher.md).
        world_size = None if ctx.args.world_size is None else parse_world_size(ctx.args.world_size)
        rule = find_rule(ctx.args.framework, world_size=world_size, configured=ctx.config().frameworks)
        also = None
        if ctx.args.verify:  # spec/tiered.md §10
            from ckpt.application.replication import manifest_problem
            from ckpt.store import tier_files

            files, digests = tier_files(store), bool(ctx.args.digests)

            def also(entry: Entry) -> str | None:
                problem = manifest_problem(files, entry.save, digests=digests)
                return problem if isinstance(problem, str) else None

        verified = resolve_verified(store, rule, also=also)
        for passed, reason in verified.skipped:
            ctx.warn(f"skipped {store.location(passed)}: {reason}")
            skipped.append({"entry": entry_document(store, passed), "reason": reason})
        entry = verified.entry
    else:
        if ctx.args.world_size is not None:
            raise UsageError("--world-size applies to a verified resolve: pass --framework hf as well")
        if ctx.args.verify:
            raise UsageError("--verify applies to a verified resolve: pass --framework as well")
        entry = store.resolve()
    if entry is None:
        what = f"no complete {ctx.args.framework} save" if ctx.args.framework else "nothing"
        ctx.warn(f"{what} is published under {store.root!r}")
        return EXIT_NOTHING
    if ctx.json:
        from ckpt.cli.output import entry_document, print_json  # json: only when asked for

        document = entry_document(store, entry)
        if ctx.args.framework:
            document["skipped"] = skipped
        print_json(document, ctx.stdout)
    else:
        ctx.say(store.location(entry))
    return EXIT_OK


def cmd_entries(ctx: Context) -> int:
    from ckpt.cli.output import entry_document, entry_line, print_json

    store = ctx.store()
    entries = store.entries()
    pinned = set(store.pinned())
    if ctx.json:
        print_json([{**entry_document(store, e), "pinned": e in pinned} for e in entries], ctx.stdout)
    else:
        lines = (entry_line(store, e) + (" (pinned)" if e in pinned else "") + "\n" for e in entries)
        ctx.stdout.write("".join(lines))
    return EXIT_OK


def cmd_publish(ctx: Context) -> int:
    from ckpt.cli.output import entry_document, print_json
    from ckpt.domain.entries import parse_step

    epoch = epoch_arg(ctx)
    step = parse_step(ctx.args.step)
    store = ctx.store()
    entry = store.publish(epoch, step, ctx.save_location(ctx.args.save))
    if ctx.json:
        print_json(entry_document(store, entry), ctx.stdout)
    else:
        ctx.say(f"published epoch {entry.epoch} step {entry.step}: {store.location(entry)}")
    return EXIT_OK


def cmd_exec_dir(ctx: Context) -> int:
    from ckpt.cli.output import print_json

    location = ctx.store().exec_dir(attempt_arg(ctx))
    if ctx.json:
        print_json({"location": location}, ctx.stdout)
    else:
        ctx.say(location)
    return EXIT_OK
