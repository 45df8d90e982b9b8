"""The indexer: keeps episodes, the recall index and the turns' vectors current, off the agent's path.

One task owns the index. Capture records a turn (on transcript.db's thread) and nudges it;
it takes the newest turns the index lacks (memory/recall/backlog.py: a turn recorded during
a long catch-up jumps the queue), stores them as episodes in memory.db, and writes their
documents (and the turns' around them, whose context they join) to the index, committing at
most once every COMMIT_EVERY seconds: a turn is searchable within about a second. It also
looks every POLL seconds, for learnings a batch added and for turns imported, and applies
forgettings as the console reports them.

A second task embeds episodes for the dense retriever the same way, newest first, a few at a
time, on a thread and model instance of its own that also owns the vector store's writer
(memory/recall/vectors.py): a new turn gets its vector within seconds, ahead of any backlog
(the first start on a long transcript, an import), and the backlog is a walk over memory.db,
not a queue in memory, in two passes: every other turn first, then the rest (backlog.first_pass).
Its progress (how many wait, at what rate) is in `status`.

Threads: SQL runs on the databases' threads (`Worker[MemoryDB]`, shared with the daemon, so
memory keeps one writer; `Worker[TranscriptDB]`); index writes on the index's thread;
embedding and the vector store on the embedder's. Searchers read the store's files and see
each commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from ...db_worker import Worker
from ...errors import log_expected
from ...logs import get_logger
from ..memory_store import MemoryDB
from ..transcript_store import Observation, TranscriptDB
from . import episodes as ep
from .backlog import Range, highest_gap, mark, normalise, unseen
from .dense import Embedder
from .documents import (
    Marks,
    Staged,
    learning_changes,
    next_turns,
    read_marks,
    stage_learnings,
    stage_turns,
    write_marks,
)
from .index import RecallIndex
from .pacing import AgentActivity, embed_delay
from .reach import Reach, sessions_and_learnings
from .vectors import VectorWriter, forget_everywhere

log = get_logger(__name__)

POLL = 2.0
COMMIT_EVERY = 1.0
# A nudge comes as a turn lands in transcript.db, before the runtime has told the person it is done:
# the catch-up waits until that turn is over, so its database calls and index writes never race the
# turn's last step (turn_complete) for the event loop and the GIL. At most this long, for a turn
# that goes on (an import's nudge during a long turn): words stay searchable within about a second.
AFTER_TURN_WAIT = 1.0
EMBED_BATCH = 8
SCAN = 4_096  # episode ids the embedder looks at a step, for those without a vector
RETRY = 5.0
GIVE_UP = 3  # failures in a row of one batch before its turns are passed over (a restart tries again)
LEGACY_PAGE = 5_000
EMBED_RATE_WINDOW = 60.0  # seconds of embedding the rate is measured over


@dataclass
class IndexerHealth:
    turns_waiting: int = 0  # recorded, not yet in the index
    embedded: int = 0  # turns with a vector
    last_error: str | None = None


class Station:
    """The embedder's thread's own: the passage model and the vector store's writer."""

    def __init__(self, model: Embedder, writer: VectorWriter) -> None:
        self.model, self.writer = model, writer

    def without_vector(self, ids: list[int]) -> list[int]:
        return [i for i, has in zip(ids, self.writer.has(ids), strict=True) if not has]

    def embed(self, batch: list[tuple[int, float, str]]) -> int:
        if not batch:
            return 0
        vectors = self.model.passages([text for _, _, text in batch])
        return self.writer.add([i for i, _, _ in batch], [at for _, at, _ in batch], vectors)

    def forget(self, root: Path, ids: Sequence[int], after: list[tuple[int, float, str]]) -> tuple[int, int]:
        """Turns a person forgot, out of this store and any other under `root` (this thread writes them);
        `after`: the turns just after them (id, date, text to embed now), whose vectors held the forgotten
        turns' words: made again here, dropped from another model's store (which this model can't make).
        Returns the records zeroed and the vectors made again."""
        zeroed = forget_everywhere(root, ids, self.writer, also_elsewhere=[i for i, _, _ in after])
        return zeroed, self.renew(after) if after else 0

    def renew(self, batch: list[tuple[int, float, str]]) -> int:
        """Stored vectors made again from `batch`'s texts (those without a vector are left to the walk)."""
        stored = [b for b, has in zip(batch, self.writer.has([i for i, _, _ in batch]), strict=True) if has]
        if not stored:
            return 0
        return self.writer.renew([i for i, _, _ in stored], self.model.passages([t for _, _, t in stored]))

    def adopt(self, page: list[tuple[int, float, bytes]]) -> None:
        matrix = np.frombuffer(b"".join(v for _, _, v in page), dtype=np.float32).reshape(len(page), -1)
        self.writer.add([i for i, _, _ in page], [at for _, at, _ in page], matrix)

    def close(self) -> None:
        self.writer.close()
        self.model.close()


@dataclass
class Rate:
    """Turns embedded per second over the last EMBED_RATE_WINDOW seconds."""

    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, now: float, n: int) -> None:
        self.samples = [s for s in self.samples if now - s[0] <= EMBED_RATE_WINDOW] + [(now, n)]

    def per_second(self, now: float) -> float | None:
        recent = [s for s in self.samples if now - s[0] <= EMBED_RATE_WINDOW]
        if len(recent) < 2:
            return None
        span = recent[-1][0] - recent[0][0]
        return sum(n for _, n in recent[1:]) / span if span > 0 else None


class Indexer:
    def __init__(self, transcript: Worker[TranscriptDB], memory: Worker[MemoryDB], index: Worker[RecallIndex],
                 embed: Worker[Station] | None = None, model: str | None = None) -> None:
        self.transcript, self.memory, self.index = transcript, memory, index
        self.embed, self.model = embed, model
        self.health = IndexerHealth()
        self._wake = asyncio.Event()
        self._embed_wake = asyncio.Event()
        self._changed: set[int] = set()
        self._forgets = 0  # forgets begun: documents staged before one may hold its words (`forgetting`)
        self._last_commit = -math.inf
        self._tasks: list[asyncio.Task[None]] = []
        self._episodes = 0
        self._rate = Rate()
        self._adopting = False
        self.reach = Reach()  # whether a search could find anything outside a session (auto-recall asks)
        self.activity = AgentActivity()  # the embedder steps aside for the agent's turns (pacing.py)
        self._activity_changed = asyncio.Event()
        self._agent_idle = asyncio.Event()  # clear while the agent's turn runs (AFTER_TURN_WAIT)
        self._agent_idle.set()
        self.current = asyncio.Event()  # set whenever the index holds every recorded turn (tests wait on it)
        self.embedded_all = asyncio.Event()  # set whenever every episode has a vector (or was passed over)
        # held from reading a batch's texts to storing its vectors: a forget that makes vectors again
        # (service.py) comes before the read or after the store, never between them with its words
        self.embedding = asyncio.Lock()

    # ------------------------------------------------------------ triggers (never block)

    def nudge(self) -> None:
        self.current.clear()
        self._wake.set()

    def turn_started(self) -> None:
        self.activity.started(time.monotonic())
        self._activity_changed.set()
        self._agent_idle.clear()

    def turn_ended(self) -> None:
        self.activity.ended(time.monotonic())
        self._activity_changed.set()
        self._agent_idle.set()

    def forgetting(self) -> None:
        """A forget begins (memory.db has lost the turns' words; the index's deletion comes next): what
        the catch-up staged before it, held back for its commit, is staged again, never written after it."""
        self._forgets += 1

    def learning_changed(self, learning_id: int) -> None:
        """A person forgot a learning, or undid it: its document goes, or comes back."""
        self._changed.add(learning_id)
        self.nudge()

    # ------------------------------------------------------------ lifecycle

    async def start(self, fresh_index: bool) -> None:
        if fresh_index:  # a new, empty directory: whatever the marks said, it holds nothing
            await self.memory.call(lambda m: write_marks(m.conn, Marks()))
        self._episodes = await self.memory.call(lambda m: ep.count(m.conn))  # then counted as they come
        self.reach.load(*await self.memory.call(lambda m: sessions_and_learnings(m.conn)))  # then told as they come
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
            await _wait(self._wake, POLL)
            await _wait(self._agent_idle, AFTER_TURN_WAIT)
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
        while self._changed:
            changed, self._changed = sorted(self._changed), set()
            forgets = self._forgets
            staged_changes = await self.memory.call(partial(_learning_changes, ids=changed))
            if staged_changes.docs:  # a learning remembered again
                self.reach.learned()
            if not await self._commit(loop, staged_changes, forgets):
                self._changed.update(changed)
        while True:  # the newest turns the index lacks, then learnings
            forgets = self._forgets
            held: Marks = await self.memory.call(lambda m: read_marks(m.conn))
            step = await self.transcript.call(partial(next_turns, marks=held))
            if step is not None:
                self.reach.turns(o.session_id for o in step[0])  # before their episodes exist
                staged: Staged | None = await self.memory.call(partial(_stage_turns, step=step, held=held))
                self._embed_wake.set()
            else:
                staged = await self.memory.call(partial(_stage_learnings, held=held))
                if staged is not None and staged.docs:
                    self.reach.learned()
            if staged is None:
                break
            self._episodes += staged.added  # in memory.db now, whether this commit is made or staged again
            if not await self._commit(loop, staged, forgets):
                continue
            top = await self.transcript.call(lambda t: t.max_id())
            self.health.turns_waiting = unseen(staged.marks.seen(), top)

    async def _commit(self, loop: asyncio.AbstractEventLoop, staged: Staged, forgets: int) -> bool:
        """Write `staged` (staged once `forgets` forgets had begun); False, and nothing written, when a
        forget began since: its documents (a turn, its neighbours with it as their context, a learning)
        may hold the forgotten words, and written after the forget's deletion they would bring them back."""
        ready = loop.time()
        if (hold := self._last_commit + COMMIT_EVERY - ready) > 0:
            await asyncio.sleep(hold)  # at most one commit a second: each costs 40-200 ms at 2M documents
            # A turn that began meanwhile (back-to-back turns) ends first: the commit's threads would take
            # the GIL and a core from it. At most AFTER_TURN_WAIT from when the commit was ready, the hold
            # counted in: a long turn still sees a commit a second.
            await _wait(self._agent_idle, max(0.0, ready + AFTER_TURN_WAIT - loop.time()))
        if self._forgets != forgets:  # checked as the write is handed out: a forget after it deletes after it
            return False

        def write(index: RecallIndex) -> None:
            index.put(staged.docs, staged.replace)
            index.commit()

        await self.index.call(write)
        self._last_commit = loop.time()
        await self.memory.call(lambda m: write_marks(m.conn, staged.marks))
        return True

    # ------------------------------------------------------------ embeddings

    async def _embed_run(self) -> None:
        assert self.embed is not None and self.model is not None
        model, station = self.model, self.embed
        try:
            await self._adopt_legacy(model, station)
        except Exception as exc:  # the rows stay in memory.db: moved at the next start
            log_expected(log, "recall_vectors_unmoved", exc)
        self.health.embedded = await station.call(lambda s: len(s.writer))
        # Two passes over a backlog (backlog.first_pass): every other turn first, so that half-way through
        # every turn's words are in some vector (the searcher lends it to the turn before), then the rest.
        # A backlog is what waits when the embedder finds work after none (a start, an import); a turn
        # recorded during its walk (above `walk_top`) is taken whole at once.
        done: list[Range] = []  # every turn here has its vector (or was passed over)
        skimmed: list[Range] = []  # the first pass has been over these
        walk_top: int | None = None
        failures = 0
        while True:
            gap: Range | None = None
            try:
                top = await self.memory.call(lambda m: ep.max_id(m.conn))
                first = highest_gap(normalise([*done, *skimmed]), top)
                if (gap := first if first is not None else highest_gap(done, top)) is None:
                    if await self._embed_again(station):
                        continue
                    walk_top = None
                    self.embedded_all.set()
                    await _wait(self._embed_wake, POLL)
                    self._embed_wake.clear()
                    continue
                if walk_top is None:
                    walk_top = top
                self.embedded_all.clear()
                await self._agent_first()
                await self._embed_again(station)
                async with self.embedding:
                    taken, batch, after = await self._next_batch(gap, station, walk_top if first is not None else 0)
                    added = await station.call(partial(Station.embed, batch=batch)) if batch else 0
                    await self.memory.call(partial(_record_embedded_after, after=after))
                if added:
                    self._rate.add(time.monotonic(), added)
                    self.health.embedded += added
                if first is None:
                    done = mark(done, *taken)
                else:
                    skimmed = mark(skimmed, *taken)
                    if taken[1] > walk_top:  # above the backlog, the first pass took every turn
                        done = mark(done, max(taken[0], walk_top + 1), taken[1])
                failures = 0
            except Exception as exc:
                failures += 1
                log_expected(log, "recall_embedding_failed", exc, failures=failures)
                self.health.last_error = repr(exc)[:500]
                if failures >= GIVE_UP and gap is not None:  # passed over until the next start
                    done, skimmed, failures = mark(done, *gap), mark(skimmed, *gap), 0
                await asyncio.sleep(RETRY)

    async def _embed_again(self, station: Worker[Station]) -> bool:
        """Vectors made after a turn that is no longer the one before theirs (a turn landed between: an
        import, or the earlier turns of a session the walk reached after its later ones), made again
        from the texts as they are now, a batch a step. One that fails lends nothing, and is not tried again."""
        ids = await self.memory.call(lambda m: ep.embed_again(m.conn, EMBED_BATCH))
        if not ids:
            return False
        await self._agent_first()
        try:
            async with self.embedding:
                batch, after = await self.memory.call(lambda m: ep.texts_to_embed(m.conn, ids))
                await station.call(lambda s: s.renew(batch))
                await self.memory.call(lambda m: ep.record_embedded_after(m.conn, after))
        except Exception:
            await self.memory.call(lambda m: ep.never_lend(m.conn, ids))
            raise
        return True

    async def _agent_first(self) -> None:
        """Wait while the agent's turn needs the CPU (pacing.py), at most MAX_DEFER."""
        wanted = time.monotonic()
        while (delay := embed_delay(self.activity, wanted, time.monotonic())) > 0:
            self._activity_changed.clear()
            await _wait(self._activity_changed, delay)

    async def _next_batch(self, gap: Range, station: Worker[Station], skim_below: int
                          ) -> tuple[Range, list[tuple[int, float, str]], list[tuple[int, int]]]:
        """The newest episodes in `gap` without a vector (at most EMBED_BATCH; at or below `skim_below`,
        those of the first pass alone), with the range of ids this step has dealt with, and the turn each
        is embedded after (ep.texts_to_embed)."""
        ids = await self.memory.call(lambda m: ep.ids_between(m.conn, gap[0], gap[1], SCAN, skim_below))
        todo = (await station.call(lambda s: s.without_vector(ids)))[:EMBED_BATCH]
        low = todo[-1] if len(todo) == EMBED_BATCH else ids[-1] if len(ids) == SCAN else gap[0]
        batch, after = await self.memory.call(lambda m: ep.texts_to_embed(m.conn, todo)) if todo else ([], [])
        return (low, gap[1]), batch, after

    async def _adopt_legacy(self, model: str, station: Worker[Station]) -> None:
        """Vectors kept in memory.db (before the store) move into it, a page at a time, then leave it."""
        self._adopting = True
        try:
            moved, started = 0, time.monotonic()
            while page := await self.memory.call(partial(_legacy, model=model)):
                await station.call(lambda s: s.adopt(page))
                await self.memory.call(lambda m: ep.drop_legacy(m.conn, model, page[-1][0]))
                moved += len(page)
            await self.memory.call(lambda m: ep.drop_legacy(m.conn, model, None))
            if moved:
                log.info("recall_vectors_moved", vectors=moved, seconds=round(time.monotonic() - started, 1))
        finally:
            self._adopting = False

    def status(self) -> dict[str, Any]:
        """How far the index and the vectors are behind the turns."""
        h = self.health
        out: dict[str, Any] = {"turns": self._episodes, "turns_waiting_for_index": h.turns_waiting,
                               "last_error": h.last_error}
        if self.embed is not None:
            waiting = max(0, self._episodes - h.embedded)
            rate = self._rate.per_second(time.monotonic())
            out["embedding"] = {"embedded": h.embedded, "waiting": waiting,
                                "per_second": None if rate is None else round(rate, 2),
                                "eta_s": None if not rate or not waiting else round(waiting / rate),
                                "moving_old_vectors": self._adopting}
        return out


async def _wait(event: asyncio.Event, seconds: float) -> None:
    """Until `event` is set, or `seconds` pass. (asyncio.timeout, not wait_for: on 3.11 a cancel that meets
    wait_for's own timeout can be swallowed, and a task stopped then never ends.)"""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


def _record_embedded_after(memory: MemoryDB, after: Sequence[tuple[int, int]]) -> None:
    ep.record_embedded_after(memory.conn, after)


def _stage_turns(memory: MemoryDB, step: tuple[list[Observation], Range], held: Marks) -> Staged:
    return stage_turns(memory.conn, *step, held)


def _learning_changes(memory: MemoryDB, ids: list[int]) -> Staged:
    return learning_changes(memory.conn, ids)


def _stage_learnings(memory: MemoryDB, held: Marks) -> Staged | None:
    return stage_learnings(memory.conn, held)


def _legacy(memory: MemoryDB, model: str) -> list[tuple[int, float, bytes]]:
    return ep.legacy_vectors(memory.conn, model, LEGACY_PAGE)
