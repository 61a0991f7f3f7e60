"""Framework rules: one pure module per training framework, and the rules configured by a site.

Each rule (``model.Rule``) says which names in a saves location are saves, what it must read of one, and
whether that save is complete; the watcher and verified resolve do the reading. The built-in rules:

==============  ============================================================  =================
name            a save is                                                     module
==============  ============================================================  =================
``hf``          folder ``checkpoint-<step>``                                  ``hf``
``dcp``         folder ``step-<step>``                                        ``dcp``
``lightning``   file or folder ``…step=<step>….ckpt``                         ``lightning``
``deepspeed``   folder ``global_step<step>``                                  ``deepspeed``
``megatron``    folder ``iter_<step>`` (7+ digits)                            ``megatron``
``nemo``        ``.ckpt`` file or folder with ``step=<step>`` in its name       ``nemo``
``orbax``       folder ``<step>`` or ``<prefix>_<step>``                      ``orbax``
``accelerate``  folder ``step-<step>`` (``Accelerator.save_state``)           ``accelerate``
==============  ============================================================  =================

Configured rules come from ``[[frameworks]]`` tables (``custom``); plugin rules from installed packages
(``ckpt.plugins``, outside the domain, since finding them reads the installed distributions). Whatever the
rule, a save that holds nothing is never complete (``presence``, checked after the rule's verdict).

Pure: standard library, attrs and the domain only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from ckpt.domain.frameworks import ZIP_TAIL_BYTES
from ckpt.domain.rules.model import HEAD_LIMIT, Item, Kind, Needs, Rule, Save, SaveView, Tail

if TYPE_CHECKING:
    from ckpt.domain.rules.custom import CustomRule, parse_custom_rules
    from ckpt.domain.rules.zipend import is_complete_zip

__all__ = [
    "BUILTIN",
    "HEAD_LIMIT",
    "TAIL_BYTES",
    "CustomRule",
    "Hint",
    "Item",
    "Kind",
    "Needs",
    "Rule",
    "Save",
    "SaveView",
    "Tail",
    "builtin_rule",
    "is_complete_zip",
    "parse_custom_rules",
    "unclaimed_save",
]

BUILTIN = ("hf", "dcp", "lightning", "deepspeed", "megatron", "nemo", "orbax", "accelerate")
TAIL_BYTES = ZIP_TAIL_BYTES

# Each rule's module is imported when its rule is first built, not with this package: a sidecar pays only
# for the rule it runs (it starts in a pod beside the trainer, and its first scan should come soon).


def __getattr__(name: str) -> Any:
    """The names of the sub-modules this package re-exports, imported on first use."""
    if name in ("CustomRule", "parse_custom_rules"):
        from ckpt.domain.rules import custom

        return getattr(custom, name)
    if name == "is_complete_zip":
        from ckpt.domain.rules import zipend

        return zipend.is_complete_zip
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def builtin_rule(name: str, *, world_size: int | None = None) -> Rule | None:
    """The built-in rule called ``name`` (the world size given to those that use it), else ``None``.

    >>> builtin_rule("deepspeed", world_size=8)
    DeepSpeedRule(world_size=8, name='deepspeed', pattern='global_step<step>')
    """
    rule: Rule | None = None
    if name == "hf":
        from ckpt.domain.rules.hf import HfRule

        rule = HfRule(world_size)
    elif name == "dcp":
        from ckpt.domain.rules.dcp import DcpRule

        rule = DcpRule(world_size)
    elif name == "lightning":
        from ckpt.domain.rules.lightning import LightningRule

        rule = LightningRule(world_size)
    elif name == "deepspeed":
        from ckpt.domain.rules.deepspeed import DeepSpeedRule

        rule = DeepSpeedRule(world_size)
    elif name == "megatron":
        from ckpt.domain.rules.megatron import MegatronRule

        rule = MegatronRule()
    elif name == "nemo":
        from ckpt.domain.rules.nemo import NemoRule

        rule = NemoRule()
    elif name == "orbax":
        from ckpt.domain.rules.orbax import OrbaxRule

        rule = OrbaxRule()
    elif name == "accelerate":
        from ckpt.domain.rules.accelerate import AccelerateRule

        rule = AccelerateRule(world_size)
    return rule


@attrs.frozen
class Hint:
    """A name that looks like a save of another rule but is no save of the chosen one."""

    name: str
    kind: Kind
    rule: str
    pattern: str

    def message(self, chosen: Rule) -> str:
        """One warning line: what was seen, and which ``--framework`` would take it."""
        return (
            f"{self.kind} {self.name!r} looks like a save but matches no {chosen.name} save name "
            f"({chosen.pattern}); --framework {self.rule} ({self.pattern}) would take it"
        )


def unclaimed_save(chosen: Rule, others: Sequence[Rule], items: Sequence[Item]) -> Hint | None:
    """The first item (by name) that ``chosen`` does not take as a save and one of ``others`` does.

    >>> dcp, hf = builtin_rule("dcp"), builtin_rule("hf")
    >>> unclaimed_save(dcp, [hf], [Item("checkpoint-5")]).rule
    'hf'
    """
    taken = {save.name for save in chosen.saves(items)}
    rest = sorted((item for item in items if item.name not in taken), key=lambda i: i.name)
    if not rest:
        return None
    for rule in others:
        if rule.name == chosen.name:
            continue
        for save in rule.saves(rest):
            return Hint(save.name, save.kind, rule.name, rule.pattern)
    return None
