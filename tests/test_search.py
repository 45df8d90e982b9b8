"""search_memory: any string is safe; BM25 when matches are few; rare words first at scale; bounded cost."""

from pathlib import Path

import pytest

from sprite_os.memory.memory_store import MemoryDB, NewLearning
from sprite_os.memory.recall import learnings as search
from sprite_os.memory.recall.learnings import clamp_limit, search_learnings, search_terms

HOSTILE = ['"', '""', "'", "*", "AND", "OR NOT", "NEAR(a b)", "content:tea", "tea) OR (1=1", "^tea", "-tea",
           "tea*", "{content type}: tea", "\\", "\0", "; DROP TABLE learnings; --", "x" * 100_000, "🙂", "",
           "   ", "a", "the of and"]


@pytest.fixture
def db(tmp_path: Path) -> MemoryDB:
    m = MemoryDB(tmp_path / "m.db")
    m.commit_batch(trigger="t", observation_ids=[1], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                   file_updates={}, base_hashes={}, learnings=[
                       NewLearning("PREFERENCE", "Prefers green tea in the morning"),
                       NewLearning("FACT", "Tea shop is on Rue Mercière"),
                       NewLearning("CORRECTION", "Dates are DD/MM/YYYY, not MM/DD/YYYY"),
                       NewLearning("FACT", "Works as an accountant in Lyon")])
    return m


TEA = {"Prefers green tea in the morning", "Tea shop is on Rue Mercière"}
ALL = TEA | {"Dates are DD/MM/YYYY, not MM/DD/YYYY", "Works as an accountant in Lyon"}


@pytest.mark.parametrize("query", HOSTILE)
def test_any_string_is_safe(db: MemoryDB, query: str) -> None:
    terms = search_terms(query)
    assert len(terms) <= 12 and all(t.isalnum() or "_" in t for t in terms)
    hits = search_learnings(db, terms, 10)  # never an FTS5 syntax error
    assert isinstance(hits, list) and {h.content for h in hits} <= ALL
    assert {x.content for x in db.all_learnings()} == ALL  # nothing dropped or changed by any query
    assert {h.content for h in search_learnings(db, search_terms("tea"), 10)} == TEA  # and search still works after it


@pytest.mark.parametrize("query", ["tea*", "-tea", "^tea", "content:tea", "tea) OR (1=1", '"tea"', '"tea',
                                   "{content type}: tea", "NEAR(tea shop)", "tea AND NOT morning"])
def test_fts5_syntax_in_a_query_is_inert_and_the_words_still_match(db: MemoryDB, query: str) -> None:
    # Operators, prefixes, column filters and quotes are not applied: the word "tea" is searched
    # as itself, so both tea learnings are found (a NOT, a column filter or a prefix would change that).
    assert {h.content for h in search_learnings(db, search_terms(query), 10)} == TEA


def test_an_injection_attempt_leaves_every_learning_in_place(db: MemoryDB) -> None:
    assert search_learnings(db, search_terms("; DROP TABLE learnings; --"), 10) == []
    assert search_learnings(db, search_terms("x'); DELETE FROM learnings; --"), 10) == []
    assert {x.content for x in db.all_learnings()} == ALL
    assert db.conn.execute("SELECT count(*) FROM learnings_fts").fetchone()[0] == 4


def test_natural_questions_find_the_relevant_learning(db: MemoryDB) -> None:
    hits = search_learnings(db, search_terms("what kind of tea does she prefer?"), 10)
    assert [h.content for h in hits] == ["Prefers green tea in the morning",  # two matching terms beat one
                                         "Tea shop is on Rue Mercière"]
    assert hits[0].score > hits[1].score
    # Porter stemming: "date" finds "Dates".
    assert [h.type for h in search_learnings(db, search_terms("date format"), 10)] == ["CORRECTION"]


def test_limit_is_clamped() -> None:
    assert (clamp_limit(0), clamp_limit(500), clamp_limit("7"), clamp_limit(None)) == (1, 50, 7, 10)


def test_rare_terms_outrank_common_ones_and_cost_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "SEARCH_CANDIDATES", 5)
    m = MemoryDB(tmp_path / "m.db")
    learnings = [NewLearning("FACT", f"user note number {n}") for n in range(50)]
    learnings.insert(3, NewLearning("FACT", "user keeps the spare key under the blue flowerpot"))
    m.commit_batch(trigger="t", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                   file_updates={}, base_hashes={}, learnings=learnings)
    queries: list[str] = []
    m.conn.set_trace_callback(queries.append)
    hits = search_learnings(m, search_terms("where does the user keep the flowerpot"), 3)
    m.conn.set_trace_callback(None)
    # "flowerpot" is rare, so the old learning that has it wins over 50 recent "user" notes.
    assert hits[0].content == "user keeps the spare key under the blue flowerpot"
    assert all("LIMIT 6" in q for q in queries if "MATCH" in q)  # each term reads at most cap + 1 rows
    assert not any("rank" in q for q in queries)  # a common term: ranked without FTS5's bm25()


def test_few_matches_are_ranked_by_fts5_bm25(db: MemoryDB) -> None:
    queries: list[str] = []
    db.conn.set_trace_callback(queries.append)
    hits = search_learnings(db, search_terms("green tea"), 10)
    db.conn.set_trace_callback(None)
    assert any("ORDER BY rank" in q for q in queries)
    assert hits[0].content == "Prefers green tea in the morning" and hits[0].score > hits[1].score
