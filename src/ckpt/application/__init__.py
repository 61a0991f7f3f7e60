"""The application layer: every flow over the store ports, written once.

``CheckpointStore`` runs publish, entries, resolve, prune and the watcher's reads over a store's small ports
(``ckpt.domain.ports``); the watcher and verified resolve build on it. Adapters sit above this layer and the
domain below it: nothing here performs I/O of its own.
"""

from ckpt.application.checkpoint_store import CheckpointStore

__all__ = ["CheckpointStore"]
