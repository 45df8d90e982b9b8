"""One search over everything memory holds: raw turns (episodes) and learnings, ranked together.

What `search_memory`, `sprite-os memory search`, the console and auto-recall all call.

1. The time cue ("last spring", "in March 2023", "now") is read off the query (timeparse).
2. Its words become plain search terms (search.search_terms): no query syntax survives.
3. The recall index ranks episodes and learnings together by BM25 (recall_index), the period
   asked about first.
4. If a dense retriever is loaded, it ranks episodes by meaning, and the two lists are fused by
   weighted reciprocal rank (k = 10, equal weights by default: measured best, docs/memory.md).
5. Hits in the period come first; for a question about the current state, newer hits gain.
6. memory.db says what each hit shows: kind, date, source (session and 1-based turn; for a
   learning, the turn it came from), a snippet. A forgotten learning is dropped here, whatever
   the index holds, and a CORRECTION moves above the learning it corrects.

The ranking steps are pure functions of their inputs and `now`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from ...database import marks
from .dense import Embedder, VectorIndex
from .hits import LEARNING_SNIPPET_CHARS, SNIPPET_CHARS, RecallHit, shown, snippet
from .index import RecallIndex, Window
from .learnings import search_learnings, search_terms
from .ranking import Candidate, order_by_time, weighted_rrf
from .timeparse import time_cue

__all__ = ["LEARNING_SNIPPET_CHARS", "SNIPPET_CHARS", "Candidate", "Dense", "RecallHit", "Searcher", "snippet"]

POOL = 50  # candidates each retriever hands to fusion
DENSE_WEIGHT = 1.0


# ---------------------------------------------------------------- the search


@dataclass
class Dense:
    """The dense half: the query model and the episodes' vectors (owned by the searcher's thread)."""

    embedder: Embedder
    vectors: VectorIndex
    weight: float = DENSE_WEIGHT

    def rank(self, query: str, limit: int) -> list[Candidate]:
        if not len(self.vectors) or not query.strip():
            return []
        found = self.vectors.search(self.embedder.query(query), limit)
        return [Candidate("episode", item, cos, at, cosine=cos) for item, cos, at in found]


class Searcher:
    """Searches one workspace's memory: memory.db (read), the recall index, the dense half if any.
    Without an index (none built yet) it finds learnings alone, by FTS5. Not thread-safe: one
    thread uses it (the server's recall thread, or the CLI)."""

    def __init__(self, conn: sqlite3.Connection, index: RecallIndex | None, dense: Dense | None = None) -> None:
        self.conn = conn
        self.index = index
        self.dense = dense

    def close(self) -> None:
        self.conn.close()

    def _lexical(self, words: list[str], limit: int, window: Window | None) -> list[Candidate]:
        if self.index is not None:
            return [Candidate(h.kind, h.id, h.score, h.at, bm25=h.score) for h in self.index.search(words, limit, window)]
        return [Candidate("learning", h.id, h.score, h.created_at, bm25=h.score)
                for h in search_learnings(self, words, limit)] if words else []

    def rank(self, query: str, now: float, limit: int, exclude_session: str | None = None,
             use_dense: bool = True) -> list[Candidate]:
        """The best `limit` memories for `query`, before hydration."""
        cue = time_cue(query[:2_000], now)
        words = search_terms(cue.rest)
        window = Window(cue.when.start, cue.when.end) if cue.when else None
        pool = POOL + (POOL if exclude_session else 0)
        lexical = self._lexical(words, pool, window)
        ranked = lexical
        if self.dense is not None and use_dense and self.index is not None:
            ranked = weighted_rrf([lexical, self.dense.rank(cue.rest[:2_000], pool)], [1.0, self.dense.weight])
        if exclude_session is not None:
            ranked = self._other_sessions(ranked, exclude_session)
        return order_by_time(ranked, cue.when, cue.current, now)[: limit * 2]  # room for what hydration drops

    def _anything_else(self, session_id: str) -> bool:
        """Does memory hold anything besides this session's turns?"""
        return bool(self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM learnings WHERE forgotten_at IS NULL) "
            "OR EXISTS (SELECT 1 FROM episodes WHERE session_id < ? OR session_id > ?)",
            (session_id, session_id)).fetchone()[0])

    def _other_sessions(self, ranked: list[Candidate], session_id: str) -> list[Candidate]:
        ids = [c.id for c in ranked if c.kind == "episode"]
        mine = {r for (r,) in self.conn.execute(
            f"SELECT id FROM episodes WHERE session_id = ? AND id IN ({marks(ids)})", [session_id, *ids])}
        return [c for c in ranked if not (c.kind == "episode" and c.id in mine)]

    def search(self, query: str, now: float, limit: int, exclude_session: str | None = None,
               use_dense: bool = True) -> list[RecallHit]:
        if exclude_session is not None and not self._anything_else(exclude_session):
            return []  # a first session: nothing to find, and no query to embed
        ranked = self.rank(query, now, limit, exclude_session, use_dense)
        words = search_terms(time_cue(query[:2_000], now).rest)
        return shown(self.conn, ranked, words)[:limit]
