"""Downloads of the person's files over the socket, a chunk at a time, in bounded memory.

A download opens its file once (console/user_files.py's walk, which never follows a link) and keeps
that descriptor: every chunk is read from it, in a thread, so what is sent is the file that was
opened, byte for byte, even if the agent renames it, replaces it or swaps a link in mid-way. The
server holds at most one chunk per download in memory (the gateway stops reading a client whose
answers pile up unsent); at most MAX_DOWNLOADS are open at once over every connection, and one
nobody asks anything of for DOWNLOAD_IDLE seconds is closed.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ..logs import get_logger
from . import files_frames as pf
from .requests import Handler, Request, RequestFailed
from .user_files import NotThere, PathRefused, UserFiles, parts

log = get_logger(__name__)

MAX_DOWNLOADS = 16  # open at once, over every connection
DOWNLOAD_IDLE = 60.0  # seconds without a chunk asked for before a download is closed

_T = TypeVar("_T")


@dataclass
class _Download:
    """Its descriptor has one owner at a time, whoever holds `lock`, so it is never closed under a
    read still running in a thread (the number could be reused by another file)."""

    fd: int
    size: int
    touched: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def refused(exc: PathRefused | NotThere) -> RequestFailed:
    if isinstance(exc, PathRefused):
        return RequestFailed("bad_path", str(exc))
    return RequestFailed("not_found", str(exc))


class Downloads:
    def __init__(self, files: UserFiles, *, limit: int = MAX_DOWNLOADS, idle: float = DOWNLOAD_IDLE,
                 chunk_bytes: int = pf.CHUNK_BYTES) -> None:
        self.files = files
        self.limit = limit
        self.idle = idle
        self.chunk_bytes = chunk_bytes
        self._open: dict[str, _Download] = {}
        self._starting = asyncio.Lock()  # one start at a time: each counts the ones before it

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return {pf.DownloadStartRequest: self._start, pf.DownloadChunkRequest: self._chunk,
                pf.DownloadCancelRequest: self._cancel}

    @property
    def open(self) -> int:
        return len(self._open)

    async def stop(self) -> None:
        for download_id in list(self._open):
            await self._close(download_id)

    async def _start(self, req: pf.DownloadStartRequest) -> pf.DownloadStartResult:
        await self._close_idle()
        async with self._starting:
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
            self._open[download_id] = _Download(fd, st.st_size)
        return pf.DownloadStartResult(request_id=req.request_id, download_id=download_id,
                                      name=parts(req.path)[-1], size=st.st_size,
                                      chunk_bytes=self.chunk_bytes)

    async def _chunk(self, req: pf.DownloadChunkRequest) -> pf.DownloadChunkResult:
        down = self._open.get(req.download_id)
        if down is None:
            raise _gone(self.idle)
        async with down.lock:
            if self._open.get(req.download_id) is not down:  # closed while this one waited
                raise _gone(self.idle)
            want = max(0, min(self.chunk_bytes, down.size - req.offset))
            data = await settled(asyncio.to_thread(os.pread, down.fd, want, req.offset)) if want else b""
            down.touched = time.monotonic()
            if len(data) < want:
                self._forget(req.download_id, down)
                raise RequestFailed("file_changed", "the file got shorter while it was downloading; nothing more "
                                    "can be sent of it: download it again")
            eof = req.offset + len(data) >= down.size
            if eof:
                self._forget(req.download_id, down)
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

    async def _close_idle(self) -> None:
        now = time.monotonic()
        for download_id, down in list(self._open.items()):
            if now - down.touched > self.idle:
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
