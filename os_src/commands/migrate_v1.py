"""`sprite-os migrate-v1`: bring a workspace's databases up to date and move v1 data into `.os/`.

Every deploy runs this with the new code before switching to it. It always creates
or upgrades the schemas of `transcript.db` and `memory.db` (idempotent). If the
workspace still has v1 data (`W/agent.db`, `W/memory/*.md`), it also moves it:

- observations and sessions go to transcript.db, learnings and pending actions to
  memory.db, keeping their ids, in chunks of ROWS_PER_COMMIT rows per transaction; a run that is
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
import os
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import Any

from .. import RELEASE_DIR
from ..config import Settings
from ..deploy_contract import apply_ownership
from ..errors import LockHeld, MigrationError
from ..fsutil import WriterLock, atomic_write
from ..isolation.probe import agent_user
from ..memory.files import CURATED, SPECS, MemoryFiles
from ..memory.memory_store import MemoryDB
from ..memory.transcript_store import TranscriptDB
from ..paths import Layout
from .migrate_v1_tables import migrate_databases, refuse_if_open, say

ROWS_PER_COMMIT = 5000
V1_DB = "agent.db"
V1_MEMORY = "memory"
DEPLOY_MANAGED = tuple(name for name, spec in SPECS.items() if spec.owner == "deploy")  # superseded
META_DONE = "migrated_v1"
TEMPLATES = RELEASE_DIR / "bootstrap" / "templates"


# ---------------------------------------------------------------- entry point


def migrate_main(settings: Settings) -> int:
    """Entry point of `sprite-os migrate-v1`."""
    try:
        migrate(settings.layout)
        if (user := agent_user(settings.agent_user)) is not None and os.geteuid() == 0:
            # v1 ran everything as root: user space becomes the agent's, .os/ stays root's (the kernel keeps the agent out)
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


def migrate(layout: Layout, chunk: int = ROWS_PER_COMMIT) -> dict[str, Any]:
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
    if not os.path.lexists(v1_db):
        say(f"nothing to migrate: no v1 data ({v1_db} does not exist)")
        return {"migrated": False}
    if (problem := untrusted(v1_db)) or (problem := untrusted(layout.root / V1_MEMORY, directory=True)):
        # v1 ran as root, and user space is the agent's to write: what is not ours may be planted.
        say(f"not migrating: {problem}; v1 data is root's (move it away to silence this)")
        return {"migrated": False, "refused": problem}

    refuse_if_open(v1_db)
    lock = WriterLock(layout.memory_lock, WriterLock.MIGRATE)  # a running server must not see v1 rows arrive under it
    try:
        lock.acquire()
    except LockHeld:
        raise MigrationError(f"a running server holds the memory lock ({layout.memory_lock}); stop it "
                             "before migrating v1 data") from None
    try:
        counts = migrate_databases(layout, v1_db, chunk)
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
        if problem := untrusted(source):
            outcome[name] = "refused"
            say(f"file={name} not carried over: {problem}")
        elif name in CURATED:
            outcome[name] = _carry_file(layout, source)
        elif name in DEPLOY_MANAGED:
            outcome[name] = "superseded"
            say(f"file={name} superseded by the deployed {name} (the v1 file is kept in the backup)")
        else:
            outcome[name] = "backup-only"
            say(f"file={name} not carried over: v2 has no such memory file (kept in the backup)")
    return outcome


def _carry_file(layout: Layout, source: Path) -> str:
    """A v1 curated file replaces a missing or untouched v2 one, checked by sha256 once written."""
    name, data = source.name, read_no_follow(source)
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


def untrusted(path: Path, *, directory: bool = False) -> str | None:
    """Why v1 data at `path` is not to be read, or None. v1 ran as root: its files are regular (or
    its folder real) and belong to whoever runs this migration. Anything else in user space (a
    symlink to a root-only file, a FIFO, a file the agent's user made) may be the agent's doing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    kind_ok = stat.S_ISDIR(st.st_mode) if directory else stat.S_ISREG(st.st_mode)
    if not kind_ok:
        return f"{path} is not a {'folder' if directory else 'regular file'}"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to uid {st.st_uid}, not to this migration's"
    return None


def read_no_follow(path: Path) -> bytes:
    """The file's bytes, refusing a symlink swapped in since it was checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or os.fstat(f.fileno()).st_uid != os.geteuid():
            raise MigrationError(f"{path} changed while it was migrated; v1 data is left in place")
        return f.read()


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

