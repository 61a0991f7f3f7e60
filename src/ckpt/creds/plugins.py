"""Credential sources that other packages provide: the ``ckpt.credential_sources`` entry-point group.

A package registers a *kind* (the value of ``source`` in a ``[[credentials]]`` table) by naming a factory::

    [project.entry-points."ckpt.credential_sources"]
    team-secrets = "team_secrets.ckpt_source:make_source"

Rules:

1. The factory is called as ``factory(settings)`` with one :class:`SourceSettings` (the table's own keys,
   the name the source must carry, where the table sits in the file, the environment and the proxy rule)
   and returns a :class:`~ckpt.creds.model.Source`. It validates its own keys and raises ``ConfigError``
   with ``key=settings.key(...)`` for a wrong one; like the built-in sources it reads no file and opens no
   connection until ``fetch``, because building is also how a configuration file is validated.
2. Built-in kinds (``env``, ``file``, ``vault``, ``aws-default``) cannot be replaced by a plugin; a kind two
   installed packages register is a ``ConfigError`` naming both, never a silent pick.
3. A factory that raises anything but ``ConfigError``, or returns something that is not a ``Source``, is a
   ``ConfigError`` naming the kind and the exception's *type* only (its text may carry a secret from the
   table).
4. Entry points are read once per process, and only when a table names a kind that is not built in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs

from ckpt.creds.model import Source
from ckpt.domain.errors import CkptError, ConfigError

if TYPE_CHECKING:
    from importlib import metadata

__all__ = ["ENTRY_POINT_GROUP", "SourceSettings", "plugin_kinds", "plugin_source"]

ENTRY_POINT_GROUP = "ckpt.credential_sources"


@attrs.frozen
class SourceSettings:
    """What a plugin's factory is given to build its source from one ``[[credentials]]`` table.

    ``table`` holds the table's keys except ``source``, as TOML parsed them; ``name`` is the name the source
    must report (the kind, or ``kind (credentials[2])`` when the kind is listed twice); ``where`` is the
    table's place in the file (``credentials[2]``), for ``ConfigError`` keys (use :meth:`key`);
    ``environ`` the environment the process reads; ``proxy_for`` the proxy rule S3 uses (a source that
    calls an HTTP service should route through it), or ``None`` for direct.
    """

    kind: str
    name: str
    table: Mapping[str, object] = attrs.field(repr=False)  # may hold secrets
    where: str
    environ: Mapping[str, str] = attrs.field(repr=False)
    proxy_for: Callable[[str], str | None] | None = attrs.field(default=None, repr=False)

    def key(self, name: str) -> str:
        """The full path of the table's key ``name`` (``credentials[2].path``), for ``ConfigError``."""
        return f"{self.where}.{name}"


@functools.cache
def _registered() -> Mapping[str, tuple[metadata.EntryPoint, ...]]:
    from importlib import metadata  # only when a table names a kind that is not built in (rule 4)

    found: dict[str, list[metadata.EntryPoint]] = {}
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry_point.name, []).append(entry_point)
    return {kind: tuple(points) for kind, points in found.items()}


def plugin_kinds(builtin: tuple[str, ...]) -> tuple[str, ...]:
    """The kinds installed packages register, sorted, without those that clash with ``builtin`` (rule 2)."""
    return tuple(sorted(kind for kind in _registered() if kind not in builtin))


def _provider(entry_point: metadata.EntryPoint) -> str:
    dist = entry_point.dist
    return dist.name if dist is not None else entry_point.value


def plugin_source(settings: SourceSettings) -> Source | None:
    """Build the source a plugin registers for ``settings.kind``; ``None`` when no package registers it."""
    points = _registered().get(settings.kind, ())
    if not points:
        return None
    key = settings.key("source")
    if len(points) > 1:
        providers = ", ".join(sorted(_provider(point) for point in points))
        raise ConfigError(
            f"{key} {settings.kind!r} is registered by more than one installed package ({providers})", key=key
        )
    try:
        factory = points[0].load()
        source: object = factory(settings)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - rule 3: the plugin's text may carry a secret; keep its type
        what = "failed" if not isinstance(exc, CkptError) else "refused the table"
        failure = ConfigError(
            f"{key}: the credential plugin for {settings.kind!r} {what} ({type(exc).__name__})", key=key
        )
    else:
        if isinstance(source, Source):
            return source
        failure = ConfigError(
            f"{key}: the credential plugin for {settings.kind!r} returned a {type(source).__name__}, "
            "not a credential source",
            key=key,
        )
    raise failure  # outside the except block: no plugin exception rides along as __context__
