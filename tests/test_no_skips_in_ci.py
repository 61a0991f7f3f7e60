"""Under ``CKPT_NO_SKIPS=1`` (set by ``.ci/run``) a skip fails: CI installs every framework the tests use."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from support import module_command, subprocess_env

SKIPPING_TEST = """
import pytest

def test_needs_a_missing_framework():
    pytest.importorskip("ckpt_no_such_framework")
"""


RGW_TEST = """
def test_needs_the_gateway(rgw_server):
    pass
"""


def _run(
    tmp_path: Path, no_skips: str | None, test: str = SKIPPING_TEST, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_skipping.py").write_text(test, encoding="utf-8")
    env = subprocess_env()
    if path is not None:
        env["PATH"] = path
    env.pop("CKPT_NO_SKIPS", None)
    if no_skips is not None:
        env["CKPT_NO_SKIPS"] = no_skips
    command = module_command("pytest", "-p", "support.fixtures", "-p", "no:cacheprovider", "-q", "-rfs")
    return subprocess.run(
        [*command, str(tmp_path / "test_skipping.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("no_skips", "code", "word"), [(None, 0, "1 skipped"), ("0", 0, "1 skipped"), ("1", 1, "1 failed")]
)
def test_a_skip_fails_only_under_no_skips(tmp_path: Path, no_skips: str | None, code: int, word: str) -> None:
    """Without the variable a missing framework skips; with it the skip is a failure naming the reason."""
    result = _run(tmp_path, no_skips)
    assert (result.returncode, word in result.stdout) == (code, True), result.stdout + result.stderr
    if code:
        assert "ckpt_no_such_framework" in result.stdout
        assert "CKPT_NO_SKIPS=1" in result.stdout


@pytest.mark.parametrize(("no_skips", "code", "word"), [(None, 0, "1 skipped"), ("1", 1, "1 error")])
def test_a_missing_gateway_skips_saying_how_to_install_or_fails_in_ci(
    tmp_path: Path, no_skips: str | None, code: int, word: str
) -> None:
    """Without Ceph's binaries on PATH the RGW tier skips with the install command; under CI's variable it
    fails (an error at the fixture), with the same words."""
    result = _run(tmp_path, no_skips, RGW_TEST, path=str(tmp_path / "empty-path"))
    assert (result.returncode, word in result.stdout) == (code, True), result.stdout + result.stderr
    assert "Ceph RGW is not installed (no ceph-authtool" in result.stdout
    assert "apt-get install --no-install-recommends radosgw ceph-mon ceph-osd" in result.stdout
    if code:
        assert "CKPT_NO_SKIPS=1 refuses to skip the RGW tier" in result.stdout
