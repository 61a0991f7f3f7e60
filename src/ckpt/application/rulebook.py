"""Finding a framework rule by name: built in, configured (``[[frameworks]]``), or from an installed plugin.

Rules:

1. A name is looked up in this order, the first match wins: the built-in rules (``hf``, ``dcp``,
   ``lightning``, ``deepspeed``, ``megatron``, ``nemo``, ``orbax``, ``accelerate``), the configuration file's
   ``[[frameworks]]`` tables, then the entry points of the group ``ckpt.frameworks`` of the installed
   distributions. A configured name can never shadow a built-in one (the configuration refuses it); a
   plugin with a built-in or configured name is never loaded.
2. A plugin's entry point names either a rule instance (it has ``name``, ``pattern``, ``saves``,
   ``needs``, ``judge`` and ``settle_time``) or a class or function returning one, called with the
   keyword argument ``world_size`` (an int, or ``None`` when unknown). The rule's ``name`` must be the entry
   point's name. A plugin that fails to import, to build, or breaks these rules is ``InvalidError`` naming
   the plugin and its distribution, never a traceback.
   A rule MAY also have ``longest_name``, its save name at the largest step (``ckpt.domain.room``, checked
   at start-up by every entry point); without it the rule is held to the one-byte name ``x``.
3. An unknown name is ``InvalidError`` listing every name that would have worked.
4. Plugins are looked up only when a name is neither built in nor configured, so the common commands never
   scan the installed distributions.
5. A rule object and a world size (:func:`as_rule`, the API's one way in: ``resolve_verified``, the
   watcher, catch-up, ``resume_location``): a rule built without a world size (``world_size`` is ``None``)
   gets it, one built with the same keeps it, one built with another is ``InvalidError`` naming both; a
   rule that has no ``world_size`` does not use one (as with :func:`find_rule`). So
   ``resolve_verified(store, find_rule("hf"), world_size=2)`` judges exactly as
   ``find_rule("hf", world_size=2)`` does.
6. A rule and an execution folder's recorded world size (:func:`with_recorded_world_size`: catch-up of a
   target, verified resolve of an entry, ``ckpt.application.world_size_record``): the record is how many
   processes wrote the saves there, so a rule without a world size judges that folder's saves with it; an
   explicit world size (``--world-size``, ``world_size=``, a rule built with one) and the record must agree:
   a conflict is ``InvalidError`` naming the folder, the record and both sizes (neither silently wins: a
   wrong explicit size would accept torn saves or reject every whole one); no record leaves the rule as is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import attrs

from ckpt.domain.errors import InvalidError, InvalidTypeError
from ckpt.domain.frameworks import Framework
from ckpt.domain.rules import BUILTIN, Rule, builtin_rule

if TYPE_CHECKING:
    from importlib import metadata

    from ckpt.domain.rules.custom import CustomRule

__all__ = [
    "PLUGIN_GROUP",
    "as_rule",
    "find_rule",
    "known_rules",
    "plugin_names",
    "with_recorded_world_size",
    "with_world_size",
]

PLUGIN_GROUP = "ckpt.frameworks"
_RULE_MEMBERS = ("name", "pattern", "saves", "needs", "judge", "settle_time")


def _plugins() -> metadata.EntryPoints:
    from importlib import metadata  # only when a plugin is looked for (rule 4): it costs a startup

    return metadata.entry_points(group=PLUGIN_GROUP)


def plugin_names() -> list[str]:
    """The names the installed plugins register, sorted."""
    return sorted({ep.name for ep in _plugins()})


def known_rules(configured: Sequence[CustomRule] = ()) -> list[str]:
    """Every name ``--framework`` takes here: built-in, configured, then installed plugins."""
    names = [*BUILTIN, *(rule.name for rule in configured)]
    return names + [n for n in plugin_names() if n not in names]


def _distribution(ep: metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"


def _load_plugin(ep: metadata.EntryPoint, world_size: int | None) -> Rule:
    where = f"plugin rule {ep.name!r} ({ep.value}, from {_distribution(ep)})"
    try:
        target = ep.load()
    except Exception as exc:  # noqa: BLE001 - any import failure of foreign code becomes one clear message
        raise InvalidError(f"{where} cannot be loaded: {type(exc).__name__}: {exc}") from None
    rule = target
    if isinstance(target, type) or not all(hasattr(target, m) for m in _RULE_MEMBERS):
        if not callable(target):
            raise InvalidError(f"{where} is neither a rule nor a callable returning one")
        try:
            rule = target(world_size=world_size)
        except Exception as exc:  # noqa: BLE001 - foreign code again
            raise InvalidError(f"{where} failed to build its rule: {type(exc).__name__}: {exc}") from None
    missing = [m for m in _RULE_MEMBERS if not hasattr(rule, m)]
    if missing:
        raise InvalidError(f"{where} is not a rule: it has no {', '.join(missing)}")
    if rule.name != ep.name:
        raise InvalidError(f"{where} calls itself {rule.name!r}: a plugin rule takes its entry point's name")
    checked: Rule = rule
    return checked


def find_rule(name: str, *, world_size: int | None = None, configured: Sequence[CustomRule] = ()) -> Rule:
    """Return the rule called ``name`` (rules 1-4); ``world_size`` goes to the rules that use it."""
    rule = builtin_rule(name, world_size=world_size)
    if rule is not None:
        return rule
    for custom in configured:
        if custom.name == name:
            return custom
    for ep in _plugins():
        if ep.name == name:
            return _load_plugin(ep, world_size)
    names = ", ".join(known_rules(configured))
    raise InvalidError(f"framework {name!r} is not one of {names} (built in, configured, or installed)")


def as_rule(framework: Framework | Rule, world_size: int | None = None) -> Rule:
    """The rule for ``framework``: a :class:`Framework` (its built-in rule, with the world size) or a rule,
    given the world size as rule 5 says.

    Anything else (a name, ``None``) is ``InvalidTypeError``: a name goes through :func:`find_rule`.
    """
    if isinstance(framework, Framework):
        rule = builtin_rule(framework.value, world_size=world_size)
        assert rule is not None  # every Framework has a built-in rule
        return rule
    if isinstance(framework, str) or not all(hasattr(framework, m) for m in _RULE_MEMBERS):
        raise InvalidTypeError(
            f"framework must be a Framework or a rule, got {type(framework).__name__} {framework!r}"
        )
    return with_world_size(framework, world_size)


def with_world_size(rule: Rule, world_size: int | None) -> Rule:
    """``rule`` judging saves written by ``world_size`` processes (rule 5)."""
    if world_size is None or not hasattr(rule, "world_size"):
        return rule
    has = rule.world_size
    if has == world_size:
        return rule
    if has is not None:
        raise InvalidError(
            f"the {rule.name} rule was built for a world size of {has}, and a world size of {world_size} was "
            "given too: give one"
        )
    if not attrs.has(type(rule)):
        raise InvalidError(
            f"the {rule.name} rule has a world size but cannot be given one (not an attrs class): build it "
            f"with world_size={world_size}"
        )
    built: Rule = attrs.evolve(cast("Any", rule), world_size=world_size)
    return built


def with_recorded_world_size(rule: Rule, recorded: int | None, folder: str) -> Rule:
    """``rule`` judging the saves of the execution folder ``folder``, which records ``recorded`` (rule 6)."""
    if recorded is None or not hasattr(rule, "world_size"):
        return rule
    has = rule.world_size
    if has is not None and has != recorded:
        raise InvalidError(
            f"{folder} records a world size of {recorded} (.ckpt-world-size: the processes that wrote its "
            f"saves), and a world size of {has} was given: give none to use the record, or the recorded one"
        )
    return with_world_size(rule, recorded)
