"""Every path that decides "complete" agrees with the framework vectors, on the same real trees (issue 20).

Whether a save is complete is decided by one rule object per framework (watcher.md §1-§2), and every path
that publishes or resumes asks it: the watcher's scan (watcher.md §4), verified resolve (§6), the catch-up
of ``ckpt resume`` (§7), ``resume_location`` (the integrations' core and their own helpers) and the API,
whichever way it is handed the rule (``find_rule(name, world_size=)``, ``parse_framework``, ``as_rule``).
This file enumerates those paths (:data:`PATHS`) and runs **every case of every file** in
``tests/vectors/frameworks/*.json`` through each of them, built for real as files on a POSIX root:

* the save's layout lies in the execution folder ``exec/a`` of a dead execution (epoch record 1), and the
  resuming execution is ``exec/b`` at epoch 2, so the catch-up paths judge it as they would after a crash;
* a case that gives a world size is run twice: the size given explicitly to the path, and the size read
  from the execution's world-size record ``exec/a/.ckpt-world-size`` with none given (ADR 0022). The
  watcher never reads the record (``ckpt watch`` writes it), so it runs the explicit way only;
* each path's verdict (the save published, or returned) must equal the case's ``complete`` (a name that
  is no save is never complete), and where the path says why (verified resolve), its reason contains the
  case's ``reason``.

The command line (``ckpt resolve --framework F [--world-size N]`` and ``ckpt resume``, as real processes)
runs for a representative subset only (:func:`cli_cases`: per vector file its first complete case, its
first incomplete save and every case with a world size of one file): a process start costs a few tenths of
a second on the CI machine, and the whole cross product would be some 600 processes; in-process the same
paths run for every case. The in-memory store and moto's S3 server run the in-process paths for a subset
too (:func:`store_cases`), each path on a fresh store.

To add a path, add a function ``(Setup) -> Verdict`` to :data:`PATHS` (or to :data:`CLI_PATHS`); to add a
rule, add its vector file (``tests/vectors/frameworks/<name>.json``, docs/vectors.md): it is picked up by
name, and :data:`OWN_RESUME` maps rule names to an integration's own ``resume_location`` when it has one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ckpt.application.catchup import catch_up, record_epoch, record_world_size, resume
from ckpt.application.rulebook import as_rule, find_rule
from ckpt.application.verify import resolve_verified
from ckpt.application.watcher import Watcher
from ckpt.domain.entries import Entry
from ckpt.domain.frameworks import Framework, parse_framework
from ckpt.domain.ports import WatchStore
from ckpt.domain.rules import BUILTIN, CustomRule, Item, Kind, Rule, parse_custom_rules
from ckpt.integrations import core
from ckpt.store import open_store
from support.harness import Harness
from support.rule_layouts import content
from support.trainer.frameworks import apply_to_folder

VECTORS = Path(__file__).parent / "vectors" / "frameworks"
DEAD, NOW = "a", "b"  # the execution that wrote the save, and the one resuming
DEAD_EPOCH, NOW_EPOCH = 1, 2


def _load(path: Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        document: dict[str, Any] = json.load(f)
    assert document["version"] == 1, path
    return document


FILES = {path.stem: _load(path) for path in sorted(VECTORS.glob("*.json"))}


@attrs.frozen
class Case:
    """One vector case: its file (the rule's name, ``custom`` for configured rules) and its fields."""

    file: str
    data: dict[str, Any] = attrs.field(eq=False)

    @property
    def id(self) -> str:
        return f"{self.file}/{self.data['id']}"

    @property
    def expected(self) -> bool:
        return bool(self.data["is_save"] and self.data["complete"])

    @property
    def world_size(self) -> int | None:
        size = self.data.get("options", {}).get("world_size")
        return None if size is None else int(size)

    @property
    def configured(self) -> tuple[CustomRule, ...]:
        """The case's own ``[[frameworks]]`` table, as the configuration would give it (``custom.json``)."""
        config = self.data.get("config")
        return () if config is None else tuple(parse_custom_rules([config], BUILTIN))

    @property
    def rule_name(self) -> str:
        return str(self.data["config"]["name"]) if "config" in self.data else str(FILES[self.file]["rule"])

    def layout(self) -> dict[str, bytes | None]:
        return {path: content(spec) for path, spec in self.data["layout"].items()}


def all_cases() -> list[Case]:
    return [Case(name, data) for name, document in FILES.items() for data in document["cases"]]


@attrs.frozen
class Setup:
    """A case on one store, and how the world size reaches the path: ``"explicit"``, ``"record"``, or
    ``"none"`` (the case gives none)."""

    case: Case
    store: WatchStore = attrs.field(eq=False)
    how: str
    root: Path | None = None  # a POSIX root, for the command-line paths

    @property
    def given(self) -> int | None:
        """The world size handed to the path explicitly."""
        return self.case.world_size if self.how == "explicit" else None

    @property
    def location(self) -> str:
        """Where the case's save lies (it may not exist: the case may say it is no save)."""
        return self.store.location(Entry(0, 0, f"exec/{DEAD}/{self.case.data['save']}")).rstrip("/")

    def rule(self, world_size: int | None = None) -> Rule:
        """The rule by name (``find_rule``), with ``world_size``."""
        return find_rule(self.case.rule_name, world_size=world_size, configured=self.case.configured)

    def step(self) -> int:
        """The step the rule reads from the save's name (0 for a name that is no save)."""
        name = self.case.data["save"]
        rule = self.rule()
        for kind in (Kind.FOLDER, Kind.FILE):
            for save in rule.saves([Item(name, kind)]):
                return save.step
        return 0

    def published(self) -> bool:
        """Whether ``pub/`` holds an entry for the case's save."""
        return any(self.store.location(e).rstrip("/") == self.location for e in self.store.entries())

    def publish(self) -> bool:
        """Publish the case's save (as its dead execution would have); False when it does not exist."""
        try:
            self.store.publish(DEAD_EPOCH, self.step(), self.location)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True


@attrs.frozen
class Verdict:
    """What a path decided: whether the save is complete there, and why not (when the path says)."""

    complete: bool
    reason: str | None = None


def _resumed(setup: Setup, location: str | None) -> Verdict:
    """A resume path's verdict: the save caught up (published); the answer must then agree."""
    caught = setup.published()
    if location is not None and location.rstrip("/") == setup.location:
        assert caught, "resumed from a save that is not published"
    if caught and not _newer_saves(setup):
        assert location is not None
        assert location.rstrip("/") == setup.location, location
    return Verdict(caught)


def _newer_saves(setup: Setup) -> bool:
    """Whether the layout holds other saves that a resume may prefer (several saves in one case)."""
    return sum(1 for e in setup.store.entries()) > 1


# -- the in-process paths ---------------------------------------------------------------------------------


def watcher_scan(setup: Setup) -> Verdict:
    """``Watcher.scan`` of the dead execution's folder, settle 0 (settle is not part of the verdicts)."""
    watcher = Watcher(
        setup.store,
        setup.rule(setup.given),
        setup.store.exec_dir(DEAD),
        DEAD_EPOCH,
        interval=1.0,
        settle=0.0,
    )
    created = watcher.scan()
    return Verdict(any(setup.store.location(e).rstrip("/") == setup.location for e in created))


def _verified(setup: Setup, rule: Rule | Framework, world_size: int | None) -> Verdict:
    if not setup.published() and not setup.publish():
        return Verdict(False, "save folder is missing")
    found = resolve_verified(setup.store, rule, world_size=world_size)
    if found.entry is not None:
        return Verdict(True)
    reasons = [r for e, r in found.skipped if setup.store.location(e).rstrip("/") == setup.location]
    return Verdict(False, reasons[0] if reasons else None)


def verified_find_rule(setup: Setup) -> Verdict:
    """``resolve_verified(store, find_rule(name, world_size=N))``."""
    return _verified(setup, setup.rule(setup.given), None)


def verified_world_size_argument(setup: Setup) -> Verdict:
    """``resolve_verified(store, find_rule(name), world_size=N)``: the size given to the call."""
    return _verified(setup, setup.rule(), setup.given)


def verified_as_rule(setup: Setup) -> Verdict:
    """``resolve_verified(store, as_rule(find_rule(name), N))``."""
    return _verified(setup, as_rule(setup.rule(), setup.given), None)


def verified_parse_framework(setup: Setup) -> Verdict:
    """``resolve_verified(store, parse_framework(name), world_size=N)`` (the rules a Framework names), and
    ``as_rule(parse_framework(name), N)``; for other rules, ``find_rule`` again."""
    name = setup.case.rule_name
    if name not in {f.value for f in Framework} or setup.case.configured:
        return verified_find_rule(setup)
    framework = parse_framework(name)
    first = _verified(setup, framework, setup.given)
    second = _verified(setup, as_rule(framework, setup.given), None)
    assert first == second, (first, second)
    return first


def catch_up_path(setup: Setup) -> Verdict:
    """``catch_up`` from the resuming execution (settle 0)."""
    caught = catch_up(
        setup.store,
        setup.rule(),
        attempt=NOW,
        epoch=NOW_EPOCH,
        settle=0.0,
        world_size=setup.given,
    )
    return Verdict(any(setup.store.location(e).rstrip("/") == setup.location for e in caught.published))


def resume_path(setup: Setup) -> Verdict:
    """``resume`` (what ``ckpt resume`` runs), settle 0."""
    resumed = resume(
        setup.store,
        setup.rule(setup.given),
        attempt=NOW,
        epoch=NOW_EPOCH,
        settle=0.0,
    )
    return _resumed(setup, resumed.location)


def core_resume_location(setup: Setup) -> Verdict:
    """``ckpt.integrations.core.resume_location`` with the rule's name (a configured rule as the object):
    the path of every integration (hf, dcp; lightning and accelerate go through it too)."""
    job = core.Job(setup.store, NOW_EPOCH, NOW)
    name: str | Rule = setup.case.rule_name if not setup.case.configured else setup.case.configured[0]
    location = core.resume_location(name, job=job, settle=0.0, world_size=setup.given)
    return _resumed(setup, location)


def _hf_resume_location(job: core.Job) -> str | None:
    from ckpt.integrations.hf import resume_location

    return resume_location(job=job, settle=0.0)


def _dcp_resume_location(job: core.Job) -> str | None:
    from ckpt.integrations.dcp import resume_location

    return resume_location(job=job, settle=0.0)


def _lightning_resume_location(job: core.Job) -> str | None:
    """The Lightning helper gives ``trainer.fit`` the checkpoint inside a ``step-<step>`` save
    (``<save>/model.ckpt``); the save it chose is that location's folder."""
    from ckpt.integrations.lightning import resume_location

    location = resume_location(job=job, settle=0.0)
    if location is not None and location.endswith("/model.ckpt"):
        return location[: -len("/model.ckpt")]
    return location


#: An integration's own ``resume_location``, by rule name, for the rules that have one. It takes no world
#: size: a case with one runs it through the record only.
OWN_RESUME: dict[str, Callable[[core.Job], str | None]] = {
    "hf": _hf_resume_location,
    "dcp": _dcp_resume_location,
    "lightning": _lightning_resume_location,
}
# Accelerate's helper is a method, ``CkptAccelerate.resume_location``, whose body is
# ``core.resume_location(find_rule("accelerate"), job=...)`` at the rule's settle: the core path above.


def own_resume_location(setup: Setup) -> Verdict:
    """The integration's own helper (``ckpt.integrations.hf.resume_location``, ...), where there is one."""
    own = OWN_RESUME.get(setup.case.rule_name)
    if own is None or setup.case.configured or setup.how == "explicit":
        return core_resume_location(setup)
    return _resumed(setup, own(core.Job(setup.store, NOW_EPOCH, NOW)))


#: Every in-process path, by name. Each runs on a fresh store holding the case's tree.
PATHS: dict[str, Callable[[Setup], Verdict]] = {
    "watcher": watcher_scan,
    "verified-find-rule": verified_find_rule,
    "verified-world-size-argument": verified_world_size_argument,
    "verified-as-rule": verified_as_rule,
    "verified-parse-framework": verified_parse_framework,
    "catch-up": catch_up_path,
    "resume": resume_path,
    "core-resume-location": core_resume_location,
    "own-resume-location": own_resume_location,
}
#: The paths that judge a published entry's save by its name alone (watcher.md §6.3).
JUDGE_ENTRIES = {p for p in PATHS if p.startswith("verified")} | {"cli-resolve"}
#: The paths that read the world-size record (the watcher does not: ``ckpt watch`` writes it).
READS_RECORD = set(PATHS) - {"watcher"}


# -- the command line, as real processes ------------------------------------------------------------------


def _cli(setup: Setup, *args: str) -> subprocess.CompletedProcess[str]:
    assert setup.root is not None
    command = [sys.executable, "-m", "ckpt", "--root", str(setup.root)]
    if setup.case.configured:
        config = setup.root.parent / "ckpt.toml"
        table = "".join(f"{key} = {json.dumps(value)}\n" for key, value in setup.case.data["config"].items())
        config.write_text(f"[[frameworks]]\n{table}", encoding="utf-8")
        command += ["--config", str(config)]
    command += [*args, "--framework", setup.case.rule_name]
    if setup.given is not None:
        command += ["--world-size", str(setup.given)]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("CKPT_", "DISPATCH_")) and k != "WORLD_SIZE"
    }
    return subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60, check=False
    )


def cli_resolve(setup: Setup) -> Verdict:
    """``ckpt resolve --framework F [--world-size N]``: exit 0 with the location, or exit 3."""
    if not setup.publish():
        return Verdict(False)
    result = _cli(setup, "resolve")
    if result.returncode == 3:
        return Verdict(False, result.stderr)
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip("\n") == setup.location, result.stdout
    return Verdict(True)


def cli_resume(setup: Setup) -> Verdict:
    """``ckpt resume --framework F --attempt b --epoch 2 --settle 0 [--world-size N]``."""
    result = _cli(setup, "resume", "--attempt", NOW, "--epoch", str(NOW_EPOCH), "--settle", "0")
    assert result.returncode == 0, result.stderr
    return _resumed(setup, result.stdout.rstrip("\n") or None)


CLI_PATHS: dict[str, Callable[[Setup], Verdict]] = {"cli-resolve": cli_resolve, "cli-resume": cli_resume}


# -- arranging a case -------------------------------------------------------------------------------------


def ways(case: Case) -> list[str]:
    """How the world size reaches the paths: explicitly and through the record, or not at all."""
    return ["none"] if case.world_size is None else ["explicit", "record"]


def posix_setup(case: Case, how: str, base: Path) -> Setup:
    """The case's tree as real files in ``exec/a`` of a fresh POSIX root, with its records."""
    root = base / "root"
    folder = root / "exec" / DEAD
    folder.mkdir(parents=True)
    apply_to_folder(case.layout(), folder)
    return _recorded(Setup(case, open_store(str(root)), how, root))


def _recorded(setup: Setup) -> Setup:
    record_epoch(setup.store, DEAD, DEAD_EPOCH)
    if setup.how == "record":
        assert setup.case.world_size is not None
        record_world_size(setup.store, DEAD, setup.case.world_size)
    return setup


def judged_by_name(case: Case) -> bool:
    """Whether a path that judges a published entry by its save's name alone can give the case's verdict.

    Verified resolve knows a save by its last element only (watcher.md §6.3), not by what lies beside it:
    a case that is no save only because of a sibling (NeMo's ``-last`` twin of a checkpoint, the same step
    published once) names a save there, complete or not by its own files. Every other case it can judge.
    """
    if case.data["is_save"]:
        return True
    rule = find_rule(case.rule_name, configured=case.configured)
    name = case.data["save"]
    return not any(rule.saves([Item(name, kind)]) for kind in (Kind.FOLDER, Kind.FILE))


def check(setup: Setup, path: str, verdict: Verdict) -> None:
    case = setup.case
    assert verdict.complete is case.expected, f"{path} ({setup.how}) says {verdict} for {case.id}"
    wanted = case.data.get("reason")
    if (
        not verdict.complete
        and wanted is not None
        and verdict.reason is not None
        and path.startswith("verified")
    ):
        assert wanted in verdict.reason, (path, verdict.reason)


def _params() -> Iterator[Any]:
    for case in all_cases():
        for how in ways(case):
            yield pytest.param(case, how, id=f"{case.id}-{how}")


@pytest.mark.parametrize(("case", "how"), list(_params()))
def test_every_path_agrees_with_the_vector(case: Case, how: str, tmp_path: Path) -> None:
    """Every in-process path, each on a fresh real tree, gives the case's verdict."""
    for number, (path, run) in enumerate(PATHS.items()):
        if how == "record" and path not in READS_RECORD:
            continue
        if path in JUDGE_ENTRIES and not judged_by_name(case):
            continue
        setup = posix_setup(case, how, tmp_path / str(number))
        check(setup, path, run(setup))


def cli_cases() -> list[Case]:
    """Per vector file: its first complete case, its first incomplete save, and the cases with a world
    size of the ``hf`` and ``deepspeed`` files (the rules whose verdicts turn on it)."""
    chosen: list[Case] = []
    for name in FILES:
        cases = [c for c in all_cases() if c.file == name]
        complete = [c for c in cases if c.expected]
        incomplete = [c for c in cases if c.data["is_save"] and not c.expected]
        chosen += complete[:1] + incomplete[:1]
        if name in ("hf", "deepspeed"):
            chosen += [c for c in cases if c.world_size is not None and c not in chosen][:4]
    return chosen


@pytest.mark.parametrize(
    ("case", "how"), [pytest.param(c, h, id=f"{c.id}-{h}") for c in cli_cases() for h in ways(c)]
)
@pytest.mark.parametrize("path", sorted(CLI_PATHS))
def test_the_command_line_agrees(case: Case, how: str, path: str, tmp_path: Path) -> None:
    """``ckpt resolve --framework`` and ``ckpt resume`` as real processes give the case's verdict."""
    setup = posix_setup(case, how, tmp_path)
    assert path not in JUDGE_ENTRIES or judged_by_name(case)
    check(setup, path, CLI_PATHS[path](setup))


# -- the same on the in-memory store and on moto's S3 server ----------------------------------------------


def store_cases() -> list[Case]:
    """The CLI subset without empty folders (an object store holds none)."""
    return [c for c in cli_cases() if all(spec is not None for spec in c.data["layout"].values())]


@pytest.fixture(params=["memory", "s3-http"])
def other_harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    from support.fixtures import HARNESS_FACTORIES

    yield from HARNESS_FACTORIES[request.param](request, tmp_path)


@pytest.mark.parametrize(
    ("case", "how"), [pytest.param(c, h, id=f"{c.id}-{h}") for c in store_cases() for h in ways(c)]
)
@pytest.mark.parametrize(
    "path", ["watcher", "verified-world-size-argument", "catch-up", "core-resume-location"]
)
def test_other_stores_agree(case: Case, how: str, path: str, other_harness: Harness) -> None:
    """The in-memory store and moto's S3 server over HTTP give the same verdicts as POSIX."""
    if how == "record" and path not in READS_RECORD:
        how = "explicit"
    for relative, data in case.layout().items():
        assert data is not None
        other_harness.make_file(f"exec/{DEAD}/{relative}", data)
    setup = _recorded(Setup(case, other_harness.store(), how))
    check(setup, path, PATHS[path](setup))
