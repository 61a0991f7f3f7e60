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
3. Before ``save_state``, the main process writes the save's manifest ``.ckpt-accelerate.json``
   (``{"custom_objects": k}``, the objects registered with ``register_for_checkpointing``), so that the
   ``accelerate`` rule knows how many ``custom_checkpoint_<i>.pkl`` the save must hold: the main process
   writes them last, and ``load_state`` refuses a folder with another count.
4. An execution folder too long for ``step-18446744073709551615`` (the longest save, spec/names.md §4.5)
   is an ``InvalidError`` when ``CkptAccelerate`` is made, on every process, before any save or
   ``wait_for_everyone``.
5. Completion is the ``accelerate`` rule's alone (``ckpt.domain.rules.accelerate``, spec/watcher.md §2.12):
   :meth:`CkptAccelerate.resume_location` is ``ckpt.integrations.core.resume_location`` with that rule, so
   its catch-up and its verified resolve judge each execution's saves with the world size that execution
   recorded (``exec/<attempt>/.ckpt-world-size``; this integration records ``num_processes``), exactly as
   ``ckpt resume --framework accelerate`` and ``ckpt watch --framework accelerate`` do.
"""

from __future__ import annotations

import json
from typing import Any

from ckpt.application.rulebook import find_rule
from ckpt.domain.entries import Entry, parse_step
from ckpt.domain.errors import InvalidError
from ckpt.domain.ports import WritesSmallFiles
from ckpt.domain.rules.accelerate import MANIFEST
from ckpt.integrations.core import Job, Publisher, open_job
from ckpt.integrations.core import resume_location as _resume_location

__all__ = ["CkptAccelerate"]

_FOLDER_PREFIX = "step-"


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
        if job is None:
            settings.setdefault("world_size", int(accelerator.num_processes))  # recorded (rule 5)
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
        custom = getattr(self.accelerator, "_custom_objects", None)  # register_for_checkpointing's list
        store = self.job.store
        if self.accelerator.is_main_process and custom is not None and isinstance(store, WritesSmallFiles):
            manifest = json.dumps({"custom_objects": len(custom)}).encode()
            store.write_file(location, MANIFEST, manifest)  # rule 3: before anything of the save
        self.accelerator.save_state(output_dir=location, **options)
        self.publisher.publish(int(step), location)
        return location

    def close(self) -> tuple[Entry, ...]:
        """End the job's replication to its durable root, if it has one (``ckpt.integrations.core`` rule 7),
        once every published save is durable; returns what is still not durable."""
        return self.publisher.close()

    def resume_location(self, *, catch_up: bool = True) -> str | None:
        """Catch up earlier executions, then the newest published save the ``accelerate`` rule finds
        complete; ``None`` at first (rule 5). Rank 0 does it and every process gets the answer."""
        return _resume_location(find_rule("accelerate"), job=self.job, catch_up=catch_up)

    def load_latest(self) -> int:
        """Load the state of :meth:`resume_location` and return its step, or return 0 on a first run."""
        location = self.resume_location()
        if location is None:
            return 0
        self.accelerator.load_state(location)
        return parse_step(location.rstrip("/").rpartition("/")[2][len(_FOLDER_PREFIX) :])
