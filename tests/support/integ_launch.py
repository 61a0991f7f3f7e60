"""Launch the processes of one real multi-process run on CPU (gloo over 127.0.0.1), the way torchrun does.

Every rank gets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1``
and a free ``MASTER_PORT``, plus the job's variables; each runs ``python -m <module> <args>`` in ``tests/``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["free_port", "run_ranks"]

TESTS = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def run_ranks(
    module: str,
    args: Sequence[str],
    *,
    world_size: int,
    env: Mapping[str, str],
    timeout: float = 900,
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``world_size`` ranks of ``module`` to the end; ``AssertionError`` with the logs if one fails."""
    port = str(free_port())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    base.update(env)
    base.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(world_size)})
    base.update(
        {"LOCAL_WORLD_SIZE": str(world_size), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    )
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
