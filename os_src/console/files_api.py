"""The person's files, answered on the socket: listing, reading, downloads (console/downloads.py)
and uploads. The file system work is console/user_files.py's, run in a thread.

An upload is written, chunk by chunk, to Sprite OS's own uploads folder, checked (size, and the
sha256 when the client sends one), then put in documents/; every client is told (`file_uploaded`)
and so is the agent, with the person's next message. An upload is its connection's, as a download
is (transfers.Owner): another connection is answered busy until that one has ended, then the first to
ask takes it over. An upload nobody sends to for UPLOAD_IDLE seconds is dropped (by a sweep every
transfers.SWEEP_EVERY seconds, and at the next upload's start); so are those a stopped server left
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from .. import protocol as p
from ..fsutil import free_bytes
from ..logs import get_logger
from ..paths import Layout
from . import files_frames as pf
from . import requests as rq
from .downloads import Downloads
from .requests import Handler, Request, RequestFailed
from .transfers import SWEEP_EVERY, Owner, bounded, held, refused, settled, sweeping
from .user_files import NotThere, PathRefused, Placed, UserFiles, upload_name

log = get_logger(__name__)

UPLOAD_IDLE = 120.0  # seconds without a chunk before an upload is dropped
MAX_UPLOADS = 4  # at once, over every connection
DISK_RESERVE = 256 * 1024 * 1024  # an upload never takes the disk below this much free space

Publish = Callable[[p.ServerFrame], None]
Note = Callable[[str], None]  # tells the agent, with the person's next message


@dataclass
class _Upload:
    """One upload's descriptor has one owner at a time: whoever holds `lock` (a chunk's write, the
    finish, a cancel, a drop). So it is never closed under a write still running in a thread, which
    would let the number be reused and another file be written."""

    temp: str  # its name in the uploads folder
    fd: int
    name: str  # the name it will have in documents/
    size: int
    owner: Owner  # the connection it is under way on
    received: int = 0
    last: tuple[int, int] = (-1, 0)  # the last chunk written: (its offset, its length)
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)
    touched: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} bytes"


class FilesConsole:
    def __init__(self, layout: Layout, publish: Publish, note: Note, *, sweep_every: float = SWEEP_EVERY) -> None:
        self.files = UserFiles(layout)
        self.downloads = Downloads(self.files, sweep_every=sweep_every)
        self.sweep_every = sweep_every
        self._publish = publish
        self._note = note
        self._uploads: dict[str, _Upload] = {}
        self._starting = asyncio.Lock()  # one start at a time: each counts the room the others took
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return {pf.FilesListRequest: self._list, pf.FileReadRequest: self._read,
                pf.UploadStartRequest: self._start, pf.UploadChunkRequest: self._chunk,
                pf.UploadFinishRequest: self._finish, pf.UploadCancelRequest: self._cancel,
                **self.downloads.handlers}

    async def start(self) -> None:
        """Uploads a stopped server left unfinished are dropped; the sweeps start (downloads', uploads')."""
        self.downloads.start()
        self._sweeper = asyncio.create_task(sweeping(self.sweep_every, self._drop_idle, "uploads"),
                                            name="uploads-sweep")
        removed = await asyncio.to_thread(self.files.sweep_uploads, time.time())
        if removed:
            log.info("uploads_swept", removed=removed)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.downloads.stop()
        await bounded([self._drop(upload_id) for upload_id in list(self._uploads)], "uploads")

    def left(self, client: str) -> None:
        """A connection ended: its downloads linger, and its uploads go on on the next connection to ask."""
        self.downloads.left(client)
        for up in self._uploads.values():
            up.owner.ended(client)

    # ------------------------------------------------------------ browsing and reading

    async def _list(self, req: pf.FilesListRequest) -> pf.FilesListResult:
        try:
            after = None if req.after is None else (req.after, req.after_folder)
            entries, total, rest = await asyncio.to_thread(self.files.listing, req.path, req.offset, after)
        except (PathRefused, NotThere) as exc:
            raise refused(exc) from None
        return pf.FilesListResult(request_id=req.request_id, path=req.path.strip("/"), total=total, rest=rest, entries=[
            pf.FileEntry(name=e.name, kind=e.kind, size=e.size, modified=e.modified, openable=e.openable)
            for e in entries])

    async def _read(self, req: pf.FileReadRequest) -> pf.FileReadResult:
        try:
            data, size = await asyncio.to_thread(self.files.read, req.path, req.offset, req.length)
        except (PathRefused, NotThere) as exc:
            raise refused(exc) from None
        return pf.FileReadResult(request_id=req.request_id, path=req.path, offset=req.offset, size=size, data=data,
                                 eof=req.offset + len(data) >= size)

    # ------------------------------------------------------------ uploads

    async def _start(self, req: pf.UploadStartRequest) -> pf.UploadStartResult:
        await self._drop_idle(time.monotonic())  # their room is the new one's
        if req.size > pf.MAX_TRANSFER_BYTES:
            raise RequestFailed("too_large", f"{_size(req.size)} is over the upload limit of "
                                f"{_size(pf.MAX_TRANSFER_BYTES)}; nothing was uploaded")
        try:
            name = upload_name(req.name)
        except PathRefused as exc:
            raise RequestFailed("bad_path", str(exc)) from None
        async with self._starting:
            if len(self._uploads) >= MAX_UPLOADS:
                raise RequestFailed("upload_failed", f"{MAX_UPLOADS} uploads are under way; wait for one to finish")
            free = await asyncio.to_thread(free_bytes, self.files.root)
            # The uploads under way will take the rest of what they announced: that room is theirs.
            room = free - sum(up.size - up.received for up in self._uploads.values())
            if req.size > room - DISK_RESERVE:
                raise RequestFailed("too_large", f"the Sprite's disk has {_size(max(room, 0))} free (uploads under "
                                    f"way counted): not enough for {_size(req.size)}; nothing was uploaded")
            temp, fd = await asyncio.to_thread(self.files.begin_upload)
            upload_id = secrets.token_hex(16)  # 128 bits: never guessed
            self._uploads[upload_id] = _Upload(temp, fd, name, req.size, Owner(rq.client.get()))
        return pf.UploadStartResult(request_id=req.request_id, upload_id=upload_id, chunk_bytes=pf.CHUNK_BYTES,
                                    max_bytes=pf.MAX_TRANSFER_BYTES)

    @contextlib.asynccontextmanager
    async def _owned(self, upload_id: str, *, server: bool = False) -> AsyncIterator[_Upload]:
        """The upload, held (its other operations wait until this one is done), if the connection
        asking owns it or takes it over (the server's own drops, `server`, ask no connection)."""
        gone = RequestFailed("not_found", "no such upload (it finished, was cancelled, or sat idle "
                             f"for {UPLOAD_IDLE:.0f} s)")
        async with held(self._uploads, upload_id, gone, None if server else lambda up: up.owner.take("upload")) as up:
            yield up

    async def _chunk(self, req: pf.UploadChunkRequest) -> pf.UploadChunkResult:
        async with self._owned(req.upload_id) as up:
            return await self._write(req, up)

    async def _write(self, req: pf.UploadChunkRequest, up: _Upload) -> pf.UploadChunkResult:
        if req.data and up.last == (req.offset, len(req.data)):
            # The last chunk again: its answer was lost with the connection. It was written once.
            return pf.UploadChunkResult(request_id=req.request_id, upload_id=req.upload_id, received=up.received)
        if req.offset != up.received:
            raise RequestFailed("upload_failed", f"a chunk at {req.offset} came after {up.received} bytes: "
                                "chunks go in order")
        if up.received + len(req.data) > up.size:
            await self._discard(req.upload_id, up)
            raise RequestFailed("too_large", f"more than the {up.size:,} bytes announced; the upload was dropped")
        try:
            await settled(asyncio.to_thread(os.pwrite, up.fd, req.data, up.received))
        except OSError as exc:
            await self._discard(req.upload_id, up)
            raise RequestFailed("upload_failed", f"the upload could not be written ({exc.strerror}); "
                                "nothing was kept") from None
        up.digest.update(req.data)
        up.last = (up.received, len(req.data))
        up.received += len(req.data)
        up.touched = time.monotonic()
        return pf.UploadChunkResult(request_id=req.request_id, upload_id=req.upload_id, received=up.received)

    async def _finish(self, req: pf.UploadFinishRequest) -> pf.UploadFinishResult:
        async with self._owned(req.upload_id) as up:
            path = await self._put_in_place(req, up)
        self._placed(path, up.size)
        return pf.UploadFinishResult(request_id=req.request_id, path=path, size=up.size)

    def _placed(self, path: str, size: int) -> None:
        """An upload is in documents/: every device and the agent are told."""
        log.info("file_uploaded", bytes=size)  # no name at info: it can say what the file is about
        self._publish(p.FileUploaded(path=path, size=size))
        self._note(f"The person uploaded {path} ({_size(size)}) through the console.")

    async def _put_in_place(self, req: pf.UploadFinishRequest, up: _Upload) -> str:
        if up.received != up.size:
            raise RequestFailed("upload_failed", f"{up.received:,} of {up.size:,} bytes arrived; send the rest first")
        if req.sha256 is not None and req.sha256 != up.digest.hexdigest():
            await self._discard(req.upload_id, up)
            raise RequestFailed("upload_failed", "the file arrived changed (its sha256 differs); nothing was kept")
        del self._uploads[req.upload_id]
        try:
            return await settled(asyncio.to_thread(self.files.finish_upload, up.temp, up.fd, up.name))
        except PathRefused as exc:
            raise RequestFailed("bad_path", f"{exc}; nothing was uploaded") from None
        except Placed as exc:  # in documents/, whole: said, with what failed after, as done (not to send again)
            self._placed(exc.path, up.size)
            raise RequestFailed("not_durable", f"the upload is in {exc.path}, but the step after failed "
                                f"({exc.strerror or exc}): it may not survive a power loss, or not be the "
                                "agent's to change; do not upload it again") from None
        except OSError as exc:
            raise RequestFailed("upload_failed", f"the upload could not be put in documents/ "
                                f"({exc.strerror or exc}); nothing was kept") from None
        finally:
            os.close(up.fd)
            await asyncio.to_thread(self.files.discard_upload, up.temp)

    async def _cancel(self, req: pf.UploadCancelRequest) -> pf.UploadCancelResult:
        async with self._owned(req.upload_id) as up:
            await self._discard(req.upload_id, up)
        return pf.UploadCancelResult(request_id=req.request_id, upload_id=req.upload_id)

    async def _drop(self, upload_id: str) -> None:
        """Drop an upload once whatever holds it is done (a stop, or one sitting idle)."""
        with contextlib.suppress(RequestFailed):
            async with self._owned(upload_id, server=True) as up:
                await self._discard(upload_id, up)

    async def _discard(self, upload_id: str, up: _Upload) -> None:
        """Close and remove an upload its caller holds."""
        del self._uploads[upload_id]
        os.close(up.fd)
        await asyncio.to_thread(self.files.discard_upload, up.temp)

    async def _drop_idle(self, now: float) -> None:
        for upload_id, up in list(self._uploads.items()):
            if now - up.touched > UPLOAD_IDLE:
                log.info("upload_dropped_idle", received=up.received, size=up.size)
                await self._drop(upload_id)
