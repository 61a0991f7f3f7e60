"""S3 under network faults: every store operation and the watcher's scan, through a fault-injecting proxy.

The store's client is the one ``make_s3_client`` builds from a ``Config``: its endpoint, ``http://s3-only-via-
proxy``, is a name only the proxy (tests/support/forward_proxy.py) resolves, to the S3 server on 127.0.0.1
(moto's, then Ceph RGW: ``s3_server``), and the ``[proxy]`` table (with proxy credentials) sends every request
through the proxy, whose rules inject the faults. A second client, straight to the server, arranges objects
and reads back what is durable.

The faults (``FAULTS``): the connection dropped before forwarding; dropped after forwarding (the storage
applied the request, the answer is lost); ``503 SlowDown``; ``500 InternalError``; ``500`` after forwarding
(applied, and the client is told it failed); a delay past the read timeout (the request lands after the
client gave up: a late write); the response body cut short.

What is proved:

* ``TestWritesUnderFaults``: publish, prune and the watcher's scan (hf and dcp), with the fault at each of
  their writing requests (and, for prune, at every request, since a prune stopped between its steps is the
  dangerous case). With retries (``max_attempts=3``) the operation ends as a fault-free run does, its effect
  durable (read back straight from moto); a conditional put whose answer was lost is this call's own
  create (its writer token, operations.md §2.6): publish returns the entry and the watcher reports the
  save as published by its scan. Without retries (``max_attempts=1``)
  a fault that took effect makes the operation fail with a clear ``ckpt`` error (a ``CkptError`` naming the
  ``s3://`` location, no secret, no botocore or urllib3 exception attached). Either way nothing is lost,
  duplicated or corrupted, prune never leaves an entry whose save lost an object, and running again
  converges to the fault-free end state.
* ``TestReadsUnderFaults``: entries, resolve, folders, read_file, exists and files answer exactly or fail
  clearly, and change nothing; a ``GetObject`` body cut short is read again by ``read_file`` itself.
* ``TestPersistentFaults``: every request faulted: the writing operations fail clearly, invariants hold.
* ``TestLostAnswerOnPublication``: the conditional put whose first attempt succeeded but whose answer was
  lost, spelled out, for ``publish`` and for the watcher (tests/test_s3_lost_replies.py has the rest).
* ``TestContract*ThroughFaults``: the store contract suite (tests/test_store_contract.py), run with every
  third request of the store faulted, passes unchanged.

Time is bounded: read timeout 0.75 s, delays of 1 s, at most three attempts; each sweep runs on fresh
buckets and waits for late requests to land before it judges.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

import test_store_contract as contract
from ckpt.adapters.s3 import S3Store, make_s3_client
from ckpt.application.watcher import Watcher
from ckpt.config import Config, S3Settings
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CkptError, ExistsError
from ckpt.domain.frameworks import Framework
from ckpt.domain.names import format_entry_name, parse_entry_names
from support.forward_proxy import (
    Delay,
    DropConnection,
    Exchange,
    ForwardProxy,
    Match,
    Rule,
    TruncateResponse,
    internal_error,
    slow_down,
)
from support.harness import Harness
from support.s3 import (
    REGION,
    RequestLog,
    S3Harness,
    isolate_from_aws_environment,
    new_bucket_name,
    raw_client,
)
from support.saves import put_save

# One label: moto's server takes the first label of a dotted host for a bucket name, so only a single-label
# host keeps path-style addressing; and no resolver knows it, so a request can only arrive through the proxy.
PROXIED_HOST = "s3-only-via-proxy"
ENDPOINT = f"http://{PROXIED_HOST}"
PROXY_USER = "ckpt-sidecar"
PROXY_PASSWORD = "proxy-password-never-shown"
# moto accepts any keys; these are distinctive so that a leak into a message would be found.
SECRET_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIAFAULTINJECTION",
    "AWS_SECRET_ACCESS_KEY": "secret-key-never-shown",
    "AWS_SESSION_TOKEN": "session-token-never-shown",
}
SECRETS = (PROXY_PASSWORD, SECRET_ENV["AWS_SECRET_ACCESS_KEY"], SECRET_ENV["AWS_SESSION_TOKEN"])
READ_TIMEOUT = 0.75
DELAY = 1.0  # past the read timeout: the client gives up, then the request reaches the storage
QUIET_SECONDS = 5.0  # the most a delayed request may take to land
ATTEMPT = "2.4102.0"
EPOCH = 3
WRITES = ("PUT", "POST", "DELETE")
# How the proxy records a request a fault took effect on (a delay is recorded as forwarded).
FAULTY_OUTCOMES = {"dropped", "dropped-after-forwarding", "replied", "replied-after-forwarding", "truncated"}


# -- faults --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A fault the proxy injects: ``rule(match)`` builds it for the requests ``match`` picks.

    ``lands``: the storage applies the request although the client sees a failure.
    """

    name: str
    rule: Callable[[Match], Rule]
    lands: bool = False

    def __str__(self) -> str:
        return self.name


DROPPED_BEFORE = Fault("drop-before-forwarding", lambda when: DropConnection(when=when))
DROPPED_AFTER = Fault(
    "drop-after-forwarding", lambda when: DropConnection(after_forwarding=True, when=when), lands=True
)
FAILED = Fault("500-internal-error", internal_error)
DELAYED = Fault("delay-past-read-timeout", lambda when: Delay(DELAY, when=when), lands=True)
TRUNCATED = Fault("truncated-response", lambda when: TruncateResponse(20, when=when))
FAULTS = [
    DROPPED_BEFORE,
    DROPPED_AFTER,
    Fault("503-slow-down", slow_down),
    FAILED,
    Fault("500-after-forwarding", lambda when: internal_error(when, after_forwarding=True), lands=True),
    DELAYED,
    TRUNCATED,
]
# One fault of each kind of consequence: not applied, applied with the answer lost, applied late.
DISTINCT_FAULTS = [DROPPED_BEFORE, DROPPED_AFTER, DELAYED]


def assert_clear_error(exc: BaseException, bucket: str) -> None:
    """``exc`` is one of ours, names the bucket, carries no secret and no vendor exception."""
    assert isinstance(exc, CkptError), f"not a ckpt error: {type(exc).__module__}.{type(exc).__name__}: {exc}"
    assert type(exc).__module__.startswith("ckpt."), type(exc)
    text = f"{exc} {exc!r}"
    assert f"s3://{bucket}" in text, text
    for secret in SECRETS:
        assert secret not in text, text
    chained: BaseException | None = exc
    while chained is not None:
        assert not type(chained).__module__.startswith(("botocore", "urllib3", "http.client")), chained
        chained = chained.__cause__ or chained.__context__


# -- the world of one run: a fresh bucket, the faulty store, a clean reader ------------------------------


class World:
    """A fresh bucket: ``store`` reaches it through the proxy; ``raw`` goes straight to moto."""

    def __init__(self, raw: Any, client: Any) -> None:
        self.raw = raw
        self.bucket = new_bucket_name()
        raw.create_bucket(Bucket=self.bucket)
        self.store = S3Store(f"s3://{self.bucket}", client)

    def put(self, key: str, data: bytes = b"") -> None:
        self.raw.put_object(Bucket=self.bucket, Key=key, Body=data)

    def make_save(self, save: str, files: dict[str, bytes]) -> str:
        put_save(self.raw, self.bucket, save, files)
        return f"{self.store.root}/{save}"

    def publish_raw(self, *entries: Entry) -> None:
        for entry in entries:
            self.put(f"pub/{format_entry_name(entry)}")

    def snapshot(self) -> Snapshot:
        """Every object in the bucket with its size, read straight from moto in one listing."""
        answer = self.raw.list_objects_v2(Bucket=self.bucket)
        assert not answer.get("IsTruncated")
        return Snapshot({obj["Key"]: obj["Size"] for obj in answer.get("Contents", ())})


@dataclass(frozen=True)
class Snapshot:
    """What the bucket durably holds."""

    sizes: dict[str, int]

    def entries(self) -> list[Entry]:
        """The entries, each an empty object whose name parses (nothing corrupted)."""
        names = {key[len("pub/") :]: size for key, size in self.sizes.items() if key.startswith("pub/")}
        assert all(size == 0 for size in names.values()), names
        return parse_entry_names(list(names))

    def save(self, save: str) -> dict[str, int]:
        prefix = save + "/"
        return {key[len(prefix) :]: size for key, size in self.sizes.items() if key.startswith(prefix)}

    def assert_whole(self, save: str, files: dict[str, bytes]) -> None:
        assert self.save(save) == {name: len(data) for name, data in files.items()}, save


# -- the writing operations, each with what success means and what a failure may leave --------------------


class Scenario(abc.ABC):
    """One operation on a fresh world: arrange it, run it, judge the outcome, recover, check the end state.

    ``judge`` gets the result, or the ``CkptError`` the operation raised (already checked to be a clear
    error), and whether a fault that lands hit a put.
    """

    name = "?"
    every_request = False  # sweep every request, not only the writing ones

    def arrange(self, world: World) -> None:  # noqa: B027 - optional hook: most scenarios start empty
        """Put the objects and entries the operation starts from."""

    @abc.abstractmethod
    def run(self, world: World) -> Any:
        """Run the operation through the faulty store."""

    @abc.abstractmethod
    def judge(self, world: World, outcome: Any, *, landed_put: bool) -> None:
        """Check the outcome and the durable state right after the run."""

    @abc.abstractmethod
    def recover(self, world: World) -> None:
        """Run again with no fault and check that the end state is what a fault-free run gives."""


class Publish(Scenario):
    """Publish one save at (7, 5)."""

    name = "publish"
    save = "exec/a/checkpoint-5"
    files: ClassVar = {"model.bin": b"w" * 300}
    entry = Entry(7, 5, "exec/a/checkpoint-5")

    def arrange(self, world: World) -> None:
        self.location = world.make_save(self.save, self.files)

    def run(self, world: World) -> Any:
        return world.store.publish(7, 5, self.location)

    def judge(self, world: World, outcome: Any, *, landed_put: bool) -> None:
        snapshot = world.snapshot()
        # Every world starts empty: an ExistsError could only be this call meeting its own create.
        assert not isinstance(outcome, ExistsError), outcome
        if isinstance(outcome, CkptError):  # the entry is there only if a put of ours landed
            assert snapshot.entries() in ([], [self.entry])
        else:
            assert outcome == self.entry
            assert snapshot.entries() == [self.entry]
        snapshot.assert_whole(self.save, self.files)

    def recover(self, world: World) -> None:
        try:
            again: Any = world.store.publish(7, 5, self.location)
        except ExistsError as exc:
            again = exc.entry
        assert again == self.entry
        snapshot = world.snapshot()
        assert snapshot.entries() == [self.entry]
        snapshot.assert_whole(self.save, self.files)


class Prune(Scenario):
    """keep=2 over four entries: folder ck-2 goes; ck-1 stays (a kept entry names it), ck-3 stays."""

    name = "prune"
    every_request = True
    saves: ClassVar = {f"exec/a/ck-{n}": {"model.bin": b"w" * (100 + n)} for n in (1, 2, 3)}
    entries = (Entry(1, 1, "exec/a/ck-1"), Entry(1, 2, "exec/a/ck-2"), Entry(1, 3, "exec/a/ck-3"))
    entries += (Entry(2, 1, "exec/a/ck-1"),)
    kept = (Entry(1, 3, "exec/a/ck-3"), Entry(2, 1, "exec/a/ck-1"))
    removed = (Entry(1, 1, "exec/a/ck-1"), Entry(1, 2, "exec/a/ck-2"))

    def arrange(self, world: World) -> None:
        for save, files in self.saves.items():
            world.make_save(save, files)
        world.publish_raw(*self.entries)

    def run(self, world: World) -> Any:
        return world.store.prune(2)

    def check_remaining(self, snapshot: Snapshot) -> list[Entry]:
        """Every remaining entry's save is whole, and the two greatest entries always remain."""
        remaining = snapshot.entries()
        assert set(self.kept) <= set(remaining) <= set(self.entries), remaining
        for entry in remaining:
            snapshot.assert_whole(entry.save, self.saves[entry.save])
        return remaining

    def judge(self, world: World, outcome: Any, *, landed_put: bool) -> None:
        snapshot = world.snapshot()
        remaining = self.check_remaining(snapshot)
        if isinstance(outcome, CkptError):
            return
        assert outcome.removed_entries == self.removed
        assert outcome.removed_folders == (world.store.location(self.removed[1]),)
        assert outcome.skipped == ()
        assert remaining == list(self.kept)
        assert snapshot.save("exec/a/ck-2") == {}

    def recover(self, world: World) -> None:
        world.store.prune(2)
        # A prune stopped after removing entries left its journal: the next prune removes the folders it
        # planned, so a failed prune leaks nothing (and loses nothing).
        snapshot = world.snapshot()
        assert self.check_remaining(snapshot) == list(self.kept)
        assert snapshot.save("exec/a/ck-2") == {}
        assert [key for key in snapshot.sizes if ".ckpt-prune-" in key] == []


class Scan(Scenario):
    """A watcher's scan over one (or two) complete saves and an incomplete one; epoch 3, settle 0."""

    def __init__(self, framework: Framework, complete_saves: int = 1) -> None:
        self.framework = framework
        self.name = f"scan-{framework}"
        if framework is Framework.HF:
            self.saves = {
                "checkpoint-10": {"trainer_state.json": b'{"global_step": 10}'},
                "checkpoint-20": {"trainer_state.json": b'{"global_step": 20}'},
                "checkpoint-30": {"trainer_state.json": b'{"global_st'},
            }
        else:
            self.saves = {
                "step-1": {".metadata": b"m"},
                "step-2": {".metadata": b"m"},
                "step-3": {"__0": b"s"},
            }
        if complete_saves == 1:
            del self.saves[list(self.saves)[1]]
        folders = list(self.saves)[:complete_saves]
        self.expected = [Entry(EPOCH, int(f.rsplit("-", 1)[1]), f"exec/{ATTEMPT}/{f}") for f in folders]

    def watcher(self, world: World) -> Watcher:
        return Watcher(world.store, self.framework, world.store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0)

    def arrange(self, world: World) -> None:
        for folder, files in self.saves.items():
            world.make_save(f"exec/{ATTEMPT}/{folder}", files)
        self.scanner = self.watcher(world)

    def run(self, world: World) -> Any:
        return self.scanner.scan()

    def judge(self, world: World, outcome: Any, *, landed_put: bool) -> None:
        durable = world.snapshot().entries()
        assert set(durable) <= set(self.expected), durable  # nothing incomplete, nothing at another epoch
        if isinstance(outcome, CkptError):
            return
        assert durable == self.expected
        assert outcome == self.expected  # a save whose put lost its answer is this scan's too

    def recover(self, world: World) -> None:
        # The same watcher scans again (it keeps what it published before an error); then a fresh one.
        self.scanner.scan()
        assert world.snapshot().entries() == self.expected
        assert (self.scanner.scan(), self.watcher(world).scan()) == ([], [])
        assert world.snapshot().entries() == self.expected


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "publish": Publish,
    "prune": Prune,
    "scan-hf": lambda: Scan(Framework.HF),
    "scan-dcp": lambda: Scan(Framework.DCP),
}


# -- the proxy, the clients, and running one faulted operation --------------------------------------------


@dataclass
class Rig:
    """The proxy in front of moto, a client straight to moto, and the faulty clients by name."""

    proxy: ForwardProxy
    raw: Any
    make: Callable[[int], Any]
    clients: dict[str, tuple[Any, RequestLog]] = field(default_factory=dict)
    sent: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def client(self, key: str, attempts: int) -> tuple[Any, RequestLog]:
        """A faulty client (one per key, so each has its own retry quota) and its request log."""
        if key not in self.clients:
            client = self.make(attempts)
            self.clients[key] = (client, RequestLog(client))
        return self.clients[key]

    def wait_until_quiet(self, log: RequestLog) -> None:
        """Wait until the proxy has finished every request the client sent (late ones have landed)."""
        deadline = time.monotonic() + QUIET_SECONDS
        while len(self.proxy.requests) < len(log.sent):
            assert time.monotonic() < deadline, "a delayed request never landed"
            time.sleep(0.02)

    def requests_of(self, operation: str) -> list[tuple[str, str]]:
        """The (method, path) of every request ``operation`` sends when nothing fails (run once)."""
        if operation not in self.sent:
            client, _log = self.client("dry-run", 1)
            world = World(self.raw, client)
            scenario = SCENARIOS[operation]()
            scenario.arrange(world)
            self.proxy.clear()
            scenario.run(world)
            self.sent[operation] = [
                (r.method, r.path.replace(world.bucket, "B")) for r in self.proxy.requests
            ]
        return self.sent[operation]

    def run(self, client: Any, log: RequestLog, scenario: Scenario, fault: Fault, match: Match) -> Run:
        """Arrange ``scenario`` on a fresh bucket, run it with the fault, wait for late requests to land."""
        world = World(self.raw, client)
        scenario.arrange(world)
        self.proxy.clear()
        log.clear()
        self.proxy.rules[:] = [fault.rule(match)]
        try:
            outcome = scenario.run(world)
        except Exception as exc:
            assert_clear_error(exc, world.bucket)
            outcome = exc
        finally:
            self.proxy.rules.clear()
        assert match.hits >= 1, f"the fault never fired ({scenario.name}: {self.proxy.requests})"
        self.wait_until_quiet(log)
        recorded = self.proxy.requests
        took_effect = fault is DELAYED or any(r.outcome in FAULTY_OUTCOMES for r in recorded)
        return Run(world, outcome, took_effect)


@dataclass(frozen=True)
class Run:
    """One faulted run: its world, its outcome (result or error), and whether the fault changed anything."""

    world: World
    outcome: Any
    took_effect: bool

    @property
    def failed(self) -> bool:
        return isinstance(self.outcome, CkptError)


def only_through_the_proxy(client: Any) -> Any:
    """Make ``client`` refuse any request to a host other than the one only the proxy resolves."""

    def guard(request: Any, **_: Any) -> None:
        assert request.url.startswith(f"{ENDPOINT}/"), f"a faulty client tried to reach {request.url}"

    client.meta.events.register_last("before-send", guard)
    return client


@pytest.fixture(scope="module")
def rig(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """moto behind the recording proxy (with proxy credentials), for the whole module."""
    port = int(s3_server.rsplit(":", 1)[1])
    resolve = {PROXIED_HOST: ("127.0.0.1", port)}
    with ForwardProxy(resolve=resolve, credentials=(PROXY_USER, PROXY_PASSWORD)) as proxy:

        def make(attempts: int) -> Any:
            settings = S3Settings(
                endpoint_url=ENDPOINT,
                region=REGION,
                addressing_style="path",
                connect_timeout=1.0,
                read_timeout=READ_TIMEOUT,
                max_attempts=attempts,
            )
            config = Config(
                s3=settings,
                proxy={"http_proxy": proxy.url_with(PROXY_USER, PROXY_PASSWORD)},
                credentials=({"source": "env"},),
            )
            with pytest.MonkeyPatch.context() as monkeypatch:
                isolate_from_aws_environment(monkeypatch, tmp_path_factory.mktemp("aws-home"))
                return only_through_the_proxy(make_s3_client(config, environ=SECRET_ENV))

        yield Rig(proxy, raw_client(s3_server), make)


@pytest.fixture
def quiet_rig(rig: Rig) -> Iterator[Rig]:
    """The rig with no rule left over and an empty record, before and after the test."""
    rig.proxy.rules.clear()
    rig.proxy.clear()
    yield rig
    rig.proxy.rules.clear()


def sweep_targets(rig: Rig, operation: str, *, every_request: bool) -> list[tuple[int, str]]:
    """The 1-based positions (and what they are) of the requests of ``operation`` to fault in turn."""
    sent = rig.requests_of(operation)
    return [(k, f"{m} {p}") for k, (m, p) in enumerate(sent, 1) if every_request or m in WRITES]


class TestWritesUnderFaults:
    @pytest.mark.parametrize("fault", FAULTS, ids=str)
    @pytest.mark.parametrize("operation", sorted(SCENARIOS))
    def test_with_retries_the_outcome_is_the_fault_free_one_and_durable(
        self, quiet_rig: Rig, operation: str, fault: Fault
    ) -> None:
        """With three attempts, a fault at any writing request still ends as a fault-free run does."""
        client, log = quiet_rig.client(f"retrying-{fault}", 3)
        for k, request in sweep_targets(quiet_rig, operation, every_request=False):
            scenario = SCENARIOS[operation]()
            run = quiet_rig.run(client, log, scenario, fault, Match(skip=k - 1, times=1))
            landed_put = fault.lands and request.startswith("PUT")
            # A put that landed with its answer lost is this call's create (operations.md §2.6): no failure.
            assert not run.failed, (operation, k, request, run.outcome)
            scenario.judge(run.world, run.outcome, landed_put=landed_put)
            scenario.recover(run.world)

    # On moto's server alone: this sweep proves the client's error translation and that a rerun converges,
    # which the server does not change; with retries (above) runs on RGW too (docs/s3-servers.md §2).
    @pytest.mark.parametrize("s3_server", ["moto"], indirect=True)
    @pytest.mark.parametrize("fault", FAULTS, ids=str)
    @pytest.mark.parametrize("operation", sorted(SCENARIOS))
    def test_without_retries_a_fault_is_a_clear_error_and_running_again_converges(
        self, quiet_rig: Rig, operation: str, fault: Fault
    ) -> None:
        """With one attempt, a fault that took effect is a clear ckpt error; nothing breaks; a rerun heals."""
        client, log = quiet_rig.client("single", 1)
        every_request = SCENARIOS[operation]().every_request and fault in DISTINCT_FAULTS
        for k, request in sweep_targets(quiet_rig, operation, every_request=every_request):
            scenario = SCENARIOS[operation]()
            run = quiet_rig.run(client, log, scenario, fault, Match(skip=k - 1, times=1))
            assert run.failed == run.took_effect, (operation, k, request, run.outcome)
            assert not isinstance(run.outcome, ExistsError), (operation, k, request)
            scenario.judge(run.world, run.outcome, landed_put=fault.lands and request.startswith("PUT"))
            scenario.recover(run.world)


# -- reads: one shared arrangement, since a read changes nothing -----------------------------------------

READ_SAVE = "exec/a/checkpoint-5"
READS: dict[str, Callable[[S3Store], Any]] = {
    "entries": lambda store: store.entries(),
    "resolve": lambda store: store.resolve(),
    "folders": lambda store: store.folders(f"{store.root}/exec/a"),
    "read_file": lambda store: store.read_file(f"{store.root}/{READ_SAVE}", "trainer_state.json"),
    "exists": lambda store: store.exists(f"{store.root}/{READ_SAVE}", "trainer_state.json"),
    "files": lambda store: store.files(f"{store.root}/{READ_SAVE}"),
}


@dataclass(frozen=True)
class ReadWorld:
    """A bucket arranged once for every read test, and each read's fault-free answer."""

    bucket: str
    entries: list[Entry]
    expected: dict[str, Any]


@pytest.fixture(scope="module")
def read_world(rig: Rig) -> ReadWorld:
    """A bucket with two saves and two entries, arranged once (a read changes nothing)."""
    client, _log = rig.client("dry-run", 1)
    world = World(rig.raw, client)
    files = {"model.bin": b"w" * 3000, "trainer_state.json": b'{"global_step": 5}' * 20}
    world.make_save(READ_SAVE, files)
    world.make_save("exec/a/checkpoint-6", files)
    world.publish_raw(Entry(1, 5, READ_SAVE), Entry(2, 6, "exec/a/checkpoint-6"))
    clean = S3Store(f"s3://{world.bucket}", rig.raw)
    expected = {name: read(clean) for name, read in READS.items()}
    return ReadWorld(world.bucket, world.snapshot().entries(), expected)


class TestReadsUnderFaults:
    @pytest.mark.parametrize("attempts", [1, 3], ids=["without-retries", "with-retries"])
    @pytest.mark.parametrize("fault", FAULTS, ids=str)
    def test_every_read_answers_exactly_or_fails_clearly_and_changes_nothing(
        self, quiet_rig: Rig, read_world: ReadWorld, fault: Fault, attempts: int
    ) -> None:
        """Each read under the fault gives the fault-free answer, or (one attempt) a clear ckpt error."""
        client, log = quiet_rig.client(f"reads-{attempts}", attempts)
        store = S3Store(f"s3://{read_world.bucket}", client)
        for name, read in READS.items():
            match = Match(times=1)
            quiet_rig.proxy.clear()
            log.clear()
            quiet_rig.proxy.rules[:] = [fault.rule(match)]
            try:
                outcome = read(store)
            except Exception as exc:
                assert_clear_error(exc, read_world.bucket)
                outcome = exc
            finally:
                quiet_rig.proxy.rules.clear()
            quiet_rig.wait_until_quiet(log)
            recorded = quiet_rig.proxy.requests
            took_effect = fault is DELAYED or any(r.outcome in FAULTY_OUTCOMES for r in recorded)
            # read_file reads a cut body again itself: botocore cannot retry a body it already handed over.
            heals_itself = attempts > 1 or (name == "read_file" and fault is TRUNCATED)
            failed = isinstance(outcome, CkptError)
            assert (match.hits, failed) == (1, took_effect and not heals_itself), (name, outcome)
            assert {r.method for r in recorded} <= {"GET", "HEAD"}, name  # a read writes nothing
            if failed:
                outcome = read(store)  # the client is not left broken
            assert outcome == read_world.expected[name], name
        assert S3Store(f"s3://{read_world.bucket}", quiet_rig.raw).entries() == read_world.entries


class TestPersistentFaults:
    @pytest.mark.parametrize("fault", [FAILED, DROPPED_AFTER, DELAYED], ids=str)
    @pytest.mark.parametrize("operation", sorted(SCENARIOS))
    def test_a_storage_failing_every_request_is_a_clear_error_and_breaks_nothing(
        self, quiet_rig: Rig, operation: str, fault: Fault
    ) -> None:
        """When every request fails, the operation raises a clear error after two attempts; state is sound."""
        client, log = quiet_rig.client(f"persistent-{fault}", 2)
        scenario = SCENARIOS[operation]()
        run = quiet_rig.run(client, log, scenario, fault, Match())
        assert run.failed, run.outcome
        assert not isinstance(run.outcome, ExistsError), run.outcome  # its 412 answers are lost too
        scenario.judge(run.world, run.outcome, landed_put=fault.lands)
        scenario.recover(run.world)


class TestLostAnswerOnPublication:
    def test_a_put_that_landed_but_lost_its_answer_is_this_publish(self, quiet_rig: Rig) -> None:
        """Drop-after-forwarding on the entry's PutObject: the retry meets 412, the HeadObject finds this
        publish's writer token, and publish returns the entry; one entry."""
        client, log = quiet_rig.client("retrying-lost-answer", 3)
        drop_after = Fault("drop-after", lambda when: DropConnection(after_forwarding=True, when=when))
        run = quiet_rig.run(client, log, Publish(), drop_after, Match(method="PUT", times=1))
        assert run.outcome == Publish.entry
        assert run.world.snapshot().entries() == [Publish.entry]
        writes = [(r.method, r.outcome) for r in quiet_rig.proxy.requests if "/pub/" in r.path]
        # the retry met the first put's entry (412), and one HeadObject told whose it was
        assert writes == [("PUT", "dropped-after-forwarding"), ("PUT", "forwarded"), ("HEAD", "forwarded")]

    def test_the_watcher_counts_that_save_as_published_and_never_republishes_it(self, quiet_rig: Rig) -> None:
        """A scan whose put lost its answer reports that save as published by it; later scans, and a new
        watcher, send no put."""
        client, log = quiet_rig.client("retrying-lost-answer", 3)
        drop_after = Fault("drop-after", lambda when: DropConnection(after_forwarding=True, when=when))
        scenario = Scan(Framework.DCP, complete_saves=2)
        run = quiet_rig.run(client, log, scenario, drop_after, Match(method="PUT", times=1))
        assert run.outcome == scenario.expected  # the first save is this scan's, its answer lost or not
        assert run.world.snapshot().entries() == scenario.expected
        quiet_rig.proxy.clear()
        assert (scenario.scanner.scan(), scenario.watcher(run.world).scan()) == ([], [])
        assert [r for r in quiet_rig.proxy.requests if r.method == "PUT"] == []
        assert run.world.snapshot().entries() == scenario.expected


class TestFaultRules:
    def test_match_picks_the_kth_request_or_every_nth(self) -> None:
        """Match(skip=k-1, times=1) takes only the k-th matching request; Match(every=3) every third."""
        exchanges = [Exchange("GET", PROXIED_HOST, 80, f"/b/{i}", []) for i in range(1, 10)]
        kth, third = Match(skip=3, times=1), Match(every=3)
        assert [e.path for e in exchanges if kth.take(e)] == ["/b/4"]
        assert [e.path for e in exchanges if third.take(e)] == ["/b/3", "/b/6", "/b/9"]
        assert (kth.seen, kth.hits, third.hits) == (4, 1, 3)

    def test_an_error_after_forwarding_reaches_the_storage(self, quiet_rig: Rig) -> None:
        """internal_error(after_forwarding=True): the object is stored, yet the client is answered 500."""
        client, _log = quiet_rig.client("single", 1)
        bucket = new_bucket_name()
        quiet_rig.raw.create_bucket(Bucket=bucket)
        quiet_rig.proxy.rules[:] = [internal_error(Match(method="PUT"), after_forwarding=True)]
        with pytest.raises(Exception, match="InternalError"):
            client.put_object(Bucket=bucket, Key="k", Body=b"landed")
        assert quiet_rig.raw.get_object(Bucket=bucket, Key="k")["Body"].read() == b"landed"
        assert [r.outcome for r in quiet_rig.proxy.requests] == ["replied-after-forwarding"]


# -- the contract suite with every third request faulted ---------------------------------------------------


class CyclingFaults:
    """Every ``every``-th request gets the next fault of a cycle, puts included: a conditional put that
    lands but loses its answer is the call's own create (operations.md §2.6), so the contract holds."""

    CYCLE = ("drop-before", "500", "truncate", "drop-after", "500-after")

    def __init__(self, every: int) -> None:
        self.every = every
        self.seen = 0
        self.fired: list[str] = []

    def apply(self, exchange: Exchange) -> None:
        self.seen += 1
        if self.seen % self.every:
            return
        fault = self.CYCLE[len(self.fired) % len(self.CYCLE)]
        self.fired.append(fault)
        rules: dict[str, Rule] = {
            "drop-before": DropConnection(),
            "500": internal_error(),
            "truncate": TruncateResponse(20),
            "drop-after": DropConnection(after_forwarding=True),
            "500-after": internal_error(after_forwarding=True),
        }
        rules[fault].apply(exchange)


@pytest.fixture
def harness(rig: Rig) -> Iterator[Harness]:
    """The contract suite's harness: a fresh bucket, its store reached through the proxy, faults cycling."""
    client, log = rig.client("contract", 3)
    store = S3Store(f"s3://{new_bucket_name()}", client)
    rig.raw.create_bucket(Bucket=store.bucket)
    rig.proxy.rules[:] = [CyclingFaults(every=3)]
    log.clear()
    rig.proxy.clear()
    try:
        yield S3Harness("s3-through-faults", store, client, rig.raw)
    finally:
        rig.proxy.rules.clear()
    rig.wait_until_quiet(log)


class TestContractPublishThroughFaults(contract.TestPublish):
    """The publish contract, with every third request of the store faulted."""


class TestContractEntriesAndResolveThroughFaults(contract.TestEntriesAndResolve):
    """The entries and resolve contract, with every third request of the store faulted."""


class TestContractPruneThroughFaults(contract.TestPrune):
    """The prune contract, with every third request of the store faulted."""


class TestContractWatchPortThroughFaults(contract.TestWatchPort):
    """The watcher port's contract (folders, read_file, exists, files), with every third request faulted."""
