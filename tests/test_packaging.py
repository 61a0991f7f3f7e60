"""The distribution name: ``ckpt-log`` on the package index, ``ckpt`` as the import name and the command.

The name ``ckpt`` on the public package index belongs to an unrelated project, so ``pip install ckpt[s3]``
would install someone else's code. These tests hold the installed metadata and every install line we print
or document to the name we own.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import re
import tomllib

import ckpt

REPO = pathlib.Path(__file__).resolve().parent.parent
DISTRIBUTION = "ckpt-log"

# `pip install [options] REQUIREMENT...` as written in prose, code blocks and messages (options are flags,
# or a constraints file: `-c FILE`); the requirement is everything up to the next quote-free whitespace,
# backtick or closing parenthesis.
_PIP_INSTALL = re.compile(
    r"pip3? install(?:\s+(?:-c\s+\S+|-{1,2}[\w-]+))*\s+(?P<requirement>'[^']*'|\"[^\"]*\"|[^\s`)]+)"
)


def _install_lines() -> list[tuple[str, str]]:
    """(file, requirement) for every ``pip install`` in the README, docs, benchmarks, src and CI script."""
    files = [REPO / "README.md", REPO / ".ci" / "run", REPO / "dev.py"]
    for folder, pattern in (("docs", "*.md"), ("benchmarks", "*.*"), ("src", "*.py")):
        files.extend(sorted((REPO / folder).rglob(pattern)))
    return [
        (str(path.relative_to(REPO)), match["requirement"].strip("'\""))
        for path in files
        if path.suffix in ("", ".md", ".py")
        for match in _PIP_INSTALL.finditer(path.read_text(encoding="utf-8"))
    ]


def _project_name(requirement: str) -> str:
    """The distribution a requirement names: ``ckpt-log`` for ``ckpt-log[s3,vault]``, ``.`` for ``-e .``."""
    return re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0]


# Tools a benchmark compares with, installed into a venv of their own (benchmarks/bench_tiered.py).
BENCHMARK_TOOLS = frozenset({"awscli"})


class TestDistributionName:
    def test_pyproject_names_the_distribution_we_own(self) -> None:
        """pyproject.toml's project name is ckpt-log; the console script is still called ckpt."""
        with open(REPO / "pyproject.toml", "rb") as f:
            project = tomllib.load(f)["project"]
        assert (project["name"], project["scripts"]) == (DISTRIBUTION, {"ckpt": "ckpt.cli:main"})

    def test_installed_metadata_carries_the_new_name(self) -> None:
        """The installed ckpt-log distribution is the one that provides the ckpt package, at its version."""
        distribution = importlib.metadata.distribution(DISTRIBUTION)
        assert distribution.version == ckpt.__version__
        assert set(importlib.metadata.packages_distributions()["ckpt"]) == {DISTRIBUTION}
        assert [ep.value for ep in distribution.entry_points if ep.group == "console_scripts"] == [
            "ckpt.cli:main"
        ]

    def test_every_install_line_names_ckpt_log(self) -> None:
        """Every pip install in the README, docs, messages and scripts installs ckpt-log or the checkout."""
        lines = _install_lines()
        assert any(file == "README.md" for file, _ in lines), "the README shows how to install"
        wrong = [
            (file, req)
            for file, req in lines
            if _project_name(req) not in (DISTRIBUTION, ".")
            and not (file.startswith("benchmarks/") and _project_name(req) in BENCHMARK_TOOLS)
        ]
        assert wrong == []

    def test_the_readme_installs_the_extras_from_ckpt_log(self) -> None:
        """The README's install line for users brings the S3 and Vault extras from ckpt-log."""
        assert ("README.md", "ckpt-log[s3,vault]") in _install_lines()
