"""v1's tables into transcript.db and memory.db: validated, copied in chunks that resume
where an interrupted run stopped, and verified (row count and a checksum over every column)
before commands/migrate_v1.py moves anything. See commands/migrate_v1.py for the whole migration."""

from __future__ import annotations

import contextlib
import hashlib
import json
import marshal
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..database import connect, transaction
from ..errors import MigrationError
from ..memory.memory_store import content_key
from ..memory.schema import OBSERVATION_TRIGGERS, create_observation_triggers
from ..paths import Layout

META_STARTED = "migrate_v1_started"  # in memory.db's meta table while v1 rows are arriving


def say(line: str) -> None:
    print(f"migrate: {line}", flush=True)


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



def migrate_databases(layout: Layout, v1_db: Path, chunk: int) -> dict[str, dict[str, Any]]:
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


def refuse_if_open(v1_db: Path) -> None:
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
