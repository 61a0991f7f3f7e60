"""The framework rules (``ckpt.domain.frameworks``): save folder names, markers, and settle, all pure."""

from __future__ import annotations

import io
import json
import zipfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt.application.watcher import Watcher
from ckpt.domain.entries import MAX_U64
from ckpt.domain.errors import InvalidError
from ckpt.domain.frameworks import (
    RNG_STATE_MAX_BYTES,
    FileTail,
    Framework,
    Markers,
    default_settle,
    large_trainer_state_problem,
    markers_problem,
    parse_framework,
    parse_world_size,
    rank_files,
    save_folders,
    save_step,
    validate_world_size,
    zip_tail_problem,
)
from ckpt.domain.ports import FileInfo
from ckpt.domain.rules import builtin_rule
from ckpt.domain.rules.settle import Look, settle_verdict
from ckpt.domain.zip_end import Span, zip_second_read
from ckpt.testing import InMemoryStore

HF, DCP = Framework.HF, Framework.DCP
STATE = b'{"global_step": 500, "log_history": [{"loss": NaN}]}'


def zip_bytes(*, comment: bytes = b"", zip64: bool = False) -> bytes:
    """A small complete zip, as ``torch.save`` writes an RNG state (one member, optionally zip64 records)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.comment = comment
        with archive.open("archive/data.pkl", "w", force_zip64=zip64) as member:
            member.write(bytes(range(256)) * 8)
    return buffer.getvalue()


RNG = zip_bytes()


def whole(data: bytes) -> FileTail:
    return FileTail(len(data), data)


class TestNames:
    """The functions are named for what they return; the old names stay as aliases for existing callers."""

    def test_old_names_are_aliases(self) -> None:
        """check_markers, check_zip_tail and check_world_size are the renamed functions themselves."""
        from ckpt.domain import frameworks

        old = (frameworks.check_markers, frameworks.check_zip_tail, frameworks.check_world_size)
        assert old == (markers_problem, zip_tail_problem, validate_world_size)


class TestParseFramework:
    def test_names_round_trip(self) -> None:
        """Each framework parses from the name it prints as."""
        assert [parse_framework(str(f)) for f in Framework] == [HF, DCP]
        assert (str(HF), str(DCP)) == ("hf", "dcp")

    @pytest.mark.parametrize("text", ["HF", "Hf", " hf", "hf ", "pytorch", "", "dcp\n", "huggingface"])
    def test_anything_else_is_invalid(self, text: str) -> None:
        """A name other than exactly ``hf`` or ``dcp`` is refused with InvalidError naming it."""
        with pytest.raises(InvalidError, match="is not one of hf, dcp"):
            parse_framework(text)

    def test_default_settle(self) -> None:
        """The default settle time is one interval for hf and zero for dcp."""
        assert (default_settle(HF, 2.5), default_settle(DCP, 2.5)) == (2.5, 0.0)


class TestWorldSize:
    @pytest.mark.parametrize(("text", "value"), [("1", 1), ("2", 2), ("08", 8), ("2147483647", 2**31 - 1)])
    def test_valid(self, text: str, value: int) -> None:
        """A world size is one or more ASCII digits with a value from 1 to 2**31 - 1."""
        assert parse_world_size(text) == value

    @pytest.mark.parametrize("text", ["0", "-1", "+2", "2.0", " 2", "", "two", "\u0662", "2147483648"])
    def test_invalid(self, text: str) -> None:
        """Anything else is refused with InvalidError naming the value."""
        with pytest.raises(InvalidError, match="world size"):
            parse_world_size(text)

    def test_rank_files(self) -> None:
        """hf with N > 1 needs rng_state_0 … rng_state_<N-1>; one process, unknown N or dcp need none."""
        assert rank_files(HF, 3) == ("rng_state_0.pth", "rng_state_1.pth", "rng_state_2.pth")
        assert (rank_files(HF, 1), rank_files(HF, None), rank_files(DCP, 4)) == ((), (), ())


class TestZipTail:
    @pytest.mark.parametrize(
        "data",
        [RNG, zip_bytes(comment=b"a comment with PK\x05\x06 inside"), zip_bytes(zip64=True)],
        ids=["plain", "comment", "zip64"],
    )
    def test_complete_zips_pass_whole_or_by_their_tail(self, data: bytes) -> None:
        """A complete zip passes, read whole or only its last bytes (with its size, and the directory's first
        bytes when it starts before them: the second read)."""
        assert zip_tail_problem(whole(data)) is None
        where = zip_second_read(len(data), data[-100:])
        span = None if where is None else Span(where[0], data[where[0] : where[0] + where[1]])
        assert zip_tail_problem(FileTail(len(data), data[-100:], span)) is None

    @pytest.mark.parametrize("data", [RNG, zip_bytes(zip64=True)], ids=["plain", "zip64"])
    def test_every_cut_short_prefix_fails(self, data: bytes) -> None:
        """A zip cut short at any length (a rank killed while writing it) is never complete."""
        passing = [n for n in range(len(data)) if zip_tail_problem(whole(data[:n])) is None]
        assert passing == []

    def test_reasons(self) -> None:
        """Each way of failing says what is wrong."""
        assert zip_tail_problem(whole(b"")) == "no end-of-central-directory record at its end"
        assert zip_tail_problem(whole(RNG + b"x")) == "no end-of-central-directory record at its end"
        assert zip_tail_problem(FileTail(3, b"four")) == "its tail is longer than the file"
        # The end record must end the file exactly: an empty zip is that record alone; a record whose
        # comment length promises a byte that is not there does not count.
        assert zip_tail_problem(whole(b"PK\x05\x06" + bytes(18))) is None
        eocd_with_missing_comment = b"PK\x05\x06" + bytes(16) + b"\x01\x00"
        assert (
            zip_tail_problem(whole(eocd_with_missing_comment))
            == "no end-of-central-directory record at its end"
        )

    @given(st.binary(max_size=300))
    def test_arbitrary_bytes_never_raise(self, data: bytes) -> None:
        """Whatever the bytes, the check answers with a verdict instead of raising."""
        reason = zip_tail_problem(whole(data))
        assert reason is None or isinstance(reason, str)


class TestSaveStep:
    @pytest.mark.parametrize(
        ("framework", "name", "step"),
        [
            (HF, "checkpoint-500", 500),
            (HF, "checkpoint-0", 0),
            (HF, "checkpoint-05", 5),  # leading zeros: accepted, as the Trainer's own readers do
            (HF, f"checkpoint-{MAX_U64}", MAX_U64),
            (DCP, "step-10", 10),
            (DCP, "step-007", 7),
        ],
    )
    def test_save_names(self, framework: Framework, name: str, step: int) -> None:
        """A folder named after the framework's pattern is a save at the step its name carries."""
        assert save_step(framework, name) == step

    @pytest.mark.parametrize(
        ("framework", "name"),
        [
            (HF, "tmp-checkpoint-5"),
            (HF, "checkpoint-best"),
            (HF, "runs"),
            (HF, "checkpoint-"),
            (HF, "checkpoint"),
            (HF, "checkpoint-+5"),
            (HF, "checkpoint--5"),
            (HF, "checkpoint- 5"),
            (HF, "checkpoint-5 "),
            (HF, "checkpoint-5.tmp"),
            (HF, "checkpoint-1_000"),
            (HF, "checkpoint-\u0665"),  # ARABIC-INDIC DIGIT FIVE: not ASCII
            (HF, f"checkpoint-{MAX_U64 + 1}"),
            (HF, "Checkpoint-5"),
            (HF, "step-5"),
            (DCP, "checkpoint-5"),
            (DCP, "step-"),
            (DCP, "step-0x10"),
            (DCP, ".step-5"),
        ],
    )
    def test_not_save_names(self, framework: Framework, name: str) -> None:
        """Any other folder name is not a save (ignored, not an error)."""
        assert save_step(framework, name) is None

    @given(st.integers(min_value=0, max_value=MAX_U64))
    def test_every_step_round_trips(self, step: int) -> None:
        """Every unsigned 64-bit step survives being put into a folder name and read back."""
        assert save_step(HF, f"checkpoint-{step}") == step
        assert save_step(DCP, f"step-{step}") == step

    @given(st.text(max_size=30))
    def test_a_save_name_is_exactly_prefix_and_ascii_digits(self, rest: str) -> None:
        """A name is a save exactly when what follows the prefix is ASCII digits that fit in 64 bits."""
        expected = int(rest) if rest.isascii() and rest.isdigit() and int(rest) <= MAX_U64 else None
        assert save_step(HF, "checkpoint-" + rest) == expected


class TestSaveFolders:
    def test_saves_in_step_order(self) -> None:
        """Only save folders are kept, ordered by step (then name), whatever the listing order."""
        names = [
            "checkpoint-30",
            "runs",
            "checkpoint-4",
            "tmp-checkpoint-50",
            "checkpoint-best",
            "checkpoint-004",
        ]
        found = save_folders(HF, names)
        assert [(f.step, f.name) for f in found] == [
            (4, "checkpoint-004"),
            (4, "checkpoint-4"),
            (30, "checkpoint-30"),
        ]

    @given(st.lists(st.integers(min_value=0, max_value=10**6), unique=True))
    def test_order_does_not_depend_on_listing_order(self, steps: list[int]) -> None:
        """The listing order of the storage is never trusted: any order gives ascending steps."""
        names = [f"step-{s}" for s in steps]
        assert [f.step for f in save_folders(DCP, names)] == sorted(steps)
        assert save_folders(DCP, names) == save_folders(DCP, list(reversed(names)))


class TestMarkersProblem:
    def test_hf_complete(self) -> None:
        """A JSON object in trainer_state.json and no sentinel is complete (even with the Trainer's NaN)."""
        assert markers_problem(HF, Markers(trainer_state=STATE)) is None

    @pytest.mark.parametrize(
        ("markers", "reason"),
        [
            (Markers(), "no trainer_state.json"),
            (Markers(trainer_state=b""), "trainer_state.json is not a JSON object"),
            (Markers(trainer_state=b'{"global_step": 5'), "trainer_state.json is not a JSON object"),
            (Markers(trainer_state=b"[1, 2]"), "trainer_state.json is not a JSON object"),
            (Markers(trainer_state=b'"text"'), "trainer_state.json is not a JSON object"),
            (Markers(trainer_state=b"null"), "trainer_state.json is not a JSON object"),
            (Markers(trainer_state=b"\xff\xfe{"), "trainer_state.json is not a JSON object"),
            (Markers(trainer_state=b"[" * 100_000), "trainer_state.json is not a JSON object"),
            (
                Markers(trainer_state=b"{}", incomplete_sentinel=True),
                "incomplete: checkpoint-is-incomplete.txt is present",
            ),
            (Markers(metadata=True), "no trainer_state.json"),
        ],
    )
    def test_hf_incomplete(self, markers: Markers, reason: str) -> None:
        """Missing, partial or non-object trainer_state.json, or the sentinel, each say why."""
        assert markers_problem(HF, markers) == reason

    def test_dcp(self) -> None:
        """A dcp save is complete exactly when .metadata is present; hf's markers do not matter to it."""
        assert markers_problem(DCP, Markers(metadata=True)) is None
        assert markers_problem(DCP, Markers(trainer_state=b"{}")) == "no .metadata"

    def test_hf_ranks_all_complete(self) -> None:
        """With world size 2, trainer_state.json plus two complete RNG zips is complete."""
        markers = Markers(trainer_state=STATE, rank_states=(whole(RNG), whole(RNG)))
        assert markers_problem(HF, markers, world_size=2) is None

    @pytest.mark.parametrize(
        ("states", "reason"),
        [
            ((), "no rng_state_0.pth (rank 0 of 2 has not finished its part of the save)"),
            ((whole(RNG),), "no rng_state_1.pth (rank 1 of 2 has not finished its part of the save)"),
            ((whole(RNG), None), "no rng_state_1.pth (rank 1 of 2 has not finished its part of the save)"),
            (
                (whole(RNG), whole(RNG[:-10])),
                (
                    "rng_state_1.pth is not a complete zip: no end-of-central-directory record at its end "
                    "(rank 1 of 2 was cut short)"
                ),
            ),
            (
                (FileTail(RNG_STATE_MAX_BYTES + 1, b""),),
                (
                    f"rng_state_0.pth is {RNG_STATE_MAX_BYTES + 1} bytes, more than a rank's RNG state "
                    "can be; not read"
                ),
            ),
        ],
    )
    def test_hf_ranks_incomplete(self, states: tuple[FileTail | None, ...], reason: str) -> None:
        """With world size 2, a rank whose RNG state is missing, cut short or too big holds the save back."""
        assert markers_problem(HF, Markers(trainer_state=STATE, rank_states=states), world_size=2) == reason

    def test_ranks_only_when_the_world_size_is_above_one(self) -> None:
        """Unknown or 1, the world size adds nothing; the other markers still come first."""
        assert markers_problem(HF, Markers(trainer_state=STATE), world_size=1) is None
        assert markers_problem(HF, Markers(trainer_state=STATE), world_size=None) is None
        assert markers_problem(HF, Markers(), world_size=2) == "no trainer_state.json"
        assert markers_problem(DCP, Markers(metadata=True), world_size=2) is None

    @given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5) | st.none(), max_size=5))
    def test_any_json_object_is_complete(self, document: dict[str, object]) -> None:
        """Any JSON object at all passes the hf marker check."""
        assert markers_problem(HF, Markers(trainer_state=json.dumps(document).encode())) is None

    @given(st.binary(max_size=40))
    def test_arbitrary_bytes_never_raise(self, data: bytes) -> None:
        """Whatever bytes the file holds, the check answers with a verdict instead of raising."""
        reason = markers_problem(HF, Markers(trainer_state=data))
        assert reason in (None, "trainer_state.json is not a JSON object")


def trainer_state_text(records: int) -> bytes:
    """``trainer_state.json`` as ``TrainerState.save_to_json`` writes it (indent 2, sorted, a newline)."""
    state = {
        "best_metric": None,
        "global_step": records,
        "log_history": [
            {"epoch": i / 7, "loss": float("nan") if i == 3 else 1.5 / (i + 1), "step": i}
            for i in range(records)
        ],
        "stateful_callbacks": {"TrainerControl": {"args": {"should_save": True}}},
        "trial_params": None,
    }
    return (json.dumps(state, indent=2, sort_keys=True) + "\n").encode()


class TestLargeTrainerState:
    """A trainer_state.json over the read cap is judged by its two ends (found from outside: a long run's
    file over 64 MiB made every save of it "not a JSON object", so it was never published)."""

    def test_the_whole_file_passes_and_every_cut_of_it_fails(self) -> None:
        """Cut anywhere while being written, the Trainer's output never ends as the whole file does."""
        text = trainer_state_text(12)
        assert large_trainer_state_problem(text[:100], FileTail(len(text), text[-200:])) is None
        for cut in range(len(text)):
            prefix = text[:cut]
            problem = large_trainer_state_problem(prefix[:100], FileTail(cut, prefix[-200:]))
            assert problem is not None, cut
            assert problem.startswith(f"trainer_state.json is {cut} bytes, too large to parse"), problem

    @pytest.mark.parametrize(
        ("head", "tail"),
        [
            (b"[\n  {}", b"\n}\n"),  # not an object
            (b'{\n  "a": 1', b"\n}"),  # the last newline not written yet
            (b'{\n  "a": 1', b"  }\n"),  # an inner object's end
            (b'{"a": {"b": 1}}', b'{"b": 1}}'),  # compact JSON: not how the Trainer writes
        ],
    )
    def test_other_ends_fail(self, head: bytes, tail: bytes) -> None:
        """Anything but '{' first and a '}' alone on the last line is "still being written"."""
        assert large_trainer_state_problem(head, FileTail(10**8, tail)) is not None

    def test_markers_use_the_ends_when_the_state_was_too_large(self) -> None:
        """With ``trainer_state_end`` the head is not parsed; the sentinel and ranks still count."""
        head = b'{\n  "best_metric": null,\n  "log_history": [\n'  # not JSON on its own
        end = FileTail(10**8, b"    }\n  ]\n}\n")
        assert markers_problem(HF, Markers(trainer_state=head, trainer_state_end=end)) is None
        sentinel = Markers(trainer_state=head, trainer_state_end=end, incomplete_sentinel=True)
        assert markers_problem(HF, sentinel) == "incomplete: checkpoint-is-incomplete.txt is present"
        assert markers_problem(HF, Markers(trainer_state=head, trainer_state_end=end), world_size=2) == (
            "no rng_state_0.pth (rank 0 of 2 has not finished its part of the save)"
        )
        cut = Markers(trainer_state=head, trainer_state_end=FileTail(10**8, b'  "loss": 1.5\n    }'))
        assert "too large to parse" in str(markers_problem(HF, cut))


def look(files: dict[str, int], started: float, finished: float | None = None) -> Look:
    return Look(
        tuple(FileInfo(p, s) for p, s in sorted(files.items())),
        started,
        started if finished is None else finished,
    )


class TestMarkersThenSettle:
    """The watcher's verdict for hf/dcp: the marker rule's reason, then the one settle rule."""

    def test_markers_first(self) -> None:
        """Incomplete markers win over any listing, and the verdict asks to forget the settle state."""
        verdict = settle_verdict(
            markers_problem(HF, Markers()), settle=1, look=look({"a": 1}, 10), since=look({"a": 1}, 0)
        )
        assert (verdict.complete, verdict.reason, verdict.since) == (False, "no trainer_state.json", None)

    def test_no_settle_means_complete_at_first_look(self) -> None:
        """With settle 0 the markers alone decide; no look is needed."""
        assert settle_verdict(
            markers_problem(HF, Markers(trainer_state=b"{}")), settle=0, look=None, since=None
        ).complete
        assert settle_verdict(
            markers_problem(DCP, Markers(metadata=True)), settle=0, look=None, since=None
        ).complete

    def test_first_look_starts_settling(self) -> None:
        """The first look at a save with complete markers is kept, and the save is not complete yet."""
        first = look({"trainer_state.json": 2}, 0.0, 0.1)
        verdict = settle_verdict(None, settle=1, look=first, since=None)
        assert (verdict.complete, verdict.since) == (False, first)
        assert verdict.reason == "not settled: first look at its files"

    def test_settles_after_the_settle_time(self) -> None:
        """An unchanged listing seen settle seconds after the first look ended makes the save complete."""
        first = look({"trainer_state.json": 2, "model": 9}, 0.0, 0.5)
        early = settle_verdict(
            None, settle=2, look=look({"trainer_state.json": 2, "model": 9}, 2.4), since=first
        )
        assert (early.complete, early.since) == (False, first)
        assert early.reason == "not settled: unchanged for 1.9s of 2s"
        on_time = settle_verdict(
            None, settle=2, look=look({"trainer_state.json": 2, "model": 9}, 2.5), since=first
        )
        assert on_time.complete

    @pytest.mark.parametrize(
        "changed",
        [
            {"trainer_state.json": 2, "model": 10},  # a file grew
            {"trainer_state.json": 2},  # a file went away
            {"trainer_state.json": 2, "model": 9, "rng_state_1.pth": 0},  # a file appeared
            {"trainer_state.json": 2, "model2": 9},  # a file was renamed
        ],
    )
    def test_any_change_restarts_the_settle(self, changed: dict[str, int]) -> None:
        """A change in names or sizes, however late, restarts the settle from this look."""
        first = look({"trainer_state.json": 2, "model": 9}, 0.0)
        now = look(changed, 100.0)
        verdict = settle_verdict(None, settle=1, look=now, since=first)
        assert (verdict.complete, verdict.since) == (False, now)
        assert verdict.reason == "not settled: its files changed since the last scan"

    def test_settle_never_delays_dcp(self) -> None:
        """The dcp rule's settle time is 0 whatever is given (settle bounds only the drain after SIGTERM)."""
        rule = builtin_rule("dcp")
        assert (rule.settle_time(10.0), rule.settle_time(10.0, 3600.0)) == (0.0, 0.0)
        verdict = settle_verdict(None, settle=rule.settle_time(10.0, 3600.0), look=None, since=None)
        assert (verdict.complete, verdict.since) == (True, None)

    def test_ranks_before_settle(self) -> None:
        """A missing rank's file is the verdict and drops the settle state, whatever the listing says."""
        reason = markers_problem(HF, Markers(trainer_state=STATE, rank_states=(whole(RNG),)), world_size=2)
        verdict = settle_verdict(reason, settle=1, look=look({"a": 1}, 10), since=look({"a": 1}, 0))
        assert (verdict.reason, verdict.since) == (
            "no rng_state_1.pth (rank 1 of 2 has not finished its part of the save)",
            None,
        )

    @pytest.mark.parametrize("settle", [-1, float("nan"), float("inf"), True, "1"])
    def test_bad_settle(self, settle: object) -> None:
        """A settle time that is negative, not finite or not a number is refused where it is given."""
        store = InMemoryStore()
        with pytest.raises(InvalidError, match="settle time"):
            Watcher(store, HF, store.exec_dir("1.1.0"), 1, 1.0, settle=settle)  # type: ignore[arg-type]

    def test_settle_needs_a_look(self) -> None:
        """Asking for a settle without this scan's look is a programming error."""
        with pytest.raises(ValueError, match="needs this scan's look"):
            settle_verdict(None, settle=1, look=None, since=None)

    @given(
        st.floats(min_value=0.001, max_value=1e6),
        st.floats(min_value=0, max_value=1e6),
        st.floats(min_value=0, max_value=1e6),
    )
    def test_complete_exactly_when_the_gap_reaches_settle(
        self, settle: float, end: float, gap: float
    ) -> None:
        """Unchanged, it is complete exactly when the second look starts settle after the first ended."""
        first = look({"f": 1}, 0.0, end)
        second = look({"f": 1}, end + gap)
        verdict = settle_verdict(None, settle=settle, look=second, since=first)
        assert verdict.complete == ((end + gap) - end >= settle)
