"""What the in-process integrations share: the job's settings, "publish on one rank after a barrier", resume.

Rules (docs/adr/0010-in-process-publish-policy.md says why):

1. Root, epoch and attempt come from explicit arguments, else the same sources as the CLI: ``CKPT_ROOT`` (or
   the configuration file's ``root``), ``DISPATCH_EPOCH``, ``DISPATCH_ATTEMPT``, the configuration file from
   ``config=`` or ``CKPT_CONFIG``. A missing or invalid one is an ``InvalidError`` when the integration is
   constructed, never at the first save hours later.
2. A save is published after a barrier that every rank reaches once its own part of the save is written,
   by exactly one process (the world's main process): one barrier and one entry creation per save (plus,
   on POSIX, the fsync of the save's files, which the frameworks do not do and the entry needs).
3. A failed publication is logged and retried before the next one; it never raises into the training loop
   (a raise on one rank while the others wait in the next collective hangs the job). What is still
   unpublished when the job dies is published by the next start's catch-up (``resume_location``) or by the
   sidecar. Only an ``InvalidError`` (a save outside the root: a configuration mistake that no retry mends)
   is raised.
4. The main process records the execution's epoch (``exec/<attempt>/.ckpt-epoch``) when the publisher is
   made, so that a later catch-up knows it even if this execution dies before its first publication, and
   beside it the run's world size (``exec/<attempt>/.ckpt-world-size``: the job's ``world_size``, from
   ``world_size=`` or ``WORLD_SIZE``, else ``torch.distributed``'s when initialised, else unknown and not
   recorded), so that a later catch-up and verified resolve judge its saves by the processes that wrote
   them (spec/layout.md §8.5). ``resume_location`` records both too, before its catch-up.
5. A job whose execution folder is too long for the longest name of the saves an integration makes there
   (``ckpt.domain.room``, spec/names.md §4.5) is an ``InvalidError`` when the integration is constructed
   (:meth:`Job.require_room`) and when ``resume_location`` is called, on every rank alike, before any save,
   epoch record, barrier or collective: raised later, on the main process only, it would leave the other
   ranks waiting in the next collective.
6. ``resume_location`` runs the catch-up and the verified resolve on the main process only and hands the
   answer to the other ranks when ``torch.distributed`` is initialised, so every rank resumes from the same
   save. This module never imports a framework: it looks at ``torch.distributed`` only if the program has
   already imported it.
7. Tiered mode (spec/tiered.md §9): ``durable=`` (else ``CKPT_DURABLE``) names a durable root, opened with
   the job's configuration and paired with the job's root (``ckpt.store.open_tiers``: the root must be a
   POSIX path, the durable root neither it nor inside it) when the job is opened: an ``InvalidError`` then,
   never at the first save. A missing root is then created (a new node, or one that lost its disk). The
   main process's publisher runs a ``BackgroundReplicator`` (``ckpt.integrations.replicator``), woken after
   each publication, and :meth:`Publisher.close` ends it; ``resume_location`` restores the durable root's
   newest verified save when it is newer than the root's own (spec/tiered.md §6), on the main process, and
   every rank gets its fast location. With ``CKPT_DURABLE_METRICS_PORT`` (and
   ``CKPT_DURABLE_METRICS_ADDRESS``, default 127.0.0.1; read only with a durable root, checked when the job
   is opened) that replicator serves the metrics of ``ckpt replicate --metrics-port`` (spec/tiered.md §9.6).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ckpt.application.rulebook import as_rule, find_rule
from ckpt.catchup import is_vanished_save
from ckpt.domain.catchup import execution_saves, parse_sub_folder
from ckpt.domain.entries import Entry, exec_save_prefix, parse_epoch, validate_attempt
from ckpt.domain.errors import CkptError, ExistsError, InvalidError, NotFoundError
from ckpt.domain.frameworks import Framework, parse_world_size, validate_world_size
from ckpt.domain.ports import SyncsSaves
from ckpt.domain.room import longest_name, require_room, require_rule_room

if TYPE_CHECKING:
    from ckpt.domain.ports import WatchStore
    from ckpt.domain.rules import Rule
    from ckpt.domain.tiered_ports import TransferSettings
    from ckpt.integrations.replicator import BackgroundReplicator
    from ckpt.store import Tiers

__all__ = [
    "Job",
    "Publisher",
    "distributed",
    "on_main_then_broadcast",
    "open_job",
    "resume_location",
]

_log = logging.getLogger("ckpt.integrations")


@attrs.frozen
class Job:
    """One execution of a training job: its store, epoch and attempt (the folder it saves into), and how
    many processes it runs (``None``: ask ``torch.distributed`` when recording, rule 4)."""

    store: WatchStore = attrs.field(eq=False)
    epoch: int
    attempt: str
    world_size: int | None = None
    tiers: Tiers | None = attrs.field(default=None, eq=False)  # with a durable root (rule 7)
    durable_metrics: tuple[str, int] | None = None  # the in-process replicator's metrics endpoint (rule 7)

    def run_world_size(self) -> int | None:
        """This run's world size (rule 4): ``world_size``, else ``torch.distributed``'s, else ``None``."""
        if self.world_size is not None:
            return self.world_size
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return validate_world_size(int(dist.get_world_size()))

    @property
    def saves_location(self) -> str:
        """``<root>/exec/<attempt>``: where the framework should save."""
        return self.store.exec_dir(self.attempt)

    def require_room(self, template: str, saves: str) -> None:
        """Refuse now (rule 5) an execution folder too long for the saves named ``template`` (``{step}`` for
        the step, ``checkpoint-{step}``) at the largest step; ``saves`` says whose they are, for the message.
        """
        folder = exec_save_prefix(self.attempt)
        require_room(folder, longest_name(template), what=f"attempt {self.attempt!r}", saves=saves)


def open_job(
    *,
    root: str | None = None,
    epoch: int | str | None = None,
    attempt: str | None = None,
    config: str | None = None,
    environ: Mapping[str, str] | None = None,
    store: WatchStore | None = None,
    world_size: int | None = None,
    durable: str | None = None,
    durable_max_bandwidth: int | str | None = None,
    durable_concurrency: int | None = None,
    durable_checksum: str | None = None,
) -> Job:
    """Gather the job's settings (rule 1) and open its store; ``InvalidError`` names what is missing.

    ``store`` replaces ``root``/``config`` (for tests with ``ckpt.testing.InMemoryStore``). ``world_size``
    (else ``WORLD_SIZE`` when set and non-empty) is this run's number of processes, recorded (rule 4).
    ``durable`` (else ``CKPT_DURABLE`` when set and non-empty) is the tiered mode's durable root, opened with
    the same configuration (rule 7); ``durable_max_bandwidth`` (bytes per second, an int or a rate such as
    ``"200M"``; else ``CKPT_DURABLE_MAX_BANDWIDTH``) and ``durable_concurrency`` (else
    ``CKPT_DURABLE_CONCURRENCY``) bound the replication, and ``durable_checksum`` (else
    ``CKPT_DURABLE_CHECKSUM``) names the S3 additional checksum of its uploads (spec/tiered.md §12);
    ``CKPT_DURABLE_METRICS_PORT`` and ``CKPT_DURABLE_METRICS_ADDRESS`` the replicator's metrics endpoint.
    """
    env = os.environ if environ is None else environ
    size = None if world_size is None else validate_world_size(world_size)
    if size is None and env.get("WORLD_SIZE"):
        try:
            size = parse_world_size(env["WORLD_SIZE"])
        except InvalidError as exc:
            raise InvalidError(f"WORLD_SIZE in the environment: {exc}") from exc
    if epoch is None:
        epoch = env.get("DISPATCH_EPOCH")
    if epoch is None:
        raise InvalidError("no epoch: pass epoch= or set DISPATCH_EPOCH")
    number = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else parse_epoch(str(epoch))
    parse_epoch(str(number))  # range check for an int given directly
    if attempt is None:
        attempt = env.get("DISPATCH_ATTEMPT")
    if attempt is None:
        raise InvalidError("no attempt: pass attempt= or set DISPATCH_ATTEMPT")
    validate_attempt(attempt)
    config_path = config or env.get("CKPT_CONFIG") or None
    loaded = None
    if config_path and (store is None or durable is not None or env.get("CKPT_DURABLE")):
        from ckpt.config import load_config

        loaded = load_config(config_path)
    if store is None:
        from ckpt.store import open_store

        root = root or env.get("CKPT_ROOT") or (loaded.root if loaded is not None else None)
        if not root:
            raise InvalidError(
                "no checkpoint root: pass root=, set CKPT_ROOT, or set root in the config file"
            )
        store = open_store(str(root), config=loaded, environ=env)
    tiers = None
    durable = durable if durable is not None else env.get("CKPT_DURABLE") or None
    if durable is not None:  # rule 7: checked now, not at the first save
        from ckpt.store import open_store, open_tiers

        if not durable:
            raise InvalidError("durable= is empty: give the durable root, or leave it out")
        limits = _limits(env, durable_max_bandwidth, durable_concurrency, durable_checksum)
        tiers = open_tiers(store, open_store(durable, config=loaded, environ=env), limits)
        from ckpt.adapters.posix.tiered import make_dirs

        make_dirs(tiers.fast.root)  # a new node, or one that lost its disk (spec/tiered.md §6.5)
        from ckpt.adapters.prometheus import parse_endpoint

        endpoint = parse_endpoint(
            env.get("CKPT_DURABLE_METRICS_PORT") or None,
            env.get("CKPT_DURABLE_METRICS_ADDRESS") or None,
            port_name="CKPT_DURABLE_METRICS_PORT",
            address_name="CKPT_DURABLE_METRICS_ADDRESS",
        )
        return Job(store, number, attempt, size, tiers, endpoint)
    return Job(store, number, attempt, size, tiers)


def _limits(
    env: Mapping[str, str], bandwidth: int | str | None, concurrency: int | None, checksum: str | None
) -> TransferSettings:
    """Rule 7: how the replication copies, from the arguments, else the environment."""
    from ckpt.domain.tiered_ports import TransferSettings, parse_checksum, parse_rate

    if checksum is None and env.get("CKPT_DURABLE_CHECKSUM"):
        checksum = parse_checksum(env["CKPT_DURABLE_CHECKSUM"], "CKPT_DURABLE_CHECKSUM")
    if bandwidth is None and env.get("CKPT_DURABLE_MAX_BANDWIDTH"):
        bandwidth = parse_rate(env["CKPT_DURABLE_MAX_BANDWIDTH"], "CKPT_DURABLE_MAX_BANDWIDTH")
    elif isinstance(bandwidth, str):
        bandwidth = parse_rate(bandwidth, "durable_max_bandwidth")
    if concurrency is None and env.get("CKPT_DURABLE_CONCURRENCY"):
        text = env["CKPT_DURABLE_CONCURRENCY"]
        if not (text.isascii() and text.isdigit()):
            raise InvalidError(f"CKPT_DURABLE_CONCURRENCY {text!r}: give an integer from 1 to 64")
        concurrency = int(text)
    return TransferSettings(8 if concurrency is None else concurrency, bandwidth, checksum or "CRC32")


def distributed() -> Any | None:
    """``torch.distributed`` when the program imported it and initialised a group of several processes."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist if dist.get_world_size() > 1 else None


def _default_barrier() -> None:
    dist = distributed()
    if dist is not None:
        dist.barrier()


def _default_is_main() -> bool:
    dist = distributed()
    return dist is None or dist.get_rank() == 0


@attrs.frozen
class _Pending:
    step: int
    location: str


class Publisher:
    """Publishes saves from inside the training script (rules 2-4).

    ``barrier`` is called on every rank before the main process publishes (default: ``torch.distributed``'s
    when a group of several processes is initialised, else nothing); ``is_main`` says whether this process
    publishes (default: rank 0, or the only process). ``on_published`` is called with each entry created.
    """

    def __init__(
        self,
        job: Job,
        *,
        is_main: bool | None = None,
        barrier: Callable[[], None] | None = None,
        on_published: Callable[[Entry], None] | None = None,
    ) -> None:
        self.job = job
        self.is_main = _default_is_main() if is_main is None else is_main
        self.barrier = _default_barrier if barrier is None else barrier
        self.on_published = on_published
        self.pending: list[_Pending] = []  # saves whose publication failed, retried first (rule 3)
        self._lock = threading.Lock()  # async saves publish from their executor's thread
        self.replicator: BackgroundReplicator | None = None
        if self.is_main:
            self._record_epoch()
            if job.tiers is not None:  # rule 7: the copy to the durable root runs in its own thread
                from ckpt.integrations.replicator import BackgroundReplicator

                self.replicator = BackgroundReplicator(job.tiers, metrics_endpoint=job.durable_metrics)

    def __repr__(self) -> str:
        return f"Publisher({self.job.store!r}, epoch={self.job.epoch}, attempt={self.job.attempt!r})"

    def _record_epoch(self) -> None:
        from ckpt.catchup import record_epoch, record_world_size

        try:
            record_epoch(self.job.store, self.job.attempt, self.job.epoch)
            size = self.job.run_world_size()
            if size is not None:
                record_world_size(self.job.store, self.job.attempt, size)
        except CkptError as exc:
            if isinstance(exc, InvalidError | NotFoundError):
                raise  # a configuration mistake (no such root): say so now, not at the first save
            _log.error(
                "cannot record the epoch of %s (catch-up will use its entries): %s", self.job.attempt, exc
            )

    def publish(self, step: int, location: str) -> Entry | None:
        """Wait for every rank (``barrier``), then publish ``location`` at ``step`` on the main process.

        Call it on every rank once its own part of the save is written. Returns the entry on the main process
        when the save is published (now or before), else ``None``.
        """
        self.barrier()
        if not self.is_main:
            return None
        return self.publish_now(step, location)

    def publish_now(self, step: int, location: str) -> Entry | None:
        """Publish without a barrier, for a caller that knows every rank is done (an async save's future)."""
        with self._lock:
            published = self._publish_pending(step, location)
        if self.replicator is not None:
            self.replicator.wake()  # rule 7: returns at once; the copy runs in the replicator's thread
        return published

    def close(self, *, drain: bool = True) -> tuple[Entry, ...]:
        """End the job's replication (rule 7): finish copying what is pending (``drain``), or stop after the
        file being copied; return the entries still not durable (each logged). Without a durable root, or
        on a process that does not publish, nothing to do. Call it on every rank when training ends."""
        if self.replicator is None:
            return ()
        return self.replicator.close(drain=drain)

    def _publish_pending(self, step: int, location: str) -> Entry | None:
        self.pending.append(_Pending(step, location))
        published: Entry | None = None
        while self.pending:
            item = self.pending[0]
            try:
                entry = self._publish_one(item)
            except CkptError as exc:
                if is_vanished_save(exc, item.location):  # deleted meanwhile (the framework's retention)
                    _log.warning("save vanished before it could be published: %s (%s)", item.location, exc)
                    self.pending.pop(0)
                    continue
                if isinstance(exc, InvalidError):
                    self.pending.pop(0)  # refused for good: raise it once, and let the next saves through
                    raise
                _log.error(  # an outage: keep it, retry before the next save
                    "could not publish %s (will retry at the next save; the next start catches it up): %s",
                    item.location,
                    exc,
                )
                return None
            self.pending.pop(0)
            if item.location == location:
                published = entry
        return published

    def _publish_one(self, item: _Pending) -> Entry:
        store = self.job.store
        if isinstance(store, SyncsSaves):
            store.sync_save(item.location)
        try:
            entry = store.publish(self.job.epoch, item.step, item.location)
        except ExistsError as exc:
            return exc.entry
        _log.info("published epoch %d step %d %s", entry.epoch, entry.step, store.location(entry))
        if self.on_published is not None:
            self.on_published(entry)
        return entry


def resume_location(
    framework: Framework | Rule | str,
    *,
    job: Job | None = None,
    settle: float | None = None,
    catch_up: bool = True,
    world_size: int | None = None,
    sub_folder: str = "",
    **settings: Any,
) -> str | None:
    """Where to resume from: catch up earlier executions, resolve verified; ``None`` on a first run.

    ``framework`` is a :class:`Framework`, a rule, or a rule's name (``find_rule``: any built-in rule or a
    plugin's; a configured rule is passed as the rule object). ``world_size`` is the number of processes
    that wrote the saves (``None``: unknown), given to the rule as ``ckpt.application.rulebook`` rule 5 says;
    it is rarely needed: a save in an execution folder that records its world size is judged by that record
    (rule 4), and a ``world_size`` that conflicts with a record is ``InvalidError``.
    ``settings`` are :func:`open_job`'s (``root``, ``epoch``, ``attempt``, ``config``, ``environ``,
    ``store``) unless ``job`` is given. ``sub_folder`` is where the saves lie inside the execution's folder
    (``"checkpoint"`` for ``exec/<attempt>/checkpoint``, torchtitan's ``checkpoint.folder``; the same
    sub-folder of every execution is caught up, ``ckpt.domain.catchup`` rule 7). With ``torch.distributed``
    initialised, only rank 0 reads and publishes, and every rank gets its answer (rule 6). An execution
    folder (with its sub-folder) too long for the framework's saves is refused first, on every rank (rule 5).
    """
    world = None if world_size is None else validate_world_size(world_size)
    rule = find_rule(framework, world_size=world) if isinstance(framework, str) else as_rule(framework, world)
    sub = parse_sub_folder(sub_folder)
    the_job = job if job is not None else open_job(**settings)
    where = f"attempt {the_job.attempt!r}" + (f" with saves sub-folder {sub!r}" if sub else "")
    require_rule_room(execution_saves(the_job.attempt, sub), rule, what=where)

    def compute() -> str | None:
        from ckpt.catchup import resume

        tiers = the_job.tiers
        resumed = resume(
            the_job.store,
            rule,
            attempt=the_job.attempt,
            epoch=the_job.epoch,
            settle=settle,
            catch_up_first=catch_up,
            run_world_size=the_job.run_world_size(),
            sub_folder=sub,
        )
        if tiers is None:
            return resumed.location
        from ckpt.application.replication import restore_newer

        outcome = restore_newer(
            tiers.fast, tiers.fast_files, tiers.durable, tiers.durable_files, rule, than=resumed.entry
        )
        for entry, reason in outcome.skipped:
            _log.warning("skipped %s: %s", tiers.durable.location(entry), reason)
        if outcome.entry is None:
            return resumed.location
        _log.info("restored %s from %s", outcome.location, tiers.durable.location(outcome.entry))
        return outcome.location

    return on_main_then_broadcast(compute)


def on_main_then_broadcast(compute: Callable[[], str | None]) -> str | None:
    """Run ``compute`` on rank 0 and hand its answer (or its failure) to every rank (rule 6).

    Without an initialised ``torch.distributed`` group of several processes, it simply runs ``compute``.
    """
    dist = distributed()
    if dist is not None and dist.get_rank() != 0:
        answer: list[object] = [None]
        dist.broadcast_object_list(answer, src=0)
        return _unpack(answer[0])
    try:
        outcome: object = compute()
    except Exception as exc:  # noqa: BLE001 - the other ranks must hear of it too; raised below
        outcome = exc
    if dist is not None:
        dist.broadcast_object_list(
            [outcome if not isinstance(outcome, Exception) else _Failed(str(outcome))], src=0
        )
    if isinstance(outcome, Exception):
        raise outcome
    return _unpack(outcome)


@attrs.frozen
class _Failed:
    message: str


def _unpack(value: object) -> str | None:
    if isinstance(value, _Failed):
        raise CkptError(f"resume failed on the main process: {value.message}")
    if value is None or isinstance(value, str):
        return value
    raise CkptError(f"resume: unexpected answer from the main process: {value!r}")
