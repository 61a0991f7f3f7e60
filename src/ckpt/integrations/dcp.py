"""PyTorch Distributed Checkpoint and torchtitan: publish a ``dcp.save`` or ``dcp.async_save`` once whole.

::

    from ckpt.integrations.dcp import CkptDCP, resume_location, step_of

    ckpt_dcp = CkptDCP()                                   # after dist.init_process_group(...)
    location = resume_location()                           # None on a first run
    if location is not None:
        dcp.load(state, checkpoint_id=location)
        start = step_of(location) + 1
    ...
    ckpt_dcp.save(state, step)                             # or: future = ckpt_dcp.async_save(state, step)

Rules (from torch's source, docs/integrations/dcp.md):

1. Saves go to ``<root>/exec/<attempt>/step-<step>``, the torchtitan layout the ``dcp`` rule knows.
2. ``dcp.save`` returns on every rank only after the coordinator has renamed ``.metadata`` into place (its
   last step is a collective), so when it returns the save is whole: the main process publishes at once, no
   further barrier.
3. ``dcp.async_save`` returns a future that resolves, on every rank, only once ``.metadata`` is in place;
   the main process publishes from the future's done-callback, with the step captured when the save was
   *scheduled* (the training loop has moved on by then). A failed future publishes nothing.
4. ``use_collectives=False`` writes one ``__<rank>.metadata`` per rank and no global ``.metadata``: no rank's
   future covers the others', so it is refused.
5. torchtitan: call :meth:`CkptDCP.publish_when_done` with ``CheckpointManager.save_future`` (async modes)
   right after it is assigned, or :meth:`CkptDCP.publish_saved` after a synchronous save.
6. An execution folder too long for ``step-18446744073709551615`` (the longest save, spec/names.md §4.5)
   is an ``InvalidError`` when ``CkptDCP`` is made, on every rank, before any save or collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError
from ckpt.domain.frameworks import Framework, save_step
from ckpt.integrations.core import Job, Publisher, distributed, open_job
from ckpt.integrations.core import resume_location as _resume_location

__all__ = ["CkptDCP", "resume_location", "step_of"]


class CkptDCP:
    """Saves with DCP into the execution's folder and publishes each save on the main process.

    Keyword arguments are :func:`~ckpt.integrations.core.open_job`'s; ``publisher_options`` go to
    :class:`~ckpt.integrations.core.Publisher` (``is_main``, ``on_published``).
    """

    def __init__(
        self, *, job: Job | None = None, publisher_options: dict[str, Any] | None = None, **settings: Any
    ):
        environ = settings.get("environ") or os.environ
        if distributed() is None and int(environ.get("WORLD_SIZE") or "1") > 1:
            # Which process publishes is decided now: before the group exists every rank would think it is
            # the main one.
            raise InvalidError(
                "make CkptDCP after init_process_group: WORLD_SIZE > 1 but no process group yet"
            )
        self.job = job if job is not None else open_job(**settings)
        self.job.require_room(f"{Framework.DCP.folder_prefix}{{step}}", "dcp saves")  # rule 6
        # No barrier: DCP's own last collective is the barrier (rules 2, 3).
        self.publisher = Publisher(self.job, barrier=lambda: None, **(publisher_options or {}))
        self._publishing: list[Future[Entry | None]] = []

    @property
    def saves_location(self) -> str:
        """``<root>/exec/<attempt>``, the folder the ``step-<step>`` saves go into."""
        return self.job.saves_location

    def checkpoint_id(self, step: int) -> str:
        """Where the save of ``step`` goes: ``<root>/exec/<attempt>/step-<step>``."""
        return f"{self.saves_location.rstrip('/')}/step-{int(step)}"

    def save(self, state_dict: dict[str, Any], step: int, **options: Any) -> None:
        """``dcp.save`` the state as the save of ``step``, then publish it on the main process (rule 2)."""
        from torch.distributed.checkpoint.state_dict_saver import save

        _refuse_rank_local(options)
        location = self.checkpoint_id(step)
        save(state_dict, checkpoint_id=location, **options)
        self.publish_saved(step, location)

    def async_save(self, state_dict: dict[str, Any], step: int, **options: Any) -> Any:
        """``dcp.async_save`` the state as the save of ``step``; publish when its future resolves (rule 3).

        Returns what ``dcp.async_save`` returns (a future, or an ``AsyncSaveResponse``).
        """
        from torch.distributed.checkpoint.state_dict_saver import async_save

        _refuse_rank_local(options)
        location = self.checkpoint_id(step)
        response = async_save(state_dict, checkpoint_id=location, **options)
        self.publish_when_done(response, step, location)
        return response

    def publish_saved(self, step: int, location: str | None = None) -> None:
        """Publish a save that a synchronous ``dcp.save`` has just returned from, on the main process."""
        if self.publisher.is_main:
            self.publisher.publish_now(int(step), location or self.checkpoint_id(step))

    def publish_when_done(self, response: Any, step: int, location: str | None = None) -> None:
        """Publish the save of ``step`` on the main process once ``response`` (a future) resolves.

        ``response`` is what ``dcp.async_save`` returned: a future, or an ``AsyncSaveResponse`` whose
        ``upload_completion`` is the future. ``step`` is captured now (rule 3).
        """
        future: Future[Any] = getattr(response, "upload_completion", response)
        if not self.publisher.is_main:
            return
        captured_step, captured_location = int(step), location or self.checkpoint_id(step)
        published: Future[Entry | None] = Future()
        self._publishing.append(published)
        future.add_done_callback(
            _publish_on_success(self.publisher, captured_step, captured_location, published)
        )

    def wait(self) -> list[Entry]:
        """Wait until every publication scheduled by :meth:`publish_when_done` has run; return its entries.

        Call it before the process exits (after the last save's future), so the last save is published.
        """
        entries = [entry for published in self._publishing if (entry := published.result()) is not None]
        self._publishing = [p for p in self._publishing if not p.done()]
        return entries

    def close(self) -> tuple[Entry, ...]:
        """Wait for the scheduled publications (:meth:`wait`), then end the job's replication to its durable
        root, if it has one (``ckpt.integrations.core`` rule 7): returns what is still not durable."""
        self.wait()
        return self.publisher.close()


def _publish_on_success(
    publisher: Publisher, step: int, location: str, published: Future[Entry | None]
) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        try:
            if future.cancelled() or future.exception() is not None:
                published.set_result(None)  # the save failed: there is nothing whole to publish
                return
            published.set_result(publisher.publish_now(step, location))
        except BaseException as exc:
            published.set_exception(exc)
            raise

    return done


def _refuse_rank_local(options: dict[str, Any]) -> None:
    if options.get("use_collectives", True) is False:
        raise InvalidError(
            "use_collectives=False writes no global .metadata; ckpt cannot tell when it is whole"
        )
    if "checkpoint_id" in options:
        raise InvalidError(
            "pass the step, not checkpoint_id: the save goes to <root>/exec/<attempt>/step-<step>"
        )


def step_of(location: str) -> int:
    """The step of a ``step-<step>`` save location, e.g. the one :func:`resume_location` returned."""
    step = save_step(Framework.DCP, location.rstrip("/").rpartition("/")[2])
    if step is None:
        raise InvalidError(f"{location!r} is not a step-<step> save")
    return step


def resume_location(*, settle: float | None = None, **settings: Any) -> str | None:
    """The ``step-<step>`` save to ``dcp.load`` after catching up earlier executions; ``None`` on a first run.

    Call it after ``init_process_group`` so that only rank 0 reads and publishes and every rank gets the
    same answer. ``settings`` are :func:`~ckpt.integrations.core.open_job`'s, or ``job=``; ``sub_folder=``
    (such as ``"checkpoint"``) when the saves lie in that sub-folder of every execution's folder, as
    :func:`ckpt.resume_location` takes it.
    """
    return _resume_location(Framework.DCP, settle=settle, **settings)
