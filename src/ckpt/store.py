"""Open a checkpoint root by its address: an absolute POSIX path or an ``s3://`` URL.

The S3 adapter (and with it boto3) is imported only for ``s3://`` roots, so POSIX-only use never pays for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ckpt.domain.arguments import require_instance, require_str
from ckpt.domain.errors import InvalidError
from ckpt.domain.redaction import redact_url

if TYPE_CHECKING:
    from ckpt.config import Config
    from ckpt.creds.model import Source
    from ckpt.domain.ports import WatchStore
    from ckpt.domain.tiered_ports import TransferSettings

__all__ = ["Tiers", "open_store", "open_tiers", "tier_files"]


def open_store(
    root: str,
    *,
    config: Config | None = None,
    environ: Mapping[str, str] | None = None,
    credentials: Source | None = None,
) -> WatchStore:
    """Return the store for ``root``: a :class:`PosixStore` or an S3 store.

    ``config`` carries the S3 client settings, the proxy table and the credential chain; ``environ``
    (default ``os.environ``) is where the proxy variables and the env credential source are read.
    ``credentials`` is any :class:`ckpt.creds.Source` (a :class:`ckpt.creds.Chain` included) an S3 store
    signs with instead of the configuration's ``[[credentials]]`` chain; it is fetched at the first request
    and again at every refresh, exactly like a configured chain. A POSIX root signs nothing and ignores it.
    Something that is not a ``Source`` (no ``name``, no ``fetch``) is an ``InvalidError``.
    """
    require_str(root, "root")
    if environ is not None:
        require_instance(environ, Mapping, "environ")
    if config is not None:
        from ckpt.config import Config

        require_instance(config, Config, "config")
    if not root:
        raise InvalidError(f"root {root!r} must be an absolute path or an s3:// URL")
    if credentials is not None:
        from ckpt.creds.model import Source

        if not isinstance(credentials, Source):
            raise InvalidError(
                f"credentials must be a ckpt.creds.Source (a name and a fetch method), "
                f"got a {type(credentials).__name__}"
            )
    if root.startswith("s3://"):
        from ckpt.adapters.s3 import open_s3_store
        from ckpt.config import Config

        env = os.environ if environ is None else environ
        s3_store: WatchStore = open_s3_store(
            root, config=config or Config(), environ=env, credentials=credentials
        )
        return s3_store
    if "://" in root:
        shown = redact_url(root, keep_user=False)
        raise InvalidError(f"root {shown!r}: only absolute paths and s3:// URLs are supported")
    from ckpt.adapters.posix import PosixStore

    return PosixStore(root)


@attrs.frozen
class Tiers:
    """The two roots of the tiered mode (docs/spec/tiered.md §1): each store with its tier files."""

    fast: WatchStore = attrs.field(eq=False)
    fast_files: Any = attrs.field(eq=False)  # ckpt.domain.tiered_ports.FastFiles
    durable: WatchStore = attrs.field(eq=False)
    durable_files: Any = attrs.field(eq=False)  # ckpt.domain.tiered_ports.DurableFiles
    settings: Any = attrs.field(default=None, eq=False)  # ckpt.domain.tiered_ports.TransferSettings

    @property
    def files_in_flight(self) -> int:
        """How many files of one save the replication copies at once (spec/tiered.md §12.1)."""
        return 4 if self.settings is None else int(self.settings.files_in_flight)


def tier_files(store: WatchStore, limits: TransferSettings | None = None) -> Any:
    """The tiered mode's files port (``ckpt.domain.tiered_ports.DurableFiles``) over ``store``'s root, its
    copies into the root bounded by ``limits`` (spec/tiered.md §12)."""
    from ckpt.adapters.posix import PosixStore
    from ckpt.adapters.posix.tiered import PosixTierFiles
    from ckpt.domain.tiered_ports import TransferSettings

    bound = limits if limits is not None else TransferSettings()
    if isinstance(store, PosixStore):
        return PosixTierFiles(store.root, max_bandwidth=bound.max_bandwidth)
    return store.durable_files(  # type: ignore[attr-defined]
        concurrency=bound.concurrency, max_bandwidth=bound.max_bandwidth, checksum=bound.checksum
    )


def open_tiers(fast: WatchStore, durable: WatchStore, limits: TransferSettings | None = None) -> Tiers:
    """Pair a fast root with its durable root (spec/tiered.md §1.1), or raise ``InvalidError`` naming them.

    The fast root MUST be a POSIX root; the durable root is an S3 root or another POSIX root that is not the
    fast root, not inside it and does not contain it (compared after resolving symbolic links). ``limits``
    bound the replication's copies into the durable root (spec/tiered.md §12).
    """
    from ckpt.adapters.posix import PosixStore

    if not isinstance(fast, PosixStore):
        raise InvalidError(f"the fast root {fast.root!r} must be an absolute POSIX path")
    if isinstance(durable, PosixStore):
        a, b = os.path.realpath(fast.root), os.path.realpath(durable.root)
        if a == b or b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/"):
            raise InvalidError(
                f"the durable root {durable.root!r} must not be the fast root {fast.root!r}, inside it or "
                "contain it"
            )
    return Tiers(fast, tier_files(fast), durable, tier_files(durable, limits), limits)
