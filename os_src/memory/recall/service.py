"""Recall in the server: the index, its indexer, the searcher's thread, the dense retriever.

The searcher owns a read connection to memory.db, the recall index and a reader of the vector
store on a thread of its own ("recall"), so a search never waits behind the daemon's writes;
the index's writer has its own thread, the turns' embedder its own, with the store's writer
(memory/recall/indexer.py). If the dense retriever cannot load, search is lexical only and
`status` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...config import Settings
from ...database import connect, on_read_only_disk, read_only_disk
from ...db_worker import Worker
from ...errors import log_expected
from ...fsutil import atomic_write
from ...logs import get_logger
from ...paths import Layout
from ..memory_store import MemoryDB
from ..schema import PURGE_FAILED, PURGE_KEY, PURGED, PURGING
from ..transcript_store import TranscriptDB
from . import auto as auto_recall
from . import episodes as ep
from .dense import DenseStatus, Embedder, load
from .documents import Marks, forgotten, rewrite, write_marks
from .hits import memory_texts
from .index import RecallIndex, exists
from .indexer import Indexer, Station
from .learnings import search_learnings, search_terms
from .searcher import LEARNING_SNIPPET_CHARS, Dense, RecallHit, Searcher, embedded, snippet
from .vectors import Matrix, VectorReader, VectorWriter, forget_everywhere, store_dir

log = get_logger(__name__)

INDEX_DIR = "index"
VECTORS_DIR = "vectors"
PROGRESS_FILE = "recall.json"  # in .os/state/: the server's recall status, for `memory status` in a shell
PUBLISH_EVERY = 5.0
FRESH = 30.0  # a published status older than this is the last word of a server that is gone
AUTO_RECALL_TIMEOUT = 0.5  # a recall slower than this is skipped: the message goes as it is
LEARNED_BUDGET = 3.0  # a batch waits this long, at most, for its learnings to be searchable
KEPT_NEAR = 5  # kept turns and learnings a forget compares a reworded line with
KEPT_NEAR_SETTLE = 30.0  # seconds a forget's check waits, at most, for the turns recorded so far to be searchable


def index_path(memory_dir: Path) -> Path:
    return memory_dir / INDEX_DIR


def vectors_path(memory_dir: Path, model: str) -> Path:
    """The vector store of `model`'s vectors (a store per model: another model's are embedded again)."""
    return store_dir(memory_dir / VECTORS_DIR, model)


def published(layout: Layout, now: float | None = None) -> dict[str, Any] | None:
    """What the running server last said about recall (its embedding rate...), if it said it lately."""
    try:
        found = json.loads((layout.state_dir / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    at = found.get("at") if isinstance(found, dict) else None
    fresh = isinstance(at, (int, float)) and abs((time.time() if now is None else now) - at) <= FRESH
    return found if fresh else None


def read_connection(path: Path) -> sqlite3.Connection:
    if on_read_only_disk(path):  # a `memory` command's search on a disk gone read-only
        return read_only_disk(path)
    conn = connect(path)
    conn.execute("PRAGMA query_only=1")
    return conn


@dataclass(frozen=True)
class Recalled:
    """What auto-recall added to a message (the runtime tells clients: agent/frames.recall_frame)."""

    context: str  # the memories, sent before the person's message as a block of its own
    memories: list[RecallHit]
    tokens: int  # the context's estimated size


def auto_recalled(searcher: Searcher, message: str, now: float, session_id: str | None, boot: str,
                  budget_tokens: int) -> list[RecallHit]:
    """The memories auto-recall sends with `message`: the one path the runtime (on the recall
    thread) and `sprite-os memory recall` both take. Nothing for a slash command (the CLI must see
    it first) or a message with no word to search for; never the turns of `session_id` (the
    current session: the agent has them), never what the boot prompt (`boot`, normalised) says."""
    if message.startswith("/") or not search_terms(message):
        return []
    cue: list[auto_recall.Cues] = []  # worked out once the search knows its spread

    def cues() -> auto_recall.Cues:
        if not cue:
            cue.append(auto_recall.cues(message, searcher.spread, searcher.known))
        return cue[0]

    hits = searcher.search(message, now, auto_recall.SEARCHED, exclude_session=session_id,
                           worth=lambda best: auto_recall.could_ask(best, cues()))
    return auto_recall.select(hits, boot, budget_tokens, cues())


class RecallService:
    def __init__(self, settings: Settings, transcript: Worker[TranscriptDB], memory: Worker[MemoryDB], *,
                 on_purge_ended: Callable[[bool], None] = lambda purged: None) -> None:
        """`on_purge_ended`: told at the end of each rewrite of the index after a forget whether it succeeded
        (the forget pass, which waits for it and owns its tries again)."""
        self.settings = settings
        self.path = index_path(settings.layout.memory_dir)
        self._index: RecallIndex | None = None
        self._dense_status = DenseStatus(False, None, "not loaded yet")
        self._query_model: Embedder | None = None
        self._dense: Dense | None = None  # the searcher's dense half (its vectors read on the recall thread)
        self._embed_model: Embedder | None = None
        self.index = Worker("recall-index", self._the_index)
        self.searcher: Worker[Searcher] = Worker("recall", self._open_searcher)
        self.embedder: Worker[Station] = Worker("recall-embed", self._the_station)
        self.indexer = Indexer(transcript, memory, self.index)
        self._memory = memory
        self._boot = ""
        self._purge: asyncio.Task[None] | None = None  # the index written anew after a forget
        self._purge_wanted = self._purge_done = 0
        self._on_purge_ended = on_purge_ended
        self._publisher: asyncio.Task[None] | None = None

    def _the_index(self) -> RecallIndex:
        assert self._index is not None
        return self._index

    def _vectors(self) -> Path:
        assert self._dense_status.model is not None
        return vectors_path(self.settings.layout.memory_dir, self._dense_status.model)

    def _the_station(self) -> Station:
        assert self._embed_model is not None and self._dense_status.model is not None
        return Station(self._embed_model, VectorWriter(self._vectors(), self._dense_status.model))

    def _open_searcher(self) -> Searcher:
        return Searcher(read_connection(self.settings.layout.memory_db), self._the_index(), self._dense)

    async def start(self) -> None:
        fresh = not exists(self.path)
        try:
            self._index = await asyncio.to_thread(RecallIndex, self.path, True)
        except Exception as exc:  # unreadable: derived data, so set it aside and index everything again
            aside = self.path.with_name(f"{self.path.name}.broken-{int(time.time())}")
            log.error("recall_index_unreadable", error=repr(exc)[:300], moved_to=str(aside))
            await asyncio.to_thread(self.path.rename, aside)
            fresh = True
            self._index = await asyncio.to_thread(RecallIndex, self.path, True)
        if self.settings.recall_dense_weight > 0:
            setting = self.settings.embedding_model
            self._query_model, self._dense_status = await asyncio.to_thread(load, setting)
            if self._query_model is not None:
                self._embed_model, _ = await asyncio.to_thread(load, setting)
                self._dense = Dense(self._query_model, VectorReader(self._vectors()), self.settings.recall_dense_weight)
        else:
            self._dense_status = DenseStatus(False, None, "switched off (SPRITE_RECALL_DENSE_WEIGHT=0)")
        if self._embed_model is not None:
            self.indexer.embed, self.indexer.model = self.embedder, self._dense_status.model
        await self.indexer.start(fresh_index=fresh)
        if await self._memory.call(lambda m: m.get_meta(PURGE_KEY)):  # a forget's purge, cut short
            await self._forget_vectors(await self._memory.call(lambda m: ep.forgotten_ids(m.conn)))
            if fresh:  # a new index is filled from memory.db, which has none of their words
                await self._memory.call(lambda m: m.conn.execute("DELETE FROM meta WHERE key = ?", (PURGE_KEY,)))
            else:
                self._purge_wanted += 1
                self._start_purge()
        self._publisher = asyncio.create_task(self._publish(), name="recall-progress")
        log.info("recall_started", index=str(self.path), fresh=fresh, dense=self._dense_status.available,
                 dense_detail=self._dense_status.detail)

    async def _publish(self) -> None:
        """The status, for `memory status` run in a shell, every PUBLISH_EVERY seconds."""
        path = self.settings.layout.state_dir / PROGRESS_FILE
        while True:
            await asyncio.sleep(PUBLISH_EVERY)
            try:
                body = json.dumps({**self.status(), "at": time.time()}).encode()
                await asyncio.to_thread(atomic_write, path, body)
            except OSError as exc:  # a full disk: the status waits, nothing else does
                log.warning("recall_progress_unwritten", error=repr(exc)[:200])

    async def stop(self) -> None:
        if self._purge is not None:  # a rewrite under way finishes on the index's thread; its marks, next start
            self._purge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._purge
        if self._publisher is not None:
            self._publisher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publisher
        await self.indexer.stop()
        await asyncio.gather(self.searcher.close(), self.embedder.close())
        if self._dense is not None:  # the searcher closed it, if it was ever opened
            await asyncio.to_thread(self._dense.close)
        await self.index.close()  # the writer finishes its merges and lets go of the directory

    async def learned(self) -> bool:
        """A batch committed learnings: index them, and wait (briefly) until they are searchable."""
        self.indexer.nudge()
        return await self.settle(LEARNED_BUDGET)

    async def settle(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, until the index holds what is recorded and learned so far."""
        if self._index is None:
            return False
        try:
            await asyncio.wait_for(self.indexer.current.wait(), budget)
            return True
        except TimeoutError:
            return False

    async def embed_passages(self, texts: Sequence[str]) -> Matrix | None:
        """`texts`' vectors as passages, on the embedder's thread; None without a dense model."""
        if self._embed_model is None:
            return None
        wanted = list(texts)
        return await self.embedder.call(lambda station: station.model.passages(wanted))

    async def kept_near(self, lines: Sequence[tuple[str, bool]]) -> list[list[str]]:
        """For each memory-file line (its text, and whether to search by meaning too, not by words
        alone), what the turns and learnings search finds nearest to it say (after a forget: only kept
        ones), so that a line another turn still supports stays. Waits briefly for the index to hold
        what is recorded (a turn not yet searchable can't keep a line: past that wait, TimeoutError)."""
        if self._index is None:
            raise RuntimeError("recall is not started: no kept turn can be searched")
        self.indexer.nudge()
        if not await self.settle(KEPT_NEAR_SETTLE):  # a kept turn not searchable yet could not keep its line
            raise TimeoutError(f"the word index is still behind what is recorded after {KEPT_NEAR_SETTLE:.0f} s")
        now, wanted = time.time(), list(lines)

        def look(s: Searcher) -> list[list[str]]:
            # whole texts, not snippets (a long turn says a fact past its first 240 characters), and of a
            # turn only the person's part: the agent's answer echoes memory, and can't keep what was forgotten
            out = []
            for line, meaning in wanted:
                hits = s.search(line, now, KEPT_NEAR, use_dense=meaning)
                said = memory_texts(s.conn, hits)
                out.append([said[(h.kind, h.id)].text if (h.kind, h.id) in said else h.snippet for h in hits])
            return out

        return await self.searcher.call(look)

    async def forget(self, episode_ids: Sequence[int], learning_ids: Sequence[int]) -> None:
        """Turns a person forgot (memory.db no longer has their text, nor the learnings deleted with
        them): their vectors are zeroed in the store (every model's) and their documents leave the
        word index, now. A deletion only marks a document, its words stay in the segment until a
        merge, so the index is then written anew in the background (`purge`), its old segment files
        deleted. A flag in memory.db's meta, set first, makes a restart finish both."""
        self.indexer.forgetting()  # what the indexer staged before now is staged again, never written after this
        await self._memory.call(lambda m: m.set_meta(PURGE_KEY, "1"))
        if self._index is None:  # not started (a tool that only reads): the server's start does it, by the flag
            return
        await self._forget_vectors(episode_ids)
        staged = await self._memory.call(lambda m: forgotten(m.conn, episode_ids, learning_ids))

        def write(index: RecallIndex) -> None:
            index.put(staged.docs, staged.replace)
            index.commit()

        await self.index.call(write)
        self._purge_wanted += 1
        self._start_purge()

    async def _forget_vectors(self, ids: Sequence[int]) -> None:
        """The forgotten turns' vectors zeroed, and the vectors of the turns just after them made again
        without their words (a vector holds the person's words of the turn before: episodes.embed_text),
        before this returns. Through the embedder's thread, the store's one writer; with no embedder, no
        writer runs, and the turns after lose their vectors (no model here can make them again)."""
        wanted = list(ids)
        if not wanted:
            return
        root = self.settings.layout.memory_dir / VECTORS_DIR
        if self._embed_model is not None:
            async with self.indexer.embedding:  # no batch read before the forget is stored after it
                after, made_after = await self._memory.call(
                    lambda m: ep.texts_to_embed(m.conn, ep.turns_after(m.conn, wanted)))
                zeroed, renewed = await self.embedder.call(lambda s: s.forget(root, wanted, after))
                await self._memory.call(lambda m: ep.record_embedded_after(m.conn, made_after))
        else:  # their vectors are dropped, none made: nothing to record
            after, _ = await self._memory.call(lambda m: ep.texts_to_embed(m.conn, ep.turns_after(m.conn, wanted)))
            zeroed, renewed = await asyncio.to_thread(
                forget_everywhere, root, wanted, None, [i for i, _, _ in after]), 0
        log.info("recall_vectors_forgotten", turns=len(wanted), zeroed=zeroed, made_again=renewed)

    def _start_purge(self) -> None:
        if self._purge is None or self._purge.done():
            self._purge = asyncio.create_task(self._purging(), name="recall-purge")

    async def _purging(self) -> None:
        path = self.settings.layout.memory_db

        def write(index: RecallIndex) -> Marks:
            conn = read_connection(path)
            try:
                return rewrite(conn, index)
            finally:
                conn.close()

        while self._purge_done < self._purge_wanted:
            wanted = self._purge_wanted
            started = time.monotonic()
            try:
                reached = await self.index.call(write)
            except Exception as exc:  # retried by the forget pass (`purge_state`), a forget or a start: the flag stays
                log.exception("recall_purge_failed", error=repr(exc)[:300])
                self._on_purge_ended(False)  # the forget pass keeps its job and tries the purge again
                return
            self._purge_done = wanted
            done = self._purge_done >= self._purge_wanted

            def mark(m: MemoryDB, reached: Marks = reached, done: bool = done) -> None:
                write_marks(m.conn, reached)
                if done:
                    m.conn.execute("DELETE FROM meta WHERE key = ?", (PURGE_KEY,))

            try:
                await self._memory.call(mark)
            except Exception as exc:  # the index's files are rewritten: the flag stays, the next start does it again
                log_expected(log, "recall_purge_unrecorded", exc)
            log.info("recall_index_purged", seconds=round(time.monotonic() - started, 2))
        # The rewrite's end, however its record in memory.db went: it used to end the task with that error, which
        # nothing awaited but a stop (it failed with it), and the pass waiting for the rewrite was never asked for
        self._on_purge_ended(True)

    def purge_state(self) -> str:
        """Whether the word index still holds forgotten words in its files: PURGED, PURGING (the rewrite under way:
        its end calls `on_purge_ended`), or PURGE_FAILED (the last rewrite failed; `purge_again` tries it again)."""
        if self._purge_done >= self._purge_wanted:
            return PURGED
        return PURGING if self._purge is not None and not self._purge.done() else PURGE_FAILED

    def purge_again(self) -> None:
        """Try again a rewrite of the index that failed (the forget pass's retry), now, in the background."""
        self._start_purge()

    async def purged(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, until no forgotten word is left in the index's files."""
        if self._purge is None:
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._purge), budget)
        return self._purge.done() and self._purge_done >= self._purge_wanted

    def booted_with(self, prompt: str) -> None:
        self._boot = auto_recall.normalise(prompt)

    async def search(self, query: str, limit: int, exclude_session: str | None = None) -> list[RecallHit]:
        if not query.strip():
            return []
        if self._index is None:  # not started (a tool that only reads): learnings alone, by FTS5
            return await self._learnings(query, limit)
        now = time.time()
        return await self.searcher.call(lambda s: s.search(query, now, limit, exclude_session))

    async def _learnings(self, query: str, limit: int) -> list[RecallHit]:
        terms = search_terms(query)
        if not terms:
            return []
        found = await self._memory.call(lambda m: search_learnings(m, terms, limit))
        return [RecallHit("learning", h.id, h.score, h.created_at, None, None, None, h.type,
                          snippet(h.content, terms, LEARNING_SNIPPET_CHARS), bm25=h.score) for h in found]

    def _recalls(self, message: str, session_id: str) -> bool:
        """Could auto-recall search for `message` in `session_id` (before its budget and its gate)?"""
        if not self.settings.auto_recall or message.startswith("/") or not search_terms(message):
            return False
        return self._index is None or self.indexer.reach.beyond(session_id)

    def expect(self, message: str, session_id: str) -> None:
        """A message has arrived for the agent: the embedding its auto-recall will search with begins now,
        on the query model's thread, so that it is made while the turn starts (or while the CLI boots,
        or while the turn before it runs) rather than after. The same vector, made once: the search takes
        it (Dense.expect). Nothing when auto-recall would not search by meaning. Never raises: the
        message is queued already, and its search embeds it anyway."""
        try:
            if self._dense is not None and self._index is not None and self._recalls(message, session_id):
                self._dense.expect(embedded(message, time.time()))
        except Exception as exc:  # an executor shut down as the server stops
            log_expected(log, "auto_recall_expect_failed", exc)

    async def auto_recall(self, message: str, session_id: str, turn_id: str) -> Recalled | None:
        """The memories `message` calls up, as the context to send before it, or None when none pass (or
        auto-recall is off, or the message is a slash command the CLI must see first). Never
        raises, and gives up after AUTO_RECALL_TIMEOUT: the message then goes as it is."""
        if not self._recalls(message, session_id):
            return None  # off, a slash command, or a first session with nothing learned: no trip to the recall thread
        now, boot, budget = time.time(), self._boot, self.settings.auto_recall_tokens
        try:
            async with asyncio.timeout(AUTO_RECALL_TIMEOUT):
                if self._index is None:  # not started: learnings alone, through the same floor
                    found = await self._learnings(message, auto_recall.SEARCHED)
                    chosen = auto_recall.select(found, boot, budget, auto_recall.cues(message, None, lambda _: False))
                else:
                    chosen = await self.searcher.call(
                        lambda s: auto_recalled(s, message, now, session_id, boot, budget))
        except TimeoutError:
            log.warning("auto_recall_slow", timeout_s=AUTO_RECALL_TIMEOUT)
            return None
        except Exception as exc:
            log_expected(log, "auto_recall_failed", exc)
            return None
        if not chosen:
            return None
        log.info("auto_recall", turn_id=turn_id, memories=len(chosen), tokens=auto_recall.tokens(chosen))
        return Recalled(auto_recall.render(chosen), chosen, auto_recall.tokens(chosen))

    def status(self) -> dict[str, Any]:
        d = self._dense_status
        return {"index": str(self.path), "dense": {"available": d.available, "model": d.model, "detail": d.detail},
                "purge_pending": self._purge_done < self._purge_wanted, **self.indexer.status()}
