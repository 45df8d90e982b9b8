"""Words most memories hold only re-score what the other words find (common_words.py): the same
results as reading every posting, wherever that can be shown, and the whole query otherwise."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from sprite_os.memory.recall import common_words as cw
from sprite_os.memory.recall.index import (
    RecallIndex,
    Window,
    bm25_documents,
    doc_id,
    episode_doc,
    learning_doc,
)

DOCS = 3_000
EXACT = 1 << 62  # split_from out of reach: every posting read


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> RecallIndex:
    """DOCS turns and learnings: "dana" in every other one (and so in nearly every turn's neighbours),
    a few topic words in some, "zyzzyva" in three."""
    rng = random.Random(7)
    topics = ["garden", "piano", "ferry", "budget", "violin", "harbour", "orchid", "ledger"]
    filler = ["today", "nice", "went", "later", "call", "dinner", "weekend", "tired", "work", "coffee"]
    path = Path(tmp_path_factory.mktemp("common-words")) / "index"
    writer = RecallIndex(path, writable=True)
    texts = []
    for i in range(DOCS):
        words = rng.choices(filler, k=rng.randint(3, 12))
        if rng.random() < 0.3:
            words += rng.choices(topics, k=rng.randint(1, 3))
        if i % 2 == 0:
            words.append("Dana")
        if i in (11, 1_500, 2_999):
            words.append("zyzzyva")
        texts.append(" ".join(words))
    docs = []
    for i, text in enumerate(texts):
        at = 1_700_000_000 + i * 3_600.0
        if i % 3 == 2:
            docs.append(learning_doc(i, at, text))
        else:
            docs.append(episode_doc(i, at, text, " ".join(texts[max(0, i - 2):i] + texts[i + 1:i + 3])))
    writer.put(docs)
    writer.commit()
    writer.close()
    return RecallIndex(path)


def both_ways(index: RecallIndex, words: list[str], limit: int, window: Window | None = None
              ) -> tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]]:
    out = []
    for split_from in (0, EXACT):
        index.split_from = split_from
        out.append([(h.kind, h.id, h.score) for h in index.search(words, limit, window)])
    index.split_from = cw.SPLIT_FROM
    return out[0], out[1]


def same(split: list[tuple[str, int, float]], exact: list[tuple[str, int, float]]) -> None:
    assert [(k, i) for k, i, _ in split] == [(k, i) for k, i, _ in exact]
    assert [s for _, _, s in split] == pytest.approx([s for _, _, s in exact], rel=1e-5)


@pytest.fixture
def merges(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each search's split was kept (True) or the whole query ran instead (False)."""
    kept: list[bool] = []
    merged = cw.merged

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = merged(*args, **kwargs)
        kept.append(out is not None)
        return out

    monkeypatch.setattr(cw, "merged", spy)
    return kept


def test_exact_when_the_rare_words_find_fewer_than_the_pool(index: RecallIndex, merges: list[bool]) -> None:
    """"zyzzyva" is in three documents (and eight turns' neighbours): all eleven are re-scored, and the
    tenth beats any document "dana" alone could bring."""
    split, exact = both_ways(index, ["dana", "zyzzyva"], 10)
    assert merges == [True]
    same(split, exact)


def test_too_few_found_by_the_rare_words_runs_the_whole_query(index: RecallIndex, merges: list[bool]) -> None:
    """Twenty asked, eleven found by "zyzzyva": the rest are those "dana" alone brings, which only the
    whole query finds."""
    split, exact = both_ways(index, ["dana", "zyzzyva"], 20)
    assert merges == [False]
    same(split, exact)
    assert len(split) == 20


def exact_scores(index: RecallIndex, words: list[str], window: Window | None = None) -> dict[tuple[str, int], float]:
    index.split_from = EXACT
    scores = {(h.kind, h.id): h.score for h in index.search(words, DOCS, window)}
    index.split_from = cw.SPLIT_FROM
    return scores


@pytest.mark.parametrize("words", [["dana", "piano"], ["piano", "ferry", "dana"], ["dana", "garden", "orchid"]])
def test_a_full_pool_is_re_scored_exactly_and_keeps_most_of_bm25s_best(index: RecallIndex, merges: list[bool],
                                                                       words: list[str]) -> None:
    """More documents hold the rare words than the pool: what is found is scored as BM25 scores it, and
    most of BM25's best are found (a document just below the pool may be missed: measured at scale in
    docs/benchmarks.md)."""
    split, exact = both_ways(index, words, 10)
    assert merges == [True]
    scores = exact_scores(index, words)
    assert [s for _, _, s in split] == pytest.approx([scores[(k, i)] for k, i, _ in split], rel=1e-5)
    assert [s for _, _, s in split] == sorted((s for _, _, s in split), reverse=True)
    assert len({(k, i) for k, i, _ in split} & {(k, i) for k, i, _ in exact}) >= 8
    assert split[0][:2] == exact[0][:2]


def test_a_window_is_searched_the_same_way(index: RecallIndex, merges: list[bool]) -> None:
    window = Window(1_700_000_000 + 500 * 3_600.0, 1_700_000_000 + 2_000 * 3_600.0)
    split, exact = both_ways(index, ["dana", "piano", "budget"], 10, window)
    assert merges[0] is True  # the window's part was split
    inside = exact_scores(index, ["dana", "piano", "budget"], window)
    assert [s for _, _, s in split] == pytest.approx([inside[(k, i)] for k, i, _ in split], rel=1e-5)
    assert len({(k, i) for k, i, _ in split} & {(k, i) for k, i, _ in exact}) >= 8


def test_small_index_or_no_common_word_is_not_split() -> None:
    counts = {"dana": [(60_000, 90_000)], "piano": [(900, 3_000)], "ferry": [(800, 2_000)]}
    assert cw.split(["dana", "piano"], counts.__getitem__, 200_000, split_from=200_001) is None
    assert cw.split(["piano", "ferry"], counts.__getitem__, 200_000) is None
    assert cw.split(["dana"], counts.__getitem__, 200_000) is None  # nothing else to find candidates
    found = cw.split(["dana", "piano"], counts.__getitem__, 200_000)
    assert found is not None and (found.rare, found.common) == (["piano"], ["dana"])
    idf = math.log(1 + (200_000 - 60_000 + 0.5) / 60_000.5), math.log(1 + (200_000 - 90_000 + 0.5) / 90_000.5)
    assert found.most(200_000, 0.5) == pytest.approx(2.2 * (idf[0] + 0.5 * idf[1]) * cw.MARGIN)


def dana_bound(index: RecallIndex) -> tuple[float, float]:
    """The highest score of "dana" alone in the index, and the bound the split takes for it."""
    index.split_from = 0
    searcher = index.index.searcher()
    top = index.search(["dana"], 1)[0].score
    found = cw.split(["dana", "zyzzyva"], lambda w: index.frequencies(searcher, w), int(searcher.num_docs), 0)
    assert found is not None and found.common == ["dana"]
    hit = searcher.search(index.query_of(["dana"]), 1, count=False).hits[0][1]
    counted = bm25_documents(searcher, index.query_of(["dana"]), hit)
    assert counted is not None
    index.split_from = cw.SPLIT_FROM
    return top, found.most(counted, 0.5)


def test_most_score_bounds_what_the_index_gives(index: RecallIndex) -> None:
    """The bound holds against tantivy's own scores: no document scores above it for "dana" alone."""
    top, most = dana_bound(index)
    assert most / 4 < top <= most  # and is not loose beyond use


def test_the_bound_counts_deleted_documents_as_bm25_does(tmp_path: Path) -> None:
    """Replaced documents stay in their segment until a merge, and BM25 counts them: an IDF taken
    over the live documents alone is lower than the index's, and was no bound (negative here)."""
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, 1_700_000_000.0, "dana piano") for i in range(1_000))
    writer.commit()
    writer.put((learning_doc(1_000 + i, 1_700_000_000.0, "piano") for i in range(990)),
               replace=[doc_id("learning", i) for i in range(990)])  # 990 replaced: 10 name her still
    writer.commit()
    writer.close()
    index = RecallIndex(tmp_path / "index")
    searcher = index.index.searcher()
    assert int(searcher.num_docs) == 1_000 and int(searcher.doc_freq("text", "dana")) == 1_000  # deletes counted
    top, most = dana_bound(index)
    assert top <= most


def test_merged_keeps_only_what_no_unfound_document_can_beat() -> None:
    a, b, c = (0, 1), (0, 2), (1, 0)
    found = [(9.0, a), (8.0, b), (7.5, c)]
    assert cw.merged(found, {c: 2.0}, 2, most=3.0) == [(9.5, c), (9.0, a)]
    assert cw.merged([(9.0, c), (9.0, a)], {}, 2, most=3.0) == [(9.0, a), (9.0, c)]  # ties: tantivy's order
    assert cw.merged(found, {}, 3, most=7.5) is None  # the third is no better than a "dana"-only document
    assert cw.merged(found, {}, 4, most=1.0) is None  # too few found
