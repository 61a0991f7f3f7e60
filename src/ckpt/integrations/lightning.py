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
6. :func:`resume_location` first catches up what earlier executions wrote but never published (a crash a
   moment after the barrier, or during an async write) with :func:`is_whole_save` as the completion check,
   since there is no watcher rule for Lightning; then it resolves.
7. An execution folder too long for ``step-18446744073709551615`` (the longest save, spec/names.md §4.5)
   is an ``InvalidError`` when ``CkptModelCheckpoint`` is made and when :func:`resume_location` is called,
   on every rank, before any save or epoch record.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO

from ckpt.domain.entries import parse_step
from ckpt.domain.errors import InvalidError, StorageError
from ckpt.domain.ports import WatchStore
from ckpt.integrations.core import Job, Publisher, newest_with_file, open_job

__all__ = [
    "CHECKPOINT_FILE",
    "CkptAsyncCheckpointIO",
    "CkptModelCheckpoint",
    "is_whole_save",
    "resume_location",
]

CHECKPOINT_FILE = "model.ckpt"
_FOLDER_PREFIX = "step-"
_LONGEST_TEMPLATE = f"{_FOLDER_PREFIX}{{step}}"  # the save is the folder; model.ckpt is inside it
_ZIP_END_RECORD = b"PK\x05\x06"
_ZIP_TAIL = 22 + 65535  # the end record is within the last 22 bytes plus the longest zip comment


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
        self.job.require_room(_LONGEST_TEMPLATE, "Lightning saves")  # rule 7, before any save
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


def is_whole_save(store: WatchStore, location: str) -> bool:
    """Whether the ``step-<step>`` save at ``location`` is whole: the catch-up's completion check.

    A single file: ``model.ckpt`` ends with a zip end-of-central-directory record (``torch.save`` writes it
    last; Lightning stages in ``$TMPDIR`` and, across file systems, copies into place, so a file can be
    seen growing). A sharded save: ``model.ckpt/.metadata`` (DCP renames it in after every rank) and
    ``model.ckpt/meta.pt`` (written by the main process after it) are both there.
    """
    tail = _tail(store, location)
    if tail is None:
        return store.exists(location, f"{CHECKPOINT_FILE}/.metadata") and store.exists(
            location, f"{CHECKPOINT_FILE}/meta.pt"
        )
    return _ZIP_END_RECORD in tail


def _tail(store: WatchStore, location: str) -> bytes | None:
    """The end of ``model.ckpt``, or ``None`` when it is not a file (absent, or a sharded save's folder).

    Read through the store's saves reader (``ckpt.application.inspection.saves_reader``): only the last bytes,
    whatever the size, on POSIX (``pread``) and S3 (a ranged GET); another store reads the file through its
    port, and a file too big for that counts as not whole (a save the catch-up cannot judge stays
    unpublished).
    """
    from ckpt.application.inspection import StoreSaves, saves_reader

    reader = saves_reader(store, location)
    try:
        tail = reader.tail(CHECKPOINT_FILE, _ZIP_TAIL)
    except StorageError:
        if not isinstance(reader, StoreSaves):
            raise  # the store's own reader failed: an outage, not a verdict on the save
        return b""
    return None if tail is None else tail.data


def resume_location(*, catch_up: bool = True, **settings: Any) -> str | None:
    """The ``ckpt_path`` to pass to ``trainer.fit``, or ``None`` on a first run.

    First publishes, under their own epochs, the whole saves earlier executions never published
    (:func:`is_whole_save`; no settle); then returns the newest published ``model.ckpt`` still on disk. It
    is usually called before ``fit`` sets up the process group, so every rank does this itself: the checks
    are deterministic on a dead execution's files and an existing entry counts as published, so every rank
    gets the same answer. ``settings`` are :func:`~ckpt.integrations.core.open_job`'s, or ``job=``.
    """
    job = settings.pop("job", None) or open_job(**settings)
    job.require_room(_LONGEST_TEMPLATE, "Lightning saves")  # rule 7, before the epoch record
    if catch_up:
        from ckpt.catchup import catch_up_folders, record_epoch

        record_epoch(job.store, job.attempt, job.epoch)
        catch_up_folders(
            job.store, is_whole_save, folder_prefix=_FOLDER_PREFIX, attempt=job.attempt, epoch=job.epoch
        )
    found = newest_with_file(job.store, CHECKPOINT_FILE, folder_prefix=_FOLDER_PREFIX)
    return None if found is None else f"{found.rstrip('/')}/{CHECKPOINT_FILE}"
