"""The configuration file (spec/config.md) at load time: what is refused before any client is built or any
request
is sent, and how the S3 client construction reports our own errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ckpt.config import (
    MAX_ATTEMPTS,
    MAX_CONFIG_BYTES,
    MAX_SECONDS,
    Config,
    S3Settings,
    endpoint_url_problem,
    load_config,
    parse_config,
)
from ckpt.domain.errors import ConfigError, InvalidError


class TestS3Timings:
    @pytest.mark.parametrize(
        "key", ["connect_timeout", "read_timeout", "refresh_seconds", "max_staleness_seconds"]
    )
    @pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e300, MAX_SECONDS + 1])
    def test_values_no_wait_can_take_are_refused(self, key: str, value: float) -> None:
        """inf, nan and durations beyond MAX_SECONDS are a ConfigError naming the key."""
        with pytest.raises(ConfigError, match=f"s3.{key}") as caught:
            parse_config({"s3": {key: value}})
        assert caught.value.key == f"s3.{key}"

    @pytest.mark.parametrize(
        "key", ["connect_timeout", "read_timeout", "refresh_seconds", "max_staleness_seconds"]
    )
    @pytest.mark.parametrize("value", [10**400, -(10**400)])
    def test_integers_too_large_for_a_float_are_refused_not_a_crash(self, key: str, value: int) -> None:
        """TOML integers have no size limit: a 401-digit one is a ConfigError naming the key and cut short in
        the message, never an OverflowError from converting it first."""
        with pytest.raises(ConfigError, match=f"^s3.{key} must be a number of seconds above 0") as caught:
            parse_config({"s3": {key: value}})
        assert caught.value.key == f"s3.{key}"
        assert len(str(caught.value)) < 200

    @pytest.mark.parametrize("value", [0, -1, 101, 10**30, True, 2.0])
    def test_max_attempts_out_of_range_is_refused(self, value: object) -> None:
        """1 to MAX_ATTEMPTS (100): 10**30 would retry a refusing endpoint for ever."""
        with pytest.raises(ConfigError, match=r"s3\.max_attempts must be an integer from 1 to 100") as caught:
            parse_config({"s3": {"max_attempts": value}})
        assert caught.value.key == "s3.max_attempts"

    def test_max_attempts_at_its_bounds_loads(self) -> None:
        assert parse_config({"s3": {"max_attempts": 1}}).s3.max_attempts == 1
        assert parse_config({"s3": {"max_attempts": MAX_ATTEMPTS}}).s3.max_attempts == MAX_ATTEMPTS

    def test_the_longest_accepted_duration_loads(self) -> None:
        """MAX_SECONDS itself is accepted, as a float."""
        assert (
            parse_config({"s3": {"max_staleness_seconds": MAX_SECONDS}}).s3.max_staleness_seconds
            == MAX_SECONDS
        )


class TestRepr:
    def test_a_configs_repr_shows_no_secret(self) -> None:
        """errors.md §3.2: the proxy URLs' passwords, every value of the credential tables and the user-info
        of the root stay out of repr(Config) (an endpoint with user-info is refused when parsed)."""
        config = parse_config(
            {
                "root": "s3://AKIAROOTKEY:root-secret@bucket/run",
                "proxy": {"https_proxy": "http://alice:Pr0xyPassw0rd@proxy.example:3128"},
                "credentials": [
                    {
                        "source": "vault",
                        "address": "https://vault.example:8200",
                        "path": "s3/team",
                        "auth": {"method": "approle", "role_id": "ROLE-ID-1", "secret_id": "SECRET-ID-2"},
                    },
                    {"source": "file", "dir": "/var/run/secrets/s3"},
                ],
            }
        )
        shown = repr(config)
        for secret in ("root-secret", "AKIAROOTKEY", "Pr0xyPassw0rd", "ROLE-ID-1", "SECRET-ID-2"):
            assert secret not in shown
        assert "'vault(address, auth, path, source)'" in shown
        assert "http://alice:***@proxy.example:3128" in shown
        assert config.proxy == {"https_proxy": "http://alice:Pr0xyPassw0rd@proxy.example:3128"}  # kept


class TestEndpointUrl:
    @pytest.mark.parametrize(
        "url",
        [
            "https://objects.example.internal:9000",
            "http://127.0.0.1:5000",
            "https://[2001:db8::1]:443",
            "https://objects.example",
            "https://objects.example/",
            "https://gateway.example/s3",
            "HTTPS://Objects.Example:9000",
        ],
    )
    def test_usable_endpoints_load(self, url: str) -> None:
        """http(s), a host, an optional port 1..65535 and an optional path are accepted as given."""
        assert parse_config({"s3": {"endpoint_url": url}}).s3.endpoint_url == url

    @pytest.mark.parametrize(
        ("url", "why"),
        [
            ("ftp://objects.example", "http:// or https://"),
            ("objects.example:9000", "http:// or https://"),
            ("s3://bucket", "http:// or https://"),
            ("https://", "no host"),
            ("https://:9000", "no host"),
            ("https://objects.example:99999", "port"),
            ("https://objects.example:0", "port"),
            ("https://objects.example:-1", "port"),
            ("https://objects.example:nine", "port"),
            ("https://[::1", "host or port"),
            ("https://objects.example/?x=1", "query or a fragment"),
            ("https://objects.example/?", "query or a fragment"),
            ("https://objects.example#top", "query or a fragment"),
            ("https://objects.example\n", "control character"),
            ("https://obj ects.example", "whitespace"),
            ("https://user@objects.example", "user-info"),
        ],
    )
    def test_endpoints_that_cannot_work_are_refused(self, url: str, why: str) -> None:
        """An endpoint that would fail at the first request is a ConfigError at load, naming the key."""
        problem = endpoint_url_problem(url)
        assert problem is not None
        assert why in problem
        with pytest.raises(ConfigError, match=r"s3\.endpoint_url") as caught:
            parse_config({"s3": {"endpoint_url": url}})
        assert caught.value.key == "s3.endpoint_url"

    def test_the_password_in_user_info_is_redacted(self) -> None:
        """The message quotes the value with its password replaced."""
        with pytest.raises(ConfigError) as caught:
            parse_config({"s3": {"endpoint_url": "https://alice:pa55word@objects.example"}})
        assert "pa55word" not in str(caught.value)
        assert "***@objects.example'" in str(caught.value)


class TestLoadConfig:
    def test_a_regular_utf8_file_loads(self, tmp_path: Path) -> None:
        """The ordinary case: a small UTF-8 TOML file, non-ASCII allowed."""
        path = tmp_path / "ckpt.toml"
        path.write_text('root = "/mnt/ckpt/équipe"\n', encoding="utf-8")
        assert load_config(str(path)) == Config(root="/mnt/ckpt/équipe", path=str(path))

    def test_a_file_at_the_cap_loads_and_one_byte_more_is_refused(self, tmp_path: Path) -> None:
        """MAX_CONFIG_BYTES is the exact limit."""
        path = tmp_path / "ckpt.toml"
        path.write_bytes(b"#" * (MAX_CONFIG_BYTES - 1) + b"\n")
        assert load_config(str(path)).root is None
        path.write_bytes(b"#" * MAX_CONFIG_BYTES + b"\n")
        with pytest.raises(ConfigError, match=f"larger than {MAX_CONFIG_BYTES} bytes"):
            load_config(str(path))

    def test_not_utf8_names_the_byte(self, tmp_path: Path) -> None:
        """A file that is not UTF-8 is a ConfigError saying where, not a UnicodeDecodeError."""
        path = tmp_path / "ckpt.toml"
        path.write_bytes(b"# ok\n# \xff\n")
        with pytest.raises(ConfigError, match=r"not valid UTF-8 \(byte 7\)"):
            load_config(str(path))

    def test_a_path_with_a_newline_is_quoted(self, tmp_path: Path) -> None:
        """The path is quoted, so its newline cannot split the message."""
        with pytest.raises(ConfigError) as caught:
            load_config(str(tmp_path / "a\nb.toml"))
        assert "\n" not in str(caught.value)
        assert "a\\nb.toml" in str(caught.value)

    @pytest.mark.parametrize(
        "deep", ["root = " + "[" * 5000 + "]" * 5000, "x = " + "{a = " * 3000 + "1" + "}" * 3000]
    )
    def test_nesting_too_deep_to_parse_is_refused_not_a_crash(self, tmp_path: Path, deep: str) -> None:
        """A small file that nests arrays or inline tables thousands deep is a ConfigError, not the
        RecursionError of the parser."""
        path = tmp_path / "ckpt.toml"
        path.write_text(deep + "\n")
        with pytest.raises(ConfigError, match="nests arrays or tables too deeply to read"):
            load_config(str(path))

    def test_a_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory is not a configuration file."""
        with pytest.raises(ConfigError, match="configuration file"):
            load_config(str(tmp_path))

    def test_a_symlink_to_a_regular_file_is_followed(self, tmp_path: Path) -> None:
        """Links are resolved (Kubernetes ConfigMaps mount files through symbolic links)."""
        target = tmp_path / "real.toml"
        target.write_text('root = "/x"\n')
        (tmp_path / "link.toml").symlink_to(target)
        assert load_config(str(tmp_path / "link.toml")).root == "/x"


class TestConnectS3:
    def test_our_own_invalid_error_is_not_relabelled_as_a_bad_endpoint(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An InvalidError of ours raised while the client is built keeps its own message."""
        from ckpt.adapters.s3 import client, connect_s3

        def refuse(*_args: object, **_kwargs: object) -> object:
            raise InvalidError("the S3 client's proxies must be explicit")

        monkeypatch.setattr(client, "create_s3_client", refuse)
        config = Config(s3=S3Settings(endpoint_url="https://objects.example:9000"))
        with pytest.raises(InvalidError) as caught:
            connect_s3(config, {})
        assert str(caught.value) == "the S3 client's proxies must be explicit"

    def test_a_malformed_endpoint_that_skipped_validation_is_still_named(self) -> None:
        """A Config built in code (not loaded) with an unusable endpoint still fails naming the key."""
        from ckpt.adapters.s3 import connect_s3

        config = Config(s3=S3Settings(endpoint_url="https://obj ects.example"))
        with pytest.raises(InvalidError, match=r"s3\.endpoint_url"):
            connect_s3(config, {})
