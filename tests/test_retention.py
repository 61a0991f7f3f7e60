"""Retention tiers (``ckpt.domain.retention``): the vectors in ``tests/vectors/retention.json`` and
hypothesis properties (derandomized) checked against naive oracles written here, not taken from ``ckpt``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt.domain.entries import Entry
from ckpt.domain.errors import InvalidError
from ckpt.domain.prune import plan_prune
from ckpt.domain.retention import KeepReason, Kept, plan_retention

VECTORS = json.loads((Path(__file__).parent / "vectors" / "retention.json").read_text(encoding="utf-8"))
DETERMINISTIC = settings(derandomize=True, max_examples=300, deadline=None, database=None)


def entry_of(data: dict[str, str]) -> Entry:
    return Entry(int(data["epoch"]), int(data["step"]), data["save"])


def every_of(case: dict[str, Any]) -> int | None:
    """The case's keep_every: a decimal string (64-bit values are strings in every vector file), or null."""
    every = case["keep_every"]
    assert every is None or isinstance(every, str), "keep_every must be a decimal string or null"
    return None if every is None else int(every)


def case_params(*, valid: bool) -> list[Any]:
    return [pytest.param(c, id=c["id"]) for c in VECTORS["cases"] if c["valid"] is valid]


class TestVectors:
    def test_the_file_is_version_1_with_unique_ids(self) -> None:
        """The vector file has the version readers check and no duplicate case id."""
        ids = [c["id"] for c in VECTORS["cases"]]
        assert VECTORS["version"] == 1
        assert len(ids) == len(set(ids))

    @pytest.mark.parametrize("case", case_params(valid=True))
    def test_valid_cases(self, case: dict[str, Any]) -> None:
        """Each valid case gives exactly the kept entries with their reasons, the removed and the folders."""
        plan = plan_retention(
            [entry_of(e) for e in case["entries"]],
            case["keep"],
            keep_every=every_of(case),
            pinned=[entry_of(e) for e in case["pinned"]],
        )
        expected_kept = [Kept(entry_of(k), tuple(KeepReason(r) for r in k["reasons"])) for k in case["kept"]]
        assert list(plan.kept) == expected_kept
        assert list(plan.remove) == [entry_of(e) for e in case["removed"]]
        assert list(plan.folders) == case["folders"]

    @pytest.mark.parametrize("case", case_params(valid=False))
    def test_invalid_cases_are_refused(self, case: dict[str, Any]) -> None:
        """keep < 1 and keep_every < 1 are InvalidError."""
        with pytest.raises(InvalidError):
            plan_retention(
                [entry_of(e) for e in case["entries"]],
                case["keep"],
                keep_every=every_of(case),
                pinned=[entry_of(e) for e in case["pinned"]],
            )


# -- properties ----------------------------------------------------------------------------------------

paths = st.lists(st.sampled_from(["a", "b", "ck-1", "ck-10"]), min_size=1, max_size=3).map(
    lambda parts: "exec/" + "/".join(parts)
)
entries = st.builds(Entry, st.integers(0, 3), st.integers(0, 12), paths)
listings = st.lists(entries, max_size=12, unique=True)  # a listing of pub/ never holds a name twice


def naive_overlap(folder: str, save: str) -> bool:
    """True when one path is the other or lies inside it, comparing whole elements."""
    f, s = folder.split("/"), save.split("/")
    n = min(len(f), len(s))
    return f[:n] == s[:n]


def naive_inside(inner: str, outer: str) -> bool:
    i, o = inner.split("/"), outer.split("/")
    return i[: len(o)] == o


class TestProperties:
    @DETERMINISTIC
    @given(
        listing=listings,
        keep=st.integers(1, 14),
        keep_every=st.none() | st.integers(1, 7),
        pinned=st.lists(entries, max_size=4),
    )
    def test_the_plan_partitions_and_keeps_every_tier(
        self, listing: list[Entry], keep: int, keep_every: int | None, pinned: list[Entry]
    ) -> None:
        """Kept + removed is the input; the reasons are exactly the tiers that apply; no kept or pinned save
        is touched; every removed save nothing needs is removed; folders are outermost and sorted."""
        plan = plan_retention(listing, keep, keep_every=keep_every, pinned=pinned)
        kept = [k.entry for k in plan.kept]
        assert Counter(kept) + Counter(plan.remove) == Counter(listing)
        ordered = sorted(listing, key=lambda e: e.key)
        latest = set(ordered[max(len(ordered) - keep, 0) :])
        for k in plan.kept:
            expected = [KeepReason.LATEST] if k.entry in latest else []
            if keep_every is not None and k.entry.step % keep_every == 0:
                expected.append(KeepReason.EVERY)
            if k.entry in pinned:
                expected.append(KeepReason.PINNED)
            assert list(k.reasons) == expected
        for e in plan.remove:
            assert e not in latest
            assert e not in pinned
            assert keep_every is None or e.step % keep_every != 0
        protected = [*kept, *pinned]
        assert [f for f in plan.folders if any(naive_overlap(f, p.save) for p in protected)] == []
        free = {e.save for e in plan.remove if not any(naive_overlap(e.save, p.save) for p in protected)}
        assert [s for s in free if not any(naive_inside(s, f) for f in plan.folders)] == []
        assert [(f, g) for f in plan.folders for g in plan.folders if f != g and naive_inside(f, g)] == []
        assert list(plan.folders) == sorted(set(plan.folders))
        assert kept == sorted(kept, key=lambda e: e.key)
        assert list(plan.remove) == sorted(plan.remove, key=lambda e: e.key)

    @DETERMINISTIC
    @given(listing=st.lists(entries, max_size=12), keep=st.integers(1, 14))
    def test_without_tiers_it_is_plan_prune(self, listing: list[Entry], keep: int) -> None:
        """No keep_every and no pins: the same plan as ``plan_prune``, every kept entry for being latest."""
        plan = plan_retention(listing, keep)
        assert plan.prune_plan == plan_prune(listing, keep)
        assert {k.reasons for k in plan.kept} <= {(KeepReason.LATEST,)}

    @DETERMINISTIC
    @given(
        listing=listings,
        keep=st.integers(1, 14),
        keep_every=st.none() | st.integers(1, 7),
        pinned=st.lists(entries, max_size=4),
    )
    def test_more_tiers_never_remove_more(
        self, listing: list[Entry], keep: int, keep_every: int | None, pinned: list[Entry]
    ) -> None:
        """Adding keep_every or pins only moves entries from removed to kept, and folders only disappear."""
        base = plan_prune(listing, keep)
        plan = plan_retention(listing, keep, keep_every=keep_every, pinned=pinned)
        assert set(plan.remove) <= set(base.remove)
        assert {f for f in plan.folders if not any(naive_inside(f, g) for g in base.folders)} == set()

    @pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
    def test_bad_keep_every_is_refused(self, value: Any) -> None:
        """keep_every must be an integer >= 1 (a bool is not one)."""
        with pytest.raises(InvalidError, match="keep_every"):
            plan_retention([Entry(1, 1, "exec/a/ck-1")], 1, keep_every=value)
