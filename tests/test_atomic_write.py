"""atomic_write and the import inbox: what they acknowledge survives a power loss. A folder they
make has its name synced into its parent; a folder fsync that fails after the rename says the
write happened but is not confirmed (NotDurable), not that nothing was written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devkit.faults import FsyncSpy
from sprite_os.fsutil import NotDurable, atomic_write
from sprite_os.memory import import_inbox
from sprite_os.memory.transcript_store import ImportedTurn
from sprite_os.paths import Layout


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> FsyncSpy:
    watched = FsyncSpy()
    monkeypatch.setattr(os, "fsync", watched)
    return watched


def test_the_folders_atomic_write_makes_are_synced_into_their_parents(tmp_path: Path, spy: FsyncSpy) -> None:
    """Only the file's own folder was synced: a power loss could lose a new `.history/<name>/` and
    every version acknowledged in it."""
    target = tmp_path / "a" / "b" / "file.md"
    atomic_write(target, b"text")
    assert target.read_bytes() == b"text"
    assert {tmp_path, tmp_path / "a", tmp_path / "a" / "b"} <= set(spy.synced)
    spy.synced.clear()
    atomic_write(target, b"again")  # folders already there: only the file and its folder
    assert [p for p in spy.synced if p.is_dir()] == [tmp_path / "a" / "b"]


def test_a_failed_folder_fsync_after_the_rename_is_written_but_not_confirmed(tmp_path: Path, spy: FsyncSpy) -> None:
    target = tmp_path / "file.md"
    atomic_write(target, b"old")
    spy.failing.add(tmp_path)
    with pytest.raises(NotDurable, match="was written, but the disk did not confirm"):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"new"  # what readers see now: not "nothing was written"
    assert [p.name for p in tmp_path.iterdir()] == ["file.md"]  # no temp file left


def test_a_new_folder_whose_parent_fsync_fails_is_taken_back(tmp_path: Path, spy: FsyncSpy) -> None:
    spy.failing.add(tmp_path)
    with pytest.raises(OSError) as raised:
        atomic_write(tmp_path / "new" / "file.md", b"x")
    assert not isinstance(raised.value, NotDurable)  # nothing was written
    assert list(tmp_path.iterdir()) == []


def test_an_inbox_file_is_synced_into_its_folder_and_the_folder_into_state(tmp_path: Path, spy: FsyncSpy) -> None:
    """The inbox file was renamed into place with no folder fsync, and the new inbox folder's name
    was never synced: `memory import` said the turns wait in the inbox, and a power loss could leave
    only the `.partial`."""
    layout = Layout(tmp_path)
    layout.state_dir.mkdir(parents=True)
    path, n = import_inbox.write(layout, [ImportedTurn("s", 1.0, "hello", "[]", "hi")])
    assert n == 1 and path.exists()
    folder = import_inbox.inbox_dir(layout)
    assert layout.state_dir in spy.synced  # the new inbox folder's name
    assert spy.synced[-1] == folder  # after the rename: the file's name


def test_an_inbox_file_whose_folder_fsync_fails_is_still_queued(tmp_path: Path, spy: FsyncSpy) -> None:
    layout = Layout(tmp_path)
    import_inbox.inbox_dir(layout).mkdir(parents=True)
    spy.failing.add(import_inbox.inbox_dir(layout))
    path, _ = import_inbox.write(layout, [ImportedTurn("s", 1.0, "hello", "[]", "hi")])
    assert import_inbox.inbox_files(layout) == [path]  # written: the writer applies it


def test_a_tagged_write_names_its_temp_file_as_temp_name_reads_it_and_touches_it_before_the_rename(
        tmp_path: Path) -> None:
    """A writer that tells its own leftovers by name (the forget pass's rewrite of a backup) gives a tag and a
    last touch of the temp file (its times), where it used to copy the whole write for those two."""
    from sprite_os.fsutil import temp_for, temp_name

    target = tmp_path / "user.md"
    target.write_text("old")
    seen: list[str] = []

    def touch(tmp: str) -> None:
        seen.append(Path(tmp).name)
        os.utime(tmp, (1_000_000_000, 1_000_000_000))

    atomic_write(target, b"new", tag="forget-", before_rename=touch)
    assert target.read_bytes() == b"new" and target.stat().st_mtime == 1_000_000_000
    assert len(seen) == 1 and (match := temp_name("forget-").match(seen[0])) and match["name"] == "user.md"
    assert temp_for(seen[0]) is None  # an untagged writer's sweep leaves it alone
    assert [p.name for p in tmp_path.iterdir()] == ["user.md"]
