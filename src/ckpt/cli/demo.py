"""``ckpt demo``: the whole story on a temporary root, told in a minute.

Two executions of one job write saves; the older one keeps running after the scheduler replaced it (a
zombie) and publishes late at a higher step; ``resolve`` still picks the newer execution's save; a republish
is refused; ``prune`` keeps what is needed. Every step goes through the real store, so the demo doubles as a
smoke test of an installation.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckpt.domain.errors import ExistsError
from ckpt.domain.names import format_entry_name

if TYPE_CHECKING:
    from ckpt.cli import Context
    from ckpt.domain.ports import WatchStore

__all__ = ["MakeSave", "run_demo", "tell"]

MakeSave = Callable[[str, dict[str, bytes]], None]

FIRST_EPOCH, SECOND_EPOCH = 1_000_000, 2_000_000  # DISPATCH_EPOCH of submissions 1 and 2
FIRST_ATTEMPT, SECOND_ATTEMPT = "1.4101.0", "2.4102.0"


class _Story:
    def __init__(self, ctx: Context, store: WatchStore, make_save: MakeSave) -> None:
        self.ctx, self.store, self._make_save = ctx, store, make_save
        self.number = 0

    def step(self, title: str) -> None:
        self.number += 1
        self.ctx.say(f"\n{self.number}. {title}")

    def note(self, text: str) -> None:
        self.ctx.say(f"   {text}")

    def save(self, attempt: str, step: int) -> str:
        location = f"{self.store.exec_dir(attempt)}/checkpoint-{step}"
        files = {"model.safetensors": b"\0" * 64, "trainer_state.json": b'{"global_step": %d}' % step}
        self._make_save(location, files)
        return location

    def publish(self, epoch: int, step: int, location: str) -> None:
        entry = self.store.publish(epoch, step, location)
        self.note(f"published  pub/{format_entry_name(entry)}")
        self.note(f"           = epoch {entry.epoch}, step {entry.step}, save {entry.save}")

    def show_log(self) -> None:
        for entry in self.store.entries():
            self.note(f"  epoch {entry.epoch:>9}  step {entry.step:>4}  {entry.save}")


def _posix_save(location: str, files: dict[str, bytes]) -> None:
    os.makedirs(location, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(location, name), "wb") as f:
            f.write(data)


def run_demo(ctx: Context) -> int:
    """Run the demo on a temporary local root (or, with ``--s3``, an embedded S3 server)."""
    if ctx.args.s3:
        from ckpt.cli.demo_s3 import run_s3_demo

        code: int = run_s3_demo(ctx, tell)
        return code
    from ckpt.adapters.posix import PosixStore

    root = tempfile.mkdtemp(prefix="ckpt-demo-")
    try:
        return tell(ctx, PosixStore(root), _posix_save, root)
    finally:
        if ctx.args.keep_root:
            ctx.say(f"\nThe root is left at {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def tell(ctx: Context, store: WatchStore, make_save: MakeSave, where: str) -> int:
    """Tell the story on ``store``; ``make_save(location, files)`` writes a save as a trainer would."""
    story = _Story(ctx, store, make_save)
    ctx.say(f"ckpt demo: a checkpoint root at {where}")
    ctx.say("Saves go to <root>/exec/<attempt>/; a finished save is published as one empty entry")
    ctx.say("in <root>/pub/ whose name carries the epoch, the step and the save's path.")

    story.step(f"Submission 1 (epoch {FIRST_EPOCH}, attempt {FIRST_ATTEMPT}) trains and saves step 500.")
    story.publish(FIRST_EPOCH, 500, story.save(FIRST_ATTEMPT, 500))

    story.step(f"Preempted and resubmitted: submission 2 (epoch {SECOND_EPOCH}, attempt {SECOND_ATTEMPT}).")
    latest = store.resolve()
    assert latest is not None
    story.note(f"resolve -> {store.location(latest)}   (resume from step {latest.step})")
    story.publish(SECOND_EPOCH, 600, story.save(SECOND_ATTEMPT, 600))

    story.step("Submission 1 was never really stopped: the zombie saves step 900 and publishes it, late.")
    story.publish(FIRST_EPOCH, 900, story.save(FIRST_ATTEMPT, 900))

    story.step("Which save does a restart resume from?")
    story.show_log()
    latest = store.resolve()
    assert latest is not None
    story.note(f"resolve -> {store.location(latest)}")
    story.note(f"The zombie's step 900 loses: epoch {SECOND_EPOCH} > {FIRST_EPOCH}, whatever the step.")

    story.step("Publishing the same save again is refused, and the entry is left untouched.")
    try:
        store.publish(SECOND_EPOCH, 600, store.location(latest))
    except ExistsError as exc:
        story.note(f"refused: {exc}")
    else:  # pragma: no cover - the store broke its contract
        ctx.warn("demo: a republish was accepted; the store does not honour exclusive create")
        return 1

    story.step("Submission 2 saves step 700; prune --keep 2 removes the rest and what only they need.")
    story.publish(SECOND_EPOCH, 700, story.save(SECOND_ATTEMPT, 700))
    plan = store.prune(2, dry_run=True)
    story.note(
        f"dry run: would remove {len(plan.removed_entries)} entries, {len(plan.removed_folders)} folders"
    )
    result = store.prune(2)
    for entry in result.removed_entries:
        story.note(f"removed entry  epoch {entry.epoch} step {entry.step}")
    for folder in result.removed_folders:
        story.note(f"removed folder {folder}")
    story.note("remaining:")
    story.show_log()
    latest = store.resolve()
    assert latest is not None
    story.note(f"resolve -> {store.location(latest)}")
    ctx.say("\nDone: the latest complete save of the newest submission always wins.")
    return 0
