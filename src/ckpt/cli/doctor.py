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
    from ckpt.adapters.s3 import S3Store
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


def _describe_credentials(store: S3Store) -> tuple[bool, str]:
    source = store.connection.credentials_source if store.connection else None
    if source is None:
        return False, "no credential source has answered yet"
    return True, f"signed with credentials from source {source!r}"


def _describe_proxy(store: S3Store) -> tuple[bool, str]:
    if store.connection is None:
        return True, "unknown (client injected)"
    via = store.connection.proxy or "direct (no proxy)"
    return True, f"{store.connection.endpoint} is reached {'through ' if store.connection.proxy else ''}{via}"


def _probe_s3(store: S3Store) -> tuple[bool, str]:
    probe = store.probe_exclusive_create()
    return probe.honoured, probe.detail


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
        from ckpt.adapters.s3 import S3Store

        assert isinstance(store, S3Store)
        s3_store = store
        check("credentials", lambda: _describe_credentials(s3_store))
        check("proxy", lambda: _describe_proxy(s3_store))
        check("exclusive-create", lambda: _probe_s3(s3_store))
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
