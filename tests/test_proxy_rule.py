"""The proxy rule (spec/proxy.md): the language-neutral vectors, focused behaviour, and properties.

``tests/vectors/proxy.json`` is the conformance suite other ports run too (format in
``docs/vectors-proxy.md``); the classes below pin down what the vectors cannot express: redaction in
``repr``, canonical forms, the error types, and invariants over arbitrary input.
"""

from __future__ import annotations

import ast
import ipaddress
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.domain import proxy as proxy_module
from ckpt.domain.errors import ConfigError, InvalidError, InvalidTypeError, ProxyConfigError
from ckpt.domain.proxy import ProxyRule, is_cgi, parse_proxy_url, redact_url
from support.strategies import FUZZY_TEXT, FUZZY_URLS

VECTORS_PATH = Path(__file__).parent / "vectors" / "proxy.json"
VECTORS: list[dict[str, Any]] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))["cases"]
ERROR_KINDS: dict[str, type[Exception]] = {"ProxyConfigError": ProxyConfigError, "ConfigError": ConfigError}
CASE_KEYS = {"id", "environment", "rule", "config", "url", "proxy", "error", "note"}
RULE_KEYS = {"http_proxy", "https_proxy", "no_proxy", "cgi"}


def build_rule(case: Mapping[str, Any]) -> ProxyRule:
    """Build the rule a vector describes: a ``config`` table, else a ``rule``, else the ``environment``."""
    environment: dict[str, str] = case.get("environment", {})
    if "config" in case:
        return ProxyRule.from_config(case["config"], cgi=is_cgi(environment))
    if "rule" in case:
        return ProxyRule(**case["rule"])
    return ProxyRule.from_environment(environment)


class TestVectors:
    """Every case in ``tests/vectors/proxy.json`` holds."""

    @pytest.mark.parametrize("case", VECTORS, ids=[case["id"] for case in VECTORS])
    def test_case(self, case: dict[str, Any]) -> None:
        """The rule built from the case gives the expected proxy, or fails at the expected stage."""
        expected_error = case.get("error")
        if expected_error is None:
            assert build_rule(case).proxy_for(case["url"]) == case["proxy"]
            return
        kind = ERROR_KINDS[expected_error["kind"]]
        if expected_error["stage"] == "construct":
            with pytest.raises(kind) as caught:
                build_rule(case)
        else:
            rule = build_rule(case)
            with pytest.raises(kind) as caught:
                rule.proxy_for(case["url"])
        assert type(caught.value) is kind
        message = str(caught.value)
        for fragment in expected_error.get("message_contains", []):
            assert fragment in message
        for fragment in expected_error.get("message_excludes", []):
            assert fragment not in message
        if "key" in expected_error:
            assert isinstance(caught.value, ConfigError)
            assert caught.value.key == expected_error["key"]


class TestVectorFile:
    """The vector file itself is well formed, so that ports can rely on its shape."""

    def test_there_are_at_least_sixty_cases_with_unique_ids(self) -> None:
        """The suite has at least 60 cases and no two share an id."""
        ids = [case["id"] for case in VECTORS]
        assert len(ids) >= 60
        assert len(set(ids)) == len(ids)

    @pytest.mark.parametrize("case", VECTORS, ids=[case["id"] for case in VECTORS])
    def test_case_shape(self, case: dict[str, Any]) -> None:
        """Each case uses known keys, one source, and exactly one of ``proxy`` and ``error``."""
        assert set(case) <= CASE_KEYS
        assert ("proxy" in case) != ("error" in case)
        assert not ("rule" in case and ("config" in case or "environment" in case))
        assert set(case.get("rule", {})) <= RULE_KEYS
        assert all(isinstance(value, str) for value in case.get("environment", {}).values())
        needs_url = "proxy" in case or case["error"]["stage"] == "proxy_for"
        assert ("url" in case) == needs_url
        if "error" in case:
            assert case["error"]["kind"] in ERROR_KINDS
            assert case["error"]["stage"] in {"construct", "proxy_for"}


class TestParseProxyUrl:
    """``parse_proxy_url`` checks a proxy value and returns its canonical form."""

    def test_a_value_without_scheme_means_http(self) -> None:
        """``host:port`` becomes ``http://host:port``."""
        assert parse_proxy_url("proxy.example:3128") == "http://proxy.example:3128"

    def test_canonical_form_lower_cases_scheme_and_host_but_not_user_info(self) -> None:
        """Scheme and host are lower-cased; user-info keeps its case and its percent-escapes."""
        value = "HTTPS://Alice:S%40cret@Proxy.Example:443/"
        assert parse_proxy_url(value) == "https://Alice:S%40cret@proxy.example:443"

    def test_non_ascii_host_is_given_in_idna_form(self) -> None:
        """A Unicode proxy host becomes its ``xn--`` form."""
        assert parse_proxy_url("http://Bücher.example:3128") == "http://xn--bcher-kva.example:3128"

    def test_ipv6_host_is_compressed_and_lower_cased(self) -> None:
        """An IPv6 proxy address is written in its compressed form."""
        assert parse_proxy_url("http://[2001:DB8:0:0::1]:3128") == "http://[2001:db8::1]:3128"

    def test_the_error_names_its_source_and_redacts_the_password(self) -> None:
        """The message names the variable or key and shows the value with ``user:***@``."""
        with pytest.raises(ProxyConfigError) as caught:
            parse_proxy_url("socks5://bob:hunter2@proxy.example:1080", source="HTTPS_PROXY")
        message = str(caught.value)
        assert message.startswith("HTTPS_PROXY value 'socks5://bob:***@proxy.example:1080'")
        assert "hunter2" not in message

    def test_an_empty_value_is_refused(self) -> None:
        """The parser itself refuses ``""``; only the rule's constructors treat it as unset."""
        with pytest.raises(ProxyConfigError, match="empty"):
            parse_proxy_url("")

    def test_a_backslash_is_refused(self) -> None:
        """urllib3 would end the authority at a backslash, so a value with one is ambiguous."""
        with pytest.raises(ProxyConfigError, match="backslash"):
            parse_proxy_url("http://user\\@proxy.example:3128")


class TestRedactUrl:
    """``redact_url`` hides the secret part of user-info, in well-formed and malformed values alike."""

    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("http://alice:s3cr3t@proxy:3128", "http://alice:***@proxy:3128"),
            ("http://token@proxy:3128", "http://***@proxy:3128"),
            ("alice:s3cr3t@proxy:3128", "alice:***@proxy:3128"),
            ("http://alice:p@ss@proxy", "http://alice:***@proxy"),
            ("http://alice:pa/ss@proxy", "http://alice:***@proxy"),
            ("alice:p://w@proxy", "alice:***@proxy"),
            ("http://proxy:3128", "http://proxy:3128"),
            ("", ""),
        ],
    )
    def test_redaction(self, url: str, expected: str) -> None:
        """Each example redacts to the expected text."""
        assert redact_url(url) == expected

    @given(
        user=st.text(alphabet=st.characters(blacklist_characters=":@/", blacklist_categories=["Cs"])),
        password=st.text(min_size=1, alphabet=st.characters(blacklist_categories=["Cs"])),
        port=st.integers(min_value=1, max_value=65535),
    )
    def test_the_password_never_survives(self, user: str, password: str, port: int) -> None:
        """For any user and password, the redacted URL is exactly ``user:***@host:port``."""
        url = f"http://{user}:{password}@proxy.example:{port}"
        assert redact_url(url) == f"http://{user}:***@proxy.example:{port}"


class TestProxyRuleValue:
    """A ``ProxyRule`` is a frozen value: canonical on construction, redacted in ``repr``."""

    def test_repr_redacts_proxy_passwords(self) -> None:
        """``repr`` shows ``user:***@`` and never the password."""
        rule = ProxyRule(
            http_proxy="http://alice:s3cr3t@proxy:3128", https_proxy="https://bob:pw2@proxy:3129"
        )
        text = repr(rule)
        assert "alice:***@proxy:3128" in text
        assert "bob:***@proxy:3129" in text
        assert "s3cr3t" not in text
        assert "pw2" not in text

    def test_values_are_canonical_after_construction(self) -> None:
        """The fields hold the canonical proxy URLs, and equal rules compare and hash equal."""
        first = ProxyRule(http_proxy="Proxy:3128", https_proxy="")
        second = ProxyRule(http_proxy="http://proxy:3128/")
        assert (first.http_proxy, first.https_proxy) == ("http://proxy:3128", None)
        assert first == second
        assert hash(first) == hash(second)

    def test_the_rule_is_frozen(self) -> None:
        """Assigning a field raises ``FrozenInstanceError``."""
        rule = ProxyRule()
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            rule.http_proxy = "http://other:1"  # type: ignore[misc]

    def test_empty_no_proxy_is_unset(self) -> None:
        """An empty ``no_proxy`` is stored as ``None``."""
        assert ProxyRule(no_proxy="").no_proxy is None

    def test_malformed_no_proxy_entries_are_reported_not_raised(self) -> None:
        """Entries that can never match are listed, as written, in ``ignored_no_proxy_entries``."""
        rule = ProxyRule(no_proxy="example.com, :443, https://x.example, [2001:db8::1], 10.0.0.0/8, *:80")
        assert rule.ignored_no_proxy_entries == (":443", "https://x.example", "[2001:db8::1]", "*:80")

    def test_an_entry_with_an_empty_port_is_not_ignored(self) -> None:
        """``host:`` is a valid entry (any port, as in Go), so it is not reported as malformed."""
        rule = ProxyRule(no_proxy="example.com:, 1.2.3.4:, [2001:db8::1]:, :")
        assert rule.ignored_no_proxy_entries == (":",)

    def test_cgi_must_be_a_bool(self) -> None:
        """A non-bool ``cgi`` (such as the raw ``REQUEST_METHOD`` string) is refused."""
        with pytest.raises(TypeError):
            ProxyRule(cgi="GET")  # type: ignore[arg-type]

    def test_proxy_config_error_is_an_invalid_error_and_a_value_error(self) -> None:
        """Callers can catch the rule's errors as ``InvalidError`` (exit 2) or as ``ValueError``."""
        with pytest.raises(InvalidError):
            ProxyRule(http_proxy="socks5://proxy:1080")
        with pytest.raises(ValueError, match="socks5"):
            ProxyRule(http_proxy="socks5://proxy:1080")


class TestFromEnvironment:
    """``ProxyRule.from_environment`` reads the proxy variables from the mapping it is given."""

    def test_reads_the_given_mapping(self) -> None:
        """All four inputs come from the mapping: both proxies, NO_PROXY and REQUEST_METHOD."""
        rule = ProxyRule.from_environment(
            {"http_proxy": "p1:1", "HTTPS_PROXY": "p2:2", "no_proxy": ".internal", "REQUEST_METHOD": "GET"}
        )
        assert rule == ProxyRule(
            http_proxy="http://p1:1", https_proxy="http://p2:2", no_proxy=".internal", cgi=True
        )

    @pytest.mark.parametrize(
        ("environ", "names"),
        [
            (None, "proxy environment"),
            ("HTTP_PROXY=p:1", "proxy environment"),
            ({"HTTP_PROXY": 8080}, "HTTP_PROXY"),
            ({"no_proxy": [".internal"]}, "no_proxy"),
            ({"REQUEST_METHOD": b"GET"}, "REQUEST_METHOD"),
        ],
    )
    def test_a_wrong_type_is_an_invalid_type_error(self, environ: object, names: str) -> None:
        """Not a mapping of strings: ``InvalidTypeError`` naming the input, never ``AttributeError``."""
        with pytest.raises(InvalidTypeError, match=names):
            ProxyRule.from_environment(environ)  # type: ignore[arg-type]

    def test_is_cgi_needs_a_non_empty_request_method(self) -> None:
        """``REQUEST_METHOD`` unset or empty is not CGI; any non-empty value is."""
        assert (is_cgi({}), is_cgi({"REQUEST_METHOD": ""}), is_cgi({"REQUEST_METHOD": "HEAD"})) == (
            False,
            False,
            True,
        )


class TestFromConfig:
    """``ProxyRule.from_config`` reads the ``[proxy]`` table and names offending keys."""

    def test_the_table_alone_decides(self) -> None:
        """The table's values make the rule; the CGI flag is passed in."""
        rule = ProxyRule.from_config({"https_proxy": "proxy:3128", "no_proxy": "10.0.0.0/8"}, cgi=False)
        assert rule == ProxyRule(https_proxy="http://proxy:3128", no_proxy="10.0.0.0/8")

    def test_a_table_that_is_not_a_table_names_the_key_proxy(self) -> None:
        """``proxy = "..."`` instead of a table raises ``ConfigError`` with ``key == "proxy"``."""
        with pytest.raises(ConfigError) as caught:
            ProxyRule.from_config("http://proxy:3128", cgi=False)
        assert caught.value.key == "proxy"

    def test_a_wrong_type_does_not_echo_the_value(self) -> None:
        """The message for a non-string value names its type, never the value (it may hold a secret)."""
        with pytest.raises(ConfigError) as caught:
            ProxyRule.from_config({"http_proxy": {"url": "http://alice:s3cr3t@proxy"}}, cgi=False)
        assert caught.value.key == "proxy.http_proxy"
        assert "s3cr3t" not in str(caught.value)


class TestProxyFor:
    """``ProxyRule.proxy_for`` details the vectors do not show."""

    def test_cgi_error_redacts_user_info_of_the_target(self) -> None:
        """The CGI refusal names the target URL with its user-info redacted."""
        rule = ProxyRule(http_proxy="proxy:3128", cgi=True)
        with pytest.raises(ProxyConfigError) as caught:
            rule.proxy_for("http://carol:t0ps3cret@example.com/")
        assert "carol:***@example.com" in str(caught.value)
        assert "t0ps3cret" not in str(caught.value)

    def test_the_answer_is_the_canonical_proxy_with_its_user_info(self) -> None:
        """The returned proxy is the canonical URL, password included, ready for the HTTP client."""
        rule = ProxyRule(https_proxy="Alice:pw@Proxy.Example:3128")
        assert rule.proxy_for("https://example.com/") == "http://Alice:pw@proxy.example:3128"


class TestProperties:
    """Invariants over arbitrary input."""

    @given(url=FUZZY_URLS, no_proxy=FUZZY_TEXT, cgi=st.booleans())
    def test_proxy_for_raises_nothing_but_proxy_config_error(
        self, url: str, no_proxy: str, cgi: bool
    ) -> None:
        """Any NO_PROXY builds a rule, and proxy_for on any URL answers a proxy, None, or ProxyConfigError."""
        rule = ProxyRule(http_proxy="http://u:p@proxy:1", https_proxy="proxy:2", no_proxy=no_proxy, cgi=cgi)
        try:
            answer = rule.proxy_for(url)
        except ProxyConfigError:
            return
        assert answer in {None, "http://u:p@proxy:1", "http://proxy:2"}

    @given(value=FUZZY_URLS)
    def test_parse_proxy_url_is_idempotent(self, value: str) -> None:
        """A value either fails with ProxyConfigError or parses to a canonical form that parses to itself."""
        try:
            canonical = parse_proxy_url(value)
        except ProxyConfigError:
            return
        assert parse_proxy_url(canonical) == canonical

    @given(
        host=st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z0-9]{1,8}){0,3}", fullmatch=True),
        port=st.integers(min_value=1, max_value=65535),
        before=st.lists(
            st.sampled_from(["example.org", ".internal", "10.0.0.0/8", ":443", "x:y"]), max_size=3
        ),
        after=st.lists(st.sampled_from(["example.org", "[::1]:80", "bad entry"]), max_size=3),
        scheme=st.sampled_from(["http", "https"]),
    )
    def test_a_star_anywhere_bypasses_every_target(
        self, host: str, port: int, before: list[str], after: list[str], scheme: str
    ) -> None:
        """With ``*`` as any entry of NO_PROXY, no well-formed target is proxied."""
        rule = ProxyRule(
            http_proxy="proxy:1", https_proxy="proxy:2", no_proxy=",".join([*before, "*", *after])
        )
        assert rule.proxy_for(f"{scheme}://{host}:{port}/") is None

    @given(
        octets=st.tuples(*[st.integers(min_value=0, max_value=255)] * 3),
        port=st.none() | st.integers(min_value=1, max_value=65535),
    )
    def test_loopback_targets_are_never_proxied(self, octets: tuple[int, int, int], port: int | None) -> None:
        """Every 127.0.0.0/8 address, plain or IPv4-mapped, goes direct."""
        rule = ProxyRule(http_proxy="proxy:1", https_proxy="proxy:2")
        address = "127.{}.{}.{}".format(*octets)
        suffix = "" if port is None else f":{port}"
        assert rule.proxy_for(f"http://{address}{suffix}/") is None
        assert rule.proxy_for(f"https://[::ffff:{address}]{suffix}/") is None

    @given(
        labels=st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), min_size=1, max_size=3),
        prefix=st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), max_size=2),
        form=st.sampled_from(["", ".", "*."]),
    )
    def test_domain_entries_match_on_label_boundaries(
        self, labels: list[str], prefix: list[str], form: str
    ) -> None:
        """A domain entry bypasses exactly its subdomains, plus the domain itself in the bare form."""
        domain = ".".join(labels)
        host = ".".join([*prefix, domain])
        rule = ProxyRule(https_proxy="proxy:2", no_proxy=form + domain)
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            is_ip = False
        else:
            is_ip = True  # domain entries never match an IP target
        assert (rule.proxy_for(f"https://{host}/") is None) == (not is_ip and (bool(prefix) or form == ""))
        assert rule.proxy_for(f"https://x{domain}/") == "http://proxy:2"  # not on a label boundary


class TestPurity:
    """``ckpt.domain.proxy`` stays pure: standard library and attrs only, no I/O modules."""

    ALLOWED = frozenset(
        {"__future__", "ipaddress", "re", "collections.abc", "typing", "attrs"}
        | {"ckpt.domain.arguments", "ckpt.domain.errors", "ckpt.domain.loopback", "ckpt.domain.redaction"}
        | {"ckpt.domain.proxy.no_proxy", "ckpt.domain.proxy.rule", "ckpt.domain.proxy.urls"}
    )

    def test_imports_only_pure_modules(self) -> None:
        """Every import in the package's modules is on the allowed list (no os, no socket, no urllib)."""
        package = Path(proxy_module.__file__).parent
        imported = set()
        for path in sorted(package.glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    imported.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom):
                    imported.add(node.module or "")
        assert imported <= self.ALLOWED
        assert len(list(package.glob("*.py"))) == 4  # __init__, urls, no_proxy, rule: all of them read

    def test_each_module_is_small(self) -> None:
        """The rule stays split by reason to change: no module of the package is much over 300 lines."""
        package = Path(proxy_module.__file__).parent
        sizes = {p.name: len(p.read_text(encoding="utf-8").splitlines()) for p in package.glob("*.py")}
        assert max(sizes.values()) <= 300, sizes
