"""`sprite-os migrate-v1`: bring a workspace's databases up to date and move v1 data into `.os/`.

Every deploy runs this with the new code before switching to it. It always creates
or upgrades the schemas of `transcript.db` and `memory.db` (idempotent). If the
workspace still has v1 data (`W/agent.db`, `W/memory/*.md`), it also moves it:

- observations and sessions go to transcript.db, learnings and pending actions to
  memory.db, keeping their ids, in chunks of CHUNK rows per transaction; a run that is
  interrupted resumes where it stopped;
- a learning or action whose normalised content collides with an earlier one keeps a
  disambiguated key (`<content_key>:v1:<id>`), and a turn recorded twice under the same
  (session_id, sequence_num) keeps its repeat with sequence_num = -id: every v1 row arrives;
- v1's memory files with a curated v2 counterpart (tools.md, user.md; files.md, context.md
  if present) replace the untouched templates (a curated or edited v2 file wins; the v1 one
  stays in the backup), checked by sha256 once written; v1's os.md (and soul.md) are
  superseded by the deployed ones; anything else in memory/ is named in the record and
  kept in the backup only;
- each table is verified (row count, and a checksum over all columns in id order) before
  anything is moved; then `migrated_v1` is recorded in memory.db's meta table and
  agent.db (with -wal/-shm) and memory/ move to `.os/backup/v1-<timestamp>/`.

v1 data that the v2 schema cannot hold as it is (a missing table or column, NULL in a
required column, a file that is not a database) stops the migration with one line naming
the problem; nothing is changed or lost. So does another process holding agent.db open (a v1
server still running would write under the copy). A second run changes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import marshal
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Settings
from .database import connect, transaction
from .deploy_contract import apply_ownership
from .errors import LockHeld, MigrationError
from .fsutil import WriterLock, atomic_write
from .isolation_probe import agent_user
from .memory.files import CURATED, SPECS, MemoryFiles
from .memory.memory_store import MemoryDB, content_key
from .memory.schema import OBSERVATION_TRIGGERS, create_observation_triggers
from .memory.transcript_store import TranscriptDB
from .paths import Layout

CHUNK = 5000
V1_DB = "agent.db"
V1_MEMORY = "memory"
DEPLOY_MANAGED = tuple(name for name, spec in SPECS.items() if spec.owner == "deploy")  # superseded
META_DONE = "migrated_v1"
META_STARTED = "migrate_v1_started"
TEMPLATES = Path(__file__).resolve().parent.parent / "bootstrap" / "templates"


@dataclass(frozen=True)
class Table:
    name: str
    db: str  # "transcript" | "memory"
    columns: tuple[str, ...]
    required: tuple[str, ...]  # NOT NULL in v2
    int_id: bool = True
    keyed: bool = False  # has a unique content_key in v2

    def select(self, alias: str = "t") -> str:
        """The v1 columns as they are stored in v2 (observations remap a repeated turn)."""
        cols = [f"{alias}.{c}" for c in self.columns]
        if self.name == "observations":
            i = self.columns.index("sequence_num")
            cols[i] = (f"CASE WHEN {alias}.id IN (SELECT id FROM temp.v1_repeats) "
                       f"THEN -{alias}.id ELSE {alias}.sequence_num END")
        return ", ".join(cols)


TABLES = (
    Table("observations", "transcript",
          ("id", "timestamp", "session_id", "sequence_num", "user_message", "tool_calls_json",
           "agent_response", "processed"),
          ("timestamp", "session_id", "sequence_num", "user_message", "tool_calls_json", "agent_response")),
    Table("sessions", "transcript", ("id", "started_at", "ended_at", "message_count", "observation_count"),
          ("id",), int_id=False),
    Table("learnings", "memory",
          ("id", "created_at", "session_id", "type", "content", "source_observation_id", "confidence"),
          ("created_at", "type", "content"), keyed=True),
    Table("pending_actions", "memory",
          ("id", "created_at", "content", "priority", "status", "source_learning_id"),
          ("created_at", "content", "status"), keyed=True),
)


def say(line: str) -> None:
    print(f"migrate: {line}", flush=True)


# ---------------------------------------------------------------- entry point


def migrate_main(settings: Settings) -> int:
    """Entry point of `sprite-os migrate-v1`."""
    try:
        migrate(settings.layout)
        if (user := agent_user(settings.agent_user)) is not None and os.geteuid() == 0:
            # v1 ran everything as root: user space becomes the agent's, .os/ stays root's (issue 9)
            apply_ownership(settings.layout.root, user.uid, user.gid, deep=True)
            say(f"owners set for the agent's user {user.name}")
    except MigrationError as exc:
        print(f"migrate: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except sqlite3.DatabaseError as exc:
        print(f"migrate: error: database error: {exc}; nothing was lost, run it again once fixed",
              file=sys.stderr, flush=True)
        return 1
    return 0


def migrate(layout: Layout, chunk: int = CHUNK) -> dict[str, Any]:
    """Upgrade the schemas and migrate v1 data if there is any. Returns what it did."""
    started = time.monotonic()
    layout.ensure()
    for db in (TranscriptDB(layout.transcript_db), MemoryDB(layout.memory_db)):
        # The constructors create or upgrade the schema (idempotent).
        say(f"schema {db.path.name} version={db.schema_version}")
        db.close()
    v1_db = layout.root / V1_DB
    done = _meta(layout, META_DONE)
    if done is not None:
        record = json.loads(done)
        _finish_move(layout, record)
        say(f"nothing to migrate: v1 data was migrated at {record['at']}, "
            f"kept in {layout.os_dir / record['backup']}")
        return {"migrated": False, "record": record}
    if not v1_db.exists():
        say(f"nothing to migrate: no v1 data ({v1_db} does not exist)")
        return {"migrated": False}

    _refuse_if_open(v1_db)
    lock = WriterLock(layout.memory_lock)  # a running server must not see v1 rows arrive under it
    try:
        lock.acquire()
    except LockHeld:
        raise MigrationError(f"a running server holds the memory lock ({layout.memory_lock}); stop it "
                             "before migrating v1 data") from None
    try:
        counts = _migrate_databases(layout, v1_db, chunk)
        files = _migrate_files(layout)
        record = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "backup": f"backup/v1-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}",  # under .os/
            "rows": counts,
            "files": files,
            "moved": _fingerprints(layout),
        }
        _set_meta(layout, META_DONE, json.dumps(record))
        _finish_move(layout, record)
    finally:
        lock.release()
    say(f"done rows={sum(c['rows'] for c in counts.values())} seconds={time.monotonic() - started:.1f} "
        f"backup={layout.os_dir / record['backup']}")
    return {"migrated": True, "record": record}


# ---------------------------------------------------------------- databases


def _migrate_databases(layout: Layout, v1_db: Path, chunk: int) -> dict[str, dict[str, Any]]:
    conns = {"transcript": connect(layout.transcript_db), "memory": connect(layout.memory_db)}
    try:
        for conn in conns.values():
            conn.create_function("content_key", 1, content_key, deterministic=True)
            try:
                conn.execute("ATTACH DATABASE ? AS v1", (str(v1_db),))
                conn.execute("SELECT count(*) FROM v1.sqlite_master").fetchone()
            except sqlite3.DatabaseError as exc:
                raise MigrationError(f"{v1_db} is not a readable v1 database ({exc}); nothing was changed") from None
        _validate(conns["memory"], v1_db)
        v1_counts = {t.name: _count(conns[t.db], f"v1.{t.name}") for t in TABLES}
        say("v1 data found at {}: {}".format(v1_db, " ".join(f"{k}={v}" for k, v in v1_counts.items())))
        _claim_target(conns, v1_db)
        conns["transcript"].execute(
            """CREATE TEMP TABLE IF NOT EXISTS v1_repeats (id INTEGER PRIMARY KEY)""")
        conns["transcript"].execute(
            """INSERT OR IGNORE INTO temp.v1_repeats SELECT id FROM v1.observations WHERE id NOT IN
               (SELECT min(id) FROM v1.observations GROUP BY session_id, sequence_num)""")
        repeats = _count(conns["transcript"], "temp.v1_repeats")
        if repeats:
            say(f"table=observations repeated_turns={repeats} (kept, with sequence_num = -id)")
        for table in TABLES:
            _copy(conns[table.db], table, v1_counts[table.name], chunk)
        conns["memory"].execute("INSERT INTO learnings_fts(learnings_fts) VALUES('rebuild')")
        say("table=learnings fts=rebuilt")
        counts = {}
        for table in TABLES:
            counts[table.name] = _verify(conns[table.db], table)
        return counts
    finally:
        for conn in conns.values():
            conn.close()


def _refuse_if_open(v1_db: Path) -> None:
    """A v1 server still running would write agent.db under the copy (Linux /proc; elsewhere
    this check is skipped). Only processes we may inspect are seen: the workspace owner's."""
    holder = _open_by_other_process({os.path.realpath(v1_db), os.path.realpath(v1_db) + "-wal"})
    if holder:
        pid, path = holder
        with contextlib.suppress(OSError):
            pid = f"{pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})"
        raise MigrationError(f"{path} is open in process {pid}, probably a running v1 server; stop it and run "
                             "the migration (or the deploy) again. Nothing was changed")


def _open_by_other_process(paths: set[str]) -> tuple[str, str] | None:
    """(pid, path) of another process holding one of `paths` open, or None."""
    try:
        pids = [e for e in os.listdir("/proc") if e.isdigit() and int(e) != os.getpid()]
    except OSError:
        return None
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if (target := os.readlink(f"/proc/{pid}/fd/{fd}")) in paths:
                        return pid, target
    return None


def _count(conn: sqlite3.Connection, table: str) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def _validate(conn: sqlite3.Connection, v1_db: Path) -> None:
    """Everything the v2 schema cannot hold as it is, found before anything is written."""
    problems: list[str] = []
    try:
        check = conn.execute("PRAGMA v1.quick_check").fetchall()
    except sqlite3.DatabaseError as exc:
        check = [(str(exc),)]
    if check != [("ok",)]:
        detail = " / ".join(" ".join(str(r[0]).split()) for r in check[:3])[:300]
        raise MigrationError(f"{v1_db} is damaged (integrity check: {detail}). "
                             "Nothing was changed; restore it from a copy, or move it away to start afresh")
    for table in TABLES:
        cols = {row[1] for row in conn.execute(f"PRAGMA v1.table_info({table.name})")}
        if not cols:
            problems.append(f"table {table.name} is missing")
            continue
        if missing := [c for c in table.columns if c not in cols]:
            problems.append(f"{table.name} has no column {', '.join(missing)}")
            continue
        if extra := sorted(cols - set(table.columns)):
            say(f"table={table.name} note: v1 column(s) {', '.join(extra)} are not carried over (kept in the backup)")
        for col in dict.fromkeys((*table.required, "id")):
            ids = [r[0] for r in conn.execute(
                f"SELECT rowid FROM v1.{table.name} WHERE {col} IS NULL ORDER BY rowid LIMIT 5")]
            if ids:
                n = _count(conn, f"v1.{table.name} WHERE {col} IS NULL")
                problems.append(f"{table.name}.{col} is NULL in {n} row(s) (rowid {', '.join(map(str, ids))})")
        if table.int_id:
            n = _count(conn, f"v1.{table.name} WHERE typeof(id) != 'integer'")
            if n:
                problems.append(f"{table.name}.id is not an integer in {n} row(s)")
        dup = conn.execute(f"SELECT id FROM v1.{table.name} GROUP BY id HAVING count(*) > 1 LIMIT 1").fetchone()
        if dup:
            problems.append(f"{table.name}.id {dup[0]!r} is not unique")
    if problems:
        raise MigrationError(f"v1 data in {v1_db} is malformed: {'; '.join(problems)}. Nothing was changed; "
                             "fix it (the original stays where it is) and run the migration (or the deploy) again")


def _claim_target(conns: dict[str, sqlite3.Connection], v1_db: Path) -> None:
    """Refuse to merge v1 rows into databases that hold rows of their own: ids would collide."""
    memory = conns["memory"]
    if memory.execute("SELECT value FROM meta WHERE key = ?", (META_STARTED,)).fetchone():
        return  # our own interrupted run: resume
    busy = [f"{t.db}.db {t.name}" for t in TABLES if _count(conns[t.db], f"main.{t.name}")]
    if busy:
        raise MigrationError(f"{v1_db} holds v1 data but {', '.join(busy)} already hold v2 data; refusing to "
                             "merge them (move agent.db away to keep the v2 data)")
    memory.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                   (META_STARTED, json.dumps({"at": time.time(), "source": str(v1_db)})))


def _copy(conn: sqlite3.Connection, table: Table, total: int, chunk: int) -> None:
    """Copy one table in id order, one transaction per chunk; rows already there were committed
    by an interrupted run, so the copy resumes after the highest id present."""
    cols = ", ".join(table.columns)
    last = conn.execute(f"SELECT max(id) FROM main.{table.name}").fetchone()[0]
    copied = _count(conn, f"main.{table.name}")
    if copied and not _prefix_intact(conn, table, last):
        say(f"table={table.name} v1 rows changed since the interrupted run (ids <= {last!r}); copying it again")
        _clear(conn, table)
        last, copied = None, 0
    if copied:
        say(f"table={table.name} resuming after id={last!r} copied={copied}/{total}")
    while True:
        after, args = ("t.id > ?", [last]) if last is not None else ("true", [])
        end = conn.execute(f"SELECT max(id) FROM (SELECT t.id FROM v1.{table.name} t WHERE {after} "
                           "ORDER BY t.id LIMIT ?)", [*args, chunk]).fetchone()[0]
        if end is None:
            break
        where, args = f"WHERE {after} AND t.id <= ?", [*args, end]
        with transaction(conn):
            if table.keyed:
                n = _copy_keyed(conn, table, where, args)
            else:
                n = conn.execute(
                    f"""INSERT INTO main.{table.name} ({cols}) SELECT {table.select()} FROM v1.{table.name} t
                        {where} ORDER BY t.id ON CONFLICT(id) DO NOTHING""", args).rowcount
        last = end
        copied += n
        say(f"table={table.name} copied={copied}/{total}")
    if copied == 0 and total == 0:
        say(f"table={table.name} copied=0/0")


def _prefix_intact(conn: sqlite3.Connection, table: Table, last: Any) -> bool:
    """The rows an interrupted run copied (ids <= last) still match v1: a v1 server may have
    updated or deleted some since, and ON CONFLICT DO NOTHING would never fix them."""
    cols = ", ".join(f"t.{c}" for c in table.columns)
    source = conn.execute(f"SELECT {table.select()} FROM v1.{table.name} t WHERE t.id <= ? ORDER BY t.id", (last,))
    target = conn.execute(f"SELECT {cols} FROM main.{table.name} t WHERE t.id <= ? ORDER BY t.id", (last,))
    return _checksum(source) == _checksum(target)


def _clear(conn: sqlite3.Connection, table: Table) -> None:
    """Empty a partially copied table. It holds only our own rows (_claim_target refused v2 data);
    observations' append-only triggers are lifted for this one transaction."""
    with transaction(conn):
        if table.name == "observations":
            for trigger in OBSERVATION_TRIGGERS:
                conn.execute(f"DROP TRIGGER IF EXISTS main.{trigger}")
        conn.execute(f"DELETE FROM main.{table.name}")
        if table.name == "observations":
            create_observation_triggers(conn)


def _copy_keyed(conn: sqlite3.Connection, table: Table, where: str, args: list[Any]) -> int:
    """Learnings and actions: each gets its content_key, disambiguated on a collision."""
    rows = conn.execute(f"SELECT {table.select()} FROM v1.{table.name} t {where} ORDER BY t.id", args).fetchall()
    content = table.columns.index("content")
    keys = [content_key(row[content]) for row in rows]
    taken: set[str] = set()
    unique = sorted(set(keys))
    for i in range(0, len(unique), 500):
        part = unique[i:i + 500]
        taken.update(r[0] for r in conn.execute(
            f"SELECT content_key FROM main.{table.name} WHERE content_key IN ({','.join('?' * len(part))})", part))
    values = []
    for row, key in zip(rows, keys, strict=True):
        if key in taken:
            key = f"{key}:v1:{row[0]}"
        taken.add(key)
        values.append((*row, key))
    marks = ", ".join("?" * (len(table.columns) + 1))
    return conn.executemany(f"""INSERT INTO main.{table.name} ({', '.join(table.columns)}, content_key)
                                VALUES ({marks}) ON CONFLICT(id) DO NOTHING""", values).rowcount


def _checksum(cursor: sqlite3.Cursor) -> tuple[int, str]:
    """Row count and sha256 over every column of every row, in the cursor's (id) order. Rows
    are hashed a block at a time (the same rows always fall into the same blocks), serialised
    by marshal format 2, which has no back-references: equal values, equal bytes."""
    digest = hashlib.sha256()
    n = 0
    while rows := cursor.fetchmany(2000):
        digest.update(marshal.dumps(rows, 2))
        n += len(rows)
    return n, digest.hexdigest()


def _verify(conn: sqlite3.Connection, table: Table) -> dict[str, Any]:
    cols = ", ".join(f"t.{c}" for c in table.columns)
    source = _checksum(conn.execute(f"SELECT {table.select()} FROM v1.{table.name} t ORDER BY t.id"))
    target = _checksum(conn.execute(f"SELECT {cols} FROM main.{table.name} t ORDER BY t.id"))
    if source != target:
        raise MigrationError(
            f"verification failed for {table.name}: v1 has {source[0]} rows (sha256 {source[1][:12]}), "
            f"migrated {target[0]} rows (sha256 {target[1][:12]}); v1 data is left in place, nothing was lost")
    say(f"verified table={table.name} rows={source[0]} sha256={source[1][:16]}")
    return {"rows": source[0], "sha256": source[1]}


# ---------------------------------------------------------------- files and the move


def _untouched(name: str, text: bytes) -> bool:
    """A v2 curated file nobody has written yet: missing, empty, or still the deploy's template."""
    if not text.strip():
        return True
    with contextlib.suppress(OSError):
        return text.strip() == (TEMPLATES / name).read_bytes().strip()
    return False


def _migrate_files(layout: Layout) -> dict[str, str]:
    """Every entry of v1's memory/ gets an outcome in the record; all of them stay in the backup."""
    v1 = layout.root / V1_MEMORY
    outcome: dict[str, str] = {}
    for source in sorted(v1.iterdir()) if v1.is_dir() else ():
        name = source.name
        if name in CURATED and source.is_file():
            outcome[name] = _carry_file(layout, source)
        elif name in DEPLOY_MANAGED and source.is_file():
            outcome[name] = "superseded"
            say(f"file={name} superseded by the deployed {name} (the v1 file is kept in the backup)")
        else:
            outcome[name] = "backup-only"
            say(f"file={name} not carried over: v2 has no such memory file (kept in the backup)")
    return outcome


def _carry_file(layout: Layout, source: Path) -> str:
    """A v1 curated file replaces a missing or untouched v2 one, checked by sha256 once written."""
    name, data = source.name, source.read_bytes()
    target = layout.memory_dir / name
    existed = target.is_file()
    current = target.read_bytes() if existed else b""
    if current == data:
        result = "unchanged"
    elif _untouched(name, current):
        atomic_write(target, data, mode=0o644)
        digest = hashlib.sha256(data).hexdigest()
        if hashlib.sha256(target.read_bytes()).hexdigest() != digest:
            # Put back what was there, so the next run does not take the damaged copy for an edit.
            if existed:
                atomic_write(target, current, mode=0o644)
            else:
                target.unlink()
            raise MigrationError(f"{target} does not read back as written from {source}; v1 data is left in place")
        MemoryFiles(layout).snapshot(name, "migrate-v1")
        say(f"file={name} copied sha256={digest[:16]}")
        return "copied"
    else:
        result = "kept-v2"  # the v1 file stays in the backup
    say(f"file={name} {result}")
    return result


def _fingerprints(layout: Layout) -> dict[str, list[int]]:
    """What will move, by (device, inode): a later run finishes an interrupted move of exactly
    these, and never takes a new user folder that happens to be called `memory`."""
    out = {}
    for name in _moved_names():
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(layout.root / name)
            out[name] = [st.st_dev, st.st_ino]
    return out


def _moved_names() -> tuple[str, ...]:
    return (V1_DB, f"{V1_DB}-wal", f"{V1_DB}-shm", V1_MEMORY)


def _finish_move(layout: Layout, record: dict[str, Any]) -> None:
    backup = layout.os_dir / record["backup"]
    for name, (dev, ino) in record.get("moved", {}).items():
        path = layout.root / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if (st.st_dev, st.st_ino) != (dev, ino):
            if name == V1_DB:
                raise MigrationError(f"v1 data was migrated at {record['at']}, but {path} appeared again; "
                                     "move it away (it is not read again)")
            continue
        backup.mkdir(parents=True, exist_ok=True)
        os.chmod(backup.parent, 0o700)  # .os/backup: Sprite OS's alone (the agent's user passes through .os/)
        os.rename(path, backup / name)
        say(f"moved {name} to {backup / name}")


def _meta(layout: Layout, key: str) -> str | None:
    db = MemoryDB(layout.memory_db)
    try:
        return db.get_meta(key)
    finally:
        db.close()


def _set_meta(layout: Layout, key: str, value: str) -> None:
    db = MemoryDB(layout.memory_db)
    try:
        db.set_meta(key, value)
    finally:
        db.close()

