"""The agent's day of spending, owned by the relay: the account agent/budget.py judges, kept in
`.os/state/agent_spend.json` so a restart does not give the agent a fresh day, and so `sprite-os
memory status` (another process) can show it.

One owner: the relay's event loop changes the account; one flusher task writes it (atomically,
off the loop), the latest state only, after each change and at stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ..fsutil import atomic_write, sweep_temp_files
from ..logs import get_logger
from .budget import (
    AgentLimits,
    Call,
    Reason,
    Refusal,
    SpendDay,
    check,
    refused,
    report,
    reserve,
    settle,
)

log = get_logger(__name__)

SPEND_FILE = "agent_spend.json"  # in .os/state


class SpendRecord(msgspec.Struct):
    """The file: the day's account, and the limits the server ran with (for `memory status`)."""

    day: float
    spent_usd: float
    calls: int
    refused: dict[str, int]
    limits: dict[str, Any]
    updated_at: float


def read_record(path: Path) -> SpendRecord | None:
    """None when there is none, or it is unreadable."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=SpendRecord)
    except (OSError, msgspec.MsgspecError):
        return None


def status_report(path: Path, now: float) -> dict[str, Any] | None:
    """The agent's budget as the server last recorded it, as of `now` (for `memory status`)."""
    record = read_record(path)
    if record is None:
        return None
    account = SpendDay(record.day, record.spent_usd, calls=record.calls, refused=record.refused).on(now)
    lim = record.limits
    limits = AgentLimits(frozenset(lim.get("models", ())), lim.get("daily_usd", 0.0), lim.get("max_tokens", 0),
                         lim.get("requests_per_minute", 0))
    return report(limits, account, now)


class SpendBook:
    def __init__(self, limits: AgentLimits, path: Path, clock: Callable[[], float] = time.time) -> None:
        self.limits = limits
        self._path = path
        self._clock = clock
        self._account = SpendDay(0.0)
        self._dirty = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._writing = threading.Lock()  # a write cancelled at stop may still run in its thread
        self._last_retryable: tuple[float, str] | None = None  # (when, why): a refusal the CLI retries

    def load(self) -> None:
        """Today's account from the file, if it counts today. Blocking. Called at start, under the
        workspace's lock: what a kill between the file's temp copy and its rename left goes first."""
        sweep_temp_files(self._path.parent, lambda name: name == self._path.name)
        record = read_record(self._path)
        if record is not None:
            self._account = SpendDay(record.day, record.spent_usd, calls=record.calls, refused=record.refused)
        self._account = self._account.on(self._clock())

    async def start(self) -> None:
        await asyncio.to_thread(self.load)
        self._flusher = asyncio.create_task(self._flush_forever(), name="agent-spend-flusher")
        self._dirty.set()  # the limits this server runs with, on disk from the start

    async def stop(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        await asyncio.to_thread(self._write)

    def admit(self, call: Call) -> Refusal | None:
        """Judge `call`; if it may go out, hold its worst case until `settle`."""
        now = self._clock()
        refusal = check(self.limits, now, call, self._account)
        if refusal is None:
            self._account = reserve(self.limits, self._account, now, call)
        else:
            self._refused(now, refusal.reason)
            if refusal.retry:
                self._last_retryable = (now, refusal.message)
        self._dirty.set()
        return refusal

    def refuse(self, reason: Reason) -> None:
        """A request refused before it was judged here (its body unreadable)."""
        self._refused(self._clock(), reason)
        self._dirty.set()

    def settle(self, call: Call, cost: float) -> None:
        self._account = settle(self._account, self._clock(), call, cost)
        self._dirty.set()

    def retry_reason(self, within: float = 30.0) -> str | None:
        """Why the relay last refused a call the CLI then retries (the rate), if that was lately:
        the CLI's own notice of the retry says only `rate_limit`."""
        if self._last_retryable is None or self._clock() - self._last_retryable[0] > within:
            return None
        return self._last_retryable[1]

    def report(self) -> dict[str, Any]:
        return report(self.limits, self._account, self._clock())

    def _refused(self, now: float, reason: Reason) -> None:
        self._account = refused(self._account, now, reason)
        log.info("agent_call_refused", reason=reason, spent_today_usd=round(self._account.spent, 4))

    async def _flush_forever(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await asyncio.to_thread(self._write)
            except OSError as exc:  # a full disk: the account lives on in memory, and is written next time
                log.warning("agent_spend_unsaved", error=exc.strerror or str(exc))
                await asyncio.sleep(5.0)
                self._dirty.set()

    def _write(self) -> None:
        with self._writing:  # the state is read under the lock: whichever write is last writes the latest
            self._write_now()

    def _write_now(self) -> None:
        a, lim = self._account, self.limits
        limits = {"daily_usd": lim.daily_usd, "models": sorted(lim.models), "max_tokens": lim.max_tokens,
                  "requests_per_minute": lim.per_minute}
        record = SpendRecord(a.day, a.spent, a.calls, dict(a.refused), limits, self._clock())
        atomic_write(self._path, msgspec.json.encode(record), mode=0o600)
