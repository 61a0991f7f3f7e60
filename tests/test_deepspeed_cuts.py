"""DeepSpeed saves for ZeRO 0-3 with tensor parallelism 2 and data parallelism 2, cut at every file boundary.

The file sequence follows DeepSpeed's ``save_checkpoint`` (reference frameworks-on-disk.md §1.2, engine.py
``_get_ckpt_name``, ``_get_zero_ckpt_name``, ``_save_zero_checkpoint``): global rank r is model-parallel rank
r % 2 and data-parallel rank r // 2; each rank writes its model states (``mp_rank_XX_model_states.pt`` by
data-parallel rank 0 only, or under ZeRO-3 ``zero_pp_rank_D_mp_rank_XX_model_states.pt`` by every rank),
then its optimizer shard (``[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt``, ZeRO 1-3 and bf16 at any
stage); rank 0 then copies ``zero_to_fp32.py`` beside the tag and writes ``latest``, with no barrier before.
Rank 0 goes first (``latest`` early, the adversarial order), then ranks 1-3. Each file is first torn (a zip
without its last byte), then whole. With ``world_size=4`` every cut but the last is incomplete, except
ZeRO 0 without bf16, where data-parallel rank 1 writes nothing: names cannot account for 4 ranks, so the
rule refuses (watcher.md §2.7 rule 3), and such a save is judged with the number of writers (2).
"""

from __future__ import annotations

import pytest

from ckpt.domain.rules import builtin_rule
from support.rule_layouts import verdict, zip_bytes

TAG = "global_step10"


def events(stage: int, bf16: bool) -> list[tuple[str, bytes]]:
    """(path, content) in the order DeepSpeed writes them; each .pt torn first, then whole."""
    whole = zip_bytes(64)
    sequence: list[tuple[str, bytes]] = []

    def pt(path: str) -> None:
        sequence.extend([(path, whole[:-1]), (path, whole)])

    for rank in range(4):
        mp, dp = rank % 2, rank // 2
        if stage == 3:
            pt(f"{TAG}/zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt")
        elif dp == 0:
            pt(f"{TAG}/mp_rank_{mp:02d}_model_states.pt")
        if stage > 0 or bf16:
            pt(f"{TAG}/{'bf16_' if bf16 else ''}zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt")
            if rank == 0:
                sequence.append(("zero_to_fp32.py", b"#!/usr/bin/env python\n"))
        if rank == 0:
            sequence.append(("latest", TAG.encode()))
    return sequence


def cuts(stage: int, bf16: bool) -> list[dict[str, bytes | None]]:
    layouts, layout = [], {}
    for path, data in events(stage, bf16):
        layout = {**layout, path: data}
        layouts.append(layout)
    return layouts


CONFIGS = [
    pytest.param(s, b, id=f"zero{s}-{'bf16' if b else 'fp16'}") for s in range(4) for b in (False, True)
]


@pytest.mark.parametrize(("stage", "bf16"), CONFIGS)
def test_every_cut(stage: int, bf16: bool) -> None:
    rule = builtin_rule("deepspeed", world_size=4)
    assert rule is not None
    layouts = cuts(stage, bf16)
    provable = stage > 0 or bf16
    for i, layout in enumerate(layouts):
        is_save, reason = verdict(rule, layout, TAG)
        assert is_save
        if i == len(layouts) - 1 and provable:
            assert reason is None, reason
        else:
            assert reason is not None, f"cut {i} of {len(layouts)} published: {sorted(layout)}"


def test_zero0_fp16_is_judged_by_its_writers() -> None:
    """ZeRO 0 without bf16, tp=2, dp=2: whole under the two processes that write files, never before."""
    rule = builtin_rule("deepspeed", world_size=2)
    assert rule is not None
    layouts = cuts(0, False)
    verdicts = [verdict(rule, layout, TAG)[1] is None for layout in layouts]
    assert verdicts == [False] * (len(layouts) - 1) + [True]
