"""One ``ListObjectsV2`` page, read from its XML body by the standard library's XML parser, expat (ADR 0027).

botocore signs, sends, retries and raises for every listing as for any request; only the body of a
successful page skips botocore's parse, which builds a dict per key (its dates and ETags parsed too) and
cost about 0.1-0.2 ms a key, most of a listing's client CPU. Rules:

1. Every listing the store sends goes through :func:`list_page` (``Bucket.pages`` and
   ``Bucket.any_object_under``), which asks the client's ``list_objects_v2`` as before: the same request,
   the same parameters (botocore still adds ``EncodingType=url``), the same retries, the same errors.
2. The page is taken over in botocore's ``before-parse.s3.ListObjectsV2`` event, only for a call made by
   :func:`list_page` on this thread (a thread-local flag: the client's other callers get botocore's dict as
   ever), and only when the answer is a 2xx whose body :func:`parse_listing_page` reads. Then the body
   handed on to botocore's parser is empty, and the page rides in the parsed answer under a private key.
   Anything else (an error status, which botocore turns into ``ClientError`` as before; a body this parser
   is not sure to read as botocore would) is left to botocore untouched, and the page is built from
   botocore's dict (:func:`page_of_answer`): the answer is the same either way, only slower.
3. :func:`parse_listing_page` reads what the store uses and nothing else: each ``Contents``' ``Key`` and
   ``Size``, each ``CommonPrefixes``' ``Prefix``, ``IsTruncated``, ``NextContinuationToken``, ``KeyCount``
   and ``EncodingType``, with botocore's meanings (an empty element is ``""``, ``IsTruncated`` is true only
   for ``true``, integers by ``int``). It gives up (``None``) on a body not declared UTF-8 (botocore reads
   every body as UTF-8), malformed XML, a root other than ``ListBucketResult``, any namespace declaration
   but the root's own (or a DTD), a repeated field, or a ``Contents`` or ``CommonPrefixes`` element not
   directly under the root; a key holding the text ``xmlns`` therefore sends its page to botocore.
4. Keys and prefixes are percent-decoded as botocore decodes them (``unquote_plus``) when the page says
   ``EncodingType`` ``url``, and only those holding ``%`` or ``+``: entry names never do.
5. One page at a time: the body, which botocore has already read whole, goes to expat in one piece
   (``ElementTree.fromstring``) and the page is read from its tree by C loops (``findall``, ``iter``,
   ``map``); the tree is dropped with the page. Fed piecewise with a Python loop over every element's end
   event (``XMLPullParser``), as at first, it cost about 1.5 times as much CPU a key.

6. botocore itself parses every 200 answer of S3 into a tree once more, only to see whether its root is
   ``Error`` (its ``_handle_200_error``, first among the client's ``before-parse.s3.*`` handlers): for a
   listing page that doubled the client's parse. On each client :func:`list_page` uses, that handler is
   replaced by :func:`_before_parse`, registered first in its place: a page it takes over has the root
   ``ListBucketResult`` (no error hides in it), and every other answer, of any operation, goes to botocore's
   handler as before. A botocore without a handler of that name keeps its own, and pages are parsed twice.

The standard library only (``xml.etree.ElementTree``); botocore is imported only to find rule 6's handler.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections.abc import Mapping
from operator import methodcaller
from typing import Any
from urllib.parse import unquote_plus
from xml.etree import ElementTree

import attrs

__all__ = ["ListingPage", "list_page", "page_of_answer", "parse_listing_page"]

_ALL_PARSES = "before-parse.s3.*"  # where botocore checks every 200 answer for an error (rule 6)
_HOOK_ID = "ckpt-listing-page"
_ANSWER_KEY = "CkptListingPage"  # where the page rides in botocore's parsed answer (no S3 member has it)
# The XML declaration's encoding, when it names one (rule 3).
_DECLARED = re.compile(rb"<\?xml[^>]*?encoding\s*=\s*[\"']([^\"']*)[\"']")
_UTF8 = (b"utf-8", b"utf8")
_FIELDS = ("IsTruncated", "NextContinuationToken", "KeyCount", "EncodingType")


@attrs.frozen
class ListingPage:
    """What the store reads from one ``ListObjectsV2`` page.

    ``keys`` and ``sizes`` are the objects' in listing order (a missing ``Size`` is 0), ``prefixes`` the
    common prefixes; all keys and prefixes are decoded. ``token`` is ``NextContinuationToken`` (``None``
    when absent), ``key_count`` is ``KeyCount`` (``None`` when absent).
    """

    keys: list[str]
    sizes: list[int]
    prefixes: list[str]
    truncated: bool = False
    token: str | None = None
    key_count: int | None = None


_local = threading.local()


def list_page(client: Any, params: Mapping[str, Any]) -> ListingPage:
    """Send one ``ListObjectsV2`` with ``params`` through ``client`` and return its page (rules 1, 2).

    Errors are the client's own (``ClientError`` and friends), raised as ``list_objects_v2`` raises them.
    A client without botocore's event system (a test double) is asked as it is and its dict read.
    """
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is None:
        return page_of_answer(client.list_objects_v2(**params))
    _install(events)
    outer = getattr(_local, "active", False)
    _local.active = True
    try:
        answer = client.list_objects_v2(**params)
    finally:
        _local.active = outer
    page = answer.get(_ANSWER_KEY)
    return page if isinstance(page, ListingPage) else page_of_answer(answer)


_installed: weakref.WeakSet[Any] = weakref.WeakSet()  # the clients' event emitters already set up
_installing = threading.Lock()


def _install(events: Any) -> None:
    """Rule 6: put :func:`_before_parse` first in the client's ``before-parse.s3.*`` handlers, in place of
    botocore's check for an error inside a 200 answer, which it then calls for every other answer."""
    if events in _installed:
        return
    with _installing:
        if events in _installed:
            return
        check = _botocore_200_check()
        if check is not None:
            events.unregister(_ALL_PARSES, check)
        events.register_first(_ALL_PARSES, _before_parse, unique_id=_HOOK_ID)
        _installed.add(events)


def _botocore_200_check() -> Any:
    """botocore's handler that parses every 200 answer of S3 looking for an ``<Error>`` root, or ``None``
    where this botocore has none by that name (then it stays, and pages are parsed twice, as before)."""
    try:
        from botocore import handlers
    except ImportError:  # a client double without botocore
        return None
    return getattr(handlers, "_handle_200_error", None)


def _before_parse(
    response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **rest: Any
) -> None:
    """The ``before-parse.s3.*`` handler (rules 2 and 6): take over a page of :func:`list_page`'s call, else
    let botocore look for an error inside a 200 answer, as it would have."""
    listing = getattr(rest.get("operation_model"), "name", None) == "ListObjectsV2"
    if listing and _take_over(response_dict, customized_response_dict):
        return  # a page whose root is ListBucketResult: no error hides in it
    check = _botocore_200_check()
    if check is not None:
        check(response_dict=response_dict, customized_response_dict=customized_response_dict, **rest)


def _take_over(response_dict: dict[str, Any], customized_response_dict: dict[str, Any]) -> bool:
    """Read a successful page of :func:`list_page`'s call (rule 2); whether it was taken over."""
    if not getattr(_local, "active", False) or not 200 <= response_dict.get("status_code", 0) < 300:
        return False
    body = response_dict.get("body")
    if not isinstance(body, bytes):
        return False
    page = parse_listing_page(body)
    if page is None:
        return False
    customized_response_dict[_ANSWER_KEY] = page
    response_dict["body"] = b""  # botocore's parser then reads the headers only
    return True


def page_of_answer(answer: Mapping[str, Any]) -> ListingPage:
    """The page of botocore's parsed (and already decoded) ``ListObjectsV2`` answer."""
    contents = answer.get("Contents", ())
    token = answer.get("NextContinuationToken")
    count = answer.get("KeyCount")
    return ListingPage(
        [obj["Key"] for obj in contents],
        [int(obj.get("Size", 0)) for obj in contents],
        [common["Prefix"] for common in answer.get("CommonPrefixes", ())],
        bool(answer.get("IsTruncated")),
        token if token else None,
        count if isinstance(count, int) else None,
    )


def _utf8(body: bytes) -> bool:
    """True when botocore, which reads every body as UTF-8, and this parser read ``body`` alike."""
    if body.startswith(b"<?xml"):
        declared = _DECLARED.match(body, 0, body.find(b"?>") + 2)
        return declared is None or declared.group(1).lower() in _UTF8
    return body.startswith(b"<")  # no declaration: UTF-8 for both (a byte-order mark is not taken)


def parse_listing_page(body: bytes) -> ListingPage | None:
    """Read a ``ListBucketResult`` body as botocore reads it; ``None`` when unsure (rules 3-5)."""
    if not _utf8(body):
        return None
    try:
        root = ElementTree.fromstring(body)  # noqa: S314 - no DTD is accepted (_one_namespace)
    except ElementTree.ParseError:
        return None
    tag = root.tag
    namespace = tag[: tag.find("}") + 1] if tag.startswith("{") else ""
    if tag != namespace + "ListBucketResult" or not _one_namespace(body, namespace):
        return None
    contents_tag, common_tag = namespace + "Contents", namespace + "CommonPrefixes"
    contents = root.findall(contents_tag)  # the root's own children (C loops, as are iter and the maps)
    commons = root.findall(common_tag)
    if (_count(root, contents_tag), _count(root, common_tag)) != (len(contents), len(commons)):
        return None  # one of them was not directly under the root
    key_tag, size_tag, prefix_tag = namespace + "Key", namespace + "Size", namespace + "Prefix"
    # Each one's first such child (find returns elements, where findall made a list per object: a page's
    # allocations are what the garbage collector pays for); the counts over the whole tree then prove that
    # none has a second and that there is none anywhere else (but the root's own Prefix).
    found_keys = list(map(methodcaller("find", key_tag), contents))
    found_sizes = list(map(methodcaller("find", size_tag), contents))
    found_prefixes = list(map(methodcaller("find", prefix_tag), commons))
    if None in found_keys or None in found_prefixes:
        return None  # a Contents without a Key, a CommonPrefixes without a Prefix
    expected = (
        len(contents),
        len(commons) + len(root.findall(prefix_tag)),
        len(contents) - found_sizes.count(None),
    )
    if (_count(root, key_tag), _count(root, prefix_tag), _count(root, size_tag)) != expected:
        return None  # a second Key, Prefix or Size in one of them, or one elsewhere
    keys = [found.text or "" for found in found_keys]
    prefixes = [found.text or "" for found in found_prefixes]
    try:
        sizes = [0 if found is None else int(found.text or "") for found in found_sizes]
    except ValueError:
        return None
    return _page_of_root(root, namespace, keys, sizes, prefixes)


def _count(root: ElementTree.Element, tag: str) -> int:
    """How many ``tag`` elements the tree holds, at any depth (a C loop)."""
    return len(list(root.iter(tag)))


def _one_namespace(body: bytes, namespace: str) -> bool:
    """True when every element is in the root's namespace (botocore ignores namespaces; this parser
    matches whole tags): the root's ``xmlns`` is the only declaration, so no other namespace or prefix can
    be bound, and there is no DTD (whose entities could declare one unseen).

    The usual page is read in one scan: when nothing but the XML declaration comes before the first
    ``<ListBucketResult``, that is the root's start tag and no DTD can precede it; then, when the text
    ``xml`` occurs only in the declaration and the root's ``xmlns``, there is no other declaration and no
    ``xml:`` prefix. Any other page takes the three scans that prove the same for every document.
    """
    at = body.find(b"<ListBucketResult")
    head = body[:at]  # all that precedes the first such tag: the declaration, or nothing, on a usual page
    declared = at > 0 and head.startswith(b"<?xml") and head.endswith(b"?>") and head.count(b"<") == 1
    usual = at == 0 or declared
    if usual and body.count(b"xml") == (at > 0) + (1 if namespace else 0):
        return True
    if b"<!DOCTYPE" in body or b"<xml:" in body:
        return False
    return body.count(b"xmlns") == (1 if namespace else 0)


def _decoded(names: list[str]) -> list[str]:
    """``unquote_plus`` of each name holding ``%`` or ``+`` (rule 4), in one call over the names joined by
    newlines when none holds one before or after: an escape cannot span a newline, so that is the same.
    Names whose only escape is ``%2F`` (every entry's ``pub%2F``) are decoded by replacing it."""
    joined = "\n".join(names)
    if "+" not in joined:
        if "%" not in joined:
            return names
        slashes = joined.replace("%2F", "/")  # the one escape of entry keys (pub%2F...): a single C pass
        decoded = slashes.split("\n")
        if "%" not in slashes and len(decoded) == len(names):  # every escape was %2F: unquote_plus gives "/"
            return decoded
    if joined.count("\n") == len(names) - 1:
        decoded = unquote_plus(joined).split("\n")
        if len(decoded) == len(names):
            return decoded
    return [unquote_plus(name) if "%" in name or "+" in name else name for name in names]


def _page_of_root(
    root: ElementTree.Element, namespace: str, keys: list[str], sizes: list[int], prefixes: list[str]
) -> ListingPage | None:
    """The page, from the root's own children and the objects read on the way; ``None`` when unsure."""
    fields: dict[str, str] = {}
    for name in _FIELDS:
        found = root.findall(namespace + name)  # the root's own children, in a C loop
        if len(found) > 1 or (found and len(found[0])):
            return None  # repeated, or not a plain value
        if found:
            fields[name] = found[0].text or ""
    try:
        count = int(fields["KeyCount"]) if "KeyCount" in fields else None
    except ValueError:
        return None
    if fields.get("EncodingType") == "url":
        keys, prefixes = _decoded(keys), _decoded(prefixes)
    return ListingPage(
        keys,
        sizes,
        prefixes,
        fields.get("IsTruncated") == "true",
        fields.get("NextContinuationToken") or None,
        count,
    )
