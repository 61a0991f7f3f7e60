"""The JSON documents and text lines the CLI prints (SPEC §8). One place, so every command agrees."""

from __future__ import annotations

import json
from typing import IO, Any

from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name
from ckpt.domain.ports import PruneResult, Store

__all__ = ["entry_document", "entry_line", "print_json", "prune_document"]


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


def prune_document(store: Store, result: PruneResult) -> dict[str, Any]:
    """The ``prune`` document."""
    return {
        "dry_run": result.dry_run,
        "removed_entries": [entry_document(store, e) for e in result.removed_entries],
        "removed_folders": list(result.removed_folders),
        "skipped": [{"location": s.location, "reason": s.reason} for s in result.skipped],
    }


def print_json(document: object, out: IO[str]) -> None:
    """Print one JSON document on its own line."""
    out.write(json.dumps(document, ensure_ascii=False) + "\n")
