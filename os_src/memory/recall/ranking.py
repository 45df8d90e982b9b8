"""How recall ranks: pure functions of the retrievers' lists, the time cue and `now`.

- `weighted_rrf`: reciprocal-rank fusion of the word and meaning lists (k = 10).
- `order_by_time`: hits dated in the period asked about first; for the current state, newer
  hits gain (never one dated after `now`, never one with a date no calendar holds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ...dates import DAY, usable
from .index import Kind
from .timeparse import When

RRF_K = 10.0
NEIGHBOUR_SHARE = 0.1  # a turn gains this share of the score of the best turn found either side of it
RECENCY = 0.5  # "now" questions: a hit from today gains up to half its score
RECENCY_DAYS = 365.0


@dataclass(frozen=True)
class Candidate:
    kind: Kind
    id: int
    score: float
    at: float
    bm25: float | None = None
    cosine: float | None = None

    def scored(self, score: float) -> Candidate:
        """This memory with another score: what `dataclasses.replace` makes, at a fifth of its cost (a
        search weighs hundreds of candidates, on the agent's path)."""
        return Candidate(self.kind, self.id, score, self.at, self.bm25, self.cosine)

    def with_cosine(self, cosine: float | None) -> Candidate:
        return Candidate(self.kind, self.id, self.score, self.at, self.bm25, cosine)


def weighted_rrf(lists: Sequence[Sequence[Candidate]], weights: Sequence[float], k: float = RRF_K) -> list[Candidate]:
    """Fuse ranked lists: an item scores the sum of weight / (k + rank) over the lists it is in."""
    score: dict[tuple[str, int], float] = {}
    merged: dict[tuple[str, int], Candidate] = {}
    for ranked, weight in zip(lists, weights, strict=True):
        for rank, c in enumerate(ranked, 1):
            key = (c.kind, c.id)
            score[key] = score.get(key, 0.0) + weight / (k + rank)
            had = merged.get(key)
            merged[key] = c if had is None else Candidate(
                had.kind, had.id, had.score, had.at, had.bm25 if had.bm25 is not None else c.bm25,
                had.cosine if had.cosine is not None else c.cosine)
    ordered = sorted(score.items(), key=lambda kv: -kv[1])
    return [merged[key].scored(s) for key, s in ordered]


def order_by_time(hits: Sequence[Candidate], when: When | None, current: bool, now: float) -> list[Candidate]:
    """Hits dated inside the period asked about first; for the current state, newer hits (never
    later than `now`) gain up to RECENCY of their score."""
    if when is not None:
        return sorted(hits, key=lambda h: (not when.start <= h.at <= when.end, -h.score))
    if not current:
        return list(hits)

    def boosted(h: Candidate) -> float:
        if not usable(h.at) or h.at > now:
            return h.score
        return h.score * (1 + RECENCY * math.exp(-(now - h.at) / DAY / RECENCY_DAYS))

    return sorted(hits, key=lambda h: -boosted(h))


def fuse(lexical: Sequence[Candidate], dense: Sequence[Candidate], seen_by_meaning: Callable[[Candidate], bool],
         dense_weight: float = 1.0, k: float = RRF_K) -> list[Candidate]:
    """Weighted reciprocal-rank fusion of the word list and the meaning list, fair to a memory the
    meaning retriever cannot see (a turn not embedded yet, a learning): it counts as if meaning had
    ranked it where words did. `seen_by_meaning(c)`: `c` has a vector."""
    unseen = [c for c in lexical if not seen_by_meaning(c)]
    fused = weighted_rrf([lexical, dense], [1.0, dense_weight], k)
    if not unseen or not dense_weight:
        return fused
    place = {(c.kind, c.id): rank for rank, c in enumerate(lexical, 1)}
    bonus = {(c.kind, c.id): dense_weight / (k + place[(c.kind, c.id)]) for c in unseen}
    lifted = [c.scored(c.score + bonus.get((c.kind, c.id), 0.0)) for c in fused]
    return sorted(lifted, key=lambda c: -c.score)


class Keyed(Protocol):
    """A memory by its key: a Candidate or a hit."""

    @property
    def kind(self) -> str: ...
    @property
    def id(self) -> int: ...


K = TypeVar("K", bound=Keyed)


def never_below_words(ranked: Sequence[K], lexical: Sequence[K], seen_by_meaning: Callable[[K], bool],
                      left_out: Collection[tuple[str, int]] = ()) -> list[K]:
    """`ranked`, with each memory meaning cannot see moved up, if need be, to its place in `lexical`:
    a turn without a vector is never ranked below where word search alone would put it. One `ranked`
    lacks is brought in from `lexical` at that place, unless it is in `left_out` (a memory the caller
    dropped on purpose: an echo, a turn shown as the learning made from it)."""
    by_key: dict[tuple[str, int], K] = {}
    for c in ranked:
        by_key.setdefault((c.kind, c.id), c)
    ranked = list(by_key.values())  # each memory once, whatever a list held twice
    waiting: list[tuple[int, tuple[str, int]]] = []
    floored: set[tuple[str, int]] = set()
    for rank, c in enumerate(lexical, 1):
        key = (c.kind, c.id)
        if key not in floored and key not in left_out and not seen_by_meaning(c):
            waiting.append((rank, key))
            floored.add(key)
            by_key.setdefault(key, c)
    if not waiting:
        return ranked
    out: list[K] = []
    placed: set[tuple[str, int]] = set()
    i = 0
    while len(out) < len(by_key):
        while waiting and waiting[0][1] in placed:
            waiting.pop(0)
        if waiting and (waiting[0][0] <= len(out) + 1 or i == len(ranked)):
            key = waiting.pop(0)[1]
        else:
            key = (ranked[i].kind, ranked[i].id)
            i += 1
            if key in placed:
                continue
        out.append(by_key[key])
        placed.add(key)
    return out


def with_neighbours(ranked: Sequence[Candidate], places: Mapping[tuple[str, int], tuple[str, int]],
                    share: float = NEIGHBOUR_SHARE) -> list[Candidate]:
    """Each turn gains `share` of the score of the better of the turns just before and after it in its
    session, when they were found too: a fact told over two turns comes back whole more often.
    `places`: each episode's (session, turn)."""
    score: dict[tuple[str, int], float] = {(c.kind, c.id): c.score for c in ranked}
    at = {place: key for key, place in places.items()}

    def near(c: Candidate) -> float:
        if (place := places.get((c.kind, c.id))) is None:
            return 0.0
        session, turn = place
        return max((score.get(at.get((session, turn + d), ("", -1)), 0.0) for d in (-1, 1)), default=0.0)

    return sorted((c.scored(c.score + share * near(c)) for c in ranked), key=lambda c: -c.score)


def lifted(ranked: Sequence[Candidate], period: When, share: float) -> list[Candidate]:
    """Memories dated in `period` gain `share` of their score (a period placed by an uncertain event)."""
    return sorted((c.scored(c.score * (1 + share)) if period.start <= c.at <= period.end else c
                   for c in ranked), key=lambda c: -c.score)
