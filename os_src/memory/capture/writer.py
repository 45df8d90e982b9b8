"""Capture's writes to transcript.db: in order, exactly once, retried until they land.

The runtime's stream hands each turn's observation (and each session's start and end)
to `TranscriptWriter.submit`, which never waits. One owner task writes them, oldest
first, on transcript.db's thread (a write submitted while nothing waits goes to that
thread at once, so a batch triggered after it reads it). A write that fails (the
database locked past a short busy timeout, busy, the disk full) is retried with backoff
(backoff.Backoff) until it lands, and the writes behind it wait: turns land in order.
Between attempts the thread is free, so readers (the daemon, /healthz) are not held up
for long by a lock only writers wait on. A replay is harmless: the unique (session_id, sequence_num) key
makes a second insert of a turn a no-op, so "exactly once" holds across retries and
restarts.

While writes fail, every write waiting is also appended to the spill file
(memory/capture/spill.py: JSON lines, fsync'd), so a kill -9 loses none of them; so is every
write waiting when the turn journal holds more closed turns than it keeps. The queue holds at most MAX_QUEUED writes in
memory; beyond that only the file holds them, and they are read back, in order, as the
queue drains. The spill file is replayed at the next start before anything else, and
removed once everything in it has landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import time
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

from ...backoff import Backoff
from ...db_worker import Worker
from ...logs import get_logger
from ...paths import Layout
from ..transcript_store import NewObservation, TranscriptDB
from .health import LOCAL_DISK, degraded
from .spill import (
    CaptureHealth,
    CommandWrite,
    ObservationWrite,
    SpillFile,
    Write,
    prepare_status,
    read_spill,
    save_status,
    spill_path,
    status_path,
    write_key,
)

log = get_logger(__name__)

MAX_QUEUED = 64  # writes held in memory; more wait in the spill file only
ATTEMPT_BUSY_TIMEOUT_MS = 1000  # per write attempt (not database.BUSY_TIMEOUT_MS): the thread is shared with readers


GROUP_MAX = 64  # writes one transaction (one fsync) may carry


def _apply(writes: list[Write]) -> Callable[[TranscriptDB], None]:
    """The writes as one transaction: one commit, one fsync, for all of them (group commit)."""
    def run(db: TranscriptDB) -> None:
        with db.busy_timeout(ATTEMPT_BUSY_TIMEOUT_MS), db.group():
            for write in writes:
                write.apply(db)

    return run


@dataclass
class _Queued:
    write: Write | None  # None: only the spill file holds it (found again by its key)
    key: tuple[str, int | str]
    spilled: bool = False  # being appended to the spill file, or appended
    durable: bool = False  # appended and fsync'd: the payload may be let go
    sent: Future[None] | None = None  # already handed to the database thread
    at: float = dataclasses.field(default_factory=time.monotonic)  # when it was queued

    @staticmethod
    def of(write: Write, spilled: bool = False) -> _Queued:
        return _Queued(write, write_key(write), spilled, durable=spilled)


def merged(spilled: list[_Queued], recovered: list[_Queued]) -> list[_Queued]:
    """The spill file's writes in their order, with the journal's turns among them: each before
    the first spilled turn of its session that follows it. By sequence, never by timestamp (a
    clock set back stamps a turn before the one it follows)."""
    out = list(spilled)
    for item in recovered:
        session, number = item.key
        at = next((i for i, q in enumerate(out) if q.key[0] == session and isinstance(q.key[1], int)
                   and isinstance(number, int) and q.key[1] > number), len(out))
        out.insert(at, item)
    return out


class TranscriptWriter:
    """Owns capture's writes. `submit` from the event loop; `start` replays the spill file first."""

    def __init__(self, db: Worker[TranscriptDB], layout: Layout, files: Executor,
                 on_durable: Callable[[Write], None] | None = None,
                 backoff: Backoff = LOCAL_DISK, max_queued: int = MAX_QUEUED,
                 on_failed: Callable[[list[Write]], None] | None = None) -> None:
        """`files`: one thread, shared with the turn journal, that does the file work in order.
        `on_durable(write)`: the write is in transcript.db, or fsync'd in the spill file.
        `on_failed(writes)`: transcript.db refused these writes and the spill file could not take them."""
        self._db = db
        self._spill = SpillFile(spill_path(layout))
        self._status_file = status_path(layout)
        self._on_durable = on_durable or (lambda _w: None)
        self._on_failed = on_failed or (lambda _w: None)
        self.backoff = backoff
        self.max_queued = max_queued
        self.health = CaptureHealth()
        self._queue: deque[_Queued] = deque()
        self._held = 0  # payloads held in memory
        self._lines = 0  # writes in the spill file (appended, or being appended)
        self._files = files
        self._wake = asyncio.Event()
        self._empty = asyncio.Event()
        self._empty.set()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    # ------------------------------------------------------------ the event loop's side (never waits)

    def submit(self, write: Write) -> None:
        if self._stopped:  # a bug: the runtime stops before memory does
            log.error("capture_write_after_stop", kind=type(write).__name__)
            return
        item = _Queued.of(write)
        if self.takes_at_once:
            item.sent = self._db.submit(_apply([write]))  # now, ahead of any read submitted after it
        self._queue.append(item)
        self._held += 1
        self._empty.clear()
        self._wake.set()
        if self.failing or self._lines or len(self._queue) > self.max_queued:
            self.spill_waiting()  # failing, behind writes that did, or overflowing: into the file

    @property
    def failing(self) -> bool:
        return self.health.failing_since is not None

    @property
    def takes_at_once(self) -> bool:
        """A write submitted now goes straight to transcript.db's thread (nothing waits before it)."""
        return not self._queue and not self.failing and self._task is not None

    def waiting(self) -> list[NewObservation]:
        """The observations queued in memory, not yet in transcript.db, oldest first."""
        return [q.write.observation for q in self._queue if isinstance(q.write, ObservationWrite)]

    def holds_turns(self, session_ids: Collection[str], turn_ids: Collection[str]) -> bool:
        """Whether a turn of these sessions, or with one of these wire ids, is queued, not yet in
        transcript.db (being written included). One whose payload only the spill file holds is known
        by its session alone: it counts whenever wire ids are asked about."""
        for q in self._queue:
            if isinstance(q.write, ObservationWrite):
                obs = q.write.observation
                if obs.session_id in session_ids or obs.turn_id in turn_ids:
                    return True
            elif q.write is None and isinstance(q.key[1], int) and (q.key[0] in session_ids or turn_ids):
                return True
        return False

    def waiting_commands(self) -> list[CommandWrite]:
        """The client ids of commands that left no turn, queued in memory, not yet in transcript.db, oldest first."""
        return [q.write for q in self._queue if isinstance(q.write, CommandWrite)]

    @property
    def held(self) -> int:
        """The writes whose payloads are held in memory (at most `max_queued`; the rest are in the spill
        file only, read back as the queue drains)."""
        return self._held

    def status(self) -> dict[str, Any]:
        oldest = round(time.monotonic() - self._queue[0].at, 1) if self._queue else 0.0
        report = {**self.health.report(len(self._queue), self._lines), "oldest_queued_s": oldest}
        return {**report, "degraded": degraded(report)}

    async def drained(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, until every write submitted so far has landed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._empty.wait(), budget)
        return self._empty.is_set()

    # ------------------------------------------------------------ lifecycle

    async def start(self, recovered: list[Write] | None = None) -> None:
        """Replay the spill file (an earlier run's writes) and `recovered` (the turn journal's),
        in the order they happened, ahead of anything submitted from now on; then start writing."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(OSError):  # while there is room: `memory status` reads it on a full disk
            await loop.run_in_executor(self._files, prepare_status, self._status_file)
        lines = await loop.run_in_executor(self._files, read_spill, self._spill.path)
        if lines:
            log.warning("capture_spill_replayed", writes=len(lines), path=str(self._spill.path))
        head = [_Queued.of(w, spilled=True) for w in lines if w is not None]
        self._lines = len(head)
        head = merged(head, [_Queued.of(w) for w in recovered or []])
        self._queue.extendleft(reversed(head))
        self._held += len(head)
        if self._queue:
            self._empty.clear()
            self._release_payloads()
        self._task = asyncio.create_task(self._run(), name="transcript-writer")
        self._wake.set()

    async def stop(self, budget: float) -> bool:
        """Land what is queued within `budget` seconds; spill what could not land, then stop. False:
        some did not land."""
        if self._task is None:
            return True
        landed = await self.drained(budget)
        if not landed:
            log.error("capture_stopped_with_writes_waiting", queued=len(self._queue))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._stopped = True
        self.spill_waiting()
        await asyncio.get_running_loop().run_in_executor(self._files, lambda: None)  # the appends are done
        return landed

    # ------------------------------------------------------------ the owner task

    async def _run(self) -> None:
        while True:
            if not self._queue:
                self._empty.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            head = self._queue[0]
            if head.write is None:
                await self._read_back()
                continue
            group = [head] if head.sent is not None else self._group()
            sent, head.sent = head.sent or self._db.submit(_apply([q.write for q in group if q.write])), None
            try:
                await asyncio.wrap_future(sent)
            except Exception as exc:  # whatever it is, the writes are kept and tried again
                await asyncio.sleep(self._failed(exc))
                continue
            for _ in group:
                self._queue.popleft()
            self._held -= len(group)
            for item in group:
                if item.write is not None:
                    self._on_durable(item.write)
            if self.failing:
                self._recovered()
            if not self._queue and self._lines:
                self._lines = 0
                self._files.submit(self._spill.remove)  # after every append: FIFO
            self._release_payloads()

    def _group(self) -> list[_Queued]:
        """The writes at the head of the queue that one transaction takes: those held in memory."""
        group = []
        for item in itertools.islice(self._queue, GROUP_MAX):
            if item.write is None:
                break
            group.append(item)
        return group

    def _failed(self, exc: Exception) -> float:
        """Count a failed write; returns the seconds until the retry."""
        now = time.time()
        h = self.health
        if h.failing_since is None:
            h.failing_since = now
            self.spill_waiting()  # durable while it lasts
        h.failures += 1
        h.last_error = f"{type(exc).__name__}: {exc}"[:300]
        delay = self.backoff.delay(h.failures, random.random())
        h.next_retry_at = now + delay
        log.warning("transcript_write_failed", error=type(exc).__name__, detail=str(exc)[:200],
                    failures=h.failures, queued=len(self._queue), retry_in_s=round(delay, 2))
        self._save_status()
        return delay

    def _recovered(self) -> None:
        h = self.health
        log.info("transcript_writes_recovered", failures=h.failures, seconds=round(time.time() - (h.failing_since or 0), 1),
                 queued=len(self._queue))
        self.health = CaptureHealth()
        self._save_status()

    # ------------------------------------------------------------ the spill file (on its own thread, in order)

    def spill_waiting(self) -> None:
        """Append every queued write the spill file does not hold yet, in queue order (also when the
        turn journal holds too many: the spill file takes them, and the journal lets them go)."""
        items = [q for q in self._queue if not q.spilled and q.write is not None]
        if not items:
            return
        for item in items:
            item.spilled = True
        self._lines += len(items)
        writes = [item.write for item in items if item.write is not None]
        done = asyncio.get_running_loop().run_in_executor(self._files, self._spill.append, writes)
        done.add_done_callback(lambda f: self._spilled(f, items))

    def _spilled(self, future: asyncio.Future[None], items: list[_Queued]) -> None:
        if (exc := future.exception()) is not None:  # a full disk: memory is all they have now
            log.warning("capture_spill_failed", writes=len(items), error=repr(exc)[:200])
            self._lines = max(0, self._lines - len(items))
            for item in items:
                item.spilled = False
            self._on_failed([item.write for item in items if item.write is not None])
            return
        for item in items:
            item.durable = True
            if item.write is not None:
                self._on_durable(item.write)
        self._release_payloads()

    def _release_payloads(self) -> None:
        """Hold at most max_queued payloads: beyond them, a write the spill file holds is let go. A
        command's is kept (a client id, a few bytes): a start lists the ids still waiting from memory
        (`waiting_commands`), and one it missed is a command the console would run again."""
        if self._held <= self.max_queued:
            return
        for item in itertools.islice(self._queue, self.max_queued, None):
            if self._held <= self.max_queued:
                return
            if item.write is not None and item.durable and not isinstance(item.write, CommandWrite):
                item.write = None
                self._held -= 1

    async def _read_back(self) -> None:
        lines = await asyncio.get_running_loop().run_in_executor(self._files, read_spill, self._spill.path)
        found = {write_key(w): w for w in lines if w is not None}
        for item in self._queue:
            if item.write is None and (write := found.get(item.key)) is not None:
                item.write = write
                self._held += 1
                if self._held >= self.max_queued:
                    break
        head = self._queue[0]
        if head.write is None:  # the file lost it (an unreadable line): nothing left to retry with
            log.error("capture_spilled_write_lost", key=str(head.key))
            self._queue.popleft()

    def _save_status(self) -> None:
        """For `memory status`, another process: the spell, while it lasts."""
        self._files.submit(save_status, self._status_file, dataclasses.replace(self.health))
