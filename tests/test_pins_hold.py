"""A pin that returned keeps its entry and its folder, whatever single fault or kill hits a prune, and
whatever the interleaving with other pins (issue 19, case 3; docs/spec/operations.md §5.4, §9.2;
layout.md §5.10).

* the put-back of an entry pinned during the prune fails (``EIO`` on POSIX, ``503`` from the S3 server, moto's
  and Ceph RGW): the prune fails naming its journal and what it removed; the next prune puts the entry back;
* the prune is killed (a real SIGKILL) after removing the entries, before deciding its journal, and before
  the put-back, on POSIX and on S3 (moto and RGW): the next ``ckpt prune`` (a real process) puts the entry
  back and finishes the job;
* two pins of one entry race a prune (forced step by step): the second says "already pinned" while the
  first sees the entry gone; the first no longer withdraws the pin the second relied on.

The pins during the prune are made by the real ``pin`` flow at a chosen system call (POSIX) or request (S3)
of the prune; each pin returned before the prune removed the entry, so each is one that must hold.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt.adapters.posix import JOURNAL_PREFIX, PosixStore
from ckpt.adapters.s3 import S3Store
from ckpt.domain.entries import Entry
from ckpt.domain.errors import NotFoundError, PruneIncompleteError
from ckpt.domain.journal import DECISION_SUFFIX
from ckpt.domain.names import format_entry_name
from support.faulty_syscalls import FaultySyscalls
from support.s3 import answer_instead, error_body, new_bucket_name, raw_client
from support.s3_processes import FAKE_ENVIRON

TESTS = Path(__file__).parent
E1, E2, E3 = (Entry(1, step, f"exec/a/ck-{step}") for step in (1, 2, 3))


class HookedSyscalls(FaultySyscalls):
    """Real system calls; ``hooks`` run once each, before the first call matching their (operation, target
    prefix), in the order given; ``fail`` as in FaultySyscalls."""

    def __init__(self, base: str, hooks: list[tuple[str, str, Callable[[], None]]]) -> None:
        super().__init__(base)
        self._hooks = list(hooks)

    def _enter(self, operation: str, target: str, path: str | int) -> Any:
        if self._hooks and (operation, True) == (self._hooks[0][0], target.startswith(self._hooks[0][1])):
            self._hooks.pop(0)[2]()
        return super()._enter(operation, target, path)


def posix_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for entry in (E1, E2, E3):
        folder = root / entry.save
        folder.mkdir(parents=True)
        (folder / "model.bin").write_bytes(b"w" * 8)
        PosixStore(str(root)).publish(entry.epoch, entry.step, str(folder))
    return root


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any ckpt or AWS setting, plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "AWS_"))}, **extra}


def run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as a real process, its output captured."""
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)


def ckpt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``ckpt ARGS`` as a real process, in a clean environment by default."""
    return run([sys.executable, "-m", "ckpt", *args], env if env is not None else clean_env())


def s3_root(endpoint: str) -> tuple[Any, str, str]:
    """A new bucket on moto's server with e1, e2 and e3 published: (client, bucket, root)."""
    client = raw_client(endpoint)
    bucket = new_bucket_name()
    client.create_bucket(Bucket=bucket)
    root = f"s3://{bucket}"
    for entry in (E1, E2, E3):
        client.put_object(Bucket=bucket, Key=f"{entry.save}/model.bin", Body=b"w")
        S3Store(root, client).publish(1, entry.step, f"{root}/{entry.save}")
    return client, bucket, root


def control_objects(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if n.startswith(JOURNAL_PREFIX))


def pin_now(root: Path, entry: Entry) -> Callable[[], None]:
    """A hook: pin ``entry`` through the real flow, in another store of the root; it must return True."""

    def hook() -> None:
        assert PosixStore(str(root)).pin(entry) is True

    return hook


class TestPosixPutBackFails:
    def test_a_failed_put_back_is_reported_and_the_next_prune_puts_the_entry_back(
        self, tmp_path: Path
    ) -> None:
        """Pinned while prune removes it, e1's put-back fails with EIO: the prune names its journal and the
        entry it removed for good (e2), keeps every folder; the next prune puts e1 back, removes ck-2."""
        root = posix_root(tmp_path)
        e1_name = format_entry_name(E1)
        calls = HookedSyscalls(str(root), [("unlink", f"pub/{e1_name}", pin_now(root, E1))])
        store = PosixStore(str(root), syscalls=calls)
        opens = {"n": 0}
        original = calls._enter

        def fail_the_put_back(operation: str, target: str, path: str | int) -> Any:
            if operation == "open" and target == f"pub/{e1_name}":
                opens["n"] += 1
                raise OSError(errno.EIO, os.strerror(errno.EIO), path)
            return original(operation, target, path)

        calls._enter = fail_the_put_back  # type: ignore[method-assign]
        with pytest.raises(PruneIncompleteError) as caught:
            store.prune(1)
        error = caught.value
        assert opens["n"] == 1
        assert error.journal is not None
        assert error.journal.startswith(f"{root}/{JOURNAL_PREFIX}")
        assert error.journal in str(error)
        assert "removed 1 entries and 0 folders" in str(error)
        assert (error.removed_entries, error.restored, error.removed_folders) == ((E2,), (), ())
        assert os.strerror(errno.EIO) in str(error)
        plain = PosixStore(str(root))
        assert plain.entries() == [E3]
        assert plain.pinned() == [E1]
        assert (root / E1.save / "model.bin").read_bytes() == b"w" * 8
        result = plain.prune(1)
        assert result.restored == (E1,)
        assert plain.entries() == [E1, E3]
        assert (root / E1.save / "model.bin").read_bytes() == b"w" * 8
        assert not (root / E2.save).exists()
        assert control_objects(root) == []


KILLER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[3])
    from ckpt.adapters.posix import PosixStore
    from ckpt.domain.entries import Entry
    from ckpt.domain.names import format_entry_name
    from support.faulty_syscalls import FaultySyscalls

    root, point = sys.argv[1], sys.argv[2]
    e1 = Entry(1, 1, "exec/a/ck-1")
    name = format_entry_name(e1)
    state = {"unlinked": False, "pinned": False}

    class Killing(FaultySyscalls):
        def _enter(self, operation, target, path):
            if operation == "unlink" and target == f"pub/{name}" and not state["pinned"]:
                state["pinned"] = PosixStore(root).pin(e1)  # a pin that returned True
                print("pinned", state["pinned"], flush=True)
            if operation == "unlink" and target.startswith("pub/"):
                state["unlinked"] = True
            call = (operation, target)
            die = (
                (point == "after-the-entries" and state["unlinked"] and call == ("open", "pub"))
                or (point == "before-the-decision" and operation == "link")
                or (point == "before-the-put-back" and operation == "open" and target == f"pub/{name}")
            )
            if die:
                os.kill(os.getpid(), signal.SIGKILL)
            return super()._enter(operation, target, path)

    PosixStore(root, syscalls=Killing(root)).prune(1)
    """
)


class TestPosixKilledPrune:
    @pytest.mark.parametrize("point", ["after-the-entries", "before-the-decision", "before-the-put-back"])
    def test_a_pin_made_during_a_killed_prune_holds(self, tmp_path: Path, point: str) -> None:
        """SIGKILL at each point between removing the entries and putting the pinned one back: the pin is
        there, e1 is not listed, every folder is whole; ``ckpt prune`` (a real process) then puts e1 back and
        finishes: e2 and its folder gone, no journal or decision left; ``ckpt resolve`` prints e3."""
        root = posix_root(tmp_path)
        killed = run([sys.executable, "-c", KILLER, str(root), point, str(TESTS)])
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert killed.stdout.splitlines() == ["pinned True"]
        store = PosixStore(str(root))
        assert store.pinned() == [E1]
        assert E1 not in store.entries()
        assert all((root / e.save / "model.bin").is_file() for e in (E1, E2, E3))
        decided = [n for n in control_objects(root) if n.endswith(DECISION_SUFFIX)]
        assert len(decided) == (1 if point == "before-the-put-back" else 0)
        prune = ckpt("--root", str(root), "prune", "--keep", "1")
        assert prune.returncode == 0, prune.stderr
        assert f"put back entry: epoch 1 step 1 {root}/{E1.save} (pinned)" in prune.stdout.splitlines()
        assert store.entries() == [E1, E3]
        assert (root / E1.save / "model.bin").read_bytes() == b"w" * 8
        assert not (root / E2.save).exists()
        assert control_objects(root) == []
        resolve = ckpt("--root", str(root), "resolve")
        assert resolve.stdout.strip() == f"{root}/{E3.save}"


S3_KILLER = textwrap.dedent(
    """
    import os, signal, sys
    sys.path.insert(0, sys.argv[4])
    from ckpt.adapters.s3 import S3Store
    from ckpt.domain.entries import Entry
    from ckpt.domain.names import format_entry_name
    from support.s3_processes import direct_client

    endpoint, bucket, point = sys.argv[1:4]
    root = f"s3://{bucket}"
    e1 = Entry(1, 1, "exec/a/ck-1")
    e1_key = f"pub/{format_entry_name(e1)}"
    client = direct_client(endpoint)
    state = {"removed": False}

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def before_delete(params, **_):
        keys = [o["Key"] for o in params["Delete"]["Objects"]]
        if keys and keys[0].startswith("pub/"):
            print("pinned", S3Store(root, direct_client(endpoint)).pin(e1), flush=True)
            state["removed"] = True

    def before_list(params, **_):
        if point == "after-the-entries" and state["removed"] and params.get("Prefix") == "pub/":
            die()

    def before_put(params, **_):
        if point == "before-the-decision" and params["Key"].endswith(".decided"):
            die()
        if point == "before-the-put-back" and params["Key"] == e1_key and state["removed"]:
            die()

    client.meta.events.register("before-parameter-build.s3.DeleteObjects", before_delete)
    client.meta.events.register("before-parameter-build.s3.ListObjectsV2", before_list)
    client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    S3Store(root, client).prune(1)
    """
)


class TestS3KilledPrune:
    @pytest.mark.parametrize("point", ["after-the-entries", "before-the-decision", "before-the-put-back"])
    def test_a_pin_made_during_a_killed_prune_holds(self, s3_server: str, tmp_path: Path, point: str) -> None:
        """On moto's server, the prune (a real process) killed by SIGKILL at each point between removing the
        entries and putting the pinned one back; ``ckpt prune`` (a real process) then puts e1 back and
        finishes: e2's objects gone, no journal or decision left."""
        client, bucket, root = s3_root(s3_server)
        env = clean_env(**FAKE_ENVIRON)
        killed = run([sys.executable, "-c", S3_KILLER, s3_server, bucket, point, str(TESTS)], env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert killed.stdout.splitlines() == ["pinned True"]
        store = S3Store(root, client)
        assert store.pinned() == [E1]
        assert E1 not in store.entries()
        config = tmp_path / "ckpt.toml"
        config.write_text(
            f'[s3]\nendpoint_url = "{s3_server}"\nregion = "us-east-1"\naddressing_style = "path"\n'
            '[[credentials]]\nsource = "env"\n'
        )
        prune = ckpt("--config", str(config), "--root", root, "prune", "--keep", "1", env=env)
        assert prune.returncode == 0, prune.stderr
        assert f"put back entry: epoch 1 step 1 {root}/{E1.save} (pinned)" in prune.stdout.splitlines()
        assert store.entries() == [E1, E3]
        keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ())}
        assert f"{E1.save}/model.bin" in keys
        assert f"{E2.save}/model.bin" not in keys
        assert not [k for k in keys if k.startswith(JOURNAL_PREFIX)]


class GatedPins(PosixStore):
    """A store whose second listing of the entries in a ``pin`` waits for ``go`` (after telling ``ready``)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ready = threading.Event()
        self.go = threading.Event()
        self._listings = 0

    def entries(self) -> list[Entry]:
        self._listings += 1
        if self._listings == 2:
            self.ready.set()
            assert self.go.wait(30)
        return super().entries()


class TestTwoPinsRacingAPrune:
    def test_the_second_pin_holds_though_the_first_saw_the_entry_gone(self, tmp_path: Path) -> None:
        """The prune plans without pins; pin A creates the pin; pin B finds it and sees e1: "already pinned";
        the prune removes e1; pin A then sees e1 gone. A leaves the pin (NotFoundError saying so), the prune
        reads it, puts e1 back and keeps ck-1: B's pin holds."""
        root = posix_root(tmp_path)
        first = PausedPin(GatedPins(str(root)), E1)
        outcome: dict[str, Any] = {}

        def a_creates_and_b_pins() -> None:  # before the prune removes e1: A created the pin, B saw e1
            first.start()
            outcome["b"] = PosixStore(str(root)).pin(E1)

        e1_name = format_entry_name(E1)
        calls = HookedSyscalls(
            str(root), [("unlink", f"pub/{e1_name}", a_creates_and_b_pins), ("open", "pub", first.finish)]
        )  # A looks again after the prune removed e1, before the prune reads the pins again
        result = PosixStore(str(root), syscalls=calls).prune(1)
        assert outcome["b"] is False  # already pinned: B relied on A's pin
        assert isinstance(first.outcome, NotFoundError)
        assert "the pin is left" in str(first.outcome)
        assert result.restored == (E1,)
        assert result.removed_entries == (E2,)
        store = PosixStore(str(root))
        assert store.entries() == [E1, E3]
        assert store.pinned() == [E1]
        assert (root / E1.save / "model.bin").is_file()
        assert control_objects(root) == []

    def test_a_pin_whose_entry_a_decision_removed_is_withdrawn(self, tmp_path: Path) -> None:
        """The pin sees e1 listed, then waits; the prune removes e1, reads no pin and decides e1 removed for
        good; the pin is created only then, finds e1 gone and that decision: it withdraws its pin and says the
        prune removed the entry; ck-1 goes."""
        root = posix_root(tmp_path)
        late = PausedPin(GatedCreate(str(root)), E1)
        # Started before the prune removes e1 (its first look sees it); created once the decision is made
        # (the journal's check follows the decision).
        e1_name = format_entry_name(E1)
        calls = HookedSyscalls(
            str(root), [("unlink", f"pub/{e1_name}", late.start), ("lstat", JOURNAL_PREFIX, late.finish)]
        )
        result = PosixStore(str(root), syscalls=calls).prune(1)
        assert isinstance(late.outcome, NotFoundError)
        assert "a prune removed the entry while it was being pinned" in str(late.outcome)
        assert result.removed_entries == (E1, E2)
        assert PosixStore(str(root)).pinned() == []
        assert not (root / E1.save).exists()


class PausedPin:
    """A real ``pin`` of ``entry`` through a gated store, in a thread: :meth:`start` runs it up to the
    store's gate, :meth:`finish` lets it end; ``outcome`` is what it returned or raised."""

    def __init__(self, store: GatedPins | GatedCreate, entry: Entry) -> None:
        self.store = store
        self.outcome: Any = None
        self._thread = threading.Thread(target=self._run, args=(entry,))

    def _run(self, entry: Entry) -> None:
        try:
            self.outcome = self.store.pin(entry)
        except NotFoundError as exc:
            self.outcome = exc

    def start(self) -> None:
        self._thread.start()
        assert self.store.ready.wait(30)

    def finish(self) -> None:
        self.store.go.set()
        self._thread.join(30)


class GatedCreate(PosixStore):
    """A store whose pin creation waits for ``go`` (after telling ``ready``)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ready = threading.Event()
        self.go = threading.Event()

    def create_pin(self, name: str) -> bool:
        self.ready.set()
        assert self.go.wait(30)
        return super().create_pin(name)


class TestS3PutBackFails:
    def test_a_failed_put_back_on_s3_is_reported_and_the_next_prune_puts_it_back(
        self, s3_server: str
    ) -> None:
        """On moto's server: e1 pinned (the real flow) just before the prune's DeleteObjects of the entries;
        the put-back PutObject of pub/<e1> answered 503 every time; the prune fails naming its journal;
        the next prune puts e1 back and finishes."""
        client, bucket, root = s3_root(s3_server)
        pruner = raw_client(s3_server)
        state = {"pinned": False}

        def pin_before_the_removal(params: Any, **_: Any) -> None:
            keys = [o["Key"] for o in params["Delete"]["Objects"]]
            if not state["pinned"] and keys and keys[0].startswith("pub/"):
                state["pinned"] = S3Store(root, raw_client(s3_server)).pin(E1)

        pruner.meta.events.register("before-parameter-build.s3.DeleteObjects", pin_before_the_removal)
        e1_key = f"pub/{format_entry_name(E1)}".encode()
        answered = answer_instead(
            pruner,
            "PutObject",
            503,
            error_body("ServiceUnavailable", "down"),
            when=lambda r: e1_key in r.url.encode(),
        )
        with pytest.raises(PruneIncompleteError) as caught:
            S3Store(root, pruner).prune(1)
        assert state["pinned"] is True
        assert answered
        assert caught.value.journal is not None
        assert caught.value.journal.startswith(f"{root}/{JOURNAL_PREFIX}")
        assert caught.value.removed_entries == (E2,)
        store = S3Store(root, client)
        assert store.entries() == [E3]
        assert store.pinned() == [E1]
        result = store.prune(1)
        assert result.restored == (E1,)
        assert store.entries() == [E1, E3]
        keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ())}
        assert f"{E1.save}/model.bin" in keys
        assert f"{E2.save}/model.bin" not in keys
        assert not [k for k in keys if k.startswith(JOURNAL_PREFIX)]


MOUNTED_PRUNE = textwrap.dedent(
    """
    import json, os, subprocess, sys
    root, folder, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
    mount = os.path.join(folder, "mnt")
    os.mkdir(mount)
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "none", mount], check=True)
    done = subprocess.run([sys.executable, "-m", "ckpt", "--root", root, *flags, "prune", "--keep", "1"],
                          capture_output=True, text=True, timeout=60)
    subprocess.run(["umount", mount], check=True)
    print(json.dumps({"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}))
    """
)


class TestCliSaysWhatAFailedPruneLeft:
    @pytest.mark.parametrize("json_output", [False, True], ids=["stderr", "json"])
    def test_the_journal_and_the_removed_entries(self, tmp_path: Path, json_output: bool) -> None:
        """``ckpt prune`` (a real process) where ck-1 holds a mount point (a tmpfs, in a private mount
        namespace), which prune never removes files on: exit 1; the entries it removed, the journal, then
        the error on stderr; with --json the document says the same."""
        root = posix_root(tmp_path)
        script = tmp_path / "mounted.py"
        script.write_text(MOUNTED_PRUNE)
        flags = ["--json"] if json_output else []
        done = run(
            ["unshare", "-m", sys.executable, str(script), str(root), str(root / E1.save), *flags],
            clean_env(),
        )
        assert done.returncode == 0, done.stderr
        prune = json.loads(done.stdout)
        assert prune["code"] == 1, prune["stderr"]
        (journal,) = (n for n in control_objects(root) if not n.endswith(DECISION_SUFFIX))
        lines = prune["stderr"].splitlines()
        error = f"ckpt: cannot remove the folder {root}/{E1.save}: a mount point of another file system"
        assert lines[-1].startswith(error)
        assert f"the folders still to remove are listed in {root}/{journal}" in lines[-1]
        if json_output:
            document = json.loads(prune["stdout"])
            assert document["incomplete"] is True
            assert document["journal"] == f"{root}/{journal}"
            assert [e["step"] for e in document["removed_entries"]] == [1, 2]
            assert document["removed_folders"] == []  # ck-1 is first: nothing removed before it
            assert len(lines) == 1
        else:
            assert prune["stdout"] == ""
            assert lines[:-1] == [
                f"ckpt: removed entry: epoch 1 step 1 {root}/{E1.save}",
                f"ckpt: removed entry: epoch 1 step 2 {root}/{E2.save}",
                f"ckpt: left journal: {root}/{journal} (the next prune finishes the job)",
            ]
        assert PosixStore(str(root)).entries() == [E3]
        result = PosixStore(str(root)).prune(1)  # the mount is gone: the next prune finishes
        assert result.removed_folders == (f"{root}/{E1.save}", f"{root}/{E2.save}")
        assert control_objects(root) == []
