"""search_memory's input handling: any string is safe, ranked by BM25."""

from pathlib import Path

import pytest

from sprite_os.database import MemoryDB, NewLearning
from sprite_os.memory.search import clamp_limit, fts_query

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


@pytest.mark.parametrize("query", HOSTILE)
def test_any_string_is_safe(db: MemoryDB, query: str) -> None:
    match = fts_query(query)
    hits = db.search(match, 10) if match else []
    assert isinstance(hits, list)
    if match:
        assert all(part.startswith('"') and part.endswith('"') for part in match.split(" OR "))


def test_natural_questions_find_the_relevant_learning(db: MemoryDB) -> None:
    hits = db.search(fts_query("what kind of tea does she prefer?") or "", 10)
    assert hits[0].content == "Prefers green tea in the morning"  # two matching terms beat one
    # Porter stemming: "date" finds "Dates".
    assert [h.type for h in db.search(fts_query("date format") or "", 10)] == ["CORRECTION"]


def test_limit_is_clamped() -> None:
    assert (clamp_limit(0), clamp_limit(500), clamp_limit("7"), clamp_limit(None)) == (1, 50, 7, 10)
