"""The evaluator script of docs/evaluation-and-retention.md, extracted from the page and run as a real
process: it scores each checkpoint as it is published, keeps the best k pinned, survives a restart, and
ends with exit 0 on SIGTERM; a prune afterwards keeps what it pinned."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

from ckpt.adapters.posix import PosixStore
from ckpt.domain.entries import Entry

ARGS = [sys.executable]
FAST = ["--interval", "0.05"]
PAGE = Path(__file__).parent.parent / "docs" / "evaluation-and-retention.md"
# The evaluation command: prints the number stored in the save's score.txt (a stand-in for a real eval).
EVAL = [
    sys.executable,
    "-c",
    "import sys, pathlib; print(pathlib.Path(sys.argv[1], 'score.txt').read_text())",
]


def extract_script(tmp_path: Path) -> Path:
    """Write the page's evaluator block (the python block after its marker comment) to a file."""
    text = PAGE.read_text(encoding="utf-8")
    marker = re.escape("<!-- tested-by: tests/test_docs_evaluator.py -->")
    found = re.search(rf"{marker}\s*```python\n(.*?)```", text, re.DOTALL)
    assert found, "the evaluator block is missing from the page"
    script = tmp_path / "evaluate.py"
    script.write_text(found.group(1), encoding="utf-8")
    return script


class Evaluator:
    """The evaluator as a process whose stdout lines are collected as they come."""

    def __init__(self, script: Path, root: Path, state: Path) -> None:
        self.process = subprocess.Popen(
            [
                *ARGS,
                str(script),
                "--root",
                str(root),
                "--state",
                str(state),
                "--best",
                "2",
                *FAST,
                "--",
                *EVAL,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def wait_for(self, line: str) -> None:
        with self._changed:
            self._changed.wait_for(lambda: line in self.lines or self.process.poll() is not None, 60)
        assert line in self.lines, (self.lines, self.process.poll())

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self._reader.join(5)
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.process.stdout.close()
        self.process.stderr.close()
        return code


def publish(store: PosixStore, root: Path, step: int, score: float) -> Entry:
    folder = root / "exec" / "a" / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "score.txt").write_text(str(score))
    return store.publish(1, step, str(folder))


def test_the_evaluator_keeps_the_best_two_pinned_across_a_restart(tmp_path: Path) -> None:
    """Lower scores win: the two best are pinned, the one that drops out is unpinned, state survives."""
    script = extract_script(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    store = PosixStore(str(root))
    state = tmp_path / "state.jsonl"
    publish(store, root, 100, 0.9)  # already there: the evaluator starts from the beginning of the log
    evaluator = Evaluator(script, root, state)
    evaluator.wait_for("pinned step 100")
    publish(store, root, 200, 0.5)
    evaluator.wait_for("pinned step 200")
    publish(store, root, 300, 0.7)
    evaluator.wait_for("unpinned step 100")
    assert evaluator.stop() == 0
    assert [e.step for e in store.pinned()] == [200, 300]

    restarted = Evaluator(script, root, state)
    publish(store, root, 400, 0.1)
    restarted.wait_for("unpinned step 300")
    assert restarted.stop() == 0
    assert [e.step for e in store.pinned()] == [200, 400]
    scored = [line for line in restarted.lines if line.startswith("scored")]
    assert len(scored) == 1  # steps 100-300 were scored by the first run and not again
    assert sum(1 for line in state.read_text().splitlines() if "score" in json.loads(line)) == 4

    store.prune(keep=1)
    assert [e.step for e in store.entries()] == [200, 400]
    assert (root / "exec" / "a" / "checkpoint-200" / "score.txt").is_file()
