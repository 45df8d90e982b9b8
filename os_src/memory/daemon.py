"""The memory daemon: the one task that runs curator batches, so memory has one writer.

Triggers only ask for work; the daemon decides when it runs. A batch runs when
~25 turns have been recorded, when a session ends, before a compaction, and at
start (for whatever a crash left). Batches never run on the agent's path: a
turn never waits for the model call, except PreCompact, which waits for its
flush within a bounded budget.

When the proxy fails, observations stay pending and the daemon retries with
exponential backoff. After six hours of failure and at least five failed calls,
turns older than six hours are marked stale: no longer retried, still in
transcript.db for `memory rebuild`. When the failing started, and how many calls
failed, is kept in memory.db (`meta`), so a restart does not reset the clock;
the count keeps a Sprite that slept through six hours from calling its first
failures after waking "six hours of failure".

A reply that arrives but is unusable (UnusableReply: a refusal, garbage) is another
matter: the same turns may fail forever and hold back every newer one. After
UNUSABLE_LIMIT in a row for the oldest chunk, it is split in half and the halves run
one after the other; a single turn that still gets them is marked stale at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass
from typing import Any

from ..database import STALE, Observation
from ..logs import get_logger
from .curator import split_batch
from .processor import BatchProcessor, CuratorError, EditConflict, UnusableReply

log = get_logger(__name__)

BACKOFF_FIRST = 2.0
BACKOFF_MAX = 300.0
STALE_AFTER = 6 * 3600.0
STALE_MIN_FAILURES = 5  # besides the six hours: wall-clock time alone counts a Sprite's sleep as failing
FAILING_KEY = "daemon_failing"  # memory.db meta: {"since": epoch seconds, "failures": n}
CONFLICT_RETRY = 2.0
UNUSABLE_LIMIT = 3  # unusable replies in a row for one chunk, then it is split (one turn: marked stale)


@dataclass
class DaemonHealth:
    last_success_at: float | None = None
    last_failure_at: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    failing_since: float | None = None
    next_retry_at: float | None = None
    batches_run: int = 0
    running: bool = False


class MemoryDaemon:
    def __init__(self, processor: BatchProcessor, batch_turns: int, stale_after: float = STALE_AFTER) -> None:
        self.processor = processor
        self.batch_turns = batch_turns
        self.stale_after = stale_after
        self.health = DaemonHealth()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set when no batch is running or requested
        self._idle.set()
        self._reasons: list[str] = []
        # (observation id, future): resolved once every turn up to that id is curated, or a run fails.
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._turns_since_batch = 0
        self._conflicts = 0  # batches dropped in a row because a person was editing a file
        # Isolation of unusable replies, in memory only (a restart starts over with whole chunks):
        self._unusable: tuple[int, int] = (0, 0)  # (first id of the chunk, unusable replies in a row)
        self._parts: list[list[int]] = []  # the pieces of split chunks still to run, oldest first
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    # ------------------------------------------------------------ triggers (never block)

    def note_turn(self) -> None:
        """A turn was recorded. Every `batch_turns` turns, ask for a batch."""
        self._turns_since_batch += 1
        if self._turns_since_batch >= self.batch_turns:
            self.trigger("batch")

    def trigger(self, reason: str) -> None:
        self._reasons.append(reason)
        self._idle.clear()
        self._wake.set()

    async def settle(self, budget: float) -> bool:
        """If a batch is running or requested, wait (at most `budget` seconds) until the turns
        recorded so far are curated, without asking for more. A new session uses it to boot
        with what the last session's end produced; a long backlog costs it only the budget."""
        if self._idle.is_set():
            return True
        return await self._wait("settle", budget, trigger=False)

    async def flush(self, reason: str, budget: float) -> bool:
        """Ask for a batch and wait, at most `budget` seconds, until every turn recorded so far is
        curated. True if that happened in time."""
        if self._task is None or self._task.done():
            return False
        return await self._wait(reason, budget, trigger=True)

    async def _wait(self, reason: str, budget: float, trigger: bool) -> bool:
        target = await self.processor.transcript.call(lambda t: t.max_id())
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, waiter))
        if trigger:
            self.trigger(reason)
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), budget)
        except TimeoutError:
            log.warning("memory_wait_timeout", reason=reason, budget=budget)
            return False

    def _resolve(self, through: int | None, ok: bool) -> None:
        """Resolve the waiters whose turns are all curated (through=None: all of them)."""
        keep = []
        for target, waiter in self._waiters:
            if through is None or target <= through:
                if not waiter.done():
                    waiter.set_result(ok)
            else:
                keep.append((target, waiter))
        self._waiters = keep

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self._load_failing()
        await self.processor.recover()
        self._task = asyncio.create_task(self._run(), name="memory-daemon")
        self.trigger("start")

    async def stop(self, flush_budget: float) -> None:
        """Flush what is pending within the budget, then stop. What is left runs at next start."""
        if self._task is None:
            return
        if flush_budget > 0 and not self._task.done():
            await self.flush("shutdown", flush_budget)
        self._stopping = True
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._idle.set()
        self._resolve(None, False)

    # ------------------------------------------------------------ the owner task

    async def _run(self) -> None:
        delay: float | None = None
        while not self._stopping:
            if delay is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            reasons, self._reasons = self._reasons or ["retry"], []
            self.health.running = True
            try:
                ok, delay = await self._drain("+".join(sorted(set(reasons))))
            except Exception as exc:  # a bug, not a model failure: keep the daemon alive
                log.exception("memory_daemon_error", error=repr(exc))
                ok, delay = False, self._backoff(repr(exc))
            finally:
                self.health.running = False
                if not self._wake.is_set():
                    self._idle.set()
            self._resolve(None, ok)

    async def _drain(self, trigger: str) -> tuple[bool, float | None]:
        """Run batches until nothing is pending. Returns (success, seconds until retry)."""
        self._turns_since_batch = 0
        await self.processor.recover()  # a batch an earlier error left half-finished comes first
        while True:
            chunk = await self._next_chunk()
            if not chunk:
                return True, None
            try:
                await self.processor.process(chunk, trigger, self._conflicts)
            except EditConflict:
                self._conflicts += 1
                return False, CONFLICT_RETRY
            except UnusableReply as exc:
                if await self._isolate(chunk, str(exc)):
                    continue  # split, or one turn marked stale: go on at once, the proxy works
                return False, await self._failed(str(exc))
            except CuratorError as exc:  # transport: the same chunk is retried, whole
                return False, await self._failed(str(exc))
            self._conflicts = 0
            self._unusable = (0, 0)
            await self._succeeded()
            self._resolve(chunk[-1].id, True)

    async def _next_chunk(self) -> list[Observation]:
        """The oldest pending turns that fit one call: the first piece of a split chunk, if any."""
        pending = await self.processor.pending(self.batch_turns)
        while self._parts:
            part = set(self._parts[0])
            chunk = [o for o in pending if o.id in part]
            if chunk:
                return chunk
            self._parts.pop(0)  # done (or stale)
        return split_batch(pending)[0] if pending else []

    async def _isolate(self, chunk: list[Observation], error: str) -> bool:
        """Count an unusable reply for `chunk`. At UNUSABLE_LIMIT in a row, split the chunk in
        half, or mark a single turn stale, and return True. Below it, return False (retry)."""
        first, count = self._unusable
        count = count + 1 if first == chunk[0].id else 1
        if count < UNUSABLE_LIMIT:
            self._unusable = (chunk[0].id, count)
            return False
        self._unusable = (0, 0)
        ids = [o.id for o in chunk]
        if len(ids) > 1:
            half = len(ids) // 2
            self._parts[:1] = [ids[:half], ids[half:]]  # replaces the piece that failed, if it was one
            log.warning("memory_batch_split", first_id=ids[0], last_id=ids[-1], observations=len(ids),
                        unusable_replies=count)
        else:
            await self.processor.transcript.call(lambda t: t.set_processed(ids, STALE))
            log.error("observation_marked_stale", observation_id=ids[0], state=STALE,
                      reason="curator reply unusable", unusable_replies=count)
        # The proxy answered: this is not the failing the six-hour rule measures.
        self.health.last_failure_at, self.health.last_error = time.time(), error[:500]
        await self._clear_failing()
        return True

    async def _succeeded(self) -> None:
        self.health.last_success_at = time.time()
        self.health.batches_run += 1
        await self._clear_failing()

    async def _clear_failing(self) -> None:
        h = self.health
        was_failing = h.failing_since is not None
        h.consecutive_failures, h.failing_since, h.next_retry_at = 0, None, None
        if was_failing:
            await self._save_failing()

    async def _failed(self, error: str) -> float:
        delay = self._backoff(error)
        await self._save_failing()
        h = self.health
        if (h.failing_since is not None and time.time() - h.failing_since >= self.stale_after
                and h.consecutive_failures >= STALE_MIN_FAILURES):
            cutoff = time.time() - self.stale_after
            marked = await self.processor.transcript.call(lambda t: t.mark_stale_before(cutoff))
            if marked:
                log.error("observations_marked_stale", count=marked, state=STALE, hours=self.stale_after / 3600)
        return delay

    async def _load_failing(self) -> None:
        raw = await self.processor.memory.call(lambda m: m.get_meta(FAILING_KEY))
        try:
            saved = json.loads(raw) if raw else None
            since, failures = (float(saved["since"]), int(saved["failures"])) if saved else (None, 0)
        except (ValueError, TypeError, KeyError) as exc:  # a bad value only costs the stale clock
            log.warning("daemon_failing_unreadable", error=repr(exc))
            since, failures = None, 0
        self.health.failing_since, self.health.consecutive_failures = since, failures

    async def _save_failing(self) -> None:
        h = self.health
        value = json.dumps({"since": h.failing_since, "failures": h.consecutive_failures}) \
            if h.failing_since is not None else ""
        await self.processor.memory.call(lambda m: m.set_meta(FAILING_KEY, value))

    def _backoff(self, error: str) -> float:
        h = self.health
        now = time.time()
        h.consecutive_failures += 1
        h.last_failure_at, h.last_error = now, error[:500]
        h.failing_since = h.failing_since or now
        delay = min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** (h.consecutive_failures - 1))
        delay *= random.uniform(0.8, 1.2)  # jitter: many Sprites must not retry in lockstep
        h.next_retry_at = now + delay
        log.warning("memory_batch_failed", error=error[:300], failures=h.consecutive_failures,
                    retry_in_s=round(delay, 1))
        return delay

    def status(self) -> dict[str, Any]:
        h = self.health
        return {
            "running": h.running,
            "batches_run": h.batches_run,
            "consecutive_failures": h.consecutive_failures,
            "last_success_at": h.last_success_at,
            "last_error": h.last_error,
            "next_retry_at": h.next_retry_at,
            "degraded": h.consecutive_failures >= 3,
        }
