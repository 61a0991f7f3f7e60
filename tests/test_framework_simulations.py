"""Each framework's save, killed at every file boundary: the rule accepts exactly the complete states.

The sequences (``tests/support/trainer/frameworks.py``) write a save in the framework's own order, as the
reference records it from the framework's source; every state a crash or a scan could see is judged by the
rule.
"""

from __future__ import annotations

import pytest

from ckpt.domain.rules import builtin_rule
from support.rule_layouts import verdict
from support.trainer.frameworks import SEQUENCES, Sequence, states


def _judge(seq: Sequence, layout: dict[str, bytes | None]) -> tuple[bool, str | None]:
    rule = builtin_rule(seq.rule, **seq.options)  # type: ignore[arg-type]
    assert rule is not None
    return verdict(rule, layout, seq.save)


@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_rule_accepts_only_complete_states(name: str) -> None:
    """At every file boundary of the save, the rule says complete exactly when the save is complete."""
    seq = SEQUENCES[name]
    wrong = []
    seen_complete = False
    for label, layout, complete in states(seq):
        is_save, reason = _judge(seq, layout)
        accepted = is_save and reason is None
        seen_complete |= complete
        if accepted is not complete:
            wrong.append(f"{label}: accepted={accepted} complete={complete} reason={reason}")
    assert wrong == []
    assert seen_complete


def test_deepspeed_without_world_size_needs_settle() -> None:
    """With the world size unknown, a rank that has not created its file yet is invisible to the rule.

    This is why the deepspeed rule settles by default when N is unknown: the listing changes again when
    the late rank's file appears.
    """
    seq = SEQUENCES["deepspeed"]
    rule = builtin_rule("deepspeed")
    assert rule is not None
    assert rule.settle_time(5.0) == 5.0
    after_latest = [layout for label, layout, _ in states(seq) if label == "op 4: write latest done"]
    assert len(after_latest) == 1
    assert verdict(rule, after_latest[0], seq.save) == (True, None)
