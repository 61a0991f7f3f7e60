"""The shared fixtures and the hypothesis profiles: a pytest plugin, loaded by ``-p support.fixtures``.

pyproject's ``[tool.pytest.ini_options]`` puts ``tests/`` on the import path (``pythonpath``) and loads this
module with ``-p`` (``addopts``): every fixture the suites share is defined here, none is re-exported.

``harness`` runs a test once per store implementation (the contract suite). Every property test draws
its examples deterministically (the ``ci`` profile) unless ``--hypothesis-profile=fuzz`` is given.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from ckpt.adapters.s3 import make_s3_client
from support.external_s3 import ExternalS3, ExternalS3Error, external_harness, from_environ
from support.fuzzing import DETERMINISTIC, register_profiles
from support.harness import Harness, MemoryHarness, PosixHarness
from support.rgw import INSTALL_HINT, RgwServer, missing_binaries, serve_rgw
from support.s3 import (
    FAKE_ENV,
    REAL_S3_HARNESS_FACTORIES,
    S3_HARNESS_FACTORIES,
    http_settings,
    isolate_from_aws_environment,
    new_bucket_name,
    only_loopback,
    raw_client,
    serve_moto,
)

# -- the machine's own settings do not leak into the tests -------------------------------------------------

# A runner inside a distributed job (or a shell left with them) would change what the sidecars under test do:
# `ckpt watch` takes its world size from WORLD_SIZE, and the integrations read the launcher's rank variables.
# Tests that want them set them for their own processes.
for _name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
    os.environ.pop(_name, None)
# Secret files written by the tests must be private, as the credential sources demand: under a umask of 002
# (common for a non-root user) they would be group-writable and rightly refused.
os.umask(0o022)

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


# name -> factory. The S3 harnesses (moto in-process, moto's HTTP server) are added by tests/support/s3.py.
HARNESS_FACTORIES: dict[str, HarnessFactory] = {"memory": _memory, "posix": _posix}
HARNESS_FACTORIES.update(S3_HARNESS_FACTORIES)
# The store contract runs on these as well: every store above, and the real S3 server (Ceph RGW).
CONTRACT_HARNESS_FACTORIES: dict[str, HarnessFactory] = {**HARNESS_FACTORIES, **REAL_S3_HARNESS_FACTORIES}
# ... and an operator's own S3 server, when CKPT_TEST_S3_ENDPOINT names one (tests/support/external_s3.py).
if os.environ.get("CKPT_TEST_S3_ENDPOINT"):
    CONTRACT_HARNESS_FACTORIES["s3-external"] = external_harness


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


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start moto's server on a free loopback port for the session; yield its endpoint URL.

    It is ``tests/support/atomic_moto_server.py``: moto with ``PutObject`` atomic, as S3 has it. Stock moto
    lets concurrent conditional puts of one key both win, which ``ckpt doctor``'s concurrent probe rightly
    reports as a broken storage.
    """
    log = tmp_path_factory.mktemp("moto-server") / "server.log"
    tests = str(Path(__file__).resolve().parent.parent)
    with serve_moto(log, module="support.atomic_moto_server", cwd=tests) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def moto_server_store_client(moto_server: str, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The client ``make_s3_client`` builds for moto's server from a ``Config``, shared by the session.

    Built once (a fresh botocore session loads the S3 model, a tenth of a second or more), under an
    environment with fake keys and no ~/.aws; its credentials are resolved when it is built.
    """
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate_from_aws_environment(monkeypatch, tmp_path_factory.mktemp("aws-home"))
        client = make_s3_client(http_settings(moto_server), environ=FAKE_ENV)
    return only_loopback(client)


@pytest.fixture(scope="session")
def rgw_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RgwServer]:
    """Start a one-node Ceph cluster and its RADOS Gateway for the session (tests/support/rgw.py).

    A real S3 server that checks SigV4 and creates exclusively by itself. Where its binaries are missing the
    tests that use it skip, saying how to install them; under ``CKPT_NO_SKIPS=1`` (CI) they fail instead.
    """
    missing = missing_binaries()
    if missing:
        message = f"Ceph RGW is not installed (no {', '.join(missing)} on PATH): {INSTALL_HINT}"
        if os.environ.get(NO_SKIPS) == "1":
            pytest.fail(f"{message}; {NO_SKIPS}=1 refuses to skip the RGW tier", pytrace=False)
        pytest.skip(message)
    with serve_rgw(tmp_path_factory.mktemp("rgw-cluster")) as server:
        yield server


@pytest.fixture(scope="session")
def rgw_server_store_client(rgw_server: RgwServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The client ``make_s3_client`` builds for the gateway from a ``Config``, signing with its main key."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        isolate_from_aws_environment(monkeypatch, tmp_path_factory.mktemp("aws-home"))
        environ = {"AWS_ACCESS_KEY_ID": rgw_server.access_key, "AWS_SECRET_ACCESS_KEY": rgw_server.secret_key}
        client = make_s3_client(http_settings(rgw_server.endpoint), environ=environ)
    return only_loopback(client)


@pytest.fixture(scope="session", params=["moto", "rgw"])
def s3_server(request: pytest.FixtureRequest) -> str:
    """The endpoint of each real-HTTP S3 server in turn: moto's (atomic) server, then Ceph RGW.

    For the tests whose proof is about the server's answers (exclusive create, races, the doctor's probe):
    they hold on both. Every key in ``support.rgw.ACCESS_KEYS`` is accepted by both.
    """
    if request.param == "rgw":
        server: RgwServer = request.getfixturevalue("rgw_server")
        return server.endpoint
    endpoint: str = request.getfixturevalue("moto_server")
    return endpoint


@pytest.fixture(scope="session")
def external_s3(request: pytest.FixtureRequest) -> ExternalS3:
    """The S3 server ``CKPT_TEST_S3_*`` name (tests/support/external_s3.py); without them, Ceph RGW.

    The fallback is the session's gateway, with a bucket and a key pair of its own, reached through the same
    code as an operator's server: so the option is tested wherever the RGW tier runs.
    """
    try:
        target = from_environ(os.environ, ci=os.environ.get(NO_SKIPS) == "1")
    except ExternalS3Error as exc:
        pytest.fail(str(exc), pytrace=False)
    if target is not None:
        return target
    server: RgwServer = request.getfixturevalue("rgw_server")
    bucket = new_bucket_name()
    raw_client(server.endpoint).create_bucket(Bucket=bucket)
    server.add_key("AKIDQUALIFYING", "qualifying-SECRET-never-printed")  # keys of its own, as a site's
    return ExternalS3(server.endpoint, bucket, "AKIDQUALIFYING", "qualifying-SECRET-never-printed")


@pytest.fixture
def s3_server_kind(s3_server: str, request: pytest.FixtureRequest) -> str:
    """Which server ``s3_server`` is in this test: ``"moto"`` or ``"rgw"`` (for expectations per server)."""
    kind: str = request.node.callspec.params["s3_server"]
    return kind


# -- no skip passes unnoticed in CI -------------------------------------------------------------------------

NO_SKIPS = "CKPT_NO_SKIPS"  # .ci/run sets it: every package the tests need is installed there


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Under ``CKPT_NO_SKIPS=1`` a skipped test is reported as failed, with the reason it gave.

    The real-framework tests skip where torch, transformers, lightning or jax are missing, so that the test
    command runs on a bare machine; CI installs them all, and there a skip would hide a test that never ran.
    """
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get(NO_SKIPS) == "1" and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"{item.nodeid} was skipped under {NO_SKIPS}=1 (CI installs everything): {reason}"
