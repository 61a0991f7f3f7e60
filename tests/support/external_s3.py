"""An S3 server a site already runs, as the target of the store contract and the exclusive-create probes.

An operator qualifies a server (MinIO, SeaweedFS, a gateway) before trusting ``ckpt`` to it by pointing the
tests at it with four variables (docs/s3-servers.md):

``CKPT_TEST_S3_ENDPOINT``
    its URL, e.g. ``http://10.0.0.5:9000``;
``CKPT_TEST_S3_BUCKET``
    an existing bucket the tests may write to; every test works under a fresh prefix of its own
    (``ckpt-test-<hex>/``) and deletes it afterwards;
``CKPT_TEST_S3_KEY`` and ``CKPT_TEST_S3_SECRET``
    the key pair to sign with (the secret is never printed).

``CKPT_TEST_S3_REGION`` is optional (``us-east-1``). With the variables set, the store contract runs once
more on that server (harness ``s3-external``) and ``tests/test_s3_external.py`` probes its exclusive create
there; without them, that module probes the session's Ceph RGW through the same code, so the option itself
is tested in CI. CI (``CKPT_NO_SKIPS=1``) accepts only a loopback endpoint: this repository's tests never
leave the machine.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest

from ckpt.adapters.s3 import S3Store, make_s3_client
from ckpt.config import Config, S3Settings

VARIABLES = ("CKPT_TEST_S3_ENDPOINT", "CKPT_TEST_S3_BUCKET", "CKPT_TEST_S3_KEY", "CKPT_TEST_S3_SECRET")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class ExternalS3Error(ValueError):
    """The variables that point the tests at an external server are incomplete or not allowed here."""


@attrs.frozen(slots=True)
class ExternalS3:
    """Where and how to reach the server; the secret is kept out of ``repr``."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str = attrs.field(repr=False)
    region: str = "us-east-1"

    @property
    def environ(self) -> dict[str, str]:
        """The environment the ``env`` credential source reads these keys from."""
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}

    def config(self) -> Config:
        """The configuration a site would write for this server (path style, short timeouts)."""
        settings = S3Settings(
            endpoint_url=self.endpoint, region=self.region, addressing_style="path",
            connect_timeout=5.0, read_timeout=30.0, max_attempts=3,
        )  # fmt: skip
        return Config(s3=settings, credentials=({"source": "env"},))

    def client(self) -> Any:
        """A client built as ``ckpt`` builds one (``make_s3_client``), signing with these keys."""
        return make_s3_client(self.config(), self.environ)


def from_environ(environ: Mapping[str, str], *, ci: bool) -> ExternalS3 | None:
    """Return the external server the variables name, ``None`` when ``CKPT_TEST_S3_ENDPOINT`` is unset.

    Raises :class:`ExternalS3Error` naming what is missing or wrong; under CI (``ci``) a non-loopback host.
    """
    endpoint = environ.get("CKPT_TEST_S3_ENDPOINT", "")
    if not endpoint:
        return None
    missing = [name for name in VARIABLES if not environ.get(name)]
    if missing:
        absent = ", ".join(missing)
        raise ExternalS3Error(f"CKPT_TEST_S3_ENDPOINT is set but {absent} is not (all four are needed)")
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        raise ExternalS3Error(f"CKPT_TEST_S3_ENDPOINT {endpoint!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise ExternalS3Error(f"CKPT_TEST_S3_ENDPOINT {endpoint!r} must be an http:// or https:// URL")
    if ci and host not in LOOPBACK:
        raise ExternalS3Error(
            f"CKPT_TEST_S3_ENDPOINT {endpoint!r} is not on this machine; CI (CKPT_NO_SKIPS=1) tests "
            "loopback servers only"
        )
    return ExternalS3(
        endpoint, environ["CKPT_TEST_S3_BUCKET"], environ["CKPT_TEST_S3_KEY"], environ["CKPT_TEST_S3_SECRET"],
        environ.get("CKPT_TEST_S3_REGION") or "us-east-1",
    )  # fmt: skip


def allow_endpoint(client: Any, endpoint: str) -> Any:
    """Make ``client`` refuse any request to a host other than ``endpoint``'s; return it."""
    allowed = urlsplit(endpoint).hostname

    def guard(request: Any, **_: Any) -> None:
        if urlsplit(request.url).hostname != allowed:
            raise AssertionError(f"a test S3 client tried to reach {request.url}; only {allowed} is allowed")

    client.meta.events.register_last("before-send", guard)
    return client


def new_prefix() -> str:
    """A fresh prefix for one test in the shared bucket."""
    return f"ckpt-test-{uuid.uuid4().hex[:16]}"


def delete_prefix(client: Any, bucket: str, prefix: str) -> None:
    """Delete every object under ``prefix/`` (what one test wrote)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{prefix}/"):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", ())]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys, "Quiet": True})


def external_harness(request: pytest.FixtureRequest, _tmp: Any) -> Iterator[Any]:
    """The contract harness on the external server: root ``s3://<bucket>/<fresh prefix>``."""
    from support.s3 import S3Harness

    target: ExternalS3 = request.getfixturevalue("external_s3")
    client = allow_endpoint(target.client(), target.endpoint)
    prefix = new_prefix()
    store = S3Store(f"s3://{target.bucket}/{prefix}", client)
    try:
        yield S3Harness("s3-external", store, client, client)
    finally:
        delete_prefix(client, target.bucket, prefix)
