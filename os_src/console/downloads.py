"""Downloads of the person's files over the socket, a chunk at a time, in bounded memory.

A download opens its file once (console/user_files.py's walk, which never follows a link) and keeps
that descriptor: every chunk is read from it, in a thread, so what is sent is the file that was
opened, byte for byte, even if the agent renames it, replaces it or swaps a link in mid-way; if the
file itself is written to (its size or modification time differ from the start's, checked around
every read), the download ends with file_changed rather than send half the old file and half the new.
The server holds at most one chunk per download in memory (the gateway handles a connection's next
request only once its queued answers are under a bound). At most MAX_DOWNLOADS are open at once over
every connection, PER_CLIENT on one; one nobody asks anything of for DOWNLOAD_IDLE seconds is closed
by the sweep, a task of its own that runs every SWEEP_EVERY seconds.

A download whose last chunk was sent, or whose connection ended, lingers LINGER seconds without
counting against its connection's share: its last chunk's answer may have been lost with the
connection, and the page asks again, on the same or a new connection (which then owns it). A start
that finds every place taken closes lingering ones first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..logs import get_logger
from . import files_frames as pf
from . import requests as rq
from .requests import Handler, Request, RequestFailed
from .user_files import NotThere, PathRefused, UserFiles, parts

log = get_logger(__name__)

MAX_DOWNLOADS = 16  # open at once, over every connection
PER_CLIENT = 4  # under way at once on one connection
DOWNLOAD_IDLE = 60.0  # seconds without a chunk asked for before a download is closed
LINGER = 30.0  # seconds a finished download, or one whose connection ended, waits to be asked again
SWEEP_EVERY = 5.0  # seconds between two looks for idle and lingering downloads

_T = TypeVar("_T")


class _Changed(Exception):
    """The file's size or modification time is no longer the start's."""


@dataclass
class _Download:
    """Its descriptor has one owner at a time, whoever holds `lock`, so it is never closed under a
    read still running in a thread (the number could be reused by another file)."""

    fd: int
    size: int
    mtime_ns: int
    owner: str  # the connection it is under way on (requests.client)
    touched: float = field(default_factory=time.monotonic)
    finished: bool = False  # its last chunk was sent: kept only to send that again
    left: bool = False  # its connection ended: kept for the page to ask again on a new one
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def lingering(self) -> bool:
        return self.finished or self.left

    def read(self, length: int, offset: int) -> bytes:
        """In a thread: the bytes at offset, if the file is still as it was when it was opened."""
        self.check()
        data = os.pread(self.fd, length, offset)
        self.check()
        if len(data) < length:
            raise _Changed
        return data

    def check(self) -> None:
        st = os.fstat(self.fd)
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise _Changed


def refused(exc: PathRefused | NotThere) -> RequestFailed:
    if isinstance(exc, PathRefused):
        return RequestFailed("bad_path", str(exc))
    return RequestFailed("not_found", str(exc))


class Downloads:
    def __init__(self, files: UserFiles, *, limit: int = MAX_DOWNLOADS, per_client: int = PER_CLIENT,
                 idle: float = DOWNLOAD_IDLE, linger: float = LINGER, sweep_every: float = SWEEP_EVERY,
                 chunk_bytes: int = pf.CHUNK_BYTES) -> None:
        self.files = files
        self.limit = limit
        self.per_client = per_client
        self.idle = idle
        self.linger = linger
        self.sweep_every = sweep_every
        self.chunk_bytes = chunk_bytes
        self._open: dict[str, _Download] = {}
        self._starting = asyncio.Lock()  # one start at a time: each counts the ones before it
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return {pf.DownloadStartRequest: self._start, pf.DownloadChunkRequest: self._chunk,
                pf.DownloadCancelRequest: self._cancel}

    @property
    def open(self) -> int:
        """Descriptors held: the downloads under way and the lingering ones."""
        return len(self._open)

    @property
    def under_way(self) -> int:
        return sum(not down.lingering for down in self._open.values())

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep(), name="downloads-sweep")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for download_id in list(self._open):
            await self._close(download_id)

    def left(self, client: str) -> None:
        """A connection ended: its downloads linger, for the page to ask again on a new one."""
        now = time.monotonic()
        for down in self._open.values():
            if down.owner == client:
                down.left, down.touched = True, now

    async def _start(self, req: pf.DownloadStartRequest) -> pf.DownloadStartResult:
        client = rq.client.get()
        async with self._starting:
            mine = sum(down.owner == client and not down.lingering for down in self._open.values())
            if mine >= self.per_client:
                raise RequestFailed("busy", f"{self.per_client} downloads are under way on this connection; wait for "
                                    "one to finish, then download this again")
            await self._make_room()
            if len(self._open) >= self.limit:
                raise RequestFailed("busy", f"{self.limit} downloads are under way; wait for one to finish, "
                                    "then download this again")
            try:
                fd, st = await asyncio.to_thread(self.files.open_held, req.path)
            except (PathRefused, NotThere) as exc:
                raise refused(exc) from None
            if st.st_size > pf.MAX_TRANSFER_BYTES:
                os.close(fd)
                raise RequestFailed("too_large", f"{st.st_size:,} bytes is over the console's download limit of "
                                    f"{pf.MAX_TRANSFER_BYTES:,}")
            download_id = secrets.token_hex(8)
            self._open[download_id] = _Download(fd, st.st_size, st.st_mtime_ns, client)
        return pf.DownloadStartResult(request_id=req.request_id, download_id=download_id,
                                      name=parts(req.path)[-1], size=st.st_size,
                                      chunk_bytes=self.chunk_bytes)

    async def _make_room(self) -> None:
        """Every place taken: the lingering downloads give theirs up, the longest untouched first."""
        lingering = sorted((down.touched, download_id) for download_id, down in self._open.items() if down.lingering)
        for _, download_id in lingering:
            if len(self._open) < self.limit:
                return
            await self._close(download_id)

    async def _chunk(self, req: pf.DownloadChunkRequest) -> pf.DownloadChunkResult:
        down = self._open.get(req.download_id)
        if down is None:
            raise _gone(self.idle)
        async with down.lock:
            if self._open.get(req.download_id) is not down:  # closed while this one waited
                raise _gone(self.idle)
            down.touched = time.monotonic()
            if down.left:  # the page came back on a new connection: it is that one's now
                down.owner, down.left = rq.client.get(), False
            want = max(0, min(self.chunk_bytes, down.size - req.offset))
            try:
                data = await settled(asyncio.to_thread(down.read, want, req.offset)) if want else b""
            except _Changed:
                self._forget(req.download_id, down)
                raise RequestFailed("file_changed", "the file was written to while it was downloading (its size or "
                                    "modification time changed); nothing more can be sent of it: download it "
                                    "again") from None
            eof = req.offset + len(data) >= down.size
            down.finished = down.finished or eof
        return pf.DownloadChunkResult(request_id=req.request_id, download_id=req.download_id, offset=req.offset,
                                      data=data, eof=eof)

    async def _cancel(self, req: pf.DownloadCancelRequest) -> pf.DownloadCancelResult:
        if req.download_id not in self._open:
            raise _gone(self.idle)
        await self._close(req.download_id)
        return pf.DownloadCancelResult(request_id=req.request_id, download_id=req.download_id)

    async def _close(self, download_id: str) -> None:
        """Close a download once whatever reads from it is done."""
        down = self._open.get(download_id)
        if down is None:
            return
        async with down.lock:
            if self._open.get(download_id) is down:
                self._forget(download_id, down)

    def _forget(self, download_id: str, down: _Download) -> None:
        """Close a download its caller holds."""
        del self._open[download_id]
        os.close(down.fd)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_every)
            try:
                await self.close_idle(time.monotonic())
            except Exception as exc:  # one bad close must not end the sweep: the next one tries again
                log.error("download_sweep_failed", error=type(exc).__name__)

    async def close_idle(self, now: float) -> None:
        """Close the downloads idle for longer than `idle`, and the lingering ones for longer than `linger`."""
        for download_id, down in list(self._open.items()):
            if now - down.touched > (self.linger if down.lingering else self.idle):
                if not down.lingering:
                    log.info("download_closed_idle", size=down.size)
                await self._close(download_id)


def _gone(idle: float) -> RequestFailed:
    return RequestFailed("not_found", f"no such download (it finished, was cancelled, or sat idle for {idle:.0f} s)")


async def settled(work: Awaitable[_T]) -> _T:
    """Await work running in a thread; if the caller is cancelled, still wait for the thread to be
    done with the descriptor it uses before the cancellation lets go of that descriptor's lock."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise
