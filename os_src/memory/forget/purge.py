"""memory.db without the forgotten turns: their episodes' text and vectors, the learnings drawn from
them (and their sessions' summaries) with their actions, and no word of them in the audit."""

from __future__ import annotations

import sqlite3
from collections.abc import Container, Sequence
from dataclasses import dataclass

from ...database import checkpoint, marks, transaction
from ..memory_store import MemoryDB
from ..recall import episodes as ep
from ..transcript_store import Observation

AUDIT_REMOVED = "(its text was removed when a person forgot the turn it came from)"


@dataclass
class Purged:
    learning_ids: list[int]
    contents: list[str]  # what those drawn from the turns said, for finding the file lines written from them


def purge_memory(db: MemoryDB, turns: Sequence[Observation]) -> Purged:
    """Delete from memory.db what came from these turns: their episodes' text and vectors, the
    learnings cited from them and their sessions' summaries, those learnings' actions; the audit
    keeps no word of them. Returns which learnings were deleted."""
    ids, sessions = [o.id for o in turns], sorted({o.session_id for o in turns})
    # A turn not indexed yet gets its episode now, without text: the indexer may hold the turn as it was
    # read before the forget, and adding an episode leaves a known one as it is.
    ep.add(db.conn, [ep.wordless(o) for o in turns])
    with transaction(db.conn) as c:
        found = delete_drawn(c, ids, sessions)
    tidy(db.conn)
    # A session's summary goes too (it may repeat the turn), but it speaks of the session's other turns
    # as well: what it says is no sign of where a line came from.
    return Purged([lid for lid, _, _ in found], [content for _, content, kind in found if kind != "SUMMARY"])


def delete_drawn(conn: sqlite3.Connection, ids: Sequence[int], sessions: Sequence[str],
                 tables: Container[str] | None = None) -> list[tuple[int, str, str]]:
    """What a forget deletes from a copy of memory.db, the live one (`purge_memory`) or a backup
    (backups.py), one list for both: the episodes' text and vectors, the learnings cited from the
    turns and their sessions' summaries, those learnings' actions, and their words in the audit.
    `tables`: those the copy has (an older one may lack some); None: all. Returns the learnings
    deleted: id, content, type."""
    def has(table: str) -> bool:
        return tables is None or table in tables

    found: list[tuple[int, str, str]] = []
    if has("learnings"):
        found = conn.execute(
            f"SELECT id, content, type FROM learnings WHERE source_observation_id IN ({marks(ids)}) "
            f"OR (type = 'SUMMARY' AND session_id IN ({marks(sessions)}))", [*ids, *sessions]).fetchall()
    gone = [lid for lid, _, _ in found]
    if has("episodes"):
        conn.execute(f"UPDATE episodes SET text = '' WHERE id IN ({marks(ids)})", list(ids))
    if has("episode_vectors"):
        conn.execute(f"DELETE FROM episode_vectors WHERE id IN ({marks(ids)})", list(ids))
    if has("pending_actions"):
        conn.execute(f"DELETE FROM pending_actions WHERE source_learning_id IN ({marks(gone)})", gone)
    if has("memory_audit"):
        conn.execute(f"UPDATE memory_audit SET detail = ? WHERE learning_id IN ({marks(gone)})",
                     [AUDIT_REMOVED, *gone])
    if has("learnings"):
        conn.execute(f"DELETE FROM learnings WHERE id IN ({marks(gone)})", gone)
    return found


def tidy(conn: sqlite3.Connection) -> None:
    """After deleting words: the FTS index merged (its segments keep a deleted row's words until
    then), the WAL emptied."""
    conn.execute("INSERT INTO learnings_fts(learnings_fts) VALUES ('optimize')")
    checkpoint(conn)


def left_over(db: MemoryDB, ids: Sequence[int]) -> dict[int, list[str]]:
    """Of these forgotten turns, those memory.db still holds words of (a forget cut short by a kill, under
    the order of steps before the job went first): each one's episode text and its learnings' contents."""
    out: dict[int, list[str]] = {}
    for i in range(0, len(ids), 500):
        part = list(ids[i:i + 500])
        for oid, text in db.conn.execute(
                f"SELECT id, text FROM episodes WHERE text != '' AND id IN ({marks(part)})", part):
            out.setdefault(oid, []).append(text)
        for oid, content in db.conn.execute(
                f"SELECT source_observation_id, content FROM learnings WHERE type != 'SUMMARY' "
                f"AND source_observation_id IN ({marks(part)})", part):
            out.setdefault(oid, []).append(content)
    return out
