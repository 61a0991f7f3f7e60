"""Every integration refuses, when it is made, an attempt too long for its saves (spec/names.md §4.5).

Raised later, at the first publication, the ``InvalidError`` came on the main process only, after the
barrier, while the other ranks went on to wait in the next collective. The constructors and resume helpers
check first, on every rank alike: the real 2-process gloo run shows that no rank is left waiting.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt.domain.errors import InvalidError
from ckpt.integrations.core import open_job, resume_location
from ckpt.testing import InMemoryStore
from support.integ_launch import run_ranks

HF_TOO_LONG = "a" * 97  # exec/<97>/checkpoint-18446744073709551615 is 134 bytes
HF_BOUNDARY = "a" * 96  # 133 bytes
STEP_TOO_LONG = "a" * 103  # exec/<103>/step-18446744073709551615 is 134 bytes
STEP_BOUNDARY = "a" * 102
LIGHTNING_TOO_LONG = "a" * 98  # exec/<98>/step=18446744073709551615.ckpt is 134 bytes: the lightning rule's
LIGHTNING_BOUNDARY = "a" * 97  # longest save name, its integration's step-<step> folders included


def settings(root: Path, attempt: str) -> dict[str, Any]:
    return {"root": str(root), "epoch": 7, "attempt": attempt, "environ": {}}


def assert_refused(caught: pytest.ExceptionInfo[InvalidError], attempt: str, saves: str, name: str) -> None:
    message = str(caught.value)
    assert message.startswith(f"attempt '{attempt}' is too long for {saves}: "), message
    assert f"'{name}'" in message
    assert "at most 133 bytes" in message


def assert_nothing_written(root: Path) -> None:
    assert list(root.iterdir()) == [], "nothing (no epoch record, no pub/) is written before the refusal"


class TestCore:
    def test_job_require_room(self, tmp_path: Path) -> None:
        """``Job.require_room`` holds the execution folder to the template's name at the largest step."""
        job = open_job(**settings(tmp_path, STEP_TOO_LONG))
        with pytest.raises(InvalidError) as caught:
            job.require_room("step-{step}", "step saves")
        assert_refused(caught, STEP_TOO_LONG, "step saves", "step-18446744073709551615")
        open_job(**settings(tmp_path, STEP_BOUNDARY)).require_room("step-{step}", "step saves")

    @pytest.mark.parametrize(("framework", "too_long"), [("hf", HF_TOO_LONG), ("dcp", STEP_TOO_LONG)])
    def test_resume_location_refuses_before_anything(self, framework: str, too_long: str) -> None:
        """``resume_location`` refuses before the epoch record and the catch-up, on every rank alike."""
        store = InMemoryStore()
        with pytest.raises(InvalidError, match=f"is too long for {framework} saves"):
            resume_location(framework, store=store, epoch=7, attempt=too_long, environ={})
        assert store.entries() == []
        assert store.folders(store.exec_dir("x").rpartition("/")[0]) == []


class TestConstructors:
    """Each integration's constructor, with its real framework installed (the frameworks extra)."""

    def test_hf_callback(self, tmp_path: Path) -> None:
        """``CkptCallback`` refuses an attempt too long for ``checkpoint-<20 digits>``."""
        pytest.importorskip("transformers")
        from ckpt.integrations.hf import CkptCallback

        with pytest.raises(InvalidError) as caught:
            CkptCallback(**settings(tmp_path, HF_TOO_LONG))
        assert_refused(caught, HF_TOO_LONG, "hf saves", "checkpoint-18446744073709551615")
        assert_nothing_written(tmp_path)
        callback = CkptCallback(**settings(tmp_path, HF_BOUNDARY))
        assert callback.saves_location == f"{tmp_path}/exec/{HF_BOUNDARY}"

    def test_dcp(self, tmp_path: Path) -> None:
        """``CkptDCP`` refuses before its publisher records the epoch."""
        pytest.importorskip("torch")
        from ckpt.integrations.dcp import CkptDCP

        with pytest.raises(InvalidError) as caught:
            CkptDCP(**settings(tmp_path, STEP_TOO_LONG))
        assert_refused(caught, STEP_TOO_LONG, "dcp saves", "step-18446744073709551615")
        assert_nothing_written(tmp_path)
        CkptDCP(**settings(tmp_path, STEP_BOUNDARY))

    def test_lightning(self, tmp_path: Path) -> None:
        """``CkptModelCheckpoint`` and Lightning's ``resume_location`` refuse with the ``lightning`` rule's
        longest save name, the rule that judges the integration's ``step-<step>`` saves (watcher.md §2.8)."""
        pytest.importorskip("lightning")
        from ckpt.integrations.lightning import CkptModelCheckpoint
        from ckpt.integrations.lightning import resume_location as lightning_resume

        with pytest.raises(InvalidError) as caught:
            CkptModelCheckpoint(settings=settings(tmp_path, LIGHTNING_TOO_LONG))
        assert_refused(caught, LIGHTNING_TOO_LONG, "lightning saves", "step=18446744073709551615.ckpt")
        with pytest.raises(InvalidError) as caught:
            lightning_resume(**settings(tmp_path, LIGHTNING_TOO_LONG))
        assert_refused(caught, LIGHTNING_TOO_LONG, "lightning saves", "step=18446744073709551615.ckpt")
        assert_nothing_written(tmp_path)
        CkptModelCheckpoint(settings=settings(tmp_path, LIGHTNING_BOUNDARY))

    def test_accelerate(self, tmp_path: Path) -> None:
        """``CkptAccelerate`` refuses before it could ``wait_for_everyone``."""
        accelerate = pytest.importorskip("accelerate")
        from ckpt.integrations.accelerate import CkptAccelerate

        accelerator = accelerate.Accelerator(cpu=True)
        with pytest.raises(InvalidError) as caught:
            CkptAccelerate(accelerator, **settings(tmp_path, STEP_TOO_LONG))
        assert_refused(caught, STEP_TOO_LONG, "Accelerate saves", "step-18446744073709551615")
        assert_nothing_written(tmp_path)
        CkptAccelerate(accelerator, **settings(tmp_path, STEP_BOUNDARY))


@pytest.mark.frameworks
@pytest.mark.filterwarnings("ignore::UserWarning")
class TestTwoRanks:
    def test_every_rank_is_refused_and_none_is_left_waiting(self, tmp_path: Path) -> None:
        """A real 2-process gloo run: ``CkptDCP()`` and ``resume_location()`` raise on both ranks, which
        then meet in one ``all_reduce`` and exit 0; nothing is published (a 120 s bound, no hang)."""
        pytest.importorskip("torch")
        root, out = tmp_path / "root", tmp_path / "out"
        root.mkdir()
        out.mkdir()
        env = {"CKPT_ROOT": str(root), "DISPATCH_EPOCH": "7", "DISPATCH_ATTEMPT": STEP_TOO_LONG}
        run_ranks("support.integ_names_run", ["--out-dir", str(out)], world_size=2, env=env, timeout=120)
        for rank in (0, 1):
            report = json.loads((out / f"rank-{rank}.json").read_text())
            assert report["all_reduce"] == 3.0
            for call in ("constructor", "resume_location"):
                assert report[call] is not None, f"rank {rank}: {call} was not refused"
                assert report[call].startswith(f"attempt '{STEP_TOO_LONG}' is too long for dcp saves")
            assert "save" not in report  # no save was attempted
        assert list(root.iterdir()) == []
