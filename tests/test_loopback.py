"""One loopback check serves both rules that need one: the proxy rule and the Vault address check.

``ckpt.domain.loopback.is_loopback_host`` decides; the proxy rule never proxies such a host
(spec/proxy.md §5.3) and the Vault source accepts plain ``http://`` to it (spec/credentials.md
§5.4). The structural tests keep a second check (or a second redaction helper) from growing back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ckpt.creds.vault import vault_address_problem
from ckpt.domain.loopback import is_loopback_host
from ckpt.domain.proxy import ProxyRule

SRC = Path(__file__).resolve().parent.parent / "src" / "ckpt"

LOOPBACK = ["localhost", "LOCALHOST", "LocalHost", "127.0.0.1", "127.255.0.9", "::1", "::ffff:127.0.0.1"]
LOOPBACK_WITH_ZONE = ["::1%eth0", "::1%25lo"]
# Hosts both rules see as a URL's host (an empty host or 0.0.0.0 is refused by each for its own reasons).
AS_URL_HOSTS = [
    *LOOPBACK,
    "localhost.",
    "mylocalhost",
    "128.0.0.1",
    "10.0.0.1",
    "::2",
    "vault.example.internal",
]
NOT_LOOPBACK = [
    "localhost.example",
    "localhost.",
    "mylocalhost",
    "128.0.0.1",
    "10.0.0.1",
    "::2",
    "::ffff:10.0.0.1",
    "0.0.0.0",
    "",
    "vault.example.internal",
]


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class TestIsLoopbackHost:
    """The helper on host text as a URL parser hands it over (no brackets)."""

    @pytest.mark.parametrize("host", LOOPBACK + LOOPBACK_WITH_ZONE)
    def test_loopback_hosts(self, host: str) -> None:
        """localhost in any case, 127.0.0.0/8, ::1 and IPv4-mapped loopback, any zone, are loopback."""
        assert is_loopback_host(host) is True

    @pytest.mark.parametrize("host", NOT_LOOPBACK)
    def test_other_hosts(self, host: str) -> None:
        """Other names (subdomains and look-alikes of localhost included) and addresses are not."""
        assert is_loopback_host(host) is False


class TestBothRulesAgree:
    """The proxy rule and the Vault address check answer alike for every host above."""

    @pytest.mark.parametrize(
        "host", LOOPBACK + [host for host in NOT_LOOPBACK if host not in ("", "0.0.0.0")]
    )
    def test_proxy_rule_and_vault_address(self, host: str) -> None:
        """A host goes direct past a proxy exactly when Vault accepts plain http:// to it."""
        url = f"http://{_bracketed(host)}:8200"
        direct = ProxyRule(http_proxy="proxy.example:3128").proxy_for(url) is None
        accepted = vault_address_problem(url, allow_insecure_http=False) is None
        assert (direct, accepted) == (is_loopback_host(host), is_loopback_host(host))


def _python_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


class TestOneOfEach:
    """Exactly one loopback check and one user-info redaction helper exist in src/."""

    def test_only_the_domain_helper_asks_ipaddress_about_loopback(self) -> None:
        """No module but ckpt/domain/loopback.py reads ``is_loopback`` or compares a host to localhost."""
        offenders = []
        for path in _python_files():
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                asks = isinstance(node, ast.Attribute) and node.attr == "is_loopback"
                compares = isinstance(node, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value == "localhost"
                    for c in [*node.comparators, node.left]
                )
                if asks or compares:
                    offenders.append(f"{path.relative_to(SRC)}:{node.lineno}")
        assert {o.partition(":")[0] for o in offenders} == {"domain/loopback.py"}, offenders

    def test_only_the_domain_helper_writes_the_redaction_mark(self) -> None:
        """No module but ckpt/domain/redaction.py puts ``***`` in place of user-info."""
        offenders = [
            f"{path.relative_to(SRC)}:{node.lineno}"
            for path in _python_files()
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "***" in node.value
        ]
        assert {o.partition(":")[0] for o in offenders} == {"domain/redaction.py"}, offenders
