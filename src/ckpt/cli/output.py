"""The JSON documents and text lines the CLI prints (spec/cli.md). One place, so every command agrees."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import IO, Any

from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import PruneResult, Store
from ckpt.domain.retention import KeepReason, Kept

__all__ = ["entry_document", "entry_line", "json_text", "kept_reasons", "print_json", "prune_document"]

# Lone surrogates can only stand inside JSON strings, where a \u escape means the same code point.
_SURROGATE = re.compile("[\ud800-\udfff]")


def entry_document(store: Store, entry: Entry) -> dict[str, Any]:
    """``{"epoch", "step", "save", "location", "name"}`` for one entry."""
    return {
        "epoch": entry.epoch,
        "step": entry.step,
        "save": entry.save,
        "location": store.location(entry),
        "name": format_entry_name(entry),
    }


def entry_line(store: Store, entry: Entry) -> str:
    """``<epoch> <step> <location>``, the text form of an entry in ``ckpt entries``."""
    return f"{entry.epoch} {entry.step} {store.location(entry)}"


def kept_reasons(kept: Kept, keep: int, keep_every: int | None) -> str:
    """``latest 3, every 1000, pinned``: why prune keeps an entry, in words."""
    words = {
        KeepReason.LATEST: f"latest {keep}",
        KeepReason.EVERY: f"every {keep_every}",
        KeepReason.PINNED: "pinned",
    }
    return ", ".join(words[reason] for reason in kept.reasons)


def prune_document(store: Store, result: PruneResult) -> dict[str, Any]:
    """The ``prune`` document; each kept entry carries its ``reasons`` (``latest``, ``every``, ``pinned``)."""
    return {
        "dry_run": result.dry_run,
        "kept": [
            {**entry_document(store, k.entry), "reasons": [r.value for r in k.reasons]} for k in result.kept
        ],
        "removed_entries": [entry_document(store, e) for e in result.removed_entries],
        "restored_entries": [entry_document(store, e) for e in result.restored],
        "removed_folders": list(result.removed_folders),
        "skipped": [{"location": s.location, "reason": s.reason} for s in result.skipped],
    }


def json_text(document: object, *, default: Callable[[Any], Any] | None = None) -> str:
    """``document`` as JSON text that is always valid UTF-8 (non-ASCII characters kept as they are).

    A path that was not valid UTF-8 (a root named with a byte such as ``0xff``) reaches us with lone
    surrogates (``\\udcff``), which have no UTF-8 encoding: they are written as JSON ``\\u`` escapes, which a
    JSON reader turns back into the same string.
    """
    text = json.dumps(document, ensure_ascii=False, default=default)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(document: object, out: IO[str]) -> None:
    """Print one JSON document on its own line (see :func:`json_text`)."""
    out.write(json_text(document) + "\n")
