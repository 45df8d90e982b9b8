"""The six files: limits enforced in code, atomic rewrites, and every version kept."""

from pathlib import Path

import pytest

from sprite_os.memory.files import CURATED, SPECS, MemoryFiles, limit_error
from sprite_os.paths import Layout


@pytest.fixture
def files(tmp_path: Path) -> MemoryFiles:
    layout = Layout(tmp_path)
    layout.ensure()
    return MemoryFiles(layout)


def test_owners_and_limits_match_the_design() -> None:
    assert {n: (s.owner, s.max_lines) for n, s in SPECS.items()} == {
        "soul.md": ("deploy", 200), "os.md": ("deploy", 200), "tools.md": ("daemon", 150),
        "files.md": ("daemon", 200), "user.md": ("daemon", 200), "context.md": ("daemon", 200)}
    assert CURATED == ("tools.md", "files.md", "user.md", "context.md")


def test_over_limit_text_is_never_written(files: MemoryFiles) -> None:
    assert limit_error("tools.md", "x\n" * 150) is None
    assert "151 lines" in (limit_error("tools.md", "x\n" * 151) or "")
    assert "bytes" in (limit_error("user.md", "x" * 30_000) or "")
    files.write("user.md", "# User\n", source="batch-1")
    with pytest.raises(ValueError, match="limit"):
        files.write("user.md", "line\n" * 201, source="batch-2")
    assert files.read("user.md") == "# User\n"


def test_history_keeps_every_version_and_rollback_restores(files: MemoryFiles) -> None:
    files.write("user.md", "v1\n", source="batch-1")
    files.path("user.md").write_text("edited by a person\n")  # an edit the daemon did not make
    files.write("user.md", "v3\n", source="batch-2")
    history = files.history("user.md")
    assert [(v.number, v.source, v.text) for v in history] == [
        (1, "batch-1", "v1\n"), (2, "on-disk", "edited by a person\n"), (3, "batch-2", "v3\n")]
    restored = files.rollback("user.md", 2)
    assert files.read("user.md") == "edited by a person\n"
    assert restored.number == 4 and restored.source == "rollback-to-2"
    with pytest.raises(KeyError):
        files.rollback("user.md", 99)


def test_missing_or_unreadable_files_read_as_empty(files: MemoryFiles) -> None:
    assert files.read("context.md") == ""
    files.path("files.md").mkdir()  # not a file at all
    assert files.read("files.md") == ""
    with pytest.raises(KeyError):
        files.read("secrets.md")


def test_writes_leave_no_temp_files(files: MemoryFiles) -> None:
    for n in range(5):
        files.write("context.md", f"# now {n}\n", source=f"batch-{n}")
    assert sorted(p.name for p in files.dir.iterdir() if p.is_file() and not p.name.startswith(".writer")) == [
        "context.md"]
