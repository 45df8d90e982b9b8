"""What the transfers of the person's files (a download, an upload) share: the connection that owns
one (`Owner`), a thread's work on a transfer's descriptor seen through to its end (`settled`), a path
refused told as the request's error (`refused`), one held under its lock while still the same one
(`held`), the sweep that closes those left idle (`sweeping`), and a stop's bounded wait for them
(`bounded`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..logs import get_logger
from .requests import RequestFailed, client
from .user_files import NotThere, PathRefused

log = get_logger(__name__)

STOP_WAIT = 1.0  # seconds a stop waits for the reads or writes still holding a transfer
SWEEP_EVERY = 5.0  # seconds between two looks for idle transfers

_T = TypeVar("_T")


class _Locked(Protocol):
    lock: asyncio.Lock


_L = TypeVar("_L", bound=_Locked)


@dataclass
class Owner:
    """The connection a transfer (a download, an upload) is under way on. Another connection is
    answered busy until that one has ended; then the first to ask takes the transfer over."""

    client: str
    left: bool = False  # its connection ended: the next connection to ask owns it

    def ended(self, key: str) -> bool:
        """Connection `key` ended: True if it owned this."""
        if self.client == key:
            self.left = True
        return self.client == key

    def take(self, what: str, room: Callable[[], None] = lambda: None) -> None:
        """Check that the connection asking owns the transfer, or takes it over now (`room` refuses a
        takeover past that connection's share by raising). Its caller holds the transfer."""
        asking = client.get()
        if self.client != asking:
            if not self.left:
                raise RequestFailed("busy", f"this {what} is another connection's: it goes on on this one only "
                                    "once that connection has ended; ask again")
            room()
            self.client = asking
        self.left = False


@contextlib.asynccontextmanager
async def held(open_: Mapping[str, _L], key: str, gone: RequestFailed,
               take: Callable[[_L], None] | None = None) -> AsyncIterator[_L]:
    """The transfer `key` of `open_`, held under its lock (its other operations wait until this one is
    done), once the lock is taken still the same one (`gone` if not: one closed or finished while this
    waited); `take` checks the connection asking owns it (`Owner.take`)."""
    transfer = open_.get(key)
    if transfer is None:
        raise gone
    async with transfer.lock:
        if open_.get(key) is not transfer:
            raise gone
        if take is not None:
            take(transfer)
        yield transfer


def refused(exc: PathRefused | NotThere) -> RequestFailed:
    if isinstance(exc, PathRefused):
        return RequestFailed("bad_path", str(exc))
    return RequestFailed("not_found", str(exc))


async def bounded(closes: list[Awaitable[None]], what: str) -> None:
    """At a stop: run the closes, waiting at most STOP_WAIT for those whose lock a thread still holds
    (its descriptor then goes with the process)."""
    if not closes:
        return
    tasks = [asyncio.ensure_future(close) for close in closes]
    _, left = await asyncio.wait(tasks, timeout=STOP_WAIT)
    for task in left:
        task.cancel()
    if left:
        log.warning("left_open_at_stop", what=what, count=len(left), after_s=STOP_WAIT)
    for task in tasks:
        if not task.cancelled() and task.done() and (exc := task.exception()) is not None:
            log.error("close_at_stop_failed", what=what, error=type(exc).__name__)


async def sweeping(every: float, close_idle: Callable[[float], Awaitable[None]], what: str) -> None:
    """Every `every` seconds, close the transfers left idle (`close_idle(now)`, monotonic): a page that
    went away sends nothing more, and nothing else would free what its transfers hold."""
    while True:
        await asyncio.sleep(every)
        try:
            await close_idle(time.monotonic())
        except Exception as exc:  # one bad close must not end the sweep: the next one tries again
            log.error("transfer_sweep_failed", what=what, error=type(exc).__name__)


async def settled(work: Awaitable[_T]) -> _T:
    """Await work running in a thread; if the caller is cancelled, still wait for the thread to be
    done with the descriptor it uses before the cancellation lets go of that descriptor's lock."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        if not task.cancelled():
            task.exception()  # retrieved: the caller is gone, and a cut read's end is no news
        raise
