"""``ckpt pin``, ``ckpt unpin``, pinned entries in ``ckpt entries``, and ``ckpt prune --keep-every`` as real
processes: output, --json documents, exit codes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name, parse_entry_name
from support.s3 import new_bucket_name, raw_client
from test_cli_s3 import KEYS, run, write_config

ENTRY_KEYS = {"epoch", "step", "save", "location", "name"}


def ckpt(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    env["DISPATCH_EPOCH"] = "999"  # never used by pin/unpin: they take --epoch explicitly
    return subprocess.run(
        [sys.executable, "-m", "ckpt", "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A root with entries at epoch 1, steps 1000, 1500, 2000, 2500, 3000."""
    r = tmp_path / "root"
    r.mkdir()
    pub = r / "pub"
    pub.mkdir()
    for step in (1000, 1500, 2000, 2500, 3000):
        (r / "exec" / "a" / f"ck-{step}").mkdir(parents=True)
        (pub / format_entry_name(Entry(1, step, f"exec/a/ck-{step}"))).touch()
    return r


def pins(root: Path) -> list[int]:
    return sorted(parse_entry_name(n).step for n in os.listdir(root / "pins"))


class TestPin:
    def test_pin_by_location_and_by_epoch_and_step(self, root: Path) -> None:
        """pin takes the save's location (absolute or relative), or --epoch and --step."""
        by_location = ckpt(root, "pin", f"{root}/exec/a/ck-1500")
        assert by_location.returncode == 0, by_location.stderr
        assert by_location.stdout == f"pinned: epoch 1 step 1500 {root}/exec/a/ck-1500\n"
        by_numbers = ckpt(root, "pin", "--epoch", "1", "--step", "2500")
        assert by_numbers.returncode == 0, by_numbers.stderr
        relative = ckpt(root, "pin", "exec/a/ck-1000")
        assert relative.returncode == 0, relative.stderr
        assert pins(root) == [1000, 1500, 2500]

    def test_pinning_twice_says_so_and_exits_0(self, root: Path) -> None:
        """A second pin is not an error; --json marks it as already pinned."""
        ckpt(root, "pin", "exec/a/ck-1500")
        again = ckpt(root, "--json", "pin", "exec/a/ck-1500")
        assert again.returncode == 0, again.stderr
        (document,) = json.loads(again.stdout)["pinned"]
        assert document["already_pinned"] is True
        assert set(document) == ENTRY_KEYS | {"already_pinned"}

    def test_pinning_what_is_not_published_exits_3(self, root: Path) -> None:
        """No published entry matches: one error line, exit 3, no pin."""
        result = ckpt(root, "pin", "--epoch", "1", "--step", "7")
        assert result.returncode == 3, result.stderr
        assert result.stderr.startswith("ckpt: ")
        assert len(result.stderr.splitlines()) == 1
        assert not (root / "pins").exists()

    @pytest.mark.parametrize("args", [[], ["--epoch", "1"], ["--step", "1000"]])
    def test_an_incomplete_selection_exits_2(self, root: Path, args: list[str]) -> None:
        """Without SAVE, both --epoch and --step are needed."""
        result = ckpt(root, "pin", *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("ckpt: ")


class TestUnpin:
    def test_unpin_twice_is_not_an_error(self, root: Path) -> None:
        """unpin removes the pin; a second unpin says there is none and exits 0."""
        ckpt(root, "pin", "exec/a/ck-1500")
        first = ckpt(root, "unpin", "--epoch", "1", "--step", "1500")
        assert first.returncode == 0, first.stderr
        assert first.stdout == f"unpinned: epoch 1 step 1500 {root}/exec/a/ck-1500\n"
        second = ckpt(root, "--json", "unpin", "exec/a/ck-1500")
        assert second.returncode == 0, second.stderr
        assert json.loads(second.stdout) == {"unpinned": []}
        assert pins(root) == []


# SAVE spellings publish refuses (operations.md §1.2); pin and unpin must refuse them the same way.
BAD_POSIX_SAVES = [
    "/etc/passwd",  # outside the root
    "exec/../x",  # a ".." element
    "exec/a/ck-1000/../ck-1500",  # ".." even where it would land on a published save
    "exec//a/ck-1000",  # an empty element
    "pub/x",  # inside the publication log, never a save
    "s3://some-bucket/exec/a/ck-1000",  # another store's form
]


class TestSaveIsCheckedAsPublishChecksIt:
    @pytest.mark.parametrize("command", ["publish", "pin", "unpin"])
    @pytest.mark.parametrize("save", BAD_POSIX_SAVES)
    def test_a_bad_save_exits_2_naming_it_before_anything_is_read(
        self, root: Path, command: str, save: str
    ) -> None:
        """pin and unpin refuse a SAVE publish refuses, with exit 2 and one line naming it, before any
        read: a malformed name in pub/ and in pins/ (exit 5 once read) does not get in the way."""
        pinned = format_entry_name(Entry(1, 1500, "exec/a/ck-1500"))
        (root / "pins").mkdir()
        (root / "pins" / pinned).touch()
        (root / "pins" / "junk").touch()
        (root / "pub" / "junk").touch()
        extra = ["--step", "1"] if command == "publish" else []
        result = ckpt(root, command, *extra, save)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        assert line.startswith("ckpt: save location "), line
        assert save in line, line
        assert sorted(os.listdir(root / "pins")) == sorted(["junk", pinned])
        assert result.stdout == ""


class TestEntries:
    def test_entries_show_which_are_pinned(self, root: Path) -> None:
        """Text lines of pinned entries end in ' (pinned)'; JSON documents carry "pinned"."""
        ckpt(root, "pin", "exec/a/ck-2000")
        text = ckpt(root, "entries").stdout.splitlines()
        assert text[2] == f"1 2000 {root}/exec/a/ck-2000 (pinned)"
        assert text[1] == f"1 1500 {root}/exec/a/ck-1500"
        documents = json.loads(ckpt(root, "--json", "entries").stdout)
        assert [d["pinned"] for d in documents] == [False, False, True, False, False]

    def test_a_malformed_pin_exits_5(self, root: Path) -> None:
        """A bad name in pins/ makes entries and prune exit 5 and removes nothing."""
        (root / "pins").mkdir()
        (root / "pins" / "junk").touch()
        entries = ckpt(root, "entries")
        assert entries.returncode == 5
        # Where the name was found, and why it is bad: not the words of a bad name in pub/.
        expected = "ckpt: malformed pin 'junk' in pins/: expected <20-digit"
        assert entries.stderr.startswith(expected), entries.stderr
        assert ckpt(root, "prune", "--keep", "1").returncode == 5
        assert len(os.listdir(root / "pub")) == 5

    @pytest.mark.parametrize("save", ["pins", "pins/x"])
    def test_an_entry_naming_the_pins_is_malformed_and_prune_removes_nothing(
        self, root: Path, save: str
    ) -> None:
        """A name in pub/ whose save is pins/ (or inside it) makes every command exit 5; pins/ survives.

        Found from outside: the bulk name parser let such a name through, and prune removed pins/ as the
        folder of the oldest entry, so the next prune deleted what the pins protected.
        """
        ckpt(root, "pin", "--epoch", "1", "--step", "1000")
        # format_entry_name refuses such a save; another port or an older version need not.
        bad = f"{0:020d}-{1:020d}-" + base64.b32encode(save.encode()).decode().rstrip("=")
        (root / "pub" / bad).touch()
        for command in (["entries"], ["resolve"], ["prune", "--keep", "1"]):
            result = ckpt(root, *command)
            assert result.returncode == 5, (command, result.stderr)
            assert bad in result.stderr
        assert pins(root) == [1000]
        assert len(os.listdir(root / "pub")) == 6

    @pytest.mark.parametrize("save", [".ckpt-prune-0123456789abcdef", ".ckpt-prune-0123456789abcdef.decided"])
    def test_a_save_named_like_a_prune_journal_is_refused_and_prune_removes_nothing(
        self, root: Path, save: str
    ) -> None:
        """names.md §1.1 rule 6. Found from outside: such a single-file save was published, then prune read it
        as an unfinished journal and deleted it while its entry stayed. Publishing it is refused now (exit
        2), and an entry naming it that another port wrote makes prune exit 5 with the file kept."""
        (root / save).write_bytes(b"model weights")
        refused = ckpt(root, "publish", "--epoch", "1", "--step", "5000", save)
        assert refused.returncode == 2, refused.stderr
        assert "starts with .ckpt-" in refused.stderr
        bad = f"{1:020d}-{5000:020d}-" + base64.b32encode(save.encode()).decode().rstrip("=")
        (root / "pub" / bad).touch()
        for command in (["entries"], ["prune", "--keep", "9"]):
            result = ckpt(root, *command)
            assert result.returncode == 5, (command, result.stderr)
            assert bad in result.stderr
        assert (root / save).read_bytes() == b"model weights"


class TestPruneTiers:
    def test_dry_run_shows_each_kept_entry_with_its_reasons(self, root: Path) -> None:
        """--keep 1 --keep-every 1000 with a pin: each kept entry is listed with why; nothing changes."""
        ckpt(root, "pin", "exec/a/ck-1500")
        result = ckpt(root, "prune", "--keep", "1", "--keep-every", "1000", "--dry-run")
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == [
            f"kept entry: epoch 1 step 1000 {root}/exec/a/ck-1000 (every 1000)",
            f"kept entry: epoch 1 step 1500 {root}/exec/a/ck-1500 (pinned)",
            f"kept entry: epoch 1 step 2000 {root}/exec/a/ck-2000 (every 1000)",
            f"kept entry: epoch 1 step 3000 {root}/exec/a/ck-3000 (latest 1, every 1000)",
            f"would remove entry: epoch 1 step 2500 {root}/exec/a/ck-2500",
            f"would remove folder: {root}/exec/a/ck-2500",
        ]
        assert len(os.listdir(root / "pub")) == 5

    def test_json_prune_reports_kept_reasons_and_removes_the_rest(self, root: Path) -> None:
        """The prune document lists every kept entry with "reasons"; the pinned folder stays."""
        ckpt(root, "pin", "exec/a/ck-1500")
        result = ckpt(root, "--json", "prune", "--keep", "1")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert [(k["step"], k["reasons"]) for k in document["kept"]] == [
            (1500, ["pinned"]),
            (3000, ["latest"]),
        ]
        assert [e["step"] for e in document["removed_entries"]] == [1000, 2000, 2500]
        assert (root / "exec" / "a" / "ck-1500").is_dir()
        assert not (root / "exec" / "a" / "ck-2000").exists()

    @pytest.mark.parametrize("every", ["0", "-1", "x", "1.5"])
    def test_bad_keep_every_exits_2(self, root: Path, every: str) -> None:
        """--keep-every must be a whole number >= 1."""
        result = ckpt(root, "prune", "--keep", "1", f"--keep-every={every}")
        assert result.returncode == 2, result.stderr
        assert len(os.listdir(root / "pub")) == 5


class TestOnS3:
    @pytest.mark.parametrize("command", ["pin", "unpin"])
    def test_a_bad_save_exits_2_naming_it_on_a_bucket(
        self, s3_server: str, tmp_path: Path, command: str
    ) -> None:
        """On s3://BUCKET/PREFIX, pin and unpin refuse every SAVE publish refuses, exit 2, naming it."""
        client = raw_client(s3_server)
        name = new_bucket_name()
        client.create_bucket(Bucket=name)
        root = f"s3://{name}/team-a"
        config = write_config(tmp_path / "ckpt.toml", root, s3_server)
        client.put_object(Bucket=name, Key="team-a/exec/a/ck-1/model.bin", Body=b"w")
        assert run(config, "publish", "--epoch", "1", "--step", "1", "exec/a/ck-1").returncode == 0
        assert run(config, "pin", "exec/a/ck-1").returncode == 0
        bad = [
            "/etc/passwd",
            "exec/../x",
            "exec/a/x/../ck-1",
            "pins/x",
            f"s3://{name}/elsewhere/exec/a/ck-1",
            f"s3://{new_bucket_name()}/team-a/exec/a/ck-1",
        ]
        for save in bad:
            result = run(config, command, save)
            assert result.returncode == 2, (save, result.stderr)
            (line,) = result.stderr.splitlines()
            assert line.startswith("ckpt: save location "), line
            assert save in line, line
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=name, Prefix="team-a/pins/")["Contents"]]
        assert keys == [f"team-a/pins/{format_entry_name(Entry(1, 1, 'exec/a/ck-1'))}"]

    def test_pin_entries_prune_tiers_unpin_and_follow_on_a_bucket(
        self, s3_server: str, tmp_path: Path
    ) -> None:
        """The same commands on s3://BUCKET/PREFIX through moto's server, from a config file."""
        client = raw_client(s3_server)
        name = new_bucket_name()
        client.create_bucket(Bucket=name)
        root = f"s3://{name}/team-a"
        config = write_config(tmp_path / "ckpt.toml", root, s3_server)
        for step in (1000, 1500, 2000, 2500):
            client.put_object(Bucket=name, Key=f"team-a/exec/a/ck-{step}/model.bin", Body=b"w")
            published = run(config, "publish", "--epoch", "1", "--step", str(step), f"exec/a/ck-{step}")
            assert published.returncode == 0, published.stderr
        pinned = run(config, "pin", "--epoch", "1", "--step", "1500")
        assert pinned.stdout == f"pinned: epoch 1 step 1500 {root}/exec/a/ck-1500\n", pinned.stderr
        assert f"1 1500 {root}/exec/a/ck-1500 (pinned)" in run(config, "entries").stdout.splitlines()
        pruned = json.loads(run(config, "--json", "prune", "--keep", "1", "--keep-every", "1000").stdout)
        assert [(k["step"], k["reasons"]) for k in pruned["kept"]] == [
            (1000, ["every"]),
            (1500, ["pinned"]),
            (2000, ["every"]),
            (2500, ["latest"]),
        ]
        assert pruned["removed_entries"] == []
        unpinned = run(config, "unpin", f"{root}/exec/a/ck-1500")
        assert unpinned.stdout == f"unpinned: epoch 1 step 1500 {root}/exec/a/ck-1500\n", unpinned.stderr
        after = json.loads(run(config, "--json", "prune", "--keep", "1", "--keep-every", "1000").stdout)
        assert [e["step"] for e in after["removed_entries"]] == [1500]
        keys = {obj["Key"] for obj in client.list_objects_v2(Bucket=name, Prefix="team-a/")["Contents"]}
        assert "team-a/exec/a/ck-1500/model.bin" not in keys
        assert f"team-a/pins/{format_entry_name(Entry(1, 1500, 'exec/a/ck-1500'))}" not in keys

        env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
        env.update(KEYS, PYTHONUNBUFFERED="1")
        follow = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ckpt",
                "--config",
                str(config),
                "follow",
                "--from-start",
                "--interval",
                "0.1",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert follow.stdout is not None
            lines = [follow.stdout.readline().rstrip("\n") for _ in range(3)]
            assert lines == [
                f"not-latest 1 1000 {root}/exec/a/ck-1000",
                f"not-latest 1 2000 {root}/exec/a/ck-2000",
                f"latest 1 2500 {root}/exec/a/ck-2500",
            ]
            follow.send_signal(signal.SIGTERM)
            _, err = follow.communicate(timeout=60)
            assert follow.returncode == 0, err
        finally:
            if follow.poll() is None:
                follow.kill()
                follow.communicate()
