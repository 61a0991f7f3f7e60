"""``ckpt watch`` as a real process: arguments, output, exit codes, signals, and kill-and-restart rounds."""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.catchup import EPOCH_RECORD, WORLD_SIZE_RECORD
from ckpt.domain.names import format_entry_name
from ckpt.domain.saves import MAX_READ_BYTES
from support import module_command, subprocess_env
from support.silent_endpoint import silent_endpoint, silent_s3_config
from support.trainer import complete_folders, mixed_plan

CKPT = [sys.executable, "-m", "ckpt"]
TRAINER = module_command("support.trainer", "folder")
ATTEMPT = "2.4102.0"
EPOCH = "2000000"
STATE = b'{"global_step": 5}'
WATCH_DCP = ("watch", "--framework", "dcp", "--interval", "0.1")


def environment(**extra: str) -> dict[str, str]:
    """The environment of a ckpt process: ours, minus ckpt's own variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_", "AWS_"))}
    env.update({"DISPATCH_EPOCH": EPOCH, "DISPATCH_ATTEMPT": ATTEMPT, "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def ckpt(root: Path | str, *args: str, env: dict[str, str] | None = None, timeout: float = 30) -> Any:
    """Run ``ckpt --root ROOT ARGS`` to the end; return the completed process (text)."""
    return subprocess.run(
        [*CKPT, "--root", str(root), *args],
        capture_output=True,
        text=True,
        env=env or environment(),
        timeout=timeout,
        check=False,
    )


def make_hf_save(root: Path, name: str, state: bytes = STATE) -> Path:
    folder = root / "exec" / ATTEMPT / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    (folder / "trainer_state.json").write_bytes(state)
    return folder


def pub_names(root: Path) -> list[str]:
    pub = root / "pub"
    return sorted(os.listdir(pub)) if pub.is_dir() else []


class Watching:
    """A ckpt process (``ARGS`` after ``--root ROOT``) whose stderr is read line by line as it runs."""

    def __init__(self, root: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [*CKPT, "--root", str(root), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or environment(),
        )
        self.lines: list[str] = []
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            if " watching " in line:
                self._started.set()

    def wait_started(self, timeout: float = 20) -> None:
        assert self._started.wait(timeout), f"ckpt watch did not start: {self.lines}"

    def finish(self, timeout: float = 20) -> tuple[int, str]:
        """Wait for the process; return its exit code and stdout (small: one JSON document at most)."""
        code = self.process.wait(timeout=timeout)
        self._reader.join(5)
        assert self.process.stdout is not None
        out = self.process.stdout.read()
        self._close()
        return code, out

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=20)
        self._reader.join(5)
        self._close()

    def _close(self) -> None:
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


@pytest.fixture
def spawn(root: Path) -> Iterator[Any]:
    """Start ``ckpt watch`` processes on ``root``; any still running at the end of the test is killed."""
    started: list[Watching] = []

    def start(*args: str) -> Watching:
        watching = Watching(root, *args)
        started.append(watching)
        return watching

    yield start
    for watching in started:
        watching.kill()


class TestOnce:
    def test_json_document(self, root: Path) -> None:
        """``--once --json`` prints {"published": [entry...]} with every field of an entry, in step order."""
        make_hf_save(root, "checkpoint-20")
        make_hf_save(root, "checkpoint-5")
        make_hf_save(root, "checkpoint-best")
        result = ckpt(root, "--json", "watch", "--framework", "hf", "--once", "--settle", "0.2")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        store = PosixStore(str(root))
        expected = [
            {
                "epoch": int(EPOCH),
                "step": entry.step,
                "save": entry.save,
                "location": store.location(entry),
                "name": format_entry_name(entry),
            }
            for entry in store.entries()
        ]
        assert document == {"published": expected}
        assert [e["step"] for e in document["published"]] == [5, 20]
        assert expected[0]["location"] == str(root / "exec" / ATTEMPT / "checkpoint-5")

    def test_nothing_to_publish(self, root: Path) -> None:
        """With nothing complete, ``--once --json`` prints an empty list and exits 0."""
        (root / "exec" / ATTEMPT / "step-1").mkdir(parents=True)
        result = ckpt(root, "--json", "watch", "--framework", "dcp", "--once")
        assert (result.returncode, json.loads(result.stdout)) == (0, {"published": []})

    def test_one_log_line_per_publication(self, root: Path) -> None:
        """Each publication is one log line on stderr; stdout stays empty without --json."""
        make_hf_save(root, "checkpoint-1")
        make_hf_save(root, "checkpoint-2")
        result = ckpt(root, "watch", "--framework", "hf", "--once", "--settle", "0")
        assert result.returncode == 0, result.stderr
        assert result.stdout == ""
        published = [line for line in result.stderr.splitlines() if " info published " in line]
        assert len(published) == 2
        assert (
            f" info published epoch={EPOCH} step=1 location={root}/exec/{ATTEMPT}/checkpoint-1 "
            in published[0]
        )

    def test_json_log_lines(self, root: Path) -> None:
        """With --log-format json, each publication is a JSON line carrying the entry's fields."""
        make_hf_save(root, "checkpoint-3")
        result = ckpt(root, "--log-format", "json", "watch", "--framework", "hf", "--once", "--settle", "0")
        assert result.returncode == 0, result.stderr
        records = [json.loads(line) for line in result.stderr.splitlines()]
        published = [r for r in records if r["message"] == "published"]
        assert len(published) == 1
        assert (published[0]["epoch"], published[0]["step"]) == (int(EPOCH), 3)
        assert published[0]["location"] == f"{root}/exec/{ATTEMPT}/checkpoint-3"

    def test_arguments_beat_the_environment(self, root: Path) -> None:
        """--epoch and --attempt override DISPATCH_EPOCH and DISPATCH_ATTEMPT."""
        folder = root / "exec" / "other" / "step-4"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m")
        result = ckpt(
            root, "--json", "watch", "--framework", "dcp", "--once", "--attempt", "other", "--epoch", "9"
        )
        assert result.returncode == 0, result.stderr
        (entry,) = json.loads(result.stdout)["published"]
        assert (entry["epoch"], entry["step"], entry["save"]) == (9, 4, "exec/other/step-4")

    @pytest.mark.parametrize("form", ["relative", "absolute"])
    def test_saves_location(self, root: Path, form: str) -> None:
        """--saves watches another folder, given relative to the root or as an absolute path."""
        folder = root / "runs" / "job" / "step-8"
        folder.mkdir(parents=True)
        (folder / ".metadata").write_bytes(b"m")
        saves = "runs/job" if form == "relative" else str(root / "runs" / "job")
        result = ckpt(root, "--json", "watch", "--framework", "dcp", "--once", "--saves", saves)
        assert result.returncode == 0, result.stderr
        assert [e["save"] for e in json.loads(result.stdout)["published"]] == ["runs/job/step-8"]


def large_trainer_state(records: int) -> bytes:
    """A ``trainer_state.json`` as the Trainer writes it (``json.dumps(indent=2)`` and a newline), built by
    repeating one ``log_history`` record so that tens of MB cost no JSON encoding."""
    record = b'    {\n      "epoch": 0.5,\n      "loss": 1.25,\n      "step": 1\n    },\n'
    last = b'    {\n      "epoch": 0.5,\n      "loss": NaN,\n      "step": 2\n    }\n'
    return b'{\n  "global_step": 7,\n  "log_history": [\n' + record * (records - 1) + last + b"  ]\n}\n"


class TestLargeTrainerState:
    def test_a_state_over_the_read_cap_is_judged_by_its_ends(self, root: Path) -> None:
        """A ``trainer_state.json`` over 64 MiB (a long run logging every step) is published when whole and
        never when cut short; verified resolve agrees. Found from outside: such a save was "not a JSON
        object" forever, so the watcher never published it and resume restarted the run from step 0.
        """
        assert json.loads(large_trainer_state(3))["global_step"] == 7  # the builder writes real JSON
        state = large_trainer_state(1_000_000)
        assert len(state) > MAX_READ_BYTES
        make_hf_save(root, "checkpoint-7", state)
        make_hf_save(root, "checkpoint-9", state[: len(state) - 9])  # killed while writing it
        result = ckpt(root, "--json", "watch", "--framework", "hf", "--once", "--settle", "0")
        assert result.returncode == 0, result.stderr
        assert [e["step"] for e in json.loads(result.stdout)["published"]] == [7]
        # Published by hand, the cut save is passed over by verified resolve, with the reason.
        assert ckpt(root, "publish", "--step", "9", f"exec/{ATTEMPT}/checkpoint-9").returncode == 0
        resolved = ckpt(root, "resolve", "--framework", "hf")
        assert resolved.returncode == 0, resolved.stderr
        assert resolved.stdout == f"{root}/exec/{ATTEMPT}/checkpoint-7\n"
        assert f"trainer_state.json is {len(state) - 9} bytes, too large to parse" in resolved.stderr


class TestEpochRecord:
    """The sidecar records its execution's epoch (spec/layout.md §8), so a later catch-up knows it."""

    def test_watching_an_attempt_records_its_epoch(self, root: Path) -> None:
        """Before the first scan, even with nothing saved yet: exec/<attempt>/.ckpt-epoch holds the epoch."""
        result = ckpt(root, "watch", "--framework", "hf", "--once", "--settle", "0")
        assert result.returncode == 0, result.stderr
        assert (root / "exec" / ATTEMPT / EPOCH_RECORD).read_bytes() == f"{EPOCH}\n".encode()

    def test_watching_with_a_world_size_records_it_beside_the_epoch(self, root: Path) -> None:
        """--world-size 2: exec/<attempt>/.ckpt-world-size holds 2 (spec/layout.md §8.5); without a world
        size (no --world-size, no WORLD_SIZE) none is written: unknown stays unknown."""
        env = {k: v for k, v in environment().items() if k != "WORLD_SIZE"}
        assert ckpt(root, "watch", "--framework", "dcp", "--once", env=env).returncode == 0
        assert not (root / "exec" / ATTEMPT / WORLD_SIZE_RECORD).exists()
        args = ("--framework", "hf", "--once", "--settle", "0", "--world-size", "2")
        result = ckpt(root, "watch", *args, env=env)
        assert result.returncode == 0, result.stderr
        assert (root / "exec" / ATTEMPT / WORLD_SIZE_RECORD).read_bytes() == b"2\n"

    def test_a_lower_record_is_kept(self, root: Path) -> None:
        """A folder that already records a lower epoch keeps it: that is the safe epoch for its saves."""
        (root / "exec" / ATTEMPT).mkdir(parents=True)
        (root / "exec" / ATTEMPT / EPOCH_RECORD).write_bytes(b"3\n")
        assert ckpt(root, "watch", "--framework", "hf", "--once", "--settle", "0").returncode == 0
        assert (root / "exec" / ATTEMPT / EPOCH_RECORD).read_bytes() == b"3\n"

    def test_saves_folder_records_nothing(self, root: Path) -> None:
        """--saves names no execution: nothing is recorded anywhere."""
        (root / "runs").mkdir()
        assert ckpt(root, "watch", "--framework", "dcp", "--once", "--saves", "runs").returncode == 0
        assert sorted(p.name for p in root.rglob("*")) == ["runs"]

    def test_a_record_that_cannot_be_written_is_a_warning(self, root: Path) -> None:
        """exec/<attempt> is a file: one warning naming the folder, and the sidecar still runs (exit 0)."""
        (root / "exec").mkdir()
        (root / "exec" / ATTEMPT).write_bytes(b"not a folder")
        result = ckpt(root, "watch", "--framework", "hf", "--once", "--settle", "0")
        assert result.returncode == 0, result.stderr
        warnings = [line for line in result.stderr.splitlines() if " warning cannot record epoch " in line]
        assert len(warnings) == 1, result.stderr
        assert f"exec/{ATTEMPT}" in warnings[0]


class TestArguments:
    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["--interval", "0"], "--interval '0' must be greater than 0"),
            (["--interval", "-1"], "--interval '-1' is not a number of seconds"),
            (["--interval", "1e3"], "--interval '1e3' is not a number of seconds"),
            (["--interval", "inf"], "--interval 'inf' is not a number of seconds"),
            (["--settle", "nan"], "--settle 'nan' is not a number of seconds"),
            (["--settle", "ten"], "--settle 'ten' is not a number of seconds"),
            (["--scan-timeout", "0"], "--scan-timeout '0' must be greater than 0"),
            (["--interval", "99999999999999999999"], "--interval '99999999999999999999' is more than"),
            (["--settle", "99999999999999999999"], "--settle '99999999999999999999' is more than"),
            (["--scan-timeout", "9999999999.5"], "--scan-timeout '9999999999.5' is more than"),
            (["--interval", "9" * 5000], "--interval '99999"),
            (["--epoch", "9" * 5000], "does not fit in 64 bits"),
            (["--epoch", "-5"], "epoch '-5' is not a decimal number"),
            (["--attempt", ".."], "attempt '..'"),
            (["--saves", "pub"], "save 'pub' is pub/ or inside it"),
            (["--saves", "/elsewhere/exec/a"], "--saves '/elsewhere/exec/a' is not under the root"),
            (["--saves", "exec/../pub"], "has a '.' or '..' path element"),
        ],
    )
    def test_invalid_values_exit_2(self, root: Path, args: list[str], message: str) -> None:
        """An invalid value is one ``ckpt:`` line naming it, and exit 2."""
        result = ckpt(root, "watch", "--framework", "hf", "--once", *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.startswith("ckpt: ")
        assert message in result.stderr
        assert "Traceback" not in result.stderr

    # exec/<attempt>/checkpoint-18446744073709551615, the longest hf save, must fit in the 133 bytes an entry
    # name carries: an attempt of 96 bytes leaves room, one of 97 does not (spec/names.md §4.5).
    @pytest.mark.parametrize(
        ("args", "shown"),
        [
            (["--attempt", "a" * 97], "attempt 'aaaa"),
            (["--attempt", "a" * 120], "attempt 'aaaa"),  # exec/<attempt>/x fits: the old check let it in
            (["--attempt", "\u00e9" * 49], "attempt '\u00e9\u00e9"),  # 98 bytes in 49 characters
            (["--saves", "exec/" + "s" * 97], "--saves 'exec/ssss"),
            (["--saves", "/ROOT/exec/" + "s" * 97], "--saves '/ROOT/exec/ssss"),
        ],
    )
    def test_a_folder_too_long_for_the_rules_longest_save_exits_2_at_start_up(
        self, root: Path, args: list[str], shown: str
    ) -> None:
        """Refused before anything is written, naming the folder, the longest save name and the limit, even
        with a complete save already there: not at its publication."""
        args = [arg.replace("/ROOT", str(root)) for arg in args]
        for attempt in ("a" * 120, "s" * 97):  # a complete save the watch would otherwise try to publish
            folder = root / "exec" / attempt / "checkpoint-500"
            folder.mkdir(parents=True)
            (folder / "trainer_state.json").write_bytes(STATE)
        result = ckpt(root, "watch", "--framework", "hf", "--once", "--settle", "0", *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("ckpt: " + shown.replace("/ROOT", str(root))), result.stderr
        assert "is too long for hf saves" in result.stderr
        assert "'checkpoint-18446744073709551615'" in result.stderr
        assert "at most 133 bytes" in result.stderr
        assert pub_names(root) == []
        assert sorted(p.name for p in (root / "exec").iterdir()) == ["a" * 120, "s" * 97]
        assert not any((root / "exec").glob(f"*/{EPOCH_RECORD}"))  # no epoch record either

    def test_the_rules_own_longest_name_decides(self, root: Path) -> None:
        """The same attempt is refused for deepspeed (global_step<20 digits>) and accepted for orbax (the
        20 digits alone): each rule is held to its own longest save name."""
        attempt = "a" * 100  # exec/<100>/ is 106 bytes: 27 left
        refused = ckpt(root, "watch", "--framework", "deepspeed", "--once", "--attempt", attempt)
        assert refused.returncode == 2, refused.stderr
        assert "'global_step18446744073709551615'" in refused.stderr
        assert "is 137 bytes" in refused.stderr
        accepted = ckpt(root, "watch", "--framework", "orbax", "--once", "--attempt", attempt)
        assert accepted.returncode == 0, accepted.stderr

    def test_an_attempt_with_room_starts_and_its_longest_save_publishes(self, root: Path) -> None:
        """The boundary: exec/<96 bytes>/checkpoint-18446744073709551615 is exactly 133 bytes, so the watch
        starts and publishes that save."""
        attempt = "b" * 96
        folder = root / "exec" / attempt / "checkpoint-18446744073709551615"
        folder.mkdir(parents=True)
        (folder / "trainer_state.json").write_bytes(STATE)
        result = ckpt(root, "watch", "--framework", "hf", "--once", "--attempt", attempt, "--settle", "0")
        assert result.returncode == 0, result.stderr
        assert [e.save for e in PosixStore(str(root)).entries()] == [
            f"exec/{attempt}/checkpoint-18446744073709551615"
        ]

    def test_fractions_are_allowed(self, root: Path) -> None:
        """Seconds may be fractions, such as 0.05 or .5."""
        result = ckpt(
            root,
            "watch",
            "--framework",
            "hf",
            "--once",
            "--interval",
            "0.05",
            "--settle",
            ".05",
            "--scan-timeout",
            "2.5",
        )
        assert result.returncode == 0, result.stderr

    @pytest.mark.parametrize(
        ("drop", "message"), [("DISPATCH_ATTEMPT", "nothing to watch"), ("DISPATCH_EPOCH", "no epoch")]
    )
    def test_missing_defaults_exit_2(self, root: Path, drop: str, message: str) -> None:
        """Without --attempt/--saves or --epoch and without their variables, watch refuses with exit 2."""
        env = environment()
        del env[drop]
        result = ckpt(root, "watch", "--framework", "dcp", "--once", env=env)
        assert result.returncode == 2
        assert message in result.stderr

    @pytest.mark.parametrize(
        "args",
        [
            ["--framework", "pytorch", "--once"],
            ["--once"],
            ["--framework", "hf", "--attempt", "a", "--saves", "exec/a", "--once"],
        ],
    )
    def test_usage_errors_exit_2(self, root: Path, args: list[str]) -> None:
        """A bad or missing --framework, or --attempt with --saves, is a usage error (exit 2)."""
        result = ckpt(root, "watch", *args)
        assert result.returncode == 2
        assert result.stderr.startswith("ckpt: ")


class TestFailures:
    def test_malformed_log_exits_5(self, root: Path) -> None:
        """A malformed name in pub/ ends the watch at its first scan with exit 5 and one line."""
        (root / "pub").mkdir()
        (root / "pub" / "not-an-entry").write_bytes(b"")
        result = ckpt(root, "watch", "--framework", "hf", "--interval", "0.05")
        assert result.returncode == 5
        errors = [line for line in result.stderr.splitlines() if line.startswith("ckpt: ")]
        assert len(errors) == 1
        assert "not-an-entry" in errors[0]
        assert "Traceback" not in result.stderr

    def test_failed_scan_exits_1(self, root: Path, spawn: Any) -> None:
        """When the root disappears while watching, the scan fails and the watch exits 1."""
        watching = spawn("watch", "--framework", "dcp", "--interval", "0.05")
        watching.wait_started()
        shutil.rmtree(root)  # it holds the execution's epoch record by now
        code, _ = watching.finish()
        assert code == 1
        assert watching.lines[-1].startswith("ckpt: ")
        assert "does not exist" in watching.lines[-1]

    def test_store_that_never_answers_exits_1_in_time(self, tmp_path: Path) -> None:
        """An S3 endpoint that accepts and never answers ends the watch with exit 1 in time."""
        env = environment(
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_CONFIG_FILE=str(tmp_path / "none"),
            AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
            AWS_EC2_METADATA_DISABLED="true",
        )
        with silent_endpoint() as (url, held):
            config = silent_s3_config(tmp_path / "ckpt.toml", url)
            started = time.monotonic()
            result = subprocess.run(
                [*CKPT, "--root", "s3://bucket", "--config", str(config), *WATCH_DCP, "--scan-timeout", "1"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
        elapsed = time.monotonic() - started
        assert result.returncode == 1, result.stderr
        assert "took longer than 1s" in result.stderr
        assert elapsed < 8, elapsed  # the stuck scan thread does not keep the process alive
        assert held, "the watcher never connected"


class TestSignals:
    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
    def test_signal_right_after_a_save_completes_still_publishes_it(
        self, root: Path, spawn: Any, signum: int
    ) -> None:
        """A save completed just before SIGTERM/SIGINT settles in the drain, is published; exit 0."""
        watching = spawn("--json", "watch", "--framework", "hf", "--interval", "0.1", "--settle", "0.6")
        watching.wait_started()
        time.sleep(0.2)
        writing = time.monotonic()  # the watcher's first look at the save comes after this
        make_hf_save(root, "checkpoint-42")
        signalled = time.monotonic()
        watching.process.send_signal(signum)
        code, out = watching.finish()
        ended = time.monotonic()
        assert code == 0, watching.lines
        assert [e["step"] for e in json.loads(out)["published"]] == [42]
        assert len(pub_names(root)) == 1
        # Settle counts from the first look: at least 0.6 s after the save began, however late the signal
        # went out (a stall of this process between the write and the signal shortens the time after it).
        assert ended - writing >= 0.5, ended - writing
        assert ended - signalled < 5, ended - signalled

    def test_signal_with_nothing_settling_exits_at_once(self, root: Path, spawn: Any) -> None:
        """With no save waiting to settle, SIGTERM ends the watch well before the settle time."""
        watching = spawn("watch", "--framework", "hf", "--interval", "0.1", "--settle", "30")
        watching.wait_started()
        signalled = time.monotonic()
        watching.process.send_signal(signal.SIGTERM)
        code, _ = watching.finish()
        assert code == 0
        assert time.monotonic() - signalled < 10

    @pytest.mark.skipif(not hasattr(fcntl, "F_SETLEASE"), reason="file leases are Linux-only")
    def test_sigterm_while_still_starting_up_exits_0(self, root: Path, tmp_path: Path) -> None:
        """SIGTERM that lands while the sidecar reads its configuration ends in one scan and exit 0, not 143.

        Deterministic start-up point: the test holds a write lease on the configuration file, so the
        sidecar's open of it blocks until the lease is released. The lease break tells the test the sidecar
        is inside that open (before the store exists); the signal is sent then, and the lease released.
        """
        config = tmp_path / "ckpt.toml"
        config.write_text("# defaults only\n")
        (root / "exec" / ATTEMPT / "step-5").mkdir(parents=True)
        (root / "exec" / ATTEMPT / "step-5" / ".metadata").write_bytes(b"m")
        # The lease break is announced with SIGIO, whose default action would end pytest itself.
        previous = signal.signal(signal.SIGIO, signal.SIG_IGN)
        fd = os.open(config, os.O_RDWR)
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
            process = subprocess.Popen(
                [*CKPT, "--root", str(root), "--config", str(config), "--json", *WATCH_DCP],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment(),
            )  # fmt: skip
            deadline = time.monotonic() + 60
            while fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_WRLCK:  # until the sidecar's open breaks it
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the sidecar never opened its configuration"
                time.sleep(0.01)
            process.send_signal(signal.SIGTERM)  # pending at once; delivered before the open returns
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
            out, err = process.communicate(timeout=60)
        finally:
            os.close(fd)
            signal.signal(signal.SIGIO, previous)
        assert process.returncode == 0, err.decode()
        assert b"Traceback" not in err
        assert [e["step"] for e in json.loads(out)["published"]] == [5]


def read_events(path: Path) -> dict[str, Any]:
    """The trainer's events: each complete save's folder with the time it was written, and ``finished``."""
    events: dict[str, Any] = {}
    for line in path.read_text().splitlines():
        document = json.loads(line)
        if document.get("complete"):
            events[document["save"]] = document["written"]
        elif document.get("finished"):
            events["finished"] = True
    return events


@pytest.fixture
def trainer_run(root: Path, tmp_path: Path) -> Iterator[Any]:
    """Start the simulated trainer as a subprocess; yield a function that starts it for a framework."""
    processes: list[subprocess.Popen[bytes]] = []

    def start(
        framework: str, *, rounds: int, pace: float, gap: float
    ) -> tuple[subprocess.Popen[bytes], Path]:
        events = tmp_path / f"{framework}-events.jsonl"
        saves = root / "exec" / ATTEMPT
        process = subprocess.Popen(
            [
                *TRAINER,
                "--framework",
                framework,
                "--saves",
                str(saves),
                "--events",
                str(events),
                "--pace",
                str(pace),
                "--gap",
                str(gap),
                "--rounds",
                str(rounds),
            ],
            env=subprocess_env(),
        )
        processes.append(process)
        return process, events

    yield start
    for process in processes:
        if process.poll() is None:
            process.kill()
        process.wait()


class TestKillAndRestart:
    # The trainer's pace (seconds between writes) is far below the settle time, as a real trainer's pauses
    # are; in a late_rank save the window between a valid trainer_state.json and the last byte is ~18 paces
    # (its longest quiet stretch 5), long enough for a watcher without settle to be caught publishing early.
    @pytest.mark.parametrize(
        ("framework", "rounds", "trainer_rounds", "pace", "gap", "settle"),
        [("hf", 30, 2, 0.02, 0.1, "0.25"), ("dcp", 15, 2, 0.01, 0.2, "0")],
    )
    def test_every_complete_save_exactly_once(
        self,
        root: Path,
        spawn: Any,
        trainer_run: Any,
        framework: str,
        rounds: int,
        trainer_rounds: int,
        pace: float,
        gap: float,
        settle: str,
    ) -> None:
        """Killed at random moments and restarted, watchers publish each complete save once, nothing else."""
        rng = random.Random(f"{framework}-{rounds}")
        trainer, events_path = trainer_run(framework, rounds=trainer_rounds, pace=pace, gap=gap)
        args = ("--framework", framework, "--interval", "0.05", "--settle", settle)
        for _ in range(rounds):
            watching = spawn("watch", *args)
            # Kill at a seeded moment after start-up, so a slow (loaded) machine kills at the same point of
            # the watcher's life as a fast one, not before it has begun.
            watching.wait_started()
            time.sleep(rng.uniform(0.0, 0.75))
            watching.kill()
        # However the kills fell, at least one watcher must be killed after it published, while the trainer
        # may still be writing: keep starting watchers, each killed right after pub/ grows (bounded).
        for _ in range(rounds):
            if pub_names(root):
                break
            watching = spawn("watch", *args)
            watching.wait_started()
            deadline = time.monotonic() + 30
            while not pub_names(root) and time.monotonic() < deadline:
                time.sleep(0.01)
            watching.kill()
        assert trainer.wait(timeout=60) == 0
        published_while_killing = len(pub_names(root))
        final = ckpt(root, "--json", "watch", *args, "--once")
        assert final.returncode == 0, final.stderr

        plan = mixed_plan(framework, trainer_rounds)
        store = PosixStore(str(root))
        entries = store.entries()
        folders = [e.save.rsplit("/", 1)[1] for e in entries]
        assert sorted(folders) == sorted(complete_folders(plan))
        assert len(folders) == len(set(folders))
        assert {e.epoch for e in entries} == {int(EPOCH)}
        assert all(e.step == int(f.rsplit("-", 1)[1]) for e, f in zip(entries, folders, strict=True))
        assert published_while_killing > 0, "no round got as far as publishing; the test proves nothing"

        events = read_events(events_path)
        assert events.get("finished") is True
        for entry, folder in zip(entries, folders, strict=True):
            completed_at = events[folder]
            published_at = os.stat(root / "pub" / format_entry_name(entry)).st_mtime
            # File times come from a coarse clock; 20 ms of slack still catches any publication made while
            # the save was being written (each takes far longer than that).
            assert published_at >= completed_at - 0.02, (folder, published_at, completed_at)
