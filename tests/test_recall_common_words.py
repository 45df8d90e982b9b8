"""Words most memories hold only re-score what the other words find (common_words.py): the same
results as reading every posting, wherever that can be shown, and the whole query otherwise."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sprite_os.memory.recall import common_words as cw
from sprite_os.memory.recall.index import (
    WINDOW_SCORE,
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


@contextmanager
def searching(index: RecallIndex, split_from: int) -> Iterator[RecallIndex]:
    """`index` with its common words split from `split_from` documents (0: always; EXACT: never)."""
    index.split_from = split_from
    try:
        yield index
    finally:
        index.split_from = cw.SPLIT_FROM


def both_ways(index: RecallIndex, words: list[str], limit: int, window: Window | None = None
              ) -> tuple[list[tuple[str, int, float]], list[tuple[str, int, float]]]:
    out = []
    for split_from in (0, EXACT):
        with searching(index, split_from):
            out.append([(h.kind, h.id, h.score) for h in index.search(words, limit, window)])
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


def test_exact_when_the_rare_words_find_fewer_than_it_rescores(index: RecallIndex, merges: list[bool]) -> None:
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


def test_a_window_counts_in_the_bound(tmp_path: Path) -> None:
    """A question about a period: every match inside it gains WINDOW_SCORE, a document "anna" alone brings
    too, so the bound a result must beat is that much higher; without it, five of the six documents "zed"
    found (fewer than it re-scores: the exact case) came back, not the "anna" ones that outrank them."""
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, 1_700_000_000.0 + i, "anna " * 8 if i % 4 == 0 else "filler words here")
               for i in range(1_000))
    writer.put(learning_doc(2_000 + i, 1_700_000_100.0 + i, "zed " + "long " * 16) for i in range(6))
    writer.commit()
    writer.close()
    index = RecallIndex(tmp_path / "index")
    window = Window(1_700_000_000.0, 1_700_000_300.0)
    split, exact = both_ways(index, ["anna", "zed"], 5, window)
    assert all(i < 1_000 for _, i, _ in exact)  # "anna" alone, above any "zed"
    assert split == exact
    assert exact[0][2] == pytest.approx(dict(exact_pairs(index, ["anna"]))[("learning", exact[0][1])] + WINDOW_SCORE)


def exact_pairs(index: RecallIndex, words: list[str]) -> list[tuple[tuple[str, int], float]]:
    with searching(index, EXACT):
        return [((h.kind, h.id), h.score) for h in index.search(words, DOCS)]


def exact_scores(index: RecallIndex, words: list[str], window: Window | None = None) -> dict[tuple[str, int], float]:
    with searching(index, EXACT):
        return {(h.kind, h.id): h.score for h in index.search(words, DOCS, window)}


@pytest.mark.parametrize("words", [["dana", "piano"], ["piano", "ferry", "dana"], ["dana", "garden", "orchid"]])
def test_a_full_rescore_is_scored_exactly_and_keeps_most_of_bm25s_best(index: RecallIndex, merges: list[bool],
                                                                       words: list[str]) -> None:
    """More documents hold the rare words than it re-scores: what is found is scored as BM25 scores it,
    and most of BM25's best are found (a document just below those re-scored may be missed:
    measured at scale in docs/benchmarks.md)."""
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
    assert cw.split(["dana"], counts.__getitem__, 200_000) is None  # nothing else to find what to re-score
    found = cw.split(["dana", "piano"], counts.__getitem__, 200_000)
    assert found is not None and (found.rare, found.common) == (["piano"], ["dana"])
    idf = math.log(1 + (200_000 - 60_000 + 0.5) / 60_000.5), math.log(1 + (200_000 - 90_000 + 0.5) / 90_000.5)
    assert found.bound(200_000, 0.5) == pytest.approx(2.2 * (idf[0] + 0.5 * idf[1]) * cw.MARGIN)


def dana_bound(index: RecallIndex) -> tuple[float, float]:
    """The highest score of "dana" alone in the index, and the bound the split takes for it."""
    with searching(index, 0):
        searcher = index.index.searcher()
        top = index.search(["dana"], 1)[0].score
        found = cw.split(["dana", "zyzzyva"], lambda w: index.frequencies(searcher, w), int(searcher.num_docs), 0)
        assert found is not None and found.common == ["dana"]
        hit = searcher.search(index.query_of(["dana"]), 1, count=False).hits[0][1]
        counted = bm25_documents(searcher, index.query_of(["dana"]), hit)
        assert counted is not None
        return top, found.bound(counted, 0.5)


def test_the_bound_holds_against_what_the_index_gives(index: RecallIndex) -> None:
    """No document scores above it for "dana" alone, and it is not loose beyond use."""
    top, bound = dana_bound(index)
    assert bound / 4 < top <= bound


def test_the_bound_counts_deleted_documents_as_bm25_does(tmp_path: Path) -> None:
    """BM25 counts deleted documents until a merge. A bound over the live documents alone is too low: the
    split would accept the "piano" documents and miss the "dana"-only ones that outrank them."""
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, 1_700_000_000.0, "gone") for i in range(1_000))
    writer.put(learning_doc(1_000 + i, 1_700_000_000.0, "dana") for i in range(30))
    writer.put(learning_doc(2_000 + i, 1_700_000_000.0, "piano " + "long " * 6) for i in range(6))
    writer.commit()
    writer.put([], replace=[doc_id("learning", i) for i in range(1_000)])  # deleted, not yet merged away
    writer.commit()
    writer.close()
    index = RecallIndex(tmp_path / "index")
    assert int(index.index.searcher().num_docs) == 36
    split, exact = both_ways(index, ["dana", "piano"], 5)  # "piano" in 6 documents: rare among 36
    assert [i for _, i, _ in exact] == list(range(1_000, 1_005))  # "dana" alone, each above any "piano"
    assert split == exact


def test_merged_refuses_what_a_document_the_rare_words_did_not_find_could_beat() -> None:
    a, b, c = (0, 1), (0, 2), (1, 0)
    found = [(9.0, a), (8.0, b), (7.5, c)]
    assert cw.merged(found, {c: 2.0}, 2, bound=3.0) == [(9.5, c), (9.0, a)]
    assert cw.merged([(9.0, c), (9.0, a)], {}, 2, bound=3.0) == [(9.0, a), (9.0, c)]  # ties: tantivy's order
    assert cw.merged(found, {}, 3, bound=7.5) is None  # the third is no better than a "dana"-only document
    assert cw.merged(found, {}, 4, bound=1.0) is None  # too few found


def test_the_document_count_is_asked_once_while_the_index_does_not_change(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """tantivy's `explain` (a tenth of a millisecond) gives the count BM25 scores by: once per commit, not
    per search, nor per part of a question about a period; a commit (a forget then a capture: the same
    live count) asks again, since a new document counts there."""
    import sprite_os.memory.recall.index as index_module

    asked: list[int | None] = []
    counted = index_module.bm25_documents

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(counted(*args, **kwargs))
        return asked[-1]

    monkeypatch.setattr(index_module, "bm25_documents", spy)
    writer = RecallIndex(tmp_path / "index", writable=True)
    writer.put(learning_doc(i, 1_700_000_000.0 + i, "dana" if i % 2 else "filler") for i in range(200))
    writer.put(learning_doc(1_000 + i, 1_700_000_000.0 + i, "piano " + "long " * 6) for i in range(6))
    writer.commit()
    with searching(writer, 0):
        writer.search(["dana", "piano"], 3, Window(1_700_000_000.0, 1_700_000_100.0))
        writer.search(["dana", "piano"], 3)
        assert asked == [206]
        writer.put([learning_doc(2_000, 1_700_000_000.0, "piano")], replace=[doc_id("learning", 0)])
        writer.commit()
        writer.search(["dana", "piano"], 3)
        assert asked == [206, 207]
    writer.close()


@pytest.mark.parametrize("common", [["dana"], ["dana", "today"], ["dana", "nice_work"]])
def test_the_common_words_add_to_each_document_exactly_what_the_whole_query_adds(index: RecallIndex,
                                                                                 common: list[str]) -> None:
    """Each clause intersected with the documents' ids, then their union: to the last bit what the
    union of the words' clauses gives on the same documents (the sum in single precision, in the same
    order); a word the parser makes a phrase of, "nice_work", is re-scored by the parsed query itself."""
    import tantivy

    searcher = index.searcher()
    found = [a for _, a in searcher.search(index.query_of(["piano", "ferry"]), 150, count=False).hits]
    assert len(found) == 150
    ids = searcher.fast_field_values("id", found)
    only = tantivy.Query.const_score_query(tantivy.Query.term_set_query(index.index.schema, "id", ids), 0.0)
    union = tantivy.Query.boolean_query([(tantivy.Occur.Must, only), (tantivy.Occur.Should, index.query_of(common))])
    want = {(a.segment_ord, a.doc): s for s, a in searcher.search(union, len(found), count=False).hits if s}
    got = index._common_scores(searcher, ids, common)
    assert {k: v for k, v in got.items() if v} == want
