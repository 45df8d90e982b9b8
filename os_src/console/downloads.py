"""Downloads of the person's files over the socket, a chunk at a time, in bounded memory.

A download opens its file once (console/user_files.py's walk, which never follows a link) and keeps
that descriptor: every chunk is read from it, in a thread, so what is sent is the file that was
opened, byte for byte, even if the agent renames it, replaces it or swaps a link in mid-way; if the
file itself is written to (its size, modification time or change time differ from the start's,
checked around every read), the download ends with file_changed rather than send half the old file
and half the new. A change time that alone moved (a rename, a chmod, a link; or a same-size rewrite
with its modification time set back) is told once, before the last chunk goes: every chunk sent is
read again and must hash as it did, so a file whose change time keeps moving costs one more read of
what was sent, not one per move. Only a chunk's start (a multiple of chunk_bytes below the size) is an
offset, so what a download records is one sha256 per chunk. The server holds at most one chunk per
download in memory (the gateway handles a connection's next request only once its queued answers are
under a bound). At most MAX_DOWNLOADS are
open at once over every connection, PER_CLIENT under way on one; one nobody asks anything of for
DOWNLOAD_IDLE seconds is closed by the sweep, a task of its own that runs every transfers.SWEEP_EVERY seconds.

A download is its connection's (transfers.Owner, as an upload is): its id (128 random bits) is no key
on another connection, which is answered busy, until the download lingers. A download whose last
chunk was sent, or whose connection ended, lingers LINGER seconds without counting against its
connection's share: its last chunk's answer may have been lost with the connection, and the page asks again, on the same or a new
connection. A finished one sends only that last chunk again; one whose connection ended goes on on
the connection that asks for it next, which then owns it, and counts it in its share (a page can't
reconnect its way past PER_CLIENT). A start that finds every place taken closes lingering ones first.
At a stop, a read still going in a thread ends at its next chunk, and the stop waits at most
transfers.STOP_WAIT for a download's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..logs import get_logger
from . import files_frames as pf
from . import requests as rq
from .requests import Handler, Request, RequestFailed
from .transfers import SWEEP_EVERY, Owner, bounded, held, refused, settled, sweeping
from .user_files import NotThere, PathRefused, UserFiles, parts

log = get_logger(__name__)

MAX_DOWNLOADS = 16  # open at once, over every connection
PER_CLIENT = 4  # under way at once on one connection
DOWNLOAD_IDLE = 60.0  # seconds without a chunk asked for before a download is closed
LINGER = 30.0  # seconds a finished download, or one whose connection ended, waits to be asked again


class _Changed(Exception):
    """The file's size, modification time or change time is no longer the start's."""


class _Cut(Exception):
    """The server is stopping: a read in a thread lets go of its descriptor at once."""


@dataclass
class _Download:
    """Its descriptor has one owner at a time, whoever holds `lock`, so it is never closed under a
    read still running in a thread (the number could be reused by another file)."""

    fd: int
    stamp: tuple[int, int, int]  # the file's size, mtime_ns and ctime_ns when it was opened (_stamp)
    owner: Owner  # the connection it is under way on
    chunk_bytes: int
    touched: float = field(default_factory=time.monotonic)
    finished: bool = False  # its last chunk was sent: kept only to send that again
    last: int = 0  # the offset of the chunk that finished it
    sent: dict[int, bytes] = field(default_factory=dict)  # a chunk's offset: the sha256 of what was read there
    moved: bool = False  # its change time alone moved since every byte sent was last read again
    cut: bool = False  # the server is stopping: a read in a thread ends at its next chunk
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def size(self) -> int:
        return self.stamp[0]

    @property
    def lingering(self) -> bool:
        return self.finished or self.owner.left

    def read(self, length: int, offset: int, last: bool) -> bytes:
        """In a thread: the bytes at offset, if the file is still as it was when it was opened; the
        `last` chunk goes only once every byte sent is still the file's."""
        self.check()
        data = os.pread(self.fd, length, offset)
        if len(data) < length:
            raise _Changed
        digest = hashlib.sha256(data).digest()
        if self.sent.setdefault(offset, digest) != digest:  # a chunk asked again is the same bytes
            raise _Changed
        self.check()  # this chunk counted in: a write during its read is told
        if last and self.moved and not self.finished:  # once finished, its last chunk's digest is the check
            self.verify()
        return data

    def check(self) -> None:
        stamp = _stamp(os.fstat(self.fd))
        if stamp == self.stamp:
            return
        if stamp[:2] != self.stamp[:2]:
            raise _Changed
        # Only its change time moved: a rename, a chmod, a new link (the download goes on), or a
        # rewrite of the same size with its modification time set back. That is told before the
        # last chunk goes (verify): re-reading what was sent at every move made a file whose change
        # time keeps moving (a chmod loop, hard-link backups) cost its size squared.
        self.stamp, self.moved = stamp, True

    def verify(self) -> None:
        """In a thread, before the last chunk goes: every byte sent is read again, once, and must
        still be the file's, so what the page saves is one file (the new one), never two halves."""
        for offset, digest in sorted(self.sent.items()):
            if self.cut:
                raise _Cut
            if hashlib.sha256(os.pread(self.fd, self.chunk_length(offset), offset)).digest() != digest:
                raise _Changed
        stamp = _stamp(os.fstat(self.fd))
        if stamp != self.stamp:  # moved again while it was read: no second pass, the download ends
            raise _Changed
        self.moved = False

    def chunk_length(self, offset: int) -> int:
        return min(self.chunk_bytes, self.size - offset)


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    """What tells a file written to since: its size, its modification time, and its change time, which
    every write sets too and which no one can set back (`touch -d`, `cp -p`, `tar` and `rsync -t` set
    the modification time back), but which a rename, a chmod or a link sets as well. Its inode and
    device can't change under a held descriptor, and its name is not what is sent."""
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


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
        self._sweeper = asyncio.create_task(sweeping(self.sweep_every, self.close_idle, "downloads"),
                                            name="downloads-sweep")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for down in self._open.values():
            down.cut = True  # a read in a thread ends at its next chunk
        await bounded([self._close(download_id) for download_id in list(self._open)], "downloads")

    def left(self, client: str) -> None:
        """A connection ended: its downloads linger, for the page to ask again on a new one."""
        now = time.monotonic()
        for down in self._open.values():
            if down.owner.ended(client):
                down.touched = now

    def _room_on(self, client: str) -> None:
        """Refuse a download's start, or its takeover, by a connection with its share under way."""
        if sum(down.owner.client == client and not down.lingering for down in self._open.values()) >= self.per_client:
            raise RequestFailed("busy", f"{self.per_client} downloads are under way on this connection; wait for "
                                "one to finish, then download this again")

    async def _start(self, req: pf.DownloadStartRequest) -> pf.DownloadStartResult:
        client = rq.client.get()
        async with self._starting:
            self._room_on(client)
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
            download_id = secrets.token_hex(16)  # 128 bits: never guessed, and no key on another connection
            self._open[download_id] = _Download(fd, _stamp(st), Owner(client), self.chunk_bytes)
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
        def take(down: _Download) -> None:
            down.owner.take("download", lambda: None if down.finished else self._room_on(rq.client.get()))

        async with held(self._open, req.download_id, _gone(self.idle), take) as down:
            self._offered(down, req.offset)
            if not down.finished:  # a finished one lingers LINGER from its end, however often it is asked
                down.touched = time.monotonic()
            want = min(self.chunk_bytes, down.size - req.offset)
            eof = req.offset + want >= down.size
            try:
                data = await settled(asyncio.to_thread(down.read, want, req.offset, eof)) if want else b""
            except _Changed:
                self._closed(req.download_id, down)
                raise RequestFailed("file_changed", "the file was written to while it was downloading (its size, "
                                    "modification time or bytes already sent changed); nothing more can be sent of "
                                    "it: download it again") from None
            except _Cut:  # its request outlived the requests' grace at a stop (then it was cut too)
                raise RequestFailed("not_found", "the server is stopping: this download was closed; download "
                                    "the file again once it is back") from None
            if eof and not down.finished:
                down.finished, down.last = True, req.offset
        return pf.DownloadChunkResult(request_id=req.request_id, download_id=req.download_id, offset=req.offset,
                                      data=data, eof=eof)

    def _offered(self, down: _Download, offset: int) -> None:
        """Only a chunk's start is asked for (so what a download records is bounded by its chunks), and
        once it has finished, only its last chunk's."""
        if down.finished and offset != down.last:
            raise RequestFailed("not_found", "this download has finished: only its last chunk can be asked "
                                "again; download the file again for the rest")
        if offset % self.chunk_bytes or offset >= max(down.size, 1):
            raise RequestFailed("not_found", f"no chunk of this download starts at {offset}: chunks start at "
                                f"multiples of {self.chunk_bytes} below the file's {down.size} bytes")

    async def _cancel(self, req: pf.DownloadCancelRequest) -> pf.DownloadCancelResult:
        async with held(self._open, req.download_id, _gone(self.idle), lambda down: down.owner.take("download")) as down:
            self._closed(req.download_id, down)
        return pf.DownloadCancelResult(request_id=req.request_id, download_id=req.download_id)

    async def _close(self, download_id: str) -> None:
        """Close a download once whatever reads from it is done."""
        with contextlib.suppress(RequestFailed):  # closed already
            async with held(self._open, download_id, _gone(self.idle)) as down:
                self._closed(download_id, down)

    def _closed(self, download_id: str, down: _Download) -> None:
        """Close a download its caller holds."""
        del self._open[download_id]
        os.close(down.fd)

    async def close_idle(self, now: float) -> None:
        """Close the downloads idle for longer than `idle`, and the lingering ones for longer than `linger`."""
        for download_id, down in list(self._open.items()):
            if now - down.touched > (self.linger if down.lingering else self.idle):
                if not down.lingering:
                    log.info("download_closed_idle", size=down.size)
                await self._close(download_id)


def _gone(idle: float) -> RequestFailed:
    return RequestFailed("not_found", f"no such download (it finished, was cancelled, or sat idle for {idle:.0f} s)")
