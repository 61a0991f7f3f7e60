"""The watcher and verified resolve with every rule: killed saves, exactly once, the wrong-framework hint.

The saves are the framework sequences of ``tests/support/trainer/frameworks.py`` played onto a real POSIX root
(and one onto S3 over HTTP); watchers scan between every two file boundaries, restarted or not.
"""

from __future__ import annotations

import io
import logging
import zipfile
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import unquote

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.application.rulebook import find_rule
from ckpt.application.verify import resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.catchup import WORLD_SIZE_RECORD
from ckpt.domain.rules import BUILTIN, TAIL_BYTES, parse_custom_rules
from support.rule_layouts import inner_zip_cut, torch_zip, zeroed_zip, zip_bytes
from support.s3 import RequestLog, new_bucket_name, raw_client
from support.trainer.frameworks import SEQUENCES, Sequence, apply_to_folder, states

ATTEMPT = "1.4101.0"
EPOCH = 7
ALL_SEQUENCES = sorted(SEQUENCES)


@pytest.fixture
def store(tmp_path: Path) -> PosixStore:
    root = tmp_path / "root"
    root.mkdir()
    return PosixStore(str(root))


def _watcher(store: PosixStore, seq: Sequence, **kwargs: Any) -> Watcher:
    rule = find_rule(seq.rule, world_size=seq.options.get("world_size"))  # type: ignore[arg-type]
    return Watcher(store, rule, store.exec_dir(ATTEMPT), EPOCH, 1.0, settle=0, **kwargs)


class TestKilledAtEveryBoundary:
    @pytest.mark.parametrize("name", ALL_SEQUENCES)
    def test_restarted_watchers_publish_the_complete_save_once(self, store: PosixStore, name: str) -> None:
        """A fresh watcher after every file boundary publishes the save only once complete, and only once."""
        seq = SEQUENCES[name]
        base = Path(store.exec_dir(ATTEMPT))
        base.mkdir(parents=True)
        created = []
        for label, layout, complete in states(seq):
            apply_to_folder(layout, base)
            created += _watcher(store, seq).scan()
            published = [e.save.rpartition("/")[2] for e in store.entries()]
            assert published == ([seq.save] if complete else []), label
        assert [e.save.rpartition("/")[2] for e in created] == [seq.save]

    @pytest.mark.parametrize("name", ALL_SEQUENCES)
    def test_one_watcher_through_the_whole_save(self, store: PosixStore, name: str) -> None:
        """One watcher scanning at every boundary publishes the save once, at the first complete state."""
        seq = SEQUENCES[name]
        base = Path(store.exec_dir(ATTEMPT))
        base.mkdir(parents=True)
        watcher = _watcher(store, seq)
        first_complete = None
        for index, (_, layout, complete) in enumerate(states(seq)):
            apply_to_folder(layout, base)
            if watcher.scan() and first_complete is None:
                first_complete = index
            assert bool(store.entries()) is complete
        assert len(store.entries()) == 1
        assert first_complete is not None

    @pytest.mark.parametrize("name", ALL_SEQUENCES)
    def test_verified_resolve_agrees(self, store: PosixStore, name: str) -> None:
        """Once published, the save passes verified resolve with the same rule."""
        seq = SEQUENCES[name]
        base = Path(store.exec_dir(ATTEMPT))
        base.mkdir(parents=True)
        *_, (_, layout, complete) = states(seq)
        assert complete
        apply_to_folder(layout, base)
        assert len(_watcher(store, seq).scan()) == 1
        rule = find_rule(seq.rule, world_size=seq.options.get("world_size"))  # type: ignore[arg-type]
        verified = resolve_verified(store, rule)
        assert verified.entry is not None
        assert verified.entry.save.endswith(seq.save)
        assert verified.skipped == ()


class TestWrongFramework:
    def test_hf_folders_under_dcp_are_named_once(
        self, store: PosixStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Under --framework dcp, a checkpoint-5 folder gets one warning naming hf; nothing is published."""
        base = Path(store.exec_dir(ATTEMPT))
        (base / "checkpoint-5").mkdir(parents=True)
        (base / "checkpoint-5" / "trainer_state.json").write_text("{}")
        watcher = Watcher(store, find_rule("dcp"), str(base), EPOCH, 1.0)
        with caplog.at_level(logging.WARNING, logger="ckpt.watcher"):
            assert watcher.scan() == []
            assert watcher.scan() == []
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        expected = (
            f"{base}: folder 'checkpoint-5' looks like a save but matches no dcp save name (step-<step>); "
            "--framework hf (checkpoint-<step>) would take it"
        )
        assert warnings == [expected]

    def test_no_warning_for_own_saves(self, store: PosixStore, caplog: pytest.LogCaptureFixture) -> None:
        """Saves of the chosen rule, staging folders and unrelated names give no warning."""
        base = Path(store.exec_dir(ATTEMPT))
        for name in ("step-5", "tmp_step-6", "logs"):
            (base / name).mkdir(parents=True)
        with caplog.at_level(logging.WARNING, logger="ckpt.watcher"):
            Watcher(store, find_rule("dcp"), str(base), EPOCH, 1.0).scan()
        assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


class TestConfiguredAndPluginRules:
    def test_configured_rule_publishes(self, store: PosixStore) -> None:
        """A [[frameworks]] rule drives the watcher and verified resolve like a built-in one."""
        (rule,) = parse_custom_rules(
            [{"name": "mytrainer", "pattern": "ckpt_{step}", "required": ["DONE"], "zip": ["model.pt"]}],
            BUILTIN,
        )
        base = Path(store.exec_dir(ATTEMPT))
        save = base / "ckpt_3"
        save.mkdir(parents=True)
        (save / "model.pt").write_bytes(zip_bytes(50))
        watcher = Watcher(store, rule, str(base), EPOCH, 1.0, settle=0)
        assert watcher.scan() == []
        (save / "DONE").write_bytes(b"")
        assert [e.step for e in watcher.scan()] == [3]
        assert resolve_verified(store, rule).entry is not None

    def test_plugin_rule_publishes(self, store: PosixStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """An installed plugin's rule drives the watcher by name."""
        monkeypatch.syspath_prepend(str(Path(__file__).parent / "plugins"))
        base = Path(store.exec_dir(ATTEMPT))
        (base / "run-9").mkdir(parents=True)
        watcher = Watcher(store, find_rule("done-marker"), str(base), EPOCH, 1.0)
        assert watcher.scan() == []
        (base / "run-9" / "DONE").write_bytes(b"")
        assert [e.step for e in watcher.scan()] == [9]


class TestOnS3:
    def test_deepspeed_and_a_lightning_file_on_s3(self, moto_server: str) -> None:
        """On S3 (moto's server, real HTTP): a DeepSpeed tag and a Lightning file are published and verified;
        the scan after costs one listing."""
        arrange = raw_client(moto_server)
        bucket = new_bucket_name()
        arrange.create_bucket(Bucket=bucket)
        client = raw_client(moto_server)
        store = S3Store(f"s3://{bucket}/team", client)
        saves = store.exec_dir(ATTEMPT)
        prefix = saves[len(f"s3://{bucket}/") :]
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            arrange.put_object(Bucket=bucket, Key=f"{prefix}/global_step10/{name}", Body=zip_bytes(80))
        arrange.put_object(Bucket=bucket, Key=f"{prefix}/latest", Body=b"global_step10")
        arrange.put_object(Bucket=bucket, Key=f"{prefix}/epoch=0-step=4.ckpt", Body=zip_bytes(80))

        deepspeed = Watcher(store, find_rule("deepspeed", world_size=1), saves, EPOCH, 1.0)
        assert [e.step for e in deepspeed.scan()] == [10]
        lightning = Watcher(store, find_rule("lightning"), saves, EPOCH, 1.0, settle=0)
        assert [e.save.rpartition("/")[2] for e in lightning.scan()] == ["epoch=0-step=4.ckpt"]

        log = RequestLog(client)
        assert deepspeed.scan() == []
        assert [operation for operation, _, _ in log.sent] == ["ListObjectsV2"]

        verified = resolve_verified(store, find_rule("lightning"))
        assert verified.entry is not None
        assert verified.entry.save.endswith("epoch=0-step=4.ckpt")
        assert resolve_verified(store, find_rule("deepspeed", world_size=1)).entry is not None


class TestZipEndThroughTheWatcher:
    """spec/watcher.md §2.4 through the watcher and verified resolve: a Lightning file cut right after a zip
    stored inside it, or whose end was written before its middle, is never published nor resolved; a
    torch-like one whose directory starts before the tail read is, on POSIX and on S3."""

    SAVES: ClassVar[dict[str, bytes]] = {
        "epoch=0-step=1.ckpt": torch_zip(1200),  # complete; its directory starts before the tail read
        "epoch=0-step=2.ckpt": torch_zip(3, zip64="saturated"),  # complete
        "epoch=0-step=3.ckpt": inner_zip_cut(50),  # cut right after an inner zip
        "epoch=0-step=4.ckpt": zeroed_zip(1200, "end"),  # its end written before its middle
    }

    def _scan(self, store: PosixStore | S3Store, saves: str) -> None:
        watcher = Watcher(store, find_rule("lightning"), saves, EPOCH, 1.0, settle=0)
        published = sorted(e.save.rpartition("/")[2] for e in watcher.scan())
        assert published == ["epoch=0-step=1.ckpt", "epoch=0-step=2.ckpt"]

    def _resolve(self, store: PosixStore | S3Store, saves: str) -> None:
        # Published by hand (as a trainer's own publish would be), the two incomplete ones are passed over.
        for step in (3, 4):
            store.publish(EPOCH, step, f"{saves}/epoch=0-step={step}.ckpt")
        verified = resolve_verified(store, find_rule("lightning"))
        assert verified.entry is not None
        assert verified.entry.save.endswith("epoch=0-step=2.ckpt")
        reasons = [reason for _, reason in verified.skipped]
        assert len(reasons) == 2
        assert "no central directory header" in reasons[0]  # step 4
        assert "does not end where its end record begins" in reasons[1]  # step 3

    def test_on_posix(self, store: PosixStore) -> None:
        """On real files: the two complete saves are published, the two others neither published nor
        resolved."""
        base = Path(store.exec_dir(ATTEMPT))
        base.mkdir(parents=True)
        for name, data in self.SAVES.items():
            (base / name).write_bytes(data)
        self._scan(store, str(base))
        self._resolve(store, str(base))

    def test_on_s3_with_request_counts(self, moto_server: str) -> None:
        """On S3 (moto's server): the same verdicts; judging a file costs one ranged GetObject of its tail,
        and one more of 4 bytes at its directory only when the directory starts before the tail."""
        arrange = raw_client(moto_server)
        bucket = new_bucket_name()
        arrange.create_bucket(Bucket=bucket)
        client = raw_client(moto_server)
        store = S3Store(f"s3://{bucket}/team", client)
        saves = store.exec_dir(ATTEMPT)
        prefix = saves[len(f"s3://{bucket}/") :]
        for name, data in self.SAVES.items():
            arrange.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
        ranges: dict[str, list[str]] = {}

        def record(request: Any, **_: Any) -> None:
            name = unquote(request.url.rpartition("/")[2])
            if name != WORLD_SIZE_RECORD:  # read whole, once, by the verified resolve (watcher.md §6.7)
                ranges.setdefault(name, []).append(request.headers["Range"].decode())

        client.meta.events.register_first("before-send.s3.GetObject", record)
        self._scan(store, saves)
        with zipfile.ZipFile(io.BytesIO(self.SAVES["epoch=0-step=1.ckpt"])) as archive:
            start = archive.start_dir
        tail = f"bytes=-{TAIL_BYTES}"
        assert ranges == {
            "epoch=0-step=1.ckpt": [tail, f"bytes={start}-{start + 3}"],
            "epoch=0-step=2.ckpt": [tail],
            "epoch=0-step=3.ckpt": [tail],
            "epoch=0-step=4.ckpt": [tail, f"bytes={start}-{start + 3}"],
        }
        self._resolve(store, saves)
