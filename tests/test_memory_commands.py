"""The operator's memory-file commands (`sprite-os memory history|show|rollback|import|rebuild`),
run as an operator would, and what each says when it is used wrongly."""

from __future__ import annotations

from pathlib import Path

import pytest

from sprite_os.commands.main import main
from sprite_os.memory.files import MemoryFiles
from sprite_os.paths import Layout


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    Layout(tmp_path).ensure()
    return tmp_path


def run(ws: Path, *args: str) -> int:
    return main(["--workspace", str(ws), "memory", *args])


def test_history_show_and_rollback_of_a_memory_file(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(ws, "history", "user.md") == 0
    assert "user.md has no saved versions yet" in capsys.readouterr().out
    files = MemoryFiles(Layout(ws))
    files.write("user.md", "# User\n- Name: Ada\n", source="curator")
    files.write("user.md", "# User\n- Name: Mallory\n", source="console")
    assert run(ws, "history", "user.md") == 0
    listed = capsys.readouterr().out.splitlines()
    assert len(listed) == 2 and "curator" in listed[0] and "console" in listed[1]
    first = files.history("user.md")[0].number
    assert run(ws, "show", "user.md") == 0
    assert capsys.readouterr().out == "# User\n- Name: Mallory\n"
    assert run(ws, "show", "user.md", str(first)) == 0
    assert capsys.readouterr().out == "# User\n- Name: Ada\n"
    assert run(ws, "rollback", "user.md", str(first)) == 0
    assert f"is now version {first}'s text" in capsys.readouterr().out
    assert files.read("user.md") == "# User\n- Name: Ada\n"


def test_a_command_used_wrongly_says_why_and_exits_2(ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    MemoryFiles(Layout(ws)).write("user.md", "# User\n", source="curator")
    cases = [
        (("show", "user.md", "999"), "has no version 999"),
        (("rollback", "user.md", "999"), "999"),
        (("history", "secrets.md"), "unknown memory file 'secrets.md'"),
        (("import", str(ws / "missing.jsonl")), "cannot read"),
        (("rebuild",), "stop the server and pass --yes"),
        (("rebuild", "--index"), "the recall index"),
    ]
    for args, said in cases:
        assert run(ws, *args) == 2, args
        assert said in capsys.readouterr().err, args
    assert main(["--workspace", str(ws / "nowhere"), "memory", "status"]) == 2
    assert "no memory at" in capsys.readouterr().err


def test_a_rebuild_after_one_cut_short_points_at_the_memory_db_from_before_both(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """It said "the previous memory.db is kept at" the half-made one the cut rebuild left, where an
    operator looking for the person's memory as it was would find what the rebuild had got to."""
    from sprite_os.memory.curation.rebuild import UNFINISHED
    from sprite_os.memory.memory_store import MemoryDB

    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    memory_db = Layout(ws).memory_db
    original = memory_db.with_name(f"{memory_db.name}.before-rebuild-20261126T120000")
    for path in (original, memory_db):
        MemoryDB(path).close()
    memory_db.with_name(UNFINISHED).write_text(original.name)
    assert run(ws, "rebuild", "--yes") == 0  # no turns: nothing for the curator
    out = capsys.readouterr().out
    assert f"the memory.db from before the rebuild that did not finish is kept at {original}" in out
    assert "the half-made one it left is kept at" in out and "the previous memory.db" not in out
