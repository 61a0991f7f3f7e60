"""The public fakes in ckpt.testing work with the real chain, as embedders would use them."""

from __future__ import annotations

import pytest

from ckpt.creds import Chain, Credentials
from ckpt.domain.errors import CredentialsError
from ckpt.domain.ports import Store, WatchStore
from ckpt.testing import InMemoryStore, StaticCredentialSource

KEYS = Credentials("AKIDSTATIC", "not-a-real-secret-value", source="static")


class TestInMemoryStore:
    def test_satisfies_the_ports(self) -> None:
        """InMemoryStore is a Store and a WatchStore structurally."""
        store = InMemoryStore()
        assert isinstance(store, Store)
        assert isinstance(store, WatchStore)

    def test_instances_do_not_share_state(self) -> None:
        """Two fakes are independent: publishing in one is invisible in the other."""
        a, b = InMemoryStore("a"), InMemoryStore("b")
        save = a.exec_dir("x") + "/ck-1"
        a.make_dir(save)
        a.publish(1, 1, save)
        assert len(a.entries()) == 1
        assert b.entries() == []


class TestStaticCredentialSource:
    def test_absent_passes_to_the_next_source(self) -> None:
        """An absent static source lets the chain ask the next one."""
        absent = StaticCredentialSource(None, name="first")
        present = StaticCredentialSource(KEYS, name="second")
        assert Chain([absent, present]).fetch().access_key_id == "AKIDSTATIC"
        assert (absent.calls, present.calls) == (1, 1)

    def test_broken_stops_the_chain_naming_it(self) -> None:
        """A broken static source is an error naming it; later sources are not asked."""
        broken = StaticCredentialSource(None, name="vaultish", broken=True)
        later = StaticCredentialSource(KEYS, name="later")
        with pytest.raises(CredentialsError, match="vaultish"):
            Chain([broken, later]).fetch()
        assert later.calls == 0

    def test_repr_shows_no_secret(self) -> None:
        """Neither the source nor the keys show the secret in repr."""
        source = StaticCredentialSource(KEYS)
        assert "not-a-real-secret-value" not in repr(source)
        assert "not-a-real-secret-value" not in repr(source.fetch())
