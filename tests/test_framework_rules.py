"""The framework rules (``ckpt.domain.rules``): the JSON vectors, zip end records, config tables, hints.

The vectors in ``tests/vectors/frameworks/*.json`` are the language-neutral definition of each rule: a
layout of the saves location, one name in it, and whether that name is a save and a complete one (and if
not, a phrase the reason contains). They are gathered and judged here exactly as the watcher does it
(``ckpt.application.inspection.judge``: the rule, then spec/watcher.md §2.6) over an in-memory layout.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.domain.errors import ConfigError
from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import (
    BUILTIN,
    Item,
    Kind,
    Tail,
    builtin_rule,
    is_complete_zip,
    parse_custom_rules,
    unclaimed_save,
)
from ckpt.domain.rules.custom import CustomRule
from ckpt.domain.rules.settle import Look, Settled, settle_verdict
from ckpt.domain.rules.zipend import TAIL_BYTES, zip_problem
from ckpt.domain.zip_end import Span, zip_second_read
from support.rule_layouts import (
    RULE_FILES,
    VECTORS,
    LayoutReader,
    content,
    inner_zip_cut,
    load_vectors,
    torch_zip,
    vector_cases,
    vector_rule,
    verdict,
    zeroed_zip,
    zip_bytes,
)


class TestVectors:
    @pytest.mark.parametrize(("name", "case"), vector_cases())
    def test_vector(self, name: str, case: dict[str, Any]) -> None:
        """Each layout's name is (or is not) a save, complete or not, for the reason the vector gives."""
        rule = vector_rule(name, case)
        layout = {path: content(spec) for path, spec in case["layout"].items()}
        is_save, reason = verdict(rule, layout, case["save"])
        assert is_save is case["is_save"], case["why"]
        if not is_save:
            return
        if case["complete"]:
            assert reason is None, f"{case['why']}: {reason}"
        else:
            assert reason is not None, case["why"]
            assert case["reason"] in reason

    def test_every_file_is_well_formed(self) -> None:
        """Every vector file names its rule, and its case ids are unique."""
        for name in RULE_FILES:
            document = load_vectors(name)
            assert document["rule"] == name
            ids = [case["id"] for case in document["cases"]]
            assert len(ids) == len(set(ids)), name
            assert ids, name

    def test_every_builtin_rule_has_vectors(self) -> None:
        """A vector file exists for every built-in rule and for configured rules."""
        assert {p.stem for p in VECTORS.glob("*.json")} == {*BUILTIN, "custom"}


def read_as_the_watcher(data: bytes) -> tuple[str | None, int]:
    """Judge ``data`` as ``ckpt.application.inspection`` reads a file: its tail, then the second read when
    asked for.

    Returns the reason (``None``: complete) and how many reads it took.
    """
    tail = Tail(len(data), data[-TAIL_BYTES:])
    where = zip_second_read(tail.size, tail.data)
    if where is None:
        return zip_problem(tail), 1
    offset, length = where
    return zip_problem(attrs.evolve(tail, span=Span(offset, data[offset : offset + length]))), 2


def torch_save_bytes(state: object) -> bytes:
    """What ``torch.save`` writes for ``state`` (torch's own zip writer, miniz)."""
    torch = pytest.importorskip("torch")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


class TestZipEnd:
    """spec/watcher.md §2.4: the end record ends the file, and the directory it describes agrees with it."""

    @pytest.mark.parametrize("comment", [b"", b"x", b"PK\x05\x06" + bytes(18), bytes(0xFFFF)])
    def test_complete_zips(self, comment: bytes) -> None:
        """A zip written by the standard library ends with its end record, whatever its comment."""
        assert is_complete_zip(zip_bytes(100, comment))

    @pytest.mark.parametrize("zip64", ["plain", "saturated", "none"])
    def test_torch_like_zips_are_real_and_complete(self, zip64: str) -> None:
        """The torch-like zips of the vectors are zips the standard library reads back, and complete."""
        data = torch_zip(5, zip64=zip64)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            assert archive.testzip() is None
            assert len(archive.namelist()) == 9
        assert read_as_the_watcher(data) == (None, 1)

    @pytest.mark.parametrize("data", [zip_bytes(40, b"note"), torch_zip(3), torch_zip(3, zip64="saturated")])
    def test_every_cut_is_incomplete(self, data: bytes) -> None:
        """A zip cut at any byte before its end is not complete (ZIP64 end records too)."""
        assert [n for n in range(len(data)) if is_complete_zip(data[:n])] == []

    def test_the_tail_holds_the_longest_comment(self) -> None:
        """The first read holds the end record with the longest comment, and a small directory before it."""
        data = zip_bytes(200_000, bytes(0xFFFF))
        assert read_as_the_watcher(data) == (None, 1)
        assert read_as_the_watcher(data[:-1])[0] is not None

    def test_a_large_directory_costs_one_more_read_at_its_start(self) -> None:
        """A directory larger than the tail read: the second read is its first 4 bytes, where zipfile finds
        it."""
        data = torch_zip(1200)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            start = archive.start_dir
        assert zip_second_read(len(data), data[-TAIL_BYTES:]) == (start, 4)
        assert read_as_the_watcher(data) == (None, 2)
        tail = Tail(len(data), data[-TAIL_BYTES:])
        assert zip_problem(tail) == f"its central directory (offset {start}) was not read"
        small = torch_zip(3)
        assert zip_second_read(len(small), small[-TAIL_BYTES:]) is None

    def test_cut_right_after_an_inner_zip(self) -> None:
        """A file cut right after a zip stored inside it ends with that zip's end record, which does not
        count: the inner offsets count from the inner zip's start, not from the file's."""
        data = inner_zip_cut(50)
        assert data.endswith(zip_bytes(50))
        reason, _ = read_as_the_watcher(data)
        assert reason is not None
        assert "does not end where its end record begins" in reason

    @pytest.mark.parametrize("tensors", [3, 1200])
    def test_tail_written_before_the_middle(self, tensors: int) -> None:
        """End records written before the middle (zeros there): no directory header where they point."""
        reason, reads = read_as_the_watcher(zeroed_zip(tensors, "end"))
        assert reason is not None
        assert reason.startswith("no central directory header at offset ")
        assert reads == (2 if tensors == 1200 else 1)

    def test_what_the_check_cannot_prove(self) -> None:
        """Member data never written, directory and end records written: it passes (watcher.md §2.4 says
        so)."""
        data = zeroed_zip(3, "directory")
        assert data.startswith(bytes(300))
        assert read_as_the_watcher(data) == (None, 1)

    def test_bytes_before_the_zip_are_not_a_complete_zip(self) -> None:
        """Bytes prepended to a whole zip shift every offset: not what torch.save writes, not complete."""
        assert not is_complete_zip(b"#!/bin/sh\n" + zip_bytes(10))

    def test_zip64_records_must_agree(self) -> None:
        """A ZIP64 locator pointing elsewhere, a ZIP64 record that does not reach the locator, an end record
        whose value differs from the ZIP64 record's, and saturated fields without ZIP64 records all fail."""
        data = torch_zip(3)
        locator = data.rindex(b"PK\x06\x07")
        record = data.rindex(b"PK\x06\x06")
        end = len(data) - 22

        def patched(at: int, value: bytes) -> bytes:
            return data[:at] + value + data[at + len(value) :]

        elsewhere = patched(locator + 8, (record - 1).to_bytes(8, "little"))
        short = patched(record + 4, (43).to_bytes(8, "little"))
        disagreeing = patched(end + 10, (4).to_bytes(2, "little"))
        saturated_classic = patched(end + 16, b"\xff" * 4)
        saturated_classic = saturated_classic[:locator] + bytes(20) + saturated_classic[locator + 20 :]
        reasons = [zip_problem(Tail(len(d), d)) for d in (elsewhere, short, disagreeing, saturated_classic)]
        assert reasons == [
            f"no ZIP64 end record where its locator points (offset {record - 1})",
            "its ZIP64 end record does not end where its locator begins",
            "its end record and its ZIP64 end record disagree",
            "its end record points to ZIP64 records that are not before it",
        ]

    def test_real_torch_save(self) -> None:
        """What torch.save writes (ZIP64 records, then the end record) is complete; cut anywhere from its
        central directory on, it is not."""
        data = torch_save_bytes({"weight": list(range(8)), "inner": zip_bytes(50)})
        assert data.rindex(b"PK\x06\x06") < data.rindex(b"PK\x06\x07") < data.rindex(b"PK\x05\x06")
        assert read_as_the_watcher(data) == (None, 1)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            start = archive.start_dir
        assert [n for n in range(start, len(data)) if is_complete_zip(data[:n])] == []

    @given(st.binary(max_size=200), st.integers(min_value=0, max_value=1000), st.binary(max_size=8))
    def test_arbitrary_bytes_never_raise(self, data: bytes, extra: int, span: bytes) -> None:
        """Any bytes at all, any size and any second read give an answer, never an exception."""
        size = len(data) + extra
        assert zip_second_read(size, data) is None or zip_second_read(size, data)[1] == 4  # type: ignore[index]
        problem = zip_problem(Tail(size, data, Span(extra // 2, span)))
        assert problem is None or isinstance(problem, str)

    @given(st.integers(min_value=0, max_value=200))
    def test_end_records_alone_with_a_size_do_not_pass(self, before: int) -> None:
        """An empty zip's end record passes only as the whole file: bytes before it make the offsets
        disagree."""
        record = b"PK\x05\x06" + bytes(18)
        assert (zip_problem(Tail(before + 22, record)) is None) is (before == 0)

    def test_signature_inside_comment_is_not_the_record(self) -> None:
        """A signature whose comment length does not reach the end exactly does not count."""
        fake = b"PK\x05\x06" + bytes(16) + (5).to_bytes(2, "little") + b"abc"
        assert not is_complete_zip(fake)


GOOD = {"name": "mytrainer", "pattern": "ckpt_{step}"}


class TestCustomRuleTables:
    def test_defaults(self) -> None:
        """A table with only a name and a pattern: a folder rule, nothing required, one-interval settle."""
        (rule,) = parse_custom_rules([GOOD], BUILTIN)
        assert rule == CustomRule("mytrainer", "ckpt_{step}", Kind.FOLDER)
        assert rule.settle_time(7.0) == 7.0
        assert parse_custom_rules([{**GOOD, "settle": 0}], BUILTIN)[0].settle_time(7.0) == 0.0
        assert parse_custom_rules([{**GOOD, "settle": 0}], BUILTIN)[0].settle_time(7.0, 3.0) == 3.0

    @pytest.mark.parametrize(
        ("table", "key", "phrase"),
        [
            ({**GOOD, "colour": "red"}, "frameworks[0].colour", "unknown key"),
            ({"pattern": "x{step}"}, "frameworks[0].name", "non-empty string"),
            ({**GOOD, "name": "Upper"}, "frameworks[0].name", "lower-case"),
            ({**GOOD, "name": "dcp"}, "frameworks[0].name", "already a framework"),
            ({**GOOD, "name": "x" * 65}, "frameworks[0].name", "lower-case"),
            ({"name": "a"}, "frameworks[0].pattern", "non-empty string"),
            ({**GOOD, "pattern": "ckpt"}, "frameworks[0].pattern", "exactly once"),
            ({**GOOD, "pattern": "{step}-{step}"}, "frameworks[0].pattern", "exactly once"),
            ({**GOOD, "pattern": "a/{step}"}, "frameworks[0].pattern", "'/'"),
            ({**GOOD, "pattern": "{step}{x}"}, "frameworks[0].pattern", "brace"),
            ({**GOOD, "pattern": "a\n{step}"}, "frameworks[0].pattern", "control"),
            ({**GOOD, "kind": "link"}, "frameworks[0].kind", "'folder' or 'file'"),
            ({**GOOD, "required": "DONE"}, "frameworks[0].required", "array of strings"),
            ({**GOOD, "required": [1]}, "frameworks[0].required", "array of strings"),
            ({**GOOD, "required": ["../x"]}, "frameworks[0].required", "not a relative path"),
            ({**GOOD, "forbidden": ["/abs"]}, "frameworks[0].forbidden", "not a relative path"),
            ({**GOOD, "json": ["a//b"]}, "frameworks[0].json", "not a relative path"),
            ({**GOOD, "zip": ["."]}, "frameworks[0].zip", "not a relative path"),
            ({**GOOD, "kind": "file", "required": ["x"]}, "frameworks[0].required", "only name '.'"),
            ({**GOOD, "kind": "file", "zip": ["x"]}, "frameworks[0].zip", "only name '.'"),
            ({**GOOD, "settle": -1}, "frameworks[0].settle", "seconds from 0 to 10000000"),
            ({**GOOD, "settle": float("inf")}, "frameworks[0].settle", "seconds from 0 to 10000000"),
            ({**GOOD, "settle": True}, "frameworks[0].settle", "must be a number"),
            # Beyond the bound of every duration (a drain would wait for it: watcher.md §5), and too large
            # for a float: refused, never an OverflowError.
            ({**GOOD, "settle": 1e300}, "frameworks[0].settle", "seconds from 0 to 10000000"),
            ({**GOOD, "settle": 10_000_001}, "frameworks[0].settle", "seconds from 0 to 10000000"),
            ({**GOOD, "settle": 10**400}, "frameworks[0].settle", "seconds from 0 to 10000000"),
        ],
    )
    def test_bad_tables(self, table: dict[str, Any], key: str, phrase: str) -> None:
        """A bad table is a ConfigError naming frameworks[<i>].<key>."""
        with pytest.raises(ConfigError, match=phrase) as caught:
            parse_custom_rules([table], BUILTIN)
        assert caught.value.key == key

    def test_duplicate_names(self) -> None:
        """Two tables may not take one name; the second is the one named."""
        with pytest.raises(ConfigError, match="already a framework") as caught:
            parse_custom_rules([GOOD, {**GOOD, "pattern": "x{step}"}], BUILTIN)
        assert caught.value.key == "frameworks[1].name"

    @pytest.mark.parametrize("tables", [{}, "x", [1], ["a"]])
    def test_not_an_array_of_tables(self, tables: object) -> None:
        """``frameworks`` must be an array of tables."""
        with pytest.raises(ConfigError) as caught:
            parse_custom_rules(tables, BUILTIN)
        assert caught.value.key in ("frameworks", "frameworks[0]")

    @given(st.text(max_size=20))
    def test_pattern_matches_only_whole_names(self, text: str) -> None:
        """A name is a save exactly when it is the pattern with ASCII digits for {step}."""
        (rule,) = parse_custom_rules([{"name": "t", "pattern": "a.{step}+b"}], BUILTIN)
        name = f"a.{text}+b"
        expected = text.isascii() and text.isdigit() and len(text) <= 20 and int(text) < 2**64
        assert bool(rule.saves([Item(name)])) is expected


class TestBuiltinRules:
    def test_every_builtin_name_builds(self) -> None:
        """Every built-in name gives a rule that calls itself by that name; anything else gives None."""
        assert [builtin_rule(n).name for n in BUILTIN if builtin_rule(n)] == list(BUILTIN)
        assert builtin_rule("pytorch") is None

    def test_saves_in_step_order(self) -> None:
        """Saves come back in step order, ties by name, whatever the listing order."""
        rule = builtin_rule("dcp")
        assert rule is not None
        items = [Item(n) for n in ("step-20", "step-3", "runs", "step-03", "tmp_step-1")]
        assert [s.name for s in rule.saves(items)] == ["step-03", "step-3", "step-20"]


class TestUnclaimedSave:
    def _hint(self, chosen: str, *names: str, kind: Kind = Kind.FOLDER) -> str | None:
        rule = builtin_rule(chosen)
        assert rule is not None
        others = [r for n in BUILTIN if (r := builtin_rule(n)) is not None]
        hint = unclaimed_save(rule, others, [Item(n, kind) for n in names])
        return None if hint is None else hint.message(rule)

    def test_hf_folder_under_dcp(self) -> None:
        """A checkpoint-5 folder under --framework dcp names the rule that would take it."""
        assert self._hint("dcp", "checkpoint-5", "runs") == (
            "folder 'checkpoint-5' looks like a save but matches no dcp save name (step-<step>); "
            "--framework hf (checkpoint-<step>) would take it"
        )

    def test_nothing_to_say(self) -> None:
        """Saves of the chosen rule and unrelated names give no hint."""
        assert self._hint("dcp", "step-5", "runs", "tmp_step-6", "logs") is None

    def test_lightning_file_under_hf(self) -> None:
        """A Lightning file under --framework hf is named with its kind."""
        message = self._hint("hf", "epoch=0-step=5.ckpt", kind=Kind.FILE)
        assert message is not None
        assert message.startswith("file 'epoch=0-step=5.ckpt'")
        assert "--framework lightning" in message


class TestLayoutReader:
    def test_items_and_files(self) -> None:
        """The in-memory layout lists top-level names with their kinds and a folder's files recursively."""
        reader = LayoutReader({"a/b/c": b"12", "a/d": b"", "f": b"x", "e/": None})
        assert reader.items() == (Item("a"), Item("e"), Item("f", Kind.FILE))
        assert [(f.path, f.size) for f in reader.files("a")] == [("b/c", 2), ("d", 0)]
        assert reader.is_file("f")
        assert not reader.is_file("a")


class TestSettle:
    def test_settle_time_per_rule(self) -> None:
        """A given settle time applies to every rule but dcp (.metadata alone decides); defaults per rule."""
        rules = {n: builtin_rule(n) for n in BUILTIN}
        assert {n: r.settle_time(4.0) for n, r in rules.items() if r} == {
            "hf": 4.0,
            "dcp": 0.0,
            "lightning": 4.0,
            "deepspeed": 4.0,
            "megatron": 0.0,
            "nemo": 0.0,
            "orbax": 0.0,
            "accelerate": 4.0,
        }
        assert {n: r.settle_time(4.0, 9.0) for n, r in rules.items() if r} == {
            **dict.fromkeys(BUILTIN, 9.0),
            "dcp": 0.0,
        }
        deepspeed = builtin_rule("deepspeed", world_size=2)
        assert deepspeed is not None
        assert deepspeed.settle_time(4.0) == 0.0

    def test_a_settle_walk(self) -> None:
        """First look starts settling, a change restarts it, an unchanged look after S completes it."""
        a = (FileInfo("x", 1),)
        b = (FileInfo("x", 2),)
        first = settle_verdict(None, settle=5, look=Look(a, 0.0, 0.1), since=None)
        assert first.reason == "not settled: first look at its files"
        changed = settle_verdict(None, settle=5, look=Look(b, 2.0, 2.1), since=first.since)
        assert changed.reason == "not settled: its files changed since the last scan"
        early = settle_verdict(None, settle=5, look=Look(b, 6.0, 6.1), since=changed.since)
        assert early.reason == "not settled: unchanged for 3.9s of 5s"
        assert early.since == changed.since
        assert settle_verdict(None, settle=5, look=Look(b, 7.1, 7.2), since=early.since).complete
        markers_fail = settle_verdict("no .metadata", settle=5, look=None, since=early.since)
        assert markers_fail == Settled("no .metadata")
        assert settle_verdict(None, settle=0, look=None, since=None).complete
