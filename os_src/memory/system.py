"""The memory system as the runtime sees it: turn capture, the compaction hooks, the search
tool, auto-recall, the boot prompt, health.

It owns the two database threads, the transcript writer and the turn journal (and the
thread that writes their files), the daemon task and the curator client, the recall
index and its indexer (memory/recall/service.py), and holds the writer lock so that only one
process curates a workspace's memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from claude_agent_sdk import HookMatcher

from ..config import Settings
from ..db_worker import Reads, Worker
from ..fsutil import WriterLock
from ..logs import get_logger
from .capture.journal import TurnJournal, journal_path, recover
from .capture.recorder import TurnRecord, TurnRecorder
from .capture.spill import ObservationWrite, Write, write_key
from .capture.writer import TranscriptWriter
from .curation.budget import DailyBudget
from .curation.curator import check_batch_tokens
from .curation.daemon import MemoryDaemon
from .files import MemoryFiles
from .forget_turns import Forgotten, TurnForgetting, hidden_lines
from .hooks import CompactionHooks, HookTimings
from .loader import BootLoader
from .memory_store import MemoryDB
from .processor import BatchProcessor, CuratorClient
from .recall.searcher import RecallHit
from .recall.service import Recalled, RecallService
from .transcript_store import NewObservation, Observation, TranscriptDB

log = get_logger(__name__)

SHUTDOWN_FLUSH_BUDGET = 10.0
CAPTURE_STOP_BUDGET = 5.0  # to land the last turns at shutdown; what is left stays in the spill file
REPLAY_BUDGET = 2.0  # at start, for the turns an earlier run left to land before the first batch
BOOT_SETTLE_BUDGET = 15.0  # a new session waits this long, at most, for the last session's batch
RECALL_SETTLE_BUDGET = 2.0  # ...and this long for what that batch learned to be searchable
HEALTH_CACHE_SECONDS = 1.0
FORGET_DRAIN_BUDGET = 5.0  # a forget waits this long, at most, for the turns still being written


class MemorySystem:
    def __init__(self, settings: Settings) -> None:
        check_batch_tokens(settings.memory_batch_tokens)  # a bad setting fails before the server listens
        layout = settings.layout
        self.settings = settings
        self.transcript: Worker[TranscriptDB] = Worker("transcript", lambda: TranscriptDB(layout.transcript_db))
        self.memory: Worker[MemoryDB] = Worker("memory", lambda: MemoryDB(layout.memory_db))
        # What other tasks (the console) may do with memory.db's thread: read. The daemon writes it.
        self.memory_reads = Reads(self.memory)
        self.files = MemoryFiles(layout)
        self.curator = CuratorClient(settings)
        self.processor = BatchProcessor(self.transcript, self.memory, self.files, self.curator)
        self.daemon = MemoryDaemon(self.processor, settings.memory_batch_turns,
                                   budget=DailyBudget(settings.memory_daily_budget_usd),
                                   batch_tokens=settings.memory_batch_tokens)
        self.timings = HookTimings()
        self.recall = RecallService(settings, self.transcript, self.memory)
        self.processor.on_commit = self.recall.learned
        self._capture_files = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture-files")
        self.journal = TurnJournal(journal_path(layout), self._capture_files)
        self.writer = TranscriptWriter(self.transcript, layout, self._capture_files, on_durable=self._durable)
        self.recorder = TurnRecorder(self.writer, self.daemon.note_turn, self.timings, self.journal)
        self.forgetting = TurnForgetting(layout, self.transcript, self.memory, self.files, self.recall.forget,
                                         self.daemon.trigger, self.daemon.apply)
        self.daemon.before_batches = self.forgetting.rewrite_files  # the files' one writer takes lines out
        self.loader = BootLoader(self.files, self.memory, self._pending_turns, self._hidden_lines)
        self.compaction = CompactionHooks(self._flush, self.loader.refresh_context,
                                          settings.precompact_budget, self.timings)
        self._lock = WriterLock(layout.memory_lock)
        self._counted: tuple[float, dict[str, int], dict[str, Any]] = (-1e9, {}, {})

    async def start(self) -> None:
        self.settings.layout.ensure()
        self._lock.acquire()
        # What an earlier run left unwritten comes first: its spill file, then its turn journal
        # (the turn it was killed in, recorded with a note).
        loop = asyncio.get_running_loop()
        recovered = await loop.run_in_executor(self._capture_files, recover, journal_path(self.settings.layout))
        self.journal.restore(recovered)
        await self.writer.start([ObservationWrite(obs) for obs in recovered])
        await self.writer.drained(REPLAY_BUDGET)
        await self.recall.start()
        await self.daemon.start()
        counts = await self.transcript.call(lambda t: t.counts())
        log.info("memory_started", **counts, batch_turns=self.settings.memory_batch_turns,
                 model=self.settings.memory_model, daily_budget_usd=self.settings.memory_daily_budget_usd,
                 batch_tokens=self.settings.memory_batch_tokens)

    async def stop(self) -> None:
        await self.writer.stop(CAPTURE_STOP_BUDGET)  # first: the flush below must see the last turns
        await self.journal.flush()
        await self.daemon.stop(flush_budget=SHUTDOWN_FLUSH_BUDGET)
        await self.recall.stop()
        await self.curator.close()
        await asyncio.gather(self.transcript.close(), self.memory.close())
        self._capture_files.shutdown(wait=False)  # idle by now: the journal and the writer are done
        self._lock.release()

    def _durable(self, write: Write) -> None:
        if isinstance(write, ObservationWrite):
            session, sequence = write_key(write)
            self.journal.durable((session, int(sequence)))
            self.recall.indexer.nudge()  # the turn is in transcript.db (or the spill file, which lands later)

    async def _flush(self, reason: str, budget: float) -> bool:
        """Curate every turn so far (before a compaction): the turns still being written first."""
        started = time.monotonic()
        await self.writer.drained(budget / 2)
        return await self.daemon.flush(reason, budget - (time.monotonic() - started))

    async def _hidden_lines(self) -> set[str]:
        return await self.memory.call(hidden_lines)

    async def forget_turns(self, ids: Sequence[int] = (), *, turn_ids: Sequence[str] = (),
                           session_id: str | None = None, by: str) -> Forgotten:
        """A person forgets turns (by id, by their id on the wire, or a whole session): their words
        leave every store now, the memory files on the daemon's next pass (memory/forget_turns.py).
        The turns still being written land first."""
        await self.writer.drained(FORGET_DRAIN_BUDGET)
        wanted = list(ids)
        if turn_ids:
            wanted += await self.transcript.call(lambda t: t.ids_of(turn_ids=turn_ids))
        if session_id is not None:
            wanted += await self.transcript.call(lambda t: t.ids_of(session_id=session_id))
        return await self.forgetting.forget(wanted, by)

    async def _pending_turns(self, limit: int) -> Sequence[Observation | NewObservation]:
        """The newest turns not yet curated: in transcript.db, and still on their way to it."""
        recorded: list[Observation] = await self.transcript.call(lambda t: t.recent_pending(limit))
        seen = {(o.session_id, o.sequence_num) for o in recorded}
        waiting = [o for o in self.writer.waiting() if (o.session_id, o.sequence_num) not in seen]
        return [*recorded, *waiting]

    # ------------------------------------------------------------ what the runtime uses

    def hooks(self) -> dict[Any, list[HookMatcher]]:
        """Only what a hook alone can do: turns are captured from the runtime's stream."""
        budget = self.settings.precompact_budget
        return {
            "PreCompact": [HookMatcher(hooks=[self.compaction.on_pre_compact], timeout=budget + 10)],
            "SessionStart": [HookMatcher(hooks=[self.compaction.on_session_start])],
        }

    async def boot_prompt(self) -> str:
        if not await self.daemon.settle(BOOT_SETTLE_BUDGET):
            log.warning("boot_without_latest_memory", budget=BOOT_SETTLE_BUDGET)
        prompt = await self.loader.boot_prompt()
        self.recall.booted_with(prompt)  # auto-recall never repeats it
        await self.recall.settle(RECALL_SETTLE_BUDGET)  # what the last batch learned is searchable too
        return prompt

    def session_started(self, session_id: str) -> None:
        self.recorder.start_session(session_id)

    def session_ended(self, session_id: str, reason: str) -> None:
        self.recorder.end_session(session_id)
        self.daemon.trigger(f"session-end-{reason}")

    def turn_started(self, prompt: str, turn_id: str | None = None) -> TurnRecord:
        self.curator.warm()  # a batch will follow: its SDK loads meanwhile, off the loop
        return self.recorder.open(prompt, turn_id)

    async def search(self, query: str, limit: int) -> list[RecallHit]:
        """Episodes and learnings together, best first (search_memory, the console)."""
        return await self.recall.search(query, limit)

    async def recall_for(self, message: str, session_id: str, turn_id: str) -> Recalled | None:
        """Auto-recall for a person's message: the prompt to send and what was added, or None."""
        return await self.recall.auto_recall(message, session_id, turn_id)

    @property
    def degraded(self) -> bool:
        """The curator has failed three calls in a row, or capture's writes are failing."""
        return bool(self.daemon.clock.report()["degraded"] or self.writer.status()["degraded"])

    async def health(self) -> dict[str, Any]:
        # Count at most once a second, whatever the request rate.
        now = time.monotonic()
        if now - self._counted[0] > HEALTH_CACHE_SECONDS:
            self._counted = (now, await self.transcript.call(lambda t: t.counts()),
                             await self.daemon.budget_status())
        return {**self.daemon.status(), "observations": self._counted[1], "budget": self._counted[2],
                "capture": self.writer.status(), "hook_errors": self.timings.errors, "recall": self.recall.status()}
