"""Which build a pod runs: ``ckpt --version``, the sidecar's start-up line, and ``doctor --json``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import ckpt


def ckpt_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    return subprocess.run(
        [sys.executable, "-m", "ckpt", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


class TestVersion:
    def test_the_installed_distribution_carries_the_one_version(self) -> None:
        """The metadata of the distribution that installed the package says ``ckpt.__version__``."""
        distributions = metadata.packages_distributions().get("ckpt", [])
        assert distributions, "no installed distribution provides the ckpt package"
        assert {metadata.version(name) for name in distributions} == {ckpt.__version__}

    def test_version_option_prints_the_version(self) -> None:
        """``ckpt --version`` prints ``ckpt <version>`` on stdout and exits 0, with no command needed."""
        result = ckpt_cli("--version")
        assert (result.returncode, result.stdout, result.stderr) == (0, f"ckpt {ckpt.__version__}\n", "")

    def test_version_option_wins_over_a_command(self, tmp_path: Path) -> None:
        """``--version`` before a command prints the version and runs nothing."""
        result = ckpt_cli("--root", str(tmp_path), "--version", "resolve")
        assert (result.returncode, result.stdout) == (0, f"ckpt {ckpt.__version__}\n")

    def test_doctor_json_includes_the_version(self, tmp_path: Path) -> None:
        """``doctor --json`` names the version next to its checks."""
        result = ckpt_cli("--root", str(tmp_path), "--json", "doctor")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["version"] == ckpt.__version__

    def test_the_sidecar_logs_the_version_at_start(self, tmp_path: Path) -> None:
        """``ckpt watch`` names its version in its first log line, as a field."""
        result = ckpt_cli(
            "--root", str(tmp_path), "watch", "--framework", "dcp", "--attempt", "a", "--epoch", "1", "--once"
        )
        assert result.returncode == 0, result.stderr
        first = result.stderr.splitlines()[0]
        assert " watching " in first, result.stderr
        assert first.endswith(f" version={ckpt.__version__}"), result.stderr
