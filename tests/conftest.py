"""Shared fixtures and the hypothesis profiles.

``harness`` runs a test once per store implementation (the contract suite). Every property test draws
its examples deterministically (the ``ci`` profile) unless ``--hypothesis-profile=fuzz`` is given.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, os.path.dirname(__file__))

from harness import Harness, MemoryHarness, PosixHarness
from s3_support import (  # noqa: F401 - the fixtures are imported for pytest to find
    S3_HARNESS_FACTORIES,
    moto_server,
    moto_server_store_client,
)
from support.fuzzing import DETERMINISTIC, register_profiles

# Every run is deterministic unless asked otherwise: `--hypothesis-profile=fuzz` (python3 dev.py fuzz) is
# loaded after this, in hypothesis' pytest_configure, and replaces it. See tests/support/fuzzing.py.
register_profiles()
settings.load_profile(DETERMINISTIC)

HarnessFactory = Callable[[pytest.FixtureRequest, Path], Iterator[Harness]]


def _memory(_request: pytest.FixtureRequest, _tmp: Path) -> Iterator[Harness]:
    yield MemoryHarness()


def _posix(_request: pytest.FixtureRequest, tmp: Path) -> Iterator[Harness]:
    root = tmp / "root"
    root.mkdir()
    yield PosixHarness(str(root))


# name -> factory. The S3 harnesses (moto in-process, moto's HTTP server) are added by tests/s3_support.py.
HARNESS_FACTORIES: dict[str, HarnessFactory] = {"memory": _memory, "posix": _posix}
HARNESS_FACTORIES.update(S3_HARNESS_FACTORIES)


@pytest.fixture(params=sorted(HARNESS_FACTORIES))
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    """One fresh store per implementation."""
    yield from HARNESS_FACTORIES[request.param](request, tmp_path)


@pytest.fixture
def tmpfs_path(tmp_path: Path) -> Iterator[Path]:
    """A fresh folder on tmpfs (/dev/shm) where there is one, else ``tmp_path``.

    For tests that create 100,000 files or make thousands of fsync calls and check nothing a disk does: on
    tmpfs they take seconds instead of half a minute.
    """
    shm = "/dev/shm"
    if not (os.path.isdir(shm) and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir=shm, prefix="ckpt-test-") as folder:
        yield Path(folder)


@pytest.fixture
def tmpfs_root(tmpfs_path: Path) -> Path:
    """An empty checkpoint root, ``root/`` inside :func:`tmpfs_path`."""
    root = tmpfs_path / "root"
    root.mkdir()
    return root
