"""The small store ports over one S3 root: the publication log, the save tree and the prune journal.

Rules (the layout is the POSIX one: ``exec/<attempt>/...`` for saves, ``pub/<entry name>`` for entries, every
key under ``PREFIX/`` or at the top of the bucket):

1. The log creates an entry with one ``PutObject`` of an empty body and ``If-None-Match: *``: ``412
   PreconditionFailed`` means it exists, unless the one ``HeadObject`` that follows finds this call's
   writer token in it (a retried put meeting its own earlier success, docs/spec/operations.md §2.6);
   ``409 ConditionalRequestConflict`` is retried a bounded number of times; a storage that does not
   implement the condition cannot hold a log (``StorageError``). An acknowledged put is durable.
2. The log is read with ``ListObjectsV2`` and ``Delimiter='/'``, 1000 keys a page, and nothing else: n
   entries cost ceil(n/1000) requests (at least one). A common prefix inside ``pub/`` is a sub-folder:
   malformed. The zero-byte ``pub/`` marker some consoles create is ``pub/`` itself and is ignored.
3. A save is a folder when at least one object's key starts with ``<save>/`` (one ``ListObjectsV2``,
   ``MaxKeys=1``); when there is none, one ``HeadObject`` of ``<save>`` tells a file (not a save) from
   nothing. A file inside a save is the object at exactly its key: objects under ``name/`` make a folder.
   Keys ending in ``/`` are folder markers, not files.
4. Removing entries and folders uses quiet ``DeleteObjects``, 1000 keys a request; the folders' objects
   are listed eight folders at a time and deleted together, batched across folders. Keys S3 refuses are never
   hidden: refused entries raise ``StorageError`` listing them (they are still published, so they still
   protect their folders); refused objects of a folder are reported in its outcome while the other folders
   are still removed. A key reported ``NoSuchKey`` is gone, which is what was asked. S3 deletes do not say
   whether a key existed, so every entry asked for is reported removed.
5. The prune journal is ``<prefix>.ckpt-prune-<16 hex>``, beside ``pub/`` and ``exec/``: written with one
   ``PutObject``, found with one listing, read with ``GetObject`` and dropped with ``DeleteObject``. Its
   decision, ``<journal key>.decided``, is one ``PutObject`` of the whole content with ``If-None-Match: *``
   (the writer token tells a lost reply from another decider's, as for an entry); dropping deletes the
   journal first.
6. A small file beside the saves (an execution's epoch record, ``WritesSmallFiles``) is one ``PutObject``
   of the whole content: an acknowledged put is durable, and a reader sees the old object or the new one.
7. Every request carries the bucket settings (``BucketSettings``, docs/spec/layout.md §9): each write goes
   through ``Bucket.put_object``, each other request through ``Bucket.params``.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ckpt.adapters.concurrent_probe import DEFAULT_WRITERS, run_at_once
from ckpt.adapters.s3.bucket_settings import NO_SETTINGS, BucketSettings
from ckpt.adapters.s3.client import S3Connection
from ckpt.adapters.s3.objects import Bucket, S3Client
from ckpt.adapters.s3.pins import S3Pins
from ckpt.application.checkpoint_store import CheckpointStore
from ckpt.domain.entries import PUB_DIR_NAME
from ckpt.domain.errors import MalformedError, StorageError
from ckpt.domain.exclusive_probe import judge_exclusive_creates
from ckpt.domain.journal import DECISION_SUFFIX, JOURNAL_PREFIX
from ckpt.domain.locator import Locator
from ckpt.domain.ports import ExclusiveCreateProbe, FileInfo, SaveRemoval
from ckpt.domain.prune import SKIP_ALREADY_GONE
from ckpt.domain.s3_root import parse_s3_root
from ckpt.domain.saves import SaveKind
from ckpt.domain.saves_reader import TreeReader

if TYPE_CHECKING:
    from ckpt.adapters.s3.cleanup import MultipartCleanup
    from ckpt.adapters.s3.durable import S3DurableFiles

__all__ = ["ExclusiveCreateProbe", "S3Journal", "S3Log", "S3Store", "S3Tree"]

# Outside pub/ and exec/, so a probe object can never look like an entry or a save.
_PROBE_DIR = ".ckpt-doctor"
#: Folder listings a prune runs at once: below the client's connection pool (10), so none waits for one.
_LISTINGS_AT_ONCE = 8
_MAX_KEYS_IN_MESSAGE = 10
# A journal lists folders, one a line: 256 MiB is millions of them, far beyond any prune.
_MAX_JOURNAL_BYTES = 256 << 20


def _refused_text(bucket: Bucket, refused: Sequence[tuple[str, str]]) -> str:
    """Return "url (code), ..." for the first few refused keys, and how many more there are."""
    shown = ", ".join(f"{bucket.url(key)} ({code})" for key, code in refused[:_MAX_KEYS_IN_MESSAGE])
    more = len(refused) - _MAX_KEYS_IN_MESSAGE
    return shown + (f", and {more} more" if more > 0 else "")


class S3Log:
    """The ``PublicationLog`` port over the keys under ``<prefix>pub/`` (rules 1, 2, 4)."""

    __slots__ = ("_bucket", "_pub")

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket
        self._pub = bucket.key(f"{PUB_DIR_NAME}/")

    def list_names(self) -> list[str]:
        """Return the names in ``pub/``; ``MalformedError`` for a sub-folder of ``pub/``."""
        names: list[str] = []
        for page in self._bucket.pages(self._pub, delimiter=True, action="list the publication log"):
            folders = sorted(page.prefixes)
            if folders:
                name = folders[0][len(self._pub) : -1]
                raise MalformedError(
                    f"malformed entry {self._bucket.url(folders[0])!r} in pub/: a folder", value=name
                )
            start = len(self._pub)
            names.extend([key[start:] for key in page.keys])
        return [name for name in names if name]  # "" is the pub/ marker object (rule 2)

    def create(self, name: str) -> bool:
        """Create ``pub/<name>`` with ``If-None-Match: *`` (rule 1); False when it already exists."""
        return self._bucket.create_new(
            self._pub + name, action="publish", needs=", so it cannot hold a publication log"
        )

    def remove(self, names: Sequence[str]) -> list[str]:
        """Delete the entries (rule 4); every name asked for is reported removed."""
        keys = [self._pub + name for name in names]
        pub_url = self._bucket.url(self._pub)
        refused = self._bucket.delete_keys(keys, action="remove entries from", location=pub_url)
        if refused:
            raise StorageError(
                f"prune could not remove {len(refused)} of {len(keys)} entries, so no folder was removed: "
                + _refused_text(self._bucket, refused),
                location=pub_url,
            )
        return list(names)


class S3Tree:
    """The ``SaveTree`` port over the keys under the root (rules 3, 4)."""

    __slots__ = ("_bucket",)

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket

    def kind(self, save: str) -> SaveKind:
        """FOLDER when an object lies under ``<save>/``, else FILE or MISSING by one HeadObject (rule 3)."""
        key = self._bucket.key(save)
        if self._bucket.any_object_under(key + "/", action="check the save"):
            return SaveKind.FOLDER
        return SaveKind.FILE if self._bucket.head(key, action="check the save") else SaveKind.MISSING

    def folders(self, path: str) -> list[str] | None:
        """Return the common prefixes directly under ``path`` (the root when ``""``)."""
        prefix = self._bucket.key(path + "/" if path else "")
        found: list[str] = []
        for page in self._bucket.pages(prefix, delimiter=True, action="list the folders of"):
            for common in page.prefixes:
                name = common[len(prefix) : -1]
                if name:  # "a//b" has an empty element: no folder a location could name
                    found.append(name)
        return found

    def read_file(self, save: str, name: str, limit: int) -> bytes | None:
        """Return the object ``<save>/<name>``, or ``None`` when there is none."""
        return self._bucket.get(f"{self._bucket.key(save)}/{name}", action="read", limit=limit)

    def is_file(self, save: str, name: str) -> bool:
        """Return True when the object ``<save>/<name>`` exists (one ``HeadObject``)."""
        return self._bucket.head(f"{self._bucket.key(save)}/{name}", action="check")

    def files(self, save: str) -> list[FileInfo]:
        """Return every object under the save with its size, sorted by relative path (markers left out)."""
        prefix = self._bucket.key(save) + "/"
        found = [
            FileInfo(key[len(prefix) :], size)
            for key, size in self._bucket.objects(prefix, action="list the files of")
            if not key.endswith("/")
        ]
        return sorted(found, key=lambda info: info.path)

    def remove_saves(self, saves: Sequence[str]) -> list[SaveRemoval]:
        """List each save's objects (eight listings at a time) and delete them all together, batched across
        saves, 1000 keys a request; a save with no key under it but an object at exactly its key is a
        single-file save, and that object joins the batch; a save with none left is "already gone"
        (rule 4)."""
        listings = self._list_at_once([self._bucket.key(save) + "/" for save in saves])
        for keys, save in zip(listings, saves, strict=True):
            if not keys and self._bucket.head(self._bucket.key(save), action="check the save"):
                keys.append(self._bucket.key(save))  # a single-file save: the object at exactly its key
        owner: dict[str, str] = {}
        for save, keys in zip(saves, listings, strict=True):
            owner.update((key, save) for key in keys)
        location = self._bucket.url(self._bucket.key(""))
        refused = self._bucket.delete_keys(list(owner), action="remove the folders under", location=location)
        refused_of: dict[str, list[tuple[str, str]]] = {}
        for key, code in refused:
            refused_of.setdefault(owner.get(key, ""), []).append((self._bucket.url(key), code))
        return [
            SaveRemoval(save, refused=tuple(refused_of.get(save, ())))
            if keys
            else SaveRemoval(save, SKIP_ALREADY_GONE)
            for save, keys in zip(saves, listings, strict=True)
        ]

    def _list_at_once(self, prefixes: Sequence[str]) -> list[list[str]]:
        """Every key under each prefix, in order; at most ``_LISTINGS_AT_ONCE`` listings in flight."""

        def keys_under(prefix: str) -> list[str]:
            return [key for key, _ in self._bucket.objects(prefix, action="list the folder")]

        if len(prefixes) <= 1:
            return [keys_under(prefix) for prefix in prefixes]
        workers = min(_LISTINGS_AT_ONCE, len(prefixes))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-s3-list") as pool:
            return list(pool.map(keys_under, prefixes))


class S3Journal:
    """The ``PruneJournal`` port: ``<prefix>.ckpt-prune-<hex>`` objects (rule 5). Identifiers are URLs."""

    __slots__ = ("_bucket", "_prefix")

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket
        self._prefix = bucket.key(JOURNAL_PREFIX)

    def _key(self, identifier: str) -> str:
        return identifier[len(self._bucket.url("")) :]

    def write_journal(self, data: bytes) -> str:
        """Put a new journal object; return its URL."""
        key = self._prefix + secrets.token_hex(8)
        self._bucket.put(key, data, action="write the prune journal")
        return self._bucket.url(key)

    def read_journals(self) -> list[tuple[str, bytes]]:
        """List the journal objects and read each (one gone meanwhile is skipped)."""
        found: list[tuple[str, bytes]] = []
        for page in self._bucket.pages(self._prefix, delimiter=True, action="list the prune journals in"):
            for key in page.keys:
                data = self._bucket.get(key, action="read the prune journal", limit=_MAX_JOURNAL_BYTES)
                if data is not None:
                    found.append((self._bucket.url(key), data))
        return sorted(found)

    def create_decision(self, journal: str, data: bytes) -> bool:
        """Put the decision of ``journal`` exclusively (rule 5); False when another decider put it first."""
        key = self._key(journal) + DECISION_SUFFIX
        return self._bucket.create_new(key, action="create the prune decision", body=data)

    def journal_exists(self, identifier: str) -> bool:
        """Return True when the journal object is still there (one ``HeadObject``)."""
        return self._bucket.head(self._key(identifier), action="check the prune journal")

    def drop_journals(self, identifiers: Sequence[str]) -> None:
        """Delete each journal and decision object, in the order given."""
        for identifier in identifiers:
            self._bucket.delete_object(self._key(identifier), action="remove the prune journal")


class S3Store(CheckpointStore):
    """A checkpoint root in a bucket, ``s3://BUCKET`` or ``s3://BUCKET/PREFIX``, through a boto3 S3 client.

    The client is injected (``open_s3_store`` builds one from the configuration); the store never creates
    one. Safe to share across threads when the client is (boto3 clients are).
    """

    __slots__ = ("_bucket", "connection")

    def __init__(
        self,
        root: str,
        client: S3Client,
        *,
        connection: S3Connection | None = None,
        settings: BucketSettings = NO_SETTINGS,
    ) -> None:
        parsed = parse_s3_root(root)
        self._bucket = Bucket(parsed, client, settings)
        #: How the client was built (endpoint, proxy, credentials), when ``open_s3_store`` built it.
        self.connection = connection
        locator = Locator(parsed.url, scheme="s3://", form="an s3:// URL")
        super().__init__(
            S3Log(self._bucket), S3Tree(self._bucket), locator, S3Journal(self._bucket), S3Pins(self._bucket)
        )

    @property
    def bucket(self) -> str:
        """The bucket name."""
        return self._bucket.root.bucket

    @property
    def settings(self) -> BucketSettings:
        """What every request and every write carries (rule 7)."""
        return self._bucket.settings

    @property
    def prefix(self) -> str:
        """The key prefix under which the root lives: ``""`` or ``"some/prefix/"``."""
        return self._bucket.root.prefix

    def saves_reader(self, location: str) -> TreeReader:
        """The ``ReadsSaves`` capability: one delimited listing, ranged heads and tails, 16 at a time.

        A subclass is read through the ``WatchStore`` port instead, so whatever it overrides is honoured.
        """
        from ckpt.adapters.s3_saves import S3Saves
        from ckpt.application.inspection import StoreSaves

        if type(self) is not S3Store:
            return StoreSaves(self, location)
        at_root = location.rstrip("/") == self.root.rstrip("/")
        prefix = self.prefix if at_root else f"{self.prefix}{self.save_of(location)}/"
        return S3Saves(self._bucket.client, self.bucket, prefix, settings=self.settings)

    def durable_files(
        self, *, concurrency: int = 8, max_bandwidth: int | None = None, checksum: str = "CRC32"
    ) -> S3DurableFiles:
        """This root as the durable root of the tiered mode (``ckpt.adapters.s3.durable``)."""
        from ckpt.adapters.s3.durable import S3DurableFiles

        return S3DurableFiles(
            self._bucket, concurrency=concurrency, max_bandwidth=max_bandwidth, checksum=checksum
        )

    def write_file(self, location: str, name: str, data: bytes) -> None:
        """The ``WritesSmallFiles`` capability: one ``PutObject`` of ``<save>/<name>`` (rule 6)."""
        save, name, data = self.small_file_of(location, name, data)
        self._bucket.put(f"{self._bucket.key(save)}/{name}", data, action="write")

    def probe_exclusive_create(self, writers: int = DEFAULT_WRITERS) -> ExclusiveCreateProbe:
        """Check that ``writers`` concurrent ``If-None-Match: *`` creates of one new key make exactly one
        winner, the others refused with 412 (``ckpt doctor``; spec/layout.md §6). Each create carries its
        own writer token, so a winner whose answer was lost still counts as the winner.

        The key is ``<root>/.ckpt-doctor/<random>`` (outside ``pub/`` and ``exec/``); the creates start
        together from ``writers`` threads; the key is deleted afterwards whatever happened. A storage that
        refuses the header as unsupported (``NotImplemented``) does not honour exclusive create; any other
        failure (access denied, unreachable) raises as usual.
        """
        bucket = self._bucket
        key = bucket.key(f"{_PROBE_DIR}/{secrets.token_hex(8)}")
        action = "probe exclusive create at"
        try:
            outcomes = run_at_once(lambda: bucket.create_exclusive(key, action=action), writers)
        finally:
            bucket.delete_object(key, action="remove the probe object")
        verdict = judge_exclusive_creates(outcomes, "If-None-Match: * creates")
        return ExclusiveCreateProbe(
            verdict.honoured,
            bucket.url(key),
            verdict.detail,
            writers=verdict.writers,
            created=verdict.created,
            refused=verdict.refused,
        )

    def multipart_cleanup(self) -> MultipartCleanup:
        """The root's incomplete multipart uploads and the lifecycle rule that aborts them
        (``ckpt doctor --durable``; :mod:`ckpt.adapters.s3.cleanup`)."""
        from ckpt.adapters.s3.cleanup import multipart_cleanup

        return multipart_cleanup(self._bucket)

    def check_write_settings(self) -> tuple[bool, str]:
        """Put one probe object as every write is sent (``Bucket.put_object``), read its ``HeadObject``
        and say whether it came back with the encryption, KMS key and storage class asked for, and, with
        ``expected_bucket_owner`` set, whether the server refuses a ``HeadObject`` expecting another owner
        (``ckpt doctor``; spec/layout.md §9.3). The key is ``<root>/.ckpt-doctor/<random>``; it is deleted
        afterwards whatever happened. A refused write or head raises as usual.
        """
        bucket = self._bucket
        key = bucket.key(f"{_PROBE_DIR}/{secrets.token_hex(8)}")
        owner_checked = True
        try:
            bucket.put(key, b"", action="probe the write settings at")
            head = bucket.head_answer(key, action="check the written probe object") or {}
            if self.settings.expected_bucket_owner is not None:
                owner_checked = bucket.owner_checked(key, action="check the expected owner at")
        finally:
            bucket.delete_object(key, action="remove the probe object")
        written = (
            f"encryption {head.get('ServerSideEncryption') or 'none'}"
            + (f" with KMS key {head['SSEKMSKeyId']}" if head.get("SSEKMSKeyId") else "")
            + f", storage class {head.get('StorageClass') or 'STANDARD'}"
        )
        problems = self.settings.check_written(head)
        failures = [f"the probe object came back with {'; '.join(problems)}"] if problems else []
        if not owner_checked:
            failures.append(
                f"the server answered a request expecting the owner {self.settings.other_owner()}: it does "
                "not check [s3] expected_bucket_owner, which guards nothing there"
            )
        if failures:
            return False, "; ".join(failures)
        if self.settings.expected_bucket_owner is not None:
            written += "; a request expecting another owner was refused"
        return True, f"{self.settings.described()}; the probe object came back with {written}"
