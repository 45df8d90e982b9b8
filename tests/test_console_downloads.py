"""Downloads over the socket: the bytes of the file that was opened, exactly, a chunk at a time read
in a thread from one descriptor (a link swapped in mid-way is never followed), only in user space,
at most MAX_DOWNLOADS open at once with a clear error past it, and a client that asks for chunks
without reading the answers is held back instead of piling them up in the server's memory."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path

import pytest

from devkit.harness import make_settings
from sprite_os.console import downloads as dl
from sprite_os.console import files_frames as pf
from tests.conftest import client_factory, running
from tests.test_console_files import Kit, unix_socket
from tests.test_console_files import kit as kit  # the fixture, shared


async def start(kit: Kit, path: str) -> pf.DownloadStartResult:
    answer = await kit.ask(pf.DownloadStartRequest(request_id="s", path=path))
    assert isinstance(answer, pf.DownloadStartResult)
    return answer


async def chunk(kit: Kit, download_id: str, offset: int) -> pf.DownloadChunkResult:
    answer = await kit.ask(pf.DownloadChunkRequest(request_id="c", download_id=download_id, offset=offset))
    assert isinstance(answer, pf.DownloadChunkResult)
    return answer


async def whole(kit: Kit, path: str) -> bytes:
    opened = await start(kit, path)
    got = b""
    while True:
        part = await chunk(kit, opened.download_id, len(got))
        got += part.data
        if part.eof:
            return got


async def test_a_download_is_the_file_byte_for_byte_read_in_a_thread(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(3 * pf.CHUNK_BYTES + 12345)
    (kit.layout.root / "documents" / "scan.bin").write_bytes(data)
    readers: list[str] = []
    pread = os.pread

    def watched(fd: int, n: int, offset: int) -> bytes:
        readers.append(threading.current_thread().name)
        return pread(fd, n, offset)

    monkeypatch.setattr(dl.os, "pread", watched)
    opened = await start(kit, "documents/scan.bin")
    assert (opened.name, opened.size, opened.chunk_bytes) == ("scan.bin", len(data), pf.CHUNK_BYTES)
    got = b""
    while not (part := await chunk(kit, opened.download_id, len(got))).eof:
        assert len(part.data) == pf.CHUNK_BYTES and part.offset == len(got)
        got += part.data
    got += part.data
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest()
    assert len(readers) == 4 and threading.main_thread().name not in readers  # never on the event loop
    assert kit.api.downloads.open == 0  # the last chunk closed it
    gone = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id, offset=0))
    assert gone.code == "not_found"
    (kit.layout.root / "empty.txt").write_bytes(b"")
    assert await whole(kit, "empty.txt") == b""


async def test_asking_for_a_chunk_again_gets_the_same_bytes(kit: Kit) -> None:
    data = os.urandom(pf.CHUNK_BYTES + 10)
    (kit.layout.root / "a.bin").write_bytes(data)
    opened = await start(kit, "a.bin")
    first = await chunk(kit, opened.download_id, 0)
    assert (await chunk(kit, opened.download_id, 0)).data == first.data == data[:pf.CHUNK_BYTES]
    assert (await chunk(kit, opened.download_id, pf.CHUNK_BYTES)).data == data[pf.CHUNK_BYTES:]


async def test_a_link_swapped_in_mid_way_is_not_followed(kit: Kit) -> None:
    docs = kit.layout.root / "documents"
    data = os.urandom(2 * pf.CHUNK_BYTES + 7)
    (docs / "lease.pdf").write_bytes(data)
    opened = await start(kit, "documents/lease.pdf")
    got = (await chunk(kit, opened.download_id, 0)).data
    # The agent swaps the file for a link to the server's token, then the folder for a link to .os/.
    (docs / "swap").symlink_to(kit.layout.os_dir / "token")
    os.replace(docs / "swap", docs / "lease.pdf")
    os.rename(docs, kit.layout.root / "was-documents")
    (kit.layout.root / "documents").symlink_to(kit.layout.os_dir)
    while not (part := await chunk(kit, opened.download_id, len(got))).eof:
        got += part.data
    got += part.data
    assert got == data and b"secret-token" not in got
    for path in ("documents/lease.pdf", "documents/token", "was-documents/lease.pdf"):
        refused = await kit.refused(pf.DownloadStartRequest(request_id="s", path=path))
        assert refused.code == "bad_path" and "link" in refused.message, (path, refused.message)


async def test_a_file_that_gets_shorter_mid_way_is_a_clear_error(kit: Kit) -> None:
    path = kit.layout.root / "log.txt"
    path.write_bytes(b"x" * (pf.CHUNK_BYTES + 100))
    opened = await start(kit, "log.txt")
    await chunk(kit, opened.download_id, 0)
    os.truncate(path, 50)
    shorter = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                        offset=pf.CHUNK_BYTES))
    assert shorter.code == "file_changed" and "shorter" in shorter.message
    assert kit.api.downloads.open == 0


async def test_only_user_space_files_and_the_size_limit(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    root = kit.layout.root
    (root / "documents" / "link").symlink_to(kit.layout.os_dir / "token")
    (root / "documents" / "r.pdf").write_bytes(b"%PDF-1.7 ...")
    for path in (".os/token", "../x", "/etc/passwd", "documents/link", "documents/../.os/token", "documents", ""):
        refused = await kit.refused(pf.DownloadStartRequest(request_id="s", path=path))
        assert refused.code == "bad_path" and "secret" not in refused.message, (path, refused.message)
    assert (await kit.refused(pf.DownloadStartRequest(request_id="s", path="documents/nope"))).code == "not_found"
    sock = unix_socket(root, monkeypatch)
    refused = await kit.refused(pf.DownloadStartRequest(request_id="s", path=f"documents/{sock}"))
    assert refused.code == "bad_path" and "a socket" in refused.message
    monkeypatch.setattr(pf, "MAX_TRANSFER_BYTES", 4)
    big = await kit.refused(pf.DownloadStartRequest(request_id="s", path="documents/r.pdf"))
    assert big.code == "too_large" and "over the console's download limit of 4" in big.message
    assert kit.api.downloads.open == 0


async def test_past_the_cap_a_download_waits_its_turn_with_a_clear_error(kit: Kit) -> None:
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    opened = [await start(kit, "a.txt") for _ in range(dl.MAX_DOWNLOADS)]
    busy = await kit.refused(pf.DownloadStartRequest(request_id="s", path="a.txt"))
    assert busy.code == "busy" and busy.message.startswith(f"{dl.MAX_DOWNLOADS} downloads are under way")
    await kit.ask(pf.DownloadCancelRequest(request_id="x", download_id=opened[0].download_id))
    assert await whole(kit, "a.txt") == b"abc"  # a place was free again
    assert (await chunk(kit, opened[1].download_id, 0)).data == b"abc"  # it finishes: one more place


async def test_a_download_nobody_reads_is_closed_and_a_stop_closes_all(tmp_path: Path) -> None:
    kit = Kit(tmp_path / "workspace")
    kit.api.downloads.idle = 0.0
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    first = await start(kit, "a.txt")
    await asyncio.sleep(0.01)
    await start(kit, "a.txt")  # a start closes the idle ones first
    gone = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=first.download_id, offset=0))
    assert gone.code == "not_found" and "idle" in gone.message
    fds = len(os.listdir("/proc/self/fd"))
    await start(kit, "a.txt")
    await kit.api.stop()
    assert kit.api.downloads.open == 0 and len(os.listdir("/proc/self/fd")) < fds


async def test_a_client_that_does_not_read_its_chunks_is_held_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    asked = 0
    answer = dl.Downloads._chunk

    async def counted(self: dl.Downloads, req: pf.DownloadChunkRequest) -> pf.DownloadChunkResult:
        nonlocal asked
        asked += 1
        return await answer(self, req)

    monkeypatch.setattr(dl.Downloads, "_chunk", counted)
    async with running(settings) as app, client_factory(app.port) as connect:
        (app.settings.layout.root / "big.bin").write_bytes(os.urandom(2 * pf.CHUNK_BYTES))
        c = await connect(hello={})
        await c.send(type="download_start", request_id="s", path="big.bin")
        download_id = (await c.until("download_start_result"))["download_id"]
        c.ws.transport.pause_reading()  # stop reading answers; its socket buffers fill up
        sent = 50  # under the rate limit's burst; 50 answers are ~35 MB of base64
        for n in range(sent):
            await c.send(type="download_chunk", request_id=f"c{n}", download_id=download_id, offset=0)
        seen = -1
        while seen != asked:  # until the server stops taking requests
            seen = asked
            await asyncio.sleep(1.0)
        assert asked < sent, asked  # held back, not queued up
        c.ws.transport.resume_reading()
        got = {(await c.until("download_chunk_result"))["request_id"] for _ in range(sent)}
        assert got == {f"c{n}" for n in range(sent)}  # and every answer came, once read
