#!/usr/bin/env python3
"""Bootstrap and run ckpt from a fresh checkout with nothing but Python 3.11+.

    python3 dev.py demo          # create .venv if needed, install ckpt, run `ckpt demo`
    python3 dev.py demo --s3     # the same story on an embedded S3 server (installs boto3 and moto)
    python3 dev.py test          # install the test extra, then lint, type-check and run the whole suite
                                 # (deterministic: the same hypothesis examples on every run)
    python3 dev.py fuzz          # exploratory: the fuzz-marked properties with random seeds, 10,000
                                 # examples each; prints a report of whatever it found
                                 # ([--budget SECONDS] stops it in time; other arguments go to pytest)
    python3 dev.py bench         # the benchmark table (benchmarks/README.md)
    python3 dev.py ckpt ARGS...  # any ckpt command from the venv

The venv is reused while pyproject.toml and constraints.txt are unchanged (a stamp file records what was
installed); every install is pinned to constraints.txt, the versions CI tested.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import venv

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venv")
BIN = os.path.join(VENV, "bin")


def _run(*cmd: str, env: dict[str, str] | None = None) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=HERE, env=env)


# Packages the test suite needs installed beside ckpt: the example credential-source plugin
# (docs/credentials-plugins.md).
_TEST_PLUGINS = ("tests/plugins/ckpt_example_source",)


def ensure_venv(extras: str = "") -> None:
    """Create .venv and install ckpt (editable) with ``extras``, unless already done for this pyproject."""
    if sys.version_info < (3, 11):  # noqa: UP036 - this script runs under whatever python3 the user has
        sys.exit(f"ckpt needs Python 3.11 or newer; this is {sys.version.split()[0]}")
    plugins = _TEST_PLUGINS if "test" in extras.split(",") else ()
    hashed = b""
    for path in ("constraints.txt", *(os.path.join(p, "pyproject.toml") for p in (".", *plugins))):
        with open(os.path.join(HERE, path), "rb") as f:
            hashed += f.read()
    digest = hashlib.sha256(hashed + extras.encode()).hexdigest()[:16]
    stamp = os.path.join(VENV, f".ckpt-installed-{digest}")
    if os.path.exists(stamp):
        return
    if not os.path.exists(os.path.join(BIN, "python")):
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    target = f".[{extras}]" if extras else "."
    pip = [os.path.join(BIN, "python"), "-m", "pip", "--disable-pip-version-check"]
    pinned = ["-c", os.path.join(HERE, "constraints.txt")]  # the tested versions (constraints.txt)
    # Until 0.1.0 the distribution was called "ckpt" (a name that belongs to another project on the package
    # index). A venv made then still holds it, and it owns the same package and `ckpt` script; its egg-info
    # in src/ is found on the editable path too. Remove both before installing ckpt-log, so that exactly
    # one distribution provides them.
    if glob.glob(os.path.join(VENV, "lib", "python*", "site-packages", "ckpt-*.dist-info")):
        _run(*pip, "uninstall", "--yes", "--quiet", "ckpt")
    shutil.rmtree(os.path.join(HERE, "src", "ckpt.egg-info"), ignore_errors=True)
    if _run(*pip, "install", "--quiet", *pinned, "-e", target) != 0:
        sys.exit("installing ckpt into .venv failed")
    for plugin in plugins:  # real installed packages, so the tests load them through their entry points
        if _run(*pip, "install", "--quiet", *pinned, "-e", plugin) != 0:
            sys.exit(f"installing the test plugin {plugin} into .venv failed")
    open(stamp, "w").close()


def fuzz(args: list[str]) -> int:
    """Run the fuzz marker under the exploratory profile and report its findings; pytest's exit code.

    ``--budget SECONDS`` bounds the run: when it is spent, pytest is interrupted, the properties that
    finished are reported, and a run with no finding then exits 0. Other arguments go to pytest.
    Exit 0: nothing found; 1: findings, printed in a banner at the end with the failing example and the
    ``@reproduce_failure`` blob; anything else: the run itself went wrong (see pytest's output).
    """
    budget: float | None = None
    if "--budget" in args:
        at = args.index("--budget")
        budget, args = float(args[at + 1]), args[:at] + args[at + 2 :]
    py = os.path.join(BIN, "python")
    with tempfile.TemporaryDirectory(prefix="ckpt-fuzz-") as scratch:
        report = os.path.join(scratch, "junit.xml")
        cmd = [py, "-m", "pytest", "-m", "fuzz", "--hypothesis-profile=fuzz", "--hypothesis-show-statistics",
               f"--junitxml={report}", "-o", "junit_logging=no", *args]  # fmt: skip
        print("+", " ".join(cmd), flush=True)
        out_of_time = False
        # Ctrl-C (or CI's timeout) reaches pytest, which writes its report; this process outlives it to print
        # the banner. A Python handler, unlike SIG_IGN, is not inherited by the child.
        previous = signal.signal(signal.SIGINT, lambda _signum, _frame: None)
        try:
            with subprocess.Popen(cmd, cwd=HERE) as child:
                try:
                    code = child.wait(timeout=budget)
                except subprocess.TimeoutExpired:
                    out_of_time = True
                    child.send_signal(signal.SIGINT)
                    try:  # pytest writes its report and ends; one that does not is killed, not waited for
                        code = child.wait(timeout=120)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        code = child.wait()
        finally:
            signal.signal(signal.SIGINT, previous)
        findings = fuzz_findings(report) if os.path.exists(report) else []
        finished = fuzz_finished(report) if os.path.exists(report) else 0
    if out_of_time:
        finished = max(finished - 1, 0)  # the report also lists the property the interrupt stopped midway
        print(f"FUZZ: the budget of {budget:g} s was spent after {finished} propert(ies) finished; the rest")
        print("      were not reached (python3 dev.py fuzz without --budget runs them all).", flush=True)
        code = 1 if findings else 0
    print(fuzz_report(findings, code), flush=True)
    return code


def fuzz_findings(junit_xml: str) -> list[tuple[str, str]]:
    """(test id, failure text) for every failed or erroring test case in a pytest JUnit XML report."""
    import xml.etree.ElementTree as ET

    found = []
    for case in ET.parse(junit_xml).iter("testcase"):  # noqa: S314 - our own pytest's report, not untrusted
        for problem in [*case.iter("failure"), *case.iter("error")]:
            test = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append((test, problem.text or problem.get("message", "")))
    return found


def fuzz_finished(junit_xml: str) -> int:
    """How many test cases a pytest JUnit XML report shows as run to the end (passed or failed)."""
    import xml.etree.ElementTree as ET

    cases = ET.parse(junit_xml).iter("testcase")  # noqa: S314 - our own pytest's report, not untrusted
    return sum(1 for case in cases if case.find("skipped") is None)


def fuzz_report(findings: list[tuple[str, str]], code: int) -> str:
    """The closing banner of ``dev.py fuzz``: what was found and how to reproduce it, or that nothing was."""
    rule = "=" * 100
    if code == 0:
        return f"{rule}\nFUZZ: no findings.\n{rule}"
    if not findings:
        return f"{rule}\nFUZZ: the run failed without a finding (pytest exit code {code}); see above.\n{rule}"
    lines = [rule, f"FUZZ FINDINGS: {len(findings)} property(ies) failed. Each is a real counterexample:", ""]
    for test, text in findings:
        lines.append(f"--- {test}")
        # pytest's E lines: the error, hypothesis' failing example with its arguments, and the blob.
        kept = [
            line[2:] if line.startswith("E ") else line
            for line in text.splitlines()
            if line.startswith("E ") or "reproduce_failure" in line
        ]
        lines.extend(kept or text.splitlines()[-20:])
        lines.append("")
    lines += [
        "Turn each one into a fixed regression example: add @example(...) with the arguments above to the",
        "property (python3 dev.py test then checks it on every run), and fix the code or the property.",
        rule,
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("demo", [])
    if command == "demo":
        ensure_venv("demo-s3" if "--s3" in rest else "")
        return _run(os.path.join(BIN, "ckpt"), "demo", *rest)
    if command == "ckpt":
        ensure_venv()
        return _run(os.path.join(BIN, "ckpt"), *rest)
    if command == "test":
        ensure_venv("test")
        py = os.path.join(BIN, "python")
        for step in (
            (py, "-m", "ruff", "check", "src", "tests", "benchmarks", "dev.py"),
            (py, "-m", "ruff", "format", "--check", "src", "tests", "benchmarks", "dev.py"),
            (py, "-m", "mypy"),
            (os.path.join(BIN, "lint-imports"),),  # the layer contract in pyproject.toml
        ):
            if _run(*step) != 0:
                return 1
        # The whole suite in one deterministic pass (the fuzz marker included, with a fixed moderate count),
        # or what the caller chose.
        return _run(py, "-m", "pytest", *rest)
    if command == "fuzz":
        ensure_venv("test")
        return fuzz(rest)
    if command == "bench":
        ensure_venv("test,bench")
        return _run(os.path.join(BIN, "python"), "benchmarks/run.py", *rest)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
