"""Finding a rule by name (``ckpt.application.rulebook``): built in, configured, and plugins from installed
packages.

The plugin ``tests/plugins/ckpt_done_marker.py`` is installed for these tests the way pip leaves a package:
a module and a ``.dist-info`` folder with ``entry_points.txt`` on ``sys.path``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ckpt.application.rulebook import PLUGIN_GROUP, find_rule, known_rules, plugin_names
from ckpt.domain.errors import InvalidError
from ckpt.domain.rules import BUILTIN, Item, parse_custom_rules

PLUGINS = Path(__file__).parent / "plugins"
CONFIGURED = parse_custom_rules([{"name": "mytrainer", "pattern": "ckpt_{step}"}], BUILTIN)


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))


def _install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: str, module: str = "") -> None:
    """Install a throw-away distribution whose one entry point is ``entry`` (``name = module:attr``)."""
    info = tmp_path / "ckpt_bad_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ckpt-bad-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{PLUGIN_GROUP}]\n{entry}\n")
    if module:
        (tmp_path / "ckpt_bad_plugin.py").write_text(module)
    monkeypatch.delitem(sys.modules, "ckpt_bad_plugin", raising=False)  # each test brings its own
    monkeypatch.syspath_prepend(str(tmp_path))


class TestFindRule:
    def test_builtin(self) -> None:
        """A built-in name gives its rule, with the world size."""
        rule = find_rule("deepspeed", world_size=4)
        assert (rule.name, getattr(rule, "world_size", None)) == ("deepspeed", 4)

    def test_configured(self) -> None:
        """A configured name gives the table's rule."""
        assert find_rule("mytrainer", configured=CONFIGURED) is CONFIGURED[0]

    def test_unknown_lists_what_works(self, installed: None) -> None:
        """An unknown name is InvalidError listing built-in, configured and installed names."""
        with pytest.raises(InvalidError) as caught:
            find_rule("pytorch", configured=CONFIGURED)
        assert str(caught.value) == (
            "framework 'pytorch' is not one of hf, dcp, lightning, deepspeed, megatron, nemo, orbax, "
            "accelerate, mytrainer, done-marker (built in, configured, or installed)"
        )

    def test_plugin(self, installed: None) -> None:
        """An installed plugin's rule is found by its entry point's name and built with the world size."""
        rule = find_rule("done-marker", world_size=2)
        assert rule.name == "done-marker"
        assert getattr(rule, "world_size", None) == 2
        assert [s.name for s in rule.saves([Item("run-3"), Item("run-x")])] == ["run-3"]

    def test_known_rules(self, installed: None) -> None:
        """Every usable name, built-in first."""
        assert known_rules(CONFIGURED) == [*BUILTIN, "mytrainer", "done-marker"]
        assert "done-marker" in plugin_names()


class TestBrokenPlugins:
    def test_import_fails(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A plugin whose module cannot be imported is one InvalidError naming it and its distribution."""
        _install(tmp_path, monkeypatch, "bad = ckpt_bad_plugin_missing:rule")
        with pytest.raises(InvalidError, match=r"plugin rule 'bad' .*ckpt-bad-plugin 0\.1.* cannot be load"):
            find_rule("bad")

    def test_factory_raises(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A factory that raises is InvalidError, not a traceback."""
        module = "def rule(*, world_size):\n    raise RuntimeError('boom')\n"
        _install(tmp_path, monkeypatch, "bad = ckpt_bad_plugin:rule", module)
        with pytest.raises(InvalidError, match="failed to build its rule: RuntimeError: boom"):
            find_rule("bad")

    def test_not_a_rule(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """An object that is no rule and not callable is refused."""
        _install(tmp_path, monkeypatch, "bad = ckpt_bad_plugin:rule", "rule = 42\n")
        with pytest.raises(InvalidError, match="neither a rule nor a callable"):
            find_rule("bad")

    def test_factory_returns_no_rule(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A factory that returns something without the rule's members is refused, naming what is missing."""
        module = "def rule(*, world_size):\n    return object()\n"
        _install(tmp_path, monkeypatch, "bad = ckpt_bad_plugin:rule", module)
        with pytest.raises(InvalidError, match="is not a rule: it has no name, pattern, saves"):
            find_rule("bad")

    def test_wrong_name(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A rule must call itself by its entry point's name."""
        module = (
            f"import sys\nsys.path.insert(0, {str(PLUGINS)!r})\n"
            "from ckpt_done_marker import DoneMarkerRule as rule\n"
        )
        _install(tmp_path, monkeypatch, "other = ckpt_bad_plugin:rule", module)
        with pytest.raises(InvalidError, match="calls itself 'done-marker'"):
            find_rule("other")

    def test_builtin_name_never_loads_a_plugin(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A plugin registered under a built-in name is never loaded: the built-in rule wins."""
        _install(tmp_path, monkeypatch, "dcp = ckpt_bad_plugin_missing:rule")
        assert find_rule("dcp").name == "dcp"
