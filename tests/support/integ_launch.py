"""Launch the processes of one real multi-process run on CPU (gloo over 127.0.0.1), the way torchrun does.

Every rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``
and a free ``MASTER_PORT``, plus the job's variables; each runs ``python -m <module> <args>`` in ``tests/``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["end_rank", "free_port", "run_killed_ranks", "run_ranks"]

TESTS = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _rank_env(env: Mapping[str, str], world_size: int) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    base.update(env)
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": str(world_size)})
    base.update(
        {"LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    )
    return base


def run_killed_ranks(
    module: str,
    args: Sequence[str],
    *,
    world_size: int,
    env: Mapping[str, str],
    killed: int,
    logs: Path,
    timeout: float = 600,
) -> None:
    """Run ``world_size`` ranks until rank ``killed`` dies of SIGKILL, then SIGKILL the others (a node
    failure) and wait for them. ``AssertionError`` with the logs when another rank ends first, the killed
    rank ends otherwise, or nothing happens within ``timeout``. Each rank's output goes to ``logs/rank-<i>``.
    """
    base = _rank_env(env, world_size)
    logs.mkdir(parents=True, exist_ok=True)
    processes = []
    for rank in range(world_size):
        rank_env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        with (logs / f"rank-{rank}").open("wb") as out:
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-m", module, *args],
                    cwd=TESTS,
                    env=rank_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + timeout
    try:
        while processes[killed].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    code = processes[killed].returncode
    if code != -signal.SIGKILL:
        output = "\n".join(
            f"rank {r}:\n{(logs / f'rank-{r}').read_text()[-3000:]}" for r in range(world_size)
        )
        raise AssertionError(f"rank {killed} of {module} ended with {code}, not SIGKILL:\n{output}")


def run_ranks(
    module: str,
    args: Sequence[str],
    *,
    world_size: int,
    env: Mapping[str, str],
    timeout: float = 900,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``world_size`` ranks of ``module`` to the end; ``AssertionError`` with the logs if one fails."""
    base = _rank_env(env, world_size)
    processes = []
    for rank in range(world_size):
        rank_env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        processes.append(
            subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=TESTS,
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    results = []
    for rank, process in enumerate(processes):
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            output, _ = process.communicate()
        results.append(subprocess.CompletedProcess(process.args, process.returncode, output, ""))
        if process.returncode != 0:
            for other in processes:
                other.kill()
            raise AssertionError(f"rank {rank} of {module} exited {process.returncode}:\n{output[-4000:]}")
    return results


def end_rank() -> None:
    """End a rank that finished its run: tear the process group down, flush, and leave at once.

    Left to the interpreter's shutdown, gloo's threads can abort a rank that finished cleanly ("terminate
    called without an active exception", exit -6): seen in fresh-clone CI runs, once even after
    ``destroy_process_group``, so the rank now also skips the interpreter's shutdown (``os._exit``), whose
    destructors are where the abort happens. Every file the rank wrote is closed by then.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
