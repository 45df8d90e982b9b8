"""Lending a turn the place of the vector that holds its words (the next turn's: each vector holds its
turn and the person's words of the turn before), and what must stay true of it: the backlog's first
pass covers every turn, a lent place is only the place of a vector that holds the turn's words, a
forgotten turn's words leave the next turn's vector at once, and the scores a search shows never
rise down the list."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from devkit.harness import make_settings, wait_for
from sprite_os.config import Settings
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall import rebuild as rebuild_module
from sprite_os.memory.recall.backlog import first_pass
from sprite_os.memory.recall.index import RecallIndex
from sprite_os.memory.recall.indexer import Station
from sprite_os.memory.recall.rebuild import _embed_missing, rebuild_recall
from sprite_os.memory.recall.searcher import Dense, Searcher
from sprite_os.memory.recall.service import index_path, vectors_path
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import TranscriptDB
from tests.test_forget_turns import seed, stored_vector, system  # noqa: F401 (a fixture)
from tests.test_recall import T0, lexical, seeded, turn
from tests.test_recall_backfill import indexer_for


def test_half_way_through_a_backlog_every_turns_words_are_in_some_vector(tmp_path: Path) -> None:
    """Claim (backlog.first_pass, docs/memory.md): a first pass over every other turn puts every turn's
    words in some vector. A vector holds its turn and the person's words of the turn before, so turn t's
    words are in t's vector or t+1's. The last turn of a session with an odd number of turns has no
    turn after it, and the first pass (even turns) skips it: no vector holds its words until the
    second pass, and search has nothing to lend it."""
    turns = [ep.Episode(i, "s", i, T0 + i, f"turn {i} of five") for i in range(1, 6)]
    turns += [ep.Episode(10 + i, "t", i, T0 + i, f"turn {i} of four") for i in range(1, 5)]
    _, memory = seeded(tmp_path, turns)
    first = set(ep.ids_between(memory.conn, 1, 20, 100, skim_below=20))
    assert len(first) == 5  # every other turn: 3 of five, 2 of four
    uncovered = [t.id for t in turns if t.id not in first and t.id + 1 not in first]
    assert uncovered == [], f"after the first pass, no vector holds the words of turns {uncovered}"



def test_the_embedders_scan_skims_by_the_backlogs_first_pass_rule_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One definition of the first pass (backlog.first_pass) serves the embedder's scan in SQL
    (episodes.ids_between): on sessions of 1 to 12 turns it picks the turns the rule picks, above
    `skim_below` every turn, and a changed rule changes what the scan picks."""
    last = {f"s{n}": n for n in range(1, 13)}
    turns = [ep.Episode(0, sid, t, T0, f"turn {t} of {sid}") for sid, n in last.items() for t in range(1, n + 1)]
    turns = [ep.Episode(i, e.session_id, e.turn, T0 + i, e.text) for i, e in enumerate(turns, 1)]
    _, memory = seeded(tmp_path, turns)
    top = len(turns)

    def scan(skim_below: int) -> list[int]:
        return sorted(ep.ids_between(memory.conn, 1, top, 10_000, skim_below))

    assert scan(top) == [e.id for e in turns if first_pass(e.turn, last[e.session_id])]
    assert scan(0) == [e.id for e in turns]
    half = top // 2
    assert scan(half) == [e.id for e in turns if e.id > half or first_pass(e.turn, last[e.session_id])]
    monkeypatch.setattr(ep, "first_pass", lambda turn, last_turn: turn == 1)
    assert scan(top) == [e.id for e in turns if e.turn == 1]

class FakeVectors:
    """A vector store whose cosines are given: `cos[id]` for each embedded episode."""

    def __init__(self, cos: dict[int, tuple[float, float]]) -> None:
        self.cos = cos

    def __len__(self) -> int:
        return len(self.cos)

    def search(self, vector: object, limit: int, within: tuple[float, float] | None = None
               ) -> list[tuple[int, float, float]]:
        found = [(i, c, at) for i, (c, at) in self.cos.items() if within is None or within[0] <= at <= within[1]]
        return sorted(found, key=lambda x: -x[1])[:limit]

    def similarities(self, vector: object, ids: Sequence[int]) -> dict[int, float]:
        return {i: self.cos[i][0] for i in ids if i in self.cos}

    def has(self, ids: Sequence[int]) -> np.ndarray:
        return np.array([i in self.cos for i in ids], dtype=bool)

    def warm(self) -> None:
        pass


class FakeEmbedder:
    def query(self, text: str) -> np.ndarray:
        return np.zeros(4, dtype=np.float32)


def fake_dense_searcher(tmp_path: Path, turns: list[ep.Episode], cos: dict[int, float]) -> Searcher:
    settings, memory = seeded(tmp_path, turns)
    at = {t.id: t.at for t in turns}
    dense = Dense(FakeEmbedder(), FakeVectors({i: (c, at[i]) for i, c in cos.items()}))
    return Searcher(memory.conn, RecallIndex(index_path(settings.layout.memory_dir)), dense)


def test_scores_a_search_shows_do_not_rise_down_the_list(tmp_path: Path) -> None:
    """The floor moves a turn without a vector up to its place in word search alone but leaves it its own
    (low) fused score: the list shows a hit scored below the hits it now sits above. `_fused_scores`
    only rescores hits brought in, not hits moved up. (A search without a time cue: scores should be
    non-increasing, as fusion sorted them.)"""
    lonely = ep.Episode(1, "x", 1, T0, "the quokka sanctuary on Rottnest island")  # no vector; words rank it first
    near = ep.Episode(2, "y", 1, T0 + 1, "we took the ferry to the island")  # words: second; meaning: first
    after = ep.Episode(3, "y", 2, T0 + 2, "and swam at the beach all afternoon")  # meaning: second, its neighbour
    filler = [ep.Episode(10 + i, f"f{i}", 1, T0 + 10 + i, f"notes on the garden shed roof number {i}")
              for i in range(8)]
    cos = {2: 0.95, 3: 0.94, **{f.id: 0.5 - 0.01 * k for k, f in enumerate(filler)}}
    searcher = fake_dense_searcher(tmp_path, [lonely, near, after, *filler], cos)
    hits = searcher.search("quokka Rottnest island", time.time(), 6)
    print([(h.id, round(h.score, 4)) for h in hits])
    assert hits[0].id == 1  # the floor put it first (word search alone ranks it first)
    scores = [h.score for h in hits]
    assert scores == sorted(scores, reverse=True), [(h.id, round(h.score, 4)) for h in hits]


async def test_a_forgotten_turns_words_leave_the_vector_of_the_turn_after_it(
        system: MemorySystem, tmp_path: Path) -> None:  # noqa: F811 (the fixture)
    """Forget purges a turn's words from every store; but each vector holds its turn and the person's words
    of the turn before (episodes.embed_text), and forget zeroes only the forgotten turn's own vector. The
    next turn's vector still encodes them: meaning still finds the next turn by the forgotten words,
    and search lends that place to whatever turn now precedes it. The word index rewrites the
    neighbours' documents on a forget (documents.forgotten); the vectors should be made again too."""
    ids = await seed(system, tmp_path)
    store = vectors_path(system.settings.layout.memory_dir, system.recall.status()["dense"]["model"])
    before = stored_vector(store, ids[2])  # "I like green tea", after "I live in Lisbon, in Alfama..."
    await system.forget_turns([ids[1]], by="the person, in the console")
    after = stored_vector(store, ids[2])
    assert after.any()
    cos = float(before @ after / np.linalg.norm(before) / np.linalg.norm(after))
    assert cos < 0.999, "turn 3's vector still holds the forgotten turn's words (unchanged by the forget)"


def embedded(conn: sqlite3.Connection, ids: Sequence[int]) -> list[tuple[int, float, str]]:
    """The vectors of `ids` made now, and stored: their texts, and which turn each was made after recorded."""
    out, after = ep.texts_to_embed(conn, ids)
    ep.record_embedded_after(conn, after)
    return out


async def test_a_forget_says_which_turn_a_vector_was_made_after_only_once_it_is_made(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811 (the fixture)
    """The forget recorded which turn the next turn's vector is made after before making it: a failure
    in between left the record saying so of a vector made as before (here one that lends nothing,
    since it could not be made again, was then taken to hold the words of the turn before it)."""
    ids = await seed(system, tmp_path)
    await system.memory.call(lambda m: ep.never_lend(m.conn, [ids[2]]))

    def broken(_station: Station, _batch: list[tuple[int, float, str]]) -> int:
        raise RuntimeError("the embedding model failed")

    monkeypatch.setattr(Station, "renew", broken)
    with pytest.raises(RuntimeError):
        await system.recall._forget_vectors([ids[1]])
    [(made_after,)] = await system.memory.call(
        lambda m: m.conn.execute("SELECT embedded_after FROM episodes WHERE id = ?", (ids[2],)).fetchall())
    assert made_after == -2


async def test_a_forget_cut_between_making_a_vector_and_storing_it_makes_it_at_the_next_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn after a forgotten one has its vector made again without the forgotten words. A failure
    between making it and storing it leaves the record as it was (here: lends nothing), not saying
    the vector was made; the forget's flag, set first, makes the next start make it and then say so."""
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")  # the dense retriever on: vectors too
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    try:
        ids = await seed(first, tmp_path)
        store = vectors_path(settings.layout.memory_dir, first.recall.status()["dense"]["model"])
        before = stored_vector(store, ids[2])  # "I like green tea", after "I live in Lisbon, in Alfama..."
        await first.memory.call(lambda m: ep.never_lend(m.conn, [ids[2]]))

        def broken(_station: Station, _batch: list[tuple[int, float, str]]) -> int:
            raise RuntimeError("the embedding model failed")

        with monkeypatch.context() as patch:
            patch.setattr(Station, "renew", broken)
            with pytest.raises(RuntimeError):
                await first.forget_turns([ids[1]], by="the person, in the console")
        made_after = "SELECT embedded_after FROM episodes WHERE id = ?"
        assert await first.memory.call(lambda m: m.conn.execute(made_after, (ids[2],)).fetchone()) == (-2,)
        assert np.array_equal(stored_vector(store, ids[2]), before)  # not made again
    finally:
        await first.stop()
    again = MemorySystem(settings)
    await again.start()
    try:
        after = stored_vector(store, ids[2])
        assert after.any() and float(before @ after / np.linalg.norm(before) / np.linalg.norm(after)) < 0.999
        assert await again.memory.call(lambda m: m.conn.execute(made_after, (ids[2],)).fetchone()) == (ids[1],)
    finally:
        await again.stop()


def test_a_rebuild_says_which_turn_a_vector_was_made_after_only_once_it_is_stored(tmp_path: Path) -> None:
    """The rebuild recorded it before the embedding model ran: a failure there (or a stop) left turns
    recorded as embedded after their turn before, with no vector made."""
    _, memory = seeded(tmp_path, [ep.Episode(i, "s", i, T0 + i, f"turn {i}") for i in range(1, 4)])

    class NoVectors:
        def __len__(self) -> int:
            return 0

        def has(self, ids: Sequence[int]) -> list[bool]:
            return [False] * len(ids)

    class Failing:
        def passages(self, texts: list[str]) -> Any:
            raise RuntimeError("the embedding model failed")

    with pytest.raises(RuntimeError):
        _embed_missing(memory, cast(Any, Failing()), cast(Any, NoVectors()), lambda *_: None)
    assert [r for (r,) in memory.conn.execute("SELECT embedded_after FROM episodes ORDER BY id")] == [None] * 3


def four_turns(tmp_path: Path) -> tuple[Settings, TranscriptDB]:
    """Two sessions of two turns each in transcript.db, recall lexical."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    transcript = TranscriptDB(settings.layout.transcript_db)
    for n, said in ((1, "My sister Margaret adopted a puppy."), (2, "What should I cook tonight?")):
        transcript.append(turn("s", n, said))
    transcript.append(turn("t", 1, "We fly to Oslo on Friday."))
    transcript.append(turn("t", 2, "Book a taxi."))
    return settings, transcript


def test_a_full_rebuild_keeps_which_turn_each_kept_vector_was_made_after(tmp_path: Path) -> None:
    """A full rebuild makes memory.db again but keeps the vector store, and said nothing of which turn
    each kept vector was made after: every one read as made after the turn now before it. A vector to
    be made again (a past turn imported before it since) was then never made again, and lent its
    place to the imported turn, whose words it does not hold."""
    settings, transcript = four_turns(tmp_path)
    transcript.append(turn("s", 0, "The plumber comes on Tuesday.", at=T0 + 1.5))  # imported: between 1 and 2
    memory = MemoryDB(settings.layout.memory_db)  # as the server left it: vectors of 1, 2, 3 and 4 made...
    ep.add(memory.conn, [ep.from_observation(o) for o in transcript.after(0, 4)])
    embedded(memory.conn, [1, 2, 3, 4])
    ep.add(memory.conn, [ep.from_observation(o) for o in transcript.after(4, 1)])  # ...then 5 imported
    embedded(memory.conn, [5])  # its own vector, made after turn 1; turn 2's is to be made again
    before = dict(memory.conn.execute("SELECT id, embedded_after FROM episodes").fetchall())
    assert before == {1: 0, 2: -1, 3: 0, 4: 3, 5: 1}
    memory.close()
    transcript.close()
    backup = settings.layout.memory_db.with_name("memory.db.before-rebuild")
    settings.layout.memory_db.rename(backup)  # what the full rebuild does with it (curation/rebuild.py)
    rebuild_recall(settings, lambda *_: None, backup)
    memory = MemoryDB(settings.layout.memory_db)
    try:
        after = dict(memory.conn.execute("SELECT id, embedded_after FROM episodes").fetchall())
        assert after == before
        assert ep.embed_again(memory.conn, 10) == [2]  # the next start makes it again
        assert 2 not in ep.turns_before(memory.conn, [2, 4, 5])  # and till then it lends nothing
    finally:
        memory.close()


def test_a_full_rebuild_that_cannot_carry_every_page_makes_every_kept_vector_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which turn each kept vector was made after is carried a page at a time. A page that fails
    (a disk error) after others went in left those applied and the rest as the rebuild guessed, and
    the rebuild said it succeeded: a kept vector could lend its place to a turn whose words it does
    not hold. All or nothing: every turn's vector is made again, and the rebuild says so."""
    settings, transcript = four_turns(tmp_path)
    memory = MemoryDB(settings.layout.memory_db)
    ep.add(memory.conn, [ep.from_observation(o) for o in transcript.after(0, 4)])
    embedded(memory.conn, [1, 2, 3, 4])
    memory.close()
    transcript.close()
    backup = settings.layout.memory_db.with_name("memory.db.before-rebuild")
    settings.layout.memory_db.rename(backup)
    carry, pages = ep.carry_embedded_after, []

    def second_page_fails(conn: sqlite3.Connection, made_after: Sequence[tuple[int, int]]) -> None:
        pages.append(made_after)
        if len(pages) == 2:
            raise sqlite3.OperationalError("disk I/O error")
        carry(conn, made_after)

    monkeypatch.setattr(rebuild_module, "CARRY_PAGE", 2)
    monkeypatch.setattr(ep, "carry_embedded_after", second_page_fails)
    report = rebuild_recall(settings, lambda *_: None, backup)
    assert len(pages) == 2
    memory = MemoryDB(settings.layout.memory_db)
    try:
        assert sorted(ep.embed_again(memory.conn, 10)) == [1, 2, 3, 4]
        assert not ep.turns_before(memory.conn, [2, 4])  # no kept vector lends a place till made again
    finally:
        memory.close()
    assert "disk I/O error" in report.warning and "made again" in report.warning


def test_a_full_rebuild_takes_the_record_before_it_over_what_its_own_pages_guessed(tmp_path: Path) -> None:
    """The rebuild adds the transcript's turns a page at a time: a past turn imported into a session,
    in a later page, lands between its turns, and the add takes every vector of that session to be made
    after the turn then before it. The memory.db before the rebuild knew better: turn 2's vector was
    to be made again (it was made before the turn now before it arrived), and turn 1's is fine."""
    s = [ep.Episode(1, "s", 1, T0, "My sister Margaret adopted a puppy."),
         ep.Episode(2, "s", 2, T0 + 100, "What should I cook tonight?"),
         ep.Episode(3, "s", 3, T0 + 200, "Book a taxi.")]
    _, memory = seeded(tmp_path, s)  # the rebuild's first page
    ep.add(memory.conn, [ep.Episode(5, "s", 0, T0 + 50, "The plumber comes on Tuesday.")])  # a later page
    guessed = dict(memory.conn.execute("SELECT id, embedded_after FROM episodes").fetchall())
    assert guessed == {1: 0, 2: -1, 3: 2, 5: None}  # 3's vector taken as made after 2: the add's guess
    ep.carry_embedded_after(memory.conn, [(1, 0), (2, 1), (3, -1), (5, 1)])  # the memory.db before it said
    after = dict(memory.conn.execute("SELECT id, embedded_after FROM episodes").fetchall())
    assert after == {1: 0, 2: -1, 3: -1, 5: 1}
    assert sorted(ep.embed_again(memory.conn, 10)) == [2, 3]


def test_a_turn_is_lent_only_the_place_of_a_vector_that_holds_its_words(tmp_path: Path) -> None:
    """Lending assumes the next turn's vector holds this turn's words. A vector is made once, with the
    turn before it *at that time* (episodes.texts_to_embed); a past turn imported later into the session lands
    between them (episodes.add renumbers), and nothing makes the vector again: the imported turn is not
    lent a vector that holds another turn's words. Nor is a turn whose next turn was embedded before it
    arrived (the indexer's newest-first walk: a session cut by a chunk boundary gets its later turns
    first), nor one that lands after a vector from before this was recorded."""
    s = [ep.Episode(1, "s", 1, T0, "My sister Margaret adopted a puppy called Biscuit."),
         ep.Episode(3, "s", 2, T0 + 100, "What should I cook tonight?"),
         ep.Episode(11, "late", 1, T0 + 300, "And the tiles for the bathroom?"),
         ep.Episode(21, "old", 1, T0 + 400, "The car needs new tyres."),
         ep.Episode(23, "old", 2, T0 + 500, "Which brand?"),
         ep.Episode(31, "kept", 1, T0 + 600, "We fly to Oslo on Friday."),
         ep.Episode(32, "kept", 2, T0 + 700, "Book a taxi.")]
    _, memory = seeded(tmp_path, s)
    [(_, _, embedded_text)] = embedded(memory.conn, [3])  # turn 2's vector: turn 1's words in it
    embedded(memory.conn, [11, 32])  # 11: embedded before the turn before it arrived
    assert "Oslo" in embedded(memory.conn, [32])[0][2]
    memory.conn.execute("UPDATE episodes SET embedded_after = NULL WHERE id = 23")  # a vector from before
    ep.add(memory.conn, [ep.Episode(2, "s", 0, T0 + 50, "The plumber comes on Tuesday."),  # imported, between
                         ep.Episode(10, "late", 0, T0 + 250, "The builder quoted for the kitchen."),
                         ep.Episode(22, "old", 0, T0 + 450, "A flat on the motorway.")])
    lent = ep.turns_before(memory.conn, [3, 11, 23, 32])
    said = {t: ep.get(memory.conn, [b])[b].persons_part for t, (b, _) in lent.items()}
    assert 3 not in lent or said[3] in embedded_text, f"turn 2 is lent a vector made from: {embedded_text!r}"
    assert lent.keys() == {32} and lent[32][0] == 31  # the one vector that holds the words of the turn before it


async def test_a_turn_landing_between_has_the_next_turns_vector_made_again_with_its_words(tmp_path: Path) -> None:
    """A past turn imported into a session lands between two turns: the vector of the turn now after it
    was made after another turn, so the embedder makes it again, with the new turn's words, and from
    then on it lends its place to the new turn (and never before: it held other words)."""
    layout = lexical(tmp_path).layout
    layout.ensure()
    db = TranscriptDB(layout.transcript_db)
    db.append(turn("s", 1, "My sister Margaret adopted a puppy called Biscuit.", at=T0))
    db.append(turn("s", 2, "What should I cook tonight?", at=T0 + 100))
    db.close()
    _, store, indexer, workers = indexer_for(layout)
    await indexer.start(fresh_index=True)
    try:
        # Not `embedded_all`: it is also set while the turns are not episodes yet (nothing to embed then).
        await wait_for(lambda: indexer.health.embedded >= 2, what="both turns' vectors")
        before = stored_vector(store, 2)
        # imported: an older turn of the same session, between the two (recorded later, so a higher id)
        await indexer.memory.call(lambda m: ep.add(m.conn, [ep.Episode(3, "s", 0, T0 + 50, "The plumber comes on Tuesday.")]))
        indexer._embed_wake.set()
        started = time.monotonic()
        while (await indexer.memory.call(lambda m: ep.turns_before(m.conn, [2]))).get(2, (0,))[0] != 3:
            assert time.monotonic() - started < 30, "the next turn's vector was not made again"
            await asyncio.sleep(0.05)
        assert not np.allclose(before, stored_vector(store, 2))
        [(_, _, text)], _ = await indexer.memory.call(lambda m: ep.texts_to_embed(m.conn, [2]))
        assert "plumber" in text
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in workers))
