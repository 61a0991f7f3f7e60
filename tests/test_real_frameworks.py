"""The watcher and verified resolve against the real frameworks: PyTorch DCP and a Hugging Face Trainer run.

Marked ``frameworks``; each test imports its framework with ``pytest.importorskip``, so the default suite
skips them where torch / transformers are not installed. Nothing is downloaded: the model is built from a
config, the data is random tokens, and the hub is switched off.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.verify import resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import Framework

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


class Sidecar:
    """A watcher running in a thread beside the training loop, as the sidecar container runs beside it."""

    def __init__(self, store: PosixStore, framework: Framework, **kwargs: Any) -> None:
        self.published: list[Entry] = []
        self.watcher = Watcher(
            store,
            framework,
            store.exec_dir(ATTEMPT),
            EPOCH,
            kwargs.pop("interval", 0.05),
            on_published=self.published.append,
            scan_timeout=30,
            **kwargs,
        )
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.watcher.watch(self.stop)
        except Exception as exc:
            self.error = exc

    def __enter__(self) -> Sidecar:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        assert self.error is None, self.error


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
        with Sidecar(store, Framework.DCP) as sidecar:
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
        with Sidecar(store, Framework.DCP) as sidecar:
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

        with Sidecar(store, Framework.HF, settle=0.2) as sidecar:
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
