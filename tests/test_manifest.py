"""The manifest (spec/tiered.md §3) on ``tests/vectors/manifest.json``: decode, encode, verify a listing."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from ckpt.domain.errors import MalformedError
from ckpt.domain.manifest import (
    MANIFEST_NAME,
    Listed,
    Manifest,
    ManifestError,
    ManifestFile,
    decode_manifest,
    encode_manifest,
    verify_listing,
)
from test_vectors import bytes_of, cases, load

Case = dict[str, Any]
PROBLEM_WORDS = {
    "missing": "is missing",
    "extra": "is not in the manifest",
    "size": "bytes",
    "digest": "sha256",
}


def files_of(items: list[dict[str, str]]) -> Manifest:
    return Manifest(tuple(ManifestFile(f["path"], int(f["size"]), f["sha256"]) for f in items))


def verify_params() -> list[Any]:
    return [pytest.param(case, id=case["id"]) for case in load("manifest_verify")["cases"]]


class TestDecode:
    @pytest.mark.parametrize("case", cases("manifest", valid=True))
    def test_valid(self, case: Case) -> None:
        """A valid manifest decodes to its files, and encoding them gives the same bytes back."""
        data = bytes_of(case, "text")
        manifest = decode_manifest(data)
        assert manifest == files_of(case["files"])
        assert encode_manifest(manifest) == data

    @pytest.mark.parametrize("case", cases("manifest", valid=False))
    def test_invalid(self, case: Case) -> None:
        """A malformed manifest is a MalformedError carrying the reason code of the rule it breaks."""
        with pytest.raises(ManifestError) as caught:
            decode_manifest(bytes_of(case, "text"))
        assert caught.value.code == case["reason"]
        assert isinstance(caught.value, MalformedError)
        assert str(caught.value).startswith("manifest")

    @pytest.mark.parametrize("case", cases("manifest", valid=True, known_bugs=False))
    def test_valid_case_is_the_independent_encoding(self, case: Case) -> None:
        """Each valid text is the compact JSON the spec describes, built here by hand (no ckpt code)."""
        import json

        files = ",".join(
            f'{{"path":{json.dumps(f["path"], ensure_ascii=False)},"size":"{f["size"]}",'
            f'"sha256":"{f["sha256"]}"}}'
            for f in case["files"]
        )
        expected = '{"version":1,"algorithm":"sha256","files":[' + files + "]}\n"
        assert bytes_of(case, "text") == expected.encode()
        paths = [f["path"] for f in case["files"]]
        assert paths == sorted(paths)  # Python str order is code-point order

    def test_digests_in_the_vectors_are_sha256(self) -> None:
        """The 'abc' and empty cases carry the real SHA-256 of those bytes."""
        by_id = {c["id"]: c for c in load("manifest")["cases"]}
        assert by_id["abc"]["files"][0]["sha256"] == hashlib.sha256(b"abc").hexdigest()
        assert by_id["one-empty-file"]["files"][0]["sha256"] == hashlib.sha256(b"").hexdigest()


class TestValueTypes:
    def test_of_sorts_and_refuses_duplicates(self) -> None:
        h = "0" * 64
        manifest = Manifest.of([ManifestFile("b", 1, h), ManifestFile("a", 1, h)])
        assert [f.path for f in manifest.files] == ["a", "b"]
        with pytest.raises(ManifestError, match="twice"):
            Manifest.of([ManifestFile("a", 1, h), ManifestFile("a", 2, h)])

    @pytest.mark.parametrize(
        "deep", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000]
    )
    def test_nesting_deeper_than_the_parser_goes_is_not_json(self, deep: bytes) -> None:
        """A manifest written to make the parser recurse (200 kB on a durable root anyone may write) is a
        ManifestError with the not-json code, never a RecursionError that would end a resume."""
        with pytest.raises(ManifestError, match="nests too deeply") as caught:
            decode_manifest(deep)
        assert caught.value.code == "not-json"

    def test_bad_file_values_name_the_path(self) -> None:
        with pytest.raises(ManifestError, match=r"'x'.*size"):
            ManifestFile("x", -1, "0" * 64)
        with pytest.raises(ManifestError, match="manifest itself"):
            ManifestFile(MANIFEST_NAME, 1, "0" * 64)


class TestVerify:
    @pytest.mark.parametrize("case", verify_params())
    def test_listing(self, case: Case) -> None:
        """The first problem in path order, naming the file, or None when the listing verifies."""
        listing = [Listed(i["path"], int(i["size"]), i.get("sha256")) for i in case["listing"]]
        problem = verify_listing(files_of(case["manifest"]), listing)
        if case["problem"] is None:
            assert problem is None
        else:
            assert problem is not None
            assert repr(case["path"]) in problem
            assert PROBLEM_WORDS[case["problem"]] in problem
