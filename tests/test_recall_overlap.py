"""Auto-recall's path: the query is embedded beside word search, not after it, with the same hits."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall.searcher import Dense, Searcher
from sprite_os.memory.recall.service import auto_recalled
from tests.test_recall import T0, dense_searcher

TURNS = [ep.Episode(1, "past", 1, T0, "Ravi keeps pushing this nature series on me."),
         ep.Episode(2, "past", 2, T0 + 1, "Fine, started Low Orbit with Maya last week."),
         ep.Episode(3, "past", 3, T0 + 2, "The plumber comes on Tuesday about the garden tap."),
         ep.Episode(4, "past", 4, T0 + 3, "Grocery list: eggs, oats, coffee, green tea."),
         ep.Episode(5, "older", 1, T0 - 86_400 * 30, "Maya recommended a Thai place near the river."),
         ep.Episode(6, "now", 1, T0 + 10, "Which documentary was it again?")]
QUERIES = ["Which documentary did my friend recommend that I began watching?", "when does the plumber come?",
           "what did Maya recommend in March 2020?", "my grocery list", "tea"]


class Recording:
    """The real query model, with when each query began and ended, beside `log`'s other marks; each
    query waits (a little) for word search to be done, as a slow embedding would."""

    def __init__(self, embedder: Any, log: list[str], words_done: threading.Event) -> None:
        self.embedder, self.log, self.words_done = embedder, log, words_done
        self.began = threading.Event()

    def query(self, text: str) -> Any:
        self.log.append("embedding began")
        self.began.set()
        self.words_done.wait(2)
        vector = self.embedder.query(text)
        self.log.append("embedding ended")
        return vector


def test_the_query_is_embedded_while_word_search_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    searcher, embedder, _ = dense_searcher(tmp_path, TURNS)
    log: list[str] = []
    words_done = threading.Event()
    assert searcher.dense is not None
    recording = Recording(embedder, log, words_done)
    searcher.dense.embedder = recording  # type: ignore[assignment]
    words = searcher._lexical

    def lexical(*args: Any) -> Any:
        recording.began.wait(2)  # before, the embedding came after word search: this wait ran out
        log.append("word search")
        found = words(*args)
        words_done.set()
        return found

    monkeypatch.setattr(searcher, "_lexical", lexical)
    hits = searcher.search(QUERIES[0], time.time(), 3)
    assert log == ["embedding began", "word search", "embedding ended"]
    assert 2 in [h.id for h in hits]  # found by meaning: the vector joined in
    searcher.close()


def embedded_first(dense: Dense, query: str) -> Future[Any] | None:
    """The search as it was: the query embedded on the searcher's thread, before word search, and every
    memory's weight looked up once meaning's list is in."""
    if not len(dense.vectors) or not query.strip():
        return None
    done: Future[Any] = Future()
    done.set_result(dense.embedder.query(query))
    return done


def test_the_overlap_finds_the_same_hits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    searcher, _, _ = dense_searcher(tmp_path, TURNS)
    now = T0 + 3_600
    found = [(searcher.search(q, now, 5, exclude_session=x), searcher.spread,
              auto_recalled(searcher, q, now, x, "", 1_500)) for q in QUERIES for x in (None, "now")]
    weights = Searcher._weights
    monkeypatch.setattr(Dense, "ask", embedded_first)
    monkeypatch.setattr(Searcher, "_weights", lambda self, rows, ranked, known=None: weights(self, rows, ranked))
    before = [(searcher.search(q, now, 5, exclude_session=x), searcher.spread,
               auto_recalled(searcher, q, now, x, "", 1_500)) for q in QUERIES for x in (None, "now")]
    assert found == before and any(hits for hits, _, _ in found) and any(s is not None for _, s, _ in found)
    searcher.close()


def test_a_failed_search_leaves_the_query_model_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Word search fails while the query is embedded: the search waits for the embedding before it raises,
    so the next search never finds the model (one query at a time) busy."""
    searcher, embedder, _ = dense_searcher(tmp_path, TURNS)
    assert searcher.dense is not None
    running: list[int] = []
    most = [0]

    class Slow:
        def query(self, text: str) -> Any:
            running.append(1)
            most[0] = max(most[0], len(running))
            time.sleep(0.2)
            running.pop()
            return embedder.query(text)

    searcher.dense.embedder = Slow()  # type: ignore[assignment]

    def broken(*_: Any) -> Any:
        raise RuntimeError("the index is unreadable")

    with monkeypatch.context() as m:
        m.setattr(searcher, "_lexical", broken)
        with pytest.raises(RuntimeError):
            searcher.search(QUERIES[0], time.time(), 3)
        assert not running  # cancelled, or done: never left running
    assert searcher.search(QUERIES[0], time.time(), 3) and most[0] == 1
    searcher.close()


def test_a_search_weighs_its_candidates_without_dataclasses_replace(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`dataclasses.replace` costs five times a direct construction, and a search with a past makes hundreds
    of candidates on the agent's path: the ranking makes them with `Candidate.scored` instead, which is
    the same candidate."""
    from dataclasses import replace

    from sprite_os.memory.recall import ranking
    from sprite_os.memory.recall import searcher as searcher_module
    from sprite_os.memory.recall.ranking import Candidate

    c = Candidate("episode", 7, 0.5, T0, bm25=3.0, cosine=0.8)
    assert c.scored(0.25) == replace(c, score=0.25) and c.with_cosine(None) == replace(c, cosine=None)
    searcher, _, _ = dense_searcher(tmp_path, TURNS)

    def slow(*_: Any, **__: Any) -> Any:
        raise AssertionError("dataclasses.replace on the search's path")

    for module in (ranking, searcher_module):
        monkeypatch.setattr(module, "replace", slow, raising=False)
    assert searcher.search(QUERIES[0], T0 + 3_600, 5, exclude_session="now")
    assert searcher.search("what did Maya recommend the week before the plumber came?", T0 + 3_600, 5)
    searcher.close()


def test_a_message_that_asks_nothing_of_memory_hydrates_no_hit(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate is looked at before the hits are read from memory.db: when no candidate's BM25 could lift
    the message over it, none is hydrated; what auto-recall sends is what it sent before, message by message."""
    from sprite_os.memory.recall import auto
    from sprite_os.memory.recall import searcher as searcher_module

    searcher, _, _ = dense_searcher(tmp_path, TURNS)
    now = T0 + 3_600
    messages = [*QUERIES, "thanks, that works", "ok", "run the tests again please"]
    before = []
    for q in messages:  # auto-recall as it was: every hit shown, then the gate
        hits = searcher.search(q, now, auto.SEARCHED, exclude_session="now")
        before.append(auto.select(hits, "", 1_500, auto.cues(q, searcher.spread, searcher.known)))
    hydrated: list[str] = []
    shown = searcher_module.shown

    def counted(*args: Any) -> Any:
        hydrated.append(asked)
        return shown(*args)

    monkeypatch.setattr(searcher_module, "shown", counted)
    after = []
    for asked in messages:
        after.append(auto_recalled(searcher, asked, now, "now", "", 1_500))
    assert after == before and any(after)
    assert "thanks, that works" not in hydrated and "ok" not in hydrated  # the gate said no: nothing read
    assert {m for m, sent in zip(messages, after, strict=True) if sent} <= set(hydrated)
    searcher.close()


def test_a_search_asks_memory_db_about_a_forget_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The re-check for a forget since the weighing ran in each hydration: twice a search with a floor, the
    same query over the same rows."""
    from sprite_os.memory.recall import hits as hits_module
    from sprite_os.memory.recall import searcher as searcher_module

    searcher, _, _ = dense_searcher(tmp_path, TURNS)
    rechecks: list[object] = []
    hydrations: list[object] = []
    recheck, shown = hits_module.Rows.recheck, searcher_module.shown

    def counted_recheck(rows: hits_module.Rows) -> None:
        rechecks.append(rows)
        recheck(rows)

    def counted_shown(*args: Any) -> Any:
        hydrations.append(args[0])
        return shown(*args)

    monkeypatch.setattr(hits_module.Rows, "recheck", counted_recheck)
    monkeypatch.setattr(searcher_module, "shown", counted_shown)
    assert searcher.search(QUERIES[0], T0 + 3_600, 5)
    assert len(hydrations) == 2 and len(rechecks) == 1  # the ranked list and the floor's, one re-check
    searcher.close()
