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
failures after waking "six hours of failure". A sleep in the middle of a failing
spell does not count either: when more than FAILING_GAP (2 x BACKOFF_MAX) passed
since the last failed call, the backoff cannot explain the gap, so the clock
starts again (since = now, one failure). The time of the last failed call is kept
beside the others; a value saved without it counts as such a gap.

A reply that arrives but is unusable (UnusableReply: a refusal, garbage) is another
matter: the same turns may fail forever and hold back every newer one. After
UNUSABLE_LIMIT in a row for the oldest chunk, an isolation begins: the chunk is
split in half and the halves run one after the other; a single turn that still gets
them is marked stale. Marking stale, and splitting further, need evidence that the
proxy and model work: a batch that succeeded after the isolation began (one from
before proves nothing: the proxy may have broken since). To find it, the first
split is a probe, and a half that fails without evidence is set aside while the
other is tried: a poison turn sits in one half, so the other succeeds. If every
piece fails (a misconfigured proxy or model answering everything with nothing
usable), the pieces are dropped and it is a plain failure, backed off and under the
six-hour rule, with no more probes until a batch succeeds or newer turns join the
oldest chunk: turns are never marked stale wholesale. Steps taken without evidence leave the failing clock running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import dataclass
from typing import Any

from ..errors import CuratorError, EditConflict, UnusableReply
from ..logs import get_logger
from .curator import split_batch
from .processor import BatchProcessor
from .schema import STALE
from .transcript_store import Observation

log = get_logger(__name__)

BACKOFF_FIRST = 2.0
BACKOFF_MAX = 300.0
STALE_AFTER = 6 * 3600.0
STALE_MIN_FAILURES = 5  # besides the six hours: wall-clock time alone counts a Sprite's sleep as failing
FAILING_KEY = "daemon_failing"  # memory.db meta: {"since": epoch s, "failures": n, "last": epoch s}
CONFLICT_RETRY = 2.0
UNUSABLE_LIMIT = 3  # unusable replies in a row for one chunk, then it is split (one turn: marked stale)
# More time than this since the last failed call was not backoff but a sleep, or a stopped daemon:
# the longest wait between two failed calls is BACKOFF_MAX x 1.2 plus one call (at most 120 s).
FAILING_GAP = 2 * BACKOFF_MAX


@dataclass
class DaemonHealth:
    last_success_at: float | None = None
    last_failure_at: float | None = None
    last_error: str | None = None
    consecutive_failures: int = 0
    failing_since: float | None = None
    failing_last: float | None = None  # the last failed call of the failing spell (persisted)
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
        self._set_aside: set[int] = set()  # first ids of pieces that failed without evidence, moved last
        # The size of the chunk whose probe split failed in every piece: no new probe until a batch
        # succeeds or the oldest chunk has grown (newer turns joined it, maybe not poisonous ones).
        self._probed = 0
        self._isolating_since: float | None = None  # a success after this is the evidence
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
        elif self._idle.is_set():  # the run ended while the target was looked up: it resolved no one
            self._waiters.remove((target, waiter))
            oldest = await self.processor.pending(1)
            return not oldest or oldest[0].id > target
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
        if self.health.last_success_at is None:  # for /healthz: the last success survives a restart
            self.health.last_success_at = await self.processor.memory.call(lambda m: m.last_done_at())
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
                    continue  # split, set aside, or one turn marked stale: go on at once
                return False, await self._failed(str(exc))
            except CuratorError as exc:  # transport: the same chunk is retried, whole
                return False, await self._failed(str(exc))
            self._conflicts = 0
            self._unusable = (0, 0)
            await self._succeeded()
            # Only as far as nothing older is pending: a piece set aside may be older than this one.
            oldest = await self.processor.pending(1)
            self._resolve(min(chunk[-1].id, oldest[0].id - 1) if oldest else chunk[-1].id, True)

    async def _next_chunk(self) -> list[Observation]:
        """The oldest pending turns that fit one call: the first piece of a split chunk, if any."""
        pending = await self.processor.pending(self.batch_turns)
        while self._parts:
            part = set(self._parts[0])
            chunk = [o for o in pending if o.id in part]
            if chunk:
                return chunk
            self._parts.pop(0)  # done (or stale)
        self._set_aside.clear()  # no isolation under way
        self._isolating_since = None
        return split_batch(pending)[0] if pending else []

    def _evidence(self) -> bool:
        """A batch succeeded since the isolation began: unusable replies are about the turns."""
        last, since = self.health.last_success_at, self._isolating_since
        return last is not None and since is not None and last > since

    async def _isolate(self, chunk: list[Observation], error: str) -> bool:
        """Count an unusable reply for `chunk`; at UNUSABLE_LIMIT in a row, act on it. True: go on
        at once (the chunk was split or set aside, or its one turn marked stale). False: a plain
        failure, retried after backoff."""
        first, count = self._unusable
        count = count + 1 if first == chunk[0].id else 1
        self._unusable = (chunk[0].id, count) if count < UNUSABLE_LIMIT else (0, 0)
        if count < UNUSABLE_LIMIT:
            return False
        ids = [o.id for o in chunk]
        piece = bool(self._parts) and ids[0] in self._parts[0]
        if self._isolating_since is None:
            self._isolating_since = time.time()
        self.health.last_failure_at, self.health.last_error = time.time(), error[:500]
        if self._evidence():
            if len(ids) == 1:
                await self.processor.transcript.call(lambda t: t.set_processed(ids, STALE))
                log.error("observation_marked_stale", observation_id=ids[0], state=STALE,
                          reason="curator reply unusable", unusable_replies=count)
            else:
                self._split(ids, piece, probe=False)
            await self._clear_failing()  # the proxy works: this is not the failing the six-hour rule measures
        elif not piece and len(ids) > max(1, self._probed):
            self._split(ids, piece, probe=True)  # the halves can show that the model answers
        elif piece and ids[0] not in self._set_aside and len(self._parts) > 1:
            self._set_aside.add(ids[0])  # try the other pieces first: one success is the evidence
            self._parts.append(self._parts.pop(0))
        else:  # every piece failed too (or one turn, alone): nothing says the turns are at fault
            if self._parts:
                log.warning("memory_batch_split_dropped", pieces=len(self._parts))
                self._probed = sum(len(part) for part in self._parts)  # a probe was made, and failed
            self._parts, self._set_aside, self._isolating_since = [], set(), None
            return False
        return True

    def _split(self, ids: list[int], piece: bool, probe: bool) -> None:
        half = len(ids) // 2
        self._parts[:1 if piece else 0] = [ids[:half], ids[half:]]  # replaces the piece that failed
        log.warning("memory_batch_split", first_id=ids[0], last_id=ids[-1], observations=len(ids), probe=probe)

    async def _succeeded(self) -> None:
        self._probed = 0
        self.health.last_success_at = time.time()
        self.health.batches_run += 1
        await self._clear_failing()

    async def _clear_failing(self) -> None:
        h = self.health
        was_failing = h.failing_since is not None
        h.consecutive_failures, h.failing_since, h.failing_last, h.next_retry_at = 0, None, None, None
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
        since: float | None = None
        last: float | None = None
        failures = 0
        try:
            saved = json.loads(raw) if raw else None
            if saved:
                since, failures = float(saved["since"]), int(saved["failures"])
                last = float(saved["last"]) if saved.get("last") is not None else None  # older values lack it
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # a bad value only costs the clock
            log.warning("daemon_failing_unreadable", error=repr(exc))
            since, last, failures = None, None, 0
        h = self.health
        h.failing_since, h.failing_last, h.consecutive_failures = since, last, failures

    async def _save_failing(self) -> None:
        h = self.health
        value = json.dumps({"since": h.failing_since, "failures": h.consecutive_failures, "last": h.failing_last}) \
            if h.failing_since is not None else ""
        await self.processor.memory.call(lambda m: m.set_meta(FAILING_KEY, value))

    def _backoff(self, error: str) -> float:
        h = self.health
        now = time.time()
        if h.failing_since is not None and (h.failing_last is None or now - h.failing_last > FAILING_GAP):
            # Not backoff: the Sprite slept or the daemon was stopped. That time is not failing.
            log.info("daemon_failing_clock_restarted", failures=h.consecutive_failures,
                     gap_s=None if h.failing_last is None else round(now - h.failing_last))
            h.failing_since, h.consecutive_failures = None, 0
        h.consecutive_failures += 1
        h.last_failure_at, h.last_error = now, error[:500]
        h.failing_since = h.failing_since or now
        h.failing_last = now
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
