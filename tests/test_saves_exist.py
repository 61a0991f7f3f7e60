"""A save that is gone, or holds nothing, is never complete (spec/watcher.md §2.6; issue 20).

Some rules decide completeness by what is *absent*: NeMo's ``-unfinished`` marker beside the save, a
configured rule with only ``forbidden`` files or nothing required. Read alone, a missing marker says
"complete" even when the save itself was deleted (by hand, by the framework's retention). These tests
publish a whole save under every built-in rule and a few configured ones, take the save away (or empty it),
and check that verified resolve, the watcher and catch-up never hand it out, on POSIX and on S3 (moto in
process and moto's server), through the API and through the real ``ckpt`` command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import boto3
import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.catchup import catch_up
from ckpt.application.verify import MISSING_FOLDER, Verified, resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.manifest import RESTORING, RESTORING_NAME
from ckpt.domain.rules import BUILTIN, Rule, builtin_rule, parse_custom_rules
from ckpt.domain.rules.presence import EMPTY_FILE, EMPTY_FOLDER
from support.fixtures import HARNESS_FACTORIES
from support.harness import Harness, MemoryHarness
from support.rule_layouts import zip_bytes
from support.s3 import RequestLog, S3Harness, new_bucket_name

EXEC = "exec/1.4101.0"
ATTEMPT = "1.4101.0"
NEMO_FOLDER = "megatron_gpt--val_loss=2.5000-step=100-consumed_samples=800.0"
NEMO_FILE = "model--val_loss=2.5000-epoch=0-step=100.ckpt"
ZIP = zip_bytes(64)


def _layouts() -> dict[str, tuple[str, dict[str, bytes], str]]:
    """Rule name -> (the save's name, a whole save's layout in the saves location, what is taken away).

    The layout maps paths relative to the saves location to bytes; files beside the save (a tracker, a
    ``latest``) stay when the save goes, as a framework's retention leaves them.
    """
    return {
        "hf": ("checkpoint-5", {"checkpoint-5/trainer_state.json": b'{"global_step": 5}'}, "checkpoint-5"),
        "dcp": ("step-5", {"step-5/.metadata": b"m", "step-5/__0_0.distcp": b"x"}, "step-5"),
        "lightning-file": ("epoch=0-step=5.ckpt", {"epoch=0-step=5.ckpt": ZIP}, "epoch=0-step=5.ckpt"),
        "lightning-folder": (
            "epoch=0-step=5.ckpt",
            {"epoch=0-step=5.ckpt/.metadata": b"m", "epoch=0-step=5.ckpt/meta.pt": ZIP},
            "epoch=0-step=5.ckpt",
        ),
        "deepspeed": (
            "global_step5",
            {"latest": b"global_step5", "global_step5/mp_rank_00_model_states.pt": ZIP},
            "global_step5",
        ),
        "megatron": (
            "iter_0000005",
            {"latest_checkpointed_iteration.txt": b"5", "iter_0000005/.metadata": b"m"},
            "iter_0000005",
        ),
        "nemo-folder": (NEMO_FOLDER, {f"{NEMO_FOLDER}/weights/.metadata": b"m"}, NEMO_FOLDER),
        "nemo-file": (NEMO_FILE, {NEMO_FILE: ZIP}, NEMO_FILE),
        "orbax": ("5", {"5/commit_success.txt": b"ok", "5/state/x": b"x"}, "5"),
        "bare-step": ("5", {"5/x": b"x"}, "5"),
        "forbidden-only": ("ckpt_5", {"ckpt_5/model.pt": ZIP}, "ckpt_5"),
        "file-nothing": ("weights-5.pt", {"weights-5.pt": ZIP}, "weights-5.pt"),
    }


LAYOUTS = _layouts()
# Configured rules whose checks all pass on a save that is not there: nothing required, only forbidden
# files, a file rule with no check of the file (config.md §7).
CONFIGURED = {
    "bare-step": {"name": "legacy-orbax", "pattern": "{step}"},
    "forbidden-only": {"name": "mytrainer", "pattern": "ckpt_{step}", "forbidden": ["WRITING"]},
    "file-nothing": {"name": "onefile", "pattern": "weights-{step}.pt", "kind": "file"},
}


def rule_for(case: str) -> Rule:
    """The rule a case is judged by: its built-in rule (``nemo-file`` is ``nemo``) or its table."""
    if case in CONFIGURED:
        return parse_custom_rules([CONFIGURED[case]], BUILTIN)[0]
    rule = builtin_rule(case.split("-", maxsplit=1)[0])
    assert rule is not None, case
    return rule


def arrange(harness: Harness, layout: Mapping[str, bytes]) -> None:
    """Write every file of ``layout`` under the saves location, beside the store."""
    for path, data in layout.items():
        harness.make_file(f"{EXEC}/{path}", data)


def take_away(harness: Harness, name: str) -> None:
    """Delete the save ``name`` (a folder and all in it, or one file), beside the store."""
    if isinstance(harness, S3Harness):
        keys = [harness.key(f"{EXEC}/{name}"), *harness.keys_under(f"{EXEC}/{name}")]
        for key in keys:
            harness.client.delete_object(Bucket=harness.bucket, Key=key)
    elif isinstance(harness, MemoryHarness):
        harness.remove_save(f"{EXEC}/{name}")
    else:
        path = os.path.join(harness.store().root, EXEC, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)


def publish_whole(harness: Harness, case: str) -> Any:
    """Arrange the case's whole save, publish it, and check verified resolve hands it out."""
    name, layout, _ = LAYOUTS[case]
    arrange(harness, layout)
    store = harness.store()
    entry = store.publish(1, 5, f"{store.exec_dir(ATTEMPT)}/{name}")
    assert resolve_verified(store, rule_for(case)) == Verified(entry, ()), "the whole save must pass"
    return entry


def _stores_for(case: str) -> list[str]:
    """The harnesses a case runs on: the in-memory fake's reader sees folders only
    (``ckpt.application.inspection.StoreSaves``), so a single-file save runs on the real stores only."""
    _, layout, gone = LAYOUTS[case]
    return [name for name in sorted(HARNESS_FACTORIES) if not (name == "memory" and gone in layout)]


#: Every (case, harness) pair that can be built: the cases crossed with the stores that can hold them.
CASES_ON_STORES = [(case, store) for case in sorted(LAYOUTS) for store in _stores_for(case)]


class TestVerifiedResolveOfAMissingSave:
    @pytest.mark.parametrize(("case", "harness"), CASES_ON_STORES, indirect=["harness"])
    def test_a_deleted_save_is_skipped_as_missing(self, harness: Harness, case: str) -> None:
        """Under every rule, a published save that was deleted is passed over as missing, never handed out."""
        entry = publish_whole(harness, case)
        take_away(harness, LAYOUTS[case][2])
        assert resolve_verified(harness.store(), rule_for(case)) == Verified(None, ((entry, MISSING_FOLDER),))

    @pytest.mark.parametrize(("case", "harness"), CASES_ON_STORES, indirect=["harness"])
    def test_an_older_whole_save_is_resumed_from(self, harness: Harness, case: str) -> None:
        """With the newest save deleted, verified resolve goes down to the older whole save."""
        name, layout, _ = LAYOUTS[case]
        store = harness.store()
        older = f"{ATTEMPT[:-1]}1"  # another execution's folder holds the older, whole save
        for path, data in layout.items():
            harness.make_file(f"exec/{older}/{path}", data)
        kept = store.publish(0, 5, f"{store.exec_dir(older)}/{name}")
        newest = publish_whole(harness, case)
        take_away(harness, LAYOUTS[case][2])
        assert resolve_verified(store, rule_for(case)) == Verified(kept, ((newest, MISSING_FOLDER),))


class TestAnEmptySave:
    """POSIX keeps an empty folder (S3 has no folders: an emptied one is gone) and a zero-byte file."""

    @pytest.fixture
    def store(self, tmp_path: Path) -> PosixStore:
        return PosixStore(str(tmp_path))

    @pytest.mark.parametrize("case", ["nemo-folder", "bare-step", "forbidden-only"])
    def test_an_emptied_folder_is_skipped(self, store: PosixStore, case: str) -> None:
        """A save folder whose files were all deleted holds nothing to load: skipped, with that reason."""
        name, layout, _ = LAYOUTS[case]
        folder = Path(store.exec_dir(ATTEMPT), name)
        for path, data in layout.items():
            Path(store.exec_dir(ATTEMPT), path).parent.mkdir(parents=True, exist_ok=True)
            Path(store.exec_dir(ATTEMPT), path).write_bytes(data)
        entry = store.publish(1, 5, str(folder))
        shutil.rmtree(folder)
        (folder / "weights").mkdir(parents=True)  # an empty sub-folder is no file either
        assert resolve_verified(store, rule_for(case)) == Verified(None, ((entry, EMPTY_FOLDER),))

    @pytest.mark.parametrize("case", ["nemo-file", "file-nothing"])
    def test_a_zero_byte_file_save_is_skipped(self, store: PosixStore, case: str) -> None:
        """A single-file save truncated to nothing is no checkpoint: skipped, with that reason."""
        name = LAYOUTS[case][0]
        path = Path(store.exec_dir(ATTEMPT), name)
        path.parent.mkdir(parents=True)
        path.write_bytes(ZIP)
        entry = store.publish(1, 5, str(path))
        path.write_bytes(b"")
        assert resolve_verified(store, rule_for(case)) == Verified(None, ((entry, EMPTY_FILE),))


class TestWatcherAndCatchUp:
    """The watcher (and catch-up, which runs watchers) never publishes a save that holds nothing."""

    @pytest.mark.parametrize("case", ["nemo-folder", "bare-step", "forbidden-only"])
    def test_an_empty_folder_is_not_published_a_full_one_is(self, tmp_path: Path, case: str) -> None:
        """An empty save folder waits, reported as empty; once it holds its files it is published."""
        store = PosixStore(str(tmp_path))
        name, layout, _ = LAYOUTS[case]
        folder = Path(store.exec_dir(ATTEMPT), name)
        folder.mkdir(parents=True)
        watcher = Watcher(store, rule_for(case), store.exec_dir(ATTEMPT), 1, interval=1.0, settle=0.0)
        assert watcher.scan() == []
        assert store.entries() == []
        for path, data in layout.items():
            Path(store.exec_dir(ATTEMPT), path).parent.mkdir(parents=True, exist_ok=True)
            Path(store.exec_dir(ATTEMPT), path).write_bytes(data)
        assert [e.save for e in watcher.scan()] == [f"{EXEC}/{name}"]

    def test_catch_up_passes_over_an_empty_nemo_folder(self, tmp_path: Path) -> None:
        """Catch-up on resume publishes an earlier execution's whole NeMo save, not its empty one."""
        store = PosixStore(str(tmp_path))
        earlier = "1.4101.0"
        Path(store.exec_dir(earlier), "model-step=7.ckpt").parent.mkdir(parents=True)
        Path(store.exec_dir(earlier), "model-step=7.ckpt").write_bytes(ZIP)
        Path(store.exec_dir(earlier), "model-step=9").mkdir()  # an emptied NeMo 2 folder
        store.publish(1, 3, store.exec_dir(earlier) + "/model-step=7.ckpt")  # learns the epoch
        caught = catch_up(store, rule_for("nemo-folder"), attempt="2.4102.0", epoch=2, settle=0.0)
        assert [e.save for e in caught.published] == []  # step 7 was already published; 9 is empty
        assert [e.save for e in store.entries()] == [f"exec/{earlier}/model-step=7.ckpt"]


FOLDER_CASES = sorted(
    c for c, (_, layout, gone) in LAYOUTS.items() if any(p.startswith(f"{gone}/") for p in layout)
)


class TestRestoreMark:
    """spec/watcher.md §2.6a, tiered.md §6.3a: on POSIX, a folder save holding the restore's mark is never
    complete, whatever its rule finds; without the mark the same folder is (S3 pays nothing: TestCost)."""

    @staticmethod
    def _marked(tmp_path: Path, case: str, attempt: str = ATTEMPT) -> tuple[PosixStore, Path]:
        store = PosixStore(str(tmp_path))
        name, layout, _ = LAYOUTS[case]
        for path, data in layout.items():
            Path(store.exec_dir(attempt), path).parent.mkdir(parents=True, exist_ok=True)
            Path(store.exec_dir(attempt), path).write_bytes(data)
        mark = Path(store.exec_dir(attempt), name, RESTORING_NAME)
        mark.write_bytes(b"")
        return store, mark

    @pytest.mark.parametrize("case", FOLDER_CASES)
    def test_verified_resolve_passes_over_a_marked_folder(self, tmp_path: Path, case: str) -> None:
        store, mark = self._marked(tmp_path, case)
        entry = store.publish(1, 5, str(mark.parent))
        assert resolve_verified(store, rule_for(case)) == Verified(None, ((entry, RESTORING),))
        mark.unlink()
        assert resolve_verified(store, rule_for(case)) == Verified(entry, ())

    @pytest.mark.parametrize("case", FOLDER_CASES)
    def test_the_watcher_publishes_a_marked_folder_only_once_the_mark_is_gone(
        self, tmp_path: Path, case: str
    ) -> None:
        store, mark = self._marked(tmp_path, case)
        watcher = Watcher(store, rule_for(case), store.exec_dir(ATTEMPT), 1, interval=1.0, settle=0.0)
        assert watcher.scan() == []
        assert store.entries() == []
        mark.unlink()
        assert [e.save for e in watcher.scan()] == [f"{EXEC}/{mark.parent.name}"]

    def test_catch_up_passes_over_a_marked_folder_of_an_execution_whose_epoch_is_known(
        self, tmp_path: Path
    ) -> None:
        earlier = "1.4101.0"
        store, mark = self._marked(tmp_path, "hf", earlier)
        older = Path(store.exec_dir(earlier), "checkpoint-3")
        older.mkdir()
        (older / "trainer_state.json").write_bytes(b'{"global_step": 3}')
        store.publish(1, 3, str(older))  # learns the epoch
        caught = catch_up(store, rule_for("hf"), attempt="2.4102.0", epoch=2, settle=0.0)
        assert caught.published == ()
        mark.unlink()
        caught = catch_up(store, rule_for("hf"), attempt="2.4102.0", epoch=2, settle=0.0)
        assert [e.save for e in caught.published] == [f"exec/{earlier}/checkpoint-5"]


class TestCost:
    """The check costs a request only for a save the rule passed without looking into it (§2.6)."""

    @pytest.mark.parametrize("harness", ["s3-moto"], indirect=True)
    @pytest.mark.parametrize(
        ("case", "expected"),
        [
            # hf: its folder's world-size record (watcher.md §6.7), the sentinel, trainer_state.json's head;
            # then the prune journals: nothing more.
            ("hf", ["GetObject", "HeadObject", "GetObject", "ListObjectsV2"]),
            # orbax: commit_success.txt inside the folder already shows it holds a file.
            ("orbax", ["HeadObject", "ListObjectsV2"]),
            # nemo, a folder: the marker beside it, then (new) the folder's listing, then the journals.
            ("nemo-folder", ["HeadObject", "ListObjectsV2", "ListObjectsV2"]),
            # nemo, a file: judged as a folder first (marker, empty listing), the parent listed to learn it is
            # a file, judged again (marker, its first byte), then the journals: as a Lightning file costs.
            ("nemo-file", ["HeadObject", *["ListObjectsV2"] * 2, "HeadObject", "GetObject", "ListObjectsV2"]),
        ],
    )
    def test_requests_of_a_verified_resolve(self, harness: Harness, case: str, expected: list[str]) -> None:
        """The requests of a verified resolve whose newest save passes, in order, by rule."""
        assert isinstance(harness, S3Harness)
        publish_whole(harness, case)
        log = RequestLog(harness.store_client)
        resolve_verified(harness.store(), rule_for(case))
        assert log.operations() == ["ListObjectsV2", *expected]  # the first lists pub/


# -- the real command ---------------------------------------------------------------------------------------

KEYS = {"AWS_ACCESS_KEY_ID": "exists-test-key", "AWS_SECRET_ACCESS_KEY": "exists-test-secret"}


def ckpt(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ckpt`` with no ckpt, scheduler, AWS or proxy settings of the machine's."""
    drop = ("CKPT_", "DISPATCH_", "AWS_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(drop)}
    env.update(KEYS)
    command = [sys.executable, "-m", "ckpt", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)


class TestResolveCommand:
    """``ckpt resolve --framework nemo`` with the newest NeMo save deleted, as a job would run it."""

    def test_posix(self, tmp_path: Path) -> None:
        """On POSIX the deleted save is reported skipped and the older whole one is printed."""
        store = PosixStore(str(tmp_path))
        saves = Path(store.exec_dir(ATTEMPT))
        (saves / "model-step=100.ckpt").parent.mkdir(parents=True)
        (saves / "model-step=100.ckpt").write_bytes(ZIP)
        (saves / "model-step=200" / "weights").mkdir(parents=True)
        (saves / "model-step=200" / "weights" / ".metadata").write_bytes(b"m")
        store.publish(1, 100, str(saves / "model-step=100.ckpt"))
        store.publish(1, 200, str(saves / "model-step=200"))
        shutil.rmtree(saves / "model-step=200")
        done = ckpt("--root", str(tmp_path), "resolve", "--framework", "nemo")
        assert (done.returncode, done.stdout) == (0, f"{saves / 'model-step=100.ckpt'}\n"), done.stderr
        assert done.stderr == f"ckpt: skipped {saves / 'model-step=200'}: {MISSING_FOLDER}\n"
        # Nothing whole left: exit 3 (nothing to resume from), never the missing save.
        os.remove(saves / "model-step=100.ckpt")
        done = ckpt("--root", str(tmp_path), "resolve", "--framework", "nemo")
        assert (done.returncode, done.stdout) == (3, ""), done.stderr

    def test_s3(self, moto_server: str, tmp_path: Path) -> None:
        """On S3 (moto's server, a config file) the same: skipped as missing, the older save printed."""
        client = boto3.client(
            "s3", endpoint_url=moto_server, region_name="us-east-1",
            aws_access_key_id="x", aws_secret_access_key="y",
        )  # fmt: skip
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        root = f"s3://{bucket}/team-a/run-42"
        config = tmp_path / "ckpt.toml"
        config.write_text(
            f'root = "{root}"\n[s3]\nendpoint_url = "{moto_server}"\nregion = "us-east-1"\n'
            'addressing_style = "path"\nmax_attempts = 2\n[[credentials]]\nsource = "env"\n'
        )
        saves = f"team-a/run-42/{EXEC}"
        client.put_object(Bucket=bucket, Key=f"{saves}/model-step=100.ckpt", Body=ZIP)
        client.put_object(Bucket=bucket, Key=f"{saves}/model-step=200/weights/.metadata", Body=b"m")
        for step, save in ((100, "model-step=100.ckpt"), (200, "model-step=200")):
            args = ("publish", "--epoch", "1", "--step", str(step), f"{EXEC}/{save}")
            done = ckpt("--config", str(config), *args)
            assert done.returncode == 0, done.stderr
        client.delete_object(Bucket=bucket, Key=f"{saves}/model-step=200/weights/.metadata")
        done = ckpt("--config", str(config), "--log-level", "warning", "resolve", "--framework", "nemo")
        assert (done.returncode, done.stdout) == (0, f"{root}/{EXEC}/model-step=100.ckpt\n"), done.stderr
        assert done.stderr == f"ckpt: skipped {root}/{EXEC}/model-step=200: {MISSING_FOLDER}\n"
