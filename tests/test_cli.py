"""The command line as a user runs it: real subprocesses, exit codes, --json documents, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckpt.domain.entries import Entry
from ckpt.domain.names import format_entry_name

ENTRY_KEYS = {"epoch", "step", "save", "location", "name"}


def ckpt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ckpt", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], code: int) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ckpt: ")
    assert "Traceback" not in result.stderr


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    r.mkdir()
    return r


def save(root: Path, rel: str) -> str:
    (root / rel).mkdir(parents=True)
    return rel


class TestResolve:
    def test_nothing_published_exits_3(self, root: Path) -> None:
        """resolve on an empty root exits 3 with one line on stderr."""
        assert_one_line_error(ckpt("--root", str(root), "resolve"), 3)

    def test_prints_the_latest_location(self, root: Path) -> None:
        """resolve prints the location of the greatest entry; the zombie's higher step loses."""
        ckpt("--root", str(root), "publish", "--epoch", "1", "--step", "900", save(root, "exec/a/ck-900"))
        ckpt("--root", str(root), "publish", "--epoch", "2", "--step", "100", save(root, "exec/b/ck-100"))
        result = ckpt("--root", str(root), "resolve")
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"{root}/exec/b/ck-100\n"

    def test_json_document(self, root: Path) -> None:
        """resolve --json prints one entry document."""
        ckpt("--root", str(root), "publish", "--epoch", "2", "--step", "100", save(root, "exec/b/ck-100"))
        document = json.loads(ckpt("--root", str(root), "--json", "resolve").stdout)
        assert document == {
            "epoch": 2,
            "step": 100,
            "save": "exec/b/ck-100",
            "location": f"{root}/exec/b/ck-100",
            "name": format_entry_name(Entry(2, 100, "exec/b/ck-100")),
        }

    def test_root_from_the_environment(self, root: Path) -> None:
        """CKPT_ROOT is the default root."""
        ckpt("--root", str(root), "publish", "--epoch", "2", "--step", "1", save(root, "exec/b/ck-1"))
        result = ckpt("resolve", env={"CKPT_ROOT": str(root)})
        assert result.stdout == f"{root}/exec/b/ck-1\n"

    def test_malformed_name_exits_5(self, root: Path) -> None:
        """A malformed name in pub/ exits 5 and the error names it."""
        (root / "pub").mkdir()
        (root / "pub" / "garbage.tmp").write_bytes(b"")
        result = ckpt("--root", str(root), "resolve")
        assert_one_line_error(result, 5)
        assert "garbage.tmp" in result.stderr

    def test_missing_root_exits_1(self, tmp_path: Path) -> None:
        """A root that does not exist is an operational failure (exit 1)."""
        assert_one_line_error(ckpt("--root", str(tmp_path / "absent"), "resolve"), 1)

    def test_no_root_is_a_usage_error(self) -> None:
        """Without --root, CKPT_ROOT or a config file, the command exits 2."""
        assert_one_line_error(ckpt("resolve"), 2)


class TestPublish:
    def test_publish_json_and_republish_exits_4(self, root: Path) -> None:
        """publish --json prints the entry; publishing it again exits 4."""
        rel = save(root, "exec/a/ck-1")
        first = ckpt("--root", str(root), "--json", "publish", "--epoch", "5", "--step", "1", rel)
        assert first.returncode == 0, first.stderr
        assert set(json.loads(first.stdout)) == ENTRY_KEYS
        again = ckpt("--root", str(root), "publish", "--epoch", "5", "--step", "1", str(root / rel))
        assert_one_line_error(again, 4)

    def test_epoch_from_dispatch_epoch(self, root: Path) -> None:
        """DISPATCH_EPOCH is the default epoch."""
        rel = save(root, "exec/a/ck-1")
        result = ckpt(
            "--root", str(root), "--json", "publish", "--step", "1", rel, env={"DISPATCH_EPOCH": "42"}
        )
        assert json.loads(result.stdout)["epoch"] == 42

    @pytest.mark.parametrize(
        "epoch", ["+1", " 1", "1 ", "1_0", "\u0661", "\uff11", "18446744073709551616", "-1", "", "0x10"]
    )
    def test_bad_epochs_exit_2(self, root: Path, epoch: str) -> None:
        """An epoch that is not plain ASCII digits fitting 64 bits is a usage error naming it."""
        rel = save(root, "exec/a/ck-1")
        result = ckpt("--root", str(root), "publish", f"--epoch={epoch}", "--step", "1", rel)
        assert_one_line_error(result, 2)
        assert "epoch" in result.stderr
        assert not (root / "pub").exists()

    def test_bad_step_exits_2(self, root: Path) -> None:
        """A bad step is a usage error."""
        rel = save(root, "exec/a/ck-1")
        assert_one_line_error(ckpt("--root", str(root), "publish", "--epoch", "1", "--step", "1.5", rel), 2)

    def test_missing_save_exits_2(self, root: Path) -> None:
        """A save that does not exist is an invalid argument (exit 2, spec/operations.md) and nothing is
        published."""
        assert_one_line_error(
            ckpt("--root", str(root), "publish", "--epoch", "1", "--step", "1", "exec/x"), 2
        )

    def test_save_outside_root_exits_2(self, root: Path, tmp_path: Path) -> None:
        """A save outside the root is an invalid argument (exit 2)."""
        result = ckpt("--root", str(root), "publish", "--epoch", "1", "--step", "1", str(tmp_path))
        assert_one_line_error(result, 2)


class TestEntriesPruneExecDir:
    def test_entries_text_and_json(self, root: Path) -> None:
        """entries prints '<epoch> <step> <location>' lines ascending, or a JSON list."""
        ckpt("--root", str(root), "publish", "--epoch", "2", "--step", "7", save(root, "exec/b/ck-7"))
        ckpt("--root", str(root), "publish", "--epoch", "1", "--step", "9", save(root, "exec/a/ck-9"))
        text = ckpt("--root", str(root), "entries").stdout.splitlines()
        assert text == [f"1 9 {root}/exec/a/ck-9", f"2 7 {root}/exec/b/ck-7"]
        documents = json.loads(ckpt("--root", str(root), "--json", "entries").stdout)
        assert [(d["epoch"], d["step"]) for d in documents] == [(1, 9), (2, 7)]
        assert all(set(d) == ENTRY_KEYS | {"pinned"} for d in documents)  # entries also says "pinned"

    def test_prune_dry_run_then_prune(self, root: Path) -> None:
        """prune --dry-run reports without changing anything; prune removes entries and folders."""
        for step in (1, 2, 3):
            ckpt(
                "--root",
                str(root),
                "publish",
                "--epoch",
                "1",
                "--step",
                str(step),
                save(root, f"exec/a/ck-{step}"),
            )
        dry = json.loads(ckpt("--root", str(root), "--json", "prune", "--keep", "1", "--dry-run").stdout)
        assert dry["dry_run"] is True
        assert [e["step"] for e in dry["removed_entries"]] == [1, 2]
        assert (root / "exec/a/ck-1").exists()
        real = json.loads(ckpt("--root", str(root), "--json", "prune", "--keep", "1").stdout)
        assert set(real) == {
            "dry_run",
            "kept",
            "removed_entries",
            "restored_entries",
            "removed_folders",
            "skipped",
        }
        assert real["dry_run"] is False
        assert sorted(real["removed_folders"]) == [f"{root}/exec/a/ck-1", f"{root}/exec/a/ck-2"]
        assert not (root / "exec/a/ck-1").exists()
        assert (root / "exec/a/ck-3").exists()

    @pytest.mark.parametrize("keep", ["0", "-1", "x", "1.0"])
    def test_prune_bad_keep_exits_2(self, root: Path, keep: str) -> None:
        """--keep must be a whole number >= 1."""
        assert_one_line_error(ckpt("--root", str(root), "prune", f"--keep={keep}"), 2)

    def test_exec_dir(self, root: Path) -> None:
        """exec-dir prints <root>/exec/<attempt>, from --attempt or DISPATCH_ATTEMPT."""
        assert (
            ckpt("--root", str(root), "exec-dir", "--attempt", "2.4102.0").stdout == f"{root}/exec/2.4102.0\n"
        )
        result = ckpt("--root", str(root), "--json", "exec-dir", env={"DISPATCH_ATTEMPT": "3.1.0"})
        assert json.loads(result.stdout) == {"location": f"{root}/exec/3.1.0"}

    @pytest.mark.parametrize("attempt", ["..", ".", "a/b", ""])
    def test_bad_attempts_exit_2(self, root: Path, attempt: str) -> None:
        """An attempt that is not one path element is a usage error."""
        assert_one_line_error(ckpt("--root", str(root), "exec-dir", f"--attempt={attempt}"), 2)


class TestUsage:
    def test_unknown_command_exits_2(self) -> None:
        """An unknown command is a one-line usage error."""
        assert_one_line_error(ckpt("frobnicate"), 2)

    def test_bad_config_key_exits_2_naming_it(self, root: Path, tmp_path: Path) -> None:
        """An unknown key in the configuration file is a usage error naming the key."""
        config = tmp_path / "ckpt.toml"
        config.write_text('[s3]\nregion = "x"\nbogus = 1\n')
        result = ckpt("--root", str(root), "--config", str(config), "resolve")
        assert_one_line_error(result, 2)
        assert "s3.bogus" in result.stderr


class TestDemo:
    def test_demo_tells_the_story_and_exits_0(self) -> None:
        """ckpt demo runs end to end: the zombie loses, a republish is refused, prune keeps what's needed."""
        result = ckpt("demo")
        assert result.returncode == 0, result.stderr
        assert "The zombie's step 900 loses" in result.stdout
        assert "refused: already published" in result.stdout
        assert result.stdout.rstrip().endswith("always wins.")
        assert "exec/2.4102.0/checkpoint-700" in result.stdout.splitlines()[-3]

    def test_demo_on_s3_runs_against_an_embedded_server(self) -> None:
        """ckpt demo --s3 tells the same story on an s3:// root served by moto on loopback."""
        result = ckpt("demo", "--s3")
        assert result.returncode == 0, result.stderr
        assert "resolve -> s3://ckpt-demo/team-a/run-42/exec/2.4102.0/checkpoint-700" in result.stdout
        assert "refused: already published" in result.stdout


def ckpt_bytes(*args: str | bytes, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Like :func:`ckpt`, with arguments and output as bytes (for paths that are not UTF-8)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_"))}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "ckpt", *args], capture_output=True, env=full_env, timeout=60, check=False
    )


class TestHostileArguments:
    @pytest.mark.parametrize("keep", ["9" * 5000, "18446744073709551616", "\u0661", "+1", " 1"])
    def test_prune_keep_out_of_range_is_one_line_exit_2(self, root: Path, keep: str) -> None:
        """--keep with thousands of digits, beyond 64 bits or not ASCII digits: exit 2, no traceback."""
        result = ckpt("--root", str(root), "prune", f"--keep={keep}")
        assert_one_line_error(result, 2)
        assert "--keep" in result.stderr

    @pytest.mark.parametrize("option", ["--epoch", "--step"])
    @pytest.mark.parametrize("value", ["inf", "nan", "-1", "1e3", "9" * 5000])
    def test_publish_numbers_that_are_not_counts_exit_2(self, root: Path, option: str, value: str) -> None:
        """--epoch and --step refuse inf, nan, negative, exponent and huge values with one line (exit 2)."""
        rel = save(root, "exec/a/ck-1")
        numbers = {"--epoch": "1", "--step": "1", option: value}
        result = ckpt("--root", str(root), "publish", *(f"{k}={v}" for k, v in numbers.items()), rel)
        assert_one_line_error(result, 2)
        assert not (root / "pub").exists()

    @pytest.mark.parametrize("option", ["--root", "--config"])
    def test_an_empty_root_or_config_is_refused_not_taken_as_absent(self, root: Path, option: str) -> None:
        """`--root "$UNSET"` must not fall through to CKPT_ROOT: a prune would empty another root."""
        for step in ("1", "2"):
            rel = save(root, f"exec/a/ck-{step}")
            assert ckpt("--root", str(root), "publish", "--epoch", "1", "--step", step, rel).returncode == 0
        args = ["--root", str(root), option, "", "prune", "--keep", "1"]
        if option == "--root":
            args = args[2:]
        result = ckpt(*args, env={"CKPT_ROOT": str(root)})
        assert_one_line_error(result, 2)
        assert f"argument {option}: is empty" in result.stderr
        assert len(list((root / "pub").iterdir())) == 2  # nothing pruned

    def test_config_that_is_not_utf8_exits_2(self, root: Path, tmp_path: Path) -> None:
        """A configuration file that is not UTF-8 is a configuration error naming the file (exit 2)."""
        config = tmp_path / "ckpt.toml"
        config.write_bytes(b'root = "/x"\n# caf\xe9\n')
        result = ckpt("--root", str(root), "--config", str(config), "resolve")
        assert_one_line_error(result, 2)
        assert "not valid UTF-8" in result.stderr
        assert str(config) in result.stderr

    @pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
    def test_config_that_is_a_device_is_refused_at_once(self, root: Path, device: str) -> None:
        """--config /dev/zero would be read forever: anything but a regular file is refused (exit 2)."""
        result = ckpt("--root", str(root), "--config", device, "resolve")
        assert_one_line_error(result, 2)
        assert "not a regular file" in result.stderr

    def test_config_that_is_a_fifo_is_refused_without_blocking(self, root: Path, tmp_path: Path) -> None:
        """A FIFO nobody writes to would block a plain open; it is refused instead (exit 2)."""
        fifo = tmp_path / "ckpt.toml"
        os.mkfifo(fifo)
        result = ckpt("--root", str(root), "--config", str(fifo), "resolve")
        assert_one_line_error(result, 2)
        assert "not a regular file" in result.stderr

    def test_config_larger_than_the_cap_is_refused(self, root: Path, tmp_path: Path) -> None:
        """A configuration file beyond MAX_CONFIG_BYTES is refused, naming the limit."""
        from ckpt.config import MAX_CONFIG_BYTES

        config = tmp_path / "ckpt.toml"
        config.write_bytes(b"# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
        result = ckpt("--root", str(root), "--config", str(config), "resolve")
        assert_one_line_error(result, 2)
        assert f"larger than {MAX_CONFIG_BYTES} bytes" in result.stderr

    @pytest.mark.parametrize("key", ["connect_timeout", "read_timeout", "refresh_seconds"])
    @pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e300"])
    def test_s3_timing_that_cannot_be_waited_for_exits_2(
        self, root: Path, tmp_path: Path, key: str, value: str
    ) -> None:
        """[s3] timings of inf, nan or beyond any wait are refused at load, naming the key (exit 2)."""
        config = tmp_path / "ckpt.toml"
        config.write_text(f'root = "s3://bucket-name/run"\n[s3]\n{key} = {value}\n')
        result = ckpt("--config", str(config), "resolve")
        assert_one_line_error(result, 2)
        assert f"s3.{key}" in result.stderr

    @pytest.mark.parametrize(
        "endpoint",
        [
            "ftp://objects.example:21",
            "https://objects.example:99999",
            "https://objects.example:0",
            "https://objects.example:port",
            "https://",
            "https://:9000",
            "objects.example:9000",
            "https://objects.example/?x=1",
            "https://objects.example/#frag",
            "https://objects.example /",
        ],
    )
    def test_endpoint_url_that_cannot_work_exits_2(self, tmp_path: Path, endpoint: str) -> None:
        """An endpoint URL that cannot work is a configuration error naming the key (exit 2), not exit 1."""
        config = tmp_path / "ckpt.toml"
        config.write_text(f'root = "s3://bucket-name/run"\n[s3]\nendpoint_url = "{endpoint}"\n')
        result = ckpt("--config", str(config), "resolve")
        assert_one_line_error(result, 2)
        assert "s3.endpoint_url" in result.stderr

    def test_endpoint_url_user_info_is_refused_and_redacted(self, tmp_path: Path) -> None:
        """User-info in the endpoint URL is refused; its password never reaches the output."""
        config = tmp_path / "ckpt.toml"
        config.write_text(
            'root = "s3://bucket-name/run"\n[s3]\nendpoint_url = "https://alice:hunter2-secret@s3.example"\n'
        )
        result = ckpt("--config", str(config), "resolve")
        assert_one_line_error(result, 2)
        assert "s3.endpoint_url" in result.stderr
        assert "hunter2-secret" not in result.stderr + result.stdout
        assert "***@s3.example" in result.stderr

    @pytest.mark.parametrize("option", ["--root", "--config"])
    def test_a_newline_in_a_path_cannot_split_or_forge_the_error_line(
        self, tmp_path: Path, option: str
    ) -> None:
        """A root or config path holding a newline stays on the one error line, escaped."""
        hostile = str(tmp_path / "absent\nckpt: forged line")
        args = [option, hostile] + (["--root", str(tmp_path)] if option == "--config" else [])
        result = ckpt(*args, "resolve")
        assert_one_line_error(result, 1 if option == "--root" else 2)
        assert "absent\\nckpt: forged line" in result.stderr

    def test_a_root_that_is_not_utf8_gives_valid_json_and_raw_text(self, tmp_path: Path) -> None:
        """--json output is valid UTF-8 JSON for a root that is not UTF-8; text gives its bytes back."""
        root = os.fsencode(tmp_path) + b"/r\xff"
        os.makedirs(root + b"/exec/a/ck-1")
        published = ckpt_bytes("--root", root, "publish", "--epoch", "1", "--step", "1", "exec/a/ck-1")
        assert published.returncode == 0, published.stderr
        document = json.loads(ckpt_bytes("--root", root, "--json", "resolve").stdout.decode("utf-8"))
        assert document["location"] == os.fsdecode(root + b"/exec/a/ck-1")
        entries = ckpt_bytes("--root", root, "--json", "entries").stdout.decode("utf-8")
        assert json.loads(entries)[0]["location"] == os.fsdecode(root + b"/exec/a/ck-1")
        text = ckpt_bytes("--root", root, "resolve")
        assert text.returncode == 0, text.stderr
        assert text.stdout == root + b"/exec/a/ck-1\n"

    def test_json_log_lines_are_valid_utf8_for_a_root_that_is_not(self, tmp_path: Path) -> None:
        """--log-format json log lines (the watcher's) stay valid UTF-8 JSON with a non-UTF-8 root."""
        root = os.fsencode(tmp_path) + b"/r\xff"
        os.makedirs(root + b"/exec/a")
        result = ckpt_bytes(
            "--root", root, "--log-format", "json", "watch", "--framework", "dcp", "--attempt", "a",
            "--epoch", "1", "--once",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = [json.loads(line.decode("utf-8")) for line in result.stderr.splitlines()]
        assert any(os.fsdecode(root) in line["message"] for line in lines)


class TestGlobalOptionsAfterTheCommand:
    """cli.md §2.4: the global options are accepted after the command as well, the later one winning."""

    def test_root_and_json_after_the_command(self, root: Path) -> None:
        """``publish ... --root R`` and ``entries --json --root R`` act on R as they do before the command."""
        rel = save(root, "exec/a/ck-5")
        published = ckpt("publish", "--epoch", "1", "--step", "5", rel, "--root", str(root))
        assert published.returncode == 0, published.stderr
        listed = ckpt("entries", "--json", "--root", str(root))
        assert listed.returncode == 0, listed.stderr
        found = [(e["epoch"], e["step"], e["save"]) for e in json.loads(listed.stdout)]
        assert found == [(1, 5, "exec/a/ck-5")]

    def test_the_option_after_the_command_wins(self, tmp_path: Path, root: Path) -> None:
        """Given before and after the command, the value after it is the one used."""
        other = tmp_path / "other"
        other.mkdir()
        ckpt("--root", str(root), "publish", "--epoch", "1", "--step", "7", save(root, "exec/a/ck-7"))
        after = ckpt("--root", str(other), "resolve", "--root", str(root))
        assert (after.returncode, after.stdout) == (0, f"{root}/exec/a/ck-7\n"), after.stderr
        before_only = ckpt("--root", str(other), "resolve")
        assert_one_line_error(before_only, 3)

    def test_an_option_left_out_after_the_command_keeps_the_one_before(self, root: Path) -> None:
        """``--json`` before the command still holds when the command repeats only ``--root``."""
        result = ckpt("--json", "entries", "--root", str(root))
        assert (result.returncode, json.loads(result.stdout)) == (0, [])

    def test_an_empty_root_after_the_command_is_a_usage_error(self, root: Path) -> None:
        """``--root ''`` after the command is refused as before it (cli.md §2.1), never taken as absent."""
        result = ckpt("--root", str(root), "entries", "--root", "", env={"CKPT_ROOT": str(root)})
        assert_one_line_error(result, 2)
        assert "argument --root: is empty" in result.stderr

    def test_log_options_after_the_command_are_checked(self, root: Path) -> None:
        """A bad ``--log-level`` after the command is a usage error naming the option."""
        result = ckpt("entries", "--root", str(root), "--log-level", "loud")
        assert_one_line_error(result, 2)
        assert "argument --log-level: invalid choice: 'loud'" in result.stderr
