"""The contract every credential source (the ``ckpt.creds.Source`` port) must pass, for any test runner.

Subclass :class:`SourceContract` in a class whose name starts with ``Test`` and give it the four
factories below; pytest (or ``unittest``-style collection of ``test_*`` methods) then runs every check
against your source. The checks use plain ``assert`` and import no test framework, so the class works
wherever ``assert`` does; a factory that needs a temporary folder can take it from an autouse fixture
that stores it on ``self`` first::

    class TestMySource(SourceContract):
        @pytest.fixture(autouse=True)
        def _folder(self, tmp_path):
            self.folder = tmp_path

        def present(self):  # keys that the source will find
            return MySource(self.folder, ...), Credentials("AKID", "secret", source="mine")

        def absent(self):  # a source that finds nothing
            return MySource(self.folder / "missing")

        def broken(self):  # a source that is there but cannot answer (half a key pair...)
            return MySource(...)

        def rotate(self, source):  # change the secret behind ``source``; return the new keys
            ...

What the contract holds a source to (spec/credentials.md §1 and the ``Source`` docstring):

* ``name`` is a non-empty string, the same at every call;
* present: ``fetch()`` returns the keys, again at every call (so a rotated secret is picked up, which
  :meth:`rotate` checks), also from several threads at once; and ``repr()`` of the source and of the
  credentials shows neither the secret key nor the session token;
* absent: ``fetch()`` returns ``None``; a source that is never absent (Vault, a chain) overrides
  :meth:`test_absent_source_returns_none` with a check of what it does instead;
* broken: ``fetch()`` raises :class:`~ckpt.CredentialsError` whose ``source`` names the source (or, for a
  chain, the member that broke: override :meth:`broken_name`), and neither its message, its ``repr``,
  nor any exception chained to it shows a secret listed by :meth:`secrets`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ckpt.domain.errors import CredentialsError

if TYPE_CHECKING:
    from ckpt.creds.model import Credentials, Source

__all__ = ["SourceContract"]

_THREADS = 4


def _chained(error: BaseException) -> Iterator[BaseException]:
    """The error and every exception attached to it as cause or context."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _keys(credentials: Credentials | None) -> tuple[str, str, str | None] | None:
    if credentials is None:
        return None
    return credentials.access_key_id, credentials.secret_access_key, credentials.session_token


class SourceContract:
    """Checks every ``Source`` must pass; subclass it and implement the factories (see the module)."""

    # -- what a subclass provides ------------------------------------------------------------------------

    def present(self) -> tuple[Source, Credentials]:
        """A source that finds keys, and the keys it must return (their ``source`` field is not compared)."""
        raise NotImplementedError

    def absent(self) -> Source:
        """A source that finds nothing."""
        raise NotImplementedError

    def broken(self) -> Source:
        """A source that is there but cannot answer."""
        raise NotImplementedError

    def rotate(self, source: Source) -> Credentials:
        """Change the secret behind ``source`` (made by :meth:`present`) and return the keys it now holds."""
        raise NotImplementedError

    def secrets(self) -> tuple[str, ...]:
        """Secret texts that must never appear in a message or a ``repr``; by default the present keys'."""
        _source, expected = self.present()
        return tuple(s for s in (expected.secret_access_key, expected.session_token) if s)

    def broken_name(self, source: Source) -> str:
        """The name a broken source's error must carry: its own, unless it reports for another source."""
        return source.name

    # -- the checks ----------------------------------------------------------------------------------------

    def test_name_is_a_stable_non_empty_string(self) -> None:
        """``name`` is a non-empty string, the same at every call."""
        source, _expected = self.present()
        assert isinstance(source.name, str)
        assert source.name
        assert source.name == source.name

    def test_present_source_returns_its_keys(self) -> None:
        """A present source returns the keys it holds, and the same keys when asked again."""
        source, expected = self.present()
        first = source.fetch()
        second = source.fetch()
        assert _keys(first) == _keys(expected)
        assert _keys(second) == _keys(expected)

    def test_present_source_answers_several_threads(self) -> None:
        """Fetching from several threads at once gives every thread the same keys."""
        source, expected = self.present()
        results: list[object] = []
        lock = threading.Lock()

        def fetch() -> None:
            try:
                found: object = _keys(source.fetch())
            except Exception as exc:  # noqa: BLE001 - reported to the asserting thread below
                found = exc
            with lock:
                results.append(found)

        threads = [threading.Thread(target=fetch) for _ in range(_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [_keys(expected)] * _THREADS

    def test_a_rotated_secret_is_picked_up(self) -> None:
        """Every fetch reads the secret again: after a rotation the new keys come back."""
        source, expected = self.present()
        assert _keys(source.fetch()) == _keys(expected)
        rotated = self.rotate(source)
        assert _keys(rotated) != _keys(expected)
        assert _keys(source.fetch()) == _keys(rotated)

    def test_reprs_show_no_secret(self) -> None:
        """Neither the source's ``repr`` nor its credentials' ``repr``/``str`` shows a secret."""
        source, _expected = self.present()
        found = source.fetch()
        shown = f"{source!r} {found!r} {found!s}"
        leaked = [secret for secret in self.secrets() if secret in shown]
        assert leaked == []

    def test_absent_source_returns_none(self) -> None:
        """An absent source returns ``None`` (the chain then asks the next one)."""
        assert self.absent().fetch() is None

    def test_broken_source_raises_credentials_error_naming_it(self) -> None:
        """A broken source raises ``CredentialsError`` with ``source`` set to its name."""
        source = self.broken()
        error = _fetch_error(source)
        assert error.source == self.broken_name(source)

    def test_broken_source_error_shows_no_secret(self) -> None:
        """The error of a broken source, its ``repr`` and every exception chained to it hold no secret."""
        error = _fetch_error(self.broken())
        shown = " ".join(f"{e!s} {e!r}" for e in _chained(error))
        leaked = [secret for secret in self.secrets() if secret in shown]
        assert leaked == []


def _fetch_error(source: Source) -> CredentialsError:
    """The ``CredentialsError`` that ``source.fetch()`` raises; an ``AssertionError`` if it raises none."""
    try:
        found = source.fetch()
    except CredentialsError as error:
        return error
    raise AssertionError(f"{source.name}: fetch() returned {found!r} instead of raising CredentialsError")
