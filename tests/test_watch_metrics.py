"""The sidecar's metrics: the watcher's scan reports, their Prometheus form, and a scraped ``ckpt watch``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

import ckpt
from ckpt.adapters.prometheus import WatchMetrics
from ckpt.application.watcher import ScanReport, Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidTypeError, MalformedError
from ckpt.domain.frameworks import Framework
from ckpt.testing import InMemoryStore

ATTEMPT = "2.4102.0"
EPOCH = 2_000_000


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class Reports:
    """A ``WatchObserver`` that keeps every report it receives."""

    def __init__(self) -> None:
        self.reports: list[ScanReport] = []

    def scanned(self, report: ScanReport) -> None:
        self.reports.append(report)


def dcp_watcher(store: InMemoryStore, observer: Reports, clock: FakeClock) -> Watcher:
    return Watcher(store, Framework.DCP, store.exec_dir(ATTEMPT), EPOCH, 1.0, observer=observer, clock=clock)


class TestScanReports:
    def test_a_scan_reports_what_it_published_and_what_waits(self) -> None:
        """Each scan reports its duration, the entries it created and the unpublished saves it found."""
        store, reports, clock = InMemoryStore(), Reports(), FakeClock()
        saves = store.exec_dir(ATTEMPT)
        store.write_file(f"{saves}/step-10", ".metadata", b"m")
        store.write_file(f"{saves}/step-20", "shard-0", b"w")  # no .metadata yet
        w = dcp_watcher(store, reports, clock)
        w.scan()
        store.write_file(f"{saves}/step-20", ".metadata", b"m")
        w.scan()
        assert reports.reports == [
            ScanReport(0.0, (Entry(EPOCH, 10, f"exec/{ATTEMPT}/step-10"),), waiting=1, error=None),
            ScanReport(0.0, (Entry(EPOCH, 20, f"exec/{ATTEMPT}/step-20"),), waiting=0, error=None),
        ]

    def test_a_failed_scan_is_reported_with_its_error(self) -> None:
        """A scan that raises is reported with the error's type name, and the error still propagates."""
        store, reports, clock = InMemoryStore(), Reports(), FakeClock()
        store.write_file(f"{store.exec_dir(ATTEMPT)}/step-1", ".metadata", b"m")
        store.put_raw_entry("not-an-entry")
        with pytest.raises(MalformedError):
            dcp_watcher(store, reports, clock).scan()
        assert [(r.error, r.succeeded) for r in reports.reports] == [("MalformedError", False)]


class TestObserverArgument:
    def test_an_observer_without_scanned_is_refused(self) -> None:
        """``observer`` must have ``scanned``; anything else is refused up front, like every argument."""
        store = InMemoryStore()
        with pytest.raises(InvalidTypeError, match="observer"):
            Watcher(store, Framework.DCP, store.exec_dir(ATTEMPT), 1, 1.0, observer=print)  # type: ignore[arg-type]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    value: float | None = registry.get_sample_value(name, labels)
    return value


class TestWatchMetrics:
    def test_reports_become_the_documented_metrics(self) -> None:
        """Counters, the last entry, waiting saves and the time since the last good scan follow reports."""
        registry, clock = CollectorRegistry(), FakeClock()
        metrics = WatchMetrics(registry, "9.9.9", clock=clock)
        assert sample(registry, "ckpt_build_info", version="9.9.9") == 1
        assert sample(registry, "ckpt_watch_scans_total") == 0
        clock.now += 3
        assert sample(registry, "ckpt_watch_seconds_since_last_successful_scan") == 3  # since start-up
        entries = (Entry(7, 100, "exec/a/step-100"), Entry(7, 200, "exec/a/step-200"))
        metrics.scanned(ScanReport(0.25, entries, waiting=2))
        clock.now += 10
        metrics.scanned(ScanReport(4.0, (), waiting=5, error="StorageError"))
        assert {
            name: sample(registry, name)
            for name in (
                "ckpt_watch_saves_published_total",
                "ckpt_watch_last_published_epoch",
                "ckpt_watch_last_published_step",
                "ckpt_watch_scans_total",
                "ckpt_watch_scan_errors_total",
                "ckpt_watch_scan_duration_seconds_count",
                "ckpt_watch_scan_duration_seconds_sum",
                "ckpt_watch_saves_waiting",
                "ckpt_watch_seconds_since_last_successful_scan",
            )
        } == {
            "ckpt_watch_saves_published_total": 2,
            "ckpt_watch_last_published_epoch": 7,
            "ckpt_watch_last_published_step": 200,
            "ckpt_watch_scans_total": 2,
            "ckpt_watch_scan_errors_total": 1,
            "ckpt_watch_scan_duration_seconds_count": 2,
            "ckpt_watch_scan_duration_seconds_sum": 4.25,
            "ckpt_watch_saves_waiting": 2,  # a failed scan leaves the last good count
            "ckpt_watch_seconds_since_last_successful_scan": 10,
        }


# -- the real sidecar ---------------------------------------------------------------------------------------


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Sidecar:
    """A running ``ckpt watch`` (or another long-running ``command``) whose stderr is read line by line."""

    def __init__(self, root: Path, *args: str, command: str = "watch") -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ckpt", "--root", str(root), command, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(),
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for_line(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if found := re.search(pattern, line):
                        return found
                left = deadline - time.monotonic()
                assert left > 0, f"no line like {pattern!r} in time: {self.lines}"
                assert self.process.poll() is None, f"exited before a line like {pattern!r}: {self.lines}"
                self._changed.wait(min(left, 0.5))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self._reader.join(5)
        return code

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self._reader.join(5)
        if self.process.stderr is not None:
            self.process.stderr.close()


@pytest.fixture
def sidecars() -> Iterator[Callable[..., Sidecar]]:
    started: list[Sidecar] = []

    def start(root: Path, *args: str) -> Sidecar:
        started.append(Sidecar(root, *args))
        return started[-1]

    yield start
    for sidecar in started:
        sidecar.kill()


def scrape(url: str) -> tuple[str, dict[str, float]]:
    """GET the endpoint; return its content type and every sample as ``name{labels}`` -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        content_type = response.headers["Content-Type"]
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return content_type, samples


def scrape_until(url: str, wanted: dict[str, float], timeout: float = 30) -> dict[str, float]:
    """Scrape (the sidecar scans every 0.05 s) until every sample of ``wanted`` has its value and the scan
    count agrees with the duration histogram; return the samples of that scrape.

    One scrape is not a snapshot: it can land between two updates of one scan (Prometheus promises no
    consistency across metrics), so a single scrape is never asserted on for values that change together.
    """
    deadline = time.monotonic() + timeout
    while True:
        _, samples = scrape(url)
        scans = samples.get("ckpt_watch_scans_total")
        settled = samples.get("ckpt_watch_scan_duration_seconds_count") == scans
        if settled and all(samples.get(name) == value for name, value in wanted.items()):
            return samples
        if time.monotonic() > deadline:
            return samples  # the caller's assertions say what is missing
        time.sleep(0.05)


class TestScrapedSidecar:
    def test_a_running_watch_serves_its_metrics(
        self, tmp_path: Path, sidecars: Callable[..., Sidecar]
    ) -> None:
        """A running ``ckpt watch`` serves scans, publications and waiting saves as they happen."""
        saves = tmp_path / "exec" / ATTEMPT
        sidecar = sidecars(
            tmp_path, "--framework", "dcp", "--attempt", ATTEMPT, "--epoch", str(EPOCH),
            "--interval", "0.05", "--metrics-port", "0",
        )  # fmt: skip
        url = sidecar.wait_for_line(r"serving metrics at (http://127\.0\.0\.1:\d+/metrics)").group(1)
        content_type, samples = scrape(url)
        assert content_type.startswith("text/plain; version=0.0.4")
        assert samples[f"ckpt_build_info{{version={ckpt.__version__}}}"] == 1
        assert samples["ckpt_watch_saves_published_total"] == 0

        (saves / "step-30").mkdir(parents=True)
        (saves / "step-30" / ".metadata").write_bytes(b"m")
        (saves / "step-40").mkdir()  # still being written: no .metadata
        samples = scrape_until(
            url,
            {
                "ckpt_watch_saves_published_total": 1,
                "ckpt_watch_last_published_epoch": EPOCH,
                "ckpt_watch_last_published_step": 30,
                "ckpt_watch_saves_waiting": 1,
            },
        )
        assert samples["ckpt_watch_saves_published_total"] == 1
        assert samples["ckpt_watch_last_published_epoch"] == EPOCH
        assert samples["ckpt_watch_last_published_step"] == 30
        assert samples["ckpt_watch_saves_waiting"] == 1
        assert samples["ckpt_watch_scans_total"] >= 1
        assert samples["ckpt_watch_scan_errors_total"] == 0
        assert samples["ckpt_watch_scan_duration_seconds_count"] == samples["ckpt_watch_scans_total"]
        assert 0 <= samples["ckpt_watch_seconds_since_last_successful_scan"] < 30

        (saves / "step-40" / ".metadata").write_bytes(b"m")
        samples = scrape_until(
            url,
            {
                "ckpt_watch_saves_published_total": 2,
                "ckpt_watch_last_published_step": 40,
                "ckpt_watch_saves_waiting": 0,
            },
        )
        assert samples["ckpt_watch_saves_published_total"] == 2
        assert (samples["ckpt_watch_last_published_step"], samples["ckpt_watch_saves_waiting"]) == (40, 0)
        assert sidecar.stop() == 0

    def test_the_endpoint_listens_on_the_address_given(
        self, tmp_path: Path, sidecars: Callable[..., Sidecar]
    ) -> None:
        """``--metrics-address`` chooses the listening address; the logged URL names it."""
        sidecar = sidecars(
            tmp_path, "--framework", "dcp", "--attempt", ATTEMPT, "--epoch", "1",
            "--interval", "0.05", "--metrics-port", "0", "--metrics-address", "127.0.0.2",
        )  # fmt: skip
        url = sidecar.wait_for_line(r"serving metrics at (http://127\.0\.0\.2:\d+/metrics)").group(1)
        assert "ckpt_watch_scans_total" in scrape(url)[1]
        assert sidecar.stop() == 0

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("--metrics-address", "127.0.0.1"), "--metrics-address applies to the metrics endpoint"),
            (("--metrics-port", "65536"), "--metrics-port '65536' must be a port number from 0 to 65535"),
            (("--metrics-port", "-1"), "must be a port number"),
            (("--metrics-port", "0", "--metrics-address", "localhost"), "must be an IP address"),
        ],
    )
    def test_invalid_metrics_options_are_usage_errors(
        self, tmp_path: Path, args: tuple[str, ...], message: str
    ) -> None:
        """A bad port or address, or an address without a port, exits 2 with one line naming the option."""
        result = subprocess.run(
            [sys.executable, "-m", "ckpt", "--root", str(tmp_path), "watch", "--framework", "dcp",
             "--attempt", ATTEMPT, "--epoch", "1", "--once", *args],
            capture_output=True, text=True, env=environment(), timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert message in result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr

    def test_a_port_in_use_fails_the_watch(self, tmp_path: Path) -> None:
        """An endpoint that cannot be bound ends ``ckpt watch`` with exit 1 and one error line."""
        import socket

        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            result = subprocess.run(
                [sys.executable, "-m", "ckpt", "--root", str(tmp_path), "watch", "--framework", "dcp",
                 "--attempt", ATTEMPT, "--epoch", "1", "--once", "--metrics-port", str(port)],
                capture_output=True, text=True, env=environment(), timeout=60, check=False,
            )  # fmt: skip
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith(f"ckpt: cannot serve metrics at 127.0.0.1:{port}: "), result.stderr
        assert len(result.stderr.splitlines()) == 1, result.stderr
