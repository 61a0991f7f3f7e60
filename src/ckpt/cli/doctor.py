"""``ckpt doctor``: checks that a root is usable before a job relies on it.

Checks, each reported with a name, a verdict and one line of detail (never a secret):

* ``root``: the root is reachable and its publication log parses.
* ``credentials`` (S3): which credential source answered — its name only.
* ``proxy`` (S3): which proxy the endpoint gets, user-info redacted, or ``direct``.
* ``exclusive-create``: the store refuses a second exclusive create of the same name. On S3 this catches
  servers that ignore ``If-None-Match: *`` and would silently overwrite entries; on POSIX it also proves the
  root is writable and fsync works.

Exit 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ckpt.domain.errors import CkptError

if TYPE_CHECKING:
    from ckpt.cli import Context

__all__ = ["register", "run"]


def register(commands: Any) -> None:
    """Add the ``doctor`` sub-command."""
    p: argparse.ArgumentParser = commands.add_parser(
        "doctor", help="check the root, credentials, proxy, and that the store honours exclusive create"
    )
    p.set_defaults(handler=run)


def _check_root(ctx: Context) -> tuple[bool, str]:
    store = ctx.store()
    entries = store.entries()
    if not entries:
        return True, f"{store.root} is reachable; nothing is published yet"
    latest = entries[-1]
    return True, (
        f"{store.root} is reachable; {len(entries)} entries, latest epoch {latest.epoch} step {latest.step}"
    )


def _checks(ctx: Context) -> list[tuple[str, bool, str]]:
    results: list[tuple[str, bool, str]] = []

    def check(name: str, probe: Any) -> bool:
        try:
            ok, detail = probe()
        except CkptError as exc:
            ok, detail = False, str(exc)
        results.append((name, ok, detail))
        return bool(ok)

    if not check("root", lambda: _check_root(ctx)):
        return results
    store = ctx.store()
    if store.root.startswith("s3://"):
        from ckpt.adapters import s3

        check("credentials", lambda: s3.describe_credentials(store))
        check("proxy", lambda: s3.describe_proxy(store))
        check("exclusive-create", lambda: s3.probe_exclusive_create(store))
    else:
        from ckpt.adapters.posix import PosixStore, probe_exclusive_create

        assert isinstance(store, PosixStore)
        check("exclusive-create", lambda: probe_exclusive_create(store))
    return results


def run(ctx: Context) -> int:
    """Run every check and print the verdicts."""
    from ckpt.cli.output import print_json

    results = _checks(ctx)
    ok = all(passed for _, passed, _ in results)
    if ctx.json:
        checks = [{"name": n, "ok": passed, "detail": d} for n, passed, d in results]
        print_json({"ok": ok, "checks": checks}, ctx.stdout)
    else:
        for name, passed, detail in results:
            ctx.say(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}")
    return 0 if ok else 1
