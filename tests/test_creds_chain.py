"""The credential value, the chain's absent/broken/nothing rules, the ``env`` and ``aws-default`` sources,
and the ``[[credentials]]`` configuration (spec/credentials.md, §9)."""

from __future__ import annotations

import subprocess
import sys
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ckpt.creds import (
    AppRoleAuth,
    AwsDefaultSource,
    Chain,
    Credentials,
    EnvSource,
    FileSource,
    KubernetesAuth,
    Source,
    VaultSource,
    chain_from_config,
    validate_credentials_config,
)
from ckpt.domain.errors import ConfigError, CredentialsError, InvalidError

SECRET = "wJalrXUtnFEMI-K7MDENG-SECRETKEY-4242"
TOKEN = "FwoGZXIvYXdz-SESSIONTOKEN-4242"


class StaticSource:
    """Always has the same credentials; counts its fetches."""

    def __init__(self, name: str, key_id: str = "AKIDSTATIC") -> None:
        self.name = name
        self.key_id = key_id
        self.fetches = 0

    def fetch(self) -> Credentials | None:
        self.fetches += 1
        return Credentials(self.key_id, SECRET, TOKEN, source=self.name)


class AbsentSource:
    def __init__(self, name: str) -> None:
        self.name = name
        self.fetches = 0

    def fetch(self) -> Credentials | None:
        self.fetches += 1
        return None


class BrokenSource:
    def __init__(self, name: str, *, with_source: bool = True) -> None:
        self.name = name
        self.with_source = with_source

    def fetch(self) -> Credentials | None:
        raise CredentialsError(f"{self.name}: refused", source=self.name if self.with_source else None)


class ExplodingSource:
    """Raises a library-style error whose text carries a secret."""

    name = "exploding"

    def fetch(self) -> Credentials | None:
        raise RuntimeError(f"backend said: bad key {SECRET}")


class TestCredentials:
    def test_repr_and_str_hide_the_secret_key_and_the_session_token(self) -> None:
        """Neither repr nor str shows the secret key or the session token; the access key id is shown."""
        creds = Credentials("AKIDEXAMPLE", SECRET, TOKEN, source="env")
        for text in (repr(creds), str(creds), f"{creds!r}", repr([creds])):
            assert SECRET not in text
            assert TOKEN not in text
            assert "AKIDEXAMPLE" in text

    def test_is_frozen(self) -> None:
        """A credentials value cannot be changed after it is made."""
        creds = Credentials("AKIDEXAMPLE", SECRET)
        with pytest.raises(AttributeError):
            creds.access_key_id = "other"  # type: ignore[misc]

    def test_refuses_empty_keys_without_echoing_values(self) -> None:
        """An empty field is refused, and the message names the field only."""
        with pytest.raises(ValueError, match="secret_access_key") as info:
            Credentials("AKIDEXAMPLE", "")
        assert "AKIDEXAMPLE" not in str(info.value)
        with pytest.raises(ValueError, match="access_key_id"):
            Credentials("", SECRET)

    def test_refuses_a_naive_expiry(self) -> None:
        """An expiry without a time zone is ambiguous and refused."""
        with pytest.raises(ValueError, match="timezone-aware"):
            Credentials("AKID", SECRET, expiry=datetime(2030, 1, 1))
        aware = Credentials("AKID", SECRET, expiry=datetime(2030, 1, 1, tzinfo=UTC))
        assert aware.expiry is not None

    def test_every_source_satisfies_the_port(self, tmp_path: Path) -> None:
        """All four sources and the chain itself are structurally ``Source``s."""
        sources: list[object] = [
            EnvSource(environ={}),
            FileSource(tmp_path),
            VaultSource(address="https://vault.example", path="s3/a", auth=KubernetesAuth("r")),
            AwsDefaultSource(),
            Chain([]),
        ]
        for source in sources:
            assert isinstance(source, Source), source


class TestPackage:
    def test_importing_the_package_imports_neither_botocore_nor_hvac(self) -> None:
        """``import ckpt.creds`` (and building a chain from config) loads no vendor library."""
        code = (
            "import sys, ckpt.creds\n"
            "ckpt.creds.chain_from_config([{'source': 'env'}, {'source': 'aws-default'}])\n"
            "print(sorted(m for m in ('botocore', 'boto3', 'hvac', 'requests') if m in sys.modules))"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
        )
        assert result.stdout.strip() == "[]"


class TestChain:
    def test_the_first_source_with_credentials_wins(self) -> None:
        """Sources are asked in order and the first present one wins; later ones are not asked."""
        first, second = StaticSource("one", "AKIDONE"), StaticSource("two", "AKIDTWO")
        found = Chain([first, second]).fetch()
        assert (found.access_key_id, found.source) == ("AKIDONE", "one")
        assert (first.fetches, second.fetches) == (1, 0)

    def test_an_absent_source_passes_to_the_next(self) -> None:
        """A source that returns None is skipped."""
        absent, present = AbsentSource("env"), StaticSource("file")
        found = Chain([absent, present]).fetch()
        assert found.source == "file"
        assert absent.fetches == 1

    def test_a_broken_source_stops_the_chain(self) -> None:
        """A present-but-broken source is an error naming it; the next source is never asked."""
        later = StaticSource("aws-default")
        with pytest.raises(CredentialsError) as info:
            Chain([AbsentSource("env"), BrokenSource("vault"), later]).fetch()
        assert info.value.source == "vault"
        assert "vault" in str(info.value)
        assert later.fetches == 0

    def test_a_broken_source_without_a_name_gets_one(self) -> None:
        """An error a source raised without ``source`` is re-raised naming the source."""
        with pytest.raises(CredentialsError) as info:
            Chain([BrokenSource("file", with_source=False)]).fetch()
        assert info.value.source == "file"

    def test_nothing_found_lists_the_sources_tried_by_name(self) -> None:
        """When every source is absent the error lists their names, in order, and nothing else."""
        with pytest.raises(CredentialsError) as info:
            Chain([AbsentSource("env"), AbsentSource("file"), AbsentSource("aws-default")]).fetch()
        assert str(info.value) == "no credentials found; sources tried: env, file, aws-default"
        assert info.value.source is None
        assert isinstance(info.value, PermissionError)

    def test_an_empty_chain_says_so(self) -> None:
        """A chain without sources cannot find anything."""
        with pytest.raises(CredentialsError, match="no credential sources are configured"):
            Chain([]).fetch()

    def test_an_unexpected_exception_is_reported_by_type_only(self) -> None:
        """A non-ckpt exception becomes a CredentialsError naming the source and the type, not the text."""
        with pytest.raises(CredentialsError) as info:
            Chain([ExplodingSource()]).fetch()
        error = info.value
        assert error.source == "exploding"
        assert "RuntimeError" in str(error)
        rendered = "".join(traceback.format_exception(error))
        assert SECRET not in rendered
        assert error.__cause__ is None
        assert error.__context__ is None

    def test_found_credentials_carry_the_chain_name_of_their_source(self) -> None:
        """The credentials' ``source`` is the name the chain knows the source by."""
        source = StaticSource("file (credentials[2])")
        assert Chain([source]).fetch().source == "file (credentials[2])"


class TestEnvSource:
    def test_unset_variables_mean_absent(self) -> None:
        """No key variables: absent."""
        assert EnvSource(environ={"PATH": "/bin"}).fetch() is None

    def test_empty_variables_count_as_unset(self) -> None:
        """Empty values are the same as unset ones."""
        environ = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": ""}
        assert EnvSource(environ=environ).fetch() is None

    def test_reads_the_key_pair_and_the_session_token(self) -> None:
        """Both keys and the token are read."""
        environ = {
            "AWS_ACCESS_KEY_ID": "AKIDENV",
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_SESSION_TOKEN": TOKEN,
        }
        found = EnvSource(environ=environ).fetch()
        assert found == Credentials("AKIDENV", SECRET, TOKEN, source="env")

    @pytest.mark.parametrize(
        ("environ", "named"),
        [
            ({"AWS_ACCESS_KEY_ID": "AKIDENV"}, "AWS_SECRET_ACCESS_KEY"),
            ({"AWS_SECRET_ACCESS_KEY": SECRET}, "AWS_ACCESS_KEY_ID"),
            ({"AWS_SESSION_TOKEN": TOKEN}, "AWS_ACCESS_KEY_ID"),
        ],
    )
    def test_half_a_key_pair_is_broken(self, environ: Mapping[str, str], named: str) -> None:
        """One key without the other (or a token alone) is an error naming the variables, not values."""
        with pytest.raises(CredentialsError) as info:
            EnvSource(environ=environ).fetch()
        assert info.value.source == "env"
        assert named in str(info.value)
        assert SECRET not in str(info.value)
        assert TOKEN not in str(info.value)

    def test_variable_names_are_configurable(self) -> None:
        """Custom variable names are read instead of the AWS ones."""
        environ = {"S3_KEY": "AKIDCUSTOM", "S3_SECRET": SECRET, "AWS_ACCESS_KEY_ID": "AKIDIGNORED"}
        source = EnvSource(
            environ=environ,
            access_key_id_var="S3_KEY",
            secret_access_key_var="S3_SECRET",
            session_token_var="T",
        )
        found = source.fetch()
        assert found is not None
        assert (found.access_key_id, found.session_token) == ("AKIDCUSTOM", None)

    def test_the_environment_is_read_at_every_fetch(self) -> None:
        """A rotated variable is seen by the next fetch."""
        environ = {"AWS_ACCESS_KEY_ID": "AKIDOLD", "AWS_SECRET_ACCESS_KEY": SECRET}
        source = EnvSource(environ=environ)
        assert source.fetch() is not None
        environ["AWS_ACCESS_KEY_ID"] = "AKIDNEW"
        found = source.fetch()
        assert found is not None
        assert found.access_key_id == "AKIDNEW"

    def test_repr_does_not_show_the_environment(self) -> None:
        """The environment holds secrets; the source's repr leaves it out."""
        source = EnvSource(environ={"AWS_SECRET_ACCESS_KEY": SECRET})
        assert SECRET not in repr(source)


@pytest.fixture
def isolated_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An environment where botocore's default chain finds nothing and never leaves the machine."""
    for name in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_ROLE_ARN",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    # Never reach for the instance-metadata endpoint: this test suite stays on loopback.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


class TestAwsDefaultSource:
    def test_nothing_configured_is_absent(self, isolated_aws: Path) -> None:
        """botocore finding nothing is absent."""
        assert AwsDefaultSource().fetch() is None

    def test_reads_the_environment_through_botocore(
        self, isolated_aws: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """botocore's env provider is part of its chain."""
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDBOTO")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        found = AwsDefaultSource().fetch()
        assert found == Credentials("AKIDBOTO", SECRET, None, source="aws-default")

    def test_reads_a_shared_credentials_profile(
        self, isolated_aws: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A profile in the shared credentials file is found."""
        (isolated_aws / "aws-credentials").write_text(
            f"[team]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = {SECRET}\n"
        )
        monkeypatch.setenv("AWS_PROFILE", "team")
        found = AwsDefaultSource().fetch()
        assert found is not None
        assert found.access_key_id == "AKIDPROFILE"

    def test_a_missing_profile_is_broken(self, isolated_aws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A profile that does not exist is an error naming the source and botocore's error."""
        monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
        with pytest.raises(CredentialsError) as info:
            AwsDefaultSource().fetch()
        assert info.value.source == "aws-default"
        assert "ProfileNotFound" in str(info.value)

    def test_half_a_pair_in_the_environment_is_broken(
        self, isolated_aws: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """botocore's partial-credentials error is reported, without the key."""
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDHALF")
        with pytest.raises(CredentialsError, match="PartialCredentialsError") as info:
            AwsDefaultSource().fetch()
        assert SECRET not in str(info.value)


FULL_EXAMPLE: list[Mapping[str, object]] = [
    {"source": "env"},
    {"source": "file", "dir": "/var/run/secrets/s3", "readable_by_others": "warn"},
    {
        "source": "vault",
        "address": "https://vault.example.internal:8200",
        "namespace": "ml",
        "ca_bundle": "/etc/ssl/certs/internal-ca.pem",
        "allow_insecure_http": False,
        "mount": "secret",
        "path": "s3/team-a",
        "fields": {"access_key_id": "ak", "secret_access_key": "sk", "session_token": "st"},
        "auth": {
            "method": "kubernetes",
            "mount": "k8s",
            "role": "ckpt-publisher",
            "jwt_file": "/var/run/secrets/kubernetes.io/serviceaccount/token",
        },
    },
    {"source": "aws-default"},
]


def _vault(**changes: object) -> dict[str, object]:
    table: dict[str, object] = {
        "source": "vault",
        "address": "https://vault.example.internal:8200",
        "path": "s3/team-a",
        "auth": {"method": "kubernetes", "role": "ckpt-publisher"},
    }
    table.update(changes)
    return table


def _approle(**auth: object) -> dict[str, object]:
    return _vault(auth={"method": "approle", **auth})


INVALID: list[tuple[str, list[object], str]] = [
    ("not a table", ["env"], "credentials[0]"),
    ("source missing", [{}], "credentials[0].source"),
    ("unknown source", [{"source": "ftp"}], "credentials[0].source"),
    ("source not a string", [{"source": 3}], "credentials[0].source"),
    ("unknown key", [{"source": "env", "bogus": 1}], "credentials[0].bogus"),
    ("env var wrong type", [{"source": "env", "access_key_id_var": 5}], "credentials[0].access_key_id_var"),
    ("env var with =", [{"source": "env", "session_token_var": "A=B"}], "credentials[0].session_token_var"),
    ("file dir missing", [{"source": "env"}, {"source": "file"}], "credentials[1].dir"),
    (
        "readable_by_others bad",
        [{"source": "file", "dir": "/s", "readable_by_others": "ignore"}],
        "credentials[0].readable_by_others",
    ),
    ("key of another kind", [{"source": "file", "dir": "/s", "path": "x"}], "credentials[0].path"),
    ("aws-default extra key", [{"source": "aws-default", "profile": "x"}], "credentials[0].profile"),
    ("vault address missing", [_vault(address=None) | {"address": 1}], "credentials[0].address"),
    ("vault path missing", [{k: v for k, v in _vault().items() if k != "path"}], "credentials[0].path"),
    ("vault auth missing", [{k: v for k, v in _vault().items() if k != "auth"}], "credentials[0].auth"),
    ("vault auth not a table", [_vault(auth="kubernetes")], "credentials[0].auth"),
    ("auth method missing", [_vault(auth={"role": "r"})], "credentials[0].auth.method"),
    ("auth method unknown", [_vault(auth={"method": "ldap"})], "credentials[0].auth.method"),
    (
        "kubernetes role missing",
        [{"source": "env"}, _vault(auth={"method": "kubernetes"})],
        "credentials[1].auth.role",
    ),
    (
        "approle key under kubernetes",
        [_vault(auth={"method": "kubernetes", "role": "r", "role_id": "x"})],
        "credentials[0].auth.role_id",
    ),
    ("approle role id missing", [_approle(secret_id_file="/s")], "credentials[0].auth.role_id"),
    ("approle secret id missing", [_approle(role_id="r")], "credentials[0].auth.secret_id"),
    (
        "approle secret id twice",
        [_approle(role_id="r", secret_id="s", secret_id_file="/s")],
        "credentials[0].auth.secret_id_file",
    ),
    (
        "kubernetes key under approle",
        [_approle(role_id="r", secret_id="s", role="x")],
        "credentials[0].auth.role",
    ),
    (
        "allow_insecure_http not bool",
        [_vault(allow_insecure_http="yes")],
        "credentials[0].allow_insecure_http",
    ),
    ("plain http to a remote host", [_vault(address="http://vault.example:8200")], "credentials[0].address"),
    ("address with user-info", [_vault(address="https://u:p@vault.example")], "credentials[0].address"),
    ("address with a path", [_vault(address="https://vault.example/v1")], "credentials[0].address"),
    ("fields unknown key", [_vault(fields={"region": "x"})], "credentials[0].fields.region"),
    ("fields not a table", [_vault(fields="ak")], "credentials[0].fields"),
    ("fields value wrong type", [_vault(fields={"access_key_id": 1})], "credentials[0].fields.access_key_id"),
    ("namespace empty", [_vault(namespace="")], "credentials[0].namespace"),
    ("path only slashes", [_vault(path="//")], "credentials[0].path"),
]


class TestConfig:
    def test_no_tables_means_botocores_default_chain(self) -> None:
        """An absent ``[[credentials]]`` is botocore's default chain (spec/credentials.md)."""
        chain = chain_from_config([])
        assert chain.names == ("aws-default",)
        assert isinstance(chain.sources[0], AwsDefaultSource)

    def test_the_spec_example_builds_the_chain_in_order(self) -> None:
        """The spec/config.md example gives env, file, vault, aws-default with every setting carried over."""
        chain = chain_from_config(FULL_EXAMPLE, environ={})
        assert chain.names == ("env", "file", "vault", "aws-default")
        file_source, vault = chain.sources[1], chain.sources[2]
        assert isinstance(file_source, FileSource)
        assert file_source.directory == Path("/var/run/secrets/s3")
        assert file_source.readable_by_others == "warn"
        assert isinstance(vault, VaultSource)
        assert (vault.address, vault.namespace, vault.mount, vault.path) == (
            "https://vault.example.internal:8200",
            "ml",
            "secret",
            "s3/team-a",
        )
        assert vault.ca_bundle == Path("/etc/ssl/certs/internal-ca.pem")
        assert (vault.fields.access_key_id, vault.fields.secret_access_key, vault.fields.session_token) == (
            "ak",
            "sk",
            "st",
        )
        assert vault.auth == KubernetesAuth(
            "ckpt-publisher", Path("/var/run/secrets/kubernetes.io/serviceaccount/token"), mount="k8s"
        )

    def test_defaults_fill_optional_keys(self) -> None:
        """Optional keys take spec/config.md's defaults: KV mount ``secret``, auth mounts named after the
        method."""
        chain = chain_from_config([_vault(), _approle(role_id="rid", secret_id_file="/run/sid")])
        kube, approle = chain.sources
        assert isinstance(kube, VaultSource)
        assert isinstance(approle, VaultSource)
        assert kube.mount == "secret"
        assert kube.auth == KubernetesAuth("ckpt-publisher")
        assert approle.auth == AppRoleAuth(role_id="rid", secret_id_file=Path("/run/sid"))

    def test_a_kind_listed_twice_is_named_by_its_table(self) -> None:
        """Two sources of one kind get names that say which table they come from."""
        chain = chain_from_config(
            [{"source": "file", "dir": "/a"}, {"source": "env"}, {"source": "file", "dir": "/b"}], environ={}
        )
        assert chain.names == ("file (credentials[0])", "env", "file (credentials[2])")

    def test_the_env_source_reads_the_given_environment(self) -> None:
        """``environ`` is what the env source reads."""
        chain = chain_from_config(
            [{"source": "env", "access_key_id_var": "K", "secret_access_key_var": "S"}],
            environ={"K": "AKIDCFG", "S": SECRET},
        )
        assert chain.fetch().access_key_id == "AKIDCFG"

    def test_plain_http_is_accepted_for_loopback_or_when_allowed(self) -> None:
        """Loopback http and an explicit allow_insecure_http are accepted (nothing is contacted)."""
        chain = chain_from_config(
            [
                _vault(address="http://127.0.0.1:8200"),
                _vault(address="http://localhost:8200"),
                _vault(address="http://vault.example:8200", allow_insecure_http=True),
            ]
        )
        assert len(chain.sources) == 3

    @pytest.mark.parametrize(
        ("tables", "key"), [(t, k) for _, t, k in INVALID], ids=[i for i, _, _ in INVALID]
    )
    def test_invalid_tables_are_refused_naming_the_key(
        self, tables: list[Mapping[str, object]], key: str
    ) -> None:
        """Unknown keys, wrong types and missing required keys raise ConfigError with the full key path."""
        with pytest.raises(ConfigError) as info:
            chain_from_config(tables, environ={})
        assert info.value.key == key, str(info.value)
        assert isinstance(info.value, InvalidError)
        with pytest.raises(ConfigError) as again:
            validate_credentials_config(tables)
        assert again.value.key == key

    def test_a_secret_of_the_wrong_type_is_not_echoed(self) -> None:
        """A wrongly typed AppRole secret id is refused without printing it."""
        with pytest.raises(ConfigError) as info:
            chain_from_config([_approle(role_id="r", secret_id=["TOPSECRET-SECRET-ID"])])
        assert info.value.key == "credentials[0].auth.secret_id"
        assert "TOPSECRET" not in str(info.value)

    def test_a_vault_source_repr_hides_approle_secrets(self) -> None:
        """AppRole ids given as values never show in a repr."""
        chain = chain_from_config([_approle(role_id="ROLEID-4242", secret_id="SECRETID-4242")])
        assert "SECRETID-4242" not in repr(chain)
        assert "ROLEID-4242" not in repr(chain)
