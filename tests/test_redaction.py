"""No refused URL shows its user-info: one redaction helper serves every message that quotes a URL.

The fuzzer found a proxy value whose scheme part held the user-info (``:p%40ss@://``) and was echoed as the
"unsupported scheme". The examples below pin that failure and the same class of echo everywhere a URL is
quoted: proxy values (from a rule, the environment or the ``[proxy]`` table), target URLs, S3 roots, the
store's root, the S3 endpoint URL and the Vault address.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ckpt import open_store
from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store, connect_s3, parse_s3_root
from ckpt.config import Config, S3Settings
from ckpt.creds.config import validate_credentials_config
from ckpt.creds.vault import KubernetesAuth, VaultSource
from ckpt.domain.errors import CkptError, ConfigError, InvalidError, ProxyConfigError
from ckpt.domain.proxy import ProxyRule, parse_proxy_url
from ckpt.domain.redaction import redact_url
from test_cli import ckpt

SECRET = "Zq9Secret"

# Proxy values the fuzzer (tests/test_fuzz_inputs.py::TestFuzzProxy) found echoing a password, and their kin:
# user-info in front of "://", so that the text before "://" is not a scheme at all.
LEAKING_PROXY_VALUES = [
    ":p%40ss@://",
    f":{SECRET}@://",
    f"user:{SECRET}@://proxy.example",
    f"user:{SECRET}@proxy.example://",
    f"HTTP:{SECRET}@://",
    f"u:{SECRET}@host:3128/://",
    f"http://user:{SECRET}@proxy.example:port",
]


def _shows_secret(value: str, message: str) -> bool:
    """Whether ``message`` holds the password of ``value``, in any letter case (schemes get lower-cased)."""
    secret = "p%40ss" if "p%40ss" in value else SECRET
    return secret.lower() in message.lower()


class TestProxyValues:
    """A refused proxy value is shown redacted, and no other part of it is echoed."""

    @pytest.mark.parametrize("value", LEAKING_PROXY_VALUES)
    def test_parse_proxy_url_refuses_without_the_password(self, value: str) -> None:
        """The fuzz examples: the error is ProxyConfigError and its message does not hold the password."""
        with pytest.raises(ProxyConfigError) as caught:
            parse_proxy_url(value, source="HTTPS_PROXY")
        message = str(caught.value)
        assert not _shows_secret(value, message), message
        assert message.startswith("HTTPS_PROXY value ")

    @pytest.mark.parametrize("value", LEAKING_PROXY_VALUES)
    def test_from_environment_refuses_without_the_password(self, value: str) -> None:
        """The second fuzz property: the same values in the environment give an error without the password."""
        with pytest.raises(ProxyConfigError) as caught:
            ProxyRule.from_environment({"HTTP_PROXY": value})
        assert not _shows_secret(value, str(caught.value))

    @pytest.mark.parametrize("value", LEAKING_PROXY_VALUES)
    def test_from_config_refuses_without_the_password(self, value: str) -> None:
        """The same values in the [proxy] table give an error naming the key, without the password."""
        with pytest.raises(ProxyConfigError) as caught:
            ProxyRule.from_config({"https_proxy": value}, cgi=False)
        assert "proxy.https_proxy" in str(caught.value)
        assert not _shows_secret(value, str(caught.value))

    def test_a_well_formed_unsupported_scheme_is_still_named(self) -> None:
        """A real scheme (letters, digits, + - .) is named in the message: it is not user-info."""
        with pytest.raises(ProxyConfigError, match="'socks5'"):
            parse_proxy_url(f"socks5://user:{SECRET}@proxy.example:1080")

    def test_a_bad_port_is_not_echoed_on_its_own(self) -> None:
        """A user-info-looking value without "@" is not quoted as a port: only the redacted value appears."""
        with pytest.raises(ProxyConfigError) as caught:
            parse_proxy_url(f"http://alice:{SECRET}")
        assert str(caught.value).count(SECRET) <= 1  # at most inside the quoted value, never again as a port
        assert "port '" not in str(caught.value)

    def test_a_target_url_with_a_bad_port_is_refused_without_user_info(self) -> None:
        """proxy_for's refusal of a malformed target shows it redacted, and no port text beside it."""
        rule = ProxyRule(https_proxy="proxy.example:3128")
        with pytest.raises(ProxyConfigError) as caught:
            rule.proxy_for(f"https://carol:{SECRET}@example.com:{SECRET}/")
        assert SECRET not in str(caught.value).replace(f"example.com:{SECRET}", "")
        assert f":{SECRET}@" not in str(caught.value)


class TestOtherUrls:
    """S3 roots, the store's root, the S3 endpoint and the Vault address are shown with user-info hidden."""

    @pytest.mark.parametrize(
        "root", [f"S3://AKIDEXAMPLE:{SECRET}@bucket/run", f"https://AKIDEXAMPLE:{SECRET}@bucket.example/run"]
    )
    def test_a_root_that_is_not_s3_hides_its_user_info(self, root: str) -> None:
        """parse_s3_root's "not an s3:// URL" quotes the root redacted."""
        with pytest.raises(InvalidError) as caught:
            parse_s3_root(root)
        assert SECRET not in str(caught.value)
        assert "AKIDEXAMPLE" not in str(caught.value)
        assert "***@bucket" in str(caught.value)

    def test_a_store_root_of_another_scheme_hides_its_user_info(self) -> None:
        """open_store's refusal of an http(s) root quotes it redacted."""
        with pytest.raises(InvalidError) as caught:
            open_store(f"https://AKIDEXAMPLE:{SECRET}@storage.example/run")
        assert SECRET not in str(caught.value)
        assert "***@storage.example/run" in str(caught.value)

    def test_a_malformed_endpoint_url_hides_its_user_info(self) -> None:
        """A malformed s3.endpoint_url is refused without its user-info, whatever botocore makes of it."""
        config = Config(
            s3=S3Settings(endpoint_url=f"AKIDEXAMPLE:{SECRET}@objects.example:9000"),
            credentials=({"source": "env"},),
        )
        with pytest.raises(CkptError) as caught:
            connect_s3(config, {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"})
        assert SECRET.lower() not in str(caught.value).lower()
        assert "akidexample" not in str(caught.value).lower()

    def test_a_vault_address_with_user_info_is_refused_without_it(self) -> None:
        """VaultSource refuses user-info in the address and does not print it."""
        with pytest.raises(ConfigError) as caught:
            VaultSource(
                address=f"https://root:{SECRET}@vault.example:8200", path="s3", auth=KubernetesAuth("r")
            )
        assert SECRET not in str(caught.value)
        assert "***@vault.example:8200" in str(caught.value)

    def test_the_credentials_table_refuses_a_vault_address_without_user_info(self) -> None:
        """The [[credentials]] validation names the key and hides the address's user-info."""
        tables: list[dict[str, Any]] = [
            {
                "source": "vault",
                "address": f"https://root:{SECRET}@vault.example:8200",
                "path": "s3",
                "auth": {"method": "kubernetes", "role": "r"},
            }
        ]
        with pytest.raises(ConfigError) as caught:
            validate_credentials_config(tables)
        assert caught.value.key == "credentials[0].address"
        assert SECRET not in str(caught.value)


class TestSaveLocations:
    """A save location given as a URL is quoted with its user-info hidden when it is refused."""

    @pytest.mark.parametrize(
        "location",
        [
            f"s3://AKIDEXAMPLE:{SECRET}@bucket/exec/a/checkpoint-1",  # user-info: not under the root
            f"https://AKIDEXAMPLE:{SECRET}@bucket/exec/a",  # not an s3:// URL
        ],
    )
    def test_s3_save_of(self, location: str) -> None:
        """S3Store.save_of refuses each location without showing its user-info."""
        store = S3Store("s3://bucket", cast(Any, object()))
        with pytest.raises(InvalidError) as caught:
            store.save_of(location)
        assert SECRET not in str(caught.value)
        assert "AKIDEXAMPLE" not in str(caught.value)

    def test_posix_save_of_a_url(self, tmp_path: Path) -> None:
        """PosixStore.save_of refuses a URL (not an absolute path) without showing its user-info."""
        with pytest.raises(InvalidError) as caught:
            PosixStore(str(tmp_path)).save_of(f"https://AKIDEXAMPLE:{SECRET}@host/x")
        assert SECRET not in str(caught.value)
        assert "***@host/x" in str(caught.value)

    def test_watch_saves_url_outside_the_root(self, tmp_path: Path) -> None:
        """``ckpt watch --saves URL`` outside the root is refused (exit 2) without the URL's user-info."""
        result = ckpt(
            "--root", str(tmp_path), "watch", "--framework", "dcp", "--epoch", "1", "--once",
            "--saves", f"s3://AKIDEXAMPLE:{SECRET}@bucket/exec/a",
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        assert "***@bucket/exec/a" in result.stderr
        assert SECRET not in result.stderr + result.stdout


class TestRedactUrl:
    """The one helper: user-info up to the last "@" is hidden; the user name is kept only when asked."""

    @pytest.mark.parametrize(
        ("url", "keep_user", "expected"),
        [
            ("http://alice:s3cr3t@proxy:3128", True, "http://alice:***@proxy:3128"),
            ("http://alice:s3cr3t@proxy:3128", False, "http://***@proxy:3128"),
            ("s3://AKID:secret@bucket/run", False, "s3://***@bucket/run"),
            (":p%40ss@://", True, ":***@://"),
            ("no-user-info://host/path", False, "no-user-info://host/path"),
        ],
    )
    def test_examples(self, url: str, keep_user: bool, expected: str) -> None:
        """Each example redacts to the expected text."""
        assert redact_url(url, keep_user=keep_user) == expected

    def test_the_proxy_module_exports_the_same_helper(self) -> None:
        """ckpt.domain.proxy.redact_url is this helper, not a second one."""
        from ckpt.domain import proxy

        assert proxy.redact_url is redact_url
