"""The example credential plugin (tests/plugins/ckpt_example_source) passes the public Source contract.

What a third-party source owes ckpt is checked by ``ckpt.testing.source_contract.SourceContract``; the
plugin is built through its installed entry point, as a configuration file would build it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt.creds import Credentials, Source, chain_from_config
from ckpt.testing.source_contract import SourceContract

KEY_ID, SECRET = "AKIDPLUGIN", "plugin-secret-never-shown"


class TestExamplePluginSource(SourceContract):
    @pytest.fixture(autouse=True)
    def _folder(self, tmp_path: Path) -> None:
        self.folder = tmp_path

    def _source(self, name: str, **keys: object) -> Source:
        chain = chain_from_config([{"source": "json-document", "path": str(self.folder / name), **keys}])
        return chain.sources[0]

    def present(self) -> tuple[Source, Credentials]:
        (self.folder / "s3.json").write_text(json.dumps({"key_id": KEY_ID, "secret": SECRET}))
        return self._source("s3.json"), Credentials(KEY_ID, SECRET, source="json-document")

    def absent(self) -> Source:
        return self._source("missing.json")

    def broken(self) -> Source:
        (self.folder / "half.json").write_text(json.dumps({"key_id": KEY_ID, "secret": ""}))
        return self._source("half.json")

    def rotate(self, source: Source) -> Credentials:
        (self.folder / "s3.json").write_text(
            json.dumps({"key_id": "AKIDROTATED", "secret": "rotated-secret"})
        )
        return Credentials("AKIDROTATED", "rotated-secret", source="json-document")

    def secrets(self) -> tuple[str, ...]:
        return (SECRET, "rotated-secret")
