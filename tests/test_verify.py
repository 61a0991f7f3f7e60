"""Verified resolve (``ckpt.application.verify.resolve_verified``) on every store the harness builds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import Verified, read_markers, resolve_verified
from ckpt.domain.entries import Entry
from ckpt.domain.errors import MalformedError
from ckpt.domain.frameworks import Framework
from support.harness import Harness
from support.saves import rng_state_bytes

HF, DCP = Framework.HF, Framework.DCP
EXEC = "exec/1.4101.0"
STATE = b'{"global_step": 1}'


def publish(harness: Harness, epoch: int, step: int, save: str, files: dict[str, bytes] | None) -> Entry:
    """Create the save with ``files`` (``None``: no folder at all) and publish it."""
    location = harness.make_save(save, files or {"model.safetensors": b"w"})
    entry = harness.store().publish(epoch, step, location)
    if files is None:
        harness.remove_save(save)
    return entry


class TestResolveVerified:
    def test_newest_complete_save_wins(self, harness: Harness) -> None:
        """With every save complete, verified resolve returns the greatest entry and skips nothing."""
        publish(harness, 1, 100, f"{EXEC}/checkpoint-100", {"trainer_state.json": STATE})
        newest = publish(harness, 1, 200, f"{EXEC}/checkpoint-200", {"trainer_state.json": STATE})
        assert resolve_verified(harness.store(), HF) == Verified(newest, ())

    def test_hf_walks_down_past_every_kind_of_incomplete(self, harness: Harness) -> None:
        """Each entry above the newest complete save is passed over with its own reason, greatest first."""
        good = publish(harness, 1, 100, f"{EXEC}/checkpoint-100", {"trainer_state.json": STATE})
        skipped = [
            publish(harness, 1, 600, f"{EXEC}/checkpoint-600", None),
            publish(harness, 1, 500, f"{EXEC}/checkpoint-500", {"model.safetensors": b"w"}),
            publish(harness, 1, 400, f"{EXEC}/checkpoint-400", {"trainer_state.json": b'{"global_st'}),
            publish(harness, 1, 300, f"{EXEC}/checkpoint-300", {"trainer_state.json": b"[]"}),
            publish(
                harness,
                1,
                250,
                f"{EXEC}/checkpoint-250",
                {"trainer_state.json": STATE, "checkpoint-is-incomplete.txt": b""},
            ),
            publish(harness, 1, 200, f"{EXEC}/checkpoint-best", {"trainer_state.json": STATE}),
        ]
        verified = resolve_verified(harness.store(), HF)
        assert verified.entry == good
        assert [(e.step, reason) for e, reason in verified.skipped] == [
            (600, "save folder is missing"),
            (500, "no trainer_state.json"),
            (400, "trainer_state.json is not a JSON object"),
            (300, "trainer_state.json is not a JSON object"),
            (250, "incomplete: checkpoint-is-incomplete.txt is present"),
            (200, "not a hf save folder name (checkpoint-<step>): 'checkpoint-best'"),
        ]
        assert [e for e, _ in verified.skipped] == skipped

    def test_dcp(self, harness: Harness) -> None:
        """A dcp save needs .metadata; one without it, a missing one, or an hf name is passed over."""
        good = publish(harness, 2, 10, f"{EXEC}/step-10", {".metadata": b"m", "__0_0.distcp": b"x"})
        publish(harness, 2, 40, f"{EXEC}/step-40", None)
        publish(harness, 2, 30, f"{EXEC}/step-30", {"__0_0.distcp": b"x", ".metadata.tmp": b"m"})
        publish(harness, 2, 20, f"{EXEC}/checkpoint-20", {".metadata": b"m"})
        verified = resolve_verified(harness.store(), DCP)
        assert verified.entry == good
        assert [(e.step, reason) for e, reason in verified.skipped] == [
            (40, "save folder is missing"),
            (30, "no .metadata"),
            (20, "not a dcp save folder name (step-<step>): 'checkpoint-20'"),
        ]

    def test_epoch_orders_before_step(self, harness: Harness) -> None:
        """A newer execution's lower step wins over an older execution's higher one, as in plain resolve."""
        publish(harness, 1, 900, "exec/old/checkpoint-900", {"trainer_state.json": STATE})
        newer = publish(harness, 2, 100, "exec/new/checkpoint-100", {"trainer_state.json": STATE})
        assert resolve_verified(harness.store(), HF).entry == newer

    def test_nothing_complete(self, harness: Harness) -> None:
        """When no save passes, the entry is None and every entry is reported."""
        publish(harness, 1, 1, f"{EXEC}/checkpoint-1", None)
        verified = resolve_verified(harness.store(), HF)
        assert verified.entry is None
        assert [reason for _, reason in verified.skipped] == ["save folder is missing"]

    def test_nothing_published(self, harness: Harness) -> None:
        """An empty log gives no entry and nothing skipped."""
        assert resolve_verified(harness.store(), DCP) == Verified(None, ())

    def test_settle_does_not_apply(self, harness: Harness) -> None:
        """A save that was just written is accepted at once: verified resolve checks markers only."""
        entry = publish(harness, 1, 7, f"{EXEC}/checkpoint-7", {"trainer_state.json": STATE})
        assert resolve_verified(harness.store(), HF).entry == entry

    def test_hf_world_size_needs_every_rank_complete(self, harness: Harness) -> None:
        """With world size 2, a save whose rank 1 never wrote, or cut short, its RNG state is passed over."""
        rng0, rng1 = rng_state_bytes(0), rng_state_bytes(1)
        good = publish(
            harness,
            1,
            100,
            f"{EXEC}/checkpoint-100",
            {"trainer_state.json": STATE, "rng_state_0.pth": rng0, "rng_state_1.pth": rng1},
        )
        publish(
            harness,
            1,
            200,
            f"{EXEC}/checkpoint-200",
            {"trainer_state.json": STATE, "rng_state_0.pth": rng0, "rng_state_1.pth": rng1[:-30]},
        )
        newest = publish(
            harness, 1, 300, f"{EXEC}/checkpoint-300", {"trainer_state.json": STATE, "rng_state_0.pth": rng0}
        )
        verified = resolve_verified(harness.store(), HF, world_size=2)
        assert verified.entry == good
        assert [(e.step, reason) for e, reason in verified.skipped] == [
            (300, "no rng_state_1.pth (rank 1 of 2 has not finished its part of the save)"),
            (
                200,
                (
                    "rng_state_1.pth is not a complete zip: no end-of-central-directory record at its end "
                    "(rank 1 of 2 was cut short)"
                ),
            ),
        ]
        # Unknown world size: the rank files are not looked at (the rule before the world size was known).
        assert resolve_verified(harness.store(), HF).entry == newest
        assert resolve_verified(harness.store(), HF, world_size=1).entry == newest

    def test_malformed_log_is_an_error(self, harness: Harness) -> None:
        """A bad name in pub/ raises MalformedError, as entries() does, instead of being skipped."""
        publish(harness, 1, 1, f"{EXEC}/checkpoint-1", {"trainer_state.json": STATE})
        harness.put_raw_name("not-an-entry")
        with pytest.raises(MalformedError):
            resolve_verified(harness.store(), HF)


class TestReadMarkers:
    def test_hf(self, harness: Harness) -> None:
        """The hf markers are trainer_state.json's bytes and whether the sentinel is present."""
        location = harness.make_save(
            f"{EXEC}/checkpoint-5", {"trainer_state.json": STATE, "checkpoint-is-incomplete.txt": b""}
        )
        markers = read_markers(harness.store(), HF, location)
        assert (markers.trainer_state, markers.incomplete_sentinel) == (STATE, True)

    def test_dcp(self, harness: Harness) -> None:
        """The dcp marker is whether .metadata is present."""
        location = harness.make_save(f"{EXEC}/step-5", {".metadata": b""})
        assert read_markers(harness.store(), DCP, location).metadata
        other = harness.make_save(f"{EXEC}/step-6", {"__0_0.distcp": b"x"})
        assert not read_markers(harness.store(), DCP, other).metadata


class TestResolveCommand:
    """``ckpt resolve --framework hf --world-size N``, run as the real CLI."""

    @staticmethod
    def resolve(
        root: Path, *args: str, world_size_env: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
        if world_size_env is not None:
            env["WORLD_SIZE"] = world_size_env
        return subprocess.run(
            [sys.executable, "-m", "ckpt", "--root", str(root), "resolve", *args],
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def test_world_size_skips_a_save_missing_a_rank(self, tmp_path: Path) -> None:
        """With --world-size 2 the newest save, missing rank 1's RNG state, is skipped and reported."""
        store = PosixStore(str(tmp_path))
        for step, files in (
            (1, {"rng_state_0.pth": rng_state_bytes(0), "rng_state_1.pth": rng_state_bytes(1)}),
            (2, {"rng_state_0.pth": rng_state_bytes(0)}),
        ):
            folder = tmp_path / EXEC / f"checkpoint-{step}"
            folder.mkdir(parents=True)
            for name, data in {"trainer_state.json": STATE, **files}.items():
                (folder / name).write_bytes(data)
            store.publish(1, step, str(folder))
        done = self.resolve(tmp_path, "--framework", "hf", "--world-size", "2", world_size_env="1")
        assert (done.returncode, done.stdout) == (0, f"{tmp_path / EXEC / 'checkpoint-1'}\n")
        assert done.stderr == (
            f"ckpt: skipped {tmp_path / EXEC / 'checkpoint-2'}: "
            "no rng_state_1.pth (rank 1 of 2 has not finished its part of the save)\n"
        )
        # Without --world-size, WORLD_SIZE (the resuming run's) is not used: the newest save is returned.
        done = self.resolve(tmp_path, "--framework", "hf", world_size_env="2")
        assert (done.returncode, done.stdout) == (0, f"{tmp_path / EXEC / 'checkpoint-2'}\n")

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (("--framework", "hf", "--world-size", "0"), "world size 0 must be between 1"),
            (("--framework", "hf", "--world-size", "two"), "world size 'two' is not a whole number"),
            (("--world-size", "2"), "--world-size applies to a verified resolve"),
        ],
    )
    def test_bad_world_size_is_a_usage_error(
        self, tmp_path: Path, args: tuple[str, ...], message: str
    ) -> None:
        """A world size that is not a whole number from 1, or one without --framework, exits 2."""
        done = self.resolve(tmp_path, *args)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr
        assert done.stderr.startswith("ckpt: ")
