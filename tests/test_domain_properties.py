"""Property tests (hypothesis) for the pure core: names, order, overlap and the prune plan.

The oracles here are written independently of ``ckpt``: the standard library's ``base64`` for the wire format,
and naive element-wise loops for saves, overlap and pruning.

The bulk parsers (``parse_entry_names``, ``latest_entry_of_names``, ``LatestEntryScan``) are held to the
reference parser ``parse_entry_name`` on arbitrary listings (:class:`TestBulkAgreesWithReference`). That is
what lets the bulk path be optimised safely, so the strategies aim at what a joined-listing, row-decoding
implementation gets wrong: names with exactly one defect (a number past 2**64 - 1, a save broken in one
way, a non-canonical or impossible base32 tail, one byte too long), names holding '\n' or separators,
ties on epoch-step, duplicates, and listings long enough to span several chunks.

The default run is derandomized (tests/support/fuzzing.py) and keeps the module at about 20 s;
:class:`TestFuzz` (marker ``fuzz``) runs a fixed few hundred texts through every parser there, and 10,000
random ones under ``python3 dev.py fuzz``.
"""

from __future__ import annotations

import base64
import itertools
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

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
from ckpt.domain.names import (
    LatestEntryScan,
    format_entry_name,
    latest_entry_of_names,
    parse_entry_name,
    parse_entry_names,
)
from ckpt.domain.prune import Overlap, PhysicalOverlap, overlaps, plan_prune
from support.fuzzing import fuzz_settings
from support.strategies import (
    ASCII_CONTROLS,
    B32_ALPHABET,
    MAX_SAVE_BYTES,
    MAX_U64,
    any_names,
    b32,
    edgy_names,
    element_chars,
    entries,
    fuzz_text,
    longest_saves,
    mixed_listings,
    mutated_names,
    newline_names,
    one_defect_names,
    oracle_save_ok,
    tail_edited_names,
    tied_entries,
    tied_names,
    tree_entries,
    tree_paths,
    valid_saves,
)

# ----------------------------------------------------------------------------------------------------------
# Independent oracles (no ckpt code).


def oracle_name(epoch: int, step: int, save: str) -> str:
    """The entry name spec/names.md prescribes, built from the standard library."""
    return f"{epoch:020d}-{step:020d}-{b32(save.encode('utf-8'))}"


def oracle_attempt_ok(attempt: str) -> bool:
    """spec/layout.md for attempts, spelled out naively."""
    try:
        size = len(attempt.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return (
        attempt not in {"", ".", ".."}
        and "/" not in attempt
        and not any(ch in ASCII_CONTROLS for ch in attempt)
        and size <= 255
    )


_ORACLE_NAME = re.compile(r"([0-9]{20})-([0-9]{20})-([A-Z2-7]+)")


def oracle_parse(name: str) -> tuple[int, int, str] | None:
    """Decode ``name`` as spec/names.md says, or return None: decode, then insist the encoding is
    canonical."""
    match = _ORACLE_NAME.fullmatch(name)
    if match is None or len(name.encode("utf-8")) > 255:
        return None
    epoch, step, text = int(match[1]), int(match[2]), match[3]
    if epoch > MAX_U64 or step > MAX_U64 or len(text) % 8 in (1, 3, 6):
        return None
    raw = base64.b32decode(text + "=" * (-len(text) % 8))
    try:
        save = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not oracle_save_ok(save) or oracle_name(epoch, step, save) != name:
        return None
    return epoch, step, save


def elements_of(path: str) -> list[str]:
    """Split a save path into its elements."""
    return path.split("/")


def naive_overlap(folder: str, save: str) -> bool:
    """True when one path is the other or lies inside it, comparing whole elements."""
    f, s = elements_of(folder), elements_of(save)
    n = min(len(f), len(s))
    return f[:n] == s[:n]


def naive_inside(inner: str, outer: str) -> bool:
    """True when ``inner`` is ``outer`` or lies inside it, comparing whole elements."""
    i, o = elements_of(inner), elements_of(outer)
    return i[: len(o)] == o


# ----------------------------------------------------------------------------------------------------------
# Helpers comparing the bulk parsers with the reference.

Outcome = tuple[str, object]


def outcome(call: Callable[[], object]) -> Outcome:
    """Run a parser: ("ok", result) or ("malformed", the name the MalformedError carries)."""
    try:
        return ("ok", call())
    except MalformedError as exc:
        return ("malformed", exc.value)


def reference_entries(names: Sequence[str]) -> Outcome:
    """What ``parse_entry_names`` must answer, computed with the reference parser name by name."""
    parsed = []
    for name in names:
        try:
            parsed.append(parse_entry_name(name))
        except MalformedError as exc:
            return ("malformed", exc.value)
    return ("ok", sorted(parsed, key=lambda e: e.key))


def latest_of(expected: Outcome) -> Outcome:
    """What ``latest_entry_of_names`` must answer, given what ``parse_entry_names`` must answer."""
    kind, value = expected
    if kind == "malformed":
        return expected
    assert isinstance(value, list)
    return ("ok", value[-1] if value else None)


def scan_latest(names: list[str], cuts: list[int]) -> Entry | None:
    """Run :class:`LatestEntryScan` over ``names`` cut into chunks at ``cuts``."""
    scan = LatestEntryScan()
    bounds = [0, *sorted(min(c, len(names)) for c in cuts), len(names)]
    for start, end in itertools.pairwise(bounds):
        scan.add(names[start:end])
    return scan.result()


def assert_bulk_agrees(names: list[str]) -> None:
    """Both bulk parsers give the reference's entries, or raise naming the reference's first bad name."""
    expected = reference_entries(names)
    assert outcome(lambda: parse_entry_names(names)) == expected
    assert outcome(lambda: latest_entry_of_names(names)) == latest_of(expected)
    assert outcome(lambda: scan_latest(names, [len(names) // 2])) == latest_of(expected)


# ----------------------------------------------------------------------------------------------------------
# Tests.


class TestRoundTrip:
    """Names encode and decode without loss (spec/names.md)."""

    @given(entry=entries)
    def test_name_round_trip(self, entry: Entry) -> None:
        """Every entry's name is the spec's encoding and decodes, alone or in bulk, to the entry."""
        name = format_entry_name(entry)
        assert name == oracle_name(entry.epoch, entry.step, entry.save)
        assert parse_entry_name(name) == entry
        assert parse_entry_names([name]) == [entry]
        assert latest_entry_of_names([name]) == entry

    @given(save=longest_saves)
    def test_longest_save_fills_the_name(self, save: str) -> None:
        """A 133-byte save gives a name of exactly 255 bytes, which parses back."""
        name = format_entry_name(Entry(MAX_U64, MAX_U64, save))
        assert len(name) == 255
        assert parse_entry_name(name).save == save

    @given(save=valid_saves, extra=st.text(element_chars, min_size=1, max_size=40))
    def test_longer_save_is_refused(self, save: str, extra: str) -> None:
        """A valid save of more than 133 bytes cannot be named: InvalidError."""
        longer = f"{save}/{extra}" if extra not in {".", ".."} else f"{save}/x{extra}"
        assume(len(longer.encode("utf-8")) > MAX_SAVE_BYTES)
        with pytest.raises(InvalidError):
            format_entry_name(Entry(0, 0, longer))


class TestCanonicalForm:
    """Parsing is exact: only the encoder's own output is accepted (spec/names.md)."""

    @given(name=mutated_names())
    def test_single_edit_is_refused_unless_canonical(self, name: str) -> None:
        """After one replace/insert/delete, a name is accepted only if it re-encodes to itself."""
        expected = oracle_parse(name)
        kind, entry = outcome(lambda: parse_entry_name(name))
        if kind == "malformed":
            assert (entry, expected) == (name, None)
        else:
            assert isinstance(entry, Entry)
            assert format_entry_name(entry) == name
            assert entry.key == expected

    @given(
        name=st.one_of(
            one_defect_names(), edgy_names, tail_edited_names(), newline_names, st.text(max_size=60)
        )
    )
    def test_reference_parser_matches_the_oracle(self, name: str) -> None:
        """On edgy and arbitrary text, the reference parser accepts exactly what the spec's oracle accepts."""
        expected = oracle_parse(name)
        actual = outcome(lambda: parse_entry_name(name))
        if expected is None:
            assert actual == ("malformed", name)
        else:
            assert actual == ("ok", Entry(*expected))

    @given(save=st.text(max_size=20))
    def test_save_error_matches_the_oracle(self, save: str) -> None:
        """``save_error`` refuses exactly the saves spec/layout.md refuses."""
        assert (save_error(save) is None) is oracle_save_ok(save)


class TestBulkAgreesWithReference:
    """The bulk parsers answer exactly as the reference parser does, on any listing."""

    @given(names=mixed_listings())
    def test_mixed_listings(self, names: list[str]) -> None:
        """Mostly-valid listings with mutated, edgy, newline and arbitrary names mixed in."""
        assert_bulk_agrees(names)

    @settings(max_examples=400)
    @given(name=one_defect_names())
    def test_one_defect(self, name: str) -> None:
        """A name with exactly one defect is judged alike by the bulk parsers and the reference."""
        assert_bulk_agrees([name])

    @given(
        names=st.lists(tied_names, max_size=12),
        defects=st.lists(one_defect_names(), min_size=1, max_size=3),
        where=st.lists(st.integers(0, 12), min_size=3, max_size=3),
    )
    def test_one_defect_names_among_valid_ones(
        self, names: list[str], defects: list[str], where: list[int]
    ) -> None:
        """Names with one defect each, inserted among valid ones, are judged alike (first bad name wins)."""
        for defect, at in zip(defects, where, strict=False):
            names.insert(min(at, len(names)), defect)
        assert_bulk_agrees(names)

    @given(names=st.lists(any_names, max_size=10))
    def test_arbitrary_listings(self, names: list[str]) -> None:
        """Listings of anything at all, including several bad names."""
        assert_bulk_agrees(names)

    @given(names=st.lists(tied_names, max_size=40))
    def test_valid_listings_with_ties(self, names: list[str]) -> None:
        """Valid listings where many names share epoch-step (and some are duplicates)."""
        names = names + names[: len(names) // 3]
        assert_bulk_agrees(names)

    @given(
        name=st.one_of(newline_names, edgy_names, tail_edited_names()),
        before=st.lists(tied_names, max_size=5),
    )
    def test_one_bad_name_after_valid_ones(self, name: str, before: list[str]) -> None:
        """A single edgy or newline-carrying name after valid ones is judged like the reference judges it."""
        assert_bulk_agrees([*before, name])
        assert_bulk_agrees([*before, name, *before])

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        seeds=st.lists(tied_entries, min_size=1, max_size=6),
        size=st.sampled_from([1, 2, 100, 4095, 4096, 4097, 8193, 9000]),
        bad=st.one_of(st.none(), one_defect_names(), mutated_names(tied_names), edgy_names, newline_names),
        where=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1)),
    )
    def test_long_listings(self, seeds: list[Entry], size: int, bad: str | None, where: float) -> None:
        """Listings of up to 9000 names (several of the bulk path's chunks), valid or with one bad name
        anywhere, many tied on epoch-step, agree with the reference.
        """
        bases = [seed.save if len(seed.save.encode("utf-8")) <= 120 else "long" for seed in seeds]
        listing = [
            Entry(seed.epoch, seed.step, f"{base}/{i}")
            for i, seed, base in zip(
                range(size), itertools.cycle(seeds), itertools.cycle(bases), strict=False
            )
        ]
        names = [format_entry_name(e) for e in listing]
        # The valid names' verdict is known by construction; only the bad one needs the reference parser.
        expected: Outcome = ("ok", sorted(listing, key=lambda e: e.key))
        if bad is not None:
            names.insert(int(where * len(names)), bad)
            verdict = reference_entries([bad])
            if verdict[0] == "malformed":
                expected = verdict
            else:
                expected = ("ok", sorted([*listing, parse_entry_name(bad)], key=lambda e: e.key))
        assert outcome(lambda: parse_entry_names(names)) == expected
        assert outcome(lambda: latest_entry_of_names(names)) == latest_of(expected)
        assert outcome(lambda: scan_latest(names, [len(names) // 3, len(names) // 2])) == latest_of(expected)

    @given(names=mixed_listings(), cuts=st.lists(st.integers(0, 40), max_size=4))
    def test_latest_entry_scan_in_chunks(self, names: list[str], cuts: list[int]) -> None:
        """Feeding a listing to LatestEntryScan in arbitrary chunks answers as the reference does."""
        assert outcome(lambda: scan_latest(names, cuts)) == latest_of(reference_entries(names))


class TestBulkRowCheck:
    """Fixed examples for the bulk path's shape-and-roles check (names.py, step 3): it decides printable-ASCII
    listings alone, refuses every path rule it is meant to catch, and hands whatever it cannot decide to the
    exact regex (step 4), which must then run; a spy on that regex counts the hand-overs.
    """

    SAVES: ClassVar[list[str]] = [
        f"exec/{e}.41{e:02d}.0/checkpoint-{500 * i}" for e in (1, 2, 3) for i in range(1, 1201)
    ]

    @pytest.fixture
    def regex_runs(self, monkeypatch: pytest.MonkeyPatch) -> list[int]:
        from ckpt.domain import names

        runs: list[int] = []
        exact = names._ROWS

        class Spy:
            def fullmatch(self, text: str) -> re.Match[str] | None:
                runs.append(len(text))
                return exact.fullmatch(text)

        monkeypatch.setattr(names, "_ROWS", Spy())
        return runs

    def listing(self, saves: Sequence[str]) -> list[str]:
        return [format_entry_name(Entry(1 + i % 3, 10 * i, save)) for i, save in enumerate(saves)]

    def test_printable_ascii_listings_need_no_regex(self, regex_runs: list[int]) -> None:
        """3,600 ordinary names (four chunks) are validated, sorted and resolved without the regex."""
        names = self.listing(self.SAVES)
        expected = sorted(map(parse_entry_name, names), key=lambda e: e.key)
        assert parse_entry_names(names) == expected
        assert scan_latest(names, [1000, 2024]) == expected[-1]
        assert regex_runs == []

    @pytest.mark.parametrize(
        ("save", "why"),
        [
            ("/exec/a", "absolute"),
            ("exec/a/", "ends with '/'"),
            ("exec//a", "empty path element"),
            ("exec/./a", "'.' or '..'"),
            ("exec/..", "'.' or '..'"),
            (".", "'.' or '..'"),
            ("pub", "pub/"),
            ("pins/exec/a", "pins/"),
            (".ckpt-prune-0123456789abcdef", "starts with .ckpt-"),
            (".ckpt-doctor/x", "starts with .ckpt-"),
            ("exec/a\x7fb", "control character"),
            ("exec/a\tb", "control character"),
            ("exec/a\x00b", "control character"),
        ],
    )
    @pytest.mark.parametrize("where", [0, 1, 1500])
    def test_one_bad_save_among_ordinary_ones_is_named(self, save: str, why: str, where: int) -> None:
        """A save that breaks one path rule, first in a chunk or anywhere in it, is refused by name."""
        bad = f"00000000000000000009-00000000000000000009-{b32(save.encode())}"
        names = self.listing(self.SAVES[:2000])
        names.insert(where, bad)
        for parse in (parse_entry_names, latest_entry_of_names, lambda n: scan_latest(n, [1024])):
            with pytest.raises(MalformedError, match=re.escape(why)) as caught:
                parse(names)
            assert caught.value.value == bad

    def test_a_non_canonical_tail_that_decodes_to_a_printable_byte_is_named(self) -> None:
        """The unused bits of a part's last character, set, make the byte after the save printable ('@' here):
        the shape check must still see it is not the row's NUL."""
        name = format_entry_name(Entry(1, 1, "exec/a/ck"))  # 9 bytes: 15 characters, 3 unused bits
        assert len(name.split("-")[2]) % 8 == 7
        last = B32_ALPHABET.index(name[-1])
        assert last & 0b111 == 0
        bad = name[:-1] + B32_ALPHABET[last | 0b010]  # the unused bits 010: the byte after the save is 0x40
        assert (B32_ALPHABET.index(bad[-1]) & 0b111) << 5 == ord("@")
        names = self.listing(self.SAVES[:50])
        names.insert(7, bad)
        with pytest.raises(MalformedError, match="canonical") as caught:
            latest_entry_of_names(names)
        assert caught.value.value == bad

    @pytest.mark.parametrize(
        "save", [".hidden/a", "exec/.a", "p", "pubx/a", "pinsx", "exec/é/ck", "exec/a b", ".ckpt/a", ".ckptx"]
    )
    def test_what_the_check_cannot_decide_goes_to_the_regex(self, save: str, regex_runs: list[int]) -> None:
        """Valid saves it leaves undecided (an element led by '.', a save led by 'p', other UTF-8) are
        accepted by the regex, which runs once for the chunk that holds them; a space is decided alone."""
        names = self.listing(self.SAVES[:100])
        odd = format_entry_name(Entry(9, 9, save))
        names.insert(50, odd)
        assert latest_entry_of_names(names) == Entry(9, 9, save)
        assert len(regex_runs) == (0 if save == "exec/a b" else 1)


class TestOrder:
    """Entries are totally ordered by (epoch, step, save) (spec/names.md)."""

    @given(a=tied_entries, b=tied_entries)
    def test_comparisons_follow_the_key(self, a: Entry, b: Entry) -> None:
        """``<``, ``<=``, ``>``, ``>=`` and ``==`` agree with the key tuple."""
        assert (a < b, a <= b, a > b, a >= b, a == b) == (
            a.key < b.key,
            a.key <= b.key,
            a.key > b.key,
            a.key >= b.key,
            a.key == b.key,
        )

    @given(a=tied_entries, b=tied_entries)
    def test_code_point_order_is_byte_order(self, a: Entry, b: Entry) -> None:
        """Comparing saves as strings is comparing their UTF-8 bytes."""
        assert (a.save < b.save) is (a.save.encode("utf-8") < b.save.encode("utf-8"))

    @given(a=tied_entries, b=tied_entries)
    def test_name_order_is_entry_order_when_saves_do_not_decide(self, a: Entry, b: Entry) -> None:
        """When the saves are equal or epoch-step differ, names sort as their entries do."""
        assume(a.save == b.save or (a.epoch, a.step) != (b.epoch, b.step))
        name_a, name_b = format_entry_name(a), format_entry_name(b)
        assert (name_a < name_b, name_a == name_b) == (a < b, a == b)

    @given(listing=st.lists(tied_entries, max_size=20))
    def test_sort_and_latest(self, listing: list[Entry]) -> None:
        """Sorting gives a non-decreasing list whose last element is the latest entry."""
        ordered = sort_entries(listing)
        assert Counter(ordered) == Counter(listing)
        assert all(x <= y for x, y in itertools.pairwise(ordered))
        names = [format_entry_name(e) for e in listing]
        assert latest_entry_of_names(names) == (ordered[-1] if ordered else None)


class TestOverlap:
    """``Overlap`` and ``overlaps`` agree with a naive element-wise comparison (spec/operations.md)."""

    @given(folder=tree_paths, listing=st.lists(tree_entries, max_size=8))
    def test_matches_naive(self, folder: str, listing: list[Entry]) -> None:
        """A folder overlaps when some save is it, is inside it or contains it, element by element."""
        expected = any(naive_overlap(folder, e.save) for e in listing)
        assert overlaps(folder, listing) is expected
        assert Overlap(e.save for e in listing)(folder) is expected

    @given(folder=valid_saves, listing=st.lists(entries, max_size=5))
    def test_matches_naive_on_any_saves(self, folder: str, listing: list[Entry]) -> None:
        """The same on arbitrary valid saves (rarely overlapping, but with arbitrary characters)."""
        expected = any(naive_overlap(folder, e.save) for e in listing)
        assert Overlap(e.save for e in listing)(folder) is expected

    @given(folder=tree_paths, listing=st.lists(tree_entries, max_size=8))
    def test_physical_without_aliases_is_lexical(self, folder: str, listing: list[Entry]) -> None:
        """With every path its own identity (no link, no bind mount), ``PhysicalOverlap`` is ``Overlap``."""

        def chain(path: str) -> tuple[str, ...]:
            parts = elements_of(path)
            return (*("/".join(parts[:n]) for n in range(len(parts), 0, -1)), "")

        expected = any(naive_overlap(folder, e.save) for e in listing)
        assert PhysicalOverlap(chain(e.save) for e in listing)(chain(folder)) is expected


class TestPlanPrune:
    """``plan_prune`` partitions the entries and proposes only safe folders (spec/operations.md)."""

    @given(listing=st.lists(tree_entries, max_size=12), keep=st.integers(1, 14))
    def test_plan(self, listing: list[Entry], keep: int) -> None:
        """Keep + remove is the input; the keep greatest stay; folders are safe, complete and not nested."""
        plan = plan_prune(listing, keep)
        ordered = sorted(listing, key=lambda e: e.key)
        cut = max(len(ordered) - keep, 0)
        # Partition, and the `keep` greatest are the ones kept.
        assert Counter(plan.keep) + Counter(plan.remove) == Counter(listing)
        assert list(plan.keep) == ordered[cut:]
        assert list(plan.remove) == ordered[:cut]
        # Safe: no candidate overlaps a kept entry; every candidate is a removed entry's save.
        assert [f for f in plan.folders if any(naive_overlap(f, k.save) for k in plan.keep)] == []
        assert set(plan.folders) <= {e.save for e in plan.remove}
        # Complete: every removed save no kept entry needs is a candidate or inside one.
        free = {e.save for e in plan.remove if not any(naive_overlap(e.save, k.save) for k in plan.keep)}
        assert [s for s in free if not any(naive_inside(s, f) for f in plan.folders)] == []
        # Outermost only, each once, in code-point order.
        nested = [(f, g) for f in plan.folders for g in plan.folders if f != g and naive_inside(f, g)]
        assert nested == []
        assert list(plan.folders) == sorted(set(plan.folders))

    @given(listing=st.lists(tree_entries, max_size=5), keep=st.integers(max_value=0))
    def test_keep_below_one_is_refused(self, listing: list[Entry], keep: int) -> None:
        """``keep < 1`` raises InvalidError."""
        with pytest.raises(InvalidError):
            plan_prune(listing, keep)


@pytest.mark.fuzz
class TestFuzz:
    """Arbitrary text never crashes a parser, and whatever a parser accepts is canonical.

    Each example goes through several parsers (the name parsers in one test, the value parsers in the
    other), so that every parser sees 10,000 texts while the class stays near a minute.
    """

    @fuzz_settings()
    @given(texts=st.lists(fuzz_text, min_size=1, max_size=3))
    def test_name_parsers(self, texts: list[str]) -> None:
        """Only MalformedError escapes the name parsers; accepted names re-encode to themselves."""
        for text in texts:
            kind, entry = outcome(lambda text=text: parse_entry_name(text))
            if kind == "malformed":
                assert entry == text
            else:
                assert isinstance(entry, Entry)
                assert format_entry_name(entry) == text
        kind, parsed = outcome(lambda: parse_entry_names(texts))
        if kind == "malformed":
            assert parsed in texts
        else:
            assert isinstance(parsed, list)
            assert sorted(format_entry_name(e) for e in parsed) == sorted(texts)
        assert (kind, parsed) == reference_entries(texts)
        assert outcome(lambda: latest_entry_of_names(texts)) == latest_of((kind, parsed))

    @fuzz_settings()
    @given(text=fuzz_text)
    # Once escaped as a bare ValueError (int()'s 4300-digit limit), and once refused although valid.
    @example(text="1" * 4301)
    @example(text="0" * 4400 + "7")
    @example(text="0" * 19 + "1")
    def test_value_parsers(self, text: str) -> None:
        """Only InvalidError escapes the value parsers, and whatever they accept is canonical."""
        for parse in (parse_epoch, parse_step):
            try:
                value = parse(text)
            except InvalidError:
                digits = text.lstrip("0") or "0"  # int() refuses more than 4300 digits, zeros included
                is_number = text.isascii() and text.isdigit()
                assert not (is_number and len(digits) <= 20 and int(digits) <= MAX_U64)
            else:
                assert 0 <= value <= MAX_U64
                assert f"{value:0{len(text)}d}" == text
        try:
            save = validate_save(text)
        except InvalidError:
            assert not oracle_save_ok(text)
        else:
            assert save == text
            assert oracle_save_ok(text)
            if len(text.encode("utf-8")) <= MAX_SAVE_BYTES:
                assert parse_entry_name(format_entry_name(Entry(0, 0, text))).save == text
        try:
            attempt = validate_attempt(text)
        except InvalidError:
            assert not oracle_attempt_ok(text)
        else:
            assert attempt == text
            assert oracle_attempt_ok(text)
            assert validate_save(f"exec/{text}") == f"exec/{text}"
