"""Hugging Face ``Trainer``: publish each save once every rank has written it, and resume in one line.

::

    from ckpt.integrations.hf import CkptCallback, resume_location

    callback = CkptCallback()                  # DISPATCH_EPOCH / DISPATCH_ATTEMPT / CKPT_ROOT, or arguments
    args = TrainingArguments(output_dir=callback.saves_location, save_total_limit=None, ...)
    trainer = Trainer(model=model, args=args, callbacks=[callback], ...)
    trainer.train(resume_from_checkpoint=resume_location(args))   # None on a first run

Rules (from transformers' source, docs/integrations/hf.md):

1. ``on_save`` runs on every process right after *its own* part of the save, with no barrier, so the
   callback waits for every rank (``torch.distributed.barrier``) and then only the world's main process
   publishes ``<output_dir>/checkpoint-<global_step>``. Every rank reaches ``on_save`` for the same saves,
   because ``control.should_save`` is computed identically everywhere.
2. The Trainer's just-in-time (SIGTERM) save never calls ``on_save``: it is published by the next start,
   whose ``resume_location`` catches up what the dead execution completed, or by a sidecar.
3. ``output_dir`` must be the execution's folder, ``<root>/exec/<attempt>`` (``callback.saves_location``):
   that is where the catch-up and the verified resolve look. It is checked when training begins.
4. An execution folder too long for ``checkpoint-18446744073709551615`` (the longest save, spec/names.md
   §4.5) is an ``InvalidError`` when the callback is made, on every rank: not on the main process alone,
   after the barrier of its first save, while the others wait in the next collective.
5. The Trainer's own rotation (``save_total_limit``) may delete a published folder; the verified resolve
   passes over it, but set ``save_total_limit=None`` and prune with ``ckpt prune`` instead.
6. With a durable root (``durable=`` or ``CKPT_DURABLE``, ``ckpt.integrations.core`` rule 7) each published
   save is copied in the background, ``on_train_end`` waits until every published save is durable, and
   ``resume_location`` restores the durable root's newest verified save when the local root lacks it.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from ckpt.domain.errors import InvalidError
from ckpt.domain.frameworks import Framework
from ckpt.integrations.core import Job, Publisher, open_job
from ckpt.integrations.core import resume_location as _resume_location

__all__ = ["CkptCallback", "resume_location"]


class CkptCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]  # Any where transformers is absent
    """A ``TrainerCallback`` that publishes every save exactly once, after every rank finished writing it.

    Keyword arguments are :func:`~ckpt.integrations.core.open_job`'s (``root``, ``epoch``, ``attempt``,
    ``config``, ``environ``, ``store``); a missing epoch or attempt is an ``InvalidError`` here.
    ``publisher_options`` go to :class:`~ckpt.integrations.core.Publisher` (``barrier``, ``is_main``,
    ``on_published``).
    """

    def __init__(
        self, *, job: Job | None = None, publisher_options: dict[str, Any] | None = None, **settings: Any
    ):
        self.job = job if job is not None else open_job(**settings)
        self.job.require_room(f"{Framework.HF.folder_prefix}{{step}}", "hf saves")  # rule 4, before any save
        self._publisher_options = dict(publisher_options or {})
        self.publisher: Publisher | None = None

    @property
    def saves_location(self) -> str:
        """The folder to pass as ``TrainingArguments.output_dir``."""
        return self.job.saves_location

    def _publisher(self, state: Any) -> Publisher:
        if self.publisher is None:
            options = {"is_main": bool(state.is_world_process_zero), **self._publisher_options}
            self.publisher = Publisher(self.job, **options)
        return self.publisher

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Check that the Trainer saves into the execution's folder (rule 3) and record the epoch."""
        expected = self.saves_location.rstrip("/")
        actual = str(args.output_dir).rstrip("/")
        if "://" not in expected:
            actual = os.path.abspath(actual)
        if actual != expected:
            raise InvalidError(f"TrainingArguments.output_dir is {actual!r}; set it to {expected!r}")
        self._publisher(state)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Wait for every rank, then publish ``checkpoint-<global_step>`` from the main process (rule 1)."""
        location = f"{self.saves_location.rstrip('/')}/checkpoint-{state.global_step}"
        self._publisher(state).publish(int(state.global_step), location)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """With a durable root, wait until every published save is durable (rule 6)."""
        if self.publisher is not None:
            self.publisher.close()


def resume_location(args: Any = None, *, settle: float | None = None, **settings: Any) -> str | None:
    """The checkpoint to pass as ``resume_from_checkpoint``, or ``None`` on a first run.

    Publishes first what earlier executions completed but never published (their just-in-time saves, the
    saves their sidecar had no time for). ``args`` (the ``TrainingArguments``) makes sure the process group
    is set up first, so only the main process reads and publishes and every rank gets the same answer.
    ``settings`` are :func:`~ckpt.integrations.core.open_job`'s, or ``job=``.
    """
    if args is not None:
        _ = args.world_size  # sets up the devices and, under a launcher, the process group
    return _resume_location(Framework.HF, settle=settle, **settings)
