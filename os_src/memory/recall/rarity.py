"""How specific a memory is: the words in it that few other memories have.

A question is answered by a turn that says something particular ("Oliver lent me The Ninth
Room"), rarely by chit-chat ("Oliver came over, we watched telly"). Both match "Oliver"; short
chit-chat even wins on BM25's length normalisation, and on meaning, where a short turn about a
person sits close to a short question about them. So the ranking weighs each memory up by how
many rare words the person said in it (`prior`): rare by the recall index's own document
frequencies, stemmed as the index stems them. Measured on the dialogue benchmark
(docs/benchmarks.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .index import RecallIndex, analyzer

RARE_IDF = 5.0  # a word is rare when at most 1 in e^5 (~150) memories have it
WEIGHT = 0.4  # each rare word adds this much to a memory's score, in proportion
MOST = 6  # rare words counted, at most
CACHE = 50_000  # document frequencies kept between searches (cleared when the index changes)


def prior(rare: int) -> float:
    """The factor a memory's score gets for `rare` rare words."""
    return 1.0 + WEIGHT * min(MOST, rare)


class Rarity:
    """Counts rare words against one recall index; owned by the searcher's thread."""

    def __init__(self, index: RecallIndex) -> None:
        self.index = index
        self._analyze = analyzer()
        self._df: dict[str, int] = {}
        self._generation = -1  # the index's, when `_df` was read (any change to it clears them)

    def held(self, words: Sequence[str]) -> bool:
        """Does any memory hold one of `words` (as the index stems them)?"""
        searcher = self.index.searcher()
        return any(searcher.doc_freq("text", token) > 0 for word in words for token in self._analyze.analyze(word))

    def counts(self, texts: list[str]) -> list[int]:
        """The rare words in each of `texts`."""
        searcher = self.index.searcher()
        docs = int(searcher.num_docs)
        if self.index.generation != self._generation or len(self._df) > CACHE:
            self._df, self._generation = {}, self.index.generation
        most = max(1.0, docs * math.exp(-RARE_IDF))
        out = []
        for text in texts:
            rare = 0
            for word in set(self._analyze.analyze(text)):
                df = self._df.get(word)
                if df is None:
                    df = self._df[word] = int(searcher.doc_freq("text", word))
                rare += df <= most
            out.append(rare)
        return out
