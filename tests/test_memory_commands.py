"""The operator's memory-file commands (`sprite-os memory history|show|rollback|import|rebuild`),
run as an operator would, and what each says when it is used wrongly."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path

import pytest

from sprite_os.commands.main import main
from sprite_os.commands.memory import REBUILD_ANYWAY
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


def test_a_rollback_takes_the_writer_lock_and_is_refused_while_a_server_holds_it(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`memory rollback` wrote the file without the workspace's writer lock: a server starting meanwhile
    (its start sweeps the memory folder's temp files, holding the lock) could remove its temp file mid-write.
    It now writes holding the lock (a start waits for it), and while a server holds it, it is refused, the
    file and its history as they were."""
    from sprite_os.fsutil import WriterLock

    layout = Layout(ws)
    files = MemoryFiles(layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="curator")
    files.write("user.md", "# User\n- Name: Mallory\n", source="console")
    first = files.history("user.md")[0].number
    def refused_while_held_by(role: str) -> str:
        with WriterLock(layout.memory_lock, role):
            assert run(ws, "rollback", "user.md", str(first)) == 2
        return capsys.readouterr().err

    err = refused_while_held_by(WriterLock.SERVER)
    assert err.startswith("sprite-os: error: ") and "held by the server (pid " in err and "stop the server" in err, err
    assert "once that command has finished" not in err
    assert files.read("user.md") == "# User\n- Name: Mallory\n" and len(files.history("user.md")) == 2

    # Held by a memory command (an import, a rebuild): it lets go when done, and the server is not the matter.
    err = refused_while_held_by(WriterLock.REBUILD)
    assert "held by `sprite-os memory rebuild` (pid " in err and err.rstrip().endswith(
        ": run the rollback again once that command has finished"), err
    assert "server" not in err.split("held by")[1], err

    held_meanwhile: list[str | None] = []
    rollback = MemoryFiles.rollback

    def looked(self: MemoryFiles, name: str, number: int) -> object:
        holder = WriterLock(layout.memory_lock, WriterLock.SERVER).holder()
        held_meanwhile.append(holder.role if holder else None)
        return rollback(self, name, number)

    monkeypatch.setattr(MemoryFiles, "rollback", looked)
    assert run(ws, "rollback", "user.md", str(first)) == 0
    assert held_meanwhile == ["memory rollback"] and files.read("user.md") == "# User\n- Name: Ada\n"
    assert WriterLock(layout.memory_lock, WriterLock.SERVER).nobody_holds()  # let go


def test_a_memory_command_that_cannot_open_the_writer_lock_says_so_in_one_line(
        ws: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A lock file the user cannot open (another user's, a read-only disk; here a folder in its place, which
    root cannot open either) made `memory rollback` fail with an OSError traceback. Each command that
    takes the lock says so in one line, exit 1."""
    layout = Layout(ws)
    files = MemoryFiles(layout)
    files.write("user.md", "# User\n- Name: Ada\n", source="curator")
    files.write("user.md", "# User\n- Name: Mallory\n", source="console")
    first = files.history("user.md")[0].number
    Path(layout.memory_lock).mkdir()
    source = tmp_path / "past.jsonl"
    source.write_text('{"session": "s1", "timestamp": "2026-01-02T03:04:05Z", "user": "hi", "assistant": "hello"}\n')
    for args in (("rollback", "user.md", str(first)), ("rebuild", "--yes", "--index"), ("import", str(source))):
        assert run(ws, *args) == 1, args
        err = capsys.readouterr().err
        assert err == f"sprite-os: error: cannot open the workspace's writer lock {layout.memory_lock}: Is a directory\n", (
            args, err)
    assert files.read("user.md") == "# User\n- Name: Mallory\n"


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


def test_a_reader_that_goes_away_is_no_error(ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sprite-os memory status | head -3`: the reader leaves before the command has printed all. The
    command ends with its own status, and no BrokenPipeError traceback (it was exit 1, mid-report)."""
    read, write = os.pipe()
    os.close(read)
    with open(write, "w", encoding="utf-8") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        assert run(ws, "status") == 0
        assert run(ws, "history", "user.md") == 0
        assert sys.stdout is closed  # put back
        closed.write("nothing to read it\n")
        closed.flush()  # went to /dev/null: the pipe's end is no longer this stream's


def test_a_database_that_cannot_be_read_is_one_line_not_a_traceback(ws: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """memory status, search and recall on a database they can't open (here a file that is not one;
    a disk gone read-only fails the same way) said it with a traceback."""
    layout = Layout(ws)
    layout.memory_db.write_bytes(b"not a database, " * 100)
    for args in (("status",), ("search", "Dana"), ("recall", "Where do I live?")):
        assert run(ws, *args) == 1, args
        err = capsys.readouterr().err.splitlines()  # a search says first that it has no recall index
        assert err[-1].startswith(f"sprite-os: error: cannot read the memory databases in {layout.memory_dir}: "), err
        assert not any("Traceback" in line for line in err), err


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


def test_a_rebuild_reads_the_copy_an_unfinished_one_set_aside_and_removes_nothing_beside_it(
        ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rebuild read that copy read-only, which makes a -wal and a -shm beside a database in WAL
    mode, then removed them: an operator's sqlite3 reading the copy at that moment lost its files.
    Read as immutable, nothing is made beside the copy, and nothing there is removed."""
    from sprite_os.memory.curation.rebuild import UNFINISHED, read_before
    from sprite_os.memory.memory_store import MemoryDB, NewLearning

    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    memory_db = Layout(ws).memory_db
    original = memory_db.with_name(f"{memory_db.name}.before-rebuild-20261126T120000")
    before = MemoryDB(original)
    before.commit_batch(trigger="auto", observation_ids=[1, 2], model="m", input_tokens=0, output_tokens=0,
                        cost_usd=0, learnings=[NewLearning("PREFERENCE", "Ada likes tea in the morning.")],
                        file_updates={}, base_hashes={})
    before.conn.execute("UPDATE learnings SET forgotten_at = 5")
    before.close()
    MemoryDB(memory_db).close()
    beside = [Path(f"{original}{suffix}") for suffix in ("-wal", "-shm")]
    assert not any(p.exists() for p in beside)
    groups, forgotten, _ = read_before(memory_db, original)
    assert groups == [[1, 2]] and list(forgotten.values()) == [5.0]
    assert not any(p.exists() for p in beside), "a read of the copy left files beside it"

    memory_db.with_name(UNFINISHED).write_text(original.name)
    reader = sqlite3.connect(original)  # an operator looking at the person's memory as it was
    try:
        assert reader.execute("SELECT count(*) FROM learnings").fetchone() == (1,)
        assert all(p.exists() for p in beside)
        assert run(ws, "rebuild", "--yes") == 0
        assert all(p.exists() for p in beside), "the rebuild removed the files of another's read"
        assert reader.execute("SELECT count(*) FROM learnings").fetchone() == (1,)
    finally:
        reader.close()


def test_a_rebuild_refuses_a_set_aside_copy_it_cannot_read_naming_that_copy(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory.db an unfinished rebuild set aside can't be read: the refusal said "Restore a
    readable memory.db" (which was readable) and named a flag, --forget-nothing, that forgets
    everything recorded in a readable one all the same. It names the copy, and a flag that says
    what it does."""
    from sprite_os.memory.curation.rebuild import UNFINISHED
    from sprite_os.memory.memory_store import MemoryDB

    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    memory_db = Layout(ws).memory_db
    MemoryDB(memory_db).close()
    original = memory_db.with_name(f"{memory_db.name}.before-rebuild-20261126T120000")
    original.write_bytes(b"\xff" * 4096)  # not a database any more
    memory_db.with_name(UNFINISHED).write_text(original.name)
    assert run(ws, "rebuild", "--yes") == 1
    err = capsys.readouterr().err
    assert f"cannot read {original}, the memory.db from before a rebuild that did not finish" in err, err
    assert f"Restore a readable copy at {original}, or pass {REBUILD_ANYWAY}" in err, err
    assert original.read_bytes() == b"\xff" * 4096 and memory_db.exists()
    assert run(ws, "rebuild", "--yes", REBUILD_ANYWAY) == 0  # told to go on: it does


def test_a_rebuild_refuses_when_the_memory_db_an_unfinished_one_set_aside_is_gone(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The marker names the memory.db from before a rebuild that did not finish. With that file gone,
    the rebuild started from the half-made memory.db, whose forgotten keys may be short of the
    original's (a kill between a batch and forgetting again): forgotten memories could come back."""
    from sprite_os.memory.curation.rebuild import UNFINISHED
    from sprite_os.memory.memory_store import MemoryDB

    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    memory_db = Layout(ws).memory_db
    MemoryDB(memory_db).close()
    gone = f"{memory_db.name}.before-rebuild-20261126T120000"
    memory_db.with_name(UNFINISHED).write_text(gone)
    assert run(ws, "rebuild", "--yes") != 0
    err = capsys.readouterr().err
    assert gone in err and UNFINISHED in err, err
    assert memory_db.exists() and not list(memory_db.parent.glob("memory.db.before-rebuild-*"))


def test_a_rebuild_whose_marker_cannot_be_written_sets_nothing_aside(
        ws: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the marker, a rebuild cut short after this would be taken for a whole one by the next,
    which would start from the half-made memory.db: fail before memory.db is set aside."""
    from sprite_os.memory.curation import rebuild as curation_rebuild
    from sprite_os.memory.memory_store import MemoryDB

    def disk_full(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    monkeypatch.setattr(curation_rebuild, "atomic_write", disk_full)
    memory_db = Layout(ws).memory_db
    MemoryDB(memory_db).close()
    assert run(ws, "rebuild", "--yes") != 0
    assert "No space left on device" in capsys.readouterr().err
    assert memory_db.exists() and not list(memory_db.parent.glob("memory.db.before-rebuild-*"))


@pytest.mark.parametrize("left", ["closed", "killed"])
def test_status_and_search_read_a_workspace_whose_disk_went_read_only(
        tmp_path: Path, left: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's first look at a Sprite whose disk an error remounted read-only: memory status and search
    failed ("unable to open database file": a WAL-mode open makes its -shm beside the database). Now they read
    it, through the WAL a killed server left (`killed`) or the database file alone (`closed`), and search the
    learnings where the recall index can't be opened (tantivy takes a lock file beside it)."""
    import json
    import subprocess

    from devkit.faults import FaultSetupFailed, small_tmpfs
    from sprite_os.memory.memory_store import MemoryDB, NewLearning
    from sprite_os.memory.transcript_store import NewObservation, TranscriptDB

    monkeypatch.setenv("SPRITE_EMBEDDING_MODEL", "off")
    try:
        disk = small_tmpfs(tmp_path / "disk", "16m")
        ws = disk.__enter__()
    except FaultSetupFailed as exc:
        pytest.skip(str(exc))
    try:
        layout = Layout(ws)
        layout.ensure()
        transcript, memory = TranscriptDB(layout.transcript_db), MemoryDB(layout.memory_db)
        transcript.append(NewObservation(1_800_000_000.0, "s1", 1, "My name is Dana", "[]", "Hello Dana"))
        memory.commit_batch(trigger="t", observation_ids=[], model="m", input_tokens=0, output_tokens=0,
                            cost_usd=0.0, learnings=[NewLearning("fact", "The user's name is Dana.")],
                            file_updates={}, base_hashes={})
        transcript.close()
        memory.close()
        assert run(ws, "rebuild", "--index", "--yes") == 0  # a recall index, which tantivy opens with a lock file
        capsys.readouterr()
        if left == "killed":  # a second turn committed into the WAL, then the writer killed before any checkpoint
            code = ("import os, signal, sqlite3, sys\n"
                    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
                    "c.execute('PRAGMA wal_autocheckpoint=0')\n"
                    "c.execute(\"INSERT INTO observations (timestamp, session_id, sequence_num, user_message, "
                    "tool_calls_json, agent_response) VALUES (1800000001, 's1', 2, 'And I live in Lisbon', '[]', "
                    "'Noted')\")\n"
                    "os.kill(os.getpid(), signal.SIGKILL)\n")
            subprocess.run([sys.executable, "-c", code, str(layout.transcript_db)], check=False)
            assert layout.transcript_db.with_name("transcript.db-wal").stat().st_size > 0
        subprocess.run(["mount", "-o", "remount,ro", str(ws)], check=True)
        before = sorted(p.name for p in layout.memory_dir.iterdir())

        assert run(ws, "status", "--json") == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert report["observations"]["total"] == (2 if left == "killed" else 1), report["observations"]
        assert run(ws, "search", "Dana") == 0
        out, err = capsys.readouterr()
        assert "The user's name is Dana." in out and "can't be written" in err and "learnings only" in err, err
        assert sorted(p.name for p in layout.memory_dir.iterdir()) == before
    finally:
        disk.__exit__(None, None, None)


def test_an_output_that_cannot_be_written_is_one_line_and_a_failure_not_a_traceback(
        ws: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`sprite-os version > /dev/full` (stdout on a full disk): the write's OSError ended the command
    in a traceback. The command now goes on to its end and exits 1, saying once, on stderr, that its
    output was lost; one that failed on its own keeps its own status."""
    def to_a_full_disk(*args: str) -> int:
        with open("/dev/full", "w", encoding="utf-8") as full, pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "stdout", full)
            code = main(["--workspace", str(ws), *args])
            assert sys.stdout is full  # put back
            return code

    assert to_a_full_disk("version") == 1
    assert to_a_full_disk("memory", "history", "user.md") == 1
    assert to_a_full_disk("memory", "show", "user.md", "999") == 2  # its own failure, said as before
    err = capsys.readouterr().err
    assert err.count("sprite-os: error: could not write the output: No space left on device") == 2, err
    assert "Traceback" not in err and "has no version 999" in err
