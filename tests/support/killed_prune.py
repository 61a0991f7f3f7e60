"""The process that forks the kill-during-prune tests' children: a prune that SIGKILLs itself, ``ckpt`` runs.

Run from ``tests/`` as ``python -m support.killed_prune`` (the tests do so with ``cwd``). It imports ``ckpt``
and botocore once, builds one S3 client (no request sent, so no connection exists to share), and then reads
one JSON request a line from stdin. For each it forks a child, waits for it, and answers one JSON line:
``{"status": <exit code>, "signal": <signal number or 0>, "stdout": ..., "stderr": ...}``. Each child is a
separate process that dies its own death; only the import cost is shared, so a round costs milliseconds
instead of a second and a half of botocore start-up per process.

Requests:

* ``{"op": "prune", "store": "posix"|"s3", "root": R, "keep": K, "kill_at": I}``: ``prune(K)`` on root R,
  killed with SIGKILL at its removal boundary I of the saves' files (0 = before the first file or folder of
  a save is removed; n = every one of them removed, before a journal is dropped; -1 = before the first
  entry is removed, the journal written). POSIX counts each
  ``unlink``/``rmdir`` under ``exec/`` and each ``unlink`` of a journal (``FaultySyscalls`` names the
  targets); S3 counts the keys of ``DeleteObjects`` under ``exec/``, cutting the request that crosses I
  down to the keys before it (a partial batch), and each ``DeleteObject`` of a journal.
* ``{"op": "cli", "argv": [...], "env": {...}}``: ``ckpt.cli.main(argv)`` with ``env`` added to the
  environment; the child exits with its exit code.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import traceback
from typing import Any

from support.faulty_syscalls import FaultySyscalls
from support.s3_processes import FAKE_ENVIRON, direct_client

__all__ = ["main"]

_JOURNAL = ".ckpt-prune-"


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class _KillingSyscalls(FaultySyscalls):
    """Real system calls; the process kills itself instead of making removal call ``kill_at + 1``."""

    __slots__ = ("_kill_at", "_removals")

    def __init__(self, base: str, kill_at: int) -> None:
        super().__init__(base)
        self._kill_at = kill_at
        self._removals = 0

    def _enter(self, operation: str, target: str, path: str | int) -> Any:
        if self._kill_at < 0 and operation == "unlink" and target.startswith("pub/"):
            _die()  # kill point -1: the journal written, no entry removed yet
        counted = (operation in ("unlink", "rmdir") and target.startswith("exec/")) or (
            operation == "unlink" and target.startswith(_JOURNAL) and ".tmp-" not in target
        )  # a decision's temporary name goes before any save's file: not a removal boundary
        if counted:
            if self._removals == self._kill_at:
                _die()
            self._removals += 1
        return super()._enter(operation, target, path)


def _s3_killer(client: Any, prefix: str, kill_at: int) -> None:
    """Register the hooks that cut the removal at boundary ``kill_at`` on ``client`` (this child's only)."""
    state = {"removed": 0, "die_after": False}
    exec_prefix = f"{prefix}exec/"

    def before_delete_objects(params: Any, **_: Any) -> None:
        objects = params["Delete"]["Objects"]
        if kill_at < 0 and objects and objects[0]["Key"].startswith(f"{prefix}pub/"):
            _die()  # kill point -1: the journal written, no entry removed yet
        if not objects or not objects[0]["Key"].startswith(exec_prefix):
            return  # the entries in pub/: not a boundary of the saves
        room = kill_at - state["removed"]
        if room <= 0:
            _die()
        if room < len(objects):
            params["Delete"]["Objects"] = objects[:room]
            state["die_after"] = True
        state["removed"] += min(room, len(objects))

    def after_delete_objects(**_: Any) -> None:
        if state["die_after"]:
            _die()

    def before_delete_object(params: Any, **_: Any) -> None:
        if params["Key"].startswith(f"{prefix}{_JOURNAL}") and state["removed"] >= kill_at:
            _die()

    client.meta.events.register("before-parameter-build.s3.DeleteObjects", before_delete_objects)
    client.meta.events.register("after-call.s3.DeleteObjects", after_delete_objects)
    client.meta.events.register("before-parameter-build.s3.DeleteObject", before_delete_object)


def _prune(request: dict[str, Any], client: Any) -> int:
    root, keep, kill_at = request["root"], int(request["keep"]), int(request["kill_at"])
    if request["store"] == "posix":
        from ckpt.adapters.posix import PosixStore

        PosixStore(root, syscalls=_KillingSyscalls(root, kill_at)).prune(keep)
    else:
        from ckpt.adapters.s3 import S3Store

        store = S3Store(root, client)
        prefix = root[len("s3://") :].partition("/")[2]
        _s3_killer(client, f"{prefix}/" if prefix else "", kill_at)
        store.prune(keep)
    return 0  # the kill point lay beyond this prune's removals


def _cli(request: dict[str, Any]) -> int:
    from ckpt.cli import main

    os.environ.update(request.get("env", {}))
    return main(list(request["argv"]))


def _child(request: dict[str, Any], client: Any, out: int, err: int) -> None:
    os.dup2(out, 1)
    os.dup2(err, 2)
    code = 70
    try:
        code = _prune(request, client) if request["op"] == "prune" else _cli(request)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(request: dict[str, Any], client: Any) -> dict[str, Any]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            _child(request, client, out.fileno(), err.fileno())
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return {
            "status": os.waitstatus_to_exitcode(status),
            "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
        }


def main() -> int:
    endpoint = sys.argv[1] if len(sys.argv) > 1 else ""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update(FAKE_ENVIRON)
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    import ckpt.cli  # noqa: F401  (imported once, here: the children only fork)

    client = direct_client(endpoint, max_attempts=1) if endpoint else None
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        answer = _run(json.loads(line), client)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
