"""The memory system as the runtime sees it: turn capture, the compaction hooks, the search
tool, auto-recall, the boot prompt, health.

It owns the two database threads, the daemon task and the curator client, the recall
index and its indexer (recall_service.py), and holds the writer lock so that only one
process curates a workspace's memory.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from claude_agent_sdk import HookMatcher
from claude_agent_sdk.types import McpSdkServerConfig

from ..config import Settings
from ..db_worker import Worker
from ..fsutil import WriterLock
from ..logs import get_logger
from ..tools.memory_search import memory_search_server
from .budget import DailyBudget
from .capture import TurnRecord, TurnRecorder
from .daemon import MemoryDaemon
from .files import MemoryFiles
from .hooks import CompactionHooks, HookTimings
from .loader import BootLoader
from .memory_store import MemoryDB
from .processor import BatchProcessor, CuratorClient
from .recall import RecallHit
from .recall_service import Recalled, RecallService
from .transcript_store import TranscriptDB

log = get_logger(__name__)

SHUTDOWN_FLUSH_BUDGET = 10.0
BOOT_SETTLE_BUDGET = 15.0
RECALL_SETTLE_BUDGET = 2.0
HEALTH_CACHE_SECONDS = 1.0  # a new session waits this long, at most, for the last session's batch


class MemorySystem:
    def __init__(self, settings: Settings) -> None:
        layout = settings.layout
        self.settings = settings
        self.transcript: Worker[TranscriptDB] = Worker("transcript", lambda: TranscriptDB(layout.transcript_db))
        self.memory: Worker[MemoryDB] = Worker("memory", lambda: MemoryDB(layout.memory_db))
        self.files = MemoryFiles(layout)
        self.curator = CuratorClient(settings)
        self.processor = BatchProcessor(self.transcript, self.memory, self.files, self.curator)
        self.daemon = MemoryDaemon(self.processor, settings.memory_batch_turns,
                                   budget=DailyBudget(settings.memory_daily_budget_usd),
                                   batch_tokens=settings.memory_batch_tokens)
        self.timings = HookTimings()
        self.recall = RecallService(settings, self.transcript, self.memory)
        self.processor.on_commit = self.recall.learned
        self.recorder = TurnRecorder(self.transcript, self._turn_recorded, self.timings)
        self.loader = BootLoader(self.files, self.memory)
        self.compaction = CompactionHooks(self.daemon.flush, self.loader.refresh_context,
                                          settings.precompact_budget, self.timings)
        self._lock = WriterLock(layout.memory_lock)
        self._counted: tuple[float, dict[str, int], dict[str, Any]] = (-1e9, {}, {})

    async def start(self) -> None:
        self.settings.layout.ensure()
        self._lock.acquire()
        await self.daemon.start()
        await self.recall.start()
        counts = await self.transcript.call(lambda t: t.counts())
        log.info("memory_started", **counts, batch_turns=self.settings.memory_batch_turns,
                 model=self.settings.memory_model, daily_budget_usd=self.settings.memory_daily_budget_usd,
                 batch_tokens=self.settings.memory_batch_tokens)

    async def stop(self) -> None:
        await self.recall.stop()
        await self.daemon.stop(flush_budget=SHUTDOWN_FLUSH_BUDGET)
        await self.curator.close()
        await asyncio.gather(self.transcript.close(), self.memory.close())
        self._lock.release()

    # ------------------------------------------------------------ what the runtime uses

    def hooks(self) -> dict[Any, list[HookMatcher]]:
        """Only what a hook alone can do: turns are captured from the runtime's stream."""
        budget = self.settings.precompact_budget
        return {
            "PreCompact": [HookMatcher(hooks=[self.compaction.on_pre_compact], timeout=budget + 10)],
            "SessionStart": [HookMatcher(hooks=[self.compaction.on_session_start])],
        }

    def mcp_servers(self) -> dict[str, McpSdkServerConfig]:
        return {"memory": memory_search_server(self.search)}

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

    def turn_started(self, prompt: str) -> TurnRecord:
        return self.recorder.open(prompt)

    def _turn_recorded(self) -> None:
        self.daemon.note_turn()
        self.recall.indexer.nudge()  # the turn's write is queued before the indexer's read of it

    async def search(self, query: str, limit: int) -> list[RecallHit]:
        """Episodes and learnings together, best first (search_memory, the console)."""
        return await self.recall.search(query, limit)

    async def recall_for(self, message: str, session_id: str, turn_id: str) -> Recalled | None:
        """Auto-recall for a person's message: the prompt to send and what was added, or None."""
        return await self.recall.auto_recall(message, session_id, turn_id)

    async def health(self) -> dict[str, Any]:
        # /healthz is unauthenticated: count at most once a second, whatever the request rate.
        now = time.monotonic()
        if now - self._counted[0] > HEALTH_CACHE_SECONDS:
            self._counted = (now, await self.transcript.call(lambda t: t.counts()),
                             await self.daemon.budget_status())
        return {**self.daemon.status(), "observations": self._counted[1], "budget": self._counted[2],
                "hook_errors": self.timings.errors, "recall": self.recall.status()}
