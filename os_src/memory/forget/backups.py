"""The backups under `.os/` without the forgotten turns: older memory.db copies (kept by `memory
rebuild`), v1's agent.db and memory files (kept by `migrate-v1`), each with a note that a forget removed
text; a recall index set aside is derived data, and goes."""

from __future__ import annotations

import calendar
import contextlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

from ...database import marks
from ...fsutil import (
    atomic_write,
    sweep_files,
    sweep_temp_files,
    temp_for,
    temp_name,
)
from ...logs import get_logger
from ...paths import Layout
from .lines import meaningful_lines, without
from .purge import delete_drawn

log = get_logger(__name__)


def _memory_file(name: str) -> bool:
    """Whether a file in a backup's memory/ holds memory text: one of v1's memory files (`user.md`), or what an
    interrupted `atomic_write` left of one (`.user.md.<random>.tmp`): v1's own, moved there with its memory/ (it
    may hold v1's latest text, which the backup keeps), or this pass's, a kill cut short."""
    return name.endswith(".md") or (temp_for(name) or "").endswith(".md")


# The pass's own temp file for a rewrite of a backup's memory file: `.<name>.forget-<random>.tmp`, a name no
# `atomic_write` (v1's included) gives, so a start tells what a kill of the pass left by its name alone.
_PASS_TEMP = "forget-"
_PASS_TEMP_NAME = temp_name(_PASS_TEMP)


def sweep_backup_temps(layout: Layout) -> list[Path]:
    """What a kill left of this pass's rewrites of v1's memory files (its temp file, beside one in
    `.os/backup/v1-<time>/memory/`), told by its name (`_rewrite`): v1's own leftovers, moved there with its
    memory/, are named as any `atomic_write`'s, and stay whatever the clock says. A temp of the version before,
    named as v1's, is told by its time, as then: written since `migrate-v1` made the backup (v1's are older; the
    pass's rewrite of one keeps its time). Call it holding the writer lock (so does `migrate-v1`, the folder's
    other writer). Returns what it removed."""
    def ours(entry: os.DirEntry[str]) -> bool:
        return bool((match := _PASS_TEMP_NAME.match(entry.name)) and _memory_file(match["name"]))

    removed: list[Path] = []
    for folder in sorted((layout.os_dir / "backup").glob("v1-*")):
        removed += sweep_files(folder / "memory", ours)
        try:
            made = calendar.timegm(time.strptime(folder.name[len("v1-"):], "%Y%m%dT%H%M%SZ"))
        except ValueError:  # not a name migrate-v1 gives: not known to be ours
            continue
        removed += sweep_temp_files(folder / "memory", _memory_file, written_since=made)
    return removed


def _backup_files(layout: Layout) -> list[Path]:
    """Memory files kept by `migrate-v1` (v1's memory/*.md, and what an interrupted write left of them:
    `_memory_file`, which may hold v1's latest text) under `.os/backup/`."""
    return [p for p in (layout.os_dir / "backup").glob("*/memory/*")
            if _memory_file(p.name) and p.is_file() and not p.is_symlink()]


def _rewrite(path: Path, text: str) -> None:
    """A backup's memory file rewritten by `atomic_write` (a temp file beside it, synced, renamed over it, the
    folder synced), under a temp name of the pass's own (`_PASS_TEMP`), which the start's sweep removes whatever
    the clock says. What an interrupted write left (v1's) keeps its time, as a version before this one swept its
    own unmarked temps by their time."""
    before = path.stat()

    def same_time(tmp: str) -> None:
        if temp_for(path.name) is not None:
            os.utime(tmp, ns=(before.st_atime_ns, before.st_mtime_ns))

    atomic_write(path, text.encode("utf-8"), tag=_PASS_TEMP, before_rename=same_time)


def backup_candidates(layout: Layout) -> dict[str, str]:
    """Every meaningful line of the backups' memory files (v1's, kept by `migrate-v1`): hash, text."""
    out: dict[str, str] = {}
    for path in _backup_files(layout):
        text = path.read_text(encoding="utf-8", errors="replace")
        out.update(meaningful_lines(text))
    return out


def _purge_copy(path: Path, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], note: str) -> bool:
    """An older copy of memory.db (kept by `memory rebuild`) or v1's agent.db (kept by `migrate-v1`):
    the same rows removed, the file rewritten without free pages (VACUUM), and a note left in it."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA secure_delete=ON")
        tables = {r for (r,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "observations" in tables:  # v1's agent.db: its turns, under the same ids
            conn.execute("DROP TRIGGER IF EXISTS observations_append_only")
            conn.execute(f"UPDATE observations SET user_message = '', tool_calls_json = '[]', agent_response = '' "
                         f"WHERE id IN ({marks(ids)})", list(ids))
        delete_drawn(conn, ids, sessions, tables)
        if "learnings_fts" in tables:
            conn.execute("INSERT INTO learnings_fts(learnings_fts) VALUES ('rebuild')")
        if "batches" in tables:
            for bid, updates in conn.execute("SELECT id, file_updates FROM batches").fetchall():
                with contextlib.suppress(ValueError, TypeError):
                    files = json.loads(updates or "{}")
                    conn.execute("UPDATE batches SET file_updates = ? WHERE id = ?",
                                 (json.dumps({n: without(t, hashes, note) for n, t in files.items()}), bid))
        conn.execute("CREATE TABLE IF NOT EXISTS forget_notes (at REAL NOT NULL, note TEXT NOT NULL)")
        conn.execute("INSERT INTO forget_notes (at, note) VALUES (?, ?)", (time.time(), note))
        conn.execute("VACUUM")
        return True
    except sqlite3.OperationalError:
        # The disk (full, an I/O error) or a lock, not the copy: it may hold the words still, so the forget's
        # job waits for a pass that can rewrite it.
        raise
    except sqlite3.DatabaseError as exc:
        # Not a database, or a damaged one ("database disk image is malformed"): sqlite can take nothing out of
        # it, though a damaged copy's other pages may hold the words still.
        log.error("forget_backup_unreadable", path=str(path), error=str(exc)[:200])
        return False
    finally:
        conn.close()


def purge_backups(layout: Layout, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], note: str,
                  unreadable: list[Path] | None = None) -> int:
    """Every backup under `.os/`: older memory.db copies, v1's data and files. Returns how many changed; the copies
    sqlite will not take as a database (passed over: their other pages may hold the words still) are added to
    `unreadable`, for the operator to be told."""
    done = 0
    copies = [*layout.memory_dir.glob("memory.db.before-rebuild-*"), *(layout.os_dir / "backup").glob("*/agent.db")]
    for path in copies:
        if not path.is_file() or path.is_symlink():
            continue
        if _purge_copy(path, ids, sessions, hashes, note):
            for suffix in ("-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            done += 1
        elif unreadable is not None:
            unreadable.append(path)
    for md in _backup_files(layout):
        text = md.read_text(encoding="utf-8", errors="replace")
        if (kept := without(text, hashes, note)) != text:
            _rewrite(md, kept)
            done += 1
    for aside in layout.memory_dir.glob("index.*"):  # a recall index set aside (broken, or mid-swap): derived data
        if aside.is_dir() and not aside.is_symlink():
            shutil.rmtree(aside)  # a file the disk will not delete holds the words still: the job waits (OSError)
            done += 1
    return done
