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

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace

import msgspec

from ...database import marks
from . import episodes as ep
from .dense import Embedder
from .index import Kind, RecallIndex, Window
from .learnings import search_learnings, search_terms
from .timeparse import When, time_cue
from .vectors import VectorReader

POOL = 50  # candidates each retriever hands to fusion
RRF_K = 10.0
DENSE_WEIGHT = 1.0
RECENCY = 0.5  # "now" questions: a hit from today gains up to half its score
RECENCY_DAYS = 365.0
SNIPPET_CHARS = 240
LEARNING_SNIPPET_CHARS = 600  # a learning is short: shown whole up to this


@dataclass(frozen=True)
class Candidate:
    kind: Kind
    id: int
    score: float
    at: float
    bm25: float | None = None
    cosine: float | None = None


class RecallHit(msgspec.Struct, frozen=True):
    kind: str  # episode | learning
    id: int  # an episode's observation id, or a learning's id
    score: float  # higher is better (fused: reciprocal-rank; lexical only: BM25)
    at: float  # the turn's date, or when the learning was made
    session_id: str | None  # the episode's session, or the session the learning came from
    turn: int | None  # 1-based turn within that session (for a learning, the turn it came from)
    observation_id: int | None  # the turn in transcript.db
    type: str  # EPISODE, or the learning's type (FACT, CORRECTION, SUMMARY...)
    snippet: str
    bm25: float | None = None
    cosine: float | None = None


# ---------------------------------------------------------------- ranking (pure)


def weighted_rrf(lists: Sequence[Sequence[Candidate]], weights: Sequence[float], k: float = RRF_K) -> list[Candidate]:
    """Fuse ranked lists: an item scores the sum of weight / (k + rank) over the lists it is in."""
    score: dict[tuple[str, int], float] = {}
    merged: dict[tuple[str, int], Candidate] = {}
    for ranked, weight in zip(lists, weights, strict=True):
        for rank, c in enumerate(ranked, 1):
            key = (c.kind, c.id)
            score[key] = score.get(key, 0.0) + weight / (k + rank)
            had = merged.get(key)
            merged[key] = c if had is None else replace(
                had, bm25=had.bm25 if had.bm25 is not None else c.bm25,
                cosine=had.cosine if had.cosine is not None else c.cosine)
    ordered = sorted(score.items(), key=lambda kv: -kv[1])
    return [replace(merged[key], score=s) for key, s in ordered]


def order_by_time(hits: Sequence[Candidate], when: When | None, current: bool, now: float) -> list[Candidate]:
    """Hits dated inside the period asked about first; for the current state, newer hits (never
    later than `now`) gain up to RECENCY of their score."""
    if when is not None:
        return sorted(hits, key=lambda h: (not when.start <= h.at <= when.end, -h.score))
    if not current:
        return list(hits)

    def boosted(h: Candidate) -> float:
        if h.at > now:
            return h.score
        return h.score * (1 + RECENCY * math.exp(-(now - h.at) / 86400 / RECENCY_DAYS))

    return sorted(hits, key=lambda h: -boosted(h))


def corrections_first(hits: Sequence[RecallHit], words: Sequence[str]) -> list[RecallHit]:
    """A CORRECTION moves just above the first higher-ranked, older learning it corrects: one that
    shares two of its words (by their first five letters, a rough stem), or one the query asked
    about. Nothing else moves."""
    out = list(hits)
    asked = {w[:5] for w in words}
    for hit in [h for h in hits if h.type == "CORRECTION"]:
        mine = _stems(hit.snippet)
        at = out.index(hit)
        for i, other in enumerate(out[:at]):
            shared = mine & _stems(other.snippet)
            if other.kind == "learning" and other.type != "CORRECTION" and other.at <= hit.at \
                    and (len(shared) >= 2 or shared & asked):
                out.insert(i, out.pop(at))
                break
    return out


def _stems(text: str) -> set[str]:
    return {w[:5] for w in search_terms(text)}


def snippet(text: str, words: Sequence[str], width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `text` around its first matching word, on one line."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    lower = flat.lower()
    at = min((i for w in words if (i := lower.find(w[:5])) >= 0), default=0)
    start = max(0, at - width // 3)
    piece = flat[start:start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


# ---------------------------------------------------------------- the search


@dataclass
class Dense:
    """The dense half: the query model and the episodes' vectors (a reader of the store, owned by the
    searcher's thread)."""

    embedder: Embedder
    vectors: VectorReader
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
        return corrections_first(hydrate(self.conn, ranked, words), words)[:limit]


def hydrate(conn: sqlite3.Connection, hits: Sequence[Candidate], words: Sequence[str]) -> list[RecallHit]:
    """What each hit shows, from memory.db. Forgotten learnings and turns, and rows gone since, are dropped."""
    episode_ids = [h.id for h in hits if h.kind == "episode"]
    learning_ids = [h.id for h in hits if h.kind == "learning"]
    episodes = ep.get(conn, episode_ids) if episode_ids else {}
    learnings = {r[0]: r for r in conn.execute(
        "SELECT l.id, l.session_id, l.source_observation_id, l.type, l.content, e.session_id, e.turn "
        "FROM learnings l LEFT JOIN episodes e ON e.id = l.source_observation_id "
        f"WHERE l.id IN ({marks(learning_ids)}) AND l.forgotten_at IS NULL", learning_ids)} if learning_ids else {}
    out = []
    for h in hits:
        if h.kind == "episode" and (e := episodes.get(h.id)) is not None and e.text:
            out.append(RecallHit(h.kind, h.id, h.score, h.at, e.session_id, e.turn, e.id, "EPISODE",
                                 snippet(e.text, words), h.bm25, h.cosine))
        elif h.kind == "learning" and (row := learnings.get(h.id)) is not None:
            _, session, source, kind, content, source_session, turn = row
            out.append(RecallHit(h.kind, h.id, h.score, h.at, session or source_session, turn, source, kind,
                                 snippet(content, words, LEARNING_SNIPPET_CHARS), h.bm25, h.cosine))
    return out
