"""Capture's writes to transcript.db: in order, exactly once, retried until they land.

The runtime's stream hands each turn's observation (and each session's start and end)
to `TranscriptWriter.submit`, which never waits. One owner task writes them, oldest
first, on transcript.db's thread (a write submitted while nothing waits goes to that
thread at once, so a batch triggered after it reads it). A write that fails (the
database locked past a short busy timeout, busy, the disk full) is retried with backoff
(retry.Backoff) until it lands, and the writes behind it wait: turns land in order.
Between attempts the thread is free, so readers (the daemon, /healthz) are not held up
for long by a lock only writers wait on. A replay is harmless: the unique (session_id, sequence_num) key
makes a second insert of a turn a no-op, so "exactly once" holds across retries and
restarts.

While writes fail, every write waiting is also appended to the spill file (JSON lines,
fsync'd), so a kill -9 loses none of them. The queue holds at most MAX_QUEUED writes in
memory; beyond that only the file holds them, and they are read back, in order, as the
queue drains. The spill file is replayed at the next start before anything else, and
removed once everything in it has landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..db_worker import Worker
from ..logs import get_logger
from ..paths import Layout
from .retry import Backoff
from .transcript_store import NewObservation, TranscriptDB

log = get_logger(__name__)

MAX_QUEUED = 64  # writes held in memory; more wait in the spill file only
BACKOFF = Backoff(first=0.25, max=5.0)  # a local disk: retry soon, and often
BUSY_TIMEOUT_MS = 1000  # per attempt: the database thread is shared with readers
SPILL_NAME = "capture-spill.jsonl"
STATUS_NAME = "capture.json"


def spill_path(layout: Layout) -> Path:
    return layout.state_dir / SPILL_NAME


def status_path(layout: Layout) -> Path:
    return layout.state_dir / STATUS_NAME


class ObservationWrite(msgspec.Struct, tag="observation", frozen=True):
    observation: NewObservation

    def apply(self, db: TranscriptDB) -> None:
        db.append(self.observation)


class SessionWrite(msgspec.Struct, tag="session", frozen=True):
    session_id: str
    event: Literal["start", "end"]
    at: float

    def apply(self, db: TranscriptDB) -> None:
        if self.event == "start":
            db.start_session(self.session_id, self.at)
        else:
            db.end_session(self.session_id, self.at)


Write = ObservationWrite | SessionWrite
_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Write] = msgspec.json.Decoder(Write)


def read_spill(path: Path) -> list[Write | None]:
    """The writes in a spill file, one per line, in order. A line that can't be read (the torn
    end of an append the process died in) is None, and logged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[Write | None] = []
    for n, line in enumerate(data.splitlines(), start=1):
        try:
            out.append(_decoder.decode(line))
        except msgspec.MsgspecError as exc:
            log.error("capture_spill_line_unreadable", path=str(path), line=n, error=str(exc)[:200])
            out.append(None)
    return out


def spill_count(path: Path) -> int:
    """How many writes a spill file holds (for `memory status`, from another process)."""
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


def _append_lines(path: Path, writes: list[Write]) -> None:
    """Append, fsync'd. An append that fails (a full disk) is cut off again, so that no torn line
    runs into the next one."""
    with path.open("ab") as f:
        size = f.tell()
        try:
            f.write(b"".join(_encoder.encode(w) + b"\n" for w in writes))
            f.flush()
            os.fsync(f.fileno())
        except OSError:
            with contextlib.suppress(OSError):
                f.truncate(size)
            raise


def _when(write: Write) -> float:
    return write.observation.timestamp if isinstance(write, ObservationWrite) else write.at


def write_key(write: Write) -> tuple[str, int | str]:
    """What makes a write unique: a turn's (session, sequence), a session's (id, event)."""
    if isinstance(write, ObservationWrite):
        return write.observation.session_id, write.observation.sequence_num
    return write.session_id, write.event


@dataclass
class CaptureHealth:
    """The failing spell of capture's writes: what /healthz and `memory status` show."""

    failing_since: float | None = None
    failures: int = 0  # failed attempts in a row
    last_error: str | None = None
    next_retry_at: float | None = None

    def report(self, queued: int, spilled: int) -> dict[str, Any]:
        return {"degraded": self.failing_since is not None or spilled > 0, "queued": queued, "spilled": spilled,
                "consecutive_failures": self.failures, "failing_since": self.failing_since,
                "last_error": self.last_error, "next_retry_at": self.next_retry_at}


def _apply(write: Write) -> Callable[[TranscriptDB], None]:
    def run(db: TranscriptDB) -> None:
        with db.busy_timeout(BUSY_TIMEOUT_MS):
            write.apply(db)

    return run


@dataclass
class _Queued:
    write: Write | None  # None: only the spill file holds it (found again by its key)
    key: tuple[str, int | str]
    spilled: bool = False  # being appended to the spill file, or appended
    durable: bool = False  # appended and fsync'd: the payload may be let go
    sent: Future[None] | None = None  # already handed to the database thread

    @staticmethod
    def of(write: Write, spilled: bool = False) -> _Queued:
        return _Queued(write, write_key(write), spilled, durable=spilled)


class TranscriptWriter:
    """Owns capture's writes. `submit` from the event loop; `start` replays the spill file first."""

    def __init__(self, db: Worker[TranscriptDB], layout: Layout, files: Executor,
                 on_durable: Callable[[Write], None] | None = None,
                 backoff: Backoff = BACKOFF, max_queued: int = MAX_QUEUED) -> None:
        """`files`: one thread, shared with the turn journal, that does the file work in order."""
        self._db = db
        self._spill = spill_path(layout)
        self._status_file = status_path(layout)
        self._on_durable = on_durable or (lambda _w: None)
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
        if not self._queue and not self.failing and self._task is not None:
            item.sent = self._db.submit(_apply(write))  # now, ahead of any read submitted after it
        self._queue.append(item)
        self._held += 1
        self._empty.clear()
        self._wake.set()
        if self.failing or self._lines or len(self._queue) > self.max_queued:
            self._spill_waiting()  # failing, behind writes that did, or overflowing: into the file

    @property
    def failing(self) -> bool:
        return self.health.failing_since is not None

    def waiting(self) -> list[NewObservation]:
        """The observations queued in memory, not yet in transcript.db, oldest first."""
        return [q.write.observation for q in self._queue if isinstance(q.write, ObservationWrite)]

    def status(self) -> dict[str, Any]:
        return self.health.report(len(self._queue), self._lines)

    async def drained(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, until every write submitted so far has landed."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._empty.wait(), budget)
        return self._empty.is_set()

    # ------------------------------------------------------------ lifecycle

    async def start(self, recovered: list[Write] | None = None) -> None:
        """Replay the spill file (an earlier run's writes) and `recovered` (the turn journal's),
        in the order they happened, ahead of anything submitted from now on; then start writing."""
        lines = await asyncio.get_running_loop().run_in_executor(self._files, read_spill, self._spill)
        if lines:
            log.warning("capture_spill_replayed", writes=len(lines), path=str(self._spill))
        head = [_Queued.of(w, spilled=True) for w in lines if w is not None]
        self._lines = len(head)
        head += [_Queued.of(w) for w in recovered or []]
        head.sort(key=lambda q: _when(q.write) if q.write is not None else 0.0)  # stable: spill order holds
        self._queue.extendleft(reversed(head))
        self._held += len(head)
        if self._queue:
            self._empty.clear()
            self._release_payloads()
        self._task = asyncio.create_task(self._run(), name="transcript-writer")
        self._wake.set()

    async def stop(self, budget: float) -> None:
        """Land what is queued within `budget` seconds; spill what could not land, then stop."""
        if self._task is None:
            return
        if not await self.drained(budget):
            log.error("capture_stopped_with_writes_waiting", queued=len(self._queue))
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        self._stopped = True
        self._spill_waiting()
        await asyncio.get_running_loop().run_in_executor(self._files, lambda: None)  # the appends are done

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
            sent, head.sent = head.sent or self._db.submit(_apply(head.write)), None
            try:
                await asyncio.wrap_future(sent)
            except Exception as exc:  # whatever it is, the write is kept and tried again
                await asyncio.sleep(self._failed(exc))
                continue
            self._queue.popleft()
            self._held -= 1
            self._on_durable(head.write)
            if self.failing:
                self._recovered()
            if not self._queue and self._lines:
                self._lines = 0
                self._files.submit(self._spill.unlink, missing_ok=True)  # after every append: FIFO
            self._release_payloads()

    def _failed(self, exc: Exception) -> float:
        """Count a failed write; returns the seconds until the retry."""
        now = time.time()
        h = self.health
        if h.failing_since is None:
            h.failing_since = now
            self._spill_waiting()  # durable while it lasts
        h.failures += 1
        h.last_error = f"{type(exc).__name__}: {exc}"[:300]
        delay = self.backoff.delay(h.failures, random.random())
        h.next_retry_at = now + delay
        log.error("transcript_write_failed", error=type(exc).__name__, detail=str(exc)[:200],
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

    def _spill_waiting(self) -> None:
        """Append every queued write the spill file does not hold yet, in queue order."""
        items = [q for q in self._queue if not q.spilled and q.write is not None]
        if not items:
            return
        for item in items:
            item.spilled = True
        self._lines += len(items)
        writes = [item.write for item in items if item.write is not None]
        done = asyncio.get_running_loop().run_in_executor(self._files, _append_lines, self._spill, writes)
        done.add_done_callback(lambda f: self._spilled(f, items))

    def _spilled(self, future: asyncio.Future[None], items: list[_Queued]) -> None:
        if (exc := future.exception()) is not None:  # a full disk: memory is all they have now
            log.error("capture_spill_failed", writes=len(items), error=repr(exc)[:200])
            self._lines = max(0, self._lines - len(items))
            for item in items:
                item.spilled = False
            return
        for item in items:
            item.durable = True
            if item.write is not None:
                self._on_durable(item.write)
        self._release_payloads()

    def _release_payloads(self) -> None:
        """Hold at most max_queued payloads: beyond them, a write the spill file holds is let go."""
        if self._held <= self.max_queued:
            return
        for item in itertools.islice(self._queue, self.max_queued, None):
            if self._held <= self.max_queued:
                return
            if item.write is not None and item.durable:
                item.write = None
                self._held -= 1

    async def _read_back(self) -> None:
        lines = await asyncio.get_running_loop().run_in_executor(self._files, read_spill, self._spill)
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
        h = self.health
        data = b"" if h.failing_since is None else msgspec.json.encode(
            {"failing_since": h.failing_since, "consecutive_failures": h.failures, "last_error": h.last_error,
             "next_retry_at": h.next_retry_at})
        path = self._status_file

        def save() -> None:
            with contextlib.suppress(OSError):
                if data:
                    tmp = path.with_name(path.name + ".tmp")
                    tmp.write_bytes(data)
                    os.replace(tmp, path)
                else:
                    path.unlink(missing_ok=True)

        self._files.submit(save)


def read_status(layout: Layout) -> dict[str, Any]:
    """What `memory status` shows about capture: the server's saved spell, and the spill file."""
    saved: dict[str, Any] = {}
    with contextlib.suppress(OSError, msgspec.MsgspecError):
        raw = status_path(layout).read_bytes()
        if raw:
            saved = msgspec.json.decode(raw)
    health = CaptureHealth(saved.get("failing_since"), int(saved.get("consecutive_failures") or 0),
                           saved.get("last_error"), saved.get("next_retry_at"))
    report = health.report(0, spill_count(spill_path(layout)))
    del report["queued"]  # only the server knows its queue
    return report
