"""Replication to an S3 durable root under network faults (spec/tiered.md §2.6, §5): one pass of
``replicate`` whose durable store reaches the server only through the fault-injecting proxy of
tests/test_s3_faults.py, with a fault at each of its requests in turn.

What is proved, for a fast save of three files published at (5, 100):

* With retries (three attempts) every fault (not applied, applied with its answer lost, applied late) at
  any request of the pass ends as a fault-free pass does: the entry published once on the durable root,
  the save whole and verifying against its manifest, digests included (on moto's server; on Ceph RGW the
  answer lost after the server applied the request, the fault whose handling the server's answers shape).
* Without retries (moto's server: what is proved is the client's handling) the pass may fail, clearly (a
  ``ckpt`` error naming the ``s3://`` location, no secret); after it no durable entry names a save that
  does not verify, and the next pass, without faults, finishes it: one entry, a verified save.
* An upload whose body is changed on the way (one byte, after the client computed its checksums) is never
  published: Ceph RGW refuses it (its signed payload hash); moto 5 stores it, ignoring the CRC32 the
  upload carries, and the replicator finds it by the ETag the server computed (ckpt.adapters.s3.durable
  rule 2), fails the pass naming the file, and the next pass uploads it again rather than trusting the
  changed object's recorded SHA-256: then the copy verifies, digests included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.posix.tiered import PosixTierFiles
from ckpt.adapters.s3 import S3Store
from ckpt.application.replication import Replicated, manifest_problem, replicate
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CkptError
from ckpt.domain.manifest import MANIFEST_NAME
from ckpt.store import open_tiers, tier_files
from support.forward_proxy import Exchange, Match
from support.s3 import new_bucket_name
from test_s3_faults import (  # the proxy rig, its fixtures and its faults: one home for them
    DISTINCT_FAULTS,
    DROPPED_AFTER,
    DROPPED_BEFORE,
    Fault,
    Rig,
    assert_clear_error,
    quiet_rig,
    rig,
)

__all__ = ["quiet_rig", "rig"]  # fixtures, used by name

SAVE = "exec/a/checkpoint-100"
ENTRY = Entry(5, 100, SAVE)
FILES = {
    "model.safetensors": bytes(range(256)) * 40,
    "sub/shard.bin": b"shard of 100" * 50,
    "trainer_state.json": b'{"global_step": 100}',
}


def fast_root(tmp_path: Path) -> PosixStore:
    root = tmp_path / "fast"
    for name, data in FILES.items():
        path = root / SAVE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    store = PosixStore(str(root))
    store.publish(ENTRY.epoch, ENTRY.step, store.location(ENTRY))
    return store


@dataclass
class Durable:
    """A fresh bucket: ``store`` reaches it through ``client`` (the proxy), ``raw`` straight."""

    raw: Any
    bucket: str
    store: S3Store

    @classmethod
    def make(cls, rig: Rig, client: Any) -> Durable:
        bucket = new_bucket_name()
        rig.raw.create_bucket(Bucket=bucket)
        return cls(rig.raw, bucket, S3Store(f"s3://{bucket}", client))

    def verified_entries(self) -> list[Entry]:
        """The durable entries, read straight from the server; each one's save verifies, digests too."""
        straight = S3Store(f"s3://{self.bucket}", self.raw)
        found = straight.entries()
        files = tier_files(straight)
        for entry in found:
            problem = manifest_problem(files, entry.save, digests=True)
            assert not isinstance(problem, str), (entry, problem)
        return found


def one_pass(fast: PosixStore, durable: Durable) -> Replicated | CkptError:
    tiers = open_tiers(fast, durable.store)
    try:
        return replicate(tiers.fast, PosixTierFiles(fast.root), tiers.durable, tiers.durable_files)
    except CkptError as exc:
        return exc


def faulted_pass(rig: Rig, client: Any, log: Any, fast: PosixStore, fault: Fault, k: int) -> Any:
    durable = Durable.make(rig, client)
    rig.proxy.clear()
    log.clear()
    match = Match(skip=k - 1, times=1)
    rig.proxy.rules[:] = [fault.rule(match)]
    try:
        outcome = one_pass(fast, durable)
    finally:
        rig.proxy.rules.clear()
    assert match.hits == 1, f"the fault never fired at request {k}"
    rig.wait_until_quiet(log)
    return durable, outcome


def pass_requests(rig: Rig, fast: PosixStore) -> list[str]:
    """The requests a fault-free pass sends, in order (method and path)."""
    client, _ = rig.client("tiered-dry-run", 1)
    durable = Durable.make(rig, client)
    rig.proxy.clear()
    outcome = one_pass(fast, durable)
    assert isinstance(outcome, Replicated)
    assert outcome.published == (ENTRY,)
    return [f"{r.method} {r.path.replace(durable.bucket, 'B')}" for r in rig.proxy.requests]


@pytest.fixture(scope="module")
def sent(rig: Rig, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return pass_requests(rig, fast_root(tmp_path_factory.mktemp("dry")))


class TestReplicationUnderFaults:
    def test_a_fault_free_pass_is_these_requests(self, sent: list[str]) -> None:
        """The sweep below covers every one: list the log, list the durable save (once, not a head per
        file), a put per file (verified by the ETag its answer carries: no head), the manifest, the save's
        check and the exclusive create of the entry."""
        save = "exec%2Fa%2Fcheckpoint-100%2F"
        assert sent[:2] == [
            "GET /B?list-type=2&prefix=pub%2F&max-keys=1000&delimiter=%2F&encoding-type=url",
            f"GET /B?list-type=2&prefix={save}&max-keys=1000&encoding-type=url",
        ]
        assert sorted(sent[2 : 2 + len(FILES)]) == [f"PUT /B/{SAVE}/{name}" for name in sorted(FILES)]
        assert sent[2 + len(FILES)] == f"PUT /B/{SAVE}/{MANIFEST_NAME}"
        assert sent[-2] == f"GET /B?list-type=2&prefix={save}&max-keys=1&encoding-type=url"
        assert sent[-1].startswith("PUT /B/pub/00000000000000000005-00000000000000000100-")
        assert len(sent) == len(FILES) + 5

    @pytest.mark.parametrize(
        ("s3_server", "fault"),
        [*(("moto", fault) for fault in DISTINCT_FAULTS), ("rgw", DROPPED_AFTER)],
        ids=str,
        indirect=["s3_server"],
    )
    def test_with_retries_every_fault_ends_as_a_fault_free_pass(
        self, quiet_rig: Rig, sent: list[str], fault: Fault, tmp_path: Path
    ) -> None:
        fast = fast_root(tmp_path)
        client, log = quiet_rig.client(f"tiered-retrying-{fault}", 3)
        for k, request in enumerate(sent, 1):
            durable, outcome = faulted_pass(quiet_rig, client, log, fast, fault, k)
            assert isinstance(outcome, Replicated), (k, request, outcome)
            assert (outcome.failure, outcome.published) == (None, (ENTRY,)), (k, request)
            assert durable.verified_entries() == [ENTRY], (k, request)

    @pytest.mark.parametrize("s3_server", ["moto"], indirect=True)
    @pytest.mark.parametrize("fault", [DROPPED_BEFORE, DROPPED_AFTER], ids=str)
    def test_without_retries_a_failed_pass_is_clear_and_the_next_one_finishes(
        self, quiet_rig: Rig, sent: list[str], fault: Fault, tmp_path: Path
    ) -> None:
        fast = fast_root(tmp_path)
        client, log = quiet_rig.client(f"tiered-once-{fault}", 1)
        for k, request in enumerate(sent, 1):
            durable, outcome = faulted_pass(quiet_rig, client, log, fast, fault, k)
            if isinstance(outcome, CkptError):
                assert_clear_error(outcome, durable.bucket)
            elif outcome.failure is not None:
                assert f"s3://{durable.bucket}" in outcome.failure, outcome.failure
            assert durable.verified_entries() in ([], [ENTRY]), (k, request)  # never an unverified entry
            again = one_pass(fast, durable)
            assert isinstance(again, Replicated), (k, request, again)
            assert again.failure is None, (k, request, again.failure)
            assert durable.verified_entries() == [ENTRY], (k, request)


@dataclass
class CorruptBody:
    """Change one byte of the first request body holding ``needle``, after the client signed and summed it."""

    needle: bytes
    hits: int = 0

    def apply(self, exchange: Exchange) -> None:
        at = exchange.body.find(self.needle)
        if self.hits or exchange.method != "PUT" or at < 0:
            return
        body = bytearray(exchange.body)
        body[at] ^= 0xFF
        exchange.body = bytes(body)
        self.hits += 1


class TestCorruptedUpload:
    def test_a_changed_upload_is_refused_and_the_next_pass_publishes_a_verified_copy(
        self, quiet_rig: Rig, tmp_path: Path
    ) -> None:
        fast = fast_root(tmp_path)
        client, _ = quiet_rig.client("tiered-corrupted", 1)
        durable = Durable.make(quiet_rig, client)
        rule = CorruptBody(FILES["sub/shard.bin"][:24])
        quiet_rig.proxy.rules[:] = [rule]
        try:
            outcome = one_pass(fast, durable)
        finally:
            quiet_rig.proxy.rules.clear()
        assert rule.hits == 1
        assert isinstance(outcome, Replicated)
        assert outcome.published == ()
        assert outcome.failure is not None
        assert "sub/shard.bin" in outcome.failure
        assert durable.verified_entries() == []
        again = one_pass(fast, durable)
        assert isinstance(again, Replicated)
        assert again.published == (ENTRY,)
        assert durable.verified_entries() == [ENTRY]
