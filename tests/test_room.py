"""The longest save name of a rule and the room a saves location leaves for it (spec/names.md §4.5).

The vectors are ``tests/vectors/room.json``; the entry points that make the check are tested with their own
commands and classes (``test_watch_cli.py``, ``test_integrations_resume.py``, ``test_integrations_*.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt.domain.entries import MAX_U64, Entry, save_error
from ckpt.domain.errors import InvalidError
from ckpt.domain.names import MAX_SAVE_BYTES, format_entry_name, parse_entry_name
from ckpt.domain.room import (
    LONGEST_STEP,
    longest_name,
    longest_save_name,
    require_room,
    require_rule_room,
    room_problem,
)
from ckpt.domain.rules import BUILTIN, Item, Kind, builtin_rule, parse_custom_rules

VECTORS = Path(__file__).parent / "vectors" / "room.json"


def _cases(field: str) -> list[Any]:
    with VECTORS.open(encoding="utf-8") as f:
        cases = json.load(f)["cases"]
    return [pytest.param(case, id=case["id"]) for case in cases if field in case]


def _rule(spec: str | dict[str, str]) -> Any:
    if isinstance(spec, str):
        rule = builtin_rule(spec)
        assert rule is not None, spec
        return rule
    (custom,) = parse_custom_rules([spec], BUILTIN)
    return custom


class TestLongestName:
    """Each rule's longest save name (rules 1, 2 of ``ckpt.domain.room``)."""

    @pytest.mark.parametrize("case", _cases("longest_name"))
    def test_vectors(self, case: dict[str, Any]) -> None:
        """The rule's longest save name is the vector's."""
        assert longest_save_name(_rule(case["rule"])) == case["longest_name"]

    @pytest.mark.parametrize("case", _cases("longest_name"))
    def test_it_is_a_save_of_its_rule_at_the_largest_step(self, case: dict[str, Any]) -> None:
        """The longest name is no invention: the rule itself takes it as a save at step 2**64 - 1."""
        rule = _rule(case["rule"])
        item = Item(case["longest_name"], Kind(case["kind"]))
        assert [(s.step, s.name) for s in rule.saves([item])] == [(MAX_U64, case["longest_name"])]

    def test_every_builtin_rule_has_a_vector(self) -> None:
        """No built-in rule is left out of the vectors (a new rule needs its case)."""
        rules = [case.values[0]["rule"] for case in _cases("longest_name")]
        covered = {rule for rule in rules if isinstance(rule, str)}
        assert set(BUILTIN) <= covered

    def test_the_largest_step_is_twenty_digits(self) -> None:
        """2**64 - 1 written in decimal, without leading zeros."""
        assert LONGEST_STEP == "18446744073709551615"
        assert longest_name("iter_{step}") == "iter_18446744073709551615"

    def test_a_plugin_rule_without_one_is_held_to_one_byte(self) -> None:
        """A rule that declares no ``longest_name`` (a plugin's) is held to ``x``, the shortest save."""

        class Plugin:
            name = "done-marker"

        assert longest_save_name(Plugin()) == "x"

    @pytest.mark.parametrize("bad", ["", "a/b", ".", "..", 5])
    def test_a_declared_name_that_is_no_path_element_is_refused(self, bad: object) -> None:
        """A rule declaring a longest name that cannot be one save name is InvalidError naming the rule."""

        class Plugin:
            name = "odd"
            longest_name = bad

        with pytest.raises(InvalidError, match="rule 'odd' declares longest_name"):
            longest_save_name(Plugin())


class TestRoom:
    """Whether ``<folder>/<longest name>`` fits in an entry name (rule 3)."""

    @pytest.mark.parametrize("case", _cases("fits"))
    def test_vectors(self, case: dict[str, Any]) -> None:
        """The longest save, its size in UTF-8 bytes and the verdict are the vector's."""
        name = longest_save_name(_rule(case["rule"]))
        assert f"{case['folder']}/{name}" == case["longest_save"]
        assert len(case["longest_save"].encode("utf-8")) == case["bytes"]
        problem = room_problem(case["folder"], name)
        assert (problem is None) is case["fits"], problem
        assert (case["bytes"] <= MAX_SAVE_BYTES) is case["fits"]

    @pytest.mark.parametrize("case", _cases("fits"))
    def test_the_verdict_is_the_entry_names(self, case: dict[str, Any]) -> None:
        """The check says exactly what formatting the entry of that save at the largest epoch says: the
        save fits when, and only when, its entry name can be written and read back."""
        save = case["longest_save"]
        assert save_error(save) is None
        entry = Entry(MAX_U64, MAX_U64, save)
        if case["fits"]:
            assert parse_entry_name(format_entry_name(entry)) == entry
        else:
            with pytest.raises(InvalidError):
                format_entry_name(entry)

    def test_the_message_names_the_location_the_longest_name_and_the_limit(self) -> None:
        """One sentence with what was refused, why, and the limit."""
        attempt = "a" * 97
        with pytest.raises(InvalidError) as caught:
            require_rule_room(f"exec/{attempt}", _rule("hf"), what=f"attempt {attempt!r}")
        assert str(caught.value) == (
            f"attempt '{attempt}' is too long for hf saves: with their longest name, "
            f"'checkpoint-18446744073709551615', the save 'exec/{attempt}/checkpoint-18446744073709551615' "
            "is 134 bytes, and an entry name carries at most 133 bytes of save path"
        )

    def test_a_name_without_a_rule(self) -> None:
        """``require_room`` takes the name directly, for an integration whose saves have a fixed shape."""
        require_room("exec/" + "a" * 102, "step-" + LONGEST_STEP, what="attempt", saves="step saves")
        with pytest.raises(InvalidError, match="is too long for step saves"):
            require_room("exec/" + "a" * 103, "step-" + LONGEST_STEP, what="attempt", saves="step saves")
