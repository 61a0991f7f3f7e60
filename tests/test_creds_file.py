"""The ``file`` credential source and the secret-file policy (spec/credentials.md): re-read at every fetch,
Kubernetes
``..data`` symlink swaps, refusal of writable or non-regular files, warning on readable ones, one newline."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ckpt.creds import Credentials, FileSource
from ckpt.creds.files import read_secret_file
from ckpt.domain.errors import CredentialsError

KEY_ID = "AKIDFILE0001"
SECRET = "file-SECRET-KEY-c0ffee-4242"
TOKEN = "file-SESSION-TOKEN-c0ffee-4242"


def write(path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    """Write a secret file and set its mode exactly (whatever the umask)."""
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    path.chmod(mode)
    return path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    folder = tmp_path / "s3"
    folder.mkdir()
    return folder


def kubernetes_volume(root: Path, generation: str, values: dict[str, str]) -> None:
    """Lay out a secret as the kubelet does: ``..<gen>/`` files, ``..data`` -> it, key -> ``..data/key``."""
    target = root / f"..{generation}"
    target.mkdir()
    for name, value in values.items():
        write(target / name, value, 0o400)
    staged = root / "..data_tmp"
    staged.symlink_to(target.name)
    os.replace(staged, root / "..data")  # the atomic swap
    for name in values:
        link = root / name
        if not link.is_symlink():
            link.symlink_to(f"..data/{name}")


class TestFileSource:
    def test_reads_the_pair_and_the_token_stripping_one_newline(self, folder: Path) -> None:
        """Each file holds one field; the single trailing newline editors add is removed."""
        write(folder / "access_key_id", KEY_ID + "\n")
        write(folder / "secret_access_key", SECRET)
        write(folder / "session_token", TOKEN + "\n")
        assert FileSource(folder).fetch() == Credentials(KEY_ID, SECRET, TOKEN, source="file")

    def test_the_session_token_is_optional(self, folder: Path) -> None:
        """Without a session_token file the credentials have none."""
        write(folder / "access_key_id", KEY_ID)
        write(folder / "secret_access_key", SECRET)
        found = FileSource(folder).fetch()
        assert found is not None
        assert found.session_token is None

    def test_a_missing_folder_is_absent(self, tmp_path: Path) -> None:
        """No folder: absent, so the chain moves on."""
        assert FileSource(tmp_path / "nowhere").fetch() is None

    def test_a_folder_without_key_files_is_absent(self, folder: Path) -> None:
        """A folder without either key file: absent."""
        write(folder / "unrelated", "x")
        assert FileSource(folder).fetch() is None

    def test_a_folder_that_is_a_file_is_broken(self, tmp_path: Path) -> None:
        """``dir`` naming a regular file is a configuration mistake, reported."""
        with pytest.raises(CredentialsError, match="not a folder"):
            FileSource(write(tmp_path / "s3", "x")).fetch()

    @pytest.mark.parametrize(
        ("present", "missing"),
        [("access_key_id", "secret_access_key"), ("secret_access_key", "access_key_id")],
    )
    def test_half_a_key_pair_is_broken(self, folder: Path, present: str, missing: str) -> None:
        """One key file without the other is an error naming the missing file."""
        write(folder / present, SECRET)
        with pytest.raises(CredentialsError) as info:
            FileSource(folder).fetch()
        assert info.value.source == "file"
        assert missing in str(info.value)
        assert SECRET not in str(info.value)

    def test_a_session_token_alone_is_broken(self, folder: Path) -> None:
        """A token without keys is a broken secret, not an absent one."""
        write(folder / "session_token", TOKEN)
        with pytest.raises(CredentialsError, match="session_token"):
            FileSource(folder).fetch()

    def test_files_are_read_again_at_every_fetch(self, folder: Path) -> None:
        """A rewritten file is seen by the next fetch of the same source."""
        source = FileSource(folder)
        write(folder / "access_key_id", "AKIDOLD")
        write(folder / "secret_access_key", SECRET)
        assert source.fetch() == Credentials("AKIDOLD", SECRET, source="file")
        write(folder / "access_key_id", "AKIDNEW")
        assert source.fetch() == Credentials("AKIDNEW", SECRET, source="file")

    def test_a_kubernetes_symlink_swap_is_picked_up(self, folder: Path) -> None:
        """Through the ``..data`` link, an atomic swap to a new generation gives the new keys."""
        kubernetes_volume(folder, "2026_01", {"access_key_id": "AKIDGEN1", "secret_access_key": SECRET})
        source = FileSource(folder)
        first = source.fetch()
        kubernetes_volume(folder, "2026_02", {"access_key_id": "AKIDGEN2", "secret_access_key": SECRET + "2"})
        second = source.fetch()
        assert first is not None
        assert second is not None
        assert (first.access_key_id, second.access_key_id) == ("AKIDGEN1", "AKIDGEN2")
        assert second.secret_access_key == SECRET + "2"


class TestPermissionPolicy:
    @pytest.mark.parametrize("mode", [0o620, 0o602, 0o666, 0o660], ids=oct)
    def test_group_or_world_writable_files_are_refused(self, folder: Path, mode: int) -> None:
        """Someone else could plant keys in a writable file: refused, naming file and mode, not content."""
        write(folder / "access_key_id", KEY_ID, mode)
        write(folder / "secret_access_key", SECRET)
        with pytest.raises(CredentialsError) as info:
            FileSource(folder).fetch()
        message = str(info.value)
        assert "writable" in message
        assert f"{mode:04o}" in message
        assert str(folder / "access_key_id") in message
        assert KEY_ID not in message

    def test_a_link_to_a_writable_file_is_refused(self, folder: Path, tmp_path: Path) -> None:
        """The check applies to the file after resolving links (a link's own mode is always 0777)."""
        target = write(tmp_path / "real-secret", SECRET, 0o622)
        write(folder / "access_key_id", KEY_ID)
        (folder / "secret_access_key").symlink_to(target)
        with pytest.raises(CredentialsError, match="writable"):
            FileSource(folder).fetch()

    def test_a_link_to_a_private_file_is_accepted(self, folder: Path, tmp_path: Path) -> None:
        """A 0600 target behind a 0777 link is fine."""
        target = write(tmp_path / "real-secret", SECRET, 0o600)
        write(folder / "access_key_id", KEY_ID)
        (folder / "secret_access_key").symlink_to(target)
        found = FileSource(folder).fetch()
        assert found is not None
        assert found.secret_access_key == SECRET

    def test_readable_files_are_warned_about_once(
        self, folder: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A 0644 file (the Kubernetes default) is used with one warning per file, not one per fetch."""
        write(folder / "access_key_id", KEY_ID, 0o644)
        write(folder / "secret_access_key", SECRET, 0o640)
        source = FileSource(folder)
        with caplog.at_level(logging.WARNING, logger="ckpt"):
            assert source.fetch() is not None
            assert source.fetch() is not None
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 2, [r.getMessage() for r in warnings]
        assert {"0644", "0640"} <= {w.getMessage().split("mode ")[1][:4] for w in warnings}
        assert all(SECRET not in r.getMessage() and KEY_ID not in r.getMessage() for r in caplog.records)

    def test_readable_files_are_refused_when_configured(self, folder: Path) -> None:
        """``readable_by_others = "refuse"`` turns the warning into a refusal."""
        write(folder / "access_key_id", KEY_ID, 0o604)
        write(folder / "secret_access_key", SECRET)
        with pytest.raises(CredentialsError, match="readable"):
            FileSource(folder, readable_by_others="refuse").fetch()

    def test_private_files_raise_no_warning(self, folder: Path, caplog: pytest.LogCaptureFixture) -> None:
        """0400 and 0600 files are read silently."""
        write(folder / "access_key_id", KEY_ID, 0o400)
        write(folder / "secret_access_key", SECRET, 0o600)
        with caplog.at_level(logging.DEBUG, logger="ckpt"):
            FileSource(folder).fetch()
        assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []

    def test_a_directory_in_place_of_a_file_is_refused(self, folder: Path) -> None:
        """Only regular files hold secrets."""
        (folder / "access_key_id").mkdir()
        write(folder / "secret_access_key", SECRET)
        with pytest.raises(CredentialsError, match="not a regular file"):
            FileSource(folder).fetch()

    def test_a_fifo_is_refused_without_blocking(self, folder: Path) -> None:
        """A FIFO would block a plain open; it is opened non-blocking and refused."""
        os.mkfifo(folder / "access_key_id", 0o600)
        write(folder / "secret_access_key", SECRET)
        with pytest.raises(CredentialsError, match="not a regular file"):
            FileSource(folder).fetch()

    def test_a_dangling_link_counts_as_missing(self, folder: Path) -> None:
        """A link to nothing is a missing file, so the pair is half present: broken."""
        write(folder / "access_key_id", KEY_ID)
        (folder / "secret_access_key").symlink_to(folder / "gone")
        with pytest.raises(CredentialsError, match="secret_access_key is missing"):
            FileSource(folder).fetch()

    def test_a_link_loop_is_refused(self, folder: Path) -> None:
        """A symbolic-link loop is reported as such."""
        (folder / "access_key_id").symlink_to(folder / "loop-b")
        (folder / "loop-b").symlink_to(folder / "access_key_id")
        with pytest.raises(CredentialsError, match="symbolic links"):
            FileSource(folder).fetch()


class TestContent:
    @pytest.mark.parametrize(
        ("content", "why"),
        [
            (SECRET + "\n\n", "more than one trailing newline"),
            (SECRET + "\r\n", "control character"),
            (" " + SECRET, "whitespace"),
            ("", "empty"),
            ("\n", "empty"),
            (b"\xff\xfe" + SECRET.encode(), "UTF-8"),
        ],
    )
    def test_malformed_content_is_refused_without_echo(
        self, tmp_path: Path, content: str | bytes, why: str
    ) -> None:
        """Only one trailing newline is stripped; anything else odd is refused, never printed."""
        path = write(tmp_path / "secret_access_key", content)
        with pytest.raises(CredentialsError, match=why) as info:
            read_secret_file(path, source="file")
        assert SECRET not in str(info.value)

    def test_an_oversized_file_is_refused(self, tmp_path: Path) -> None:
        """A secret is small; a huge file is not one."""
        path = write(tmp_path / "secret_access_key", "A" * (65 * 1024))
        with pytest.raises(CredentialsError, match="larger than"):
            read_secret_file(path, source="file")

    def test_a_missing_file_is_none(self, tmp_path: Path) -> None:
        """The reader reports absence as None; the caller decides what that means."""
        assert read_secret_file(tmp_path / "nope", source="file") is None

    def test_the_allow_policy_reads_readable_files_silently(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The Kubernetes JWT (0644 by design) is read without a warning."""
        path = write(tmp_path / "token", "eyJhbGciOi.JWT.sig\n", 0o644)
        with caplog.at_level(logging.DEBUG, logger="ckpt"):
            assert read_secret_file(path, source="vault", readable_by_others="allow") == "eyJhbGciOi.JWT.sig"
        assert caplog.records == []
