"""``ckpt doctor``: checks that a root is usable before a job relies on it.

Checks, each reported with a name, a verdict and one line of detail (never a secret):

* ``root``: the root is reachable and its publication log parses.
* ``credentials`` (S3): which credential source answered — its name only.
* ``proxy`` (S3): for each host the client contacted for the root (the bucket's own host with
  virtual-hosted addressing; the endpoint when no request was sent), the proxy it is routed through,
  user-info redacted, or ``direct``. It fails when such a proxy does not accept a TCP connection, and
  runs even when the root check failed, since an unreachable proxy is a likely reason.
* ``exclusive-create``: on S3, eight concurrent ``If-None-Match: *`` creates of one new key make exactly one
  winner and seven 412s (``--json`` adds ``writers``, ``created`` and ``refused``). This catches servers
  that ignore the condition (or a proxy that strips it) and servers that check and then write, letting two
  concurrent writers both win: either would silently break the log. On POSIX the store refuses a second
  exclusive create of the same name, which also proves the root is writable and fsync works.
* ``write-settings`` (S3): one probe object written as every object is (``[s3]`` ``sse``,
  ``sse_kms_key_id``, ``storage_class``, ``expected_bucket_owner``) comes back, by ``HeadObject``, with
  the encryption, KMS key and storage class asked for, and with ``expected_bucket_owner`` set, a
  ``HeadObject`` expecting another owner is refused (else the server ignores the setting). Its detail
  shows what came back.

With ``--durable DURABLE`` (spec/tiered.md §11) every check above runs again on the durable root, each
named ``durable <check>``; on an S3 durable root, ``durable multipart-cleanup`` says whether a lifecycle
rule of the bucket aborts the incomplete multipart uploads a killed replicator leaves, and how many there
are (``--json`` adds ``incomplete_uploads``): without such a rule it *warns* (``warn``), as it does when the
lifecycle cannot be read, since nothing is wrong with the checkpoints, only with what the bucket keeps.
Then ``tiers`` pairs the two roots (``ckpt.store.open_tiers``) and
reports the replication lag: the fast entries not yet durable and the steps between the two roots'
newest entries (``--json`` adds ``pending`` and ``lag_steps``). A lag is not a failure; a pair that is
not allowed (the fast root not a POSIX path, the durable root inside it) is.

Exit 0 when no check fails (a warning is not a failure), 1 otherwise.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ckpt.domain.errors import CkptError

if TYPE_CHECKING:
    from ckpt.adapters.s3 import S3Store
    from ckpt.cli import Context

__all__ = ["WARN", "register", "run"]

_DURABLE = "durable "  # the prefix of the durable root's checks

#: The verdict of a check that found something to fix that is not a failure (cli.md §9.1).
WARN = "warn"

#: How long the proxy check waits for a TCP connection to a proxy.
_PROXY_CONNECT_SECONDS = 5.0


def register(commands: Any) -> None:
    """Add the ``doctor`` sub-command."""
    p: argparse.ArgumentParser = commands.add_parser(
        "doctor", help="check the root, credentials, proxy, and that the store honours exclusive create"
    )
    p.add_argument(
        "--durable",
        metavar="DURABLE",
        help="also check this durable root (s3:// or a path) and the replication lag to it",
    )
    p.set_defaults(handler=run)


def _check_root(open_store: Any) -> tuple[bool, str]:
    store = open_store()
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


def _check_proxy(store: S3Store) -> tuple[bool, str]:
    from ckpt.adapters.proxy import probe_proxy
    from ckpt.domain.redaction import redact_url

    connection = store.connection
    if connection is None:
        return True, "unknown (client injected)"
    ok, lines = True, []
    for origin in connection.routes() or [connection.endpoint]:
        proxy = connection.proxy_for(origin)
        if proxy is None:
            lines.append(f"{origin} is reached direct (no proxy)")
            continue
        problem = probe_proxy(proxy, _PROXY_CONNECT_SECONDS)
        if problem is None:
            lines.append(f"{origin} is reached through {redact_url(proxy)}")
        else:
            ok = False
            shown = redact_url(proxy)
            lines.append(f"{origin} is routed through the proxy {shown}, which cannot be reached: {problem}")
    return ok, "; ".join(lines)


def _probe(store: object) -> tuple[bool, str, dict[str, int]]:
    from ckpt.domain.ports import ProbesExclusiveCreate

    if not isinstance(store, ProbesExclusiveCreate):
        return False, "this store cannot probe exclusive create", {}
    probe = store.probe_exclusive_create()
    # Only a concurrent probe (S3) counts its creates; --json shows the numbers then.
    numbers = {"writers": probe.writers, "created": probe.created, "refused": probe.refused}
    return probe.honoured, probe.detail, numbers if probe.writers else {}


def _checks(ctx: Context, numbers: dict[str, dict[str, int]]) -> list[tuple[str, bool | str, str]]:
    """Run the checks; a check that counted something (the probe's creates) leaves it in ``numbers``."""
    results: list[tuple[str, bool | str, str]] = []

    def check(name: str, probe: Any) -> bool:
        try:
            ok, detail, *counted = probe()
        except CkptError as exc:
            ok, detail, counted = False, str(exc), []
        results.append((name, ok, detail))
        if counted:
            numbers[name] = counted[0]
        return bool(ok)

    fast = _root_checks(check, ctx.store, "")
    durable_root = getattr(ctx.args, "durable", None)
    if durable_root is None:
        return results

    def open_durable() -> Any:
        from ckpt.store import open_store

        if not durable_root:
            raise CkptError("--durable is empty: give the durable root")
        config = ctx.config() if ctx.args.config or ctx.environ.get("CKPT_CONFIG") else None
        return open_store(durable_root, config=config, environ=ctx.environ)

    durable = _root_checks(check, _once(open_durable), _DURABLE)
    if fast is not None and durable is not None:
        check("tiers", lambda: _check_tiers(fast, durable))
    return results


def _once(opener: Any) -> Any:
    opened: list[Any] = []

    def open_once() -> Any:
        if not opened:
            opened.append(opener())
        return opened[0]

    return open_once


def _root_checks(check: Any, open_store: Any, prefix: str) -> Any:
    """The checks of one root, each named ``<prefix><check>``; the store when its root check passed."""
    root_ok = check(f"{prefix}root", lambda: _check_root(open_store))
    try:
        store = open_store()
    except CkptError:  # the root check already reported why the store cannot be opened
        return None
    if store.root.startswith("s3://"):
        from ckpt.adapters.s3 import S3Store

        assert isinstance(store, S3Store)
        s3_store = store
        if root_ok:
            check(f"{prefix}credentials", lambda: _describe_credentials(s3_store))
        check(f"{prefix}proxy", lambda: _check_proxy(s3_store))
        if root_ok:
            check(f"{prefix}exclusive-create", lambda: _probe(s3_store))
            check(f"{prefix}write-settings", s3_store.check_write_settings)
        if root_ok and prefix == _DURABLE:  # only the replicator makes multipart uploads
            check(f"{prefix}multipart-cleanup", lambda: _check_multipart_cleanup(s3_store))
    elif root_ok:
        check(f"{prefix}exclusive-create", lambda: _probe(store))
    return store if root_ok else None


def _check_multipart_cleanup(store: S3Store) -> tuple[bool | str, str, dict[str, int]]:
    """Whether the bucket's lifecycle aborts the root's incomplete multipart uploads (cli.md §9.2)."""
    found = store.multipart_cleanup()
    if found.incomplete is None:
        now = "its incomplete multipart uploads could not be listed (access denied)"
    else:
        now = f"{found.incomplete}{' or more' if found.more else ''} incomplete under {found.location} now"
    numbers = {} if found.incomplete is None else {"incomplete_uploads": found.incomplete}
    if found.rule is not None:
        rule, days = found.rule
        after = f"{days} day{'' if days == 1 else 's'}"
        detail = f"lifecycle rule {rule!r} aborts incomplete multipart uploads after {after}; {now}"
        return True, detail, numbers
    if not found.rules_known:
        detail = (
            "the bucket's lifecycle rules could not be read (access denied), so whether one aborts the "
            f"incomplete multipart uploads a killed replicator leaves is unknown; {now}"
        )
        return WARN, detail, numbers
    detail = (
        "no enabled lifecycle rule of the bucket aborts incomplete multipart uploads under "
        f"{found.location}: the parts of an upload a replicator was killed in stay stored, and billed, "
        f'until one does (docs/tiered.md, "Checking both roots"); {now}'
    )
    return WARN, detail, numbers


def _check_tiers(fast: Any, durable: Any) -> tuple[bool, str, dict[str, int]]:
    """The pair is allowed (spec/tiered.md §1.1); the lag: entries not yet durable, steps behind (§11)."""
    from ckpt.application.replication import not_yet_durable
    from ckpt.store import open_tiers

    open_tiers(fast, durable)
    newest = max(durable.entries(), default=None)
    fast_entries = fast.entries()
    pending = not_yet_durable(fast_entries, newest)
    lag = 0 if not fast_entries else fast_entries[-1].step - (0 if newest is None else newest.step)
    lag = max(lag, 0)
    shown = "none" if newest is None else f"epoch {newest.epoch} step {newest.step}"
    detail = f"{len(pending)} entries not yet durable, {lag} steps behind; newest durable: {shown}"
    return True, detail, {"pending": len(pending), "lag_steps": lag}


def _warning(verdict: bool | str) -> dict[str, bool]:
    return {"warning": True} if verdict == WARN else {}


def run(ctx: Context) -> int:
    """Run every check and print the verdicts."""
    from ckpt import __version__
    from ckpt.cli.output import print_json

    numbers: dict[str, dict[str, int]] = {}
    results = _checks(ctx, numbers)
    ok = all(passed is not False for _, passed, _ in results)
    if ctx.json:
        checks = [
            {"name": n, "ok": passed is not False, **_warning(passed), "detail": d, **numbers.get(n, {})}
            for n, passed, d in results
        ]
        print_json({"ok": ok, "version": __version__, "checks": checks}, ctx.stdout)
    else:
        for name, passed, detail in results:
            verdict = "warn" if passed == WARN else "ok  " if passed else "FAIL"
            ctx.say(f"{verdict} {name}: {detail}")
    return 0 if ok else 1
