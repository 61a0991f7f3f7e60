"""The ordered credential chain (spec/credentials.md): the first source that *has* credentials wins.

Rules, in order, for each source:

1. it returns credentials: they win; later sources are not asked;
2. it returns ``None`` (absent): ask the next source;
3. it raises ``CredentialsError`` (present but broken): stop and raise it — never fall through silently,
   because a fall-through would sign with keys nobody meant to use;
4. it raises anything else: that is a bug or an untranslated library error; it is reported as a broken
   source with the exception's *type* only (its text may carry a secret).

When every source is absent the error lists the names of the sources tried, and nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs

from ckpt.creds.model import Credentials, Source
from ckpt.domain.errors import CkptError, CredentialsError

__all__ = ["Chain"]

_log = logging.getLogger(__name__)


def _as_tuple(sources: Sequence[Source]) -> tuple[Source, ...]:
    return tuple(sources)


@attrs.frozen
class Chain:
    """Credential sources, asked in order. Satisfies :class:`~ckpt.creds.model.Source` itself."""

    sources: tuple[Source, ...] = attrs.field(converter=_as_tuple)
    name: str = attrs.field(default="chain", kw_only=True)

    @property
    def names(self) -> tuple[str, ...]:
        """The sources' names, in order."""
        return tuple(source.name for source in self.sources)

    def fetch(self) -> Credentials:
        """Return the first source's credentials; raise ``CredentialsError`` as the module rules say."""
        for source in self.sources:
            failure: CredentialsError | None = None
            try:
                found = source.fetch()
            except CredentialsError as exc:
                if exc.source is not None:
                    raise
                failure = CredentialsError(str(exc), source=source.name)
            except CkptError:
                raise
            except Exception as exc:  # noqa: BLE001 - the firewall of rule 4: report the type, drop the text
                failure = CredentialsError(
                    f"credential source {source.name!r} failed unexpectedly ({type(exc).__name__})",
                    source=source.name,
                )
            if failure is not None:
                # Raised outside the except block so no library exception rides along as __context__.
                raise failure
            if found is None:
                _log.debug("credential source %s: absent", source.name)
                continue
            if found.source != source.name:
                found = attrs.evolve(found, source=source.name)
            _log.debug("credential source %s: found access key id %s", source.name, found.access_key_id)
            return found
        if not self.sources:
            raise CredentialsError("no credential sources are configured")
        raise CredentialsError(f"no credentials found; sources tried: {', '.join(self.names)}")
