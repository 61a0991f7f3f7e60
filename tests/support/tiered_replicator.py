"""``ckpt replicate`` in a process that signals itself at a file boundary (tests/test_tiered.py).

Usage: ``python -m support.tiered_replicator MODE N CKPT-ARGS...``. MODE ``kill`` sends SIGKILL to this
process right after the N-th file is stored on the durable root (the file whole, nothing after it done);
``term`` sends SIGTERM there instead (the replicator must stop at the next boundary); ``kill-manifest``
sends SIGKILL right after the N-th manifest is written (before its entry is published); ``kill-restore``
sends SIGKILL right after the N-th file a restore installed in the fast root (``TIERED_FAST_ROOT``).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from ckpt.adapters.posix.tiered import PosixTierFiles
from ckpt.adapters.s3.durable import S3DurableFiles
from ckpt.cli import main


def _after(cls: Any, method: str, count: int, signum: int, *, fast: bool) -> None:
    """Signal this process after the ``count``-th call of ``method`` on the fast root (``fast``) or on the
    durable one."""
    original = getattr(cls, method)
    seen = [0]

    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if (getattr(self, "root", None) == os.environ.get("TIERED_FAST_ROOT")) is fast:
            seen[0] += 1
            if seen[0] == count:
                os.kill(os.getpid(), signum)
        return result

    setattr(cls, method, wrapped)


if __name__ == "__main__":
    mode, count, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    method = {"kill-manifest": "write_small", "kill-restore": "install"}.get(mode, "put")
    signum = signal.SIGTERM if mode == "term" else signal.SIGKILL
    for cls in (PosixTierFiles, S3DurableFiles):
        if hasattr(cls, method):
            _after(cls, method, count, signum, fast=mode == "kill-restore")
    sys.exit(main(rest))
