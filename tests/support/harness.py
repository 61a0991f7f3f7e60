"""Store harnesses: how the contract suite builds a root on each storage and arranges trees in it.

The contract suite (``tests/test_store_contract.py``) is written once against :class:`Harness` and runs on
every implementation registered in ``HARNESS_FACTORIES`` (``tests/support/fixtures.py`` parametrizes the
``harness`` fixture over them). A harness arranges state *beside* the store under test (real files, real
objects), so the store's own reads are what the tests check.
"""

from __future__ import annotations

import os
from typing import Protocol

from ckpt.adapters.posix import PosixStore
from ckpt.domain.ports import WatchStore
from ckpt.testing import InMemoryStore
from support.saves import DEFAULT_FILES, make_save


class Harness(Protocol):
    """Builds one fresh store and arranges trees under its root."""

    name: str

    def store(self) -> WatchStore:
        """Return the store under test (the same one on every call)."""
        ...

    def make_save(self, save: str, files: dict[str, bytes] | None = None) -> str:
        """Create the save folder ``save`` (relative to the root) with ``files``; return its location."""
        ...

    def make_file(self, path: str, data: bytes) -> str:
        """Create one regular file (on S3 one object) at ``path`` under the root; return its location."""
        ...

    def remove_save(self, save: str) -> None:
        """Delete the save folder and everything in it, beside the store."""
        ...

    def save_exists(self, save: str) -> bool:
        """Return True when anything of the save is still stored."""
        ...

    def put_raw_name(self, name: str, *, folder: bool = False) -> None:
        """Put a raw name (or a sub-folder) into ``pub/``, beside the store."""
        ...

    def pub_names(self) -> list[str]:
        """Return the raw names in ``pub/``, read beside the store."""
        ...


class MemoryHarness:
    """The in-memory fake."""

    name = "memory"

    def __init__(self) -> None:
        self._store = InMemoryStore()

    def store(self) -> InMemoryStore:
        return self._store

    def make_save(self, save: str, files: dict[str, bytes] | None = None) -> str:
        location = f"{self._store.root}/{save}"
        self._store.make_dir(location)
        for name, data in (DEFAULT_FILES if files is None else files).items():
            self._store.write_file(location, name, data)
        return location

    def make_file(self, path: str, data: bytes) -> str:
        parent, _, name = path.rpartition("/")
        self._store.write_file(f"{self._store.root}/{parent}", name, data)
        return f"{self._store.root}/{path}"

    def remove_save(self, save: str) -> None:
        self._store.remove_tree(f"{self._store.root}/{save}")

    def save_exists(self, save: str) -> bool:
        location = f"{self._store.root}/{save}"
        parent, _, leaf = location.rpartition("/")
        return any(f.name == leaf for f in self._store.folders(parent))

    def put_raw_name(self, name: str, *, folder: bool = False) -> None:
        self._store.put_raw_entry(name, folder=folder)

    def pub_names(self) -> list[str]:
        return self._store.raw_names()


class PosixHarness:
    """A real directory on the real filesystem."""

    name = "posix"

    def __init__(self, root: str) -> None:
        self.root = root
        self._store = PosixStore(root)

    def store(self) -> PosixStore:
        return self._store

    def make_save(self, save: str, files: dict[str, bytes] | None = None) -> str:
        return make_save(self.root, save, files)

    def make_file(self, path: str, data: bytes) -> str:
        location = os.path.join(self.root, path)
        os.makedirs(os.path.dirname(location), exist_ok=True)
        with open(location, "wb") as f:
            f.write(data)
        return location

    def remove_save(self, save: str) -> None:
        import shutil

        shutil.rmtree(os.path.join(self.root, save))

    def save_exists(self, save: str) -> bool:
        return os.path.lexists(os.path.join(self.root, save))

    def put_raw_name(self, name: str, *, folder: bool = False) -> None:
        pub = os.path.join(self.root, "pub")
        os.makedirs(pub, exist_ok=True)
        if folder:
            os.mkdir(os.path.join(pub, name))
        else:
            open(os.path.join(pub, name), "wb").close()

    def pub_names(self) -> list[str]:
        pub = os.path.join(self.root, "pub")
        return sorted(os.listdir(pub)) if os.path.isdir(pub) else []
