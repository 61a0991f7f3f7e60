"""Reading a saves location for the rules: the POSIX reader on real files, and the vectors through it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix_saves import PosixSaves
from ckpt.adapters.s3 import S3Store
from ckpt.adapters.s3_saves import S3Saves
from ckpt.application.inspection import gather_view
from ckpt.domain.errors import NotFoundError, StorageError
from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import TAIL_BYTES, Item, Kind, Tail
from support.forward_proxy import ForwardProxy, Match, RewriteResponse
from support.rule_layouts import LayoutReader, content, vector_cases, vector_rule, zip_bytes
from support.s3 import new_bucket_name, raw_client
from support.trainer.frameworks import apply_to_folder


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "folder" / "sub").mkdir(parents=True)
    (tmp_path / "folder" / "a.txt").write_bytes(b"hello")
    (tmp_path / "folder" / "sub" / "b.bin").write_bytes(b"\x00" * 3)
    (tmp_path / "file.ckpt").write_bytes(b"0123456789")
    os.symlink("folder", tmp_path / "link-to-folder")
    os.symlink("file.ckpt", tmp_path / "link-to-file")
    os.symlink("../file.ckpt", tmp_path / "folder" / "link-inside")
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


class TestPosixSaves:
    def test_items_are_folders_and_regular_files(self, base: Path) -> None:
        """Links and FIFOs are neither folders nor files: never saves."""
        items = sorted(PosixSaves(str(base)).items(), key=lambda i: i.name)
        assert items == [Item("file.ckpt", Kind.FILE), Item("folder", Kind.FOLDER)]

    def test_files_recursive_without_links(self, base: Path) -> None:
        """A folder's regular files, recursively, by path; a link inside is not listed."""
        assert PosixSaves(str(base)).files("folder") == [FileInfo("a.txt", 5), FileInfo("sub/b.bin", 3)]

    def test_missing_things_are_answers(self, base: Path) -> None:
        """A missing location, folder or file is empty or None, never an error."""
        reader = PosixSaves(str(base / "nowhere"))
        assert reader.items() == []
        assert reader.files("x") == []
        assert reader.head("x", 10) is None
        assert reader.tail("x", 10) is None
        assert not reader.is_file("x")

    def test_a_missing_root_is_an_error(self, tmp_path: Path) -> None:
        """A missing location under a root that is gone too is NotFoundError, not "no saves"."""
        reader = PosixSaves(str(tmp_path / "root" / "exec" / "1"), root=str(tmp_path / "root"))
        with pytest.raises(NotFoundError, match="does not exist"):
            reader.items()
        (tmp_path / "root").mkdir()
        assert reader.items() == []

    def test_is_file(self, base: Path) -> None:
        """Only a regular file is a file: not a link to one, a folder or a FIFO."""
        reader = PosixSaves(str(base))
        assert [reader.is_file(n) for n in ("file.ckpt", "link-to-file", "folder", "fifo")] == [
            True,
            False,
            False,
            False,
        ]

    def test_head_is_bounded(self, base: Path) -> None:
        """A head reads at most its limit."""
        reader = PosixSaves(str(base))
        assert reader.head("file.ckpt", 4) == b"0123"
        assert reader.head("file.ckpt", 100) == b"0123456789"
        assert reader.head("folder/a.txt", 0) == b""

    def test_nothing_is_read_through_links_or_fifos(self, base: Path) -> None:
        """A link, a FIFO (without blocking) and a folder read as absent."""
        reader = PosixSaves(str(base))
        for name in ("link-to-file", "fifo", "folder", "folder/link-inside"):
            assert reader.head(name, 10) is None
            assert reader.tail(name, 10) is None

    def test_tail_of_a_large_file_reads_only_the_end(self, tmp_path: Path) -> None:
        """The tail of a 4 GiB sparse file is its last bytes and its size, read with one pread."""
        big = tmp_path / "big.pt"
        with open(big, "wb") as f:
            f.truncate(4 << 30)
            f.seek((4 << 30) - 3)
            f.write(b"end")
        assert PosixSaves(str(tmp_path)).tail("big.pt", 5) == Tail(4 << 30, b"\x00\x00end")

    def test_tail_of_a_short_file(self, base: Path) -> None:
        """A file shorter than the tail is read whole."""
        assert PosixSaves(str(base)).tail("file.ckpt", 100) == Tail(10, b"0123456789")


@pytest.mark.parametrize(("name", "case"), vector_cases())
def test_vectors_read_from_real_files(name: str, case: dict[str, Any], tmp_path: Path) -> None:
    """Every vector judged from real files through PosixSaves agrees with the in-memory layout."""
    rule = vector_rule(name, case)
    layout = {path: content(spec) for path, spec in case["layout"].items()}
    apply_to_folder(layout, tmp_path)
    posix, memory = PosixSaves(str(tmp_path)), LayoutReader(layout)
    items = sorted(posix.items(), key=lambda i: i.name)
    assert tuple(items) == memory.items()
    saves = [s for s in rule.saves(items) if s.name == case["save"]]
    assert bool(saves) is case["is_save"]
    for save in saves:
        assert rule.judge(gather_view(rule, save, items, posix)) == rule.judge(
            gather_view(rule, save, items, memory)
        )


# -- S3, over real HTTP to moto's server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_bucket(moto_server: str) -> tuple[Any, Any, str]:
    """A bucket on moto's server, an arranging client, and the configured client the store would use."""
    client = raw_client(moto_server)
    bucket = new_bucket_name()
    client.create_bucket(Bucket=bucket)
    return client, raw_client(moto_server), bucket


def _truncated_without_token(body: bytes) -> bytes:
    """moto's ListObjectsV2 answer made to say it is cut short, without saying where to go on."""
    body = re.sub(rb"<NextContinuationToken>[^<]*</NextContinuationToken>", b"", body)
    return body.replace(b"<IsTruncated>false</IsTruncated>", b"<IsTruncated>true</IsTruncated>")


def _upload(client: Any, bucket: str, prefix: str, layout: dict[str, bytes | None]) -> None:
    for path, data in layout.items():
        if data is not None:
            client.put_object(Bucket=bucket, Key=f"{prefix}{path}", Body=data)


class TestS3Saves:
    def test_items_files_heads_tails(self, s3_bucket: tuple[Any, Any, str]) -> None:
        """Folders, files, bounded heads and ranged tails come from the objects under the prefix."""
        arrange, client, bucket = s3_bucket
        _upload(
            arrange,
            bucket,
            "basic/exec/1/",
            {"folder/a.txt": b"hello", "folder/sub/b.bin": b"\x00" * 3, "file.ckpt": b"0123456789"}
            | {"empty": b""},
        )
        arrange.put_object(Bucket=bucket, Key="basic/exec/1/marker/", Body=b"")  # a console folder marker
        reader = S3Saves(client, bucket, "basic/exec/1/")
        assert sorted(reader.items(), key=lambda i: i.name) == [
            Item("empty", Kind.FILE),
            Item("file.ckpt", Kind.FILE),
            Item("folder", Kind.FOLDER),
            Item("marker", Kind.FOLDER),
        ]
        assert reader.files("folder") == [FileInfo("a.txt", 5), FileInfo("sub/b.bin", 3)]
        assert reader.files("marker") == []
        assert [reader.is_file(n) for n in ("file.ckpt", "folder", "nope")] == [True, False, False]
        assert (reader.head("file.ckpt", 4), reader.head("file.ckpt", 100), reader.head("nope", 4)) == (
            b"0123",
            b"0123456789",
            None,
        )
        assert reader.tail("file.ckpt", 3) == Tail(10, b"789")
        assert reader.tail("file.ckpt", 100) == Tail(10, b"0123456789")
        assert reader.tail("nope", 3) is None
        assert reader.head("empty", 10) == b""
        assert reader.tail("empty", 10) == Tail(0, b"")

    def test_a_tail_is_one_ranged_request(self, s3_bucket: tuple[Any, Any, str]) -> None:
        """The tail of a large object is one GetObject carrying a suffix Range: the object is not read."""
        arrange, _, bucket = s3_bucket
        big = bytes(range(256)) * 4096  # 1 MiB
        arrange.put_object(Bucket=bucket, Key="big/shard.pt", Body=big)
        client = raw_client(arrange.meta.endpoint_url)
        ranges: list[str | None] = []
        client.meta.events.register_first(
            "before-send.s3.GetObject", lambda request, **_: ranges.append(request.headers.get("Range"))
        )
        tail = S3Saves(client, bucket, "big/").tail("shard.pt", TAIL_BYTES)
        assert tail == Tail(len(big), big[-TAIL_BYTES:])
        assert [r.decode() if isinstance(r, bytes) else r for r in ranges] == [f"bytes=-{TAIL_BYTES}"]

    def test_tails_concurrently_in_order(self, s3_bucket: tuple[Any, Any, str]) -> None:
        """Many tails read side by side come back in the order asked."""
        arrange, client, bucket = s3_bucket
        _upload(arrange, bucket, "many/", {f"s{i:03d}.pt": zip_bytes(i) for i in range(40)})
        reader = S3Saves(client, bucket, "many/", concurrency=8)
        names = [f"s{i:03d}.pt" for i in range(40)]
        tails = reader.map_concurrently(lambda p: reader.tail(p, TAIL_BYTES), names)
        assert [t.size if t else None for t in tails] == [len(zip_bytes(i)) for i in range(40)]

    @pytest.mark.parametrize("read", ["items", "files", "store-reader"])
    def test_a_listing_cut_short_without_a_token_is_refused(
        self, moto_server: str, s3_bucket: tuple[Any, Any, str], read: str
    ) -> None:
        """A page saying IsTruncated with no continuation token is a StorageError naming the location, as
        the store's own lister has it: the names on the missing pages (a forbidden marker) never look
        absent. The page comes from moto's server, rewritten by a relay in front of it."""
        arrange, _, bucket = s3_bucket
        _upload(arrange, bucket, "cut/exec/1/", {"ck-1/a.bin": b"a", "ck-2/b.bin": b"b", "f.txt": b"f"})
        cut = RewriteResponse(
            _truncated_without_token, when=Match(method="GET", path_prefix=f"/{bucket}?list-type=2")
        )
        with ForwardProxy(upstream=("127.0.0.1", int(moto_server.rsplit(":", 1)[1])), rules=[cut]) as relay:
            client = raw_client(relay.url)
            reader = (
                S3Store(f"s3://{bucket}/cut", client).saves_reader(f"s3://{bucket}/cut/exec/1")
                if read == "store-reader"
                else S3Saves(client, bucket, "cut/exec/1/")
            )
            with pytest.raises(
                StorageError, match="truncated the listing without a continuation token"
            ) as caught:
                reader.files("ck-1") if read == "files" else reader.items()
        listed = "cut/exec/1/ck-1/" if read == "files" else "cut/exec/1/"
        assert f"s3://{bucket}/{listed}" in str(caught.value)
        assert caught.value.location == f"s3://{bucket}/{listed}"
        assert cut.when.hits == 1
        assert [r.outcome for r in relay.requests] == ["rewritten"]

    def test_missing_bucket_is_a_storage_error(self, s3_bucket: tuple[Any, Any, str]) -> None:
        """A listing of a bucket that does not exist is our NotFoundError, not a botocore error."""
        _, client, _ = s3_bucket
        with pytest.raises(NotFoundError):
            S3Saves(client, new_bucket_name(), "x/").items()


@pytest.mark.parametrize(("name", "case"), vector_cases())
def test_vectors_read_from_s3(name: str, case: dict[str, Any], s3_bucket: tuple[Any, Any, str]) -> None:
    """Every vector judged from objects on moto's server through S3Saves agrees with the in-memory layout."""
    arrange, client, bucket = s3_bucket
    rule = vector_rule(name, case)
    layout = {path: content(spec) for path, spec in case["layout"].items()}
    prefix = f"vectors/{name}/{case['id']}/"
    _upload(arrange, bucket, prefix, layout)
    for path, data in layout.items():
        if data is None:  # an empty folder: S3 has none; a console marker stands in for it
            arrange.put_object(Bucket=bucket, Key=f"{prefix}{path.rstrip('/')}/", Body=b"")
    s3, memory = S3Saves(client, bucket, prefix), LayoutReader(layout)
    items = sorted(s3.items(), key=lambda i: i.name)
    assert tuple(items) == memory.items()
    for save in [s for s in rule.saves(items) if s.name == case["save"]]:
        expected = rule.judge(gather_view(rule, save, items, memory))
        assert rule.judge(gather_view(rule, save, items, s3)) == expected
