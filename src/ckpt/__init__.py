"""ckpt: publish and resolve ML training checkpoints on POSIX filesystems and S3, fenced by epoch.

The public API is what ``__all__`` lists (a test pins it). Everything else is internal.

    >>> import ckpt, tempfile
    >>> root = tempfile.mkdtemp()
    >>> store = ckpt.open_store(root)
    >>> store.resolve() is None
    True
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ckpt.domain.entries import Entry, latest, parse_epoch, parse_step, validate_attempt, validate_save
from ckpt.domain.errors import (
    CkptError,
    ConfigError,
    CredentialsError,
    ExistsError,
    InvalidError,
    InvalidTypeError,
    MalformedError,
    NotFoundError,
    ProxyConfigError,
    PruneIncompleteError,
    SaveNotFoundError,
    ScanTimeoutError,
    StorageError,
)
from ckpt.domain.names import format_entry_name, parse_entry_name
from ckpt.domain.ports import FileInfo, Folder, PruneResult, SaveReader, SkippedFolder, Store, WatchStore
from ckpt.store import open_store

if TYPE_CHECKING:
    from ckpt.application.following import follow
    from ckpt.application.verify import Verified, resolve_verified
    from ckpt.application.watcher import Watcher
    from ckpt.domain.follow import Followed
    from ckpt.domain.frameworks import Framework, parse_framework
    from ckpt.domain.proxy import ProxyRule
    from ckpt.domain.prune import PrunePlan, overlaps, plan_prune
    from ckpt.domain.retention import KeepReason, Kept, RetentionPlan, plan_retention
    from ckpt.integrations.core import resume_location
    from ckpt.stopping import stop_on_signals

__all__ = [
    "CkptError",
    "ConfigError",
    "CredentialsError",
    "Entry",
    "ExistsError",
    "FileInfo",
    "Folder",
    "Followed",
    "Framework",
    "InvalidError",
    "InvalidTypeError",
    "KeepReason",
    "Kept",
    "MalformedError",
    "NotFoundError",
    "ProxyConfigError",
    "ProxyRule",
    "PruneIncompleteError",
    "PrunePlan",
    "PruneResult",
    "RetentionPlan",
    "SaveNotFoundError",
    "SaveReader",
    "ScanTimeoutError",
    "SkippedFolder",
    "StorageError",
    "Store",
    "Verified",
    "WatchStore",
    "Watcher",
    "follow",
    "format_entry_name",
    "latest",
    "open_store",
    "overlaps",
    "parse_entry_name",
    "parse_epoch",
    "parse_framework",
    "parse_step",
    "plan_prune",
    "plan_retention",
    "resolve_verified",
    "resume_location",
    "stop_on_signals",
    "validate_attempt",
    "validate_save",
]

#: The package version, kept here only: pyproject.toml reads it (``dynamic``), and so the installed
#: distribution's metadata, ``ckpt --version``, the sidecar's start-up line and ``doctor --json`` all agree.
__version__ = "0.1.0"


# Loaded on first use: a POSIX-only command should not pay at start-up for the proxy rule (ipaddress), the
# watcher (threading, json) or the prune planner.
_LAZY = {
    "PrunePlan": "ckpt.domain.prune",
    "overlaps": "ckpt.domain.prune",
    "plan_prune": "ckpt.domain.prune",
    "ProxyRule": "ckpt.domain.proxy",
    "Framework": "ckpt.domain.frameworks",
    "parse_framework": "ckpt.domain.frameworks",
    "Watcher": "ckpt.application.watcher",
    "Verified": "ckpt.application.verify",
    "resolve_verified": "ckpt.application.verify",
    "resume_location": "ckpt.integrations.core",
    "follow": "ckpt.application.following",
    "KeepReason": "ckpt.domain.retention",
    "Kept": "ckpt.domain.retention",
    "RetentionPlan": "ckpt.domain.retention",
    "plan_retention": "ckpt.domain.retention",
    "Followed": "ckpt.domain.follow",
    "stop_on_signals": "ckpt.stopping",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckpt' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
