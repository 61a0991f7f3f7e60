"""The examples in the package's docstrings run: a ``>>>`` line that stopped being true fails the suite.

Docs are tests (docs/adr/0013-deterministic-tests-and-fuzzing.md): every module under ``src/ckpt`` whose
docstrings hold an example is found by walking the package, so a new example runs without being listed here.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import ckpt

SOURCE = Path(ckpt.__file__).parent


def _modules_with_examples() -> list[str]:
    """Every module of the package whose source holds a doctest prompt."""
    found = ["ckpt"] if ">>> " in (SOURCE / "__init__.py").read_text(encoding="utf-8") else []
    for module in pkgutil.walk_packages([str(SOURCE)], prefix="ckpt."):
        relative = module.name.removeprefix("ckpt.").replace(".", "/")
        path = SOURCE / (relative + ("/__init__.py" if module.ispkg else ".py"))
        if ">>> " in path.read_text(encoding="utf-8"):
            found.append(module.name)
    return found


MODULES = _modules_with_examples()


def test_the_walk_finds_the_examples() -> None:
    """The walk finds the modules known to carry examples (a broken walk would run nothing)."""
    assert {"ckpt.domain.prune", "ckpt.domain.names", "ckpt.domain.proxy.rule"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    """Every example in the module's docstrings gives the output it shows."""
    module = importlib.import_module(name)
    outcome = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=False)
    assert outcome.attempted > 0, f"{name} has a '>>> ' but doctest found no example in it"
    assert outcome.failed == 0, f"{outcome.failed} of {outcome.attempted} examples in {name} failed (run it)"
