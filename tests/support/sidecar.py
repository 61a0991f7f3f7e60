"""A watcher in a thread beside a real training loop, as the sidecar container runs beside the trainer."""

from __future__ import annotations

import threading
from typing import Any

from ckpt.adapters.posix import PosixStore
from ckpt.application.watcher import Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import Framework
from ckpt.domain.rules import Rule

__all__ = ["Sidecar"]


class Sidecar:
    """``with Sidecar(store, rule, attempt, epoch) as sidecar:`` watches ``exec/<attempt>`` in the block.

    ``sidecar.published`` lists the entries in the order they were created; leaving the block stops the
    watcher and fails the test if it raised. ``interval`` defaults to 50 ms; other keywords go to
    :class:`Watcher`.
    """

    def __init__(
        self, store: PosixStore, rule: Framework | Rule, attempt: str, epoch: int, **kwargs: Any
    ) -> None:
        self.published: list[Entry] = []
        self.watcher = Watcher(
            store,
            rule,
            store.exec_dir(attempt),
            epoch,
            kwargs.pop("interval", 0.05),
            on_published=self.published.append,
            scan_timeout=30,
            **kwargs,
        )
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.watcher.watch(self.stop)
        except Exception as exc:
            self.error = exc

    def __enter__(self) -> Sidecar:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        assert self.error is None, self.error
