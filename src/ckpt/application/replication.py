"""Replication to a durable root and restore from it (docs/spec/tiered.md §2, §5, §6).

Rules:

1. :func:`replicate` is one pass: the fast root's entries greater than the durable root's greatest entry,
   ascending, handled in turn (an older one the durable root lacks was pruned there, or is a zombie's that
   no resume would choose; it is never copied, spec/tiered.md §2.1): list, digest, copy what the durable
   root does not already hold (same size and SHA-256), verify (the port's ``put`` returns only once the
   stored copy verified), write the manifest, publish with the fast entry's epoch and step.
   ``ExistsError`` from that publish means it is done (exactly once, §5.1).
2. ``stop()`` is asked before every file: when it answers True the pass ends after the file being copied,
   publishing nothing more; the entries not yet durable come back in ``pending`` (§7.1).
3. A failure of one entry (a ``CkptError``) ends the pass there: the entry and every later one are
   ``pending`` and the failure is reported; a save that is gone or incomplete under the rule is ``passed``,
   and so is one holding a file a manifest cannot list (its path not UTF-8, or with a control character),
   found before anything of it is copied: no later pass could copy it, so it must not hold back the rest.
4. :func:`restore_newer` walks the durable entries from the greatest down while they are greater than the
   fast candidate, takes the first whose save is complete under the rule on the durable root and verifies
   against its manifest, restores it into the fast root (each file verified against the manifest) and
   publishes it there at its epoch and step (§6.2-§6.3). Every entry passed over comes back with its reason,
   a failure to read or restore one (a ``CkptError``) included; a durable log that cannot be read raises.
5. With ``files_in_flight`` above 1 the files of one save are copied that many at a time (each still
   digested, copied and verified as rule 1 says; the manifest waits for all of them); ``stop()`` is asked
   before each file begins; the first failure lets the files in flight finish, begins no other, and
   fails the entry. Saves stay one at a time, in order (spec/tiered.md §2.1).
6. The durable save is listed once before its files are copied; only a file it lists with the fast file's
   size is asked for its recorded digest (``stored``), so a save the durable root lacks costs no request
   per file before its uploads (spec/tiered.md §5.2).
7. A restore fetches, verifies and installs up to ``files_in_flight`` files of the save at once
   (:data:`RESTORE_FILES_IN_FLIGHT`); the first that does not verify, or fails, lets those in flight finish
   and begins no other; the manifest and the fast entry are written only once every file is installed.
   The temporary files a restore killed with files in flight left in the save are removed first. The
   save's folder carries the restore's mark (``FastFiles.begin_restore``) from before its first file until
   after the manifest: a restore that fails or is killed leaves it, and no judge calls such a folder
   complete; a fast save holding the mark is never replicated (it is ``passed``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

import attrs

from ckpt.application.verify import why_incomplete
from ckpt.domain.entries import Entry
from ckpt.domain.errors import CkptError, ExistsError, VerificationError
from ckpt.domain.manifest import (
    MANIFEST_NAME,
    RESTORING,
    RESTORING_NAME,
    Manifest,
    ManifestFile,
    decode_manifest,
    encode_manifest,
    path_problem,
    verify_listing,
)
from ckpt.domain.ports import WatchStore
from ckpt.domain.rules import Rule
from ckpt.domain.tiered_ports import DurableFiles, FastFiles

__all__ = [
    "RESTORE_FILES_IN_FLIGHT",
    "Replicated",
    "Restored",
    "manifest_problem",
    "not_yet_durable",
    "pending_after",
    "pending_between",
    "replicate",
    "restore_newer",
]

MISSING_SAVE = "save folder is missing"
RESTORE_FILES_IN_FLIGHT = 8  # files of one save a restore fetches at once (spec/tiered.md §6.3)
_T = TypeVar("_T")


@attrs.frozen
class Replicated:
    """What one replication pass did, and what is not yet durable."""

    published: tuple[Entry, ...] = ()  # published on the durable root by this pass, ascending
    already: int = 0  # fast entries the durable root already had
    older: int = 0  # fast entries the durable root lacks, older than its greatest: never copied
    passed: tuple[tuple[Entry, str], ...] = ()  # not replicable, with why
    pending: tuple[Entry, ...] = ()  # not yet durable: the pass stopped or failed before them
    failure: str | None = None  # why the pass stopped early, when it failed
    stopped: bool = False  # ``stop()`` ended the pass
    files_copied: int = 0
    bytes_copied: int = 0
    files_present: int = 0  # files the durable root already held (same size and digest)
    verification_failed: bool = False  # the failure is a copy that did not verify
    newest_fast: Entry | None = None  # the fast root's greatest entry, as the pass listed it
    newest_durable: Entry | None = None  # the durable root's greatest entry once the pass ended

    @property
    def lag_steps(self) -> int:
        """Steps between the two roots' greatest entries (spec/tiered.md §11.1)."""
        if self.newest_fast is None:
            return 0
        behind = self.newest_fast.step - (0 if self.newest_durable is None else self.newest_durable.step)
        return max(behind, 0)


@attrs.define
class _Pass:
    published: list[Entry] = attrs.Factory(list)
    passed: list[tuple[Entry, str]] = attrs.Factory(list)
    files_copied: int = 0
    bytes_copied: int = 0
    files_present: int = 0
    newest: tuple[Entry | None, Entry | None] = (None, None)  # fast and durable, as listed at the start
    lock: threading.Lock = attrs.Factory(threading.Lock)  # a save's files may be copied in several threads


class _Stopped(Exception):  # noqa: N818 - control flow inside one pass
    pass


class _NotVerified(Exception):  # noqa: N818 - a restored file that does not verify (rule 7)
    pass


def _copy_file(
    fast_files: FastFiles,
    durable_files: DurableFiles,
    save: str,
    path: str,
    *,
    tally: _Pass,
    held: dict[str, int],
) -> ManifestFile:
    """Copy and verify one file unless the durable root holds it already (§2.2 steps 2-3, §5.2); ``held``
    is the durable save's listing (rule 6)."""
    digest = fast_files.digest(save, path)
    assert digest.sha256 is not None  # the fast port always digests
    stored = durable_files.stored(save, path) if held.get(path) == digest.size else None
    if stored is not None and stored.size == digest.size and stored.sha256 == digest.sha256:
        with tally.lock:
            tally.files_present += 1
    else:
        durable_files.put(fast_files.local_path(save, path), save, path, digest.sha256, digest.size)
        with tally.lock:
            tally.files_copied += 1
            tally.bytes_copied += digest.size
    return ManifestFile(path, digest.size, digest.sha256)


def _each(
    work: Callable[[str], _T], paths: list[str], *, in_flight: int, stop: Callable[[], bool]
) -> list[_T]:
    """``work(path)`` for every path, ``in_flight`` at a time, the results in the order of ``paths`` (rules 5
    and 7). ``stop()`` is asked before each one begins (``_Stopped``); the first failure lets the ones in
    flight finish, begins no other, and is raised (a real failure before a ``_Stopped``)."""

    def one(path: str) -> _T:
        if stop():
            raise _Stopped
        return work(path)

    if in_flight <= 1 or len(paths) <= 1:
        return [one(path) for path in paths]
    with ThreadPoolExecutor(min(in_flight, len(paths)), thread_name_prefix="ckpt-copy") as pool:
        futures = [pool.submit(one, path) for path in paths]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        if any(f.exception() is not None for f in done):
            for future in futures:
                future.cancel()  # not begun: never begun; the ones in flight finish
            wait(futures)
            errors = [e for f in futures if not f.cancelled() and (e := f.exception()) is not None]
            real = [e for e in errors if not isinstance(e, _Stopped)]
            raise (real or errors)[0]
        return [f.result() for f in futures]


def _unlisted_name(files: Iterable[str]) -> str | None:
    """Why a manifest could not list one of these paths (spec/tiered.md §2.5a), checked before any copy."""
    for path in files:
        problem = path_problem(path)
        if problem is not None:
            return f"file {path!r} cannot be listed in a manifest: its path {problem}"
    return None


def _copy_save(
    fast_files: FastFiles,
    durable_files: DurableFiles,
    save: str,
    files: list[str],
    *,
    stop: Callable[[], bool],
    tally: _Pass,
    in_flight: int,
) -> Manifest:
    """Copy and verify every file of ``save``, ``in_flight`` at a time (rule 5); return its manifest."""
    held = {item.path: item.size for item in durable_files.listing(save) or ()}  # rule 6

    def copy(path: str) -> ManifestFile:
        return _copy_file(fast_files, durable_files, save, path, tally=tally, held=held)

    return Manifest.of(_each(copy, files, in_flight=in_flight, stop=stop))


def not_yet_durable(fast_entries: Iterable[Entry], durable_newest: Entry | None) -> list[Entry]:
    """The fast entries a replicator has still to copy, ascending: those greater than the durable root's
    greatest entry, every one when it has none (spec/tiered.md §2.1, §7.1a, §11.1). The one home of that
    rule: the replication, the fast prune, the lag and the reports all ask it."""
    return sorted(e for e in fast_entries if durable_newest is None or e > durable_newest)


def pending_after(fast: WatchStore, last: Replicated) -> list[Entry]:
    """The fast entries not yet durable after the pass ``last`` (spec/tiered.md §11.1): its own when it
    stopped or failed, else those greater than the durable root's greatest, less those it passed over (one
    listing of the fast root). What the replicators' metrics report as pending."""
    if last.pending:
        return list(last.pending)
    passed = {entry for entry, _ in last.passed}
    return [e for e in not_yet_durable(fast.entries(), last.newest_durable) if e not in passed]


def pending_between(fast: WatchStore, durable: WatchStore) -> list[Entry]:
    """:func:`not_yet_durable` of the two roots as listed now (one listing of each)."""
    return not_yet_durable(fast.entries(), max(durable.entries(), default=None))


def replicate(
    fast: WatchStore,
    fast_files: FastFiles,
    durable: WatchStore,
    durable_files: DurableFiles,
    *,
    rule: Rule | None = None,
    stop: Callable[[], bool] = lambda: False,
    files_in_flight: int = 1,
) -> Replicated:
    """One replication pass from ``fast`` to ``durable`` (rules 1-3, 5)."""
    done = set(durable.entries())
    newest = max(done) if done else None
    on_fast = fast.entries()
    todo = not_yet_durable(on_fast, newest)
    already = sum(1 for entry in on_fast if entry in done)
    older = len(on_fast) - already - len(todo)
    tally = _Pass()
    tally.newest = (max(on_fast, default=None), newest)
    for index, entry in enumerate(todo):
        try:
            if rule is not None:
                reason = why_incomplete(fast, rule, entry)
                if reason is not None:
                    tally.passed.append((entry, reason))
                    continue
            listing = fast_files.listing(entry.save)
            if listing is None:
                tally.passed.append((entry, MISSING_SAVE))
                continue
            if any(item.path == RESTORING_NAME for item in listing):
                tally.passed.append((entry, RESTORING))  # a restore's unfinished work is no save (§6.3)
                continue
            files = [item.path for item in listing if item.path != MANIFEST_NAME]
            unnamed = _unlisted_name(files)
            if unnamed is not None:
                tally.passed.append((entry, unnamed))  # never replicable: no later pass could do better
                continue
            manifest = _copy_save(
                fast_files,
                durable_files,
                entry.save,
                files,
                stop=stop,
                tally=tally,
                in_flight=files_in_flight,
            )
            durable_files.write_small(entry.save, MANIFEST_NAME, encode_manifest(manifest))
            try:
                durable.publish(entry.epoch, entry.step, durable.location(entry))
            except ExistsError:
                pass  # another replicator committed this copy (spec/tiered.md §5.1)
            else:
                tally.published.append(entry)
        except _Stopped:
            return _outcome(tally, (already, older), todo[index:], stopped=True)
        except CkptError as exc:
            return _outcome(
                tally,
                (already, older),
                todo[index:],
                failure=f"{durable.location(entry)}: {exc}",
                verification=isinstance(exc, VerificationError),
            )
    return _outcome(tally, (already, older), [])


def _outcome(
    tally: _Pass,
    counts: tuple[int, int],
    pending: list[Entry],
    *,
    failure: str | None = None,
    stopped: bool = False,
    verification: bool = False,
) -> Replicated:
    fast_newest, durable_newest = tally.newest
    if tally.published:
        durable_newest = max([*tally.published, *([] if durable_newest is None else [durable_newest])])
    return Replicated(
        published=tuple(tally.published),
        already=counts[0],
        older=counts[1],
        passed=tuple(tally.passed),
        pending=tuple(pending),
        failure=failure,
        stopped=stopped,
        files_copied=tally.files_copied,
        bytes_copied=tally.bytes_copied,
        files_present=tally.files_present,
        verification_failed=verification,
        newest_fast=fast_newest,
        newest_durable=durable_newest,
    )


@attrs.frozen
class Restored:
    """The durable entry restored into the fast root (``None``: none newer was usable), and those passed."""

    entry: Entry | None
    location: str | None  # the restored save's location on the fast root
    skipped: tuple[tuple[Entry, str], ...]  # durable entries passed over, greatest first, with why


def manifest_problem(files: DurableFiles, save: str, *, digests: bool = False) -> Manifest | str:
    """The save's manifest when the save verifies against it (spec/tiered.md §3.4), else the problem.

    Sizes always (one listing); with ``digests`` every file is also read whole and its SHA-256 compared
    (§10). No manifest, one that does not decode, or no save is a problem, named.
    """
    data = files.read_small(save, MANIFEST_NAME)
    if data is None:
        return f"no manifest ({MANIFEST_NAME})"
    try:
        manifest = decode_manifest(data)
    except CkptError as exc:
        return str(exc)
    listing = files.listing(save)
    if listing is None:
        return MISSING_SAVE
    problem = verify_listing(manifest, listing)
    if problem is None and digests:
        problem = verify_listing(manifest, [files.digest(save, f.path) for f in manifest.files])
    return manifest if problem is None else problem


def _usable(durable: WatchStore, durable_files: DurableFiles, rule: Rule, entry: Entry) -> Manifest | str:
    """The entry's manifest when its durable save is usable (spec/tiered.md §6.2), else the reason."""
    reason = why_incomplete(durable, rule, entry)
    return reason if reason is not None else manifest_problem(durable_files, entry.save)


def _restore(
    fast: WatchStore,
    fast_files: FastFiles,
    durable_files: DurableFiles,
    entry: Entry,
    manifest: Manifest,
    *,
    in_flight: int,
) -> str | None:
    """Fetch, verify and install every file, write the manifest, publish on the fast root (§6.3, rule 7)."""
    expected = {f.path: f.sha256 for f in manifest.files}

    def install(path: str) -> None:
        def fill(temp: str) -> None:
            durable_files.fetch(entry.save, path, temp)

        problem = fast_files.install(entry.save, path, fill, expected[path])
        if problem is not None:
            raise _NotVerified(problem)

    fast_files.sweep(entry.save)  # what a restore killed with files in flight left (§6.3)
    fast_files.begin_restore(entry.save)  # until the end, no judge calls the folder complete (§6.3)
    try:
        _each(install, list(expected), in_flight=in_flight, stop=lambda: False)
    except _NotVerified as exc:
        return str(exc)  # the mark stays: what was installed is no save (§8.3)
    fast_files.write_small(entry.save, MANIFEST_NAME, encode_manifest(manifest))
    fast_files.end_restore(entry.save)
    with contextlib.suppress(ExistsError):  # published before, its save lost with the disk (§6.3)
        fast.publish(entry.epoch, entry.step, fast.location(entry))
    return None


def restore_newer(
    fast: WatchStore,
    fast_files: FastFiles,
    durable: WatchStore,
    durable_files: DurableFiles,
    rule: Rule,
    *,
    than: Entry | None,
    files_in_flight: int = RESTORE_FILES_IN_FLIGHT,
) -> Restored:
    """Restore the newest usable durable entry greater than ``than`` into the fast root (rule 4)."""
    skipped: list[tuple[Entry, str]] = []
    for entry in reversed(durable.entries()):
        if than is not None and entry <= than:
            break
        try:
            usable = _usable(durable, durable_files, rule, entry)
            if isinstance(usable, str):
                skipped.append((entry, usable))
                continue
            problem = _restore(fast, fast_files, durable_files, entry, usable, in_flight=files_in_flight)
        except CkptError as exc:  # one copy that cannot be read is passed over (spec/tiered.md §6.2)
            problem = str(exc)
        if problem is not None:
            skipped.append((entry, problem))
            continue
        return Restored(entry, fast.location(entry), tuple(skipped))
    return Restored(None, None, tuple(skipped))
