"""The watcher's and the replicator's metrics in the Prometheus text format, served over HTTP
(``ckpt watch --metrics-port``, ``ckpt replicate --metrics-port``).

Rules:

1. ``prometheus_client`` (the ``metrics`` extra) is imported only by :func:`serve_watch_metrics`; without it
   that is an ``InvalidError`` naming the extra, so ``ckpt watch`` without ``--metrics-port`` never needs it.
2. Metrics live in a registry of their own, not the library's global one: nothing else in the process (a
   trainer that imports ``ckpt``) shows up in them, and a second server cannot collide with the first.
3. The watcher knows nothing of Prometheus: :class:`WatchMetrics` is a
   :class:`~ckpt.application.watcher.WatchObserver` fed one ``ScanReport`` per scan. What a scrape shows:

   ========================================================  ==============================================
   ``ckpt_watch_saves_published_total``                      entries this watcher created
   ``ckpt_watch_last_published_epoch`` / ``..._step``         the last entry it created (absent until then)
   ``ckpt_watch_scans_total``                                scans that ended (successful or not)
   ``ckpt_watch_scan_errors_total``                          scans that failed or timed out
   ``ckpt_watch_scan_duration_seconds``                      a histogram of scan durations
   ``ckpt_watch_seconds_since_last_successful_scan``         since the last successful scan ended, or since
                                                             the metrics started when none has yet
   ``ckpt_watch_saves_waiting``                              save folders the last scan found unpublished
   ``ckpt_build_info{version="..."}``                        1, labelled with the package version
   ========================================================  ==============================================
3a. The replicator knows nothing of Prometheus either: :class:`ReplicationMetrics` is fed one
   ``Replicated`` per pass (or the failure of a pass that could not read a log). What a scrape shows
   (throughput is ``rate(ckpt_replicate_bytes_copied_total[...])``):

   ========================================================  ==============================================
   ``ckpt_replicate_saves_published_total``                  entries this replicator created (durable root)
   ``ckpt_replicate_files_copied_total`` / ``..._bytes_...``  files and bytes copied and verified
   ``ckpt_replicate_files_present_total``                    files found already durable, not copied again
   ``ckpt_replicate_passes_total``                           passes that ended (successful or not)
   ``ckpt_replicate_pass_failures_total``                    passes that failed (each is retried)
   ``ckpt_replicate_verification_failures_total``            passes failed by a copy that did not verify
   ``ckpt_replicate_entries_pending``                        fast entries not yet durable after the pass
   ``ckpt_replicate_lag_steps``                              steps between the roots' greatest entries
   ``ckpt_replicate_lag_seconds``                            how long the oldest pending entry has waited,
                                                             since this replicator first saw it (0: none)
   ``ckpt_replicate_last_durable_epoch`` / ``..._step``       the durable root's greatest entry
   ``ckpt_replicate_seconds_since_last_successful_pass``     as the watcher's scan gauge
   ========================================================  ==============================================
4. The server binds the address given (``127.0.0.1`` unless told otherwise: metrics are not for the world
   unless the operator says so) and serves from a daemon thread, so it never keeps the process alive.
5. :func:`parse_endpoint` is the one reading of a port and an address as an operator writes them (the
   commands' ``--metrics-port`` / ``--metrics-address``, the in-process replicator's
   ``CKPT_DURABLE_METRICS_PORT`` / ``CKPT_DURABLE_METRICS_ADDRESS``): a port from 0 to 65535, an IP address.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ckpt.domain.errors import InvalidError

if TYPE_CHECKING:  # annotations only: importing this module (every command's parser) stays cheap
    from ckpt.application.replication import Replicated
    from ckpt.application.watcher import ScanReport
    from ckpt.domain.entries import Entry

__all__ = [
    "DEFAULT_ADDRESS",
    "MetricsServer",
    "ReplicationMetrics",
    "WatchMetrics",
    "parse_endpoint",
    "serve_replication_metrics",
    "serve_watch_metrics",
]

# Scans list a folder or two: usually milliseconds on POSIX, up to seconds on a slow S3 endpoint, and at
# most the scan timeout (default 120 s).
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


DEFAULT_ADDRESS = "127.0.0.1"


def parse_endpoint(
    port: str | None, address: str | None, *, port_name: str, address_name: str
) -> tuple[str, int] | None:
    """``(address, port)`` as written under ``port_name`` and ``address_name``, or ``None`` when no port is
    given (rule 5); ``InvalidError`` naming the one that is wrong."""
    import ipaddress

    if port is None:
        if address is not None:
            raise InvalidError(f"{address_name} applies to the metrics endpoint: give {port_name} as well")
        return None
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and int(port) <= 65535):
        shown = port if len(port) <= 40 else port[:40] + "..."
        raise InvalidError(f"{port_name} {shown!r} must be a port number from 0 to 65535")
    if address is None:
        address = DEFAULT_ADDRESS
    try:
        ipaddress.ip_address(address)
    except ValueError:
        shown = address if len(address) <= 60 else address[:60] + "..."
        raise InvalidError(
            f"{address_name} {shown!r} must be an IP address (such as 127.0.0.1, 0.0.0.0 or ::)"
        ) from None
    return address, int(port)


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise InvalidError(
            "serving metrics needs the prometheus_client package: pip install 'ckpt-log[metrics]'"
        ) from exc
    return prometheus_client


class WatchMetrics:
    """A ``WatchObserver`` (:mod:`ckpt.application.watcher`) keeping the metrics in ``registry`` (rule 3)."""

    def __init__(self, registry: Any, version: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        prometheus = _prometheus()
        self.registry = registry
        self._clock = clock
        self._lock = threading.Lock()
        self._last_success = clock()  # until a scan succeeds: when the metrics started (rule 3)
        self._published = prometheus.Counter(
            "ckpt_watch_saves_published", "Entries this watcher created.", registry=registry
        )
        self._epoch = prometheus.Gauge(
            "ckpt_watch_last_published_epoch",
            "Epoch of the last entry this watcher created.",
            registry=registry,
        )
        self._step = prometheus.Gauge(
            "ckpt_watch_last_published_step",
            "Step of the last entry this watcher created.",
            registry=registry,
        )
        self._scans = prometheus.Counter(
            "ckpt_watch_scans", "Scans that ended, successful or not.", registry=registry
        )
        self._errors = prometheus.Counter(
            "ckpt_watch_scan_errors", "Scans that failed or timed out.", registry=registry
        )
        self._duration = prometheus.Histogram(
            "ckpt_watch_scan_duration_seconds",
            "How long scans took.",
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        since = prometheus.Gauge(
            "ckpt_watch_seconds_since_last_successful_scan",
            "Seconds since the last successful scan ended (since start-up while none has).",
            registry=registry,
        )
        since.set_function(self._seconds_since_success)
        self._waiting = prometheus.Gauge(
            "ckpt_watch_saves_waiting",
            "Save folders the last scan found not yet published (settling or incomplete).",
            registry=registry,
        )
        _build_info(prometheus, registry, version)

    def _seconds_since_success(self) -> float:
        with self._lock:
            return max(0.0, self._clock() - self._last_success)

    def scanned(self, report: ScanReport) -> None:
        """Count one scan and what it published (``WatchObserver``)."""
        self._scans.inc()
        self._duration.observe(report.duration)
        if report.created:
            self._published.inc(len(report.created))
            last = report.created[-1]
            self._epoch.set(last.epoch)
            self._step.set(last.step)
        if report.succeeded:
            self._waiting.set(report.waiting)
            with self._lock:
                self._last_success = self._clock()
        else:
            self._errors.inc()


def _build_info(prometheus: Any, registry: Any, version: str) -> None:
    info = prometheus.Gauge(
        "ckpt_build_info", "Always 1; the label says which ckpt build runs.", ["version"], registry=registry
    )
    info.labels(version=version).set(1)


class ReplicationMetrics:
    """The replicator's metrics in ``registry`` (rule 3a), fed by :meth:`passed` after every pass."""

    def __init__(self, registry: Any, version: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        prometheus = _prometheus()
        self.registry = registry
        self._clock = clock
        self._lock = threading.Lock()
        self._last_success = clock()
        self._waiting_since: dict[Entry, float] = {}

        def counter(name: str, text: str) -> Any:
            return prometheus.Counter(f"ckpt_replicate_{name}", text, registry=registry)

        def gauge(name: str, text: str) -> Any:
            return prometheus.Gauge(f"ckpt_replicate_{name}", text, registry=registry)

        self._published = counter("saves_published", "Entries this replicator created on the durable root.")
        self._files = counter("files_copied", "Files copied and verified.")
        self._bytes = counter("bytes_copied", "Bytes copied and verified.")
        self._present = counter("files_present", "Files found already durable and not copied again.")
        self._passes = counter("passes", "Passes that ended, successful or not.")
        self._failures = counter("pass_failures", "Passes that failed (the next pass retries).")
        self._verification = counter("verification_failures", "Passes failed by a copy that did not verify.")
        self._pending = gauge("entries_pending", "Fast entries not yet durable after the last pass.")
        self._lag_steps = gauge("lag_steps", "Steps between the two roots' greatest entries.")
        lag_seconds = gauge("lag_seconds", "Seconds the oldest entry not yet durable has waited (0: none).")
        lag_seconds.set_function(self._lag_seconds)
        self._epoch = gauge("last_durable_epoch", "Epoch of the durable root's greatest entry.")
        self._step = gauge("last_durable_step", "Step of the durable root's greatest entry.")
        since = gauge(
            "seconds_since_last_successful_pass",
            "Seconds since the last successful pass ended (since start-up while none has).",
        )
        since.set_function(self._seconds_since_success)
        _build_info(prometheus, registry, version)

    def _seconds_since_success(self) -> float:
        with self._lock:
            return max(0.0, self._clock() - self._last_success)

    def _lag_seconds(self) -> float:
        with self._lock:
            oldest = min(self._waiting_since.values(), default=None)
            return 0.0 if oldest is None else max(0.0, self._clock() - oldest)

    def passed(self, outcome: Replicated | None, pending: tuple[Entry, ...] = ()) -> None:
        """Count one pass: its outcome, or ``None`` for a pass that failed before it began; ``pending`` are
        the fast entries not yet durable after it."""
        self._passes.inc()
        if outcome is None:
            self._failures.inc()
            return
        self._published.inc(len(outcome.published))
        self._files.inc(outcome.files_copied)
        self._bytes.inc(outcome.bytes_copied)
        self._present.inc(outcome.files_present)
        self._pending.set(len(pending))
        self._lag_steps.set(outcome.lag_steps)
        if outcome.newest_durable is not None:
            self._epoch.set(outcome.newest_durable.epoch)
            self._step.set(outcome.newest_durable.step)
        now = self._clock()
        with self._lock:
            self._waiting_since = {e: self._waiting_since.get(e, now) for e in pending}
            if outcome.failure is None:
                self._last_success = now
        if outcome.failure is not None:
            self._failures.inc()
            if outcome.verification_failed:
                self._verification.inc()


class MetricsServer:
    """A running metrics endpoint: where it listens, and how to stop it."""

    def __init__(self, server: Any, thread: threading.Thread, address: str) -> None:
        self._server = server
        self._thread = thread
        self.address = address
        self.port: int = server.server_port

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def serve_watch_metrics(address: str, port: int, version: str) -> tuple[WatchMetrics, MetricsServer]:
    """Create the watcher's metrics and serve them at ``http://address:port/metrics`` (port 0: any free one).

    Raises ``InvalidError`` when ``prometheus_client`` is missing (rule 1) and ``OSError`` naming the address
    and port when they cannot be bound.
    """
    prometheus = _prometheus()
    registry = prometheus.CollectorRegistry()
    metrics = WatchMetrics(registry, version)
    return metrics, _serve(prometheus, registry, address, port)


def serve_replication_metrics(
    address: str, port: int, version: str
) -> tuple[ReplicationMetrics, MetricsServer]:
    """The replicator's metrics (rule 3a), served as :func:`serve_watch_metrics` serves the watcher's."""
    prometheus = _prometheus()
    registry = prometheus.CollectorRegistry()
    metrics = ReplicationMetrics(registry, version)
    return metrics, _serve(prometheus, registry, address, port)


def _serve(prometheus: Any, registry: Any, address: str, port: int) -> MetricsServer:
    try:
        server, thread = prometheus.start_http_server(port, addr=address, registry=registry)
    except OSError as exc:
        where = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        raise OSError(exc.errno, f"cannot serve metrics at {where}: {exc.strerror or exc}") from None
    return MetricsServer(server, thread, address)
