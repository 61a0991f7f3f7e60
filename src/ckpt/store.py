"""Open a checkpoint root by its address: an absolute POSIX path or an ``s3://`` URL.

The S3 adapter (and with it boto3) is imported only for ``s3://`` roots, so POSIX-only use never pays for it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ckpt.domain.arguments import require_instance, require_str
from ckpt.domain.errors import InvalidError
from ckpt.domain.redaction import redact_url

if TYPE_CHECKING:
    from ckpt.config import Config
    from ckpt.domain.ports import WatchStore

__all__ = ["open_store"]


def open_store(
    root: str, *, config: Config | None = None, environ: Mapping[str, str] | None = None
) -> WatchStore:
    """Return the store for ``root``: a :class:`PosixStore` or an S3 store.

    ``config`` carries the S3 client settings, the proxy table and the credential chain; ``environ``
    (default ``os.environ``) is where the proxy variables and the env credential source are read.
    """
    require_str(root, "root")
    if environ is not None:
        require_instance(environ, Mapping, "environ")
    if config is not None:
        from ckpt.config import Config

        require_instance(config, Config, "config")
    if not root:
        raise InvalidError(f"root {root!r} must be an absolute path or an s3:// URL")
    if root.startswith("s3://"):
        from ckpt.adapters.s3 import open_s3_store
        from ckpt.config import Config

        env = os.environ if environ is None else environ
        s3_store: WatchStore = open_s3_store(root, config=config or Config(), environ=env)
        return s3_store
    if "://" in root:
        shown = redact_url(root, keep_user=False)
        raise InvalidError(f"root {shown!r}: only absolute paths and s3:// URLs are supported")
    from ckpt.adapters.posix import PosixStore

    return PosixStore(root)
