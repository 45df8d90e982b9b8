"""The memory daemon: the one task that runs curator batches, so memory has one writer.

Triggers (every `batch_turns` turns, a session's end, PreCompact, start) only ask
for work. The daemon wakes, runs batches until nothing is pending, and settles
the waiters (a flush, a new session's settle) whose turns are curated. A backlog
drains in chunks as large as the call's token cap allows (at most MAX_CHUNK_TURNS
turns), not `batch_turns` at a time. After a failure it sleeps until the retry that
memory/curation/retry.py's policy set, whatever triggers arrive meanwhile; while the proxy is
down, a cheap question to it (retry.Probe: every PROBE_EVERY, sooner once a new turn asks for
a batch) brings the retry forward as soon as it answers again. Before each call it asks
memory/curation/budget.py's policy whether the day's budget allows it; if not, it sleeps until
the next UTC day, and that is no failure. Batches never run on the agent's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ...backoff import Backoff
from ...config import DEFAULT_BATCH_TOKENS, DEFAULT_DAILY_USD
from ...errors import BudgetSpent, CuratorError, EditConflict, UnusableReply, log_expected
from ...logs import get_logger
from ...spending import DailyBudget, cost_usd, day_start
from ..forget.jobs import FORGET_PASS
from ..memory_store import MemoryDB
from ..processor import MAX_REPLY_TOKENS, BatchProcessor
from ..schema import STALE
from ..transcript_store import Observation
from .budget import BUDGET_KEY, BudgetRecord
from .curator import split_batch
from .retry import (
    BACKOFF_FIRST,
    BACKOFF_MAX,
    FAILING_KEY,
    STALE_AFTER,
    FailureClock,
    PoisonTurns,
    Probe,
    Verdict,
)

log = get_logger(__name__)

R = TypeVar("R")

CONFLICT_RETRY = 2.0  # a person is editing a memory file: soon again, and not a failure
# During a budget wait, look at the wall clock this often: a suspended Sprite's loop clock stands
# still, so one long sleep until midnight could oversleep it by the length of the suspend.
BUDGET_RECHECK = 300.0
MAX_CHUNK_TURNS = 100  # turns one call may carry when the token cap allows (a backlog's catch-up)


async def _nothing() -> None:
    pass


@dataclass
class DaemonHealth:
    last_success_at: float | None = None
    last_error: str | None = None
    batches_run: int = 0
    running: bool = False


@dataclass(frozen=True, eq=False)
class _Waiter:
    """A flush or a settle waiting for every turn up to `target` to be curated."""

    target: int  # the last observation id it waits for
    after: int  # only a run numbered above this answers it with success
    done: asyncio.Future[bool]


class MemoryDaemon:
    def __init__(self, processor: BatchProcessor, batch_turns: int, stale_after: float = STALE_AFTER,
                 budget: DailyBudget | None = None, batch_tokens: int = DEFAULT_BATCH_TOKENS) -> None:
        self.processor = processor
        self.batch_turns = batch_turns
        self.batch_tokens = batch_tokens  # estimated input tokens of one call, at most
        self.budget = budget or DailyBudget(DEFAULT_DAILY_USD)
        self.resumes_at: float | None = None  # waiting for the budget until then (wall clock)
        self.backoff = Backoff(BACKOFF_FIRST, BACKOFF_MAX)  # read here: tests shorten it by patching this module
        self.clock = FailureClock(stale_after=stale_after)
        self.poison = PoisonTurns()
        self.probe = Probe()
        self.health = DaemonHealth()
        self._wake = asyncio.Event()  # work is requested, or a retry is due
        self._asked = asyncio.Event()  # a trigger arrived (during a backoff: a probe may come sooner)
        self._proxy_down = False  # the current backoff is for the proxy: probing it may end it
        self._idle = asyncio.Event()  # no batch running, requested or scheduled
        self._idle.set()
        self._not_before = 0.0  # loop time before which no run starts (a backoff)
        # Why a run was asked for, until it starts: a set, as every turn past `batch_turns` asks
        # again while a backoff holds the run (hours, with the proxy down).
        self._reasons: set[str] = set()
        # Resolved once every turn up to `target` is curated by a run numbered above `after`, or once
        # any run fails. A flush needs a run begun after it was asked (its forget pass: before_batches
        # runs at a run's start); a settle, any run.
        self._waiters: list[_Waiter] = []
        self._runs = 0  # runs begun so far
        self._turns_since_batch = 0
        self._conflicts = 0  # batches dropped in a row because a person was editing a file
        self._task: asyncio.Task[None] | None = None
        # Run first in each pass: what a person's forget left for the files' one writer to do.
        self.before_batches: Callable[[], Awaitable[object]] = _nothing
        self._pass_wanted = asyncio.Event()  # a forget's pass asked for: it needs no model, no backoff holds it

    # ------------------------------------------------------------ memory.db's one writer

    async def apply(self, change: Callable[[MemoryDB], R]) -> R:
        """A change to memory.db from outside the daemon (a person forgetting a learning, the
        console's audit record), made by its one writer: the daemon's own database thread."""
        return await self.processor.memory.call(change)

    # ------------------------------------------------------------ triggers (never block)

    def note_turn(self) -> None:
        """A turn was recorded. Every `batch_turns` turns, ask for a batch."""
        self._turns_since_batch += 1
        if self._turns_since_batch >= self.batch_turns:
            self.trigger("batch")

    def trigger(self, reason: str) -> None:
        if reason == FORGET_PASS:
            self._pass_wanted.set()
        self._reasons.add(reason)
        self._idle.clear()
        self._wake.set()
        self.probe.asked = True
        self._asked.set()

    async def settle(self, budget: float) -> bool:
        """If a batch is running, requested or scheduled, wait (at most `budget` seconds) until the
        turns recorded so far are curated, without asking for more. A new session uses it to boot
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
        loop = asyncio.get_running_loop()
        target = await self.processor.transcript.call(lambda t: t.max_id())
        waiter = _Waiter(target, self._runs if trigger else -1, loop.create_future())
        self._waiters.append(waiter)
        if trigger:
            self.trigger(reason)
        elif self._idle.is_set():  # the run ended while the target was looked up: it resolved no one
            self._waiters.remove(waiter)
            oldest = await self.processor.pending(1)
            return not oldest or oldest[0].id > target
        hold = self._not_before - loop.time()
        if self._waiting_for_budget() or hold >= budget:  # the next run comes too late for it
            self._waiters.remove(waiter)
            log.info("memory_wait_skipped", reason=reason, budget=budget, retry_in_s=round(hold, 1),
                     budget_spent=self._waiting_for_budget())
            return False
        try:
            return await asyncio.wait_for(asyncio.shield(waiter.done), budget)
        except TimeoutError:
            log.warning("memory_wait_timeout", reason=reason, budget=budget)
            return False

    def _resolve(self, through: int | None, ok: bool) -> None:
        """Resolve the waiters whose turns are all curated (through=None: all of them) by this run,
        if it began after they were asked; a failure answers every one of them."""
        keep = []
        for waiter in self._waiters:
            if (through is None or waiter.target <= through) and (not ok or self._runs > waiter.after):
                if not waiter.done.done():
                    waiter.done.set_result(ok)
            else:
                keep.append(waiter)
        self._waiters = keep

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        raw = await self.processor.memory.call(lambda m: m.get_meta(FAILING_KEY))
        try:
            self.clock.restore(raw)  # a restart does not reset the failing clock
        except ValueError as exc:  # a bad value only costs the clock
            log.warning("daemon_failing_unreadable", error=repr(exc))
        if self.health.last_success_at is None:  # for /healthz: the last success survives a restart
            self.health.last_success_at = await self.processor.memory.call(lambda m: m.last_done_at())
        await self.processor.recover()
        await self._save_budget()  # a new setting takes effect now; a wait is found again at the first call
        worst = cost_usd(self.processor.curator.model, self.batch_tokens, MAX_REPLY_TOKENS)
        if worst > self.budget.daily_usd:
            log.warning("memory_budget_below_one_call", daily_usd=self.budget.daily_usd,
                        worst_call_usd=round(worst, 4))
        self._task = asyncio.create_task(self._run(), name="memory-daemon")
        self.trigger("start")  # a restart tries at once, whatever retry was scheduled

    async def stop(self, flush_budget: float) -> bool:
        """Flush what is pending within the budget, then stop. What is left runs at next start. False:
        the flush did not curate every turn (its budget ran out, or the curator's backoff held it)."""
        if self._task is None:
            return True
        flushed = flush_budget > 0 and not self._task.done() and await self.flush("shutdown", flush_budget)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._idle.set()
        self._resolve(None, False)
        return flushed or not await self.processor.pending(1)  # no time left, and nothing to curate anyway

    # ------------------------------------------------------------ the owner task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            await self._until_retry(loop)  # the backoff holds, whatever triggers arrive meanwhile
            self._wake.clear()
            self._runs += 1
            reasons, self._reasons = self._reasons or {"retry"}, set()
            self.health.running = True
            try:
                ok, delay = await self._attempt("+".join(sorted(reasons)))
            finally:
                self.health.running = False
            if delay is not None:
                self._not_before = loop.time() + delay
                self._wake.set()  # the retry is due then
            elif not self._wake.is_set():
                self._idle.set()
            self._resolve(None, ok)

    async def _until_retry(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait out the backoff. While the proxy is down, ask it now and then whether it answers;
        once it does, the retry is now."""
        while (hold := self._not_before - loop.time()) > 0:
            if self._pass_wanted.is_set():  # a forget's pass, meanwhile
                try:
                    await self._forget_pass()
                except Exception as exc:  # the next run does it again
                    log_expected(log, "memory_forget_pass_failed", exc)
                continue
            due = self.probe.due(loop.time(), self._not_before) if self._proxy_down else None
            if due is None:
                await _first(hold, self._pass_wanted)
                continue
            if (wait := due - loop.time()) > 0:
                self._asked.clear()
                await _first(wait, self._asked, self._pass_wanted)  # a trigger may bring the question forward
                continue
            self.probe.probed(loop.time())
            if await self.processor.curator.probe():
                log.info("curator_proxy_answers", retry_brought_forward_s=round(self._not_before - loop.time(), 1))
                self._not_before = loop.time()

    async def _attempt(self, trigger: str) -> tuple[bool, float | None]:
        """One run. Returns (success, seconds until the retry, or None when nothing is left)."""
        try:
            return await self._drain(trigger)
        except Exception as exc:  # a bug or a database error: it counts like a failed call
            log_expected(log, "memory_daemon_error", exc)
            return False, await self._failed(repr(exc))

    async def _forget_pass(self) -> None:
        """The forgets' file pass (`before_batches`), on this task: the memory files' one writer. A forget that
        asks while it runs asks for the next."""
        self._pass_wanted.clear()
        await self.before_batches()

    async def _drain(self, trigger: str) -> tuple[bool, float | None]:
        self._turns_since_batch = 0
        self._proxy_down = False
        await self._forget_pass()
        await self.processor.recover()  # a batch an earlier error left half-finished comes first
        while True:
            if self._pass_wanted.is_set():  # a forget asked during a backlog's drain: between two calls, not after all
                self._pass_done_here()
                await self._forget_pass()
            chunk = await self._next_chunk()
            if not chunk:
                return True, None
            ids = [o.id for o in chunk]
            try:
                await self.processor.process(chunk, trigger, self._conflicts, gate=self._may_call)
            except BudgetSpent as exc:  # no failure: the turns wait, no clock runs
                return False, min(exc.resumes_at - time.time(), BUDGET_RECHECK)
            except EditConflict:
                self._conflicts += 1
                return False, CONFLICT_RETRY
            except UnusableReply as exc:
                verdict = self.poison.unusable(ids)
                delay = await self._on_unusable(verdict, ids, str(exc))
                if verdict.goes_on:
                    continue
                return False, delay
            except CuratorError as exc:  # transport: the same turns are retried, whole
                self._proxy_down = True
                self.probe.waiting(asyncio.get_running_loop().time())
                return False, await self._failed(str(exc))
            self._conflicts = 0
            self.poison.succeeded()
            # The batch's commit, as memory status reads it: not this clock after its files were written.
            self.health.last_success_at = await self.processor.memory.call(lambda m: m.last_done_at())
            self.health.batches_run += 1
            await self._clear_failing()
            # Only as far as nothing older is pending: a turn set aside may be older than these.
            oldest = await self.processor.pending(1)
            self._resolve(min(ids[-1], oldest[0].id - 1) if oldest else ids[-1], True)

    def _pass_done_here(self) -> None:
        """The pass a forget asked for runs in this run: its ask no longer wakes the daemon for a run of its own
        after this one (the same pass twice, each counted as a pass that kept a job the pass keeps)."""
        self._reasons.discard(FORGET_PASS)
        if not self._reasons:  # every trigger gives its reason: no other asked for a run
            self._wake.clear()

    async def _next_chunk(self) -> list[Observation]:
        """The oldest pending turns that fit one call, or the one turn an isolation runs next."""
        pending = await self.processor.pending(max(self.batch_turns, MAX_CHUNK_TURNS))
        one = self.poison.next_turn([o.id for o in pending])
        if one is not None:
            return [o for o in pending if o.id == one]
        if not pending:
            return []
        return split_batch(pending, await self.processor.turn_budget(self.batch_tokens))[0]

    # ------------------------------------------------------------ the budget

    async def _may_call(self, input_tokens: int) -> None:
        """The gate before each call: raises BudgetSpent unless today's budget covers its worst case."""
        now = time.time()
        spent = await self.processor.memory.call(lambda m: m.cost_since(day_start(now)))
        estimate = cost_usd(self.processor.curator.model, input_tokens, MAX_REPLY_TOKENS)
        decision = self.budget.check(now, spent, estimate)
        if decision.resumes_at is not None:
            if decision.resumes_at != self.resumes_at:
                self.resumes_at = decision.resumes_at
                log.warning("memory_budget_spent", spent_usd=round(spent, 4), call_usd=round(estimate, 4),
                            daily_usd=self.budget.daily_usd, resumes_at=decision.resumes_at)
                await self._save_budget()
            raise BudgetSpent(f"the daily budget of ${self.budget.daily_usd:.2f} is spent", decision.resumes_at)
        if self.resumes_at is not None:
            self.resumes_at = None
            log.info("memory_budget_resumed", spent_usd=round(spent, 4), daily_usd=self.budget.daily_usd)
            await self._save_budget()

    def _waiting_for_budget(self) -> bool:
        return self.resumes_at is not None and time.time() < self.resumes_at

    async def _save_budget(self) -> None:
        value = BudgetRecord(self.budget.daily_usd, self.resumes_at).dumps()
        await self.processor.memory.call(lambda m: m.set_meta(BUDGET_KEY, value))

    async def _on_unusable(self, verdict: Verdict, ids: list[int], error: str) -> float:
        """Act on the isolation's verdict on an unusable reply; returns the backoff, 0 if it goes on."""
        log.warning("memory_reply_unusable", first_id=ids[0], last_id=ids[-1], verdict=verdict.value)
        if verdict is Verdict.STALE:  # a turn succeeded alone: the proxy works, this turn does not
            await self.processor.transcript.call(lambda t: t.set_processed(ids, STALE))
            log.error("observation_marked_stale", observation_id=ids[0], state=STALE,
                      reason="curator reply unusable")
            self.health.last_error = error[:500]
            await self._clear_failing()
            return 0.0
        if verdict is Verdict.GIVE_UP:
            log.warning("memory_isolation_dropped", observations=self.poison.probed)
        return await self._failed(error, back_off=verdict is not Verdict.ISOLATE)

    async def _clear_failing(self) -> None:
        if self.clock.succeeded():
            await self._save_clock()

    async def _failed(self, error: str, back_off: bool = True) -> float:
        """Count a failed call; returns the seconds until the retry. Marks old turns stale under the
        six-hour rule. Never raises: the daemon must outlive a broken database."""
        now = time.time()
        if self.clock.failed(now):
            log.info("daemon_failing_clock_restarted", failures=self.clock.failures)
        delay = self.backoff.delay(self.clock.failures, random.random()) if back_off else 0.0
        self.clock.next_retry_at = now + delay
        self.health.last_error = error[:500]
        log.warning("memory_batch_failed", error=error[:300], failures=self.clock.failures,
                    retry_in_s=round(delay, 1))
        try:
            await self._save_clock()
            if (cutoff := self.clock.stale_cutoff(now)) is not None:
                marked = await self.processor.transcript.call(lambda t: t.mark_stale_before(cutoff))
                if marked:
                    log.error("observations_marked_stale", count=marked, state=STALE,
                              hours=self.clock.stale_after / 3600)
        except Exception as exc:
            log_expected(log, "daemon_failing_not_saved", exc)
        return delay

    async def _save_clock(self) -> None:
        value = self.clock.dumps()
        await self.processor.memory.call(lambda m: m.set_meta(FAILING_KEY, value))

    def status(self) -> dict[str, Any]:
        h = self.health
        return {"running": h.running, "batches_run": h.batches_run, "last_success_at": h.last_success_at,
                "last_error": h.last_error, **self.clock.report()}


async def _first(seconds: float, *events: asyncio.Event) -> None:
    """Until one of `events` is set, or `seconds` have passed."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
