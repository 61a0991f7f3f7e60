"""Real two-process Hugging Face Trainer runs, each save cut short at a chosen write: the multi-rank proof.

Run as a script (the test starts it as a subprocess)::

    python tests/support/hf_ranks.py --out DIR

It reads one run per line on stdin, ``{"name": str, "kill": str | null}``, and answers each with one line on
stdout once the run is over, ``{"name", "exit": [rank 0's wait status, rank 1's]}``, so a caller can plan
later runs from what earlier ones recorded. For each run the script forks two processes
(ranks 0 and 1, ``gloo`` on CPU, a file rendezvous: no port) from itself, after importing torch and
transformers once, so a run costs a training step and a save instead of two interpreter start-ups. Each rank
trains one step of a tiny GPT-2 built from a config and saves ``DIR/<name>/exec/<ATTEMPT>/checkpoint-1``.

Every write the Trainer makes inside a checkpoint folder goes through one of three calls, and each is
wrapped: ``torch.save`` (training arguments, optimizer, scheduler, RNG states), the safetensors writer of
``save_pretrained`` (weights) and ``open`` for writing (``config.json``, ``generation_config.json``,
``trainer_state.json``). Each rank appends ``{"rank", "file"}`` to ``DIR/<name>/writes.jsonl`` after each such
write completes, so a clean run records the order of every rank's files. ``kill`` is
``rank=<r>,file=<name>,when=before|during|after``: rank ``r`` SIGKILLs itself just before that write, after
writing only the first half of the file (what a rank killed while writing leaves), or just after it. A rank
that reaches ``on_save`` (its part of the save done) SIGKILLs itself too: a job preempted right after its
save, with no collective left for a survivor to hang in.
"""

from __future__ import annotations

import argparse
import builtins
import json
import os
import signal
import sys
from typing import Any

ATTEMPT = "1.4101.0"
WORLD_SIZE = 2


def _parse_kill(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    return dict(part.split("=", 1) for part in text.split(","))


class WriteHooks:
    """Wraps the Trainer's write calls for one rank: records each file written, kills at the chosen one."""

    def __init__(self, rank: int, log: str, kill: dict[str, str] | None) -> None:
        self.rank = rank
        self.log = log
        self.kill = kill if kill is not None and int(kill["rank"]) == rank else None

    def _in_checkpoint(self, path: object) -> bool:
        return isinstance(path, str | os.PathLike) and f"{os.sep}checkpoint-" in os.fspath(path)

    def _die(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def before(self, path: str) -> None:
        kill = self.kill
        if kill is not None and kill["file"] == os.path.basename(path) and kill["when"] == "before":
            self._die()

    def after(self, path: str) -> None:
        name = os.path.basename(path)
        with builtins.open(self.log, "a") as f:  # the unwrapped open, on purpose
            f.write(json.dumps({"rank": self.rank, "file": name}) + "\n")
        if self.kill is not None and self.kill["file"] == name:
            if self.kill["when"] == "during":
                size = os.path.getsize(path)
                os.truncate(path, size // 2)
            self._die()

    def install(self) -> None:
        import torch
        import transformers.modeling_utils as modeling_utils

        hooks = self
        real_save = torch.save
        real_safe_save = modeling_utils.safe_save_file
        real_open = builtins.open

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if not hooks._in_checkpoint(f):
                return real_save(obj, f, *args, **kwargs)
            hooks.before(os.fspath(f))
            result = real_save(obj, f, *args, **kwargs)
            hooks.after(os.fspath(f))
            return result

        def safe_save(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
            hooks.before(os.fspath(filename))
            result = real_safe_save(tensors, filename, *args, **kwargs)
            hooks.after(os.fspath(filename))
            return result

        class Closing:
            """A file opened for writing that reports to the hooks once it is closed."""

            def __init__(self, file: Any, path: str) -> None:
                self._file = file
                self._path = path

            def __getattr__(self, name: str) -> Any:
                return getattr(self._file, name)

            def __enter__(self) -> Closing:
                return self

            def __exit__(self, *exc: object) -> None:
                self.close()

            def close(self) -> None:
                if not self._file.closed:
                    self._file.close()
                    hooks.after(self._path)

        def open_(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            if not (hooks._in_checkpoint(file) and any(c in mode for c in "wax")):
                return real_open(file, mode, *args, **kwargs)
            hooks.before(os.fspath(file))
            return Closing(real_open(file, mode, *args, **kwargs), os.fspath(file))

        torch.save = save
        modeling_utils.safe_save_file = safe_save
        builtins.open = open_


def train(rank: int, run_dir: str, rendezvous: str, kill: dict[str, str] | None) -> None:
    """One rank of one run: initialise the process group, train one step, save, die in ``on_save``."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(WORLD_SIZE),
        LOCAL_WORLD_SIZE=str(WORLD_SIZE),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="1",  # never dialled: the file rendezvous below initialises the group first
    )
    import torch
    import torch.distributed as dist
    import transformers

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=WORLD_SIZE)
    WriteHooks(rank, os.path.join(run_dir, "writes.jsonl"), kill).install()

    class RandomTokens(torch.utils.data.Dataset):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            self.data = torch.randint(0, 64, (16, 8), generator=torch.Generator().manual_seed(0))

        def __len__(self) -> int:
            return len(self.data)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"input_ids": self.data[i], "labels": self.data[i]}

    class DieAfterSave(transformers.TrainerCallback):  # type: ignore[misc]
        def on_save(self, *_: Any, **__: Any) -> None:
            os.kill(os.getpid(), signal.SIGKILL)

    transformers.set_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=8)
    args = transformers.TrainingArguments(
        output_dir=os.path.join(run_dir, "exec", ATTEMPT),
        max_steps=1,
        save_strategy="steps",
        save_steps=1,
        per_device_train_batch_size=2,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        logging_strategy="no",
    )
    trainer = transformers.Trainer(
        model=transformers.GPT2LMHeadModel(config),
        args=args,
        train_dataset=RandomTokens(),
        callbacks=[DieAfterSave()],
    )
    trainer.train()
    os.kill(os.getpid(), signal.SIGKILL)  # not reached: on_save ends every rank


def run(out: str, name: str, kill: str | None, timeout: float) -> list[int]:
    """Fork both ranks of one run, wait for them (at most ``timeout`` each), return their wait statuses."""
    run_dir = os.path.join(out, name)
    os.makedirs(run_dir)
    rendezvous = os.path.join(run_dir, "rendezvous")
    pids = []
    for rank in range(WORLD_SIZE):
        pid = os.fork()
        if pid == 0:  # the child: never returns into the parent's code
            os.dup2(2, 1)  # stdout is the parent's answer channel; the libraries' chatter goes to stderr
            try:
                train(rank, run_dir, rendezvous, _parse_kill(kill))
            finally:
                os._exit(70)
        pids.append(pid)
    statuses = []
    for pid in pids:
        signal.alarm(int(timeout))  # a rank that hangs (it should not) fails the run instead of the suite
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        finally:
            signal.alarm(0)
        statuses.append(status)
    return statuses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args(argv)
    # Import once, before any fork; run no torch operation here (forked children start the thread pools).
    import torch  # noqa: F401
    import transformers
    import transformers.modeling_utils  # noqa: F401

    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(InterruptedError()))
    for line in sys.stdin:
        spec = json.loads(line)
        statuses = run(args.out, spec["name"], spec.get("kill"), args.timeout)
        print(json.dumps({"name": spec["name"], "exit": statuses}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
