"""Searching what memory has learned: any text in, plain search terms out, learnings ranked.

The user's words never reach FTS5 syntax: only runs of word characters survive,
and each is quoted as an FTS5 string, so operators, quotes, parentheses and
column filters in the input are inert. Learnings are ranked by BM25, or by the
rarity of the terms they contain when memory is large (see `search_learnings`),
so a natural question ("what date format does she like?") finds learnings that
share its meaningful words.
"""

from __future__ import annotations

import heapq
import math
import re
import sqlite3
from collections.abc import Sequence
from typing import Protocol

import msgspec

from ...database import marks

MAX_QUERY_CHARS = 2_000  # of input looked at; the rest of a huge query is ignored
MAX_TERMS = 12
MAX_TERM_CHARS = 64
MAX_LIMIT = 50
SEARCH_CANDIDATES = 300  # matches read per query term (see search_learnings)
BM25_MATCHES = 600  # up to this many matches in all, FTS5's bm25() ranks them

_WORD = re.compile(r"\w+")
# A learning a person forgot (memory/forget/learnings.py) is never found; the partial index keeps this cheap.
_NOT_FORGOTTEN = "rowid NOT IN (SELECT id FROM learnings WHERE forgotten_at IS NOT NULL)"
STOPWORDS = frozenset(
    """a about after again all also am an and any are as at be been before being but by can could did do
    does doing for from had has have having he her here hers him his how i if in into is it its just me
    more most my no nor not now of on once only or other our out over own same she should so some such
    than that the their them then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours""".split()
)


class HasConn(Protocol):
    """memory.db, as a MemoryDB or a bare connection's holder."""

    @property
    def conn(self) -> sqlite3.Connection: ...


class SearchHit(msgspec.Struct, frozen=True):
    id: int
    type: str
    content: str
    created_at: float
    confidence: float
    score: float  # higher is better


def search_terms(text: str) -> list[str]:
    """The words of `text` worth searching for: lowercase, stopwords dropped (unless
    nothing else is left), each at most 64 characters, at most 12."""
    words = [w.lower() for w in _WORD.findall(text[:MAX_QUERY_CHARS])]
    meaningful = [w for w in words if w not in STOPWORDS and len(w) > 1] or words
    return list(dict.fromkeys(w[:MAX_TERM_CHARS] for w in meaningful))[:MAX_TERMS]


def stems(text: str, drop: frozenset[str] = frozenset()) -> set[str]:
    """The search terms of `text` by their first five letters (a rough stem), those in `drop` left out."""
    return {w[:5] for w in search_terms(text)} - drop


def clamp_limit(limit: object) -> int:
    try:
        value = int(str(limit))
    except ValueError:
        return 10
    return max(1, min(MAX_LIMIT, value))


def search_learnings(db: HasConn, terms: Sequence[str], limit: int) -> list[SearchHit]:
    """Learnings matching any of `terms`, best first.

    When the terms match few learnings (the usual case), FTS5 ranks them by BM25. FTS5's
    bm25() costs time per match, though: it scans each term's doclist for IDF and scores
    every match (~6 us each), so one common term among a million learnings costs seconds
    (measured: 2.8 s for a term in 79% of rows). So each term first reads at most
    SEARCH_CANDIDATES matches, newest first; when any term has more, or all together more
    than BM25_MATCHES, learnings are ranked instead by the summed IDF of the terms they
    contain (newest first on ties): a rare term's matches are all read, a common term adds
    only its recent matches, with the little weight it deserves. Either way the cost is
    bounded. Terms must be plain words (search_terms makes them so); each is quoted.
    """
    conn, cap = db.conn, SEARCH_CANDIDATES
    matches: dict[str, list[int]] = {}
    for term in terms:
        found = [r for (r,) in conn.execute(
            f"SELECT rowid FROM learnings_fts WHERE learnings_fts MATCH ? AND {_NOT_FORGOTTEN} "
            "ORDER BY rowid DESC LIMIT ?", (f'"{term}"', cap + 1))]
        if found:
            matches[term] = found
    if not matches:
        return []
    if all(len(r) <= cap for r in matches.values()) and sum(map(len, matches.values())) <= BM25_MATCHES:
        best = [(rowid, -rank) for rowid, rank in conn.execute(
            f"SELECT rowid, rank FROM learnings_fts WHERE learnings_fts MATCH ? AND {_NOT_FORGOTTEN} "
            "ORDER BY rank LIMIT ?",
            (" OR ".join(f'"{t}"' for t in matches), limit))]
    else:
        top = conn.execute("SELECT max(rowid) FROM learnings").fetchone()[0] or 0
        best = _rank_by_idf(matches, top, limit)
    ids = [rowid for rowid, _ in best]
    found_rows = {row[0]: row for row in conn.execute(
        f"SELECT id, type, content, created_at, confidence FROM learnings WHERE id IN ({marks(ids)})", ids)}
    return [SearchHit(id=r[0], type=r[1], content=r[2], created_at=r[3], confidence=r[4], score=round(score, 4))
            for rowid, score in best if (r := found_rows.get(rowid)) is not None]


def _rank_by_idf(matches: dict[str, list[int]], top: int, limit: int) -> list[tuple[int, float]]:
    cap = SEARCH_CANDIDATES
    scores: dict[int, float] = {}
    for found in matches.values():
        # A common term's document count, estimated from how densely it matches recent rows.
        df = len(found) if len(found) <= cap else cap * top / max(1, top - found[cap - 1] + 1)
        idf = math.log(1 + (top - df + 0.5) / (df + 0.5))
        for rowid in found[:cap]:
            scores[rowid] = scores.get(rowid, 0.0) + idf
    return heapq.nlargest(limit, scores.items(), key=lambda kv: (kv[1], kv[0]))
