"""Forgetting a learning, and undoing it.

A forgotten learning keeps its row (with `forgotten_at`), so the forgetting can be undone;
search, the boot prompt's recent learnings and its pending actions skip it, and the
curator extracting the same text again adds nothing (learnings are deduplicated on their
normalised text), so it does not come back. transcript.db is never touched: the turn the
learning came from stays as it was. `memory rebuild` carries forgotten learnings over.
Each forgetting and undo is a row in the audit (memory/audit.py).
"""

from __future__ import annotations

import sqlite3

from ...database import transaction
from ..audit import record
from ..memory_store import MemoryDB


def set_forgotten(db: MemoryDB, learning_id: int, forget: bool, now: float) -> float | None:
    """Forget (or remember again) a learning; returns its `forgotten_at` afterwards. Raises
    KeyError if there is no such learning. Only a change is recorded in the audit."""
    with transaction(db.conn) as c:
        row = c.execute("SELECT forgotten_at, type, content FROM learnings WHERE id = ?", (learning_id,)).fetchone()
        if row is None:
            raise KeyError(f"no learning #{learning_id}")
        was, kind, content = row
        if (was is not None) == forget:
            return None if was is None else float(was)
        stamp = now if forget else None
        c.execute("UPDATE learnings SET forgotten_at = ? WHERE id = ?", (stamp, learning_id))
        record(db, "forget" if forget else "unforget", now, learning_id=learning_id, detail=f"{kind}: {content}")
        return stamp


def forgotten_count(db: MemoryDB) -> int:
    return int(db.conn.execute("SELECT count(*) FROM learnings WHERE forgotten_at IS NOT NULL").fetchone()[0])


def forgotten_keys(conn: sqlite3.Connection) -> dict[str, float]:
    """content_key -> forgotten_at of the forgotten learnings in the memory.db open on `conn` (the
    rebuild's one read-only open of it; none if it has no learnings yet or is older than the
    forgetting). A memory.db that can't be read raises sqlite3.Error: "nothing was forgotten" would be
    a guess."""
    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # a damaged header raises only here
    columns = {row[1] for row in conn.execute("PRAGMA table_info(learnings)")}
    if "forgotten_at" not in columns:
        return {}
    found = conn.execute("SELECT content_key, forgotten_at FROM learnings WHERE forgotten_at IS NOT NULL")
    return {key: float(at) for key, at in found.fetchall()}


def forget_again(db: MemoryDB, keys: dict[str, float]) -> int:
    """After a rebuild: forget again what was forgotten before it (matched on normalised text)."""
    with transaction(db.conn) as c:
        return sum(c.execute("UPDATE learnings SET forgotten_at = ? WHERE content_key = ? AND forgotten_at IS NULL",
                             (at, key)).rowcount for key, at in keys.items())
