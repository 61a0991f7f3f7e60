"""The checkpoint store on S3-compatible object storage (docs/spec/layout.md), through a boto3 client.

The modules, one reason to change each:

* :mod:`~ckpt.adapters.s3.errors`: the botocore error table and the one translating context manager;
* :mod:`~ckpt.adapters.s3.bucket_settings`: the ``[s3]`` settings every request and write carries;
* :mod:`~ckpt.adapters.s3.objects`: the requests on one bucket (paging, exclusive create, batch delete);
* :mod:`~ckpt.adapters.s3.store`: the log, tree and journal ports, and :class:`S3Store` assembling them;
* :mod:`~ckpt.adapters.s3.client`: building the client from the configuration.

The root URL's grammar is pure and lives in :mod:`ckpt.domain.s3_root`. Importing this package imports
neither boto3 nor botocore.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ckpt.adapters.s3.bucket_settings import BucketSettings
from ckpt.adapters.s3.client import S3Connection, connect_s3, make_s3_client
from ckpt.adapters.s3.objects import PAGE_SIZE, S3Client
from ckpt.adapters.s3.store import S3Store
from ckpt.domain.ports import ExclusiveCreateProbe
from ckpt.domain.s3_root import MAX_PREFIX_BYTES, S3Root, parse_s3_root

if TYPE_CHECKING:
    from ckpt.config import Config
    from ckpt.creds.model import Source

__all__ = [
    "MAX_PREFIX_BYTES",
    "PAGE_SIZE",
    "BucketSettings",
    "ExclusiveCreateProbe",
    "S3Client",
    "S3Connection",
    "S3Root",
    "S3Store",
    "connect_s3",
    "make_s3_client",
    "open_s3_store",
    "parse_s3_root",
]


def open_s3_store(
    root: str, *, config: Config, environ: Mapping[str, str], credentials: Source | None = None
) -> S3Store:
    """Return the :class:`S3Store` for ``root``, its client built from ``config`` by ``make_s3_client``,
    signing with ``credentials`` when given (a source built in code), else the ``[[credentials]]`` chain.
    Every request it makes carries the ``[s3]`` bucket settings (``BucketSettings``).

    The root is validated before any client is built, so a bad URL costs no credential lookup.
    """
    parse_s3_root(root)
    client, connection = connect_s3(config, environ, credentials)
    settings = BucketSettings.from_s3_settings(config.s3)
    return S3Store(root, client, connection=connection, settings=settings)
