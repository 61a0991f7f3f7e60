"""A rule and a world size reach every path one way (issue 20, case 4; ``ckpt.application.rulebook`` rule 5).

``resolve_verified(store, find_rule("hf"), world_size=2)`` used to ignore the world size and hand out a
save missing rank 1's RNG state, while ``Framework.HF`` with the same world size refused it; and
``resume_location`` knew only ``hf`` and ``dcp`` by name. Real files on POSIX.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.application.rulebook import as_rule, find_rule
from ckpt.application.verify import resolve_verified
from ckpt.domain.errors import InvalidError
from ckpt.domain.frameworks import Framework
from ckpt.domain.rules.deepspeed import DeepSpeedRule
from ckpt.domain.rules.hf import HfRule
from ckpt.domain.rules.nemo import NemoRule
from ckpt.integrations.core import resume_location
from support.rule_layouts import zip_bytes

ATTEMPT = "1.4101.0"


def hf_root(tmp_path: Path) -> tuple[PosixStore, str, str]:
    """Two hf saves: checkpoint-5 whole for two ranks, checkpoint-9 without rank 1's RNG state."""
    root = tmp_path / "root"
    store = PosixStore(str(root))
    for step, ranks in ((5, (0, 1)), (9, (0,))):
        folder = root / "exec" / ATTEMPT / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"m" * 16)
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
        for rank in ranks:
            (folder / f"rng_state_{rank}.pth").write_bytes(zip_bytes(32))
        store.publish(1, step, str(folder))
    return store, str(root / "exec" / ATTEMPT / "checkpoint-5"), str(root)


class TestAsRule:
    def test_a_rule_built_without_a_world_size_gets_the_one_given(self) -> None:
        """find_rule("hf") then a world size of 2 is the rule find_rule("hf", world_size=2) gives."""
        assert as_rule(find_rule("hf"), 2) == find_rule("hf", world_size=2) == HfRule(2)
        assert as_rule(DeepSpeedRule(), 8) == DeepSpeedRule(8)

    def test_the_same_world_size_twice_is_fine_and_two_are_refused(self) -> None:
        """A rule built for 2 and given 2 keeps it; given 4 is InvalidError naming both."""
        assert as_rule(HfRule(2), 2) == HfRule(2)
        with pytest.raises(InvalidError, match="built for a world size of 2, and a world size of 4"):
            as_rule(HfRule(2), 4)

    def test_a_rule_without_a_world_size_does_not_use_one(self) -> None:
        """NeMo's marker decides: the world size is not its business, as with find_rule."""
        assert as_rule(NemoRule(), 4) == NemoRule() == find_rule("nemo", world_size=4)


class TestResolveVerified:
    def test_a_rule_object_and_a_framework_agree(self, tmp_path: Path) -> None:
        """With a world size of 2 both skip checkpoint-9 (rank 1's RNG state missing) for checkpoint-5."""
        store, whole, _ = hf_root(tmp_path)
        by_rule = resolve_verified(store, find_rule("hf"), world_size=2)
        by_framework = resolve_verified(store, Framework.HF, world_size=2)
        assert by_rule == by_framework
        assert by_rule.entry is not None
        assert store.location(by_rule.entry) == whole
        assert [entry.step for entry, _ in by_rule.skipped] == [9]
        assert "rng_state_1.pth" in by_rule.skipped[0][1]


class TestResumeLocation:
    def test_any_rule_by_name_with_the_world_size(self, tmp_path: Path) -> None:
        """resume_location("hf", world_size=2) resumes from checkpoint-5; without the world size, from 9."""
        _, whole, root = hf_root(tmp_path)
        settings = {"root": root, "epoch": 1, "attempt": ATTEMPT, "environ": {}, "catch_up": False}
        assert resume_location("hf", world_size=2, **settings) == whole
        assert resume_location(find_rule("hf"), world_size=2, **settings) == whole
        assert resume_location("hf", **settings) == f"{root}/exec/{ATTEMPT}/checkpoint-9"

    def test_every_built_in_rule_is_known_by_name(self, tmp_path: Path) -> None:
        """Not only hf and dcp: deepspeed, megatron, nemo, orbax and lightning by name (nothing to resume)."""
        root = tmp_path / "root"
        root.mkdir()
        for name in ("dcp", "lightning", "deepspeed", "megatron", "nemo", "orbax"):
            assert resume_location(name, root=str(root), epoch=1, attempt=ATTEMPT, environ={}) is None

    def test_an_unknown_name_lists_the_rules(self, tmp_path: Path) -> None:
        """A name no rule has is InvalidError listing the names that work."""
        with pytest.raises(InvalidError, match="deepspeed"):
            resume_location("nosuch", root=str(tmp_path), epoch=1, attempt=ATTEMPT, environ={})
