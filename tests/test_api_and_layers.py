"""The public API is pinned, and the domain stays pure."""

from __future__ import annotations

import ast
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

    def test_posix_resolve_imports_neither_boto3_nor_hvac(self, tmp_path: pathlib.Path) -> None:
        """`ckpt resolve` on a local root never imports boto3, botocore or hvac."""
        code = (
            "import sys\n"
            "from ckpt.cli import main\n"
            f"main(['--root', {str(tmp_path)!r}, 'resolve'])\n"
            "print(sorted(m for m in ('boto3', 'botocore', 'hvac', 'requests') if m in sys.modules))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "[]"
