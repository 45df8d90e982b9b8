"""Facts that change: a CORRECTION replaces the older learning it corrects.

When the curator records a CORRECTION ("The user's name is Daniela, not Dana"), the older
learning it corrects ("The user's name is Dana") is found and marked replaced
(`learnings.replaced_by`, `replaced_at`: schema step 6). A replaced learning leaves the boot
prompt's recent learnings, ranks just below its correction in every search and is never sent
by auto-recall; the correction shows "was: <old> until <date>", so where the change came from
stays visible. The row itself stays, like every learning; forgetting the correction brings the
old learning back (a replacement by a forgotten learning does not count).

Which learning a correction replaces is a pure policy (`corrected`): of the older learnings
that share its words, the one it covers best, if it shares at least two of that learning's
words and half of them (a correction restates what it corrects: same subject, new value).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from ..text import safe_text, utc
from .recall.learnings import search_learnings, search_terms, stems

MIN_SHARED = 2
MIN_COVERED = 0.5  # of the older learning's words
CANDIDATES = 20
NOT_REPLACEABLE = ("SUMMARY", "ACTION")  # a session's summary, a to-do: nothing a correction replaces
# Words nearly every learning has: sharing them says nothing about the subject.
GENERIC = frozenset({"user", "users", "perso", "prefe", "likes", "wants", "alway", "usual"})


class _Conn:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn


def corrected(correction: str, candidates: Sequence[tuple[int, str]]) -> int | None:
    """The id of the candidate (older learnings, best match first) that `correction` replaces, or None."""
    mine = stems(correction, GENERIC)
    best: tuple[float, int] | None = None
    for learning_id, content in candidates:
        theirs = stems(content, GENERIC)
        shared = len(mine & theirs)
        if not theirs or shared < MIN_SHARED or shared < MIN_COVERED * len(theirs):
            continue
        covered = shared / len(theirs)
        if best is None or covered > best[0]:
            best = (covered, learning_id)
    return best[1] if best else None


def link(conn: sqlite3.Connection, correction_id: int, content: str, at: float) -> int | None:
    """Mark the learning the new CORRECTION `correction_id` replaces; returns its id (None: none found)."""
    terms = search_terms(content)
    if not terms:
        return None
    found = [h.id for h in search_learnings(_Conn(conn), terms, CANDIDATES) if h.id != correction_id]
    if not found:
        return None
    rows = conn.execute(
        f"SELECT id, content FROM learnings WHERE id IN ({','.join('?' * len(found))}) AND id < ? "
        f"AND type NOT IN ({','.join('?' * len(NOT_REPLACEABLE))}) AND forgotten_at IS NULL "
        "AND replaced_by IS NULL", [*found, correction_id, *NOT_REPLACEABLE]).fetchall()
    order = {lid: i for i, lid in enumerate(found)}
    old = corrected(content, sorted(((int(r[0]), str(r[1])) for r in rows), key=lambda r: order[r[0]]))
    if old is not None:
        conn.execute("UPDATE learnings SET replaced_by = ?, replaced_at = ? WHERE id = ?", (correction_id, at, old))
    return old


def link_all(conn: sqlite3.Connection) -> int:
    """Link every CORRECTION not linked yet, oldest first (a database from before step 6)."""
    linked = 0
    for cid, content, at in conn.execute(
            "SELECT id, content, created_at FROM learnings WHERE type = 'CORRECTION' AND forgotten_at IS NULL "
            "AND id NOT IN (SELECT replaced_by FROM learnings WHERE replaced_by IS NOT NULL) ORDER BY id").fetchall():
        linked += link(conn, int(cid), str(content), float(at)) is not None
    return linked


def was(old: str, until: float) -> str:
    """What a correction shows of the learning it replaced."""
    return f"(was: {safe_text(' '.join(old.split()))} until {utc(until, '%Y-%m-%d')})"


def replaced_learnings(conn: sqlite3.Connection, correction_ids: Sequence[int]) -> dict[int, tuple[str, float]]:
    """For each correction among `correction_ids`: the content it replaced, and when."""
    if not correction_ids:
        return {}
    return {int(r[0]): (str(r[1]), float(r[2])) for r in conn.execute(
        f"SELECT replaced_by, content, replaced_at FROM learnings WHERE replaced_by IN "
        f"({','.join('?' * len(correction_ids))}) ORDER BY id", list(correction_ids))}


def replacements(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, int]:
    """For each learning among `ids` that a correction (not forgotten) replaced: that correction's id."""
    if not ids:
        return {}
    return {int(r[0]): int(r[1]) for r in conn.execute(
        f"SELECT l.id, l.replaced_by FROM learnings l JOIN learnings c ON c.id = l.replaced_by "
        f"WHERE l.id IN ({','.join('?' * len(ids))}) AND c.forgotten_at IS NULL", list(ids))}
