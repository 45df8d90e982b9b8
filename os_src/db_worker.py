"""The thread that owns one database connection, so the event loop never waits on SQLite."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

from .database import query_only


class Closable(Protocol):
    def close(self) -> None: ...


class Store(Closable, Protocol):
    @property
    def conn(self) -> sqlite3.Connection: ...


T = TypeVar("T", bound=Closable)
S = TypeVar("S", bound=Store)
R = TypeVar("R")


class Worker(Generic[T]):
    """Owns one database object on one thread. Coroutines await `call`; callers that must
    never wait use `submit` and go on. The database is opened on first use, in that thread,
    so constructing a Worker touches nothing (the owner may still have a lock to take)."""

    def __init__(self, name: str, opener: Callable[[], T]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"db-{name}")
        self._opener = opener
        self._obj: T | None = None
        self.name = name

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
