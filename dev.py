#!/usr/bin/env python3
"""Bootstrap and run ckpt from a fresh checkout with nothing but Python 3.11+.

    python3 dev.py demo          # create .venv if needed, install ckpt, run `ckpt demo`
    python3 dev.py demo --s3     # the same story on an embedded S3 server (installs boto3 and moto)
    python3 dev.py test          # install the test extra, then lint, type-check and run the whole suite
    python3 dev.py bench         # the benchmark table (benchmarks/README.md)
    python3 dev.py ckpt ARGS...  # any ckpt command from the venv

The venv is reused while pyproject.toml is unchanged (a stamp file records what was installed).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
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
    for project in (".", *plugins):
        with open(os.path.join(HERE, project, "pyproject.toml"), "rb") as f:
            hashed += f.read()
    digest = hashlib.sha256(hashed + extras.encode()).hexdigest()[:16]
    stamp = os.path.join(VENV, f".ckpt-installed-{digest}")
    if os.path.exists(stamp):
        return
    if not os.path.exists(os.path.join(BIN, "python")):
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    target = f".[{extras}]" if extras else "."
    pip = [os.path.join(BIN, "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    if _run(*pip, "-e", target) != 0:
        sys.exit("installing ckpt into .venv failed")
    for plugin in plugins:  # real installed packages, so the tests load them through their entry points
        if _run(*pip, "-e", plugin) != 0:
            sys.exit(f"installing the test plugin {plugin} into .venv failed")
    open(stamp, "w").close()


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
            (py, "-m", "mypy"),
        ):
            if _run(*step) != 0:
                return 1
        if rest:  # the caller chose what to run
            return _run(py, "-m", "pytest", *rest)
        # The whole suite, then the fuzz marker in its own pass (10,000 examples per parser).
        if _run(py, "-m", "pytest", "-m", "not fuzz") != 0:
            return 1
        return _run(py, "-m", "pytest", "-m", "fuzz")
    if command == "bench":
        ensure_venv("test,bench")
        return _run(os.path.join(BIN, "python"), "benchmarks/run.py", *rest)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
