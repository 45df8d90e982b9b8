"""The SQLite wrapper both memory databases share: pragmas, transactions, schema migrations, typed rows.

Each database has one owner (a store in `memory/`), and in the server each store
lives on its own thread behind a `db_worker.Worker`, so the event loop never
waits on SQLite. Raw SQL throughout the stores: sqlite-utils builds the schemas,
but its query helpers would hide the transactions and `INSERT OR IGNORE`
semantics the stores rely on.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from .logs import get_logger

if TYPE_CHECKING:  # imported by migrate, and only when a step must run (a tenth of a second of CPU)
    import sqlite_utils

log = get_logger(__name__)

BUSY_TIMEOUT_MS = 5000
# Under WAL, FULL syncs the WAL at every commit: a commit that returned survives a power loss or
# a kernel crash. NORMAL syncs it only at checkpoints, so the last commits before a crash of the
# machine (not of the process) were lost: turns a person had seen complete. A commit costs one
# fsync more (docs/benchmarks.md); writers that commit in bulk group their writes (group commit).
SYNCHRONOUS = "FULL"

Row = TypeVar("Row", bound=msgspec.Struct)
SchemaStep = Callable[["sqlite_utils.Database"], None]


def connect(path: Path) -> sqlite3.Connection:
    """Open a database with WAL, durable commits and a busy timeout, as both databases need.
    secure_delete: what a write frees (a forgotten turn's words, a deleted learning) is overwritten
    with zeros, not left in free pages for anyone who reads the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    conn.execute("PRAGMA secure_delete=ON")
    return conn


def read_only(path: Path, *, set_aside: bool = False) -> sqlite3.Connection:
    """A connection that can't write `path`. A plain read-only open of a database in WAL mode still
    makes its -wal and -shm beside it, and leaves them there. `set_aside`: a copy nothing writes, its
    WAL checkpointed into it when it was set aside (a rebuild's memory.db.before-rebuild-*): read as
    immutable, with no lock, so nothing is made beside it."""
    return sqlite3.connect(f"file:{path}?{'immutable=1' if set_aside else 'mode=ro'}", uri=True)


def on_read_only_disk(path: Path) -> bool:
    """Whether `path`'s folder can't be written (a disk an error remounted read-only, a folder the operator may
    not write): where a reader can't open the database as `connect` does."""
    return not os.access(path.parent, os.W_OK)


def read_only_disk(path: Path) -> sqlite3.Connection:
    """A reader's connection to a database on a disk that can't be written. A WAL-mode open must make its -shm
    beside the database ("unable to open database file"). With a -wal beside it (a writer killed before its
    checkpoint) SQLite reads it read-only, the WAL included; without one, on a file system mounted read-only, the
    database file holds every commit and nothing can add one: read as immutable, with no lock and nothing made
    beside it."""
    if not path.exists():
        raise sqlite3.OperationalError(f"no database at {path}")
    # Immutable only where nothing can write: on a folder merely closed to this user a server may be writing.
    frozen = os.statvfs(path.parent).f_flag & os.ST_RDONLY and not path.with_name(f"{path.name}-wal").exists()
    mode = "immutable=1" if frozen else "mode=ro"
    return sqlite3.connect(f"{path.absolute().as_uri()}?{mode}", uri=True, isolation_level=None,
                           check_same_thread=False)


def open_store(path: Path, steps: Sequence[SchemaStep], *, reading: bool = False) -> sqlite3.Connection:
    """A store's connection, its schema brought to the version `steps` make. `reading` (a command that only
    reads): on a disk that can't be written, read-only and as it is, with no migration."""
    if reading and on_read_only_disk(path):
        return read_only_disk(path)
    conn = connect(path)
    migrate(conn, steps)
    return conn


CHECKPOINT_TRIES = 50  # 20 ms apart: a reader's transaction (a search, a page of turns) is shorter


def checkpoint(conn: sqlite3.Connection, tries: int = CHECKPOINT_TRIES) -> bool:
    """Copy the WAL into the database and empty it (it holds old copies of changed pages: after a
    forget, the words). A reader in the middle of a transaction keeps part of it: tried again for
    up to a second (on the database's own thread, never the event loop). False when a reader kept
    it that long; the next checkpoint takes the rest.

    Each try answers at once: a TRUNCATE checkpoint waits for readers through the busy handler,
    which would hold every try for the whole busy timeout (5 s: 50 tries, four minutes)."""
    conn.execute("PRAGMA busy_timeout=0")
    try:
        for attempt in range(tries):
            busy, _log, _moved = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            if not busy:
                return True
            if attempt + 1 < tries:
                time.sleep(0.02)
    finally:
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    log.warning("wal_not_emptied", detail="a reader held the WAL through every try; the next checkpoint empties it")
    return False


@contextmanager
def query_only(conn: sqlite3.Connection) -> Iterator[None]:
    """Within it, a write on `conn` fails ("attempt to write a readonly database"): how a reader
    that shares the writer's connection is kept from writing."""
    conn.execute("PRAGMA query_only=1")
    try:
        yield
    finally:
        conn.execute("PRAGMA query_only=0")


class transaction:
    """`with transaction(conn):` -- BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: type[BaseException] | None, _exc: BaseException | None,
                 _tb: TracebackType | None) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection, steps: Sequence[SchemaStep]) -> None:
    """Run each schema step past PRAGMA user_version, each in its own transaction.
    Steps are idempotent, so a migration interrupted part-way simply runs again. sqlite-utils, which
    builds the schemas, is imported only when a step must run: a database already at its version (a
    restart, every `memory` command) opens without it."""
    db: sqlite_utils.Database | None = None
    for version, step in enumerate(steps, start=1):
        if user_version(conn) >= version:
            continue
        if db is None:
            import sqlite_utils

            db = sqlite_utils.Database(conn)
        with transaction(conn):
            step(db)
            conn.execute(f"PRAGMA user_version={version}")


def rows(cursor: sqlite3.Cursor, cls: type[Row]) -> list[Row]:
    """The cursor's rows as `cls`, matched by column name. A column `cls` does not know is left out:
    a deploy runs the version before on the new schema until its switch (and again after a
    rollback), and a `SELECT *` must not fail there on a column a later version added."""
    known = set(cls.__struct_fields__)
    names = [d[0] for d in cursor.description]
    keep = [i for i, name in enumerate(names) if name in known]
    return [cls(**{names[i]: row[i] for i in keep}) for row in cursor.fetchall()]


def marks(values: Sequence[Any]) -> str:
    """`?,?,?` for an IN (...) list of `values`."""
    return ",".join("?" * len(values))
