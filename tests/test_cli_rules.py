"""``ckpt watch --framework`` and ``ckpt resolve --framework`` with the new rules, run as the real CLI.

Every framework name works the same way on the command line: the built-in ones, a ``[[frameworks]]`` rule
of the configuration file, and an installed plugin's (installed here by ``PYTHONPATH``, as pip leaves one).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.rule_layouts import zip_bytes
from test_watch_cli import ATTEMPT, ckpt, environment

PLUGINS = Path(__file__).parent / "plugins"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def saves(root: Path) -> Path:
    folder = root / "exec" / ATTEMPT
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_deepspeed(root: Path, step: int, *, ranks: int = 2, latest: bool = True) -> None:
    tag = saves(root) / f"global_step{step}"
    tag.mkdir()
    (tag / "mp_rank_00_model_states.pt").write_bytes(zip_bytes(100))
    for rank in range(ranks):
        (tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").write_bytes(zip_bytes(100))
    if latest:
        (saves(root) / "latest").write_text(f"global_step{step}")


def write_zero0(root: Path, step: int, *, mp_ranks: int) -> None:
    """A ZeRO-0 tag whose first ``mp_ranks`` tensor-parallel ranks wrote their file; ``latest`` names it."""
    tag = saves(root) / f"global_step{step}"
    tag.mkdir()
    for rank in range(mp_ranks):
        (tag / f"mp_rank_{rank:02d}_model_states.pt").write_bytes(zip_bytes(100))
    (saves(root) / "latest").write_text(f"global_step{step}")


def published_steps(out: str) -> list[int]:
    return [e["step"] for e in json.loads(out)["published"]]


class TestBuiltinRules:
    def test_deepspeed_watch_and_resolve(self, root: Path) -> None:
        """deepspeed: a tag with latest and complete shards is published; resolve checks the world size."""
        write_deepspeed(root, 10)
        watched = ckpt(root, "--json", "watch", "--framework", "deepspeed", "--settle", "0", "--once")
        assert watched.returncode == 0, watched.stderr
        assert published_steps(watched.stdout) == [10]

        resolved = ckpt(root, "resolve", "--framework", "deepspeed", "--world-size", "2")
        assert (resolved.returncode, resolved.stdout.strip()) == (0, str(saves(root) / "global_step10"))
        four = ckpt(root, "resolve", "--framework", "deepspeed", "--world-size", "4")
        assert four.returncode == 3
        assert "2 optimizer shard(s) for a world size of 4" in four.stderr

    def test_deepspeed_world_size_counts_every_model_parallel_rank(self, root: Path) -> None:
        """deepspeed, ZeRO 0, tp=2: with --world-size 2 a tag without mp_rank_01 is not published, and
        resolve skips it when published anyway (watcher.md §2.7; issue 20)."""
        write_zero0(root, 10, mp_ranks=2)
        write_zero0(root, 20, mp_ranks=1)
        watched = ckpt(root, "--json", "watch", "--framework", "deepspeed", "--world-size", "2", "--once")
        assert watched.returncode == 0, watched.stderr
        assert published_steps(watched.stdout) == [10]

        # Published as a watcher without the world size would have (the names alone cannot tell dp = 2).
        tag = saves(root) / "global_step20"
        assert ckpt(root, "publish", "--step", "20", str(tag)).returncode == 0
        resolved = ckpt(root, "resolve", "--framework", "deepspeed", "--world-size", "2")
        assert (resolved.returncode, resolved.stdout.strip()) == (0, str(saves(root) / "global_step10"))
        reason = "1 mp_rank_XX_model_states.pt and no ZeRO shards for a world size of 2"
        assert f"ckpt: skipped {tag}: {reason}" in resolved.stderr

        (tag / "mp_rank_01_model_states.pt").write_bytes(zip_bytes(100))
        resolved = ckpt(root, "resolve", "--framework", "deepspeed", "--world-size", "2")
        assert (resolved.returncode, resolved.stdout.strip(), resolved.stderr) == (0, str(tag), "")

    def test_deepspeed_watch_waits_for_the_last_model_parallel_rank(self, root: Path) -> None:
        """deepspeed, ZeRO 0, tp=2, --world-size 2: watch publishes the tag only once mp_rank_01 is whole."""
        write_zero0(root, 10, mp_ranks=1)
        watch = ("--json", "watch", "--framework", "deepspeed", "--world-size", "2", "--once")
        first = ckpt(root, *watch)
        assert (first.returncode, published_steps(first.stdout)) == (0, []), first.stderr
        late = saves(root) / "global_step10" / "mp_rank_01_model_states.pt"
        late.write_bytes(zip_bytes(100)[:-1])
        cut = ckpt(root, *watch)
        assert (cut.returncode, published_steps(cut.stdout)) == (0, []), cut.stderr
        late.write_bytes(zip_bytes(100))
        whole = ckpt(root, *watch)
        assert (whole.returncode, published_steps(whole.stdout)) == (0, [10]), whole.stderr

    def test_an_unknown_framework_lists_the_names(self, root: Path) -> None:
        """An unknown --framework exits 2 naming every built-in rule."""
        result = ckpt(root, "watch", "--framework", "pytorch", "--once")
        assert result.returncode == 2
        assert "framework 'pytorch' is not one of hf, dcp, lightning, deepspeed, megatron, nemo, orbax" in (
            result.stderr
        )

    def test_wrong_framework_says_so(self, root: Path) -> None:
        """A DCP save in an hf-named folder under --framework dcp: one warning names --framework hf."""
        folder = saves(root) / "checkpoint-5"
        folder.mkdir()
        (folder / ".metadata").write_bytes(b"m")
        result = ckpt(root, "watch", "--framework", "dcp", "--once")
        assert result.returncode == 0, result.stderr
        warnings = [line for line in result.stderr.splitlines() if " warning " in line]
        assert len(warnings) == 1
        assert "'checkpoint-5' looks like a save but matches no dcp save name (step-<step>)" in warnings[0]
        assert "--framework hf (checkpoint-<step>) would take it" in warnings[0]
        assert "published 0 save(s)" in result.stderr


class TestLightningIntegrationSaves:
    """Issue 20 case 1: the Lightning integration's saves, ``exec/<attempt>/step-<step>/model.ckpt`` (a file,
    or a sharded folder), are saves of ``--framework lightning`` (watcher.md §2.8): ``resolve`` and
    ``resume`` find them, and no warning sends the user to ``--framework dcp``, which refuses them."""

    @staticmethod
    def write(root: Path, attempt: str) -> Path:
        folder = root / "exec" / attempt
        (folder / "step-2").mkdir(parents=True)
        (folder / "step-2" / "model.ckpt").write_bytes(zip_bytes(100))
        sharded = folder / "step-4" / "model.ckpt"
        sharded.mkdir(parents=True)
        for rank in range(2):
            (sharded / f"__{rank}_0.distcp").write_bytes(bytes(64))
        (sharded / ".metadata").write_bytes(b"dcp metadata")
        (sharded / "meta.pt").write_bytes(zip_bytes(100))
        (folder / "step-6" / "model.ckpt").mkdir(parents=True)  # a sharded save just begun
        (folder / "step-6" / "model.ckpt" / "__0_0.distcp").write_bytes(bytes(64))
        return folder

    def test_resolve_takes_the_newest_whole_one(self, root: Path) -> None:
        """Published saves: resolve prints the newest whole one (the sharded step 4), skipping step 6."""
        folder = self.write(root, ATTEMPT)
        for step in (2, 4, 6):
            assert ckpt(root, "publish", "--step", str(step), str(folder / f"step-{step}")).returncode == 0
        resolved = ckpt(root, "resolve", "--framework", "lightning")
        assert (resolved.returncode, resolved.stdout.strip()) == (0, str(folder / "step-4")), resolved.stderr
        assert f"ckpt: skipped {folder / 'step-6'}: no model.ckpt/.metadata" in resolved.stderr
        assert "--framework dcp" not in resolved.stderr

    def test_resume_catches_up_and_prints_the_save(self, root: Path) -> None:
        """A dead execution's unpublished saves: resume publishes the whole ones at its epoch and prints the
        newest; watch takes the same ones; neither warns."""
        folder = self.write(root, "a")
        (folder / ".ckpt-epoch").write_text("10\n")
        resumed = ckpt(root, "resume", "--framework", "lightning", "--settle", "0")
        assert (resumed.returncode, resumed.stdout.strip()) == (0, str(folder / "step-4")), resumed.stderr
        assert "looks like a save" not in resumed.stderr
        env = environment(DISPATCH_ATTEMPT="a", DISPATCH_EPOCH="10")
        watched = ckpt(
            root, "--json", "watch", "--framework", "lightning", "--settle", "0", "--once", env=env
        )
        assert (watched.returncode, published_steps(watched.stdout)) == (0, []), watched.stderr
        assert "looks like a save" not in watched.stderr


class TestConfiguredRule:
    CONFIG = """
[[frameworks]]
name = "mytrainer"
pattern = "ckpt_{step}"
required = ["DONE"]
zip = ["model.pt"]
settle = 0
"""

    def test_watch_and_resolve_by_its_name(self, root: Path, tmp_path: Path) -> None:
        """A [[frameworks]] rule is a --framework for watch and resolve."""
        config = tmp_path / "ckpt.toml"
        config.write_text(self.CONFIG)
        for step, done in ((3, True), (4, False)):
            folder = saves(root) / f"ckpt_{step}"
            folder.mkdir()
            (folder / "model.pt").write_bytes(zip_bytes(64))
            if done:
                (folder / "DONE").write_bytes(b"")
        watched = ckpt(root, "--config", str(config), "--json", "watch", "--framework", "mytrainer", "--once")
        assert watched.returncode == 0, watched.stderr
        assert published_steps(watched.stdout) == [3]
        resolved = ckpt(root, "--config", str(config), "resolve", "--framework", "mytrainer")
        assert resolved.stdout.strip() == str(saves(root) / "ckpt_3")

    def test_a_bad_table_is_exit_2_naming_the_key(self, root: Path, tmp_path: Path) -> None:
        """A pattern without {step} is refused when the file is loaded, naming frameworks[0].pattern."""
        config = tmp_path / "ckpt.toml"
        config.write_text('[[frameworks]]\nname = "x"\npattern = "ckpt"\n')
        result = ckpt(root, "--config", str(config), "watch", "--framework", "x", "--once")
        assert result.returncode == 2
        assert "frameworks[0].pattern" in result.stderr


class TestPluginRule:
    def test_watch_and_resolve_through_an_installed_plugin(self, root: Path) -> None:
        """A rule an installed package registers under ckpt.frameworks works by name."""
        env = environment(PYTHONPATH=os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))
        (saves(root) / "run-7").mkdir()
        (saves(root) / "run-7" / "DONE").write_bytes(b"")
        (saves(root) / "run-8").mkdir()
        watched = ckpt(root, "--json", "watch", "--framework", "done-marker", "--once", env=env)
        assert watched.returncode == 0, watched.stderr
        assert published_steps(watched.stdout) == [7]
        resolved = ckpt(root, "resolve", "--framework", "done-marker", env=env)
        assert resolved.stdout.strip() == str(saves(root) / "run-7")
