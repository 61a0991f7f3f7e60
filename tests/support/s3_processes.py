"""Code the S3 tests run in child processes: racing publishers and a pruner, and the trainer's S3 client.

Children are started with multiprocessing's ``spawn`` method, so each one imports this module afresh: it
imports only ``ckpt`` and botocore (never moto or pytest, which would cost a second of start-up per child).
Every child builds its store the way ``ckpt`` itself does (``open_s3_store`` from a ``Config``), signing with
fake keys, against a loopback endpoint only. A worker never raises: it puts what happened on a results queue,
one outcome per attempt, so that the parent can count winners and collect failures.

Workers build their store and send a first request, then wait on a shared barrier, so that all of them hit
the storage at once.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SAVE_FILES",
    "PruneJob",
    "PruneReport",
    "PublishJob",
    "PublishNewSavesJob",
    "direct_client",
    "missing_objects",
    "prune_repeatedly",
    "publish_names",
    "publish_new_saves",
]

# The fake keys every child signs with; they only ever travel to 127.0.0.1.
FAKE_ENVIRON: Mapping[str, str] = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
# The objects of every save the prune race writes: the check after each prune looks for all of them.
SAVE_FILES: dict[str, bytes] = {"model.safetensors": b"w" * 64, "optimizer.pt": b"o" * 32, ".metadata": b"m"}


def _isolate() -> None:
    """Drop ambient AWS settings from this child's environment (config files, CA bundle, profiles)."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        del os.environ[name]
    os.environ["AWS_CONFIG_FILE"] = os.devnull
    os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
    os.environ["AWS_EC2_METADATA_DISABLED"] = "true"


def direct_client(endpoint: str, *, max_attempts: int = 3) -> Any:
    """A plain botocore S3 client straight to ``endpoint`` (path style, fake keys, no proxy, no ~/.aws)."""
    import botocore.config
    import botocore.session

    if not endpoint.startswith("http://127.0.0.1:"):
        raise ValueError(f"only loopback endpoints are allowed here, not {endpoint!r}")
    return botocore.session.Session().create_client(
        "s3",
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id=FAKE_ENVIRON["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=FAKE_ENVIRON["AWS_SECRET_ACCESS_KEY"],
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            retries={"total_max_attempts": max_attempts, "mode": "standard"},
            proxies={},
            connect_timeout=5,
            read_timeout=30,
        ),
    )


def _store(endpoint: str, root: str) -> Any:
    """The store ``ckpt`` itself would open for ``root`` with ``[s3] endpoint_url = endpoint``."""
    from ckpt.adapters.s3 import open_s3_store
    from ckpt.config import Config, S3Settings

    _isolate()
    settings = S3Settings(
        endpoint_url=endpoint,
        region="us-east-1",
        addressing_style="path",
        connect_timeout=5.0,
        read_timeout=30.0,
        max_attempts=3,
    )
    config = Config(s3=settings, credentials=({"source": "env"},))
    return open_s3_store(root, config=config, environ=FAKE_ENVIRON)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"


# -- publishers racing for the same names -----------------------------------------------------------------


@dataclass(frozen=True)
class PublishJob:
    """What one racing publisher publishes: ``(epoch, step, save)`` triples, in the order given."""

    endpoint: str
    root: str
    entries: tuple[tuple[int, int, str], ...]


def publish_names(job: PublishJob, ready: Any, results: Any) -> None:
    """Publish every entry of ``job`` once all publishers are ready; put ``(entry, outcome)`` pairs on
    ``results``, outcome ``"created"``, ``"exists"``, or the text of any other error."""
    from ckpt.domain.errors import ExistsError

    store = _store(job.endpoint, job.root)
    store.entries()  # a first request now: connection and credentials are ready before the race
    ready.wait(60)
    outcomes: list[tuple[tuple[int, int, str], str]] = []
    for epoch, step, save in job.entries:
        try:
            store.publish(epoch, step, f"{store.root}/{save}")
        except ExistsError as exc:
            outcome = "exists" if exc.entry.key == (epoch, step, save) else f"wrong entry: {exc.entry}"
        except Exception as exc:
            outcome = _describe(exc)
        else:
            outcome = "created"
        outcomes.append(((epoch, step, save), outcome))
    results.put(outcomes)


# -- publishers of new saves, and a pruner, racing ---------------------------------------------------------


@dataclass(frozen=True)
class PublishNewSavesJob:
    """A publisher that writes ``count`` new saves (``SAVE_FILES``) under ``exec/w<worker>/`` and publishes
    each at ``(epoch, step)``, its steps rising and interleaving with the other publishers'."""

    endpoint: str
    root: str
    bucket: str
    worker: int
    count: int
    epoch: int


def publish_new_saves(job: PublishNewSavesJob, ready: Any, results: Any) -> None:
    """Write and publish ``job.count`` new saves once everyone is ready; put ``(published, errors)``."""
    store = _store(job.endpoint, job.root)
    client = direct_client(job.endpoint)
    store.entries()
    ready.wait(60)
    rng = random.Random(job.worker)
    published: list[tuple[int, int, str]] = []
    errors: list[str] = []
    for i in range(job.count):
        step = 10 * i + job.worker
        save = f"exec/w{job.worker}/checkpoint-{step}"
        try:
            for name, data in SAVE_FILES.items():
                client.put_object(Bucket=job.bucket, Key=f"{store.prefix}{save}/{name}", Body=data)
            store.publish(job.epoch, step, f"{store.root}/{save}")
        except Exception as exc:
            errors.append(f"{save}: {_describe(exc)}")
        else:
            published.append((job.epoch, step, save))
        time.sleep(rng.uniform(0.0, 0.02))
    results.put((published, errors))


@dataclass(frozen=True)
class PruneJob:
    """A pruner that runs ``prune(keep)`` until told to stop, then once more, checking after every one."""

    endpoint: str
    root: str
    bucket: str
    keep: int


@dataclass(frozen=True)
class PruneReport:
    """What the pruner saw: prunes run, entries and folders removed, and every broken invariant."""

    prunes: int
    removed_entries: tuple[tuple[int, int, str], ...]
    removed_folders: int
    violations: tuple[str, ...]
    errors: tuple[str, ...]


def missing_objects(client: Any, bucket: str, prefix: str, saves: list[str]) -> list[str]:
    """Return ``save: missing files`` for each save in ``saves`` that lacks one of ``SAVE_FILES``."""
    broken: list[str] = []
    for save in saves:
        key_prefix = f"{prefix}{save}/"
        answer = client.list_objects_v2(Bucket=bucket, Prefix=key_prefix)
        present = {obj["Key"][len(key_prefix) :] for obj in answer.get("Contents", ())}
        if missing := sorted(set(SAVE_FILES) - present):
            broken.append(f"{save}: missing {missing}")
    return broken


def prune_repeatedly(job: PruneJob, ready: Any, stop: Any, results: Any) -> None:
    """Prune until ``stop`` is set, then once more; after every prune, check each remaining entry's save."""
    store = _store(job.endpoint, job.root)
    client = direct_client(job.endpoint)
    prunes = removed_folders = 0
    removed: list[tuple[int, int, str]] = []
    violations: list[str] = []
    errors: list[str] = []
    ready.wait(60)
    last = False
    while not last:
        last = stop.is_set()
        try:
            result = store.prune(job.keep)
            # Only this process deletes, and publishers only add whole saves, so an entry listed now must
            # have a whole save when the check reads it.
            remaining = [entry.save for entry in store.entries()]
        except Exception as exc:
            errors.append(_describe(exc))
            continue
        prunes += 1
        removed += [entry.key for entry in result.removed_entries]
        removed_folders += len(result.removed_folders)
        violations += missing_objects(client, job.bucket, store.prefix, remaining)
    results.put(PruneReport(prunes, tuple(removed), removed_folders, tuple(violations), tuple(errors)))
