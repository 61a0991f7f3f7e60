"""The tests' helpers, one package: pytest puts ``tests/`` on the import path (``pythonpath`` in pyproject).

A child process does not inherit that; one started with ``python -m support.<module>`` gets it from
:func:`subprocess_env` (or from ``cwd=tests/``, which ``python -m`` puts first on its path).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["TESTS_DIR", "module_command", "subprocess_env"]

# The folder that holds this package: what a child process needs on its path to import ``support``.
TESTS_DIR = Path(__file__).resolve().parent.parent


def subprocess_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: ours) with ``tests/`` first on ``PYTHONPATH``, so a child can import ``support``."""
    result = dict(os.environ if env is None else env)
    existing = result.get("PYTHONPATH")
    result["PYTHONPATH"] = os.pathsep.join([str(TESTS_DIR), existing] if existing else [str(TESTS_DIR)])
    return result


def module_command(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` with this interpreter (pair it with
    :func:`subprocess_env`)."""
    return [sys.executable, "-m", module, *args]
