"""S3 credentials for ``ckpt`` (spec/credentials.md): the ``Credentials`` value, the ``Source`` port, the
ordered chain, the four sources (``env``, ``file``, ``vault``, ``aws-default``), the ``[[credentials]]``
configuration, and the ``ckpt.credential_sources`` entry-point group through which other packages add kinds of
source.

Importing this package imports neither ``botocore`` nor ``hvac``; the sources import them when they first
need them. The botocore session that signs with a chain lives in :mod:`ckpt.creds.botocore_session`, which
does import botocore (import it where an S3 client is made).

Secrets never appear in a ``repr``, a log record or an exception message produced here.
"""

from __future__ import annotations

from ckpt.creds.aws_default import AwsDefaultSource
from ckpt.creds.chain import Chain
from ckpt.creds.config import chain_from_config, validate_credentials_config
from ckpt.creds.env import EnvSource
from ckpt.creds.files import FileSource
from ckpt.creds.model import Credentials, Source
from ckpt.creds.plugins import ENTRY_POINT_GROUP, SourceSettings
from ckpt.creds.vault import AppRoleAuth, KubernetesAuth, VaultFields, VaultSource

__all__ = [
    "ENTRY_POINT_GROUP",
    "AppRoleAuth",
    "AwsDefaultSource",
    "Chain",
    "Credentials",
    "EnvSource",
    "FileSource",
    "KubernetesAuth",
    "Source",
    "SourceSettings",
    "VaultFields",
    "VaultSource",
    "chain_from_config",
    "validate_credentials_config",
]
