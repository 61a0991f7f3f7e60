"""A prune killed at every removal boundary of a save: nothing hands that save out again (issue 19, case 2).

For every built-in rule's layout (``lightning`` twice: a sharded folder and a single ``.ckpt`` file) and one
configured rule (``[[frameworks]]``), on POSIX and on S3 (moto's server and Ceph RGW over HTTP): two complete
saves are published, and ``prune(keep=1)`` runs in a child process that SIGKILLs itself at removal boundary
``i`` of the older save, for every ``i`` from 0 (the entry removed, no file yet) to ``n`` (every file and
folder removed, the journal not yet dropped). POSIX counts each ``unlink`` and ``rmdir`` (``n`` = files +
folders); S3 each key of the batched ``DeleteObjects``, which the child cuts to the keys before ``i``. After
each kill:

* ``ckpt watch --once`` over that execution's folder publishes nothing, ``ckpt resume`` and
  ``ckpt resolve --framework X`` print the newer save, and the entries hold the newer save's only;
* then ``ckpt prune --keep 1`` finishes the removal: the older save is gone and no journal is left.

One kill point more, before any entry is removed (the journal written): the older entry is still there and
its save whole; once the newer save is rotated away, ``ckpt resolve --framework X`` must skip the older one
as ``being removed by a prune``, for every layout on both stores.

The children are forked by ``support.killed_prune``, which imports ckpt and botocore once (a fresh interpreter
per child would cost about 1.5 s each on S3); each is a separate process that dies by a real SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.application.checkpoint_store import CheckpointStore
from ckpt.domain.journal import JOURNAL_PREFIX
from ckpt.domain.rules import BUILTIN, Rule, builtin_rule, parse_custom_rules
from support.rule_layouts import verdict, zip_bytes
from support.s3 import new_bucket_name, raw_client

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
ATTEMPT = "3.4103.0"
EXEC = f"exec/{ATTEMPT}"
EPOCH = 7
OLDER, NEWER = 10, 20
CUSTOM = {"name": "mytrainer", "pattern": "ckpt_{step}", "kind": "folder", "required": ["DONE"]}
ZIP = zip_bytes(40)


@attrs.frozen
class RuleLayout:
    """One rule's two saves: the files of the saves location holding both (older and newer complete)."""

    framework: str
    older: str  # the older save's name in the saves location
    newer: str
    files: Mapping[str, bytes]

    @property
    def single_file(self) -> bool:
        return self.older in self.files


def _folder_saves(framework: str, name: str, content: Mapping[str, bytes], **beside: bytes) -> RuleLayout:
    files = dict(beside)
    for step in (OLDER, NEWER):
        files.update({f"{name.format(step=step)}/{path}": data for path, data in content.items()})
    return RuleLayout(framework, name.format(step=OLDER), name.format(step=NEWER), files)


LAYOUTS: dict[str, RuleLayout] = {
    "hf": _folder_saves(
        "hf", "checkpoint-{step}", {"model.safetensors": b"m" * 16, "trainer_state.json": b"{}"}
    ),
    "dcp": _folder_saves("dcp", "step-{step}", {".metadata": b"md", "__0_0.distcp": b"s" * 16}),
    "lightning-folder": _folder_saves(
        "lightning", "epoch=0-step={step}.ckpt", {".metadata": b"md", "meta.pt": ZIP}
    ),
    "lightning-file": RuleLayout(
        "lightning",
        f"epoch=0-step={OLDER}.ckpt",
        f"epoch=0-step={NEWER}.ckpt",
        {f"epoch=0-step={OLDER}.ckpt": ZIP, f"epoch=0-step={NEWER}.ckpt": ZIP},
    ),
    "deepspeed": _folder_saves(
        "deepspeed", "global_step{step}", {"mp_rank_00_model_states.pt": ZIP}, latest=b"global_step20"
    ),
    "megatron": _folder_saves(
        "megatron", "iter_{step:07d}", {".metadata": b"md"}, **{"latest_checkpointed_iteration.txt": b"20"}
    ),
    "nemo": _folder_saves("nemo", "run--step={step}", {"context.yaml": b"model: x", "weights.bin": b"w"}),
    "orbax": _folder_saves(
        "orbax", "{step}", {"_CHECKPOINT_METADATA": b"{}", "commit_success.txt": b"Checkpoint commit"}
    ),
    "configured": _folder_saves("mytrainer", "ckpt_{step}", {"DONE": b"", "weights.bin": b"w" * 16}),
}


def rule_of(layout: RuleLayout) -> Rule:
    if layout.framework == CUSTOM["name"]:
        return parse_custom_rules([CUSTOM], BUILTIN)[0]
    rule = builtin_rule(layout.framework)
    assert rule is not None
    return rule


def boundaries(layout: RuleLayout, store: str) -> int:
    """How many removals the older save takes: POSIX files and folders, S3 keys (a single file: one)."""
    if layout.single_file:
        return 1
    paths = [p for p in layout.files if p.startswith(f"{layout.older}/")]
    if store == "s3":
        return len(paths)
    folders = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    return len(paths) + len(folders)


class TestLayouts:
    @pytest.mark.parametrize("name", sorted(LAYOUTS))
    def test_both_saves_are_complete_under_their_rule(self, name: str) -> None:
        """Each layout holds two saves its rule finds complete (else the kill rounds would prove nothing)."""
        layout = LAYOUTS[name]
        rule = rule_of(layout)
        assert verdict(rule, layout.files, layout.older) == (True, None)
        assert verdict(rule, layout.files, layout.newer) == (True, None)


# -- the rounds ---------------------------------------------------------------------------------------------


class Runner:
    """The forking process of ``support.killed_prune``: one request a line, one answer a line."""

    def __init__(self, endpoint: str) -> None:
        # Nothing of ckpt's, the scheduler's, AWS's or a proxy's environment reaches the children.
        dropped = ("CKPT_", "DISPATCH_", "AWS_", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(dropped)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "support.killed_prune", *([endpoint] if endpoint else [])],
            cwd=TESTS, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        assert self.process.stdout.readline() == "ready\n"

    def run(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0
        self.process.stdout.close()


@attrs.frozen
class Place:
    """Where a round runs: a store kind, its root, its config file, and how to look at what is there."""

    store: str
    root: str
    config: Path
    client: Any = None
    bucket: str = ""
    prefix: str = ""
    path: Path | None = None

    def open(self) -> CheckpointStore:
        """This test's own view of the root (to arrange the entries and read them back)."""
        if self.path is not None:
            return PosixStore(self.root)
        return S3Store(self.root, self.client)

    def put(self, files: Mapping[str, bytes]) -> None:
        for rel, data in files.items():
            if self.path is not None:
                target = self.path / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            else:
                self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}{rel}", Body=data)

    def remaining(self, save: str) -> int:
        """How many of the save's removals are still to come: its files and folders, or its keys."""
        if self.path is not None:
            top = self.path / save
            if top.is_file():
                return 1
            return 0 if not top.exists() else 1 + sum(1 for _ in top.rglob("*"))
        answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}{save}")
        return sum(1 for o in answer.get("Contents", ()) if o["Key"] in self._save_keys(save, answer))

    def _save_keys(self, save: str, answer: Any) -> set[str]:
        keys = {o["Key"] for o in answer.get("Contents", ())}
        exact = f"{self.prefix}{save}"
        return {k for k in keys if k == exact or k.startswith(exact + "/")}

    def journals(self) -> list[str]:
        if self.path is not None:
            return sorted(p.name for p in self.path.iterdir() if p.name.startswith(JOURNAL_PREFIX))
        answer = self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}{JOURNAL_PREFIX}")
        return sorted(o["Key"] for o in answer.get("Contents", ()))


@pytest.fixture(scope="module")
def posix_runner() -> Iterator[Runner]:
    runner = Runner("")
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def s3_runner(s3_server: str) -> Iterator[Runner]:
    runner = Runner(s3_server)
    yield runner
    runner.close()


def _config(tmp_path: Path, endpoint: str | None) -> Path:
    config = tmp_path / "ckpt.toml"
    text = ""
    if endpoint is not None:
        text += (
            f'[s3]\nendpoint_url = "{endpoint}"\nregion = "us-east-1"\naddressing_style = "path"\n'
            "connect_timeout = 2\nread_timeout = 10\nmax_attempts = 2\n"
            '[[credentials]]\nsource = "env"\n'
        )
    text += f'[[frameworks]]\nname = "{CUSTOM["name"]}"\npattern = "{CUSTOM["pattern"]}"\n'
    text += f'kind = "folder"\nrequired = {json.dumps(CUSTOM["required"])}\n'
    config.write_text(text)
    return config


def _round(runner: Runner, place: Place, layout: RuleLayout, kill_at: int) -> list[str]:
    """One kill point: arrange, publish both saves, kill the prune at ``kill_at``, check; return problems."""
    problems: list[str] = []
    place.put({f"{EXEC}/{path}": data for path, data in layout.files.items()})
    older, newer = f"{place.root}/{EXEC}/{layout.older}", f"{place.root}/{EXEC}/{layout.newer}"
    base = ["--config", str(place.config), "--root", place.root]

    def ckpt(*argv: str) -> dict[str, Any]:
        return runner.run({"op": "cli", "argv": [*base, *argv]})

    store = place.open()
    for step, location in ((OLDER, older), (NEWER, newer)):
        store.publish(EPOCH, step, location)
    prune = {"op": "prune", "store": place.store, "root": place.root, "keep": 1, "kill_at": kill_at}
    killed = runner.run(prune)
    assert (killed["status"], killed["signal"]) == (-9, 9), killed  # the kill point lies in this prune
    n = boundaries(layout, place.store)
    left = place.remaining(f"{EXEC}/{layout.older}")
    if left != n - kill_at:
        problems.append(f"killed at {kill_at} of {n}: {left} removals left, expected {n - kill_at}")
    framework = ["--framework", layout.framework]
    where = ["--attempt", ATTEMPT, "--epoch", str(EPOCH)]
    watched = ckpt("watch", *framework, *where, "--once", "--settle", "0")
    resumed = ckpt("resume", *framework, *where, "--settle", "0")
    resolved = ckpt("resolve", *framework)
    if [(e.step, store.location(e)) for e in store.entries()] != [(NEWER, newer)]:
        problems.append(f"killed at {kill_at}: the entries are {store.entries()}")
    for what, answer, expected in (
        ("watch --once", watched, None),
        ("resume", resumed, f"{newer}\n"),
        ("resolve --framework", resolved, f"{newer}\n"),
    ):
        if answer["status"] != 0 or (expected is not None and answer["stdout"] != expected):
            shown = f"exit {answer['status']} out {answer['stdout']!r} err {answer['stderr'][-400:]!r}"
            problems.append(f"killed at {kill_at}: {what}: {shown}")
    finished = ckpt("prune", "--keep", "1")
    if finished["status"] != 0:
        problems.append(f"killed at {kill_at}: the next prune failed: {finished['stderr']!r}")
    left, journals = place.remaining(f"{EXEC}/{layout.older}"), place.journals()
    if left or journals:
        problems.append(
            f"killed at {kill_at}: after the next prune {left} removals are left, journals {journals}"
        )
    return problems


def _rotate_away(place: Place, layout: RuleLayout) -> None:
    """Remove the newer save, as a framework's own retention does (``save_total_limit``). NeMo sets the
    save's ``-unfinished`` marker before it removes a checkpoint; the marker is what this leaves (a NeMo
    save whose folder is gone altogether passes the rule in a verified resolve: a separate defect)."""
    save = f"{EXEC}/{layout.newer}"
    if layout.framework == "nemo":
        place.put({f"{save}-unfinished": b""})
        return
    if place.path is not None:
        target = place.path / save
        if target.is_file():
            target.unlink()
        else:
            shutil.rmtree(target)
        return
    answer = place.client.list_objects_v2(Bucket=place.bucket, Prefix=f"{place.prefix}{save}")
    for key in place._save_keys(save, answer):
        place.client.delete_object(Bucket=place.bucket, Key=key)


def _round_before_entries(runner: Runner, place: Place, layout: RuleLayout) -> list[str]:
    """Kill point -1: the journal is written, no entry removed. The newer save is then rotated away: the
    older entry is still there and its save whole, yet verified resolve must not return it."""
    place.put({f"{EXEC}/{path}": data for path, data in layout.files.items()})
    older, newer = f"{place.root}/{EXEC}/{layout.older}", f"{place.root}/{EXEC}/{layout.newer}"
    store = place.open()
    store.publish(EPOCH, OLDER, older)
    store.publish(EPOCH, NEWER, newer)
    prune = {"op": "prune", "store": place.store, "root": place.root, "keep": 1, "kill_at": -1}
    killed = runner.run(prune)
    assert (killed["status"], killed["signal"]) == (-9, 9), killed
    assert len(place.journals()) == 1
    _rotate_away(place, layout)
    base = ["--config", str(place.config), "--root", place.root]
    resolved = runner.run({"op": "cli", "argv": [*base, "resolve", "--framework", layout.framework]})
    problems: list[str] = []
    if resolved["stdout"] or resolved["status"] == 0 or "being removed by a prune" not in resolved["stderr"]:
        problems.append(f"resolve --framework after the rotation: {resolved}")
    finished = runner.run({"op": "cli", "argv": [*base, "prune", "--keep", "1"]})
    left, journals = place.remaining(f"{EXEC}/{layout.older}"), place.journals()
    if finished["status"] != 0 or left or journals:
        problems.append(f"the next prune: {finished}, {left} removals left, journals {journals}")
    return problems


class TestKilledPrune:
    @pytest.mark.parametrize("name", sorted(LAYOUTS))
    def test_posix_no_kill_point_hands_the_older_save_out(
        self, name: str, posix_runner: Runner, tmp_path: Path
    ) -> None:
        """On POSIX, at every unlink/rmdir boundary of the older save, a restarted watcher, resume and a
        verified resolve never hand it out, and the next prune finishes the removal."""
        layout = LAYOUTS[name]
        config = _config(tmp_path, None)
        problems: list[str] = []
        for kill_at in range(boundaries(layout, "posix") + 1):
            root = tmp_path / f"root-{kill_at}"
            root.mkdir()
            problems += _round(posix_runner, Place("posix", str(root), config, path=root), layout, kill_at)
        assert problems == []

    # Every layout on moto; on RGW the layouts whose batched delete differs in shape (several files, one file
    # with a marker beside it, a single file): the kill points are the client's, the deletes the server's.
    @pytest.mark.parametrize(
        ("s3_server", "name"),
        [("moto", name) for name in sorted(LAYOUTS)]
        + [("rgw", name) for name in ("deepspeed", "hf", "lightning-file")],
        indirect=["s3_server"],
    )
    def test_s3_no_kill_point_hands_the_older_save_out(
        self, name: str, s3_runner: Runner, s3_server: str, tmp_path: Path
    ) -> None:
        """On S3 (moto's server and Ceph RGW over HTTP, each in turn), at every key of the batched delete
        of the older save, a restarted watcher, resume and a verified resolve never hand it out, and the
        next prune finishes."""
        layout = LAYOUTS[name]
        config = _config(tmp_path, s3_server)
        client = raw_client(s3_server)
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        problems: list[str] = []
        for kill_at in range(boundaries(layout, "s3") + 1):
            prefix = f"run-{kill_at}/"
            place = Place("s3", f"s3://{bucket}/run-{kill_at}", config, client, bucket, prefix)
            problems += _round(s3_runner, place, layout, kill_at)
        assert problems == []

    def test_killed_before_the_entries_go_the_whole_older_save_is_never_resolved(
        self, posix_runner: Runner, tmp_path: Path
    ) -> None:
        """Killed after its journal and before any entry is removed, then the newer save rotated away: for
        every layout, a verified resolve skips the older entry as being removed (its save is whole and
        would pass), and the next prune finishes the removal. On POSIX."""
        problems: list[str] = []
        config = _config(tmp_path, None)
        for name, layout in sorted(LAYOUTS.items()):
            root = tmp_path / f"root-{name}"
            root.mkdir()
            place = Place("posix", str(root), config, path=root)
            problems += _round_before_entries(posix_runner, place, layout)
        assert problems == []

    def test_s3_killed_before_the_entries_go_the_whole_older_save_is_never_resolved(
        self, s3_runner: Runner, s3_server: str, tmp_path: Path
    ) -> None:
        """The same on S3 (moto's server and Ceph RGW over HTTP, each in turn)."""
        problems: list[str] = []
        config = _config(tmp_path, s3_server)
        client = raw_client(s3_server)
        bucket = new_bucket_name()
        client.create_bucket(Bucket=bucket)
        for name, layout in sorted(LAYOUTS.items()):
            place = Place("s3", f"s3://{bucket}/{name}", config, client, bucket, f"{name}/")
            problems += _round_before_entries(s3_runner, place, layout)
        assert problems == []
