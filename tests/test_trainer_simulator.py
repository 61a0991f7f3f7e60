"""The simulated trainer itself: both sinks leave exactly the plan's manifests, and a killed run resumes.

The watcher, crash and S3 suites judge ``ckpt`` against what the trainer says it wrote; this holds the trainer
to it. A folder and a bucket (on moto's server and on Ceph RGW) get the same plan, and each ends up holding,
for every save, exactly the names and bytes of :func:`support.trainer.manifest`, with one event format on
both.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path

from support import module_command, subprocess_env
from support.s3 import new_bucket_name, raw_client
from support.saves import read_files
from support.trainer import (
    BucketSink,
    FolderSink,
    SaveSpec,
    Trainer,
    complete_folders,
    manifest,
    mixed_plan,
    spec_at,
)


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _expected(specs: Iterable[SaveSpec]) -> dict[str, bytes]:
    """Every file the saves hold once written, by path under the saves location."""
    return {f"{spec.folder}/{name}": data for spec in specs for name, data in manifest(spec).items()}


def test_a_folder_holds_the_manifests_and_the_events_say_so(tmp_path: Path) -> None:
    """Every save of the mixed plans, in a folder: exactly its manifest; the events mark the complete ones."""
    for framework in ("hf", "dcp"):
        saves, events = tmp_path / framework, tmp_path / f"{framework}.jsonl"
        plan = mixed_plan(framework, 1)
        Trainer(FolderSink(saves), pace=0, events=events).run(plan)
        assert read_files(saves) == _expected(mixed_plan(framework, 1))
        written = [e for e in _events(events) if "written" in e]
        assert {e["save"] for e in written if e["complete"]} == complete_folders(plan)
        assert len(written) == len(plan)
        assert _events(events)[-1] == {"finished": True}


def test_a_bucket_holds_the_same_manifests(s3_server: str) -> None:
    """The same plans into a bucket, object by object: the same names and bytes, nothing left in staging."""
    client = raw_client(s3_server)
    for framework in ("hf", "dcp"):
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        Trainer(BucketSink(client, bucket, "exec/1"), pace=0).run(mixed_plan(framework, 1))
        objects = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="exec/1/"):
            for item in page.get("Contents", ()):
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                objects[item["Key"].removeprefix("exec/1/")] = body
        assert objects == _expected(mixed_plan(framework, 1))


def test_a_process_started_again_goes_on_after_the_last_save_it_began(tmp_path: Path) -> None:
    """Without ``--start``, a trainer process resumes after the last item its events file says it began."""
    saves, events = tmp_path / "saves", tmp_path / "events.jsonl"
    command = module_command("support.trainer", "folder", "--framework", "hf", "--plan", "endless")
    arguments = ["--saves", str(saves), "--events", str(events), "--pace", "0"]
    for count in ("2", "4"):
        subprocess.run([*command, *arguments, "--count", count], env=subprocess_env(), check=True, timeout=60)
    started = [e["index"] for e in _events(events) if "started" in e]
    assert started == [0, 1, 2, 3]
    assert read_files(saves) == _expected(spec_at("hf", i) for i in range(4))
