"""Lightning: publish each checkpoint once it is completely written on every rank, also with async IO.

::

    from ckpt.integrations.lightning import CkptAsyncCheckpointIO, CkptModelCheckpoint, resume_location

    checkpoint = CkptModelCheckpoint(every_n_train_steps=100)     # the job from DISPATCH_* / CKPT_ROOT
    trainer = L.Trainer(callbacks=[checkpoint], plugins=[CkptAsyncCheckpointIO()])  # async IO: optional
    trainer.fit(model, ckpt_path=resume_location())               # None on a first run

Rules (from Lightning's source, docs/integrations/lightning.md):

1. ``Callback.on_save_checkpoint`` runs *before* anything is written, so it is not used. ``ModelCheckpoint``
   saves through ``trainer.save_checkpoint``, which ends with a barrier of every rank; the publication comes
   right after it, on the global main process, for single files and sharded folders alike.
2. Every save goes into its own folder, ``<root>/exec/<attempt>/step-<step>/model.ckpt`` (a sharded
   strategy makes ``model.ckpt`` a folder): the publication log names folders.
3. ``last.ckpt`` (``save_last``) is written beside the step folders and never published: it duplicates a
   step and is rewritten in place.
4. With ``AsyncCheckpointIO`` the file is written on a background thread after the barrier, and nothing
   fires when it is done. Use :class:`CkptAsyncCheckpointIO` instead: it queues the publication on the same
   single worker right after the write, so it runs only once the write succeeded, with the step captured
   when the save was scheduled. A plain ``AsyncCheckpointIO`` is refused (it would publish a file that does
   not exist yet). Async IO is for single-file strategies (only the main process writes).
5. ``save_top_k`` defaults to -1 (keep all): Lightning's own deletions would leave published folders empty;
   prune with ``ckpt prune`` instead.
6. :func:`resume_location` is :func:`ckpt.integrations.core.resume_location` with the built-in ``lightning``
   rule, whose layout 1b is this module's ``step-<step>/model.ckpt`` (docs/spec/watcher.md §2.8): it
   catches up what earlier executions wrote but never published (a crash a moment after the barrier, or
   during an async write), judged by that rule with the world size the dead execution recorded, then
   resolves verified, and returns the ``model.ckpt`` inside the save. There is no completion check here.
7. An execution folder too long for the ``lightning`` rule's longest save name,
   ``step=18446744073709551615.ckpt`` (spec/names.md §4.5, watcher.md §1.5), is an ``InvalidError`` when
   ``CkptModelCheckpoint`` is made and when :func:`resume_location` is called, on every rank, before any
   save or epoch record.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from ckpt.application.rulebook import find_rule
from ckpt.domain.catchup import execution_saves
from ckpt.domain.entries import parse_step
from ckpt.domain.errors import InvalidError
from ckpt.domain.room import require_rule_room
from ckpt.domain.rules.lightning import CHECKPOINT
from ckpt.integrations.core import Job, Publisher, open_job
from ckpt.integrations.core import resume_location as _resume_location

__all__ = [
    "CHECKPOINT_FILE",
    "CkptAsyncCheckpointIO",
    "CkptModelCheckpoint",
    "resume_location",
]

CHECKPOINT_FILE = CHECKPOINT  # "model.ckpt", inside each step-<step> save folder
_FOLDER_PREFIX = "step-"
RULE = "lightning"
"""The built-in rule that judges this module's saves (its layout 1b: ``step-<step>/model.ckpt``)."""


def _require_room(job: Job) -> None:
    """Rule 7: refuse, on every rank, an execution folder too long for the ``lightning`` rule's saves."""
    require_rule_room(execution_saves(job.attempt, ""), find_rule(RULE), what=f"attempt {job.attempt!r}")


def _save_folder_step(filepath: str) -> tuple[str, int] | None:
    """The save folder and step of ``<exec>/step-<step>/model.ckpt``, or ``None`` (``last.ckpt``, ...)."""
    folder, name = os.path.split(str(filepath).rstrip("/"))
    base = os.path.basename(folder)
    if name != CHECKPOINT_FILE or not base.startswith(_FOLDER_PREFIX):
        return None
    try:
        return folder, parse_step(base[len(_FOLDER_PREFIX) :])
    except InvalidError:
        return None


class CkptAsyncCheckpointIO(AsyncCheckpointIO):  # type: ignore[misc,unused-ignore]  # Any without lightning
    """``AsyncCheckpointIO`` that publishes each ``step-<step>`` save once its background write succeeded."""

    publisher: Publisher | None = None  # set by CkptModelCheckpoint.setup

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        """Queue the write, then the publication on the same single worker (rule 4)."""
        super().save_checkpoint(checkpoint, path, storage_options)
        found = _save_folder_step(str(path))
        publisher = self.publisher
        if found is None or publisher is None or not publisher.is_main:
            return
        folder, step = found
        failed_before = self._error

        def publish_after_write() -> None:
            if self._error is None or self._error is failed_before:
                publisher.publish_now(step, folder)

        assert self._executor is not None  # set up by the super call
        self._executor.submit(publish_after_write)


class CkptModelCheckpoint(ModelCheckpoint):  # type: ignore[misc,unused-ignore]  # Any without lightning
    """A ``ModelCheckpoint`` that saves into the execution's folder and publishes every save (rules 1-5).

    ``job``/``settings`` give the job (:func:`~ckpt.integrations.core.open_job`'s keywords in ``settings``);
    ``publisher_options`` go to the :class:`~ckpt.integrations.core.Publisher`; every other keyword goes
    to ``ModelCheckpoint`` except ``dirpath`` and ``filename``, which this class decides.
    """

    def __init__(
        self,
        *,
        job: Job | None = None,
        settings: dict[str, Any] | None = None,
        publisher_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        for fixed in ("dirpath", "filename", "auto_insert_metric_name"):
            if fixed in options:
                raise InvalidError(
                    f"{fixed} is decided by CkptModelCheckpoint (saves go to <exec>/step-<step>/)"
                )
        self.job = job if job is not None else open_job(**(settings or {}))
        _require_room(self.job)  # rule 7, before any save
        options.setdefault("save_top_k", -1)
        super().__init__(
            dirpath=self.job.saves_location,
            filename=f"{_FOLDER_PREFIX}{{step}}/{CHECKPOINT_FILE.removesuffix('.ckpt')}",
            auto_insert_metric_name=False,
            **options,
        )
        self._publisher_options = dict(publisher_options or {})
        self.publisher: Publisher | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Make the publisher once the ranks are known; wire the async IO, refuse a plain one (rule 4)."""
        super().setup(trainer, pl_module, stage)
        if self.publisher is None:
            options = {
                "is_main": bool(trainer.is_global_zero),
                "barrier": lambda: None,
                **self._publisher_options,
            }
            self.publisher = Publisher(self.job, **options)
        io = trainer.strategy.checkpoint_io
        if isinstance(io, CkptAsyncCheckpointIO):
            io.publisher = self.publisher
        elif isinstance(io, AsyncCheckpointIO):
            raise InvalidError(
                "AsyncCheckpointIO publishes nothing when a write ends: use CkptAsyncCheckpointIO"
            )

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """After fitting, wait until every published save is durable, with a durable root (core rule 7)."""
        super().teardown(trainer, pl_module, stage)
        if stage == "fit" and self.publisher is not None:
            self.publisher.close()

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        """Save (ending with Lightning's barrier), then publish on the global main process (rules 1, 3)."""
        super()._save_checkpoint(trainer, filepath)
        found = _save_folder_step(filepath)
        if found is None or self.publisher is None or not self.publisher.is_main:
            return
        if isinstance(trainer.strategy.checkpoint_io, CkptAsyncCheckpointIO):
            return  # published by the IO once the background write is done
        folder, step = found
        self.publisher.publish_now(step, folder)


def resume_location(*, catch_up: bool = True, settle: float | None = None, **settings: Any) -> str | None:
    """The ``ckpt_path`` to pass to ``trainer.fit``, or ``None`` on a first run (rule 6).

    :func:`ckpt.integrations.core.resume_location` with the ``lightning`` rule: first publishes, under their
    own epochs, the complete saves earlier executions never published (judged by the rule, with the world
    size each execution recorded; ``settle`` as ``ckpt resume --settle``, default the rule's), then returns
    the newest published save the rule finds complete now: its ``model.ckpt`` for a ``step-<step>`` save
    (a file or a sharded folder), the save itself for a ``…step=<step>….ckpt`` one. It is usually called
    before ``fit`` sets up the process group, so every rank does this itself: the checks are deterministic
    on a dead execution's files and an existing entry counts as published, so every rank gets the same
    answer. ``settings`` are :func:`~ckpt.integrations.core.open_job`'s, or ``job=``. The core refuses an
    execution folder too long for the rule's saves first (rule 7).
    """
    job = settings.pop("job", None) or open_job(**settings)
    found = _resume_location(find_rule(RULE), job=job, settle=settle, catch_up=catch_up)
    if found is None:
        return None
    found = found.rstrip("/")
    if _save_folder_step(f"{found}/{CHECKPOINT_FILE}") is None:
        return found  # a ModelCheckpoint file or folder of the rule's layout 1a: the checkpoint itself
    return f"{found}/{CHECKPOINT_FILE}"
