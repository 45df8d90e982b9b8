"""The indexer: keeps episodes, the recall index and the turns' embeddings current, off the agent's path.

One task owns the index. Capture records a turn (on transcript.db's thread) and nudges it;
it then reads every turn recorded since the last episode, stores the new episodes in
memory.db, and writes their documents (and the two turns before each, whose context they
join) to the index, committing at most once every COMMIT_EVERY seconds: a turn is searchable
within about a second. It also looks every POLL seconds, for learnings a batch added and for
turns another process imported, and applies forgettings as the console reports them.

A second task embeds episodes for the dense retriever, newest first, a few at a time, on a
thread and model instance of its own: its backlog (a first start on a long transcript) is a
query on memory.db, not a queue in memory, and never holds up anything else.

Threads: SQL runs on memory.db's thread (`Worker[MemoryDB]`, shared with the daemon, so
memory keeps one writer); index writes on the index's thread; embedding on the embedder's;
vectors join the dense index on the recall thread, which owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from ...db_worker import Worker
from ...errors import log_expected
from ...logs import get_logger
from ..memory_store import MemoryDB
from ..transcript_store import Observation, TranscriptDB
from . import episodes as ep
from .dense import Embedder, to_blob
from .documents import CHUNK, Marks, Staged, learning_changes, stage, write_marks
from .index import RecallIndex
from .searcher import Searcher

log = get_logger(__name__)

POLL = 2.0
COMMIT_EVERY = 1.0
EMBED_BATCH = 8
RETRY = 5.0
VECTOR_PAGE = 5_000


@dataclass
class IndexerHealth:
    episodes: int = 0
    indexed_through: int = 0
    embedded: int = 0
    last_error: str | None = None


class Indexer:
    def __init__(self, transcript: Worker[TranscriptDB], memory: Worker[MemoryDB], index: Worker[RecallIndex],
                 recall: Worker[Searcher], embed: Worker[Embedder] | None = None, model: str | None = None) -> None:
        self.transcript, self.memory, self.index, self.recall = transcript, memory, index, recall
        self.embed, self.model = embed, model
        self.health = IndexerHealth()
        self._wake = asyncio.Event()
        self._embed_wake = asyncio.Event()
        self._changed: set[int] = set()
        self._last_commit = -math.inf
        self._tasks: list[asyncio.Task[None]] = []
        self.current = asyncio.Event()  # set whenever the index holds every recorded turn (tests wait on it)

    # ------------------------------------------------------------ triggers (never block)

    def nudge(self) -> None:
        self.current.clear()
        self._wake.set()

    def learning_changed(self, learning_id: int) -> None:
        """A person forgot a learning, or undid it: its document goes, or comes back."""
        self._changed.add(learning_id)
        self.nudge()

    # ------------------------------------------------------------ lifecycle

    async def start(self, fresh_index: bool) -> None:
        if fresh_index:  # a new, empty directory: whatever the marks said, it holds nothing
            await self.memory.call(lambda m: write_marks(m.conn, Marks()))
        self._tasks.append(asyncio.create_task(self._run(), name="recall-indexer"))
        if self.embed is not None and self.model is not None:
            self._tasks.append(asyncio.create_task(self._embed_run(), name="recall-embedder"))
        self.nudge()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()

    # ------------------------------------------------------------ the index

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL)
            self._wake.clear()
            try:
                await self._catch_up(loop)
                self.health.last_error = None
                if not self._wake.is_set():
                    self.current.set()
            except Exception as exc:
                log_expected(log, "recall_index_failed", exc)
                self.health.last_error = repr(exc)[:500]
                await asyncio.sleep(RETRY)

    async def _catch_up(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:  # turns -> episodes
            last = await self.memory.call(lambda m: ep.max_id(m.conn))
            new = await self.transcript.call(partial(TranscriptDB.after, last_id=last, limit=CHUNK))
            if new:
                await self.memory.call(partial(_add_episodes, new=new))
                self.health.episodes = new[-1].id
            if len(new) < CHUNK:
                break
        if self._changed:
            changed, self._changed = sorted(self._changed), set()
            await self._commit(loop, await self.memory.call(lambda m: learning_changes(m.conn, changed)))
        while (staged := await self.memory.call(lambda m: stage(m.conn))) is not None:
            await self._commit(loop, staged)
            self._embed_wake.set()

    async def _commit(self, loop: asyncio.AbstractEventLoop, staged: Staged) -> None:
        if (hold := self._last_commit + COMMIT_EVERY - loop.time()) > 0:
            await asyncio.sleep(hold)  # at most one commit a second: each costs 40-200 ms at 2M documents

        def write(index: RecallIndex) -> None:
            index.put(staged.docs, staged.replace)
            index.commit()

        await self.index.call(write)
        self._last_commit = loop.time()
        reached = Marks(staged.episodes_through, staged.learnings_through)
        await self.memory.call(lambda m: write_marks(m.conn, reached))
        self.health.indexed_through = staged.episodes_through

    # ------------------------------------------------------------ embeddings

    async def _embed_run(self) -> None:
        model = self.model
        assert model is not None and self.embed is not None
        try:
            await self._load_vectors(model)
        except Exception as exc:
            log.exception("recall_vectors_unreadable", error=repr(exc)[:300])
        done_below, cursor, pass_top = 0, math.inf, 0
        while True:
            try:
                if cursor == math.inf:
                    pass_top = await self.memory.call(lambda m: ep.max_id(m.conn))
                below = cursor if cursor != math.inf else pass_top + 1
                batch = await self.memory.call(partial(_unembedded, model=model, above=done_below, below=int(below)))
                if not batch:
                    done_below, cursor = pass_top, math.inf
                    await self._embed_wake.wait()
                    self._embed_wake.clear()
                    continue
                await self._embed(model, batch)
                cursor = min(e.id for e, _ in batch)
            except Exception as exc:
                log_expected(log, "recall_embedding_failed", exc)
                self.health.last_error = repr(exc)[:500]
                await asyncio.sleep(RETRY)

    async def _embed(self, model: str, batch: list[tuple[ep.Episode, ep.Episode | None]]) -> None:
        assert self.embed is not None
        texts = [ep.embed_text(prev, e) for e, prev in batch]
        vectors = await self.embed.call(lambda m: m.passages(texts))
        ids, at = [e.id for e, _ in batch], [e.at for e, _ in batch]
        await self.memory.call(lambda m: ep.put_vectors(m.conn, model, [(i, to_blob(v)) for i, v in zip(
            ids, vectors, strict=True)]))
        await self.recall.call(lambda s: _add_vectors(s, ids, at, vectors))
        self.health.embedded += len(batch)

    async def _load_vectors(self, model: str) -> None:
        """The stored vectors into the dense index, a page at a time."""
        started, after, n = time.monotonic(), 0, 0
        while page := await self.memory.call(partial(_vectors, model=model, after=after)):
            ids, at = [p[0] for p in page], [p[1] for p in page]
            matrix = np.frombuffer(b"".join(p[2] for p in page), dtype=np.float32).reshape(len(page), -1)
            await self.recall.call(partial(_add_vectors, ids=ids, at=at, vectors=matrix))
            after, n = ids[-1], n + len(page)
        self.health.embedded = n
        log.info("recall_vectors_loaded", vectors=n, seconds=round(time.monotonic() - started, 2))

    def status(self) -> dict[str, Any]:
        h = self.health
        return {"episodes_seen": h.episodes, "indexed_through": h.indexed_through, "embedded": h.embedded,
                "last_error": h.last_error}


def _add_episodes(memory: MemoryDB, new: list[Observation]) -> int:
    return ep.add(memory.conn, [ep.from_observation(o) for o in new])


def _unembedded(memory: MemoryDB, model: str, above: int, below: int) -> list[tuple[ep.Episode, ep.Episode | None]]:
    return [(e, ep.previous(memory.conn, e)) for e in ep.missing_vectors(memory.conn, model, above, below, EMBED_BATCH)]


def _vectors(memory: MemoryDB, model: str, after: int) -> list[tuple[int, float, bytes]]:
    return ep.vectors(memory.conn, model, after, VECTOR_PAGE)


def _add_vectors(searcher: Searcher, ids: list[int], at: list[float], vectors: Any) -> None:
    if searcher.dense is not None:
        searcher.dense.vectors.add(ids, at, vectors)
