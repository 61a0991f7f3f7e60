"""``ckpt doctor`` through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli import ckpt


class TestDoctorPosix:
    def test_a_healthy_root_passes_every_check(self, tmp_path: Path) -> None:
        """On a writable local root, the root and exclusive-create checks pass and the exit code is 0."""
        result = ckpt("--root", str(tmp_path), "--json", "doctor")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["ok"] is True
        assert [c["name"] for c in document["checks"]] == ["root", "exclusive-create"]
        assert all(c["ok"] for c in document["checks"])
        assert list(tmp_path.iterdir()) == []  # the probe cleaned up after itself

    def test_a_malformed_log_fails_the_root_check(self, tmp_path: Path) -> None:
        """A malformed name in pub/ fails the doctor (exit 1) and the detail names it."""
        (tmp_path / "pub").mkdir()
        (tmp_path / "pub" / "not-an-entry").write_bytes(b"")
        result = ckpt("--root", str(tmp_path), "doctor")
        assert result.returncode == 1
        assert result.stdout.startswith("FAIL root: ")
        assert "not-an-entry" in result.stdout

    def test_a_missing_root_fails(self, tmp_path: Path) -> None:
        """A root that does not exist fails the root check."""
        result = ckpt("--root", str(tmp_path / "absent"), "--json", "doctor")
        assert result.returncode == 1
        assert json.loads(result.stdout)["ok"] is False
