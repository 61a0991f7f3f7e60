"""The public API is pinned, and the domain stays pure."""

from __future__ import annotations

import ast
import importlib.util
import pathlib
import subprocess
import sys

import ckpt

SRC = pathlib.Path(ckpt.__file__).parent

PUBLIC_API = [
    "CkptError",
    "ConfigError",
    "CredentialsError",
    "Entry",
    "ExistsError",
    "Framework",
    "FileInfo",
    "Folder",
    "Followed",
    "InvalidError",
    "InvalidTypeError",
    "KeepReason",
    "Kept",
    "MalformedError",
    "NotFoundError",
    "ProxyConfigError",
    "ProxyRule",
    "PruneIncompleteError",
    "PrunePlan",
    "PruneResult",
    "RetentionPlan",
    "SaveNotFoundError",
    "SaveReader",
    "ScanTimeoutError",
    "SkippedFolder",
    "StorageError",
    "Store",
    "Verified",
    "Watcher",
    "WatchStore",
    "follow",
    "format_entry_name",
    "latest",
    "open_store",
    "overlaps",
    "parse_entry_name",
    "parse_epoch",
    "parse_framework",
    "parse_step",
    "plan_prune",
    "plan_retention",
    "resolve_verified",
    "resume_location",
    "stop_on_signals",
    "validate_attempt",
    "validate_save",
]

# The domain may import only these (and itself): pure standard-library modules and attrs.
DOMAIN_ALLOWED = {
    "__future__",
    "attrs",
    "base64",
    "collections",
    "collections.abc",
    "enum",
    "functools",
    "ipaddress",
    "itertools",
    "json",
    "math",
    "operator",
    # Walks a pickle's opcodes over bytes already read (the accelerate rule's completeness check); it never
    # unpickles, so no code from the save runs, and it does no I/O.
    "pickletools",
    "re",
    "string",
    "typing",
    "urllib",
    "urllib.parse",
    "unicodedata",
    "encodings",
    "encodings.idna",
    "dataclasses",
}


# What `ckpt resolve` on a POSIX root must not import: the S3 and Vault clients, the rules and the readers
# they need, the watcher, the prune planner, the configuration and the other commands, logging and json
# (only for --json), and shutil with its compression modules (argparse's width look-up).
NOT_IMPORTED_BY_POSIX_RESOLVE = (
    *("boto3", "botocore", "hvac", "requests", "urllib3", "socket", "ssl", "ipaddress"),
    *("json", "logging", "shutil", "bz2", "lzma", "tomllib", "concurrent.futures"),
    *("ckpt.config", "ckpt.creds", "ckpt.adapters.s3", "ckpt.domain.proxy", "ckpt.application.rulebook"),
    *(
        "ckpt.domain.rules",
        "ckpt.domain.frameworks",
        "ckpt.application.inspection",
        "ckpt.adapters.posix_saves",
    ),
    "ckpt.stopping",
    *("ckpt.application.watcher", "ckpt.application.verify", "ckpt.domain.prune"),
    *("ckpt.cli.retention", "ckpt.cli.watch", "ckpt.cli.follow", "ckpt.cli.resume", "ckpt.cli.doctor"),
    *("ckpt.cli.replicate", "ckpt.application.replication", "ckpt.adapters.posix.tiered"),
    *("ckpt.cli.output", "ckpt.cli.logs"),
)


class TestPublicApi:
    def test_all_is_pinned(self) -> None:
        """ckpt.__all__ is exactly the documented public API."""
        assert sorted(ckpt.__all__) == sorted(PUBLIC_API)

    def test_every_public_name_resolves(self) -> None:
        """Every name in __all__ is importable from ckpt."""
        missing = [name for name in ckpt.__all__ if getattr(ckpt, name, None) is None]
        assert missing == []


class TestLayers:
    def test_domain_imports_nothing_impure(self) -> None:
        """ckpt.domain imports only pure stdlib modules, attrs and itself: no I/O, vendors or outer layers."""
        offenders = []
        for path in sorted((SRC / "domain").rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                offenders += [
                    f"{path.relative_to(SRC)}: {n}"
                    for n in names
                    if n not in DOMAIN_ALLOWED and not n.startswith("ckpt.domain")
                ]
        assert offenders == []

    def test_the_layer_contract_holds(self) -> None:
        """import-linter's contracts in pyproject.toml (no layer imports one above it) are all kept."""
        lint = pathlib.Path(sys.executable).parent / "lint-imports"
        result = subprocess.run(
            [str(lint), "--config", str(SRC.parent.parent / "pyproject.toml"), "--no-cache"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        assert result.returncode == 0, result.stdout[-2000:]
        assert "0 broken" in result.stdout

    def test_no_store_port_is_found_by_getattr(self) -> None:
        """Optional capabilities are protocols checked with isinstance: no getattr on a store in src/."""
        offenders = [
            str(path.relative_to(SRC))
            for path in sorted(SRC.rglob("*.py"))
            if "getattr(self.store" in path.read_text() or "getattr(store" in path.read_text()
        ]
        assert offenders == []

    def test_posix_resolve_imports_only_what_it_needs(self, tmp_path: pathlib.Path) -> None:
        """`ckpt resolve` on a local root imports no S3 or Vault client, no rule, watcher, prune,
        configuration or logging code, nothing argparse would bring for the terminal's width
        (benchmarks/README.md holds its start-up to 1.5x `import attrs`)."""
        for module in NOT_IMPORTED_BY_POSIX_RESOLVE:  # each name is real, so the check below means something
            assert importlib.util.find_spec(module) is not None, module
        code = (
            "import sys\n"
            "from ckpt.cli import main\n"
            f"main(['--root', {str(tmp_path)!r}, 'resolve'])\n"
            f"print([m for m in {NOT_IMPORTED_BY_POSIX_RESOLVE!r} if m in sys.modules])\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        ).stdout
        assert out.strip() == "[]"
