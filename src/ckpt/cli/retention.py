"""The retention commands: ``prune``, ``pin`` and ``unpin`` (spec/cli.md).

Imported by :mod:`ckpt.cli` only when one of them runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ckpt.cli import EXIT_NOTHING, EXIT_OK, Context, UsageError, whole_number
from ckpt.domain.errors import NotFoundError, PruneIncompleteError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    from ckpt.domain.entries import Entry
    from ckpt.domain.ports import WatchStore

__all__ = ["cmd_pin", "cmd_prune", "cmd_unpin"]


def cmd_prune(ctx: Context) -> int:
    from ckpt.cli.output import kept_reasons, print_json, prune_document

    keep = whole_number(ctx.args.keep, "--keep", minimum=1)
    every = ctx.args.keep_every
    keep_every = None if every is None else whole_number(every, "--keep-every", minimum=1)
    store = ctx.store()
    held: list[Entry] = []
    if ctx.args.force and ctx.args.durable is None:
        raise UsageError("--force goes with --durable")
    if ctx.args.durable is not None and not ctx.args.force:  # spec/tiered.md §7.1
        pending = _not_yet_durable(ctx, store, ctx.args.durable)
        keep = max(keep, len(pending))  # they are the greatest entries: the dry run sees them kept too
        for entry in pending:
            ctx.warn(f"kept, not yet durable: {store.location(entry)}")
            if not ctx.args.dry_run and _pin(store, entry):
                held.append(entry)  # pinned by this prune only, for its duration
    try:
        result = store.prune(keep, keep_every=keep_every, dry_run=ctx.args.dry_run)
    except PruneIncompleteError as exc:
        _say_what_was_left(ctx, store, exc)
        raise  # the error line and exit 1 (cli.md §7.3)
    finally:
        for entry in held:
            store.unpin(entry)
    if ctx.json:
        print_json(prune_document(store, result), ctx.stdout)
        return EXIT_OK
    verb = "would remove" if result.dry_run else "removed"
    for kept in result.kept:
        entry = kept.entry
        why = kept_reasons(kept, keep, keep_every)
        ctx.say(f"kept entry: epoch {entry.epoch} step {entry.step} {store.location(entry)} ({why})")
    for line in _removal_lines(store, verb, result.removed_entries, result.restored, result.removed_folders):
        ctx.say(line)
    for skip in result.skipped:
        ctx.say(f"kept folder: {skip.location} ({skip.reason})")
    if not (result.removed_entries or result.removed_folders or result.skipped or result.restored):
        ctx.say("nothing to prune")
    return EXIT_OK


def _not_yet_durable(ctx: Context, store: WatchStore, durable: str) -> list[Entry]:
    """The entries greater than the durable root's greatest: those a replicator has still to copy
    (spec/tiered.md §2.1, §7.1)."""
    from ckpt.application.replication import pending_between
    from ckpt.cli.replicate import open_tier

    return pending_between(store, open_tier(ctx, durable)[2])


def _pin(store: WatchStore, entry: Entry) -> bool:
    """Pin ``entry`` for the prune; False when it was pinned already (or is gone)."""
    try:
        return store.pin(entry)
    except NotFoundError:
        return False


def _removal_lines(
    store: WatchStore, verb: str, entries: Iterable[Entry], restored: Iterable[Entry], folders: Iterable[str]
) -> Iterator[str]:
    """The lines of what a prune removed (or would) and put back, in cli.md §7.3's order."""
    for entry in entries:
        yield f"{verb} entry: epoch {entry.epoch} step {entry.step} {store.location(entry)}"
    for entry in restored:
        yield f"put back entry: epoch {entry.epoch} step {entry.step} {store.location(entry)} (pinned)"
    for folder in folders:
        yield f"{verb} folder: {folder}"


def _say_what_was_left(ctx: Context, store: WatchStore, exc: PruneIncompleteError) -> None:
    """What a prune that failed half way had done, on stderr, or as the JSON document (cli.md §7.3)."""
    from ckpt.cli.output import entry_document, print_json

    if ctx.json:
        print_json(
            {
                "incomplete": True,
                "error": str(exc),
                "journal": exc.journal,
                "removed_entries": [entry_document(store, e) for e in exc.removed_entries],
                "removed_folders": list(exc.removed_folders),
                "restored_entries": [entry_document(store, e) for e in exc.restored],
            },
            ctx.stdout,
        )
        return
    for line in _removal_lines(store, "removed", exc.removed_entries, exc.restored, exc.removed_folders):
        ctx.warn(line)
    if exc.journal is not None:
        ctx.warn(f"left journal: {exc.journal} (the next prune finishes the job)")


def _selection(ctx: Context, store: WatchStore) -> Callable[[Entry], bool]:
    """Which entries ``SAVE`` and/or ``--epoch`` and ``--step`` select (``pin``, ``unpin``).

    Everything given is checked before the store is read: ``SAVE`` exactly as ``publish`` checks it
    (``save_of``: outside the root, ``..``, an invalid save path are exit 2 naming it).
    """
    from ckpt.domain.entries import parse_epoch, parse_step

    args = ctx.args
    if args.save is None and (args.epoch is None or args.step is None):
        raise UsageError(f"{args.command}: name the entry by SAVE, or by --epoch and --step")
    save = None if args.save is None else store.save_of(ctx.save_location(args.save))
    epoch = None if args.epoch is None else parse_epoch(args.epoch)
    step = None if args.step is None else parse_step(args.step)
    return lambda e: (
        (save is None or e.save == save)
        and (epoch is None or e.epoch == epoch)
        and (step is None or e.step == step)
    )


def cmd_pin(ctx: Context) -> int:
    from ckpt.cli.output import entry_document, print_json

    store = ctx.store()
    selects = _selection(ctx, store)
    chosen = [e for e in store.entries() if selects(e)]
    if not chosen:
        ctx.warn("no published entry matches: nothing to pin")
        return EXIT_NOTHING
    documents = []
    for entry in chosen:
        try:
            created = store.pin(entry)
        except NotFoundError as exc:  # a prune removed it meanwhile (ckpt.application.pins rule 2)
            ctx.warn(str(exc))
            return EXIT_NOTHING
        documents.append({**entry_document(store, entry), "already_pinned": not created})
        if not ctx.json:
            what = "pinned" if created else "already pinned"
            ctx.say(f"{what}: epoch {entry.epoch} step {entry.step} {store.location(entry)}")
    if ctx.json:
        print_json({"pinned": documents}, ctx.stdout)
    return EXIT_OK


def cmd_unpin(ctx: Context) -> int:
    from ckpt.cli.output import entry_document, print_json

    store = ctx.store()
    selects = _selection(ctx, store)
    chosen = [e for e in store.pinned() if selects(e)]
    documents = []
    for entry in chosen:
        if store.unpin(entry):
            documents.append(entry_document(store, entry))
            if not ctx.json:
                ctx.say(f"unpinned: epoch {entry.epoch} step {entry.step} {store.location(entry)}")
    if ctx.json:
        print_json({"unpinned": documents}, ctx.stdout)
    elif not documents:
        ctx.say("not pinned: nothing to unpin")
    return EXIT_OK
