"""The conformance vectors in ``tests/vectors/*.json``, run against the Python implementation.

The JSON files are the language-neutral suite a port in another language must pass (``docs/vectors.md``);
this module is their Python consumer. The expected values in the files were computed independently of
``ckpt``'s encoder, and :class:`TestVectorsAreSelfConsistent` re-derives the wire-level ones with the
standard library's ``base64`` so that a typo in a vector cannot hide behind a matching bug.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ckpt.domain.catchup import (
    format_epoch_record,
    format_world_size_record,
    parse_epoch_record,
    parse_world_size_record,
    plan_catch_up,
)
from ckpt.domain.entries import (
    Entry,
    parse_epoch,
    parse_step,
    save_error,
    sort_entries,
    validate_attempt,
    validate_save,
)
from ckpt.domain.errors import InvalidError, MalformedError
from ckpt.domain.journal import (
    JournalContent,
    decide,
    format_decision,
    format_journal,
    parse_decision,
    parse_journal,
    read_journal,
)
from ckpt.domain.names import format_entry_name, latest_entry_of_names, parse_entry_name, parse_entry_names
from ckpt.domain.prune import (
    Overlap,
    PhysicalOverlap,
    PrunePlan,
    leftover_folders,
    overlaps,
    plan_prune,
    recheck_folders,
)
from ckpt.domain.removing import Removing
from ckpt.domain.retention import SKIP_PINNED
from ckpt.domain.s3_root import parse_s3_root

Case = dict[str, Any]

VECTORS = Path(__file__).parent / "vectors"
VECTOR_FILES = (
    "names",
    "numbers",
    "saves",
    "attempts",
    "order",
    "overlap",
    "overlap_physical",
    "prune",
    "prune_recheck",
    "journal",
    "decision",
    "removing",
    "s3_roots",
    "world_size_record",
    "epoch_record",
    "catch_up",
    "leftover",
    "cli_exit_codes",
    "manifest",
    "manifest_verify",
)
CASE_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")

# Vector cases the implementation is known to get wrong, "<file>/<case id>" -> the bug. They run as strict
# xfails: the vector stays as the spec says, and fixing the bug turns the xfail into a failure until the
# entry is deleted here.
KNOWN_BUGS: dict[str, str] = {}  # case id -> why it fails; run as strict xfails until fixed


@cache
def load(stem: str) -> dict[str, Any]:
    """Return the decoded JSON document ``tests/vectors/<stem>.json``."""
    with (VECTORS / f"{stem}.json").open(encoding="utf-8") as f:
        document: dict[str, Any] = json.load(f)
    return document


def cases(stem: str, *, valid: bool | None = None, known_bugs: bool = True) -> list[Any]:
    """Return the cases of one file as pytest params (id from the case), optionally only valid/invalid ones.

    With ``known_bugs`` the cases listed in :data:`KNOWN_BUGS` are marked as strict xfails; tests that only
    check the vectors themselves pass ``known_bugs=False``.
    """
    params = []
    for case in load(stem)["cases"]:
        if valid is not None and case.get("valid") is not valid:
            continue
        bug = KNOWN_BUGS.get(f"{stem}/{case['id']}") if known_bugs else None
        marks = [pytest.mark.xfail(reason=bug, strict=True)] if bug else []
        params.append(pytest.param(case, id=case["id"], marks=marks))
    return params


def text_of(case: Case, field: str) -> str:
    """Return the string under ``field``, or the bytes under ``<field>_hex`` mapped with surrogateescape.

    Bytes that are not UTF-8 cannot be a Python ``str``; surrogateescape turns each bad byte into a lone
    surrogate, which is how such a value reaches Python code from a byte-oriented source.
    """
    if field in case:
        value: str = case[field]
        return value
    return bytes.fromhex(case[f"{field}_hex"]).decode("utf-8", "surrogateescape")


def bytes_of(case: Case, field: str) -> bytes:
    """Return the UTF-8 of the string under ``field``, or the bytes under ``<field>_hex``."""
    if field in case:
        return str(case[field]).encode("utf-8")
    return bytes.fromhex(case[f"{field}_hex"])


def entry_of(data: dict[str, str]) -> Entry:
    """Build an :class:`Entry` from a JSON entry object (u64 values are decimal strings)."""
    return Entry(int(data["epoch"]), int(data["step"]), data["save"])


def expected_entry(case: Case) -> Entry:
    """Return the entry a valid ``names.json`` case decodes to."""
    return entry_of(case)


def b32(raw: bytes) -> str:
    """Unpadded RFC 4648 base32, from the standard library (independent of ckpt's encoder)."""
    return base64.b32encode(raw).decode("ascii").rstrip("=")


def format_name(data: dict[str, str]) -> str:
    """Encode a JSON entry object with the standard library (independent of ckpt)."""
    return f"{int(data['epoch']):020d}-{int(data['step']):020d}-{b32(data['save'].encode('utf-8'))}"


def valid_names() -> list[str]:
    """Return every valid name of ``names.json``, in file order."""
    return [case["name"] for case in load("names")["cases"] if case["valid"]]


POSITIONS = ("first", "middle", "last")


def insert_at(names: list[str], name: str, position: str) -> list[str]:
    """Return ``names`` with ``name`` inserted first, in the middle or last."""
    at = {"first": 0, "middle": len(names) // 2, "last": len(names)}[position]
    return [*names[:at], name, *names[at:]]


def malformed_name(call: Callable[[], object]) -> str | None:
    """Run ``call``; return the ``value`` of the MalformedError it raises (failing if it raises nothing)."""
    with pytest.raises(MalformedError) as exc:
        call()
    return exc.value.value


class TestVectorFiles:
    """Every vector file has the shape ``docs/vectors.md`` promises."""

    @pytest.mark.parametrize("stem", VECTOR_FILES)
    def test_document_shape(self, stem: str) -> None:
        """A file is an object with version 1, a description and a non-empty list of cases."""
        document = load(stem)
        assert sorted(document) == ["cases", "description", "version"]
        assert document["version"] == 1
        assert isinstance(document["description"], str)
        assert document["description"]
        assert isinstance(document["cases"], list)
        assert document["cases"]

    @pytest.mark.parametrize("stem", VECTOR_FILES)
    def test_case_ids_are_unique_kebab_case(self, stem: str) -> None:
        """Case ids are unique within a file and spelled in lower-case kebab case."""
        ids = [case["id"] for case in load(stem)["cases"]]
        bad = [i for i in ids if not CASE_ID.fullmatch(i)]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        assert bad == []
        assert duplicates == []

    @pytest.mark.parametrize(
        "stem",
        [
            *("names", "numbers", "saves", "attempts", "prune", "journal", "decision", "s3_roots"),
            *("world_size_record", "epoch_record", "manifest"),
        ],
    )
    def test_invalid_cases_carry_a_reason_and_a_note(self, stem: str) -> None:
        """Every invalid case has a kebab-case reason code and a human note."""
        invalid = [case for case in load(stem)["cases"] if case["valid"] is False]
        assert invalid
        without = [
            case["id"]
            for case in invalid
            if not CASE_ID.fullmatch(case.get("reason", "")) or not case.get("note")
        ]
        assert without == []

    def test_names_file_is_large_enough(self) -> None:
        """``names.json`` holds at least 40 valid and 60 invalid names."""
        valid = sum(1 for case in load("names")["cases"] if case["valid"])
        invalid = sum(1 for case in load("names")["cases"] if not case["valid"])
        assert valid >= 40
        assert invalid >= 60


class TestVectorsAreSelfConsistent:
    """The vectors agree with an independent derivation (standard-library base64, plain arithmetic)."""

    @pytest.mark.parametrize("case", cases("names", valid=True, known_bugs=False))
    def test_valid_name_is_the_independent_encoding(self, case: Case) -> None:
        """A valid name is the zero-padded numbers and the stdlib base32 of the save's UTF-8 bytes."""
        assert case["name"] == format_name(case)
        assert len(case["name"]) <= 255

    @pytest.mark.parametrize(
        "case", [p for p in cases("names", valid=False, known_bugs=False) if "save_hex" in p.values[0]]
    )
    def test_bad_save_name_only_fails_by_its_save(self, case: Case) -> None:
        """A name refused for its save is otherwise canonical: the stdlib encoding of the bytes it carries."""
        raw = bytes.fromhex(case["save_hex"])
        prefix = case["name"][:42]
        assert case["name"] == prefix + b32(raw)
        assert case["reason"].startswith("save-")

    @pytest.mark.parametrize("case", cases("numbers", valid=True, known_bugs=False))
    def test_number_value_is_the_decimal_text(self, case: Case) -> None:
        """A valid number's value is its ASCII digits read in base ten, and fits in 64 bits."""
        text = case["text"]
        value = 0
        for digit in text:
            value = value * 10 + "0123456789".index(digit)
        assert str(value) == case["value"]
        assert value <= 2**64 - 1

    @pytest.mark.parametrize("case", cases("order", known_bugs=False))
    def test_ascending_is_a_permutation_sorted_by_key(self, case: Case) -> None:
        """``ascending`` is the input reordered by (epoch, step, save in code-point order)."""
        keys = [(int(e["epoch"]), int(e["step"]), e["save"]) for e in case["entries"]]
        ascending = [(int(e["epoch"]), int(e["step"]), e["save"]) for e in case["ascending"]]
        assert ascending == sorted(keys)

    @pytest.mark.parametrize("case", cases("order", known_bugs=False))
    def test_name_order_flag_is_true(self, case: Case) -> None:
        """``name_order_differs`` says whether sorting the names as strings would change the order."""
        names = [format_name(e) for e in case["ascending"]]
        assert (sorted(names) != names) is case["name_order_differs"]


class TestParseEntryName:
    """``parse_entry_name``, the reference parser, on ``names.json``."""

    @pytest.mark.parametrize("case", cases("names", valid=True))
    def test_valid_name_decodes(self, case: Case) -> None:
        """A valid name decodes to the epoch, step and save the vector gives."""
        actual = parse_entry_name(case["name"])
        assert actual == expected_entry(case)

    @pytest.mark.parametrize("case", cases("names", valid=False))
    def test_invalid_name_is_malformed(self, case: Case) -> None:
        """An invalid name raises MalformedError carrying the name."""
        assert malformed_name(lambda: parse_entry_name(case["name"])) == case["name"]


class TestFormatEntryName:
    """``format_entry_name`` on ``names.json`` and ``saves.json``."""

    @pytest.mark.parametrize("case", cases("names", valid=True))
    def test_round_trip(self, case: Case) -> None:
        """Formatting the decoded entry gives back the name, byte for byte."""
        actual = format_entry_name(expected_entry(case))
        assert actual == case["name"]

    @pytest.mark.parametrize("case", cases("saves", valid=True))
    def test_name_length_limit(self, case: Case) -> None:
        """A save of at most 133 bytes round-trips through a name; a longer one raises InvalidError."""
        entry = Entry(1, 2, case["save"])
        if case["fits_in_name"]:
            assert parse_entry_name(format_entry_name(entry)) == entry
        else:
            with pytest.raises(InvalidError):
                format_entry_name(entry)


class TestParseEntryNames:
    """``parse_entry_names``, the bulk parser, on ``names.json``."""

    @pytest.mark.parametrize("case", cases("names", valid=True))
    def test_valid_name_alone(self, case: Case) -> None:
        """A listing of one valid name gives its one entry."""
        actual = parse_entry_names([case["name"]])
        assert actual == [expected_entry(case)]

    def test_all_valid_names_together(self) -> None:
        """A listing of every valid name gives every entry, ascending, whatever the listing order."""
        expected = sorted(
            (expected_entry(p.values[0]) for p in cases("names", valid=True)), key=lambda e: e.key
        )
        names = valid_names()
        assert parse_entry_names(names) == expected
        assert parse_entry_names(names[::-1]) == expected

    def test_empty_listing(self) -> None:
        """An empty listing gives no entries."""
        assert parse_entry_names([]) == []

    @pytest.mark.parametrize("position", POSITIONS)
    @pytest.mark.parametrize("case", cases("names", valid=False))
    def test_invalid_name_among_valid_ones(self, case: Case, position: str) -> None:
        """One invalid name first, in the middle or last among valid ones raises MalformedError naming it."""
        listing = insert_at(valid_names(), case["name"], position)
        assert malformed_name(lambda: parse_entry_names(listing)) == case["name"]

    def test_first_invalid_name_in_listing_order(self) -> None:
        """With several invalid names, the error names the first one in listing order."""
        invalid = [p.values[0]["name"] for p in cases("names", valid=False)]
        names = valid_names()
        for first in (invalid[0], invalid[-1], invalid[len(invalid) // 2]):
            listing = [names[0], first, *names[1:], *invalid]
            assert malformed_name(lambda listing=listing: parse_entry_names(listing)) == first


class TestLatestEntryOfNames:
    """``latest_entry_of_names``, the bulk path of ``resolve``, on ``names.json`` and ``order.json``."""

    @pytest.mark.parametrize("case", cases("names", valid=True))
    def test_valid_name_alone(self, case: Case) -> None:
        """A listing of one valid name gives its entry."""
        assert latest_entry_of_names([case["name"]]) == expected_entry(case)

    def test_all_valid_names_together(self) -> None:
        """A listing of every valid name gives the greatest entry."""
        expected = max((expected_entry(p.values[0]) for p in cases("names", valid=True)), key=lambda e: e.key)
        assert latest_entry_of_names(valid_names()) == expected
        assert latest_entry_of_names(valid_names()[::-1]) == expected

    def test_empty_listing(self) -> None:
        """An empty listing has no latest entry."""
        assert latest_entry_of_names([]) is None

    def test_the_old_name_is_the_same_function(self) -> None:
        """``latest_entry_name``, the old name (it returns an entry, not a name), stays as an alias."""
        from ckpt.domain import names

        assert names.latest_entry_name is latest_entry_of_names

    @pytest.mark.parametrize("position", POSITIONS)
    @pytest.mark.parametrize("case", cases("names", valid=False))
    def test_invalid_name_among_valid_ones(self, case: Case, position: str) -> None:
        """One invalid name among valid ones raises MalformedError naming it, wherever it sorts."""
        listing = insert_at(valid_names(), case["name"], position)
        assert malformed_name(lambda: latest_entry_of_names(listing)) == case["name"]

    @pytest.mark.parametrize("case", cases("order"))
    def test_latest_of_order_case(self, case: Case) -> None:
        """The latest entry of a listing is the last of the expected ascending order."""
        names = [format_entry_name(entry_of(e)) for e in case["entries"]]
        assert latest_entry_of_names(names) == entry_of(case["ascending"][-1])


@pytest.mark.parametrize("parse", [parse_epoch, parse_step], ids=["epoch", "step"])
class TestParseNumbers:
    """``parse_epoch`` and ``parse_step`` on ``numbers.json``."""

    @pytest.mark.parametrize("case", cases("numbers", valid=True))
    def test_valid(self, parse: Callable[[str], int], case: Case) -> None:
        """ASCII digits that fit in 64 bits parse to their value."""
        actual = parse(case["text"])
        assert actual == int(case["value"])

    @pytest.mark.parametrize("case", cases("numbers", valid=False))
    def test_invalid(self, parse: Callable[[str], int], case: Case) -> None:
        """Anything else raises InvalidError."""
        with pytest.raises(InvalidError):
            parse(case["text"])


class TestSaves:
    """``validate_save`` and ``save_error`` on ``saves.json``."""

    @pytest.mark.parametrize("case", cases("saves", valid=True))
    def test_valid(self, case: Case) -> None:
        """A valid save is returned unchanged and has no error."""
        assert validate_save(case["save"]) == case["save"]
        assert save_error(case["save"]) is None

    @pytest.mark.parametrize("case", cases("saves", valid=False))
    def test_invalid(self, case: Case) -> None:
        """An invalid save raises InvalidError, and save_error explains why."""
        save = text_of(case, "save")
        with pytest.raises(InvalidError):
            validate_save(save)
        assert isinstance(save_error(save), str)

    def test_reason_codes_match_the_errors(self) -> None:
        """Cases sharing a reason code get the same explanation, and different codes different ones."""
        by_reason: dict[str, set[str | None]] = {}
        for p in cases("saves", valid=False, known_bugs=False):
            case = p.values[0]
            by_reason.setdefault(case["reason"], set()).add(save_error(text_of(case, "save")))
        ambiguous = {reason: errors for reason, errors in by_reason.items() if len(errors) != 1}
        assert ambiguous == {}
        phrases = [next(iter(errors)) for errors in by_reason.values()]
        assert len(set(phrases)) == len(phrases)


class TestAttempts:
    """``validate_attempt`` on ``attempts.json``."""

    @pytest.mark.parametrize("case", cases("attempts", valid=True))
    def test_valid(self, case: Case) -> None:
        """A valid attempt is returned unchanged and makes a valid ``exec/<attempt>`` save."""
        assert validate_attempt(case["attempt"]) == case["attempt"]
        assert save_error(f"exec/{case['attempt']}") is None

    @pytest.mark.parametrize("case", cases("attempts", valid=False))
    def test_invalid(self, case: Case) -> None:
        """An invalid attempt raises InvalidError."""
        with pytest.raises(InvalidError):
            validate_attempt(text_of(case, "attempt"))


class TestWorldSizeRecords:
    """``parse_world_size_record`` and ``format_world_size_record`` on ``world_size_record.json``."""

    @pytest.mark.parametrize("case", cases("world_size_record", valid=True))
    def test_valid(self, case: Case) -> None:
        """A valid record parses to its world size, and formatting that size gives the same bytes back."""
        data = bytes_of(case, "content")
        assert parse_world_size_record(data) == case["world_size"]
        assert format_world_size_record(case["world_size"]) == data

    @pytest.mark.parametrize("case", cases("world_size_record", valid=False))
    def test_invalid(self, case: Case) -> None:
        """A malformed record is MalformedError (a reader then treats the world size as unknown)."""
        with pytest.raises(MalformedError):
            parse_world_size_record(bytes_of(case, "content"))

    @pytest.mark.parametrize("case", cases("world_size_record", valid=True, known_bugs=False))
    def test_valid_case_is_the_independent_encoding(self, case: Case) -> None:
        """A valid case is the world size in plain decimal and a newline, in range (no ckpt code)."""
        assert isinstance(case["world_size"], int)
        assert 1 <= case["world_size"] <= 2**31 - 1
        assert bytes_of(case, "content") == f"{case['world_size']}\n".encode("ascii")


class TestOrder:
    """Entry order on ``order.json``."""

    @pytest.mark.parametrize("case", cases("order"))
    def test_sort(self, case: Case) -> None:
        """Sorting the entries gives the expected ascending order."""
        expected = [entry_of(e) for e in case["ascending"]]
        entries = [entry_of(e) for e in case["entries"]]
        assert sorted(entries) == expected
        assert sort_entries(entries) == expected

    @pytest.mark.parametrize("case", cases("order"))
    def test_comparisons_follow_the_order(self, case: Case) -> None:
        """Each entry is strictly less than every later entry of the ascending order."""
        ascending = [entry_of(e) for e in case["ascending"]]
        wrong = [
            (a, b)
            for i, a in enumerate(ascending)
            for b in ascending[i + 1 :]
            if not (a < b and a <= b and b > a and b >= a and a != b)
        ]
        assert wrong == []

    @pytest.mark.parametrize("case", cases("order"))
    def test_parse_entry_names_sorts(self, case: Case) -> None:
        """The bulk parser returns the listing's entries in the expected order."""
        names = [format_entry_name(entry_of(e)) for e in case["entries"]]
        assert parse_entry_names(names) == [entry_of(e) for e in case["ascending"]]


class TestOverlap:
    """``overlaps`` and ``Overlap`` on ``overlap.json``."""

    @pytest.mark.parametrize("case", cases("overlap"))
    def test_overlaps(self, case: Case) -> None:
        """``overlaps`` answers as the vector says."""
        entries = [entry_of(e) for e in case["entries"]]
        assert overlaps(case["folder"], entries) is case["expected"]

    @pytest.mark.parametrize("case", cases("overlap"))
    def test_overlap_index(self, case: Case) -> None:
        """The reusable ``Overlap`` index answers the same."""
        index = Overlap(e["save"] for e in case["entries"])
        assert index(case["folder"]) is case["expected"]


class TestPhysicalOverlap:
    """``PhysicalOverlap`` on ``overlap_physical.json``."""

    @pytest.mark.parametrize("case", cases("overlap_physical"))
    def test_physical_overlap(self, case: Case) -> None:
        """A candidate's chain overlaps the needed chains exactly when the vector says."""
        needed = PhysicalOverlap(None if chain is None else tuple(chain) for chain in case["needed"])
        folder = None if case["folder"] is None else tuple(case["folder"])
        assert needed(folder) is case["expected"]


class TestPlanPrune:
    """``plan_prune`` on ``prune.json``."""

    @pytest.mark.parametrize("case", cases("prune", valid=True))
    def test_plan(self, case: Case) -> None:
        """The plan keeps, removes and proposes exactly the vector's entries and folders."""
        plan = plan_prune([entry_of(e) for e in case["entries"]], case["keep"])
        assert list(plan.keep) == [entry_of(e) for e in case["kept"]]
        assert list(plan.remove) == [entry_of(e) for e in case["removed"]]
        assert list(plan.folders) == case["folders"]

    @pytest.mark.parametrize("case", cases("prune", valid=False))
    def test_invalid_keep(self, case: Case) -> None:
        """A keep below 1 raises InvalidError."""
        with pytest.raises(InvalidError):
            plan_prune([entry_of(e) for e in case["entries"]], case["keep"])


class TestRecheckFolders:
    """``recheck_folders`` on ``prune_recheck.json``."""

    @pytest.mark.parametrize("case", cases("prune_recheck"))
    def test_recheck(self, case: Case) -> None:
        """The folders still removed and the planned folders skipped, with their reasons, are the vector's."""
        pins = case.get("pins", [])
        check = recheck_folders(case["planned"], case["left"], [*case["saves"], *pins])
        # The pure function judges against every save alike; which of its skips a pin made is told apart by
        # ckpt.application.pruning (PruneRun._finish), with the same Overlap of the pins as here.
        pinned = Overlap(pins)
        skipped = [[folder, SKIP_PINNED if pinned(folder) else why] for folder, why in check.skipped]
        assert list(check.remove) == case["remove"]
        assert skipped == case["skipped"]

    @pytest.mark.parametrize("case", [c for c in cases("prune_recheck") if not c.values[0].get("pins")])
    def test_recheck_without_pins_is_the_pure_function(self, case: Case) -> None:
        """Without pins, the pure function alone gives the vector's skips and their reasons."""
        check = recheck_folders(case["planned"], case["left"], case["saves"])
        assert [list(skip) for skip in check.skipped] == case["skipped"]


class TestLeftoverFolders:
    """``leftover_folders`` on ``leftover.json``: the folders a prune inherits from earlier journals."""

    @pytest.mark.parametrize("case", cases("leftover"))
    def test_inherited(self, case: Case) -> None:
        """The inherited folders are the vector's: journal folders not planned and not named by what stays."""
        kept = tuple(Entry(1, step, save) for step, save in enumerate(case["kept"]))
        plan = PrunePlan(keep=kept, remove=(), folders=tuple(case["planned"]))
        # leftover_folders knows the plan only; the pins and the spared entries are applied on top by
        # CheckpointStore.prune (ckpt.application.checkpoint_store), with an Overlap of their saves as here.
        protected = Overlap([*case["pins"], *case["spared"]])
        inherited = [f for f in leftover_folders(plan, case["journal_folders"]) if not protected(f)]
        assert sorted(inherited) == case["inherited"]

    @pytest.mark.parametrize(
        "case", [c for c in cases("leftover") if not (c.values[0]["pins"] or c.values[0]["spared"])]
    )
    def test_inherited_without_pins_is_the_pure_function(self, case: Case) -> None:
        """Without pins or spared entries, the pure function alone gives the vector's folders, sorted."""
        kept = tuple(Entry(1, step, save) for step, save in enumerate(case["kept"]))
        plan = PrunePlan(keep=kept, remove=(), folders=tuple(case["planned"]))
        assert list(leftover_folders(plan, case["journal_folders"])) == case["inherited"]

    @pytest.mark.parametrize("case", cases("leftover", known_bugs=False))
    def test_inherited_is_listed_in_code_point_order(self, case: Case) -> None:
        """A case lists its inherited folders once each, in code-point order (no ckpt code)."""
        assert case["inherited"] == sorted(set(case["inherited"]))


class TestEpochRecords:
    """``parse_epoch_record`` and ``format_epoch_record`` on ``epoch_record.json``."""

    @pytest.mark.parametrize("case", cases("epoch_record", valid=True))
    def test_valid(self, case: Case) -> None:
        """A valid record parses to its epoch, and formatting that epoch gives the same bytes back."""
        data = bytes_of(case, "content")
        assert parse_epoch_record(data) == int(case["epoch"])
        assert format_epoch_record(int(case["epoch"])) == data

    @pytest.mark.parametrize("case", cases("epoch_record", valid=False))
    def test_invalid(self, case: Case) -> None:
        """A malformed record is MalformedError (a reader then treats the record as absent)."""
        with pytest.raises(MalformedError):
            parse_epoch_record(bytes_of(case, "content"))

    @pytest.mark.parametrize("case", cases("epoch_record", valid=True, known_bugs=False))
    def test_valid_case_is_the_independent_encoding(self, case: Case) -> None:
        """A valid case is the epoch in plain decimal and one newline, in 64 bits (no ckpt code)."""
        epoch = int(case["epoch"])
        assert 0 <= epoch <= 2**64 - 1
        assert bytes_of(case, "content") == f"{epoch}\n".encode("ascii")


# The reason codes of catch_up.json and the words of the Python message that name each rule (watcher.md §7.3;
# the message texts are not normative, so a port matches the codes its own way).
CATCH_UP_REASONS = {
    "unknown-epoch": "epoch is unknown",
    "newer": "a newer execution",
    "older-than-published": "than the newest published epoch",
    "too-long": "too long for its saves' longest name",
}


class TestCatchUpPlan:
    """``plan_catch_up`` on ``catch_up.json``: the folders a catch-up looks into, at what epoch."""

    @staticmethod
    def plan(case: Case) -> Any:
        """Run the planner on the case's inputs."""
        folders = {name: None if epoch is None else int(epoch) for name, epoch in case["folders"].items()}
        return plan_catch_up(
            case["attempt"],
            int(case["epoch"]),
            folders,
            [entry_of(e) for e in case["entries"]],
            longest_name=case["longest_name"],
            sub_folder=case.get("sub_folder", ""),
        )

    @pytest.mark.parametrize("case", cases("catch_up"))
    def test_targets(self, case: Case) -> None:
        """The targets are the vector's, at its epochs, in ascending (epoch, attempt) order."""
        targets = [(t.attempt, t.epoch) for t in self.plan(case).targets]
        assert targets == [(t["attempt"], int(t["epoch"])) for t in case["targets"]]

    @pytest.mark.parametrize("case", cases("catch_up"))
    def test_passed_over(self, case: Case) -> None:
        """The folders passed over are the vector's, each for the rule its reason code names."""
        passed = sorted((p.attempt, p.reason) for p in self.plan(case).passed)
        expected = sorted((p["attempt"], p["reason"]) for p in case["passed"])
        assert [attempt for attempt, _ in passed] == [attempt for attempt, _ in expected]
        wrong = [
            (attempt, code, reason)
            for (attempt, reason), (_, code) in zip(passed, expected, strict=True)
            if CATCH_UP_REASONS[code] not in reason
        ]
        assert wrong == []

    @pytest.mark.parametrize("case", cases("catch_up", known_bugs=False))
    def test_every_folder_is_targeted_or_passed_once(self, case: Case) -> None:
        """Each listed folder, and the current one, is a target or passed over, never both (no ckpt code)."""
        named = [t["attempt"] for t in case["targets"]] + [p["attempt"] for p in case["passed"]]
        assert sorted(named) == sorted({*case["folders"], case["attempt"]})
        assert all(p["reason"] in CATCH_UP_REASONS for p in case["passed"])
        keys = [(int(t["epoch"]), t["attempt"]) for t in case["targets"]]
        assert keys == sorted(keys)


# Journals that a writer produces (the others are unfinished files only a reader meets).
JOURNAL_FORMAT_CASES = [c for c in cases("journal", valid=True) if "parse_only" not in c.values[0]]


class TestPruneJournal:
    """``format_journal`` and ``parse_journal`` on ``journal.json``."""

    @pytest.mark.parametrize("case", JOURNAL_FORMAT_CASES)
    def test_format(self, case: Case) -> None:
        """A journal is written byte for byte as the vector says."""
        entries = [parse_entry_name(name) for name in case["entries"]]
        assert format_journal(case["folders"], entries) == case["text"].encode("utf-8")

    @pytest.mark.parametrize("case", cases("journal", valid=True))
    def test_parse(self, case: Case) -> None:
        """A journal lists the vector's folders and entries; an unfinished one lists none."""
        assert parse_journal("j", bytes_of(case, "text")) == case["folders"]
        content = read_journal("j", bytes_of(case, "text"))
        assert [format_entry_name(e) for e in content.entries] == case["entries"]

    @pytest.mark.parametrize("case", cases("journal", valid=False))
    def test_refused(self, case: Case) -> None:
        """A finished journal with a bad header or folder is MalformedError naming the journal."""
        with pytest.raises(MalformedError, match=re.escape("/root/.ckpt-prune-0")):
            parse_journal("/root/.ckpt-prune-0", bytes_of(case, "text"))


class TestPruneDecision:
    """``decide``, ``format_decision`` and ``parse_decision`` on ``decision.json``."""

    @pytest.mark.parametrize("case", cases("decision", valid=True))
    def test_decide_format_and_parse(self, case: Case) -> None:
        """The entries removed for good, the decision's text byte for byte, and the text read back."""

        def entries(key: str) -> list[Entry]:
            return [parse_entry_name(name) for name in case[key]]

        removed = decide(
            JournalContent((), tuple(entries("journal_entries"))), entries("present"), entries("pinned")
        )
        assert sorted(format_entry_name(e) for e in removed) == case["removed"]
        assert format_decision(removed) == case["text"].encode("utf-8")
        assert parse_decision("d", case["text"].encode("utf-8")) == removed

    @pytest.mark.parametrize("case", cases("decision", valid=False))
    def test_refused(self, case: Case) -> None:
        """A decision that is unfinished, of another version or lists a bad entry is MalformedError."""
        with pytest.raises(MalformedError, match=re.escape("/root/.ckpt-prune-0.decided")):
            parse_decision("/root/.ckpt-prune-0.decided", bytes_of(case, "text"))


class TestS3Roots:
    """``parse_s3_root`` on ``s3_roots.json``."""

    @pytest.mark.parametrize("case", cases("s3_roots", valid=True))
    def test_parse(self, case: Case) -> None:
        """A valid root gives the vector's bucket, prefix and canonical URL."""
        root = parse_s3_root(case["root"])
        assert (root.bucket, root.prefix, root.url) == (case["bucket"], case["prefix"], case["url"])

    @pytest.mark.parametrize("case", cases("s3_roots", valid=False))
    def test_refused(self, case: Case) -> None:
        """An invalid root is InvalidError, and its message never shows user-info."""
        with pytest.raises(InvalidError) as caught:
            parse_s3_root(case["root"])
        if "secret" in case:
            assert case["secret"] not in str(caught.value)


class TestRemovingVectors:
    """``Removing`` on ``removing.json``: which journal, if any, makes a save one being removed."""

    @pytest.mark.parametrize("case", cases("removing"))
    def test_journal_of(self, case: Case) -> None:
        """``journal_of`` names the journal the vector expects, or none."""
        journals = [(j["name"], j["text"].encode("utf-8")) for j in case["journals"]]
        assert Removing.of_journals(journals).journal_of(case["save"]) == case["expected"]
