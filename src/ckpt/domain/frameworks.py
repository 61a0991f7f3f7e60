"""Framework rules: which folders are saves, and when a save is complete (spec/watcher.md).

A *framework rule* answers two questions from facts the caller gathered; nothing here reads a file.

Rules:

1. ``hf`` (Hugging Face ``Trainer``): a save is a folder named ``checkpoint-<step>``. ``dcp`` (PyTorch
   Distributed Checkpoint, torchtitan layout): ``step-<step>``. ``<step>`` follows ``parse_step``: ASCII
   decimal digits whose value fits in 64 bits. Leading zeros are accepted (``checkpoint-05`` is step 5),
   because the Trainer's own ``get_last_checkpoint`` and checkpoint rotation accept them too; the save is
   still published under its real folder name, so ``checkpoint-5`` and ``checkpoint-05`` are two saves.
   Anything else (``tmp-checkpoint-5``, ``checkpoint-best``, ``runs``, ``checkpoint-``, ``checkpoint-+5``,
   a step past 2**64 - 1) is not a save and is ignored, never an error.
2. ``hf`` markers: ``trainer_state.json`` is present and parses (as Python's ``json`` reads it, which admits
   the ``NaN``/``Infinity`` the Trainer writes into ``log_history``) to a JSON *object*, and the
   ``checkpoint-is-incomplete.txt`` sentinel is absent. A ``trainer_state.json`` larger than the read cap
   (a long run logging every step) is not read whole: it is judged by its two ends, as the Trainer writes
   it (``json.dumps(indent=2) + "\\n"``): it starts with ``{`` and ends with ``\\n}\\n``. Only the outermost
   ``}`` of that output starts a line (inner ones are indented; a JSON string holds no raw newline), so
   no prefix of it, cut short while being written, ends that way. ``dcp`` marker: ``.metadata`` is
   present (DCP renames it into place once every rank has written).
3. ``hf`` ranks: when the world size ``N`` is known and greater than 1, every ``rng_state_<i>.pth`` for
   ``i < N`` is present and is a complete zip (its end-of-central-directory record ends the file). Each
   Trainer process writes its own as the last file of its part of the save, with no barrier before the main
   process writes ``trainer_state.json``; a rank that died mid-save never changes the listing again, so
   settle alone cannot catch it. With ``N`` unknown or 1 there is nothing more to check (one process writes
   ``rng_state.pth`` before ``trainer_state.json``).
4. Settle (the watcher only, ``hf`` only) is the one settle rule of ``ckpt.domain.rules.settle``, applied
   after the markers: the default settle time is one interval. A ``dcp`` save never waits for settle:
   ``.metadata`` is renamed into place after every rank has written, so it is a true completion marker; for
   ``dcp`` the settle time only bounds the watcher's drain.
5. Verified resolve uses the markers only (rules 2 and 3): settle is about a save still being written, and
   a published save was settled when it was published.

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable

import attrs

from ckpt.domain.arguments import require_str
from ckpt.domain.entries import parse_step
from ckpt.domain.errors import InvalidError
from ckpt.domain.zip_end import ZIP_TAIL_BYTES, Span, zip_end_problem

__all__ = [
    "INCOMPLETE_SENTINEL",
    "METADATA",
    "RNG_STATE_MAX_BYTES",
    "TRAINER_STATE",
    "ZIP_TAIL_BYTES",
    "FileTail",
    "Framework",
    "Markers",
    "SaveFolder",
    "check_markers",
    "check_world_size",
    "check_zip_tail",
    "default_settle",
    "large_trainer_state_problem",
    "markers_problem",
    "parse_framework",
    "parse_world_size",
    "rank_files",
    "save_folders",
    "save_step",
    "validate_world_size",
    "zip_tail_problem",
]

TRAINER_STATE = "trainer_state.json"
INCOMPLETE_SENTINEL = "checkpoint-is-incomplete.txt"
METADATA = ".metadata"
# Rule 3: a rank's RNG state is a few kilobytes (Python, NumPy, torch CPU and accelerator generators). A file
# listed larger than this is not read whole; the bound keeps a strange file from costing a scan its memory.
RNG_STATE_MAX_BYTES = 64 * 1024 * 1024


class Framework(enum.Enum):
    """A training framework whose saves the watcher recognises. ``str()`` gives the CLI name."""

    HF = "hf"
    DCP = "dcp"

    def __str__(self) -> str:
        return self.value

    @property
    def folder_prefix(self) -> str:
        """The folder-name prefix of a save, before the step: ``checkpoint-`` or ``step-``."""
        return "checkpoint-" if self is Framework.HF else "step-"

    @property
    def folder_pattern(self) -> str:
        """The folder-name shape, for messages: ``checkpoint-<step>`` or ``step-<step>``."""
        return f"{self.folder_prefix}<step>"


def parse_framework(text: str) -> Framework:
    """Parse a framework name, exactly ``hf`` or ``dcp`` (the two this enumeration names; every rule's name,
    built in, configured or a plugin's, goes through ``ckpt.application.rulebook.find_rule``).

    >>> parse_framework("dcp")
    <Framework.DCP: 'dcp'>
    """
    require_str(text, "framework")
    for framework in Framework:
        if text == framework.value:
            return framework
    names = ", ".join(f.value for f in Framework)
    raise InvalidError(f"framework {text!r} is not one of {names}")


def default_settle(framework: Framework, interval: float) -> float:
    """The settle time when none is given: one interval for ``hf``, 0 for ``dcp`` (rule 4)."""
    return interval if framework is Framework.HF else 0.0


MAX_WORLD_SIZE = 2**31 - 1  # torch keeps ranks in a 32-bit int


def parse_world_size(text: str) -> int:
    """Parse a world size (the number of training processes): ASCII decimal digits, 1 or more.

    >>> parse_world_size("8")
    8
    """
    if not isinstance(text, str) or not text.isascii() or not text.isdigit():
        raise InvalidError(f"world size {text!r} is not a whole number of processes (such as 8)")
    return validate_world_size(int(text))


def validate_world_size(world_size: int) -> int:
    """Return ``world_size`` when it is a whole number of processes from 1 to 2**31 - 1; else InvalidError."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise InvalidError(f"world size {world_size!r} is not a whole number of processes")
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise InvalidError(f"world size {world_size!r} must be between 1 and {MAX_WORLD_SIZE}")
    return world_size


def rank_files(framework: Framework, world_size: int | None) -> tuple[str, ...]:
    """The per-rank files a complete save must hold, in rank order (rule 3).

    >>> rank_files(Framework.HF, 2), rank_files(Framework.HF, 1), rank_files(Framework.DCP, 2)
    (('rng_state_0.pth', 'rng_state_1.pth'), (), ())
    """
    if framework is not Framework.HF or world_size is None or validate_world_size(world_size) == 1:
        return ()
    return tuple(f"rng_state_{rank}.pth" for rank in range(world_size))


def save_step(framework: Framework, name: str) -> int | None:
    """Return the step of a save folder called ``name``, or ``None`` when it is not a save (rule 1).

    >>> save_step(Framework.HF, "checkpoint-500"), save_step(Framework.HF, "tmp-checkpoint-500")
    (500, None)
    """
    prefix = framework.folder_prefix
    if not name.startswith(prefix):
        return None
    try:
        return parse_step(name[len(prefix) :])
    except InvalidError:
        return None


@attrs.frozen
class SaveFolder:
    """A folder that is a save under a framework's rule: its name and the step the name carries."""

    step: int
    name: str


def save_folders(framework: Framework, names: Iterable[str]) -> list[SaveFolder]:
    """Return the names that are saves, in step order (ties by name), dropping everything else.

    >>> [f.name for f in save_folders(Framework.DCP, ["step-20", "runs", "step-3"])]
    ['step-3', 'step-20']
    """
    found = []
    for name in names:
        step = save_step(framework, name)
        if step is not None:
            found.append(SaveFolder(step, name))
    return sorted(found, key=lambda f: (f.step, f.name))


@attrs.frozen
class Markers:
    """The marker files of one save, as read from the store.

    ``trainer_state`` is the content of ``trainer_state.json`` (``None`` when absent), or its first bytes when
    ``trainer_state_end`` is given; ``incomplete_sentinel`` whether ``checkpoint-is-incomplete.txt`` is
    present; ``metadata`` whether ``.metadata`` is present; ``rank_states`` the end of each rank's
    ``rng_state_<i>.pth`` (``None`` where absent). A rule looks only at its own fields.
    """

    trainer_state: bytes | None = None
    incomplete_sentinel: bool = False
    #: When ``trainer_state.json`` was larger than the read cap: its size and last bytes (``trainer_state``
    #: then holds only its first bytes; rule 2).
    trainer_state_end: FileTail | None = None
    metadata: bool = False
    rank_states: tuple[FileTail | None, ...] = ()


@attrs.frozen
class FileTail:
    """The end of one file as read: its size in bytes and its last bytes (the whole file when small).

    ``tail`` is empty when the file was not read (larger than a reader's bound). ``span`` is the zip check's
    second read, when one was needed (``zip_end.zip_second_read``).
    """

    size: int
    tail: bytes
    span: Span | None = None


def zip_tail_problem(file: FileTail) -> str | None:
    """Return why ``file`` does not end as a complete zip does, or ``None`` when it does (rule 3).

    The check is ``ckpt.domain.zip_end.zip_end_problem`` (spec/watcher.md §2.4): an end-of-central-directory
    record ends the file exactly, and the central directory it describes (through the ZIP64 records when
    there are some) lies inside the file, ends where those records begin and starts with a directory
    header. It needs the last ``ZIP_TAIL_BYTES`` of the file, and ``file.span`` when the directory starts
    before them (``zip_end.zip_second_read`` says where).

    >>> zip_tail_problem(FileTail(3, b"PK\\x03"))
    'no end-of-central-directory record at its end'
    """
    return zip_end_problem(file.size, file.tail, file.span)


def _is_json_object(data: bytes) -> bool:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return False
    return isinstance(value, dict)


#: How the Trainer's ``trainer_state.json`` ends: the outermost ``}`` alone on the last line (rule 2).
_TRAINER_STATE_END = b"\n}\n"


def large_trainer_state_problem(head: bytes, end: FileTail) -> str | None:
    """Judge a ``trainer_state.json`` too large to parse by its first bytes and its end (rule 2).

    >>> large_trainer_state_problem(b'{\\n  "a": 1', FileTail(99_000_000, b'  }\\n  ]\\n}\\n'))
    >>> large_trainer_state_problem(b'{\\n  "a": 1', FileTail(99_000_000, b'      "step": 9\\n    }'))[:40]
    'trainer_state.json is 99000000 bytes, to'
    """
    if head.lstrip(b" \t\r\n").startswith(b"{") and end.tail.endswith(_TRAINER_STATE_END):
        return None
    return (
        f"{TRAINER_STATE} is {end.size} bytes, too large to parse, and does not start and end as the "
        f"Trainer writes it ('{{' first, a '}}' alone on the last line): still being written"
    )


def markers_problem(framework: Framework, markers: Markers, *, world_size: int | None = None) -> str | None:
    """Return why the markers say the save is not complete, or ``None`` when they say it is (rules 2, 3).

    ``world_size`` (``None``: unknown) is the number of training processes; for ``hf`` with more than one,
    ``markers.rank_states[i]`` must be rank ``i``'s complete ``rng_state_<i>.pth``. A reader may stop at the
    first rank that fails, leaving ``rank_states`` shorter: the ranks are checked in order, so the verdict
    names that one.

    >>> markers_problem(Framework.HF, Markers(trainer_state=b'{"global_step": 5}'))
    >>> markers_problem(Framework.HF, Markers(trainer_state=b'{"global_st'))
    'trainer_state.json is not a JSON object'
    >>> markers_problem(Framework.HF, Markers(trainer_state=b"{}"), world_size=2)
    'no rng_state_0.pth (rank 0 of 2 has not finished its part of the save)'
    """
    if framework is Framework.DCP:
        return None if markers.metadata else f"no {METADATA}"
    if markers.trainer_state is None:
        return f"no {TRAINER_STATE}"
    if markers.trainer_state_end is not None:
        problem = large_trainer_state_problem(markers.trainer_state, markers.trainer_state_end)
        if problem is not None:
            return problem
    elif not _is_json_object(markers.trainer_state):
        return f"{TRAINER_STATE} is not a JSON object"
    if markers.incomplete_sentinel:
        return f"incomplete: {INCOMPLETE_SENTINEL} is present"
    names = rank_files(framework, world_size)
    for rank, name in enumerate(names):
        state = markers.rank_states[rank] if rank < len(markers.rank_states) else None
        if state is None:
            return f"no {name} (rank {rank} of {len(names)} has not finished its part of the save)"
        if state.size > RNG_STATE_MAX_BYTES:
            return f"{name} is {state.size} bytes, more than a rank's RNG state can be; not read"
        problem = zip_tail_problem(state)
        if problem is not None:
            return f"{name} is not a complete zip: {problem} (rank {rank} of {len(names)} was cut short)"
    return None


# Old names, which did not say what they return (a problem, or the checked value): kept so that callers not
# yet renamed keep working.
check_markers = markers_problem
check_zip_tail = zip_tail_problem
check_world_size = validate_world_size
