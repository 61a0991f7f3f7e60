"""The exit-code vectors (``tests/vectors/cli_exit_codes.json``), each run as a ``python -m ckpt`` process.

Each case prepares a fresh root in a temporary folder (folders, files, FIFOs), runs one command in a clean
environment and checks its exit code (spec/errors.md §2), and where the case says so its stdout and that its
error is one ``ckpt:`` line (spec/cli.md §3.1). The format is in ``docs/vectors.md``; a port runs the same
cases against its own command.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

VECTORS = Path(__file__).parent / "vectors" / "cli_exit_codes.json"
DOCUMENT: dict[str, Any] = json.loads(VECTORS.read_text(encoding="utf-8"))
CASES = [pytest.param(case, id=case["id"]) for case in DOCUMENT["cases"]]
EXIT_CODES = {0, 1, 2, 3, 4, 5, 130, 141}
# Cases the implementation is known to get wrong, id -> the bug; strict xfails until fixed.
KNOWN_BUGS: dict[str, str] = {}


def substitute(text: str, root: Path) -> str:
    """Replace ``{root}`` with the case's root folder."""
    return text.replace("{root}", str(root))


def prepare(case: dict[str, Any], root: Path) -> None:
    """Create the case's folders, files and FIFOs under ``root``."""
    for rel in case.get("dirs", []):
        (root / rel).mkdir(parents=True, exist_ok=True)
    for rel, content in case.get("files", {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content, encoding="utf-8")
    for rel in case.get("fifos", []):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(root / rel)


def clean_environment(extra: dict[str, str], root: Path) -> dict[str, str]:
    """The test's environment without CKPT_*, DISPATCH_* and WORLD_SIZE, plus the case's ``env``."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_")) and k != "WORLD_SIZE"
    }
    env.update({k: substitute(v, root) for k, v in extra.items()})
    return env


def run(case: dict[str, Any], root: Path) -> tuple[int, str | None, str]:
    """Run the case's command; return its exit code, stdout (``None``: into a closed pipe) and stderr."""
    command = [sys.executable, "-m", "ckpt", *(substitute(a, root) for a in case["args"])]
    env = clean_environment(case.get("env", {}), root)
    if case.get("stdout_pipe") == "closed":
        read_end, write_end = os.pipe()
        os.close(read_end)  # before the process starts: its first write finds no reader
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=subprocess.PIPE,
                env=env,
                cwd=root,
                timeout=30,
                check=False,
            )
        finally:
            os.close(write_end)
        return result.returncode, None, result.stderr.decode("utf-8", "replace")
    result = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, env=env, cwd=root, timeout=30, check=False
    )
    return result.returncode, result.stdout.decode("utf-8"), result.stderr.decode("utf-8", "replace")


class TestExitCodeVectors:
    """Every case of ``cli_exit_codes.json`` as a process."""

    @pytest.mark.parametrize(
        "case",
        [
            pytest.param(
                p.values[0], id=p.id, marks=[pytest.mark.xfail(reason=KNOWN_BUGS[p.id], strict=True)]
            )
            if p.id in KNOWN_BUGS
            else p
            for p in CASES
        ],
    )
    def test_exit_code(self, case: dict[str, Any], tmp_path: Path) -> None:
        """The command exits with the case's code, prints its stdout, and errs in one ``ckpt:`` line."""
        root = tmp_path / "root"
        root.mkdir()
        prepare(case, root)
        code, stdout, stderr = run(case, root)
        assert (code, stderr) == (case["exit"], stderr)
        if "stdout" in case:
            assert stdout == substitute(case["stdout"], root)
        assert "Traceback" not in stderr
        if case.get("error_line") is True:
            lines = stderr.splitlines()
            assert len(lines) == 1, stderr
            assert lines[0].startswith("ckpt: "), stderr
        elif case.get("error_line") is False:
            assert stderr == ""


class TestExitCodeVectorFile:
    """The file has the shape ``docs/vectors.md`` describes (no ckpt code)."""

    def test_every_exit_code_of_the_table_but_sigint_is_exercised(self) -> None:
        """Each exit code of errors.md §2.1 has a case, except 130 (a SIGINT needs a moment to send it)."""
        assert {case["exit"] for case in DOCUMENT["cases"]} == EXIT_CODES - {130}

    def test_cases_name_their_spec_and_situation(self) -> None:
        """Each case cites the section it encodes and says its situation, and uses only known keys."""
        known = {"id", "situation", "dirs", "files", "fifos", "env", "stdout_pipe", "args", "exit", "stdout"}
        known |= {"error_line", "spec"}
        bad = [
            case["id"]
            for case in DOCUMENT["cases"]
            if not case["situation"] or not case["spec"].split(" ")[0].endswith(".md") or set(case) - known
        ]
        assert bad == []
