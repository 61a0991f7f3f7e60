"""A save's manifest: every file, its size and SHA-256, written last in a replicated save (spec/tiered.md §3).

Rules:

1. The manifest is the file :data:`MANIFEST_NAME` at the top of the save. It lists every other regular file
   of the save (never itself) by its path relative to the save, slash-separated.
2. Its content is exactly what :func:`encode_manifest` writes: UTF-8 JSON, compact, in the key order
   ``version``, ``algorithm``, ``files``, and a newline; each file ``{"path", "size", "sha256"}``; sizes are
   decimal strings (64-bit values are strings, docs/vectors.md); digests lower-case hex; files in strictly
   ascending code-point order of their paths. :func:`decode_manifest` accepts nothing else and names what
   is wrong (``MalformedError`` with a reason code, see ``ManifestError.code``).
3. A listing verifies against a manifest (:func:`verify_listing`) when it holds exactly the manifest's files
   (the manifest itself aside) with the same sizes and, where the listing knows a digest, the same digest.
   The first problem in path order is the answer; ``None`` means it verifies.

Pure: standard library (json) and attrs only.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from ckpt.domain.errors import MalformedError

__all__ = [
    "ALGORITHM",
    "MANIFEST_NAME",
    "MAX_MANIFEST_BYTES",
    "RESTORING",
    "RESTORING_NAME",
    "Listed",
    "Manifest",
    "ManifestError",
    "ManifestFile",
    "decode_manifest",
    "encode_manifest",
    "verify_listing",
]

MANIFEST_NAME = ".ckpt-manifest.json"
# The mark a restore leaves in a fast save folder while it fills it (spec/tiered.md §6.3): a folder holding
# it is no complete save under any rule, however whole its markers look, until the restore removes it.
RESTORING_NAME = ".ckpt-restoring"
RESTORING = f"being restored from the durable root ({RESTORING_NAME} is there)"
ALGORITHM = "sha256"
VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20  # the store's read cap (spec/watcher.md): millions of files
_MAX_U64 = 2**64 - 1
_HEX64 = re.compile(r"[0-9a-f]{64}")
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,19}")
_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_KEYS = ("version", "algorithm", "files")
_FILE_KEYS = ("path", "size", "sha256")


class ManifestError(MalformedError):
    """A manifest that does not decode; ``code`` is the rule broken (docs/vectors.md, ``manifest.json``)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message, why=message)
        self.code = code


def path_problem(path: str) -> str | None:
    """Why ``path`` is not a clean file path inside a save (rule 1), or ``None``."""
    if not path:
        return "is empty"
    if _CONTROL.search(path):
        return "holds a control character or a byte that is not UTF-8"
    if path.startswith("/") or path.endswith("/"):
        return "starts or ends with '/'"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' element"
    if path == MANIFEST_NAME:
        return "is the manifest itself"
    return None


@attrs.frozen
class ManifestFile:
    """One file of a save: its path relative to the save, its size in bytes, its SHA-256 (lower-case hex)."""

    path: str
    size: int
    sha256: str

    def __attrs_post_init__(self) -> None:
        problem = path_problem(self.path) if isinstance(self.path, str) else "is not a string"
        if problem is not None:
            raise ManifestError(f"manifest file path {self.path!r} {problem}", code="path")
        if type(self.size) is not int or not 0 <= self.size <= _MAX_U64:
            raise ManifestError(
                f"manifest file {self.path!r}: size {self.size!r} is not 0..2**64-1", code="size"
            )
        if not isinstance(self.sha256, str) or not _HEX64.fullmatch(self.sha256):
            raise ManifestError(
                f"manifest file {self.path!r}: sha256 {self.sha256!r} is not 64 lower-case hex digits",
                code="digest",
            )


def _check_files(files: Sequence[ManifestFile]) -> None:
    for before, after in itertools.pairwise(files):
        if before.path == after.path:
            raise ManifestError(f"manifest lists {after.path!r} twice", code="duplicate")
        if before.path > after.path:
            raise ManifestError(
                f"manifest files are not in ascending path order: {after.path!r} after {before.path!r}",
                code="order",
            )
    paths = {f.path for f in files}
    for f in files:
        head = f.path
        while "/" in head:
            head = head.rpartition("/")[0]
            if head in paths:
                raise ManifestError(
                    f"manifest lists {head!r} as a file and as a folder of {f.path!r}", code="conflict"
                )


@attrs.frozen
class Manifest:
    """Every file of a save, in ascending path order (rule 2). :meth:`of` sorts a listing into one."""

    files: tuple[ManifestFile, ...]

    def __attrs_post_init__(self) -> None:
        _check_files(self.files)

    @classmethod
    def of(cls, files: Iterable[ManifestFile]) -> Manifest:
        """The manifest of ``files`` in any order."""
        return cls(tuple(sorted(files, key=lambda f: f.path)))

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def encode_manifest(manifest: Manifest) -> bytes:
    """The manifest's canonical bytes (rule 2).

    >>> encode_manifest(Manifest(()))
    b'{"version":1,"algorithm":"sha256","files":[]}\\n'
    """
    document = {
        "version": VERSION,
        "algorithm": ALGORITHM,
        "files": [{"path": f.path, "size": str(f.size), "sha256": f.sha256} for f in manifest.files],
    }
    return (json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise ManifestError(f"manifest has the key {key!r} twice in one object", code="duplicate-key")
    return dict(pairs)


def _fail(what: str, code: str) -> ManifestError:
    return ManifestError(f"manifest {what}", code=code)


def _decode_file(item: object, index: int) -> ManifestFile:
    if not isinstance(item, dict) or tuple(item) != _FILE_KEYS:
        raise _fail(
            f"file {index} is not an object with exactly the keys path, size, sha256 in that order",
            "file-keys",
        )
    path, size = item["path"], item["size"]
    if not isinstance(path, str):
        raise _fail(f"file {index}: path {path!r} is not a string", "path")
    if not isinstance(size, str) or not _DECIMAL.fullmatch(size) or int(size) > _MAX_U64:
        raise _fail(f"file {path!r}: size {size!r} is not a decimal string 0..2**64-1", "size")
    return ManifestFile(path, int(size), item["sha256"])


def decode_manifest(data: bytes) -> Manifest:
    """Parse a manifest; ``ManifestError`` (a ``MalformedError``) unless it is exactly canonical (rule 2).

    >>> m = Manifest((ManifestFile("w/x.bin", 3, "0" * 64),))
    >>> decode_manifest(encode_manifest(m)) == m
    True
    """
    if len(data) > MAX_MANIFEST_BYTES:
        raise _fail(f"is larger than {MAX_MANIFEST_BYTES} bytes", "too-large")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(f"is not UTF-8 (byte {exc.start})", "not-utf8") from None
    try:
        document = json.loads(text, object_pairs_hook=_no_duplicates)
    except ManifestError:
        raise
    except ValueError as exc:
        raise _fail(f"is not JSON: {exc}", "not-json") from None
    except RecursionError:  # nesting deeper than the parser goes is no manifest either
        raise _fail("is not JSON this decoder reads: it nests too deeply", "not-json") from None
    if not isinstance(document, dict) or tuple(document) != _KEYS:
        raise _fail("is not an object with exactly the keys version, algorithm, files in that order", "keys")
    if type(document["version"]) is not int or document["version"] != VERSION:
        raise _fail(f"version {document['version']!r} is not {VERSION}", "version")
    if document["algorithm"] != ALGORITHM:
        raise _fail(f"algorithm {document['algorithm']!r} is not {ALGORITHM!r}", "algorithm")
    if not isinstance(document["files"], list):
        raise _fail("files is not a list", "files")
    manifest = Manifest(tuple(_decode_file(item, i) for i, item in enumerate(document["files"])))
    if encode_manifest(manifest) != data:
        raise _fail(
            "is not in canonical form (compact JSON, only the escapes JSON needs, one newline)",
            "not-canonical",
        )
    return manifest


@attrs.frozen
class Listed:
    """A file as a tier lists it: path in the save, size, and its SHA-256 when the tier knows it."""

    path: str
    size: int
    sha256: str | None = None


def verify_listing(manifest: Manifest, listing: Iterable[Listed]) -> str | None:
    """The first problem (in path order) of ``listing`` against ``manifest``, or ``None`` (rule 3).

    >>> m = Manifest((ManifestFile("a", 3, "0" * 64),))
    >>> verify_listing(m, [Listed("a", 3)]) is None
    True
    >>> verify_listing(m, [Listed("a", 2)])
    "file 'a' has 2 bytes, the manifest says 3"
    """
    listed = {item.path: item for item in listing if item.path != MANIFEST_NAME}
    expected = {f.path: f for f in manifest.files}
    for path in sorted(expected.keys() | listed.keys()):
        want, got = expected.get(path), listed.get(path)
        if got is None:
            return f"file {path!r} is missing"
        if want is None:
            return f"file {path!r} is not in the manifest"
        if got.size != want.size:
            return f"file {path!r} has {got.size} bytes, the manifest says {want.size}"
        if got.sha256 is not None and got.sha256 != want.sha256:
            return f"file {path!r} has sha256 {got.sha256}, the manifest says {want.sha256}"
    return None
