"""The watcher and verified resolve against the real frameworks: PyTorch DCP and a Hugging Face Trainer run.

Marked ``frameworks``; each test imports its framework with ``pytest.importorskip``, so the default suite
skips them where torch / transformers are not installed. Nothing is downloaded: the model is built from a
config, the data is random tokens, and the hub is switched off.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import read_markers, resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.frameworks import Framework, markers_problem
from support.sidecar import Sidecar

# Never reach a hub: the libraries read these when they are first imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

pytestmark = [
    pytest.mark.frameworks,
    # These tests check our watcher against the frameworks, not the frameworks' own deprecation notices.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

ATTEMPT = "3.4103.0"
EPOCH = 3_000_000


@pytest.fixture
def store(tmp_path: Path) -> PosixStore:
    root = tmp_path / "root"
    root.mkdir()
    return PosixStore(str(root))


class TestPyTorchDCP:
    def test_saves_are_published_and_the_newest_loads_back(self, store: PosixStore) -> None:
        """Real DCP saves into exec/<attempt>/step-N are published; the verified newest one loads back."""
        torch = pytest.importorskip("torch")
        dcp = pytest.importorskip("torch.distributed.checkpoint")

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        saved: dict[int, dict[str, Any]] = {}
        with Sidecar(store, Framework.DCP, ATTEMPT, EPOCH) as sidecar:
            for step in (10, 20, 30):
                for _ in range(3):
                    optimizer.zero_grad()
                    model(torch.randn(5, 8)).pow(2).mean().backward()
                    optimizer.step()
                state = {"model": model.state_dict()}
                dcp.save(state, checkpoint_id=os.path.join(store.exec_dir(ATTEMPT), f"step-{step}"))
                saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
        assert sorted(e.step for e in sidecar.published) == [10, 20, 30]
        assert [e.step for e in store.entries()] == [10, 20, 30]

        verified = resolve_verified(store, Framework.DCP)
        assert verified.entry is not None
        assert (verified.entry.step, verified.skipped) == (30, ())

        fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        target = {"model": fresh.state_dict()}
        dcp.load(target, checkpoint_id=store.location(verified.entry))
        fresh.load_state_dict(target["model"])
        for name, tensor in fresh.state_dict().items():
            assert torch.equal(tensor, saved[30][name]), name

    def test_a_save_without_metadata_is_not_published(self, store: PosixStore) -> None:
        """A DCP save whose .metadata never arrived (a crashed coordinator) is passed over."""
        torch = pytest.importorskip("torch")
        dcp = pytest.importorskip("torch.distributed.checkpoint")

        folder = os.path.join(store.exec_dir(ATTEMPT), "step-5")
        dcp.save({"w": torch.ones(3)}, checkpoint_id=folder)
        os.rename(os.path.join(folder, ".metadata"), os.path.join(folder, ".metadata.tmp"))
        with Sidecar(store, Framework.DCP, ATTEMPT, EPOCH) as sidecar:
            pass
        assert sidecar.published == []


class TestHuggingFaceTrainer:
    def test_trainer_run_is_published_and_resumable(self, store: PosixStore) -> None:
        """A Trainer run with rotation: every surviving checkpoint is published; verified resolve resumes."""
        torch = pytest.importorskip("torch")
        transformers = pytest.importorskip("transformers")
        pytest.importorskip("accelerate")

        class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]
            def __init__(self, n: int) -> None:
                generator = torch.Generator().manual_seed(0)
                self.data = torch.randint(0, 64, (n, 16), generator=generator)

            def __len__(self) -> int:
                return len(self.data)

            def __getitem__(self, i: int) -> dict[str, Any]:
                return {"input_ids": self.data[i], "labels": self.data[i]}

        def trainer(max_steps: int) -> Any:
            config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
            transformers.set_seed(0)
            args = transformers.TrainingArguments(
                output_dir=store.exec_dir(ATTEMPT),
                max_steps=max_steps,
                per_device_train_batch_size=4,
                save_strategy="steps",
                save_steps=3,
                save_total_limit=2,
                logging_steps=3,
                report_to=[],
                use_cpu=True,
                disable_tqdm=True,
                dataloader_num_workers=0,
            )
            return transformers.Trainer(
                model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=RandomTokens(64)
            )

        with Sidecar(store, Framework.HF, ATTEMPT, EPOCH, settle=0.2) as sidecar:
            trainer(12).train()
        exec_dir = Path(store.exec_dir(ATTEMPT))
        surviving = sorted(p.name for p in exec_dir.iterdir() if p.name.startswith("checkpoint-"))
        assert surviving == ["checkpoint-12", "checkpoint-9"]  # save_total_limit=2 removed the rest
        published = {os.path.basename(store.location(e)) for e in store.entries()}
        assert set(surviving) <= published
        assert len(sidecar.published) == len(published)

        verified = resolve_verified(store, Framework.HF)
        assert verified.entry is not None
        assert verified.entry.step == 12
        assert verified.skipped == ()

        # The framework resumes from the verified location, which proves the published save is loadable.
        resumed = trainer(15)
        resumed.train(resume_from_checkpoint=store.location(verified.entry))
        assert resumed.state.global_step == 15


RANKS_SCRIPT = os.path.join(os.path.dirname(__file__), "support", "hf_ranks.py")
RANKS_ATTEMPT = "1.4101.0"  # support.hf_ranks.ATTEMPT


class TwoRankRuns:
    """The two-process Trainer runner (``support/hf_ranks.py``) as a subprocess: one run per request."""

    def __init__(self, out: Path) -> None:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo",  # gloo's own connections stay on 127.0.0.1
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "PYTHONWARNINGS": "ignore",
        }
        self.out = out
        self.stderr: IO[bytes] = open(out.parent / "ranks.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, RANKS_SCRIPT, "--out", str(out), "--timeout", "120"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env=env,
        )

    def run(self, name: str, kill: str | None) -> Path:
        """Run both ranks once (``kill`` as the script takes it); return the run's root."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps({"name": name, "kill": kill}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the runner died; see {self.out.parent / 'ranks.log'}"
        assert json.loads(line)["name"] == name
        return self.out / name

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        self.process.wait(60)
        self.process.stdout.close()
        self.stderr.close()


@pytest.fixture
def two_rank_runs(tmp_path: Path) -> Iterator[TwoRankRuns]:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    runs = TwoRankRuns(tmp_path / "runs")
    try:
        yield runs
    finally:
        runs.close()


def recorded_writes(run_root: Path) -> dict[int, list[str]]:
    """Each rank's files, in the order it finished writing them, as the run's write hooks logged them."""
    order: dict[int, list[str]] = {0: [], 1: []}
    for line in (run_root / "writes.jsonl").read_text().splitlines():
        record = json.loads(line)
        order[record["rank"]].append(record["file"])
    return order


def assert_loadable(folder: Path, files: list[str]) -> None:
    """Every file the clean run wrote is in ``folder`` and loads: torch files, safetensors, JSON."""
    import safetensors.torch
    import torch

    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    for name in files:
        path = folder / name
        if name.endswith((".pth", ".pt", ".bin")):
            torch.load(path, weights_only=False)
        elif name.endswith(".safetensors"):
            safetensors.torch.load_file(path)
        else:
            json.loads(path.read_text())


class TestHuggingFaceTrainerTwoRanks:
    def test_a_save_cut_short_on_any_rank_at_any_write_is_never_published(
        self, two_rank_runs: TwoRankRuns, tmp_path: Path
    ) -> None:
        """Two real ranks, each killed before, during or after each of its writes: only whole saves go out."""
        clean = two_rank_runs.run("clean", None)
        order = recorded_writes(clean)
        # The Trainer's file order this proof relies on: rank 1 writes only its RNG state; rank 0 ends with
        # its RNG state and then trainer_state.json (the reference, frameworks-on-disk.md).
        assert order[1] == ["rng_state_1.pth"]
        assert order[0][-2:] == ["rng_state_0.pth", "trainer_state.json"]
        all_files = order[0] + order[1]

        # Every boundary of every rank: before each write and after its last one ("after" any other write is
        # "before" the next); and during each write whose half the rule must see through (the RNG states and
        # trainer_state.json: half of an earlier file leaves no trainer_state.json, as "before" does). Only
        # a rank that finished its part leaves a whole save.
        checked = {"rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"}
        points = [(rank, name, "before") for rank in (0, 1) for name in order[rank]]
        points += [(rank, name, "during") for rank in (0, 1) for name in order[rank] if name in checked]
        points += [(rank, order[rank][-1], "after") for rank in (0, 1)]
        roots: dict[str, tuple[Path, bool]] = {"clean": (clean, True)}
        for rank, name, when in points:
            run_name = f"rank{rank}-{when}-{name}"
            root = two_rank_runs.run(run_name, f"rank={rank},file={name},when={when}")
            roots[run_name] = (root, when == "after")

        # The sidecar as deployed: ckpt watch --once with WORLD_SIZE from the environment, on copies of the
        # clean run and of the run whose rank 1 died while writing its RNG state.
        for run_name, expected in (("clean", [1]), ("rank1-during-rng_state_1.pth", [])):
            copy = tmp_path / "cli" / run_name
            shutil.copytree(roots[run_name][0], copy)
            watched = subprocess.run(
                [
                    *(sys.executable, "-m", "ckpt", "--root", str(copy), "--json", "watch"),
                    *("--framework", "hf", "--attempt", RANKS_ATTEMPT, "--epoch", "7", "--once"),
                    *("--settle", "0"),
                ],
                env={**os.environ, "WORLD_SIZE": "2"},
                capture_output=True,
                text=True,
                check=True,
                timeout=120,
            )
            assert [e["step"] for e in json.loads(watched.stdout)["published"]] == expected, watched.stderr

        # Every run, in process: published exactly when whole; what is published loads.
        old_rule_passes = []
        for run_name, (root, whole) in roots.items():
            store = PosixStore(str(root))
            saves = store.exec_dir(RANKS_ATTEMPT)
            folder = Path(saves) / "checkpoint-1"
            created = Watcher(store, Framework.HF, saves, 7, 1.0, settle=0, world_size=2).scan()
            assert [e.step for e in created] == ([1] if whole else []), run_name
            if whole:
                assert_loadable(folder, all_files)
            if (
                not whole
                and markers_problem(Framework.HF, read_markers(store, Framework.HF, str(folder))) is None
            ):
                old_rule_passes.append(run_name)  # the rule without a world size would have published it
            # Verified resolve applies the same rule, even to a save that something else published.
            if not whole:
                store.publish(7, 1, str(folder))
            verified = resolve_verified(store, Framework.HF, world_size=2)
            assert (verified.entry is not None) == whole, (run_name, verified)
        # Without the world size, the rank-1 kills leave a save that trainer_state.json and a settled
        # listing would pass: the gap this rule closes.
        assert sorted(old_rule_passes) == ["rank1-before-rng_state_1.pth", "rank1-during-rng_state_1.pth"]
