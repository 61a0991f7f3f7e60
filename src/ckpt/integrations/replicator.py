"""The in-process replicator: the tiered mode's copy to the durable root, off the training thread.

Rules (docs/spec/tiered.md §9):

1. One :class:`BackgroundReplicator` per job with a durable root, on the main process only (the one that
   publishes). It runs replication passes (``ckpt.application.replication.replicate``, spec/tiered.md §2)
   in one daemon thread: one pass when it starts (what an earlier execution published and never made
   durable), then one each time it is woken.
2. :meth:`~BackgroundReplicator.wake` is what the training side pays per save: it sets an event and
   returns; no file is read and no request is sent on the caller's thread.
3. A pass that fails (storage, verification, a log that cannot be read) is logged with what is not yet
   durable, and tried again after ``retry_seconds`` or at the next wake, whichever comes first.
3a. A pass that raises anything else (a defect, an error a library did not translate) is logged the same
   way, by its type and message (its traceback at debug level), counted as a failed pass, and retried: the
   thread never dies of it, so the saves published after it are still copied and ``close`` still drains.
4. :meth:`~BackgroundReplicator.close` (the integrations call it when training ends; also run at the
   interpreter's normal exit) lets the thread run one last pass, begun after the close so that it sees
   every save published before it, and ends the thread when that pass ends (success or not). With
   ``drain=False``
   it stops after the file being copied and publishes nothing more. Either way each fast entry still not
   durable is one ``not yet durable`` warning: a SIGKILL or a lost node loses only what those lines name,
   and the next execution's replicator (or ``ckpt replicate``) copies them while the fast root holds them.
5. With a metrics endpoint (``(address, port)``: ``CKPT_DURABLE_METRICS_PORT``, spec/tiered.md §9.6) it
   serves the metrics ``ckpt replicate --metrics-port`` serves (``ckpt.adapters.prometheus``), fed after
   every pass, from the moment it starts until :meth:`~BackgroundReplicator.close` returns. An endpoint
   that cannot be served (the port taken, ``prometheus_client`` missing) is logged as an error and the
   replicator runs without metrics: metrics never stop training.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any

from ckpt.application.replication import Replicated, pending_after, pending_between, replicate
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CkptError
from ckpt.store import Tiers

__all__ = ["BackgroundReplicator"]

_log = logging.getLogger("ckpt.integrations")

RETRY_SECONDS = 30.0


class BackgroundReplicator:
    """Replicates the fast root's published saves to the durable root in a background thread (rules 1-4)."""

    def __init__(
        self,
        tiers: Tiers,
        *,
        retry_seconds: float = RETRY_SECONDS,
        metrics_endpoint: tuple[str, int] | None = None,
    ) -> None:
        self.tiers = tiers
        self.retry_seconds = retry_seconds
        self.published: list[Entry] = []  # durable entries this replicator created, in order
        self.last: Replicated | None = None  # the last pass's outcome
        self.failure: str | None = None  # the last pass's failure, None once a pass succeeds
        self._wake = threading.Event()
        self._stop = threading.Event()  # stop after the file being copied
        self._draining = False
        self._lock = threading.Lock()
        self.metrics: Any = None  # ckpt.adapters.prometheus.ReplicationMetrics, while served (rule 5)
        self.metrics_url: str | None = None
        self._server: Any = None
        if metrics_endpoint is not None:
            self._serve(metrics_endpoint)
        self._thread = threading.Thread(target=self._run, name="ckpt-replicator", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"BackgroundReplicator({self.tiers.fast!r} -> {self.tiers.durable!r})"

    def _serve(self, endpoint: tuple[str, int]) -> None:
        """Rule 5: serve the metrics, or say why not and go on without them."""
        from ckpt import __version__
        from ckpt.adapters.prometheus import serve_replication_metrics

        try:
            self.metrics, self._server = serve_replication_metrics(*endpoint, version=__version__)
        except (CkptError, OSError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            _log.error("replicating without metrics: %s", reason)
            return
        self.metrics_url = self._server.url
        _log.info("serving replication metrics at %s", self.metrics_url)

    def wake(self) -> None:
        """Ask for a pass soon (rule 2): returns at once."""
        self._wake.set()

    def close(self, *, drain: bool = True) -> tuple[Entry, ...]:
        """Finish what is pending (``drain``) or stop after the file being copied, then end the thread.

        Returns the fast entries still not durable, each also logged as a warning (rule 4). Idempotent.
        """
        atexit.unregister(self.close)
        with self._lock:
            self._draining = True
        if not drain:
            self._stop.set()
        self._wake.set()
        self._thread.join()
        if self._server is not None:
            self._server.close()
            self._server = None
        pending = self.pending()
        for entry in pending:
            _log.warning("not yet durable: %s", self.tiers.fast.location(entry))
        return pending

    def pending(self) -> tuple[Entry, ...]:
        """The fast entries greater than the durable root's greatest (spec/tiered.md §2.1), as now listed."""
        try:
            return tuple(pending_between(self.tiers.fast, self.tiers.durable))
        except CkptError as exc:
            _log.error("cannot tell which entries are not yet durable: %s", exc)
            return self.last.pending if self.last is not None else ()

    def _run(self) -> None:
        retry = False
        first = True
        while True:
            if not first:
                self._wake.wait(self.retry_seconds if retry else None)
            first = False
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                draining = self._draining
            try:
                retry = not self._pass()
            except Exception as exc:  # noqa: BLE001 - rule 3a: the thread outlives a bug in a pass
                self._unexpected(exc)
                retry = True
            if draining:  # begun after close(): it saw every entry published before close() (rule 4)
                return

    def _pass(self) -> bool:
        tiers = self.tiers
        try:
            outcome = replicate(
                tiers.fast,
                tiers.fast_files,
                tiers.durable,
                tiers.durable_files,
                stop=self._stop.is_set,
                files_in_flight=tiers.files_in_flight,
            )
        except CkptError as exc:  # rule 3: the logs could not be read
            if self.metrics is not None:
                self.metrics.passed(None)
            self.failure = str(exc)
            _log.error("replication failed (will retry): %s", exc)
            return False
        self.last = outcome
        self.published += outcome.published
        if self.metrics is not None:
            self._count(outcome)
        for entry in outcome.published:
            _log.info("durable: %s", tiers.durable.location(entry))
        for entry, reason in outcome.passed:
            _log.warning("passed over %s: %s", tiers.fast.location(entry), reason)
        self.failure = outcome.failure
        if outcome.failure is not None:
            _log.error("replication failed (will retry): %s", outcome.failure)
            return False
        return True

    def _unexpected(self, exc: Exception) -> None:
        """Rule 3a: count and log an error that is no ``CkptError``, the traceback only at debug level."""
        self.failure = f"{type(exc).__name__}: {exc}"
        if self.metrics is not None:
            self.metrics.passed(None)
        _log.error("replication failed unexpectedly (will retry): %s", self.failure)
        _log.debug("the failed pass", exc_info=exc)

    def _count(self, outcome: Replicated) -> None:
        assert self.metrics is not None
        try:
            pending = tuple(pending_after(self.tiers.fast, outcome))
        except CkptError as exc:
            _log.error("cannot tell which entries are not yet durable: %s", exc)
            pending = outcome.pending
        self.metrics.passed(outcome, pending)
