"""Accelerate: save state, wait for every process, publish on the main process; resume in one line.

::

    from ckpt.integrations.accelerate import CkptAccelerate

    accelerator = Accelerator()
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    saver = CkptAccelerate(accelerator)             # the job from DISPATCH_* / CKPT_ROOT, or arguments
    start = saver.load_latest() + 1                 # 0 + 1 on a first run; else the saved step + 1
    for step in range(start, steps + 1):
        ...
        if step % 100 == 0:
            saver.save_state(step)

Rules (from Accelerate's source, docs/integrations/accelerate.md):

1. ``Accelerator.save_state`` has no post-save hook and ends without a barrier (every process writes its own
   ``random_states_<i>.pkl``), so :meth:`CkptAccelerate.save_state` saves, waits for everyone
   (``wait_for_everyone``), then publishes on the main process.
2. Saves go to ``<root>/exec/<attempt>/step-<step>``: Accelerate's own automatic naming counts saves, not
   steps, and its ``total_limit`` deletes *before* saving, so neither is used.
3. Resuming first publishes, under their own epochs, the whole saves earlier executions never published:
   there is no watcher rule for Accelerate, so "whole" is every process's ``random_states_<i>.pkl`` (the
   last file each writes, with ``torch.save``) present and whole, for the current number of processes:
   ending with its zip end-of-central-directory record (``torch.save``'s format since torch 1.6), or, for
   a file written as a plain pickle, with the pickle STOP opcode. Then the newest published save whose
   ``random_states_0.pkl`` is still there.
4. An execution folder too long for ``step-18446744073709551615`` (the longest save, spec/names.md §4.5)
   is an ``InvalidError`` when ``CkptAccelerate`` is made, on every process, before any save or
   ``wait_for_everyone``.
"""

from __future__ import annotations

from typing import Any

from ckpt.domain.entries import parse_step
from ckpt.domain.errors import InvalidError
from ckpt.domain.ports import WatchStore
from ckpt.integrations.core import Job, Publisher, newest_with_file, on_main_then_broadcast, open_job

__all__ = ["CkptAccelerate"]

_FOLDER_PREFIX = "step-"
_ALWAYS_WRITTEN = "random_states_0.pkl"  # the main process's RNG state: in every save_state
_ZIP_END_RECORD = b"PK\x05\x06"
_ZIP_END_SIZE = 22  # the end record without its comment


def _whole_torch_file(data: bytes) -> bool:
    """Whether ``data`` is a whole ``torch.save`` file (rule 3).

    The zip format ends with the end-of-central-directory record: its signature, then 16 bytes, then the
    comment length and the comment, so the last signature must sit exactly that far from the end. A plain
    pickle (protocol 2 or later) ends with STOP.
    """
    at = data.rfind(_ZIP_END_RECORD, max(0, len(data) - _ZIP_END_SIZE - 0xFFFF))
    if at >= 0 and len(data) - at >= _ZIP_END_SIZE:
        comment = int.from_bytes(data[at + 20 : at + 22], "little")
        if at + _ZIP_END_SIZE + comment == len(data):
            return True
    return data.startswith(b"\x80") and data.endswith(b".")


class CkptAccelerate:
    """Saves an ``Accelerator``'s state into the execution's folder and publishes each save once.

    Keyword arguments are :func:`~ckpt.integrations.core.open_job`'s; ``publisher_options`` go to the
    :class:`~ckpt.integrations.core.Publisher` (``on_published``).
    """

    def __init__(
        self,
        accelerator: Any,
        *,
        job: Job | None = None,
        publisher_options: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        self.accelerator = accelerator
        self.job = job if job is not None else open_job(**settings)
        self.job.require_room(f"{_FOLDER_PREFIX}{{step}}", "Accelerate saves")  # rule 4, before any save
        self.publisher = Publisher(
            self.job,
            is_main=bool(accelerator.is_main_process),
            barrier=accelerator.wait_for_everyone,
            **(publisher_options or {}),
        )

    def location(self, step: int) -> str:
        """Where the save of ``step`` goes: ``<root>/exec/<attempt>/step-<step>``."""
        return f"{self.job.saves_location.rstrip('/')}/{_FOLDER_PREFIX}{int(step)}"

    def save_state(self, step: int, **options: Any) -> str:
        """``accelerator.save_state`` into :meth:`location`, wait for everyone, publish on the main one."""
        if "output_dir" in options:
            raise InvalidError(
                "pass the step, not output_dir: the save goes to <root>/exec/<attempt>/step-<step>"
            )
        location = self.location(step)
        self.accelerator.save_state(output_dir=location, **options)
        self.publisher.publish(int(step), location)
        return location

    def is_whole_save(self, store: WatchStore, location: str) -> bool:
        """Whether a ``step-<step>`` save is whole: every process's ``random_states_<i>.pkl``, the last file
        it writes, is there and whole (rule 3; for the current number of processes)."""
        for index in range(int(self.accelerator.num_processes)):
            data = store.read_file(location, f"random_states_{index}.pkl")
            if not data or not _whole_torch_file(data):
                return False
        return True

    def resume_location(self, *, catch_up: bool = True) -> str | None:
        """Catch up earlier executions, then the newest published save still on disk; ``None`` at first.

        Rank 0 does it and every process gets the answer (rule 3).
        """

        def compute() -> str | None:
            store = self.job.store
            if catch_up:
                from ckpt.catchup import catch_up_folders

                catch_up_folders(
                    store,
                    self.is_whole_save,
                    folder_prefix=_FOLDER_PREFIX,
                    attempt=self.job.attempt,
                    epoch=self.job.epoch,
                )
            return newest_with_file(store, _ALWAYS_WRITTEN, folder_prefix=_FOLDER_PREFIX)

        return on_main_then_broadcast(compute)

    def load_latest(self) -> int:
        """Load the state of :meth:`resume_location` and return its step, or return 0 on a first run."""
        location = self.resume_location()
        if location is None:
            return 0
        self.accelerator.load_state(location)
        return parse_step(location.rstrip("/").rpartition("/")[2][len(_FOLDER_PREFIX) :])
