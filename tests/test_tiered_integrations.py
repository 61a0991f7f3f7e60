"""The tiered mode from inside the training script (spec/tiered.md §9): the publisher's background
replicator and ``resume_location`` across tiers, on real files, and in real 2-process gloo runs of the
Hugging Face Trainer and of PyTorch DCP with a fast and a durable root."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.posix.tiered import PosixTierFiles
from ckpt.application.replication import manifest_problem
from ckpt.domain.errors import InvalidError
from ckpt.domain.manifest import MANIFEST_NAME, decode_manifest
from ckpt.integrations.core import Publisher, open_job, resume_location
from support.integ_launch import run_killed_ranks, run_ranks


def write_save(root: Path, attempt: str, step: int, files: int = 2) -> str:
    save = root / "exec" / attempt / f"checkpoint-{step}"
    save.mkdir(parents=True)
    for i in range(files):
        (save / f"part-{i}.bin").write_bytes(bytes([step % 251, i]) * (1000 + step))
    (save / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return str(save)


def roots(tmp_path: Path) -> tuple[Path, Path]:
    fast, durable = tmp_path / "fast", tmp_path / "durable"
    fast.mkdir()
    durable.mkdir()  # a POSIX durable root, like any root, exists before it is used (cli.md §13.5)
    return fast, durable


def pairs(root: Path) -> list[tuple[int, int]]:
    return [(e.epoch, e.step) for e in PosixStore(str(root)).entries()]


def manifest_paths(root: Path, save: str) -> list[str]:
    manifest = decode_manifest((root / save / MANIFEST_NAME).read_bytes())
    return sorted(f.path for f in manifest.files)


class TestOpenJob:
    def test_a_durable_root_inside_the_root_is_refused_when_the_job_is_opened(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidError, match="must not be the fast root"):
            open_job(root=str(tmp_path), epoch=1, attempt="a", environ={}, durable=str(tmp_path / "d"))

    def test_ckpt_durable_from_the_environment(self, tmp_path: Path) -> None:
        fast, durable = tmp_path / "fast", tmp_path / "durable"
        env = {"CKPT_ROOT": str(fast), "DISPATCH_EPOCH": "1", "DISPATCH_ATTEMPT": "a", "CKPT_DURABLE": ""}
        assert open_job(environ=env).tiers is None  # empty: not set
        assert not fast.exists()
        job = open_job(environ={**env, "CKPT_DURABLE": str(durable)})
        assert job.tiers is not None
        assert job.tiers.durable.root == str(durable)
        assert fast.is_dir()  # with a durable root, a missing root is created (a new node)


class TestBackgroundReplicator:
    def test_every_published_save_is_durable_after_close_with_its_manifest(self, tmp_path: Path) -> None:
        fast, durable = roots(tmp_path)
        job = open_job(root=str(fast), epoch=7, attempt="a", environ={}, durable=str(durable))
        publisher = Publisher(job, is_main=True)
        assert publisher.replicator is not None
        for step in (2, 4, 6):
            publisher.publish(step, write_save(fast, "a", step))
        assert publisher.close() == ()  # nothing left that is not durable
        assert pairs(durable) == [(7, 2), (7, 4), (7, 6)]
        for step in (2, 4, 6):
            save = f"exec/a/checkpoint-{step}"
            assert manifest_paths(durable, save) == ["part-0.bin", "part-1.bin", "trainer_state.json"]
            for name in ("part-0.bin", "part-1.bin"):
                assert (durable / save / name).read_bytes() == (fast / save / name).read_bytes()
        assert [(e.epoch, e.step) for e in publisher.replicator.published] == [(7, 2), (7, 4), (7, 6)]

    def test_a_publication_does_no_replication_on_the_training_thread(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Every file of the copy is read by the replicator's thread, none by the one that publishes."""
        from ckpt.adapters.posix.tiered import PosixTierFiles

        readers: list[str] = []
        original = PosixTierFiles.listing

        def listing(self: PosixTierFiles, save: str) -> Any:
            readers.append(threading.current_thread().name)
            return original(self, save)

        monkeypatch.setattr(PosixTierFiles, "listing", listing)
        fast, durable = roots(tmp_path)
        job = open_job(root=str(fast), epoch=7, attempt="a", environ={}, durable=str(durable))
        publisher = Publisher(job, is_main=True)
        publisher.publish(2, write_save(fast, "a", 2))
        publisher.close()
        assert pairs(durable) == [(7, 2)]
        assert readers
        assert set(readers) == {"ckpt-replicator"}

    def test_a_pass_that_raises_a_defect_is_logged_and_the_thread_goes_on(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Rule 3a of ckpt.integrations.replicator: an error that is no CkptError (here a RuntimeError from
        the first copy) fails that pass only; the thread lives, and close() still makes every save durable."""
        from ckpt.adapters.posix.tiered import PosixTierFiles

        original = PosixTierFiles.put
        raised: list[str] = []

        def put(self: PosixTierFiles, *args: Any) -> None:
            if not raised:
                raised.append(threading.current_thread().name)
                raise RuntimeError("a defect in the copy")
            original(self, *args)

        monkeypatch.setattr(PosixTierFiles, "put", put)
        fast, durable = roots(tmp_path)
        job = open_job(root=str(fast), epoch=7, attempt="a", environ={}, durable=str(durable))
        with caplog.at_level("ERROR", logger="ckpt.integrations"):
            publisher = Publisher(job, is_main=True)
            assert publisher.replicator is not None
            publisher.publish(2, write_save(fast, "a", 2))
            publisher.publish(4, write_save(fast, "a", 4))
            assert publisher.close() == ()
        assert len(raised) == 1  # in the replicator's thread or one of its copies', never the training one
        assert raised[0] != threading.current_thread().name
        expected = "replication failed unexpectedly (will retry): RuntimeError: a defect in the copy"
        assert expected in caplog.text
        assert pairs(durable) == [(7, 2), (7, 4)]

    def test_an_earlier_executions_saves_are_copied_when_the_next_one_starts(self, tmp_path: Path) -> None:
        fast, durable = roots(tmp_path)
        plain = Publisher(open_job(root=str(fast), epoch=1, attempt="a", environ={}), is_main=True)
        plain.publish(3, write_save(fast, "a", 3))  # no durable root: never copied by that execution
        assert pairs(durable) == []
        job = open_job(root=str(fast), epoch=2, attempt="b", environ={}, durable=str(durable))
        publisher = Publisher(job, is_main=True)
        assert publisher.close() == ()
        assert pairs(durable) == [(1, 3)]

    def test_close_without_draining_reports_what_is_not_durable(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        fast, durable = roots(tmp_path)
        plain = Publisher(open_job(root=str(fast), epoch=1, attempt="a", environ={}), is_main=True)
        for step in (1, 2):
            plain.publish(step, write_save(fast, "a", step))
        job = open_job(root=str(fast), epoch=1, attempt="a", environ={}, durable=str(durable))
        publisher = Publisher(job, is_main=False)  # not the main process: no replicator at all
        assert publisher.replicator is None
        assert publisher.close() == ()
        publisher = Publisher(job, is_main=True)
        left = publisher.close(drain=False)
        copied = pairs(durable)
        # Stopped after the file in flight: what is durable and what is reported together are every entry.
        assert copied + [(e.epoch, e.step) for e in left] == [(1, 1), (1, 2)]
        for entry in left:
            assert f"not yet durable: {PosixStore(str(fast)).location(entry)}" in caplog.text

    def test_resume_location_restores_the_newest_durable_save_into_a_lost_fast_root(
        self, tmp_path: Path
    ) -> None:
        fast, durable = roots(tmp_path)
        job = open_job(root=str(fast), epoch=3, attempt="a", environ={}, durable=str(durable))
        publisher = Publisher(job, is_main=True)
        for step in (10, 20):
            publisher.publish(step, write_save(fast, "a", step))
        publisher.close()
        expected = (fast / "exec/a/checkpoint-20/part-1.bin").read_bytes()
        shutil.rmtree(fast)  # a new node: the fast root is gone
        settings: dict[str, Any] = {"root": str(fast), "epoch": 4, "attempt": "b", "environ": {}}
        found = resume_location("hf", settle=0, **settings, durable=str(durable))
        assert found == str(fast / "exec/a/checkpoint-20")
        assert (fast / "exec/a/checkpoint-20/part-1.bin").read_bytes() == expected
        assert pairs(fast) == [(3, 20)]  # published on the fast root at its epoch and step
        # Without the durable root, the same call on the restored fast root finds the same save.
        assert resume_location("hf", settle=0, **settings) == found


def scrape(url: str) -> dict[str, float]:
    """The metrics at ``url``, by name with labels, as Prometheus' text format writes them."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


class TestReplicatorMetrics:
    """spec/tiered.md §9.6: the in-process replicator serves ``ckpt replicate``'s metrics."""

    def env(self, fast: Path, durable: Path, **more: str) -> dict[str, str]:
        return {
            "CKPT_ROOT": str(fast),
            "CKPT_DURABLE": str(durable),
            "DISPATCH_EPOCH": "3",
            "DISPATCH_ATTEMPT": "a",
            **more,
        }

    def test_scraped_over_http_while_training_and_gone_after_close(self, tmp_path: Path) -> None:
        import urllib.error

        fast, durable = roots(tmp_path)
        job = open_job(environ=self.env(fast, durable, CKPT_DURABLE_METRICS_PORT="0"))
        assert job.durable_metrics == ("127.0.0.1", 0)
        publisher = Publisher(job, is_main=True)
        try:
            replicator = publisher.replicator
            assert replicator is not None
            assert replicator.metrics_url is not None
            assert replicator.metrics_url.startswith("http://127.0.0.1:")
            for step in (10, 20):
                publisher.publish(step, write_save(fast, "a", step))
            done = threading.Event()
            for _ in range(600):  # until the replicator's thread has published both (a bound, not a timing)
                if len(replicator.published) == 2:
                    done.set()
                    break
                done.wait(0.05)
            assert [e.step for e in replicator.published] == [10, 20]
            seen = scrape(replicator.metrics_url)
            assert seen["ckpt_replicate_saves_published_total"] == 2
            assert seen["ckpt_replicate_files_copied_total"] == 6  # two parts and the state, twice
            assert seen["ckpt_replicate_last_durable_epoch"] == 3
            assert seen["ckpt_replicate_last_durable_step"] == 20
            assert seen["ckpt_replicate_entries_pending"] == 0
            assert seen["ckpt_replicate_lag_steps"] == 0
            assert seen["ckpt_replicate_passes_total"] >= 1
            url = replicator.metrics_url
        finally:
            assert publisher.close() == ()
        with pytest.raises(urllib.error.URLError):
            scrape(url)

    def test_a_malformed_port_is_refused_when_the_job_is_opened(self, tmp_path: Path) -> None:
        fast, durable = roots(tmp_path)
        with pytest.raises(InvalidError, match="CKPT_DURABLE_METRICS_PORT 'http' must be a port number"):
            open_job(environ=self.env(fast, durable, CKPT_DURABLE_METRICS_PORT="http"))
        with pytest.raises(InvalidError, match="CKPT_DURABLE_METRICS_ADDRESS 'localhost' must be an IP"):
            open_job(
                environ=self.env(
                    fast, durable, CKPT_DURABLE_METRICS_PORT="0", CKPT_DURABLE_METRICS_ADDRESS="localhost"
                )
            )
        plain = open_job(
            environ={**self.env(fast, durable), "CKPT_DURABLE": "", "CKPT_DURABLE_METRICS_PORT": "x"}
        )
        assert plain.tiers is None  # without a durable root the variables are not read

    def test_a_port_taken_is_logged_and_the_replication_goes_on(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        import socket

        fast, durable = roots(tmp_path)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = str(taken.getsockname()[1])
            job = open_job(environ=self.env(fast, durable, CKPT_DURABLE_METRICS_PORT=port))
            with caplog.at_level("ERROR", logger="ckpt.integrations"):
                publisher = Publisher(job, is_main=True)
            assert publisher.replicator is not None
            assert publisher.replicator.metrics_url is None
            assert f"replicating without metrics: cannot serve metrics at 127.0.0.1:{port}" in caplog.text
            publisher.publish(10, write_save(fast, "a", 10))
            assert publisher.close() == ()
        assert pairs(durable) == [(3, 10)]


def run_tiered(
    module: str, fast: Path, durable: Path, attempt: str, epoch: int, out: Path, *args: str
) -> Any:
    env = {
        "CKPT_ROOT": str(fast),
        "CKPT_DURABLE": str(durable),
        "DISPATCH_EPOCH": str(epoch),
        "DISPATCH_ATTEMPT": attempt,
    }
    run_ranks(module, ["--out", str(out), *args], world_size=2, env=env)
    return json.loads(out.read_text())


@pytest.mark.frameworks
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
class TestTwoRanks:
    def test_hf_trainer_replicates_and_a_new_node_resumes_from_the_durable_copy(self, tmp_path: Path) -> None:
        pytest.importorskip("transformers")
        fast, durable = roots(tmp_path)
        first = run_tiered(
            "support.integ_hf_run", fast, durable, "a", 10, tmp_path / "a.json", "--max-steps", "4"
        )
        assert [(p["epoch"], p["step"]) for p in first["published"]] == [(10, 2), (10, 4)]
        assert pairs(durable) == [(10, 2), (10, 4)]  # on_train_end waited for the replication
        save = "exec/a/checkpoint-4"
        listed = sorted(p.name for p in (fast / save).iterdir())
        assert "rng_state_1.pth" in listed  # rank 1's part too
        assert manifest_paths(durable, save) == listed
        shutil.rmtree(fast)  # the node is lost between the runs
        second = run_tiered(
            "support.integ_hf_run", fast, durable, "b", 20, tmp_path / "b.json", "--max-steps", "6"
        )
        assert second["resumed_from"] == str(fast / save)
        assert (second["first_step"], second["final_step"]) == (5, 6)
        assert pairs(fast) == [(10, 4), (20, 6)]
        assert pairs(durable) == [(10, 2), (10, 4), (20, 6)]

    def test_dcp_replicates_and_a_new_node_loads_the_durable_copy(self, tmp_path: Path) -> None:
        pytest.importorskip("torch")
        fast, durable = roots(tmp_path)
        first = run_tiered(
            "support.integ_dcp_run", fast, durable, "a", 10, tmp_path / "a.json", "--until", "2"
        )
        assert pairs(durable) == [(10, 1), (10, 2)]  # close() waited for the replication
        assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(manifest_paths(durable, "exec/a/step-2"))
        shutil.rmtree(fast)
        second = run_tiered(
            "support.integ_dcp_run", fast, durable, "b", 20, tmp_path / "b.json", "--until", "3"
        )
        assert second["resumed_from"] == str(fast / "exec/a/step-2")
        assert second["start"] == 3
        assert second["loaded_sum"] == pytest.approx(first["sums"]["2"])  # the restored bytes are the save
        assert pairs(durable) == [(10, 1), (10, 2), (20, 3)]

    def test_a_rank_killed_mid_save_then_a_lost_node_resumes_from_a_verified_durable_copy(
        self, tmp_path: Path
    ) -> None:
        """Rank 1 dies before its RNG state of step 4 and rank 0 is SIGKILLed before publishing it (the
        replicator dies with it, wherever it was); the node is then lost. The torn save is never durable;
        every durable entry verifies, digests included; the next run on a new node starts from the newest
        durable copy (checkpoint-2 when the replicator had finished it before the kill, else from scratch).
        """
        pytest.importorskip("transformers")
        fast, durable = roots(tmp_path)
        env = {"CKPT_ROOT": str(fast), "CKPT_DURABLE": str(durable), "DISPATCH_EPOCH": "10"}
        env["DISPATCH_ATTEMPT"] = "a"
        args = ["--out", str(tmp_path / "a.json"), "--max-steps", "8", "--kill-at", "4:rank1-without-rng"]
        run_killed_ranks("support.integ_hf_run", args, world_size=2, env=env, killed=0, logs=tmp_path / "a")
        assert pairs(fast) == [(10, 2)]
        on_durable = pairs(durable)
        assert on_durable in ([], [(10, 2)])  # never the torn checkpoint-4
        for _, step in on_durable:
            files = PosixTierFiles(str(durable))
            problem = manifest_problem(files, f"exec/a/checkpoint-{step}", digests=True)
            assert not isinstance(problem, str), problem
        shutil.rmtree(fast)
        second = run_tiered(
            "support.integ_hf_run", fast, durable, "b", 20, tmp_path / "b.json", "--max-steps", "5"
        )
        if on_durable:
            assert second["resumed_from"] == str(fast / "exec/a/checkpoint-2")
            assert second["first_step"] == 3
        else:
            assert second["resumed_from"] is None
            assert second["first_step"] == 1
        assert (20, 4) in pairs(durable)  # the new run's saves are replicated
