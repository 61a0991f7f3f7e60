"""The hypothesis strategies the test modules share, in one module.

Four groups, each written independently of ``ckpt`` (the expected outcomes are computed here, never by
asking the code under test):

* configuration documents shaped like spec/config.md, each with its expected outcome;
* entry names and saves, for the property tests of the pure core, aimed at what a bulk, row-decoding
  parser gets wrong;
* cheap fuzz texts for every parser;
* URL-ish text for the proxy rule, and fuzz texts for S3 roots, proxy values, URLs and raw documents.

Configuration documents: :func:`config_cases` draws a *valid* document (every table and key of spec/config.md,
hostile but acceptable strings included) and then applies at most one known mutation: an unknown key in
some table, a required key dropped, a value of the wrong type, or a value of the right type that the spec
refuses. The expected outcome is computed here from the mutation: a ``Config`` built from the document, or
a ``ConfigError`` whose ``key`` is the mutated key's full path (``credentials[1].auth.role``).
:func:`toml_text` writes a document as TOML, so that the property goes through a real file and ``tomllib``.

Names and saves use only the standard library (``base64``) and, for fixed seeds, ``Entry`` and
``format_entry_name``.
"""

from __future__ import annotations

import base64
import datetime
import math
from typing import Any

import attrs
from hypothesis import assume
from hypothesis import strategies as st

from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name

Path = tuple[str | int, ...]

# spec/config.md, written out here independently of src/ckpt/config.py and src/ckpt/creds/config.py.
TOP_KEYS = ("root", "s3", "proxy", "credentials")
S3_STRINGS = ("region", "ca_bundle")
# Seconds in [s3] are finite and at most this many (about 115 days): anything longer cannot be waited for.
MAX_SECONDS = 10_000_000
S3_NUMBERS = ("connect_timeout", "read_timeout", "refresh_seconds", "max_staleness_seconds")
# The bucket settings (spec/config.md §3.1): sse_kms_key_id only beside sse = "aws:kms".
S3_BUCKET_KEYS = ("sse", "sse_kms_key_id", "expected_bucket_owner", "storage_class")
S3_KEYS = ("endpoint_url", *S3_STRINGS, "addressing_style", *S3_NUMBERS, "max_attempts", *S3_BUCKET_KEYS)
PROXY_KEYS = ("http_proxy", "https_proxy", "no_proxy")
ENV_VARS = ("access_key_id_var", "secret_access_key_var", "session_token_var")
SOURCE_KEYS = {
    "env": ("source", *ENV_VARS),
    "file": ("source", "dir", "readable_by_others"),
    "vault": ("source", "address", "namespace", "ca_bundle", "allow_insecure_http", "mount", "path", "fields",
              "auth"),
    "aws-default": ("source",),
}  # fmt: skip
AUTH_KEYS = {
    "kubernetes": ("method", "mount", "role", "jwt_file"),
    "approle": ("method", "mount", "role_id", "role_id_file", "secret_id", "secret_id_file"),
}
FIELD_KEYS = ("access_key_id", "secret_access_key", "session_token")
CHOICES = {
    "addressing_style": ("path", "virtual", "auto"),
    "readable_by_others": ("warn", "refuse"),
    "source": tuple(SOURCE_KEYS),
    "method": tuple(AUTH_KEYS),
}
PROXY_PASSWORD = "Zq9Secret"


@attrs.frozen
class ConfigCase:
    """A document, what was done to it, and the keys a ``ConfigError`` may name (empty: it is valid).

    ``keys`` holds more than one path only where spec/config.md leaves the choice open (which of
    ``role_id`` and
    ``role_id_file`` a missing or doubled pair names; ``credentials`` or ``credentials[i]`` for an element
    that is not a table). ``proxy_error`` marks a refused proxy URL: a ``ProxyConfigError`` naming the key.
    """

    document: dict[str, Any]
    mutation: str
    keys: frozenset[str] = frozenset()
    proxy_error: bool = False


def key_path(path: Path) -> str:
    """``("credentials", 1, "auth", "role")`` -> ``"credentials[1].auth.role"``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


# Hostile but acceptable strings: any non-empty text (controls, NUL, other scripts, TOML's own syntax).
_TEXT = st.text(min_size=1, max_size=16)
_POSITIVE = st.one_of(st.integers(1, MAX_SECONDS), st.floats(min_value=1e-6, max_value=MAX_SECONDS))
# Endpoints an S3 client can use: http(s), a host, an optional port and path.
_ENDPOINTS = st.sampled_from(
    ["https://objects.example.internal:9000", "http://127.0.0.1:9000", "https://s3.example", "http://h/gw/s3"]
)
# Endpoints refused at load: no usable scheme, no host, a port out of range, user-info, a query.
_BAD_ENDPOINTS = st.sampled_from(
    [
        "",
        "0",
        "ftp://objects.example",
        "https://",
        "http://h:99999",
        "http://h:0",
        "https://u:p@h",
        "http://h/?q=1",
    ]
)
_VAR_NAMES = _TEXT.filter(lambda t: "=" not in t and "\0" not in t)
_SECRET_PATHS = _TEXT.filter(lambda t: bool(t.strip("/")))
_PROXY_URLS = st.sampled_from(
    ["", "http://proxy.example:3128", f"https://ckpt:{PROXY_PASSWORD}@proxy.example:3129", "http://10.0.0.1"]
)
_NO_PROXY = st.sampled_from(
    ["", ".example.internal,10.0.0.0/8", "*", "localhost, 127.0.0.1", "vault.example"]
)


def _s3() -> st.SearchStrategy[dict[str, Any]]:
    optional: dict[str, st.SearchStrategy[Any]] = dict.fromkeys(S3_STRINGS, _TEXT)
    optional["endpoint_url"] = _ENDPOINTS
    optional |= dict.fromkeys(S3_NUMBERS, _POSITIVE)
    optional |= {
        "addressing_style": st.sampled_from(CHOICES["addressing_style"]),
        "max_attempts": st.integers(1, 50),
        "expected_bucket_owner": st.from_regex(r"[0-9]{12}", fullmatch=True),
        "storage_class": st.sampled_from(["STANDARD", "STANDARD_IA", "GLACIER_IR", "COLD", "tier-2.fast"]),
    }
    encryption = st.sampled_from(
        [{}, {"sse": "AES256"}, {"sse": "aws:kms"}, {"sse": "aws:kms", "sse_kms_key_id": "alias/ckpt"}]
    )
    return st.tuples(st.fixed_dictionaries({}, optional=optional), encryption).map(lambda t: t[0] | t[1])


def _auth() -> st.SearchStrategy[dict[str, Any]]:
    kubernetes = st.fixed_dictionaries(
        {"method": st.just("kubernetes"), "role": _TEXT}, optional={"mount": _SECRET_PATHS, "jwt_file": _TEXT}
    )
    approle = st.tuples(
        st.fixed_dictionaries({"method": st.just("approle")}, optional={"mount": _SECRET_PATHS}),
        st.sampled_from(["role_id", "role_id_file"]),
        st.sampled_from(["secret_id", "secret_id_file"]),
        _TEXT,
        _TEXT,
    ).map(lambda t: {**t[0], t[1]: t[3], t[2]: t[4]})
    return st.one_of(kubernetes, approle)


def _credentials() -> st.SearchStrategy[dict[str, Any]]:
    env = st.fixed_dictionaries({"source": st.just("env")}, optional=dict.fromkeys(ENV_VARS, _VAR_NAMES))
    file = st.fixed_dictionaries(
        {"source": st.just("file"), "dir": _TEXT},
        optional={"readable_by_others": st.sampled_from(CHOICES["readable_by_others"])},
    )
    vault = st.fixed_dictionaries(
        {
            "source": st.just("vault"),
            "address": st.sampled_from(
                ["https://vault.example:8200", "https://10.0.0.2", "http://127.0.0.1:8200"]
            ),
            "path": _SECRET_PATHS,
            "auth": _auth(),
        },
        optional={
            "namespace": _TEXT,
            "ca_bundle": _TEXT,
            "allow_insecure_http": st.booleans(),
            "mount": _SECRET_PATHS,
            "fields": st.fixed_dictionaries({}, optional=dict.fromkeys(FIELD_KEYS, _TEXT)),
        },
    )
    return st.one_of(env, file, vault, st.just({"source": "aws-default"}))


def valid_documents() -> st.SearchStrategy[dict[str, Any]]:
    """Documents spec/config.md accepts: any subset of its tables and keys, values of the right type and
    range."""
    return st.fixed_dictionaries(
        {},
        optional={
            "root": _TEXT,
            "s3": _s3(),
            "proxy": st.fixed_dictionaries(
                {}, optional={"http_proxy": _PROXY_URLS, "https_proxy": _PROXY_URLS, "no_proxy": _NO_PROXY}
            ),
            "credentials": st.lists(_credentials(), max_size=3),
        },
    )


def _tables(document: dict[str, Any]) -> list[tuple[Path, tuple[str, ...]]]:
    """Every table in a valid document with the keys it may hold."""
    tables: list[tuple[Path, tuple[str, ...]]] = [((), TOP_KEYS)]
    if "s3" in document:
        tables.append((("s3",), S3_KEYS))
    if "proxy" in document:
        tables.append((("proxy",), PROXY_KEYS))
    for i, table in enumerate(document.get("credentials", [])):
        tables.append((("credentials", i), SOURCE_KEYS[table["source"]]))
        if "auth" in table:
            tables.append((("credentials", i, "auth"), AUTH_KEYS[table["auth"]["method"]]))
        if "fields" in table:
            tables.append((("credentials", i, "fields"), FIELD_KEYS))
    return tables


def _get(document: Any, path: Path) -> Any:
    for part in path:
        document = document[part]
    return document


def _leaves(document: dict[str, Any]) -> list[Path]:
    """Every key with a scalar value, and every table and array, as a path."""
    found: list[Path] = []

    def walk(value: Any, path: Path) -> None:
        if path:
            found.append(path)
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(inner, (*path, key))
        elif isinstance(value, list):
            for i, inner in enumerate(value):
                walk(inner, (*path, i))

    walk(document, ())
    return found


_ANY_VALUE = st.one_of(
    st.text(max_size=8),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.dates(),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(0, 9), max_size=2),
)


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {str: "str", list: "list", dict: "table"}.get(type(value), "other")


@st.composite
def config_cases(draw: st.DrawFn) -> ConfigCase:
    """A valid document with at most one known mutation, and the outcome spec/config.md gives it."""
    # A copy with no shared tables: a strategy may hand the same table object to two places (st.just), and a
    # mutation of one must not change the other (copy.deepcopy would keep them shared).
    document = _unshared(draw(valid_documents()))
    mutation = draw(st.sampled_from(["none", "unknown", "missing", "wrong-type", "refused-value"]))
    if mutation == "unknown":
        path, allowed = draw(st.sampled_from(_tables(document)))
        name = draw(
            st.one_of(st.text(max_size=10), st.sampled_from(["Root", "S3", "endpoint-url", "roles", ""]))
        )
        if name not in allowed:
            _get(document, path)[name] = draw(_ANY_VALUE)
            return ConfigCase(document, f"unknown key {name!r} in {key_path(path) or 'the top level'}",
                              frozenset({key_path((*path, name))}))  # fmt: skip
    elif mutation == "missing":
        required = _required(document)
        if required:
            path, keys = draw(st.sampled_from(required))
            del _get(document, path[:-1])[path[-1]]
            return ConfigCase(document, f"dropped {key_path(path)}", keys)
    elif mutation == "wrong-type":
        path = draw(st.sampled_from(_leaves(document))) if _leaves(document) else None
        if path is not None:
            current = _get(document, path)
            wrong = draw(_ANY_VALUE.filter(lambda v: _kind(v) != _kind(current)))
            _get(document, path[:-1])[path[-1]] = wrong
            keys = {key_path(path)}
            if path[0] == "credentials" and len(path) == 2:  # an element of the array that is not a table
                keys.add("credentials")
            return ConfigCase(document, f"{key_path(path)} = {wrong!r} (was {current!r})", frozenset(keys))
    elif mutation == "refused-value":
        refused = _refusable(document, draw)
        if refused:
            path, value, keys, proxy_error = draw(st.sampled_from(refused))
            if value is _DELETE:
                del _get(document, path[:-1])[path[-1]]
            else:
                _get(document, path[:-1])[path[-1]] = value
            return ConfigCase(document, f"{key_path(path)} = {value!r}", keys, proxy_error)
    return ConfigCase(document, "none")


_DELETE = object()


def _unshared(value: Any) -> Any:
    """``value`` rebuilt so that no dict or list in it is the same object as another."""
    if isinstance(value, dict):
        return {key: _unshared(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_unshared(item) for item in value]
    return value


def _required(document: dict[str, Any]) -> list[tuple[Path, frozenset[str]]]:
    """The required keys present in a valid document, each with the keys its absence may be named by."""
    found: list[tuple[Path, frozenset[str]]] = []
    for i, table in enumerate(document.get("credentials", [])):
        at: Path = ("credentials", i)
        found.append(((*at, "source"), frozenset({key_path((*at, "source"))})))
        required = {"file": ("dir",), "vault": ("address", "path", "auth")}.get(table["source"], ())
        found += [((*at, key), frozenset({key_path((*at, key))})) for key in required]
        if "auth" in table:
            auth: Path = (*at, "auth")
            found.append(((*auth, "method"), frozenset({key_path((*auth, "method"))})))
            if table["auth"]["method"] == "kubernetes":
                found.append(((*auth, "role"), frozenset({key_path((*auth, "role"))})))
            else:
                for pair in (("role_id", "role_id_file"), ("secret_id", "secret_id_file")):
                    present = next(key for key in pair if key in table["auth"])
                    found.append(((*auth, present), frozenset(key_path((*auth, key)) for key in pair)))
    return found


def _refusable(document: dict[str, Any], draw: st.DrawFn) -> list[tuple[Path, Any, frozenset[str], bool]]:
    """Values of the right type that spec/config.md refuses, at keys present in the document."""
    out: list[tuple[Path, Any, frozenset[str], bool]] = []

    def refuse(path: Path, value: Any, *, proxy_error: bool = False) -> None:
        out.append((path, value, frozenset({key_path(path)}), proxy_error))

    if "root" in document:
        refuse(("root",), "")
    for key in document.get("s3", {}):
        path = ("s3", key)
        if key in S3_STRINGS:
            refuse(path, "")
        elif key == "endpoint_url":
            refuse(path, draw(_BAD_ENDPOINTS))
        elif key in S3_NUMBERS:
            bad = [0, -1, -0.5, -1e9, 0.0, math.nan, math.inf, -math.inf, 1e300, MAX_SECONDS + 1]
            refuse(path, draw(st.sampled_from(bad)))
        elif key == "max_attempts":
            refuse(path, draw(st.sampled_from([0, -3])))
        elif key == "addressing_style":
            refuse(path, draw(_TEXT.filter(lambda t: t not in CHOICES["addressing_style"])))
        elif key == "sse":
            refuse(path, draw(st.sampled_from(["aes256", "AWS:KMS", "aws:kms:dsse", "none"])))
        elif key == "sse_kms_key_id":
            refuse(path, draw(st.sampled_from(["my key", "ключ", "k" * 2049])))
        elif key == "expected_bucket_owner":
            refuse(path, draw(st.sampled_from(["12345678901", "1234567890123", "arn:aws:iam::1:root"])))
        elif key == "storage_class":
            refuse(path, draw(st.sampled_from(["GLACIER", "DEEP_ARCHIVE", "standard", "two words"])))
    for key in ("http_proxy", "https_proxy"):
        if key in document.get("proxy", {}):
            bad = draw(st.sampled_from([f"socks5://u:{PROXY_PASSWORD}@proxy.example:1080",
                                        f"http://u:{PROXY_PASSWORD}@proxy.example:99999"]))  # fmt: skip
            refuse(("proxy", key), bad, proxy_error=True)
    for i, table in enumerate(document.get("credentials", [])):
        at: Path = ("credentials", i)
        refuse((*at, "source"), draw(_TEXT.filter(lambda t: t not in CHOICES["source"])))
        for key in table:
            if key in ENV_VARS:
                refuse((*at, key), draw(st.sampled_from(["", "A=B", "KEY\0"])))
            elif key in ("dir", "namespace", "ca_bundle"):
                refuse((*at, key), "")
            elif key == "readable_by_others":
                refuse((*at, key), draw(_TEXT.filter(lambda t: t not in CHOICES["readable_by_others"])))
            elif key in ("path", "mount"):
                refuse((*at, key), draw(st.sampled_from(["/", "///"])))
        if table["source"] == "vault" and table.get("allow_insecure_http") is not True:
            refuse((*at, "address"), draw(st.sampled_from(["http://vault.example:8200", "http://10.0.0.2"])))
        if "auth" in table:
            auth: Path = (*at, "auth")
            refuse((*auth, "method"), draw(_TEXT.filter(lambda t: t not in CHOICES["method"])))
            if table["auth"]["method"] == "approle":
                for pair in (("role_id", "role_id_file"), ("secret_id", "secret_id_file")):
                    missing = next(key for key in pair if key not in table["auth"])
                    keys = frozenset(key_path((*auth, key)) for key in pair)
                    out.append(((*auth, missing), "also-set", keys, False))
    return out


def expected_config_fields(document: dict[str, Any]) -> dict[str, Any]:
    """What a valid document's ``Config`` holds: numbers of [s3] as floats (but ``max_attempts``)."""
    s3 = {key: (float(v) if key in S3_NUMBERS else v) for key, v in document.get("s3", {}).items()}
    return {
        "root": document.get("root"),
        "s3": s3,
        "proxy": document.get("proxy"),
        "credentials": tuple(document.get("credentials", [])),
    }


def toml_text(document: dict[str, Any]) -> str:
    """The document as TOML: top-level keys one per line, everything nested as inline tables and arrays."""
    return "".join(f"{_toml_key(key)} = {_toml_value(value)}\n" for key, value in document.items())


def _toml_key(key: str) -> str:
    return _toml_string(key)


def _toml_string(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(c if ord(c) >= 0x20 and c != "\x7f" else f"\\u{ord(c):04X}" for c in escaped) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    assert isinstance(value, dict), value
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"


# ----------------------------------------------------------------------------------------------------------
# Constants and helpers for names and saves.

MAX_U64 = 2**64 - 1
MAX_SAVE_BYTES = 133
ASCII_CONTROLS = "".join(chr(c) for c in range(0x20)) + "\x7f"
B32_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def b32(raw: bytes) -> str:
    """Unpadded upper-case RFC 4648 base32 from the standard library."""
    return base64.b32encode(raw).decode("ascii").rstrip("=")


def oracle_save_ok(save: str) -> bool:
    """spec/layout.md, spelled out naively (no ckpt code): the saves the strategies build as valid."""
    try:
        save.encode("utf-8")
    except UnicodeEncodeError:
        return False
    elements = save.split("/")
    return (
        save != ""
        and not any(ch in ASCII_CONTROLS for ch in save)
        and all(e not in {"", ".", ".."} for e in elements)
        and elements[0] not in {"pub", "pins"}
        and not elements[0].startswith(".ckpt-")
    )


# ----------------------------------------------------------------------------------------------------------
# Entry names and saves.

u64s = st.one_of(
    st.integers(0, MAX_U64),
    st.sampled_from([0, 1, 9, 10, 2**32, 2**63, 10**19 - 1, 10**19, MAX_U64 - 1, MAX_U64]),
)
# Few distinct values, so that listings tie on epoch-step often.
tied_u64s = st.sampled_from([0, 1, 2, MAX_U64])

element_chars = st.one_of(
    st.sampled_from("ab.-~_ 0é日😀\u0085\u2028\ufeff"),
    st.characters(codec="utf-8", exclude_characters="/" + ASCII_CONTROLS),
)
# The first elements no save may have (pub, pins) and their neighbours, which a sloppy check confuses.
_NEXT_TO_THE_RESERVED = ("pub", "pubx", "Pub", "pub.d", "pins", "pinsx", "Pins", "pins.d")
_NEXT_TO_THE_RESERVED += (".ckpt-", ".ckpt-prune-0", ".ckpt", ".ckptx", ".Ckpt-x", "x.ckpt-")
elements = st.one_of(
    st.text(element_chars, min_size=1, max_size=10).filter(lambda e: e not in {".", ".."}),
    # Elements next to a rule: valid, but a sloppy check refuses them (or accepts their neighbours).
    st.sampled_from([*_NEXT_TO_THE_RESERVED, "exec", "...", ".a", "a.", "-", "ck-1", "ck-10", "~"]),
)


@st.composite
def short_saves(draw: st.DrawFn) -> str:
    """A valid save of at most 133 bytes: one to six elements, trimmed to fit."""
    parts = draw(st.lists(elements, min_size=1, max_size=6))
    if parts[0] in {"pub", "pins"}:
        parts[0] += "x"
    if parts[0].startswith(".ckpt-"):
        parts[0] = "x" + parts[0]
    while len(parts) > 1 and len("/".join(parts).encode("utf-8")) > MAX_SAVE_BYTES:
        parts.pop()
    save = "/".join(parts)
    while len(save.encode("utf-8")) > MAX_SAVE_BYTES:
        save = save[:-1]
    assume(oracle_save_ok(save))
    return save


# Exactly 133 bytes: a drawn start (possibly multi-byte) padded with ASCII up to the limit.
longest_saves = (
    short_saves()
    .map(lambda s: s[:30])
    .filter(oracle_save_ok)
    .map(lambda s: s + "a" * (MAX_SAVE_BYTES - len(s.encode("utf-8"))))
)
valid_saves = st.one_of(short_saves(), longest_saves)
entries = st.builds(Entry, u64s, u64s, valid_saves)
tied_entries = st.builds(Entry, tied_u64s, tied_u64s, valid_saves)
valid_names = entries.map(format_entry_name)
tied_names = tied_entries.map(format_entry_name)

# Characters a mutation inserts: the name's own alphabet, near misses, and anything at all.
mutation_chars = st.one_of(
    st.sampled_from(B32_ALPHABET + "0123456789" + "0189=-_.+/ \n\r\t\x00abcmz" + "\u0660\uff10\u00b2é"),
    st.characters(),
)


@st.composite
def mutated_names(draw: st.DrawFn, names: st.SearchStrategy[str] = valid_names) -> str:
    """A valid name with one character replaced, inserted or deleted."""
    name = draw(names)
    kind = draw(st.sampled_from(["replace", "insert", "delete"]))
    if kind == "insert":
        at = draw(st.integers(0, len(name)))
        return name[:at] + draw(mutation_chars) + name[at:]
    at = draw(st.integers(0, len(name) - 1))
    if kind == "replace":
        return name[:at] + draw(mutation_chars) + name[at + 1 :]
    return name[:at] + name[at + 1 :]


# Save bytes built from tokens that sit on every rule of spec/layout.md and every byte a bulk decoder might
# use as a
# delimiter (NUL, \x01, '\n', '-'): control bytes, '.', '..', 'pub', stray '/', broken and overlong UTF-8, a
# surrogate, C1 controls. Concatenations of a few tokens are valid often enough and wrong in every way.
_PLAIN_TOKENS = (b"a", b"b", b"ck-1", b"pub", b"pubx", b"pins", b"/", b".", b"..", b"-", b"~", b" ", b"\\")
_CONTROL_TOKENS = (b"\x00", b"\x01", b"\n", b"\r", b"\t", b"\x1f", b"\x7f")
_UTF8_TOKENS = (b"\xc3\xa9", b"\xe6\x97\xa5", b"\xf0\x9f\x98\x80", b"\xc2\x85", b"\xe2\x80\xa8")
_BROKEN_UTF8_TOKENS = (
    b"\x80",
    b"\xc3",
    b"\xe6\x97",
    b"\xf0\x9f",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\xf4\x90\x80\x80",
    b"\xff",
)
SAVE_TOKENS = _PLAIN_TOKENS + _CONTROL_TOKENS + _UTF8_TOKENS + _BROKEN_UTF8_TOKENS
token_saves = st.lists(st.sampled_from(SAVE_TOKENS), max_size=8).map(b"".join)
# Around the 133-byte limit: 213 base32 characters fit in a name, 214 is an impossible length, 215 too long.
edge_length_saves = st.builds(
    lambda body, tail: (body * 140)[: 133 - len(tail)] + tail,
    st.sampled_from([b"a", b"a/", b"\xc3\xa9"]),
    st.lists(st.sampled_from(SAVE_TOKENS), max_size=3).map(b"".join),
).flatmap(lambda raw: st.sampled_from([raw, raw + b"b", raw + b"bc", raw[:-1]]))
edgy_save_bytes = st.one_of(token_saves, token_saves, st.binary(max_size=20), edge_length_saves)

# 20-character number fields: mostly the tied values, else near and past 2**64 - 1, or any 20 digits.
number_fields = st.one_of(
    tied_u64s.map("{:020d}".format),
    tied_u64s.map("{:020d}".format),
    st.integers(MAX_U64 - 3, MAX_U64 + 3).map("{:020d}".format),
    st.from_regex(r"[0-9]{20}", fullmatch=True),
)
# Names with well-formed (or nearly) numbers and base32 of edgy bytes: the decoded save decides.
edgy_names = st.builds(lambda e, s, raw: f"{e}-{s}-{b32(raw)}", number_fields, number_fields, edgy_save_bytes)


@st.composite
def tail_edited_names(draw: st.DrawFn) -> str:
    """A valid name (some at the 255-byte limit) whose last base32 character is replaced, doubled or dropped.

    Replacing it exercises the unused-bits rule for every tail length; adding or dropping one character makes
    impossible lengths, including 214 characters, between the longest name and a name that is too long.
    """
    name = draw(
        st.one_of(tied_names, st.builds(Entry, tied_u64s, tied_u64s, longest_saves).map(format_entry_name))
    )
    char = draw(st.sampled_from(TAIL_CHARS))
    edit = draw(st.sampled_from(["replace", "append", "drop"]))
    return {"replace": name[:-1] + char, "append": name + char, "drop": name[:-1]}[edit]


# Valid names with exactly one defect, so that nothing else gets them refused: the property tests' sharpest
# probe of the bulk path, which checks each rule with a different trick.
CONTROLS = st.sampled_from([chr(c) for c in range(0x20)] + ["\x7f"])
# What a row-based decoder might take for the end of a save: NUL, fill bytes, newline.
ROW_ENDS = st.sampled_from(["\x00\n", "\x00\x01\n", "\x00\x01\x01\n", "\n", "\x00"])
BROKEN_UTF8 = [
    *(b"\x80", b"\xbf", b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98", b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf"),
    *(b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff"),
]
# What replaces a name's last character: its alphabet, and characters that some decoder reads as a digit.
TAIL_CHARS = B32_ALPHABET + "018=abcdefgmqvz" + "\u0660\u0664\uff10\uff14\u00b2\u0968"


_SAVE_DEFECTS = ("pub", "pub-inside", "pins", "pins-inside", "dot", "empty-element", "leading", "trailing")
_SAVE_DEFECTS += ("control", "utf8", "reserved")


@st.composite
def defective_saves(draw: st.DrawFn) -> bytes:
    """The UTF-8 bytes of a valid save with one defect that makes it invalid (spec/layout.md)."""
    save = draw(short_saves())
    parts = save.split("/")
    at = draw(st.integers(0, len(parts)))
    kind = draw(st.sampled_from(_SAVE_DEFECTS))
    if kind in {"pub", "pins"}:
        return kind.encode()
    if kind in {"pub-inside", "pins-inside"}:
        return f"{kind.partition('-')[0]}/{save}".encode()
    if kind == "reserved":
        return f".ckpt-{save}".encode()
    if kind in {"dot", "empty-element"}:
        element = draw(st.sampled_from([".", ".."])) if kind == "dot" else ""
        return "/".join([*parts[:at], element, *parts[at:]]).encode()
    if kind == "leading":
        return f"/{save}".encode()
    if kind == "trailing":
        return f"{save}/".encode()
    raw = save.encode()
    cut = draw(st.integers(0, len(raw)))
    if kind == "control":
        return raw[:cut] + draw(st.one_of(CONTROLS, ROW_ENDS)).encode() + raw[cut:]
    return raw[:cut] + draw(st.sampled_from(BROKEN_UTF8)) + raw[cut:]


@st.composite
def one_defect_names(draw: st.DrawFn) -> str:
    """A valid name with exactly one thing wrong: a number, the save, the base32 tail, or the length."""
    entry = draw(tied_entries)
    epoch, step = f"{entry.epoch:020d}", f"{entry.step:020d}"
    part = b32(entry.save.encode())
    kind = draw(st.sampled_from(["number", "save", "tail", "zero-bits", "length"]))
    if kind == "number":
        wrong = draw(
            st.one_of(
                st.integers(MAX_U64 + 1, MAX_U64 + 20).map("{:020d}".format),
                st.integers(MAX_U64 + 1, 10**20 - 1).map("{:020d}".format),
                st.sampled_from(["18446744073709551625", "18446744073709551706", "19000000000000000000"]),
            )
        )
        epoch, step = draw(st.sampled_from([(wrong, step), (epoch, wrong)]))
    elif kind == "save":
        part = b32(draw(defective_saves()))
    elif kind == "tail":
        part = part[:-1] + draw(st.sampled_from(TAIL_CHARS))
    elif kind == "zero-bits":
        # Zero characters after the tail: the bits stay zero, only the length (1, 3 or 6 mod 8, or too long)
        # or the canonical form can refuse it.
        part += "A" * draw(st.integers(1, 7))
    else:
        longer = entry.save + "/" + "a" * MAX_SAVE_BYTES
        size = draw(st.integers(MAX_SAVE_BYTES + 1, MAX_SAVE_BYTES + 4))
        part = b32(longer.encode()[:size])
    return f"{epoch}-{step}-{part}"


# Separators and newlines in the wrong place: one name must never pass for two, or two for one.
newline_names = st.one_of(
    st.builds(
        lambda a, sep, b: f"{a}{sep}{b}",
        tied_names,
        st.sampled_from(["\n", "-\n", "\n-", "-", ""]),
        tied_names,
    ),
    st.builds(lambda n, fix: n + fix, tied_names, st.sampled_from(["\n", "-", "-\n", "\r\n", "\x00"])),
    st.builds(lambda fix, n: fix + n, st.sampled_from(["\n", "-", "-\n", "\n-"]), tied_names),
    st.builds(lambda n, at: n[:at] + "\n" + n[at:], tied_names, st.integers(0, 60)),
    st.sampled_from(["", "-", "\n", "-\n", "--", "\n\n"]),
)
any_names = st.one_of(
    valid_names,
    tied_names,
    one_defect_names(),
    mutated_names(tied_names),
    edgy_names,
    tail_edited_names(),
    newline_names,
    st.text(max_size=50),
)


@st.composite
def mixed_listings(draw: st.DrawFn) -> list[str]:
    """Valid names (many tied on epoch-step) with up to two names of any kind inserted anywhere."""
    names = draw(st.lists(st.one_of(tied_names, valid_names), max_size=30))
    for name in draw(st.lists(any_names, max_size=2)):
        names.insert(draw(st.integers(0, len(names))), name)
    return names


# Saves and folders drawn from a small tree, so that overlaps and nesting are frequent.
tree_paths = st.lists(
    st.sampled_from(["exec", "a", "b", "ck-1", "ck-10", "x", "é"]), min_size=1, max_size=4
).map("/".join)
tree_entries = st.builds(Entry, st.integers(0, 3), st.integers(0, 3), tree_paths)


# ----------------------------------------------------------------------------------------------------------
# Fuzz texts for every parser.

# The fuzz strategies are cheap on purpose: at 10,000 examples hypothesis' own cost per example dominates,
# so the near-valid names are single edits of a fixed set of names rather than freshly drawn entries.
_FUZZ_SEEDS = tuple(
    format_entry_name(Entry(epoch, step, save))
    for epoch, step, save in [
        (0, 0, "a"),
        (1, 2, "ab"),
        (MAX_U64, MAX_U64, "abc"),
        (2, 100, "exec/2.4102.0/checkpoint-100"),
        (9, 10**19, "exec/日本/é/😀"),
        (3, 4, "a" * MAX_SAVE_BYTES),
        (5, 6, "pubx/\u0085/~"),
    ]
)
_FUZZ_CHARS = B32_ALPHABET + "0123456789" + "018=-_./ \n\r\x00\x7fabmé\u0660\uff10\u00b2日"
near_names = st.builds(
    lambda name, at, char, edit: {
        "replace": name[:at] + char + name[at + 1 :],
        "insert": name[:at] + char + name[at:],
        "delete": name[:at] + name[at + 1 :],
    }[edit],
    st.sampled_from(_FUZZ_SEEDS),
    st.integers(0, 256),
    st.sampled_from(_FUZZ_CHARS),
    st.sampled_from(["replace", "insert", "delete"]),
)
fuzz_text = st.one_of(
    st.text(),
    st.text(st.sampled_from(_FUZZ_CHARS), max_size=60),
    st.text(st.sampled_from("0123456789"), min_size=1, max_size=25),
    st.text(st.sampled_from("ab./-\x00\x1f\x7f é日pu"), max_size=12),
    st.sampled_from(_FUZZ_SEEDS),
    near_names,
)


# ----------------------------------------------------------------------------------------------------------
# URL-ish text for the proxy rule.

URL_PIECES = st.sampled_from(
    [
        *"abcxyz019.-_:/?#[]@%*, \t\n\\",
        *"\u00e4\u793a\uff21\u00af\uff0f",  # a-umlaut, CJK, fullwidth A, macron, fullwidth solidus
        *["http://", "https://", "HTTP://", "[::1]", "[fe80::1%25", "localhost", "127.0.0.1", "::ffff:"],
        *["xn--", "%25", ":443", "*.", "/8", "2001:db8::"],
    ]
)
FUZZY_TEXT = st.one_of(st.text(), st.lists(URL_PIECES, max_size=12).map("".join))
FUZZY_URLS = st.one_of(
    FUZZY_TEXT,
    st.tuples(st.sampled_from(["http://", "https://", "HTTPS://", "ftp://", ""]), FUZZY_TEXT).map("".join),
)


# ----------------------------------------------------------------------------------------------------------
# Fuzz texts for S3 roots, proxy values, target URLs and configuration documents.

# Text biased towards the characters these grammars care about, plus anything at all.
FUZZ_SPECIAL = st.sampled_from([*"/:@?#[]%.-_*,= \t\n\x00\x7fAaZz09", "..", "//", "s3://", "http://", "::"])
FUZZ_TEXT = st.one_of(
    st.text(max_size=80),
    st.lists(st.one_of(FUZZ_SPECIAL, st.text(max_size=6)), max_size=20).map("".join),
)
FUZZ_HOSTS = st.one_of(
    st.from_regex(r"[a-z0-9][a-z0-9.-]{1,20}[a-z0-9]", fullmatch=True),
    st.sampled_from(["127.0.0.1", "[::1]", "10.1.2.3", "[2001:db8::1]", "localhost", "bücher.example"]),
    FUZZ_TEXT,
)


def fuzz_s3_roots() -> st.SearchStrategy[str]:
    return st.one_of(
        FUZZ_TEXT.map(lambda t: "s3://" + t),
        st.tuples(FUZZ_HOSTS, st.lists(FUZZ_TEXT, max_size=4)).map(
            lambda t: "s3://" + "/".join([t[0], *t[1]])
        ),
        FUZZ_TEXT,
    )


def fuzz_proxy_values() -> st.SearchStrategy[str]:
    return st.one_of(
        FUZZ_TEXT,
        st.tuples(
            st.sampled_from(["", "http://", "https://", "socks5://", "HTTP://", "ftp://"]),
            st.sampled_from(["", "user:p%40ss@", "u@", ":Zq9Secret@"]),
            FUZZ_HOSTS,
            st.sampled_from(["", ":3128", ":0", ":65536", ":x", "/path", "?q", "#f"]),
        ).map("".join),
    )


def fuzz_urls() -> st.SearchStrategy[str]:
    return st.one_of(
        FUZZ_TEXT,
        st.tuples(
            st.sampled_from(["http://", "https://", "HTTPS://", "ftp://", ""]),
            FUZZ_HOSTS,
            st.sampled_from(["", ":80", ":443", ":9000", ":99999", "/b/k", "?x=1"]),
        ).map("".join),
    )


FUZZ_TOML_SCALARS = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), FUZZ_TEXT, st.just([])
)
FUZZ_CONFIG_KEYS = st.one_of(
    st.sampled_from(
        ["root", "s3", "proxy", "credentials", "endpoint_url", "region", "addressing_style", "ca_bundle",
         "connect_timeout", "read_timeout", "max_attempts", "refresh_seconds", "max_staleness_seconds",
         "http_proxy", "https_proxy", "no_proxy", "source", "dir", "readable_by_others", "address", "path",
         "mount", "namespace", "auth", "method", "role", "jwt_file", "role_id", "secret_id", "fields"]
    ),
    st.text(max_size=8),
)  # fmt: skip
FUZZ_CONFIG_DOCUMENTS = st.recursive(
    st.dictionaries(FUZZ_CONFIG_KEYS, FUZZ_TOML_SCALARS, max_size=5),
    lambda children: st.dictionaries(
        FUZZ_CONFIG_KEYS, st.one_of(FUZZ_TOML_SCALARS, children, st.lists(children, max_size=3)), max_size=5
    ),
    max_leaves=8,
)
