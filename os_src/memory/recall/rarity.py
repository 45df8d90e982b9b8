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
import sys
from collections.abc import Sequence

import tantivy

from .index import RecallIndex, analyzer

RARE_IDF = 5.0  # a word is rare when at most 1 in e^5 (~150) memories have it
WEIGHT = 0.4  # each rare word adds this much to a memory's score, in proportion
MOST = 6  # rare words counted, at most
CACHE = 50_000  # document frequencies kept between searches (cleared when the index changes)
# Memories' counts kept between searches, by their text: at most this many bytes, each text's own size
# (sys.getsizeof: 1 to 4 bytes a character, as the text needs, and its header) and ENTRY_BYTES for its slot.
COUNTED_BYTES = 4_000_000
ENTRY_BYTES = 64  # an entry's dict slot and index, about


def prior(rare: int) -> float:
    """The factor a memory's score gets for `rare` rare words."""
    return 1.0 + WEIGHT * min(MOST, rare)


class Rarity:
    """Counts rare words against one recall index; owned by the searcher's thread."""

    def __init__(self, index: RecallIndex) -> None:
        self.index = index
        self._analyze = analyzer()
        self._seen: set[str] = set()  # words whose document frequency was read from `_of`
        self._rare: set[str] = set()  # those of them that are rare
        self._counted: dict[str, int] = {}  # each text's count, while `_of` is the index's searcher
        self._held = 0  # bytes that `_counted` holds, as COUNTED_BYTES counts them
        self._of: tantivy.Searcher | None = None  # the index's searcher then (a new one when it changes)

    @property
    def kept_bytes(self) -> int:
        """The bytes the counts kept between searches hold, as COUNTED_BYTES counts them (at most that)."""
        return sum(sys.getsizeof(text) + ENTRY_BYTES for text in self._counted)

    def held(self, words: Sequence[str]) -> bool:
        """Does any memory hold one of `words` (as the index stems them)?"""
        searcher = self.index.searcher()
        return any(searcher.doc_freq("text", token) > 0 for word in words for token in self._analyze.analyze(word))

    def counts(self, texts: list[str]) -> list[int]:
        """The rare words in each of `texts` (what is known is counted by set operations: a search's
        fifty memories hold a thousand distinct words, most of them looked up before). A text counted
        before against the same searcher is not analysed again: the next search, and auto-recall's
        beside search_memory's, find many of the same memories. Kept by the text itself, so a memory
        whose words memory.db changed is counted anew whatever the index says."""
        searcher = self.index.searcher()
        if searcher is not self._of or len(self._seen) > CACHE:
            self._seen, self._rare, self._counted, self._held, self._of = set(), set(), {}, 0, searcher
        most = max(1.0, int(searcher.num_docs) * math.exp(-RARE_IDF))
        out = []
        for text in texts:
            if (known := self._counted.get(text)) is not None:
                out.append(known)
                continue
            words = set(self._analyze.analyze(text))
            for word in words - self._seen:
                self._seen.add(word)
                if searcher.doc_freq("text", word) <= most:
                    self._rare.add(word)
            size = sys.getsizeof(text) + ENTRY_BYTES
            if self._held + size > COUNTED_BYTES:
                self._counted, self._held = {}, 0
            self._held += size
            out.append(self._counted.setdefault(text, len(words & self._rare)))
        return out
