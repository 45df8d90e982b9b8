"""Migration of a v1 workspace (W/agent.db, W/memory/*.md) into .os/ (sprite_os.commands.migrate_v1)."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devkit.deploy_support import (
    REPO,
    V1_FILES,
    V1Data,
    base_env,
    make_v1_workspace,
    run_until,
    table_rows,
)
from sprite_os.commands import migrate_v1 as m
from sprite_os.commands import migrate_v1_tables as migrate_tables
from sprite_os.config import Settings
from sprite_os.isolation.policy import AgentUser
from sprite_os.memory.memory_store import MemoryDB, content_key
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.paths import Layout

V1_COLUMNS = {t.name: ", ".join(t.columns) for t in migrate_tables.TABLES}
# The generated v1 workspace (v1_template) is built once per worker that runs these: keep them on one.
pytestmark = pytest.mark.xdist_group("v1-workspace")


@pytest.fixture(scope="module")
def v1_template(tmp_path_factory: pytest.TempPathFactory) -> V1Data:
    """One generated v1 workspace (6,000 turns, 6,005 observation rows); each test migrates its own copy.
    The tests that stop a run part-way copy in chunks of 1,000, so a run stopped after its third commit
    resumes mid-table with four chunks still to go; a run at the default ROWS_PER_COMMIT (5,000) still
    takes two commits. It was 12,000 turns, which tested nothing more for twice the CPU."""
    return make_v1_workspace(tmp_path_factory.mktemp("v1") / "ws", observations=6000, learnings=2500,
                             actions=300)


@pytest.fixture
def v1(v1_template: V1Data, tmp_path: Path) -> V1Data:
    root = tmp_path / "ws"
    subprocess.run(["cp", "-a", str(v1_template.root), str(root)], check=True)
    return V1Data(root, v1_template.counts, v1_template.repeated_turns, v1_template.key_collisions)


def state(root: Path) -> dict[str, Any]:
    """Everything a migration could change: files (bytes), table contents, meta."""
    out: dict[str, Any] = {}
    for folder, _dirs, files in os.walk(root):
        for name in files:
            path = Path(folder) / name
            if path.suffix in (".db", ".db-wal", ".db-shm", ".lock") or name.endswith(("-wal", "-shm")):
                continue
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    layout = Layout(root)
    for db, tables in ((layout.transcript_db, ("observations", "sessions")),
                       (layout.memory_db, ("learnings", "pending_actions", "meta", "batches"))):
        conn = sqlite3.connect(db)
        for table in tables:
            out[f"{db.name}:{table}"] = hashlib.sha256(
                repr(conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()).encode()).hexdigest()
        conn.close()
    return out


def test_every_row_and_file_arrives(v1: V1Data, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(v1.root)
    source = {t: table_rows(v1.root / "agent.db", t, V1_COLUMNS[t]) for t in V1_COLUMNS}
    result = m.migrate(layout, chunk=1000)
    out = capsys.readouterr().out
    assert result["migrated"] is True
    assert "migrate: table=observations copied=1000/6005" in out

    # Every row, every column, same ids (a repeated turn's sequence_num becomes -id).
    assert len(v1.repeated_turns) == 5
    for table, rows in source.items():
        db = layout.transcript_db if table in ("observations", "sessions") else layout.memory_db
        migrated = table_rows(db, table, V1_COLUMNS[table])
        assert len(migrated) == len(rows) == v1.counts[table]
        if table == "observations":
            expected = [(r[0], *r[1:3], -r[0], *r[4:]) if r[0] in v1.repeated_turns else r for r in rows]
            assert migrated == expected
        else:
            assert migrated == rows, table
        assert result["record"]["rows"][table]["rows"] == len(rows)

    # content_key: unique, and a collision keeps the row under a disambiguated key.
    for table in ("learnings", "pending_actions"):
        keys = dict(sqlite3.connect(layout.memory_db).execute(f"SELECT id, content_key FROM {table}").fetchall())
        contents = dict(table_rows(layout.memory_db, table, "id, content"))
        collided = v1.key_collisions[table]
        assert collided, "the generated data must hold content_key collisions"
        for rid, key in keys.items():
            expected = content_key(contents[rid]) + (f":v1:{rid}" if rid in collided else "")
            assert key == expected

    # The FTS index holds every learning.
    memory = MemoryDB(layout.memory_db)
    some = source["learnings"][len(source["learnings"]) // 2]
    word = some[4].split()[0].lower()
    assert memory.conn.execute("SELECT count(*) FROM learnings_fts WHERE learnings_fts MATCH ?",
                               (word,)).fetchone()[0] >= 1
    assert memory.conn.execute("SELECT count(*) FROM learnings_fts").fetchone()[0] == v1.counts["learnings"]
    record = json.loads(memory.get_meta("migrated_v1") or "{}")
    memory.close()
    assert record["files"] == {"tools.md": "copied", "user.md": "copied", "os.md": "superseded"}

    # Files: tools.md and user.md byte for byte (with a history version); v1 moved to the backup.
    for name in ("tools.md", "user.md"):
        assert (layout.memory_dir / name).read_text(encoding="utf-8") == V1_FILES[name]
        assert list((layout.history_dir / name).glob("*_migrate-v1.md"))
    backup = layout.os_dir / record["backup"]
    assert not (v1.root / "agent.db").exists() and not (v1.root / "memory").exists()
    assert (backup / "agent.db").is_file()
    assert (backup / "memory" / "os.md").read_text() == V1_FILES["os.md"]
    assert table_rows(backup / "agent.db", "observations", V1_COLUMNS["observations"]) == source["observations"]
    assert oct(layout.os_dir.stat().st_mode & 0o777) == "0o711"  # passed through, never listed
    assert oct(backup.parent.stat().st_mode & 0o777) == "0o700"  # v1's data: Sprite OS's alone


def test_second_run_changes_nothing(v1: V1Data, capsys: pytest.CaptureFixture[str]) -> None:
    m.migrate(Layout(v1.root))
    before = state(v1.root)
    capsys.readouterr()
    assert m.migrate(Layout(v1.root))["migrated"] is False
    assert "nothing to migrate: v1 data was migrated at" in capsys.readouterr().out
    assert state(v1.root) == before


def test_no_v1_data_only_creates_the_schemas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(tmp_path)
    assert m.migrate(layout) == {"migrated": False}
    assert "nothing to migrate: no v1 data" in capsys.readouterr().out
    assert TranscriptDB(layout.transcript_db).schema_version >= 1
    assert MemoryDB(layout.memory_db).get_meta("migrated_v1") is None


def test_curated_v2_file_wins_and_v1_file_is_kept(v1: V1Data, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(v1.root)
    layout.memory_dir.mkdir(parents=True)
    template = (REPO / "bootstrap" / "templates" / "tools.md").read_bytes()
    (layout.memory_dir / "tools.md").write_bytes(template)  # untouched template: v1 wins
    (layout.memory_dir / "user.md").write_text("# Who you are working with\n\nCurated in v2 already.\n")
    record = m.migrate(layout)["record"]
    out = capsys.readouterr().out
    assert "file=user.md kept-v2" in out and "file=tools.md copied" in out
    assert (layout.memory_dir / "user.md").read_text() == "# Who you are working with\n\nCurated in v2 already.\n"
    assert (layout.memory_dir / "tools.md").read_text(encoding="utf-8") == V1_FILES["tools.md"]
    assert (layout.os_dir / record["backup"] / "memory" / "user.md").read_text(encoding="utf-8") == V1_FILES["user.md"]


def test_every_v1_memory_file_is_carried_or_named(v1: V1Data, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """The design's v1 migration: v1 had os.md, tools.md and user.md. Any v1 file with a curated v2 counterpart is
    carried over; every other one is named in the record and a `migrate:` line, and kept in the backup."""
    layout = Layout(v1.root)
    (v1.root / "memory" / "context.md").write_text("# Context\n\nQuarter-end close this week.\n")
    (v1.root / "memory" / "soul.md").write_text("# v1 soul\n")
    (v1.root / "memory" / "notes.md").write_text("# Notes the v1 agent kept\n")
    real_write = m.atomic_write
    monkeypatch.setattr(m, "atomic_write", lambda path, data, mode: real_write(path, data[:-1], mode))
    with pytest.raises(m.MigrationError, match="does not read back as written"):  # a short write is caught
        m.migrate(layout)
    monkeypatch.undo()
    record = m.migrate(layout)["record"]
    out = capsys.readouterr().out
    assert record["files"] == {"context.md": "copied", "notes.md": "backup-only", "os.md": "superseded",
                               "soul.md": "superseded", "tools.md": "copied", "user.md": "copied"}
    assert "migrate: file=notes.md not carried over" in out
    assert f"file=user.md copied sha256={hashlib.sha256(V1_FILES['user.md'].encode()).hexdigest()[:16]}" in out
    assert (layout.memory_dir / "context.md").read_text() == "# Context\n\nQuarter-end close this week.\n"
    backup = layout.os_dir / record["backup"] / "memory"
    assert (backup / "notes.md").read_text() == "# Notes the v1 agent kept\n"
    assert (backup / "soul.md").read_text() == "# v1 soul\n"


def test_interrupted_run_resumes(v1: V1Data, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Stop at the third progress line (as a crash would), then run again."""
    layout = Layout(v1.root)
    lines = []

    def say(line: str) -> None:
        lines.append(line)
        if "copied=" in line and len([x for x in lines if "copied=" in x]) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(migrate_tables, "say", say)  # the copy reports its progress
    with pytest.raises(KeyboardInterrupt):
        m.migrate(layout, chunk=1000)
    assert (v1.root / "agent.db").exists()
    assert MemoryDB(layout.memory_db).get_meta("migrated_v1") is None
    assert TranscriptDB(layout.transcript_db).counts()["total"] == 3000
    monkeypatch.undo()
    m.migrate(layout, chunk=1000)
    out = capsys.readouterr().out
    assert "table=observations resuming after id=3000 copied=3000/6005" in out
    assert TranscriptDB(layout.transcript_db).counts()["total"] == v1.counts["observations"]
    assert MemoryDB(layout.memory_db).get_meta("migrated_v1") is not None


def test_resume_after_v1_rows_changed_copies_again(v1: V1Data, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A v1 server wrote agent.db between an interrupted run and its resume: the changed tables
    are copied again from scratch, and verification passes."""
    layout = Layout(v1.root)

    def say(line: str) -> None:
        if line.startswith("table=pending_actions copied="):  # every table copied, none verified
            raise KeyboardInterrupt

    monkeypatch.setattr(migrate_tables, "say", say)  # the copy reports its progress
    with pytest.raises(KeyboardInterrupt):
        m.migrate(layout, chunk=1000)
    monkeypatch.undo()
    _execute(v1.root / "agent.db",
             "UPDATE pending_actions SET status = 'dismissed-by-v1' WHERE id = 3",
             "UPDATE observations SET processed = 7 WHERE id = 5",
             "DELETE FROM learnings WHERE id = 10")
    capsys.readouterr()
    record = m.migrate(layout, chunk=1000)["record"]
    out = capsys.readouterr().out
    for table in ("observations", "learnings", "pending_actions"):
        assert f"migrate: table={table} v1 rows changed since the interrupted run" in out
    assert "migrate: table=sessions resuming after id=" in out  # unchanged: resumed, not copied again
    assert record["rows"]["learnings"]["rows"] == v1.counts["learnings"] - 1
    assert table_rows(layout.memory_db, "pending_actions", "id, status")[2] == (3, "dismissed-by-v1")
    assert table_rows(layout.transcript_db, "observations", "id, processed")[4] == (5, 7)
    # The append-only triggers are back.
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        _execute(layout.transcript_db, "DELETE FROM observations WHERE id = 1")


@pytest.mark.parametrize("marker", ["table=observations copied=5000/", "table=learnings copied="])
def test_killed_run_resumes(v1: V1Data, marker: str) -> None:
    """SIGKILL `sprite-os migrate-v1` at a progress line; the next run completes and verifies."""
    env = base_env(SPRITE_WORKSPACE=str(v1.root))
    cmd = [sys.executable, "-m", "sprite_os", "migrate-v1"]
    killed, out = run_until(cmd, marker, env=env)
    assert killed, out
    assert (v1.root / "agent.db").exists() and (v1.root / "memory" / "user.md").exists()
    assert MemoryDB(Layout(v1.root).memory_db).get_meta("migrated_v1") is None
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "resuming after id=" in done.stdout
    for table in V1_COLUMNS:
        assert f"verified table={table} rows={v1.counts[table]} " in done.stdout
    assert not (v1.root / "agent.db").exists()


def _malformed_garbage(db: Path) -> None:
    db.write_bytes(b"this is not a database\n" * 100)


def _malformed_damaged_page(db: Path) -> None:
    data = bytearray(db.read_bytes())
    middle = len(data) // 2 // 4096 * 4096
    data[middle + 100:middle + 4000] = b"\xff" * 3900
    db.write_bytes(bytes(data))


def _execute(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()


def _malformed_nulls(db: Path) -> None:
    _execute(db, "UPDATE observations SET user_message = NULL WHERE id IN (7, 9)")


def _malformed_no_column(db: Path) -> None:
    _execute(db, "DROP TRIGGER learnings_ai", "DROP TABLE learnings_fts", "ALTER TABLE learnings DROP COLUMN confidence")


def _malformed_no_table(db: Path) -> None:
    _execute(db, "DROP TABLE pending_actions")


@pytest.mark.parametrize(("damage", "message"), [
    (_malformed_garbage, "is not a readable v1 database"),
    (_malformed_damaged_page, "is damaged (integrity check: *** in database v1 ***"),
    (_malformed_nulls, "observations.user_message is NULL in 2 row(s) (rowid 7, 9)"),
    (_malformed_no_column, "learnings has no column confidence"),
    (_malformed_no_table, "table pending_actions is missing"),
])
def test_malformed_v1_fails_clearly_and_loses_nothing(v1: V1Data, damage: Any, message: str) -> None:
    db = v1.root / "agent.db"
    for extra in ("agent.db-wal", "agent.db-shm"):
        (v1.root / extra).unlink(missing_ok=True)
    damage(db)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    env = base_env(SPRITE_WORKSPACE=str(v1.root))
    done = subprocess.run([sys.executable, "-m", "sprite_os", "migrate-v1"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    errors = done.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("migrate: error: ") and message in errors[0], done.stderr
    assert "nothing was changed" in errors[0].lower()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert (v1.root / "memory" / "tools.md").read_text(encoding="utf-8") == V1_FILES["tools.md"]
    layout = Layout(v1.root)
    assert TranscriptDB(layout.transcript_db).counts()["total"] == 0
    assert MemoryDB(layout.memory_db).get_meta("migrated_v1") is None
    if damage is _malformed_nulls:  # fixed by hand, it then migrates
        conn = sqlite3.connect(db)
        conn.execute("UPDATE observations SET user_message = '' WHERE user_message IS NULL")
        conn.commit()
        conn.close()
        assert m.migrate(layout)["migrated"] is True


def test_refuses_to_merge_into_v2_data(v1: V1Data, capsys: pytest.CaptureFixture[str]) -> None:
    layout = Layout(v1.root)
    from sprite_os.memory.transcript_store import NewObservation
    TranscriptDB(layout.transcript_db).append(NewObservation(1.0, "v2-session", 0, "hi", "[]", "hello"))
    with pytest.raises(m.MigrationError, match="already hold v2 data"):
        m.migrate(layout)
    assert (v1.root / "agent.db").exists()


def test_running_server_lock_blocks_migration(v1: V1Data) -> None:
    import fcntl

    layout = Layout(v1.root)
    layout.ensure()
    fd = os.open(layout.memory_lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(m.MigrationError, match="holds the memory lock"):
            m.migrate(layout)
    finally:
        os.close(fd)
    assert (v1.root / "agent.db").exists()


def test_a_process_holding_agent_db_open_blocks_migration(v1: V1Data) -> None:
    """A v1 server still running (here: a child holding agent.db open) must stop first."""
    layout = Layout(v1.root)
    code = ("import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('SELECT count(*) FROM observations').fetchone(); print('open', flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(v1.root / "agent.db")], stdout=subprocess.PIPE)
    try:
        assert child.stdout and child.stdout.readline() == b"open\n"
        before = hashlib.sha256((v1.root / "agent.db").read_bytes()).hexdigest()
        with pytest.raises(m.MigrationError, match=rf"agent.db(-wal)? is open in process {child.pid} "):
            m.migrate(layout)
    finally:
        child.kill()
        child.wait()
    assert hashlib.sha256((v1.root / "agent.db").read_bytes()).hexdigest() == before
    assert TranscriptDB(layout.transcript_db).counts()["total"] == 0
    assert MemoryDB(layout.memory_db).get_meta(migrate_tables.META_STARTED) is None
    assert m.migrate(layout)["migrated"] is True  # once it is gone


def test_a_user_folder_named_memory_is_never_taken(v1: V1Data) -> None:
    layout = Layout(v1.root)
    record = m.migrate(layout)["record"]
    (v1.root / "memory").mkdir()
    (v1.root / "memory" / "notes.txt").write_text("the user's own folder")
    m.migrate(layout)
    assert (v1.root / "memory" / "notes.txt").exists()
    (v1.root / "agent.db").write_bytes(b"")  # a v1 database appearing again is an error, not re-read
    with pytest.raises(m.MigrationError, match="appeared again"):
        m.migrate(layout)
    assert (layout.os_dir / record["backup"] / "agent.db").is_file()


def test_migrate_as_root_gives_user_space_to_the_agents_user(agent_user: AgentUser, tmp_path: Path) -> None:
    from sprite_os.commands.migrate_v1 import migrate_main

    ws = tmp_path / "ws"
    Layout(ws).ensure()
    (ws / "documents" / "from-v1.md").write_text("made when everything ran as root")
    assert migrate_main(Settings(workspace=ws, agent_user=agent_user.name)) == 0
    assert (ws / "documents" / "from-v1.md").stat().st_uid == agent_user.uid
    assert (ws.stat().st_uid, ws.stat().st_gid, ws.stat().st_mode & 0o7777) == (0, agent_user.gid, 0o1770)
    assert (ws / ".os" / "memory").stat().st_uid == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid need root")
def test_v1_data_the_agent_could_have_planted_is_not_read(v1: V1Data, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The hostile review: every deploy runs migrate-v1 as root, and user space is the agent's to
    write. A planted agent.db (not root's) is not migrated; in a real v1 memory folder, a symlink
    to a root-only file or a file of another uid is not carried into .os/memory/."""
    layout = Layout(v1.root)
    secret = tmp_path / "root-only"
    secret.write_text("ROOT SECRET\n")
    os.chmod(secret, 0o600)
    os.unlink(v1.root / "memory" / "user.md")
    os.symlink(secret, v1.root / "memory" / "user.md")
    (v1.root / "memory" / "context.md").write_text("PLANTED\n")
    os.chown(v1.root / "memory" / "context.md", 4251, 4251)
    result = m.migrate(layout)
    assert result["migrated"]
    assert result["record"]["files"]["user.md"] == "refused" and result["record"]["files"]["context.md"] == "refused"
    memory = "".join(p.read_text() for p in layout.memory_dir.glob("*.md"))
    assert "ROOT SECRET" not in memory and "PLANTED" not in memory

    planted = tmp_path / "planted"
    ws = planted / "ws"
    (ws / ".os").mkdir(parents=True)
    backup = next((v1.root / ".os" / "backup").iterdir())
    subprocess.run(["cp", "-a", str(backup / "agent.db"), str(ws / "agent.db")], check=True)
    os.chown(ws / "agent.db", 4251, 4251)
    capsys.readouterr()
    result = m.migrate(Layout(ws))
    assert not result["migrated"] and "belongs to uid 4251" in result["refused"]
    assert TranscriptDB(Layout(ws).transcript_db).counts()["total"] == 0
    assert "not migrating" in capsys.readouterr().out
