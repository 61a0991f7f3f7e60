"""The listing pages the S3 store reads itself (ckpt.adapters.s3.listing, ADR 0027).

The parser is held to botocore's own parse (its rest-xml parser, then its ``EncodingType=url`` decoding) on
the same bodies, shaped by hand and drawn by hypothesis; where it is not sure to agree it must say so
(``None``) and leave the page to botocore. Over moto's server: the pages are taken over, the answer the
store gives is the one it gave before, errors and retries are botocore's, and the request counts stay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote_plus
from xml.sax.saxutils import escape

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.adapters.s3 import PAGE_SIZE, S3Store, make_s3_client
from ckpt.adapters.s3.listing import ListingPage, list_page, page_of_answer, parse_listing_page
from ckpt.domain.errors import StorageError
from support.s3 import (
    FAKE_ENV,
    RequestLog,
    answer_instead,
    error_body,
    http_settings,
    new_bucket_name,
    raw_client,
)

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"


def botocore_page(body: bytes, status: int = 200) -> ListingPage:
    """What botocore makes of ``body`` for a ``ListObjectsV2`` the client sent (EncodingType auto-set)."""
    from botocore.handlers import decode_list_object_v2
    from botocore.parsers import create_parser

    shape = _s3_model().operation_model("ListObjectsV2").output_shape
    parsed = create_parser("rest-xml").parse({"body": body, "headers": {}, "status_code": status}, shape)
    decode_list_object_v2(parsed, {"encoding_type_auto_set": True})
    return page_of_answer(parsed)


_MODEL: list[Any] = []


def _s3_model() -> Any:
    if not _MODEL:
        import botocore.session

        _MODEL.append(botocore.session.Session().get_service_model("s3"))
    return _MODEL[0]


def listing_body(
    keys: Sequence[str] = (),
    *,
    prefixes: Sequence[str] = (),
    truncated: str | None = "false",
    token: str | None = None,
    encoding: str | None = None,
    namespace: str | None = NAMESPACE,
    sizes: list[str | None] | None = None,
    declaration: str = '<?xml version="1.0" encoding="UTF-8"?>',
    extra: str = "",
) -> bytes:
    """A ``ListBucketResult`` document as S3 writes it (keys given as they go on the wire)."""
    xmlns = f' xmlns="{namespace}"' if namespace else ""
    parts = [f"{declaration}<ListBucketResult{xmlns}><Name>bucket</Name><Prefix>pub/</Prefix>"]
    if encoding is not None:
        parts.append(f"<EncodingType>{encoding}</EncodingType>")
    if truncated is not None:
        parts.append(f"<IsTruncated>{truncated}</IsTruncated>")
    parts.append(f"<KeyCount>{len(keys) + len(prefixes)}</KeyCount><MaxKeys>1000</MaxKeys>")
    for n, key in enumerate(keys):
        size = "0" if sizes is None else sizes[n]
        size_element = "" if size is None else f"<Size>{size}</Size>"
        parts.append(
            f"<Contents><Key>{escape(key)}</Key><LastModified>2026-12-01T10:00:00.000Z</LastModified>"
            f"<ETag>&quot;d41d8cd98f00b204e9800998ecf8427e&quot;</ETag>{size_element}"
            "<StorageClass>STANDARD</StorageClass></Contents>"
        )
    parts.extend(f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes)
    if token is not None:
        parts.append(f"<NextContinuationToken>{escape(token)}</NextContinuationToken>")
    parts.append(f"{extra}</ListBucketResult>")
    return "".join(parts).encode("utf-8")


def assert_as_botocore(body: bytes) -> ListingPage:
    """The parser reads ``body`` and agrees with botocore; return the page. A body holding the text
    ``xmlns`` beyond the root's declaration (in a key) is left to botocore: then the parser gives up."""
    ours = parse_listing_page(body)
    expected = botocore_page(body)
    if body.count(b"xmlns") > 1:
        assert ours is None
        return expected
    assert ours is not None, "the parser gave up on a page it should read"
    assert ours == expected
    return ours


ENTRY = "pub/00000000000000000002-00000000000000000100-MV4GKYZPMEXWG2ZNGE"


class TestShapes:
    def test_an_empty_page(self) -> None:
        """No objects, no prefixes, not truncated: an empty page, KeyCount 0."""
        page = assert_as_botocore(listing_body())
        assert page == ListingPage([], [], [], False, None, 0)

    def test_a_truncated_page_carries_its_token(self) -> None:
        """IsTruncated true and NextContinuationToken: both read, the token as sent (never decoded)."""
        body = listing_body(
            [ENTRY], truncated="true", token="1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm+%2F", encoding="url"
        )
        page = assert_as_botocore(body)
        assert (page.truncated, page.token, page.keys) == (
            True,
            "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm+%2F",
            [ENTRY],
        )

    def test_istruncated_is_true_only_for_lowercase_true(self) -> None:
        """``True``, ``1`` and an absent element are not truncated, as for botocore."""
        for text in ("True", "1", "", None):
            assert assert_as_botocore(listing_body([ENTRY], truncated=text)).truncated is False

    def test_unicode_keys_without_encoding(self) -> None:
        """Keys with non-ASCII, XML-escaped and '+'/'%' characters, no EncodingType: taken as they are."""
        keys = ["pub/ü/é", "pub/a&b<c>", "pub/a+b%20c", "pub/日本語 key"]
        assert assert_as_botocore(listing_body(keys)).keys == keys

    def test_url_encoded_keys_and_prefixes_are_decoded(self) -> None:
        """EncodingType url: keys and prefixes percent-decoded, '+' a space, as botocore decodes them."""
        keys = ["pub/ü/é", "pub/a+b", "pub/a b%c", "pub/plain"]
        prefixes = ["exec/ä b+/", "exec/x/"]
        body = listing_body(
            [quote_plus(k, safe="/") for k in keys],
            prefixes=[quote_plus(p, safe="/") for p in prefixes],
            encoding="url",
        )
        page = assert_as_botocore(body)
        assert (page.keys, page.prefixes) == (keys, prefixes)

    def test_common_prefixes_of_a_delimited_listing(self) -> None:
        """Common prefixes beside objects, in listing order."""
        page = assert_as_botocore(listing_body([ENTRY], prefixes=["pub/a/", "pub/b/"]))
        assert page.prefixes == ["pub/a/", "pub/b/"]

    def test_sizes_and_a_missing_size(self) -> None:
        """Size read as an integer; an object without one is 0, as the store read botocore's dict."""
        page = assert_as_botocore(listing_body(["a", "b"], sizes=["123", None]))
        assert page.sizes == [123, 0]

    def test_without_a_namespace_and_with_an_empty_key(self) -> None:
        """A server that sends no namespace, and an empty <Key/>: read as botocore reads them."""
        body = listing_body(["", "k"], namespace=None)
        assert assert_as_botocore(body).keys == ["", "k"]

    def test_without_an_xml_declaration(self) -> None:
        """No declaration: UTF-8 for both."""
        assert assert_as_botocore(listing_body(["pub/ü"], declaration="")).keys == ["pub/ü"]

    def test_a_page_of_a_thousand_entries(self) -> None:
        """A full page, as resolve reads it."""
        keys = [f"pub/{n:020d}-{n:020d}-MV4GKYZPMEXWG2ZNGE" for n in range(PAGE_SIZE)]
        assert assert_as_botocore(listing_body(keys, truncated="true", token="t")).keys == keys

    @pytest.mark.parametrize(
        "keys",
        [
            ["pub%2Fa", "pub%2Fb%2Fc"],  # the one escape of entry keys, decoded by replacing it
            ["pub%2Fa", "pub%2fb"],  # a lowercase escape beside it
            ["pub%2Fa%20b", "pub%2Fc"],  # another escape in the same name
            ["pub%%2Fa"],  # a bare percent sign before it
            ["pub%2F2F", "%2F%2F"],  # what follows a replaced escape is not read again
            ["pub%2Fa+b"],  # a plus, a space for unquote_plus
        ],
    )
    def test_url_encoded_keys_with_and_beside_the_slash_escape(self, keys: list[str]) -> None:
        """Keys whose only escape is %2F take a shorter path than the others: both decode as botocore."""
        assert_as_botocore(listing_body(keys, prefixes=keys, encoding="url"))

    @pytest.mark.parametrize(
        ("body", "why"),
        [
            (listing_body(["pub/page.xml"]), "a key holding the text xml"),
            (listing_body(["k"], namespace="urn:xml:s3"), "a namespace holding the text xml"),
            (listing_body(["k"], declaration='<?xml version="1.0"?><!-- a note -->'), "a comment first"),
            (listing_body(["k"], declaration='<?xml version="1.0"?>\n'), "a newline first"),
            (listing_body(["k"], declaration="<?ckpt note?>"), "another processing instruction"),
        ],
    )
    def test_pages_beyond_the_usual_prolog_are_read_too(self, body: bytes, why: str) -> None:
        """A page whose prolog or text makes the one-scan namespace check unsure is proven by the three
        scans instead, and read."""
        assert parse_listing_page(body) is not None, why
        assert_as_botocore(body)


_DTD = "<!DOCTYPE ListBucketResult []>"


class TestGivingUp:
    """Bodies the parser is not sure to read as botocore does: ``None``, and botocore parses them."""

    @pytest.mark.parametrize(
        ("why", "body"),
        [
            (
                "declared latin-1",
                listing_body(["k"], declaration='<?xml version="1.0" encoding="ISO-8859-1"?>'),
            ),
            ("a byte-order mark", b"\xef\xbb\xbf" + listing_body(["k"])),
            ("malformed XML", listing_body(["k"])[:-5]),
            ("an empty body", b""),
            ("an error document", error_body("InternalError")),
            ("another root", listing_body(["k"]).replace(b"ListBucketResult", b"ListVersionsResult")),
            ("a repeated IsTruncated", listing_body(["k"], extra="<IsTruncated>true</IsTruncated>")),
            (
                "a repeated token",
                listing_body(["k"], token="a", extra="<NextContinuationToken>b</NextContinuationToken>"),
            ),
            ("a Contents without a Key", listing_body(["k"], extra="<Contents><Size>1</Size></Contents>")),
            (
                "a Contents with two Keys",
                listing_body(["k"], extra="<Contents><Key>a</Key><Key>b</Key></Contents>"),
            ),
            (
                "a nested Contents",
                listing_body(["k"], extra="<Owner><Contents><Key>x</Key></Contents></Owner>"),
            ),
            ("a CommonPrefixes without a Prefix", listing_body(["k"], extra="<CommonPrefixes/>")),
            (
                "a Contents with two Sizes",
                listing_body(["k"], extra="<Contents><Key>a</Key><Size>1</Size><Size>2</Size></Contents>"),
            ),
            (
                "a CommonPrefixes with two Prefixes",
                listing_body(
                    ["k"], extra="<CommonPrefixes><Prefix>a</Prefix><Prefix>b</Prefix></CommonPrefixes>"
                ),
            ),
            ("a Key beside the Contents", listing_body(["k"], extra="<Key>stray</Key>")),
            (
                "a Key deeper in a Contents",
                listing_body(["k"], extra="<Contents><Key>a</Key><Owner><Key>b</Key></Owner></Contents>"),
            ),
            ("a foreign namespace", listing_body(["k"], extra='<Key xmlns="urn:other">x</Key>')),
            ("a prefix bound on the root", listing_body(["k"], namespace=NAMESPACE + '" xmlns:x="urn:x')),
            (
                "no namespace but a prefix",
                listing_body(["k"], namespace=None, extra='<x:Key xmlns:x="u">a</x:Key>'),
            ),
            ("a DTD", listing_body(["k"], declaration='<?xml version="1.0"?><!DOCTYPE ListBucketResult []>')),
            (
                "a DTD after a comment naming the root",
                listing_body(["k"], declaration=f'<?xml version="1.0"?><!-- <ListBucketResult -->{_DTD}'),
            ),
            ("a DTD without a declaration", listing_body(["k"], declaration=_DTD)),
            ("an xml: prefix", listing_body(["k"], extra="<xml:Contents><Key>x</Key></xml:Contents>")),
            ("a key holding xmlns", listing_body(["pub/xmlns"])),
            ("a size that is no integer", listing_body(["k"], sizes=["many"])),
            ("a KeyCount that is no integer", listing_body(["k"]).replace(b"<KeyCount>1<", b"<KeyCount>x<")),
            (
                "a field holding an element",
                listing_body(["k"], truncated="true", token="t").replace(
                    b"<IsTruncated>true<", b"<IsTruncated>true<b/><"
                ),
            ),
        ],
    )
    def test_gives_up(self, why: str, body: bytes) -> None:
        """The parser answers None."""
        assert parse_listing_page(body) is None, why


# Characters XML 1.0 can carry in text (no other control characters, no surrogates).
_XML_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r\ufffe\uffff").filter(
        lambda c: c >= " " or c in "\t\n"
    ),
    max_size=40,
)
_ANY_KEY = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40)


class TestAgainstBotocore:
    @given(
        keys=st.lists(_XML_TEXT, max_size=20),
        prefixes=st.lists(_XML_TEXT, max_size=5),
        truncated=st.booleans(),
    )
    def test_raw_keys(self, keys: list[str], prefixes: list[str], truncated: bool) -> None:
        """Any keys XML can carry, sent as they are: the parser and botocore agree."""
        body = listing_body(keys, prefixes=prefixes, truncated="true" if truncated else "false", token="t")
        assert_as_botocore(body)

    @given(keys=st.lists(_ANY_KEY, max_size=20), prefixes=st.lists(_ANY_KEY, max_size=5))
    def test_url_encoded_keys(self, keys: list[str], prefixes: list[str]) -> None:
        """Any keys, url-encoded as S3 sends them with EncodingType=url: both decode them alike, to them."""
        body = listing_body(
            [quote_plus(k) for k in keys], prefixes=[quote_plus(p) for p in prefixes], encoding="url"
        )
        page = assert_as_botocore(body)
        assert (page.keys, page.prefixes) == (keys, prefixes)

    @given(sizes=st.lists(st.one_of(st.none(), st.integers(0, 2**63).map(str)), max_size=10))
    def test_sizes(self, sizes: list[str | None]) -> None:
        """Sizes present or absent: both agree."""
        assert_as_botocore(listing_body([f"k{n}" for n in range(len(sizes))], sizes=sizes))


# -- over moto's server -------------------------------------------------------------------------------------


class Bucket:
    """A fresh bucket on moto's server and a client of its own for the store."""

    def __init__(self, endpoint: str, client: Any = None) -> None:
        self.name = new_bucket_name()
        self.arrange = raw_client(endpoint)
        self.arrange.create_bucket(Bucket=self.name)
        self.client = client or raw_client(endpoint)
        self.taken: list[bool] = []  # per ListObjectsV2 answer: whether the page rode past botocore's parse

        def after_call(parsed: dict[str, Any], **_: Any) -> None:
            self.taken.append("CkptListingPage" in parsed)

        self.client.meta.events.register("after-call.s3.ListObjectsV2", after_call)

    def put(self, key: str, data: bytes = b"") -> None:
        self.arrange.put_object(Bucket=self.name, Key=key, Body=data)


@pytest.fixture
def bucket(moto_server: str) -> Bucket:
    return Bucket(moto_server)


class TestOverHttp:
    def test_pages_are_taken_over_and_the_requests_stay(self, bucket: Bucket) -> None:
        """resolve over 2,500 entries: ceil(n/1000) = 3 ListObjectsV2, each page read by the parser."""
        from ckpt.domain.entries import Entry
        from ckpt.domain.names import format_entry_name

        entries = [Entry(1, n, f"exec/a/ck-{n}") for n in range(2_500)]
        for entry in entries:
            bucket.put(f"pub/{format_entry_name(entry)}")
        store = S3Store(f"s3://{bucket.name}", bucket.client)
        log = RequestLog(bucket.client)
        assert store.resolve() == entries[-1]
        assert log.operations() == ["ListObjectsV2"] * math.ceil(len(entries) / PAGE_SIZE)
        assert bucket.taken == [True, True, True]
        assert store.entries() == entries

    def test_other_callers_of_the_client_get_botocores_dict(self, bucket: Bucket) -> None:
        """A list_objects_v2 the store did not send is parsed by botocore, as ever."""
        bucket.put("pub/x")
        list_page(bucket.client, {"Bucket": bucket.name, "Prefix": "pub/"})
        answer = bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="pub/")
        assert [obj["Key"] for obj in answer["Contents"]] == ["pub/x"]
        assert bucket.taken == [True, False]

    def test_odd_keys_come_back_as_they_were_put(self, bucket: Bucket) -> None:
        """Keys with spaces, '+', '%', '&' and non-ASCII (sent url-encoded): files lists them as put."""
        names = sorted(["a b.bin", "a+b.bin", "50%.bin", "x&y<z>.bin", "ünï/cödé.bin", "日本.bin"])
        for name in names:
            bucket.put(f"exec/a/ck-1/{name}", b"123")
        store = S3Store(f"s3://{bucket.name}", bucket.client)
        files = store.files(f"s3://{bucket.name}/exec/a/ck-1")
        assert [(f.path, f.size) for f in files] == [(name, 3) for name in names]
        assert bucket.taken == [True]
        assert [f.name for f in store.folders(f"s3://{bucket.name}/exec/a")] == ["ck-1"]

    def test_an_error_status_is_botocores_client_error_translated_as_before(self, bucket: Bucket) -> None:
        """403 AccessDenied on the listing: StorageError naming the code, botocore's parse of the error."""
        answer_instead(bucket.client, "ListObjectsV2", 403, error_body("AccessDenied"))
        store = S3Store(f"s3://{bucket.name}", bucket.client)
        with pytest.raises(StorageError, match=r"AccessDenied, HTTP 403"):
            store.resolve()
        assert bucket.taken == [False]

    @pytest.mark.parametrize("status", [500, 200])
    def test_a_page_after_a_retried_failure(self, moto_server: str, status: int) -> None:
        """A 500, or a 200 carrying an <Error> (botocore makes it a 500), then the page: botocore retries
        (two requests sent, two attempts configured), the page is read, the answer is right."""
        bucket = Bucket(moto_server, make_s3_client(http_settings(moto_server, max_attempts=2), FAKE_ENV))
        bucket.put("pub/x")
        answered = answer_instead(
            bucket.client, "ListObjectsV2", status, error_body("InternalError"), times=1
        )
        log = RequestLog(bucket.client)
        page = list_page(bucket.client, {"Bucket": bucket.name, "Prefix": "pub/"})
        assert (page.keys, len(answered), log.operations()) == (["pub/x"], 1, ["ListObjectsV2"] * 2)
        assert bucket.taken == [True]

    def test_botocores_error_check_runs_once_for_every_answer_but_the_pages_taken_over(
        self, bucket: Bucket, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Rule 6: botocore's search for an <Error> inside a 200 answer (a tree of the whole body) is not
        run on a page the parser read, and runs, once, on every other answer of the same client: a listing
        the store did not send, a put, a head."""
        from botocore import handlers

        checked: list[int] = []
        original = handlers._looks_like_special_case_error

        def counting(status_code: int, body: bytes) -> bool:
            checked.append(status_code)
            return original(status_code, body)

        monkeypatch.setattr(handlers, "_looks_like_special_case_error", counting)
        bucket.put("pub/x")
        checked.clear()
        list_page(bucket.client, {"Bucket": bucket.name, "Prefix": "pub/"})
        list_page(bucket.client, {"Bucket": bucket.name, "Prefix": "pub/"})
        assert (checked, bucket.taken) == ([], [True, True])
        bucket.client.list_objects_v2(Bucket=bucket.name, Prefix="pub/")
        bucket.client.put_object(Bucket=bucket.name, Key="pub/y", Body=b"")
        bucket.client.head_object(Bucket=bucket.name, Key="pub/y")
        assert checked == [200, 200, 200]

    def test_a_cut_page_is_still_retried_as_botocore_retries_it(self, moto_server: str) -> None:
        """A 200 whose body is cut short (a network fault): the parser gives up, botocore's check finds
        it malformed and makes it a 500, the retry reads the page."""
        bucket = Bucket(moto_server, make_s3_client(http_settings(moto_server, max_attempts=2), FAKE_ENV))
        bucket.put("pub/x")
        cut = b"<ListBucketResult><Contents>"
        answered = answer_instead(bucket.client, "ListObjectsV2", 200, cut, times=1)
        log = RequestLog(bucket.client)
        page = list_page(bucket.client, {"Bucket": bucket.name, "Prefix": "pub/"})
        assert (page.keys, len(answered), log.operations()) == (["pub/x"], 1, ["ListObjectsV2"] * 2)

    def test_the_last_failed_attempt_is_botocores_error(self, moto_server: str) -> None:
        """500 on every attempt: the store's StorageError naming InternalError, as before."""
        bucket = Bucket(moto_server, make_s3_client(http_settings(moto_server, max_attempts=2), FAKE_ENV))
        answer_instead(bucket.client, "ListObjectsV2", 500, error_body("InternalError"))
        with pytest.raises(StorageError, match="InternalError"):
            S3Store(f"s3://{bucket.name}", bucket.client).entries()
        assert bucket.taken == [False]
