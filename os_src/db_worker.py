"""The thread that owns one database connection, so the event loop never waits on SQLite."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

from .database import query_only


class Closable(Protocol):
    def close(self) -> None: ...


class Store(Closable, Protocol):
    @property
    def conn(self) -> sqlite3.Connection: ...


# A background thread's nice value, the lowest: against a thread at 0 it weighs 15 to 1024 for a contested
# core (measured, its work took 3-5 times as long beside busy processes: docs/benchmarks.md), and it has
# an idle core at full speed.
BACKGROUND_NICE = 19


def lower_priority() -> None:
    """Make the calling thread a background one (BACKGROUND_NICE). On Linux a nice value is a thread's
    own, and threads it starts inherit it (tantivy's writer's). Raising it needs no privilege; where
    it can't be set, the thread runs as before."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


T = TypeVar("T", bound=Closable)
S = TypeVar("S", bound=Store)
R = TypeVar("R")


class Worker(Generic[T]):
    """Owns one database object on one thread. Coroutines await `call`; callers that must
    never wait use `submit` and go on. The database is opened on first use, in that thread,
    so constructing a Worker touches nothing (the owner may still have a lock to take).
    `background`: work a turn does not wait for (indexing, embedding): its thread runs at the
    lowest priority (lower_priority), so it never takes a core a turn wants. Some do wait on it: a
    forget (holding the agent's turns) embeds on the embedder's thread, and a new session's boot
    waits, 10 s at most, for a forget's decision that embeds there (memory/system.py)."""

    def __init__(self, name: str, opener: Callable[[], T], background: bool = False) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"db-{name}",
                                            initializer=lower_priority if background else None)
        self._opener = opener
        self._obj: T | None = None
        self.name = name
        self.background = background

    def _get(self) -> T:  # runs only on the worker's thread
        if self._obj is None:
            self._obj = self._opener()
        return self._obj

    async def call(self, fn: Callable[[T], R]) -> R:
        return await asyncio.wrap_future(self._executor.submit(lambda: fn(self._get())))

    def submit(self, fn: Callable[[T], R]) -> Future[R]:
        return self._executor.submit(lambda: fn(self._get()))

    async def close(self) -> None:
        """Finish every queued call, then close the connection."""

        def _close() -> None:
            if self._obj is not None:
                self._obj.close()
                self._obj = None

        await asyncio.wrap_future(self._executor.submit(_close))
        self._executor.shutdown(wait=True)


class Reads(Generic[S]):
    """A Worker's store as another task may use it: on the same thread, each call with the
    connection read-only, so the store's one writer stays the only one (a write raises)."""

    def __init__(self, worker: Worker[S]) -> None:
        self._worker = worker

    async def call(self, fn: Callable[[S], R]) -> R:
        def read(store: S) -> R:
            with query_only(store.conn):
                return fn(store)

        return await self._worker.call(read)
