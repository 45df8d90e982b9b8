"""One search over everything memory holds: raw turns (episodes) and learnings, ranked together.

What `search_memory`, `sprite-os memory search`, the console and auto-recall all call.

1. The time cue ("last spring", "in March 2023", "now") is read off the query (timeparse).
2. Its words become plain search terms (search.search_terms): no query syntax survives.
3. The recall index ranks episodes and learnings together by BM25 (recall_index), the period
   asked about first.
4. If a dense retriever is loaded, it ranks episodes by meaning (the query is embedded on a thread of
   its own while words are searched), and the two lists are fused by
   weighted reciprocal rank (k = 10; by default the dense list weighs 1.2, the lexical list 1: docs/memory.md).
5. Hits in the period come first; for a question about the current state, newer hits gain.
6. memory.db says what each hit shows: kind, date, source (session and 1-based turn; for a
   learning, the turn it came from), a snippet. A forgotten learning is dropped here, whatever
   the index holds, and a CORRECTION moves above the learning it corrects.

The ranking steps are pure functions of their inputs and `now`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import msgspec

from ...config import DEFAULT_DENSE_WEIGHT
from ...database import marks
from . import episodes as ep
from .dense import Embedder
from .hits import (
    LEARNING_SNIPPET_CHARS,
    SNIPPET_CHARS,
    RecallHit,
    Rows,
    memory_texts,
    shown,
    snippet,
)
from .index import RecallIndex, Window
from .learnings import MAX_QUERY_CHARS, search_learnings, search_terms
from .ranking import (
    Candidate,
    Keyed,
    fuse,
    lifted,
    never_below_words,
    order_by_time,
    with_neighbours,
)
from .rarity import Rarity, prior
from .timeparse import anchor_cue, time_cue
from .vectors import Matrix, VectorReader

__all__ = ["LEARNING_SNIPPET_CHARS", "SNIPPET_CHARS", "Candidate", "Dense", "RecallHit", "Searcher", "snippet"]

POOL = 50  # candidates each retriever hands to fusion
# The spread: the nearest memory's cosine above this nearest's. auto.py's gate weights were fitted with 50:
# a literal, so that a change of POOL does not move a fitted input.
SPREAD_RANK = 50
ANCHOR_LIFT = 0.3  # a memory in the period another event places gains this share of its score
# Queries begun before their search asks, at most: as many messages as may wait for the agent (protocol's
# MAX_QUEUED_MESSAGES, which memory may not import: a test ties the two). They run first come, first served,
# so a smaller cap gave up the next one's vector first and made it again; each kept is 1.5 KB.
EXPECTED = 16


# ---------------------------------------------------------------- the search


@dataclass
class Dense:
    """The dense half: the query model and the episodes' vectors (a reader of the store, owned by the
    searcher's thread). The query model runs on a thread of its own, one query at a time (`ask`); a
    query may be begun early, from any thread (`expect`), and the search that asks for it then takes
    its vector (the engine makes the same vector for the same text, whenever it is made)."""

    embedder: Embedder
    vectors: VectorReader
    weight: float = DEFAULT_DENSE_WEIGHT
    _thread: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)
    _expected: OrderedDict[str, Future[Matrix]] = field(default_factory=OrderedDict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    def _embed(self, text: str) -> Future[Matrix]:  # under the lock
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="recall-query")
        return self._thread.submit(self.embedder.query, text)

    def expect(self, text: str) -> None:
        """Begin embedding `text` now, for a search that will ask for it soon (auto-recall's, begun as a
        message arrives: the vector is made while the turn starts). At most EXPECTED are kept, the
        oldest given up first. Any thread may call this."""
        with self._lock:
            if self._closed or not text.strip() or text in self._expected:
                return
            self._expected[text] = self._embed(text)
            while len(self._expected) > EXPECTED:
                self._expected.popitem(last=False)[1].cancel()

    def ask(self, query: str) -> Future[Matrix] | None:
        """The query's embedding, begun at once on the query model's thread (or earlier, by `expect`): the
        engine releases the GIL, so word search runs beside it (on a second core) and a search takes the
        longer of the two, not their sum. None when there is nothing to look for. Wait for it (`look`,
        or `settled`) before asking again: the model serves one query at a time."""
        if not len(self.vectors) or not query.strip():
            return None
        with self._lock:
            return self._expected.pop(query, None) or self._embed(query)

    def look(self, asked: Future[Matrix] | None, limit: int, also: Sequence[int], window: Window | None = None
             ) -> tuple[list[Candidate], dict[int, float]]:
        """The `limit` nearest episodes to the query `asked` (dated in `window`, if given), and the cosine
        of each episode among `also` that has a vector (one missing from it has none yet)."""
        if asked is None:
            return [], {}
        vector = asked.result()
        found = self.vectors.search(vector, limit, (window.start, window.end) if window else None)
        return ([Candidate("episode", item, cos, at, cosine=cos) for item, cos, at in found],
                self.vectors.similarities(vector, also))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for waiting in self._expected.values():
                waiting.cancel()
            self._expected.clear()
        if self._thread is not None:
            self._thread.shutdown()


def embedded(query: str, now: float) -> str:
    """What of `query` a search embeds, at `now`: its words without the time cue (Searcher.rank)."""
    return time_cue(query[:MAX_QUERY_CHARS], now).rest


def settled(asked: Future[Matrix] | None) -> None:
    """An embedding no longer wanted (the search failed before it was looked at) cancelled, or waited for:
    the query model is never left busy for the next search."""
    if asked is not None and not asked.cancel():
        wait([asked])


@dataclass(frozen=True)
class Ranked:
    """A search's memories, best first, before hydration; `words_alone`: word search alone's (None when
    meaning had no say); `seen(m)`: meaning can see `m` (it has a vector); `asked`: the query without
    its time cue."""

    ranked: list[Candidate]
    words_alone: list[Candidate] | None
    seen: Callable[[Keyed], bool]
    asked: str


@dataclass(frozen=True)
class Weights:
    """What weighs a search's memories, worked out once for both lists (fused, and word search alone)."""

    prior: dict[tuple[str, int], float]
    places: dict[tuple[str, int], tuple[str, int]]


def _first(ranked: list[Candidate], event: Candidate | None) -> list[Candidate]:
    """`ranked` with `event` (the memory that told of the event a period was placed by) first."""
    if event is None:
        return ranked
    return [event, *(c for c in ranked if (c.kind, c.id) != (event.kind, event.id))]


def _fused_scores(hits: list[RecallHit], fused: set[tuple[str, int]], seen: Callable[[Keyed], bool]
                  ) -> list[RecallHit]:
    """Scores that never rise down the list, after the floor: a hit it brought in from word search alone
    (a BM25 score) takes the fused score of the hit it went above, so that every score is of one kind;
    a hit it moved up (meaning can't see it) takes at least that score. One pass from the bottom up."""
    out = list(hits)
    for i in range(len(out) - 1, -1, -1):
        below = out[i + 1].score if i + 1 < len(out) else 0.0
        if (out[i].kind, out[i].id) not in fused:
            out[i] = msgspec.structs.replace(out[i], score=below)
        elif out[i].score < below and not seen(out[i]):
            out[i] = msgspec.structs.replace(out[i], score=below)
    return out


def spread(nearest: Sequence[Candidate]) -> float | None:
    """How far the nearest memory stands out: its cosine above the SPREAD_RANK-th nearest's (the
    last's, in a smaller memory). None without meaning's list."""
    cosines = [c.cosine for c in nearest[:SPREAD_RANK] if c.cosine is not None]
    return cosines[0] - cosines[-1] if cosines else None


class Searcher:
    """Searches one workspace's memory: memory.db (read), the recall index, the dense half if any.
    Without an index (none built yet) it finds learnings alone, by FTS5. Not thread-safe: one
    thread uses it (the server's recall thread, or the CLI)."""

    def __init__(self, conn: sqlite3.Connection, index: RecallIndex | None, dense: Dense | None = None) -> None:
        self.conn = conn
        self.index = index
        self.dense = dense
        self.rarity = Rarity(index) if index is not None else None
        # off: fusion and the time cue alone, without the specificity prior, the neighbours' share and the
        # period another event places (the benchmark measures them side by side)
        self.policies = True
        self.spread: float | None = None  # the last search's (auto.Cues), None when meaning had no say
        self._recorded = ep.records_embedded_after(conn)  # which turn each vector was made after (lending)

    def known(self, words: Sequence[str]) -> bool:
        """Does any memory hold one of `words`?"""
        return self.rarity is not None and self.rarity.held(words)

    def close(self) -> None:
        if self.dense is not None:
            self.dense.close()
        self.conn.close()

    def _lexical(self, words: list[str], limit: int, window: Window | None) -> list[Candidate]:
        if self.index is not None:
            return [Candidate(h.kind, h.id, h.score, h.at, bm25=h.score) for h in self.index.search(words, limit, window)]
        return [Candidate("learning", h.id, h.score, h.created_at, bm25=h.score)
                for h in search_learnings(self, words, limit)] if words else []

    def rank(self, query: str, now: float, limit: int, exclude_session: str | None = None,
             use_dense: bool = True, *, rows: Rows) -> Ranked:
        """The best `limit` memories for `query`, before hydration; beside them, when meaning had a
        say, word search alone's ranking of the same query, made the same way (the floor). `rows`: what
        memory.db holds of them, read once for the search (hydration reads the same rows)."""
        cue = time_cue(query[:MAX_QUERY_CHARS], now)
        period = cue.when
        window = Window(period.start, period.end) if period else None
        ranked, words_alone, seen, self.spread = self._retrieve_all(cue.rest, window, use_dense, exclude_session,
                                                                    rows)
        lists = [ranked] if words_alone is None else [ranked, words_alone]
        events: list[Candidate | None] = [None] * len(lists)
        if period is None and self.policies and (anchor := anchor_cue(cue.rest)) is not None:
            # "the week before my sister's wedding": the wedding's turn dates the week. Which turn that is
            # may be wrong, so the week's memories gain rather than come first, and the turn itself leads.
            # Word search alone finds the event by its own lights, as a search by words alone does.
            told_fused, told_words, _, _ = self._retrieve_all(anchor.event, None, use_dense, exclude_session, rows)
            for i, told in enumerate([told_fused, told_words or []][: len(lists)]):
                if told:
                    events[i] = told[0]
                    lists[i] = lifted(lists[i], anchor.window(told[0].at), ANCHOR_LIFT)
        lists = [_first(order_by_time(found, period, cue.current, now), event)[: limit * 2]  # room for hydration
                 for found, event in zip(lists, events, strict=True)]
        return Ranked(lists[0], lists[1] if len(lists) > 1 else None, seen, cue.rest)

    def _retrieve_all(self, text: str, window: Window | None, use_dense: bool, exclude_session: str | None,
                      rows: Rows) -> tuple[list[Candidate], list[Candidate] | None, Callable[[Keyed], bool], float | None]:
        """Words and meaning, fused and weighed by how specific each memory is; what words alone found
        (None when meaning had no say), and whether meaning can see a memory, for the floor; the spread."""
        pool = POOL + (POOL if exclude_session else 0)
        by_meaning = self.dense is not None and use_dense and self.index is not None
        asked = self.dense.ask(text) if self.dense is not None and by_meaning else None
        try:
            lexical = self._lexical(search_terms(text), pool, window)
            known = self._weights(rows, lexical)  # while the query is embedded: each memory's weight is its own
            if asked is not None and self.dense is not None:
                self.dense.vectors.warm()  # and the vectors the scan will read, made single precision
            dense: list[Candidate] = []
            cosines: dict[int, float] = {}
            if self.dense is not None and by_meaning:
                dense, cosines = self.dense.look(asked, pool, [c.id for c in lexical if c.kind == "episode"], window)
                lexical = [c.with_cosine(cosines.get(c.id)) if c.kind == "episode" else c for c in lexical]
        finally:
            settled(asked)
        vectors = {c.id for c in dense} | set(cosines)
        meaning = bool(dense)
        lent = self._lent(dense, self.dense.vectors) if dense and self.dense is not None else dense
        placed = {c.id for c in lent}

        def seen(c: Keyed) -> bool:  # without meaning there is nothing to be fair about
            return not meaning or (c.kind == "episode" and c.id in vectors)

        def ranked_by_meaning(c: Keyed) -> bool:  # its own vector, or the one that holds its words
            return seen(c) or (c.kind == "episode" and c.id in placed)

        ranked = fuse(lexical, lent, ranked_by_meaning, self.dense.weight if self.dense is not None else 1.0) \
            if meaning else list(lexical)
        weights = self._weights(rows, ranked, known)  # of every memory found: word search's are among them
        ranked = self._weighed(ranked, weights)
        # the floor is word search alone as it ranks on its own: weighed the same way
        words = self._weighed(lexical, weights) if meaning else None
        if exclude_session is not None:  # the spread too: the current session's turns say nothing of memory
            ranked = self._other_sessions(ranked, exclude_session)
            words = self._other_sessions(words, exclude_session) if words is not None else None
            dense = self._other_sessions(dense, exclude_session)
        return ranked, words, seen, spread(dense)  # the spread: of the vectors themselves, none lent

    def _lent(self, nearest: list[Candidate], vectors: VectorReader) -> list[Candidate]:
        """Meaning's list, each turn without a vector yet placed just after the turn that follows it in
        its session, when that one has a vector: what the person said is embedded with the turn after
        it (episodes.embed_text), so that vector holds these words too. The backlog embeds every other
        turn first (indexer.py), so that half-way through, every turn's words are in some vector."""
        before = ep.turns_before(self.conn, [c.id for c in nearest if c.kind == "episode"], self._recorded)
        wanted = [b for b, _ in before.values()]
        if not wanted:
            return nearest
        lacking = {b for b, has in zip(wanted, vectors.has(wanted), strict=True) if not has}
        out: list[Candidate] = []
        taken = {c.id for c in nearest}
        for c in nearest:
            out.append(c)
            if (b := before.get(c.id)) is not None and b[0] in lacking and b[0] not in taken:
                taken.add(b[0])
                out.append(Candidate("episode", b[0], c.score, b[1]))  # its own cosine is not known
        return out

    def _weights(self, rows: Rows, ranked: list[Candidate], known: Weights | None = None) -> Weights | None:
        """How specific each memory is (its prior: rarity.py) and where an episode sits in its session;
        None when the policies are off. Those in `known` are not looked up again."""
        if self.rarity is None or not self.policies or not ranked:
            return known
        if known is not None:
            ranked = [c for c in ranked if (c.kind, c.id) not in known.prior]
            if not ranked:
                return known
        said = memory_texts(rows, ranked)
        rare = self.rarity.counts([said[(c.kind, c.id)].text if (c.kind, c.id) in said else "" for c in ranked])
        prior_of: dict[tuple[str, int], float] = {(c.kind, c.id): prior(n) for c, n in zip(ranked, rare, strict=True)}
        places = {key: s.place for key, s in said.items() if s.place is not None}
        if known is None:
            return Weights(prior_of, places)
        return Weights(known.prior | prior_of, known.places | places)

    @staticmethod
    def _weighed(ranked: list[Candidate], weights: Weights | None) -> list[Candidate]:
        """Each memory's score times its prior, then a share of the best of the turns either side of it
        (ranking.with_neighbours)."""
        if weights is None or not ranked:
            return ranked
        weighed = [c.scored(c.score * weights.prior[(c.kind, c.id)]) for c in ranked]
        return with_neighbours(weighed, weights.places)

    def _anything_else(self, session_id: str) -> bool:
        """Does memory hold anything besides this session's turns?"""
        return bool(self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM learnings WHERE forgotten_at IS NULL) "
            "OR EXISTS (SELECT 1 FROM episodes WHERE session_id < ? OR session_id > ?)",
            (session_id, session_id)).fetchone()[0])

    def _other_sessions(self, ranked: Sequence[Candidate], session_id: str) -> list[Candidate]:
        ids = [c.id for c in ranked if c.kind == "episode"]
        mine = {r for (r,) in self.conn.execute(
            f"SELECT id FROM episodes WHERE session_id = ? AND id IN ({marks(ids)})", [session_id, *ids])}
        return [c for c in ranked if not (c.kind == "episode" and c.id in mine)]

    def search(self, query: str, now: float, limit: int, exclude_session: str | None = None,
               use_dense: bool = True, worth: Callable[[float], bool] | None = None) -> list[RecallHit]:
        """The best `limit` memories for `query`, as hits. `worth(best)`: whether hits whose best BM25 is
        `best` could be shown at all (auto-recall's gate, which may read `self.spread`); when not, no hit
        is read from memory.db and there are none. No hit scores above its candidates' best."""
        self.spread = None
        if exclude_session is not None and not self._anything_else(exclude_session):
            return []  # a first session: nothing to find, and no query to embed
        rows = Rows(self.conn)  # memory.db's rows of what is found, read once: for weighing, then hydration
        found = self.rank(query, now, limit, exclude_session, use_dense, rows=rows)
        if worth is not None and not worth(max((c.bm25 for c in [*found.ranked, *(found.words_alone or [])]
                                                if c.bm25 is not None), default=0.0)):
            return []  # most messages ask nothing of memory: what would be dropped is never hydrated
        rows.recheck()  # a forget since the weighing read its rows, once for both lists hydrated
        words = search_terms(found.asked)
        said: dict[str, set[str]] = {}  # the stems of what memories say: the floor's list holds most of them too
        hits = shown(rows, found.ranked, words, said)
        if found.words_alone is not None:
            # The floor is taken on what is shown, after hydration made each list's hits: a memory
            # hydration left out on purpose (an echo, a turn shown as its learning) stays out.
            kept = {(h.kind, h.id) for h in hits}
            dropped = {(c.kind, c.id) for c in found.ranked} - kept
            floored = never_below_words(hits, shown(rows, found.words_alone, words, said), found.seen,
                                        dropped)
            hits = _fused_scores(floored, kept, found.seen)
        return hits[:limit]
