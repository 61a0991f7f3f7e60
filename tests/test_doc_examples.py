"""The docs are tests (issue 20): every shell and Python example in README.md and docs/ runs, or says why not.

Every fenced ``bash``/``sh``/``shell``/``console``/``python`` block of README.md and docs/**/*.md carries, on
the line right before its fence, one marker comment (README.md, "Development", documents them):

- ``<!-- runs: NAME -->``: this module runs it, with the runner ``NAME`` of :data:`RUNNERS`, on a temporary
  POSIX root (``/mnt/ckpt/run-42`` in the text becomes that root), and checks what the page says it prints;
- ``<!-- excerpt: PATH -->``: the block is quoted from the file ``PATH``: each of its code lines (comments and
  blank lines aside) appears there, in the same order;
- ``<!-- tested-by: tests/FILE.py -->``: another test module extracts and runs it (and names the page);
- ``<!-- illustrative: REASON -->``: not run, for the reason given (a cluster, S3, a framework's model...).

A block without a marker, with an empty reason, or naming a runner that does not exist fails the suite, and
so does a runner that no block uses.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry

REPO = Path(__file__).parent.parent
LANGUAGES = frozenset({"bash", "sh", "shell", "console", "python"})
KINDS = ("runs", "excerpt", "tested-by", "illustrative")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>[a-z-]+):\s*(?P<argument>.*?)\s*-->\s*$")
DOC_ROOT = "/mnt/ckpt/run-42"
EPOCH = 2_000_000
ATTEMPT = "2.4102.0"
TIMEOUT = 30


@attrs.frozen
class Block:
    """One fenced block of a page, with the marker on the line before its fence (``kind`` ``None``: none)."""

    page: str
    line: int
    lang: str
    text: str
    kind: str | None
    argument: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def extract(page: str, markdown: str) -> list[Block]:
    """Every shell or Python block of ``markdown``, in page order, with its marker."""
    lines = markdown.splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if not opened:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith(opened["fence"]):
            end += 1
        if opened["lang"] in LANGUAGES:
            marker = MARKER.match(lines[index - 1]) if index else None
            blocks.append(
                Block(
                    page,
                    index + 1,
                    opened["lang"],
                    "".join(f"{line}\n" for line in lines[index + 1 : end]),
                    marker["kind"] if marker else None,
                    marker["argument"] if marker else "",
                )
            )
        index = end + 1
    return blocks


def problems(blocks: list[Block], runners: dict[str, object]) -> list[str]:
    """What is wrong with the blocks' markers; empty when every block runs or says why not."""
    found = []
    for block in blocks:
        if block.kind is None:
            found.append(
                f"{block.where}: a {block.lang} block without a marker: add a runner to "
                "tests/test_doc_examples.py and <!-- runs: NAME -->, or <!-- illustrative: REASON -->"
            )
        elif block.kind not in KINDS:
            found.append(f"{block.where}: unknown marker {block.kind!r}; one of {', '.join(KINDS)}")
        elif not block.argument:
            found.append(f"{block.where}: the {block.kind} marker names nothing (a runner, a file, a reason)")
        elif block.kind == "runs" and block.argument not in runners:
            found.append(f"{block.where}: no runner {block.argument!r} in tests/test_doc_examples.py")
    used = {block.argument for block in blocks if block.kind == "runs"}
    found.extend(f"runner {name!r} runs no block" for name in sorted(set(runners) - used))
    return found


def pages() -> Iterator[Path]:
    yield REPO / "README.md"
    yield from sorted((REPO / "docs").rglob("*.md"))


def all_blocks() -> list[Block]:
    return [
        block
        for path in pages()
        for block in extract(path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8"))
    ]


def code_lines(text: str) -> list[str]:
    """A block's or a file's lines with comments, blank lines and ``...`` left out, spaces collapsed."""
    kept = []
    for line in text.splitlines():
        code = " ".join(re.sub(r"(^|\s)#.*$", "", line).split())
        if code and code != "...":
            kept.append(code)
    return kept


# -- the world a runner gives a block -----------------------------------------------------------------------


@attrs.define
class World:
    """A temporary root, the block's environment, and stand-ins for the commands a page calls around ckpt."""

    tmp: Path
    root: Path = attrs.field(init=False)
    bin: Path = attrs.field(init=False)
    store: PosixStore = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.root = self.tmp / "run-42"
        self.root.mkdir()
        self.store = PosixStore(str(self.root))
        self.bin = self.tmp / "bin"
        self.bin.mkdir()
        # `ckpt` is this checkout's, and `python` this interpreter, whatever the PATH holds.
        self.command("ckpt", f'exec "{sys.executable}" -m ckpt "$@"')
        self.command("python", f'exec "{sys.executable}" "$@"')
        self.command("python3", f'exec "{sys.executable}" "$@"')

    def command(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        path.chmod(0o755)

    def echo_command(self, name: str) -> None:
        """A stand-in that prints its name and arguments, one a line (a trainer, a launcher)."""
        self.command(name, f'printf "%s\\n" {name} "$@"')

    @property
    def env(self) -> dict[str, str]:
        source = str(REPO / "src")
        path = os.environ.get("PYTHONPATH")
        return {
            "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(self.tmp),
            "PYTHONPATH": source if not path else f"{source}{os.pathsep}{path}",
            "CKPT_ROOT": str(self.root),
            "DISPATCH_EPOCH": str(EPOCH),
            "DISPATCH_ATTEMPT": ATTEMPT,
            "WORLD_SIZE": "2",
        }

    def save(self, step: int) -> Path:
        """A save ``checkpoint-<step>`` of this execution, complete for ``hf``."""
        save = self.root / "exec" / ATTEMPT / f"checkpoint-{step}"
        save.mkdir(parents=True)
        (save / "trainer_state.json").write_text(f'{{"global_step": {step}}}', encoding="utf-8")
        return save

    def publish(self, step: int) -> Entry:
        return self.store.publish(EPOCH, step, str(self.save(step)))

    def local(self, text: str) -> str:
        return text.replace(DOC_ROOT, str(self.root))

    def sh(self, text: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``text`` with bash, -e -u and pipefail, in the temporary folder."""
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", self.local(text)],
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        if check:
            assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done

    def python(self, text: str, *, before: str = "", after: str = "") -> str:
        """Run ``before``, the block and ``after`` as one script; its stdout."""
        done = subprocess.run(
            [sys.executable, "-c", before + self.local(text) + after],
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        return done.stdout

    def follow(self, text: str, *, stop: signal.Signals | None) -> tuple[list[str], int]:
        """Run a block that follows the log until it prints a line, publishing new saves while it has not.

        The entries published before the follow starts listing are not new to it, so saves are published
        one after the other until one is printed: what it prints does not depend on when it started. Then
        ``stop`` is sent (the block ends itself) or, with ``None``, the process is ended.
        """
        script = self.local(text).replace("interval=30", "interval=0.05")
        process = subprocess.Popen(
            [sys.executable, "-u", "-c", script],
            cwd=self.tmp,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        printed: list[str] = []
        first = threading.Event()

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                printed.append(line.rstrip("\n"))
                first.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        step = 10_000
        while not first.wait(0.1) and process.poll() is None:
            step += 100
            self.publish(step)
        if stop is None:
            process.kill()
        else:
            process.send_signal(stop)
        code = process.wait(TIMEOUT)
        reader.join(5)
        errors = process.stderr.read()
        process.stdout.close()
        process.stderr.close()
        assert printed, (code, errors)
        return printed, code


# -- the runners: each prepares its block's world, runs the block, and checks what the page says -----------


def readme_cli(block: Block, world: World) -> None:
    """The README's command lines: exec-dir, publish, resolve and a dry-run prune print what they say."""
    # The page's export names the page's root; the world's root replaces it, and the save is the trainer's.
    world.save(600)
    done = world.sh(block.text)
    location = f"{world.root}/exec/{ATTEMPT}/checkpoint-600"
    published, resolved, pruned = done.stdout.splitlines()
    assert published == f"published epoch {EPOCH} step 600: {location}"
    shown = re.search(r"^ckpt resolve +# (\S+)$", block.text, re.MULTILINE)
    assert shown, "the page shows what resolve prints"
    assert resolved == location == world.local(shown[1])
    assert json.loads(pruned)["removed_entries"] == []


def readme_api(block: Block, world: World) -> None:
    """The README's Python API block, on a temporary root, down to a follow that prints a new entry."""
    world.save(600)
    printed, _ = world.follow(block.text, stop=None)
    assert printed[0].endswith(" True"), printed  # a new entry of the newest epoch is the latest
    assert world.store.pinned() == [Entry(EPOCH, 600, f"exec/{ATTEMPT}/checkpoint-600")]


def readme_resolve_hf(block: Block, world: World) -> None:
    """``ckpt resolve --framework hf`` prints the newest complete save and names one passed over."""
    world.publish(500)
    incomplete = world.publish(600)
    (world.root / incomplete.save / "trainer_state.json").unlink()
    done = world.sh(block.text)
    assert done.stdout == f"{world.root}/exec/{ATTEMPT}/checkpoint-500\n"
    assert "checkpoint-600" in done.stderr, done.stderr


def readme_verified(block: Block, world: World) -> None:
    """The README's verified resolve in Python gives the newest complete save's location."""
    world.publish(600)
    before = f"import ckpt\nstore = ckpt.open_store({str(world.root)!r})\n"
    printed = world.python(block.text, before=before, after="print(resume_from)\n")
    assert printed == f"{world.root}/exec/{ATTEMPT}/checkpoint-600\n"


def readme_resume(block: Block, world: World) -> None:
    """``ckpt resume`` gives the trainer no resume flag on a first run, and the newest save afterwards."""
    (world.tmp / "train.py").write_text("import sys\nprint(sys.argv[1:])\n", encoding="utf-8")
    assert world.sh(block.text).stdout == "[]\n"
    world.publish(600)
    location = f"{world.root}/exec/{ATTEMPT}/checkpoint-600"
    assert world.sh(block.text).stdout == f"['--resume-from-checkpoint', '{location}']\n"


def resolve_nothing(block: Block, world: World) -> None:
    """A framework page's resolve line is accepted on an empty root: nothing is published, no usage error."""
    done = world.sh(block.text, check=False)
    # 0: `if latest=$(ckpt resolve ...)`; 3: a bare `latest=$(ckpt resolve ...)` under -e
    assert done.returncode in (0, 3), (done.returncode, done.stderr)
    assert re.fullmatch(r"ckpt: no complete \S+ save is published under '[^']+'\n", done.stderr), done.stderr


def locator(block: Block, world: World) -> None:
    """The Locator of an az:// root builds."""
    world.python(block.text, before="from ckpt.domain.locator import Locator\n")


def defines(block: Block, world: World) -> None:
    """A block that defines a class or a function runs (its imports exist) and defines it."""
    world.python(block.text)


def follow_stop(block: Block, world: World) -> None:
    """The follow loop with a stop event prints new entries and ends with exit 0 on SIGTERM."""
    world.publish(600)
    printed, code = world.follow(block.text, stop=signal.SIGTERM)
    assert code == 0
    assert re.fullmatch(rf"\d+ {re.escape(str(world.root))}/exec/{ATTEMPT}/checkpoint-\d+ latest", printed[0])


def pin_cli(block: Block, world: World) -> None:
    """pin by location, pin by epoch and step, entries shows (pinned), and unpin: all exit 0."""
    world.publish(600)
    done = world.sh(block.text)
    listed = [line for line in done.stdout.splitlines() if line.startswith(f"{EPOCH} 600 ")]
    assert listed == [f"{EPOCH} 600 {world.root}/exec/{ATTEMPT}/checkpoint-600 (pinned)"], done.stdout
    assert world.store.pinned() == []


def prune_dry_run(block: Block, world: World) -> None:
    """The dry-run prune prints the very lines the page shows, for the entries the page implies."""
    for step in (5_000, 10_000, 14_500, 15_000, 20_000, 20_500, 21_000):
        entry = world.publish(step)
        if step == 14_500:
            world.store.pin(entry)
    printed = world.sh(block.text).stdout.splitlines()
    for shown in block.text.splitlines()[1:]:
        expected = shown.removeprefix("# ")
        if expected == "...":
            continue
        pattern = re.escape(world.local(expected)).replace(re.escape("/.../"), "/[^ ]+/")
        assert any(re.fullmatch(pattern, line) for line in printed), (expected, printed)


def start_sh(block: Block, world: World) -> None:
    """The pod's start script starts fresh on an empty root and resumes from the newest save afterwards."""
    world.echo_command("torchrun")
    output_dir = f"{world.root}/exec/{ATTEMPT}"
    fresh = ["torchrun", "--nproc_per_node", "2", "train.py", "--output_dir", output_dir]
    fresh += ["--save_steps", "500"]
    assert world.sh(block.text).stdout.splitlines() == fresh
    world.publish(500)
    resumed = [*fresh, "--resume_from_checkpoint", f"{output_dir}/checkpoint-500"]
    assert world.sh(block.text).stdout.splitlines() == resumed


def resume_saves(block: Block, world: World) -> None:
    """``ckpt resume --saves exec/<attempt>/checkpoint`` is empty at first, then that folder's newest save."""
    shown = block.text + 'printf "%s" "$R"\n'
    assert world.sh(shown).stdout == ""
    save = world.root / "exec" / ATTEMPT / "checkpoint" / "step-500"  # a DCP save: .metadata written last
    save.mkdir(parents=True)
    (save / ".metadata").write_bytes(b"")
    world.store.publish(EPOCH, 500, str(save))
    assert world.sh(shown).stdout == str(save)


def tiered_cli(block: Block, world: World) -> None:
    """docs/tiered.md: replicate a published save, lose the fast root, resume from the restored copy."""
    durable = world.tmp / "durable"
    durable.mkdir()
    save = world.publish(500)
    shown = block.text.replace("/mnt/durable/run-42", str(durable))
    fast_save = world.store.location(save)
    original = (Path(fast_save) / "trainer_state.json").read_bytes()
    done = world.sh(shown)
    published = f"{durable}/exec/{ATTEMPT}/checkpoint-500"
    assert done.stdout.splitlines() == [published, f"resume from {fast_save}"]
    assert (Path(fast_save) / "trainer_state.json").read_bytes() == original  # restored from the copy
    assert [(e.epoch, e.step) for e in PosixStore(str(durable)).entries()] == [(EPOCH, 500)]


RUNNERS: dict[str, Callable[[Block, World], None]] = {
    "readme-cli": readme_cli,
    "readme-api": readme_api,
    "readme-resolve-hf": readme_resolve_hf,
    "readme-verified": readme_verified,
    "readme-resume": readme_resume,
    "resolve-nothing": resolve_nothing,
    "locator": locator,
    "defines": defines,
    "follow-stop": follow_stop,
    "pin-cli": pin_cli,
    "prune-dry-run": prune_dry_run,
    "start-sh": start_sh,
    "resume-saves": resume_saves,
    "tiered-cli": tiered_cli,
}

BLOCKS = all_blocks()


def by_kind(kind: str) -> list[Any]:
    return [pytest.param(block, id=block.where) for block in BLOCKS if block.kind == kind]


class TestMarkers:
    def test_every_block_runs_or_says_why_not(self) -> None:
        """Every shell and Python block of README.md and docs/ has a valid marker; every runner, a block."""
        assert problems(BLOCKS, RUNNERS) == []

    def test_the_pages_hold_blocks_of_each_kind(self) -> None:
        """The extraction finds the pages' blocks (an extractor that found none would pass everything)."""
        kinds = {block.kind for block in BLOCKS}
        assert kinds == set(KINDS)
        assert len(BLOCKS) >= 40

    def test_an_unmarked_block_fails(self) -> None:
        """A block without a marker is reported with its page and line, as is a marker one line too far."""
        page = "intro\n\n```sh\nckpt resolve\n```\n\n<!-- illustrative: far -->\n\n```python\nimport x\n```\n"
        blocks = extract("new.md", page)
        assert [(block.line, block.kind) for block in blocks] == [(3, None), (9, None)]
        assert [text.split(":")[1] for text in problems(blocks, {})] == ["3", "9"]

    def test_markers_must_name_something_that_exists(self) -> None:
        """An empty reason, an unknown kind, an unknown runner, and a runner no block uses are reported."""
        page = (
            "<!-- illustrative: -->\n```sh\nx\n```\n<!-- skip: why -->\n```bash\nx\n```\n"
            "<!-- runs: nobody -->\n```python\nx\n```\n"
            "<!-- illustrative: needs a cluster -->\n```console\nx\n```\n"
            "```toml\nnot = 'code'\n```\n"
        )
        found = problems(extract("new.md", page), {"unused": None})
        assert found == [
            "new.md:2: the illustrative marker names nothing (a runner, a file, a reason)",
            "new.md:6: unknown marker 'skip'; one of runs, excerpt, tested-by, illustrative",
            "new.md:10: no runner 'nobody' in tests/test_doc_examples.py",
            "runner 'unused' runs no block",
        ]

    def test_an_excerpt_that_drifted_from_its_file_is_found(self) -> None:
        """The excerpt check compares code lines in order, so a changed or reordered line fails it."""
        source = code_lines("def f(x):  # doc\n    return x + 1\n\ndef g():\n    pass\n")
        assert is_excerpt(code_lines("def f(x):\n    return x + 1  # page comment\n...\n"), source)
        assert not is_excerpt(code_lines("def f(x):\n    return x + 2\n"), source)
        assert not is_excerpt(code_lines("def g():\ndef f(x):\n"), source)


def is_excerpt(lines: list[str], source: list[str]) -> bool:
    """Whether ``lines`` occur in ``source`` in the same order (not necessarily next to each other)."""
    remaining = iter(source)
    return all(any(line == candidate for candidate in remaining) for line in lines)


@pytest.mark.parametrize("block", by_kind("runs"))
def test_example_runs(block: Block, tmp_path: Path) -> None:
    """The block runs on a temporary root and prints what its page says."""
    RUNNERS[block.argument](block, World(tmp_path))


@pytest.mark.parametrize("block", by_kind("excerpt"))
def test_excerpt_matches_its_file(block: Block) -> None:
    """Each code line of the block is in the quoted file, in order."""
    source = code_lines((REPO / block.argument).read_text(encoding="utf-8"))
    missing = [line for line in code_lines(block.text) if line not in source]
    assert missing == []
    assert is_excerpt(code_lines(block.text), source)


@pytest.mark.parametrize("block", by_kind("tested-by"))
def test_the_testing_module_reads_the_page(block: Block) -> None:
    """The module named as running the block exists and names the page it extracts the block from."""
    module = (REPO / block.argument).read_text(encoding="utf-8")
    assert Path(block.page).name in module
