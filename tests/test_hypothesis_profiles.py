"""The default test run is deterministic; ``python3 dev.py fuzz`` explores and reports (ADR 0009)."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from types import ModuleType

import pytest
from hypothesis import settings

from support.fuzzing import DETERMINISTIC, DETERMINISTIC_FUZZ_EXAMPLES, EXPLORATORY, fuzz_settings

REPO = pathlib.Path(__file__).resolve().parent.parent


def _dev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev", REPO / "dev.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _examples_drawn(test_id: str) -> list[str]:
    """Run one property in a fresh pytest process, outside any CI environment, and return what it tried."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHONHASHSEED": "random"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "--hypothesis-verbosity=verbose", test_id],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Verbose hypothesis prints each example it runs ("Test case: ...", "Trying example: ..." before 6.13x),
    # arguments on the lines after (``self`` with its address); only pytest's closing line has a duration.
    lines = done.stdout.splitlines()
    return [re.sub(r" at 0x[0-9a-f]+", "", line) for line in lines if not re.search(r"\d+ passed", line)]


class TestDeterministicDefault:
    def test_the_default_profile_is_derandomized(self) -> None:
        """Without --hypothesis-profile, every property runs under the derandomized ci profile."""
        active = settings.default
        assert settings.get_current_profile_name() == DETERMINISTIC
        assert (active.derandomize, active.database, active.deadline, active.print_blob) == (
            True,
            None,
            None,
            True,
        )

    @pytest.mark.parametrize(
        "test_id",
        [
            "tests/test_domain_properties.py::TestCanonicalForm::test_save_error_matches_the_oracle",
            "tests/test_fuzz_inputs.py::TestFuzzS3Root",
        ],
    )
    def test_two_runs_draw_the_same_examples(self, test_id: str) -> None:
        """Two fresh runs of a property (a plain one and a fuzz-marked one) try exactly the same examples."""
        first = _examples_drawn(test_id)
        assert sum(line.startswith(("Test case", "Trying example")) for line in first) >= 50
        assert _examples_drawn(test_id) == first

    def test_fuzz_properties_get_a_moderate_fixed_count(self) -> None:
        """In the deterministic run a fuzz-marked property draws a fixed few hundred examples."""
        assert fuzz_settings().max_examples == DETERMINISTIC_FUZZ_EXAMPLES


class TestExploratoryProfile:
    def test_the_fuzz_profile_is_random_and_large(self) -> None:
        """The fuzz profile draws with random seeds and 10,000 examples per fuzz-marked property."""
        profile = settings.get_profile(EXPLORATORY)
        assert (profile.derandomize, profile.max_examples, profile.print_blob) == (False, 10_000, True)
        settings.load_profile(EXPLORATORY)
        try:
            assert fuzz_settings().max_examples == 10_000
        finally:
            settings.load_profile(DETERMINISTIC)


PROBE = """
from hypothesis import given, settings, strategies as st

@settings(derandomize=True, database=None, print_blob=True)
@given(st.integers())
def test_small(x):
    assert x < 1000
"""


class TestFuzzReport:
    def test_a_finding_is_reported_with_its_example_and_blob(self, tmp_path: pathlib.Path) -> None:
        """dev.py's report names the failing property, its falsifying example and the reproduction blob."""
        (tmp_path / "test_probe.py").write_text(PROBE)
        report = tmp_path / "junit.xml"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
             "-o", "junit_logging=no", "test_probe.py"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout
        dev = _dev()
        findings = dev.fuzz_findings(str(report))
        assert [test for test, _ in findings] == ["test_probe::test_small"]
        assert dev.fuzz_finished(str(report)) == 1
        text = dev.fuzz_report(findings, done.returncode)
        assert "FUZZ FINDINGS: 1 property(ies) failed" in text
        assert "--- test_probe::test_small" in text
        assert "test_small(" in text  # "Falsifying example:" or, since 6.13x, "Failing test case:"
        assert "x=1000," in text
        assert "@reproduce_failure(" in text

    def test_no_findings_and_a_broken_run_are_told_apart(self) -> None:
        """Exit 0 says there were no findings; a failure without any failed test says the run itself broke."""
        dev = _dev()
        assert "FUZZ: no findings." in dev.fuzz_report([], 0)
        assert "failed without a finding (pytest exit code 5)" in dev.fuzz_report([], 5)
