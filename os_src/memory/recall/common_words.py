"""Words most memories hold, searched the cheap way: they re-score what the other words find.

tantivy-py collects every search through a MultiCollector, which tantivy never prunes for, so a
query reads each of its words' whole posting lists. A word half the memories hold (the person's
partner, named in every other turn) costs a million postings a field at 1M + 1M, more than the rest
of a question costs, for the smallest part of any score (BM25's IDF of a word in half the documents
is 0.69, against 5 to 12 for a word that says what the question is about).

So in a large index a question's words in more than COMMON_SHARE of the documents are not searched
for (Elasticsearch's "common terms" query, done by hand): the other words find `rescored(limit)`
documents, and the common words' scores are added to those alone (one query, each common clause
intersected with their ids: a millisecond or so for a hundred, whatever the words' lists; index.py).

No document that only the common words match is ever left out: the `limit`-th result must score
above their bound (each common word's highest BM25, summed), or the whole query runs (`merged`
returns None). The order is exact BM25 when the other words matched fewer documents than
`rescored(limit)`, since all of them were re-scored; otherwise a document just below those can be
missed. Measured at 1M + 1M with a name in half the documents (docs/benchmarks.md): 98% of each
question's top 10 are exact BM25's, recall@10 0.496 against 0.497 (one question in 1,000), for a
quarter to a third less CPU at p95. Checking that edge too held for too few questions to gain anything.
Pure code: the index reads document frequencies and runs the queries (index.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

COMMON_SHARE = 0.2  # a word in more than a fifth of the documents only re-scores
SPLIT_FROM = 100_000  # documents; below, every posting is read (a millisecond at most) and BM25 is exact
RESCORED_PER_RESULT = 2  # documents the other words find, per result asked for
K1 = 1.2  # tantivy's BM25 term saturation: a word adds at most idf * (K1 + 1) in a field
MARGIN = 1.0001  # tantivy scores in single precision

# a word's document frequency in each field (text, context), for each of its index terms
Frequencies = Callable[[str], Sequence[tuple[int, int]]]
Address = tuple[int, int]  # a document's (segment, doc) in one searcher


@dataclass(frozen=True)
class Split:
    rare: list[str]  # searched for
    common: list[str]  # only re-score what `rare` finds
    common_frequencies: list[tuple[int, int]]  # the common words' terms' (text, context) document frequencies

    def bound(self, documents: int, context_boost: float) -> float:
        """The highest BM25 the common words can give a document together, with `documents` as BM25
        counts them (tantivy: every document of every segment, deleted ones not yet merged away too)."""
        return bound_of(self.common_frequencies, documents, context_boost) * MARGIN


def idf(frequency: int, documents: int) -> float:
    """tantivy's BM25 IDF."""
    return math.log(1 + (documents - frequency + 0.5) / (frequency + 0.5))


def bound_of(frequencies: Sequence[tuple[int, int]], documents: int, context_boost: float) -> float:
    """The highest BM25 terms with these (text, context) frequencies can add to a document."""
    return sum((K1 + 1) * (idf(t, documents) * (t > 0) + context_boost * idf(c, documents) * (c > 0))
               for t, c in frequencies)


def split(words: Sequence[str], frequencies: Frequencies, documents: int, split_from: int = SPLIT_FROM
          ) -> Split | None:
    """The common words of a question (among `documents`, the live ones: a threshold, not a score)
    apart from the rest; None when searching all of them is the way (an index under `split_from`
    documents, or no word common, or every word common). A word is common by its `text` frequency: its
    `context` one follows it (each turn's neighbours), four times over."""
    if documents < split_from:
        return None
    freq = {w: frequencies(w) for w in words}
    common = [w for w in words if any(t > COMMON_SHARE * documents for t, _ in freq[w])]
    if not common or len(common) == len(words):
        return None
    return Split([w for w in words if w not in common], common, [f for w in common for f in freq[w]])


def rescored(limit: int) -> int:
    """How many documents the other words find, and the common words re-score, for `limit` results."""
    return limit * RESCORED_PER_RESULT


def merged(found: Sequence[tuple[float, Address]], extra: dict[Address, float], limit: int, bound: float
           ) -> list[tuple[float, Address]] | None:
    """The best `limit` of `found` (score by the rare words, address), each with its common words'
    score from `extra` added, ties in address order as tantivy breaks them; None when a document the
    rare words did not find at all could be among them (the common words' `bound` is not below the
    result's last), or when they found too few."""
    scored = sorted(((score + extra.get(at, 0.0), at) for score, at in found), key=lambda s: (-s[0], s[1]))[:limit]
    if len(scored) < limit or scored[-1][0] <= bound:
        return None
    return scored
