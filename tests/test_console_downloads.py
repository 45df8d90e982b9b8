"""Downloads over the socket: the bytes of the file that was opened, exactly, a chunk at a time read
in a thread from one descriptor (a link swapped in mid-way is never followed, a file written to
mid-way is file_changed), only in user space, at most MAX_DOWNLOADS open at once and PER_CLIENT on
one connection with a clear error past it (a takeover counted in), each its connection's alone, closed when idle by a sweep of their own or lingering
for a while once finished or their connection gone, and a client that asks for chunks without
reading the answers is held back instead of piling them up in the server's memory."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import os
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import pytest

from devkit.harness import make_settings
from sprite_os.console import downloads as dl
from sprite_os.console import files_frames as pf
from sprite_os.console import requests as rq
from tests.conftest import client_factory, running
from tests.test_console_files import Kit, unix_socket
from tests.test_console_files import kit as kit  # the fixture, shared

_T = TypeVar("_T")


async def on(client: str, work: Awaitable[_T]) -> _T:
    """`work` as asked on the connection `client` (what the gateway's request task sets)."""
    context = contextvars.copy_context()
    context.run(rq.client.set, client)
    return await asyncio.create_task(_awaited(work), context=context)


async def _awaited(work: Awaitable[_T]) -> _T:
    return await work


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
    assert kit.api.downloads.under_way == 0  # the last chunk finished it
    await kit.ask(pf.DownloadCancelRequest(request_id="x", download_id=opened.download_id))
    gone = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id, offset=0))
    assert gone.code == "not_found" and kit.api.downloads.open == 0
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
    assert shorter.code == "file_changed" and "written to" in shorter.message
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
    clients = [f"c{n}" for n in range(dl.MAX_DOWNLOADS // dl.PER_CLIENT)]
    opened = [await on(c, start(kit, "a.txt")) for c in clients for _ in range(dl.PER_CLIENT)]
    mine = await on("c0", kit.refused(pf.DownloadStartRequest(request_id="s", path="a.txt")))
    assert mine.code == "busy" and mine.message.startswith(f"{dl.PER_CLIENT} downloads are under way on this "
                                                           "connection")
    busy = await on("other", kit.refused(pf.DownloadStartRequest(request_id="s", path="a.txt")))
    assert busy.code == "busy" and busy.message.startswith(f"{dl.MAX_DOWNLOADS} downloads are under way;")
    await on("c0", kit.ask(pf.DownloadCancelRequest(request_id="x", download_id=opened[0].download_id)))
    assert await on("other", whole(kit, "a.txt")) == b"abc"  # a place was free again
    assert (await on("c0", chunk(kit, opened[1].download_id, 0))).data == b"abc"  # it finishes: c0 may start one more
    assert await on("c0", whole(kit, "a.txt")) == b"abc"


async def test_concurrent_starts_never_open_more_than_the_cap(kit: Kit) -> None:
    # Each start counts the ones before it: without the starts' lock, all of them see room.
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    kit.api.downloads.per_client = dl.MAX_DOWNLOADS
    answers = await asyncio.gather(*(kit.ask(pf.DownloadStartRequest(request_id=f"s{n}", path="a.txt"))
                                     for n in range(dl.MAX_DOWNLOADS + 4)), return_exceptions=True)
    assert kit.api.downloads.open == dl.MAX_DOWNLOADS
    assert sum(isinstance(a, pf.DownloadStartResult) for a in answers) == dl.MAX_DOWNLOADS


async def test_the_last_chunk_asked_again_after_its_answer_was_lost_gets_the_same_bytes(kit: Kit) -> None:
    # The page asks again for a chunk whose answer was lost with the connection, the last one too.
    data = os.urandom(pf.CHUNK_BYTES + 10)
    (kit.layout.root / "a.bin").write_bytes(data)
    opened = await on("tab", start(kit, "a.bin"))
    await on("tab", chunk(kit, opened.download_id, 0))
    last = await on("tab", chunk(kit, opened.download_id, pf.CHUNK_BYTES))
    assert last.eof and kit.api.downloads.under_way == 0  # finished: its place on the connection is free
    kit.api.downloads.left("tab")  # the answer was lost with the connection: the page asks on a new one
    again = await on("tab-2", chunk(kit, opened.download_id, pf.CHUNK_BYTES))
    assert again.eof and again.data == last.data == data[pf.CHUNK_BYTES:]
    await kit.api.downloads.close_idle(time.monotonic() + dl.LINGER + 1)  # then it lingers no more
    assert kit.api.downloads.open == 0


async def test_a_client_gone_leaves_its_downloads_lingering_and_they_give_their_places_up(kit: Kit) -> None:
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    clients = [f"c{n}" for n in range(dl.MAX_DOWNLOADS // dl.PER_CLIENT)]
    opened = {c: [await on(c, start(kit, "a.txt")) for _ in range(dl.PER_CLIENT)] for c in clients}
    for c in clients:  # every tab closed mid-way
        kit.api.downloads.left(c)
    assert kit.api.downloads.under_way == 0 and kit.api.downloads.open == dl.MAX_DOWNLOADS
    # A page come back on a new connection goes on with its download: that connection owns it now.
    assert (await on("c0-again", chunk(kit, opened["c0"][0].download_id, 0))).data == b"abc"
    # A new client gets a place at once: the lingering ones give theirs up, the longest untouched first.
    assert await on("new", whole(kit, "a.txt")) == b"abc"
    assert kit.api.downloads.open == dl.MAX_DOWNLOADS  # one lingering download was closed for it
    resumed = opened["c0"][0].download_id
    lingering = [o.download_id for c in clients for o in opened[c] if o.download_id != resumed]
    assert sum(d not in kit.api.downloads._open for d in lingering) == 1
    assert resumed in kit.api.downloads._open  # not the one asked for again


async def test_a_connection_that_ends_leaves_its_downloads_to_linger(tmp_path: Path) -> None:
    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    async with running(settings, memory=False) as app, client_factory(app.port) as connect:
        (app.settings.layout.root / "a.txt").write_bytes(b"x" * (pf.CHUNK_BYTES + 3))
        a = await connect(hello={})
        frames = []
        for n in range(dl.PER_CLIENT + 1):
            await a.send(type="download_start", request_id=f"s{n}", path="a.txt")
            frames.append(await a.recv())
        assert [f["type"] for f in frames] == ["download_start_result"] * dl.PER_CLIENT + ["error"]
        assert frames[-1]["code"] == "busy"
        downloads = app.files.downloads
        assert downloads.under_way == dl.PER_CLIENT
        await a.ws.close()  # the tab is closed mid-way
        async with asyncio.timeout(10):
            while downloads.under_way:
                await asyncio.sleep(0.05)
        b = await connect(hello={})
        await b.send(type="download_chunk", request_id="c", download_id=frames[0]["download_id"], offset=0)
        assert (await b.until("download_chunk_result"))["eof"] is False  # the page goes on, on a new connection
        assert downloads.under_way == 1


async def test_idle_downloads_are_closed_by_a_sweep_of_their_own_stopped_with_the_rest(tmp_path: Path) -> None:
    kit = Kit(tmp_path / "workspace")
    downloads = kit.api.downloads
    downloads.idle, downloads.sweep_every = 0.0, 0.01
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    fds = len(os.listdir("/proc/self/fd"))
    first = await start(kit, "a.txt")
    await kit.api.start()  # the sweep
    async with asyncio.timeout(10):  # closed with no other request coming
        while downloads.open:
            await asyncio.sleep(0.01)
    gone = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=first.download_id, offset=0))
    assert gone.code == "not_found" and "idle" in gone.message and len(os.listdir("/proc/self/fd")) == fds
    sweeper = downloads._sweeper
    downloads.idle = 60.0
    await start(kit, "a.txt")
    await kit.api.stop()
    assert sweeper is not None and sweeper.done()
    assert downloads.open == 0 and len(os.listdir("/proc/self/fd")) == fds


async def test_a_file_rewritten_in_place_mid_way_is_file_changed_not_half_old_half_new(kit: Kit) -> None:
    # The agent rewrites it in place (`cat new > report.pdf`: truncated, then written to the same size).
    path = kit.layout.root / "report.pdf"
    old, new = b"A" * (pf.CHUNK_BYTES + 100), b"B" * (pf.CHUNK_BYTES + 100)
    path.write_bytes(old)
    os.utime(path, ns=(time.time_ns() - 10**9, time.time_ns() - 10**9))  # written a second ago
    opened = await start(kit, "report.pdf")
    assert (await chunk(kit, opened.download_id, 0)).data == old[:pf.CHUNK_BYTES]
    with open(path, "r+b") as f:  # same inode
        f.truncate(0)
        f.write(new)
    changed = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                        offset=pf.CHUNK_BYTES))
    assert changed.code == "file_changed" and kit.api.downloads.open == 0


async def test_a_file_that_grows_mid_way_is_file_changed(kit: Kit) -> None:
    path = kit.layout.root / "log.txt"
    path.write_bytes(b"x" * (pf.CHUNK_BYTES + 100))
    opened = await start(kit, "log.txt")
    with open(path, "ab") as f:
        f.write(b"more")
    changed = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id, offset=0))
    assert changed.code == "file_changed"


async def test_a_chunk_cancelled_mid_read_keeps_its_descriptor_until_the_read_is_done(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    # The read runs in a thread a cancellation can't stop: the descriptor stays open under it (a
    # descriptor closed there could be reused by another file, and that file's bytes sent).
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    opened = await start(kit, "a.txt")
    reading, go = threading.Event(), threading.Event()
    still_open: list[bool] = []
    pread = os.pread

    def slow(fd: int, n: int, offset: int) -> bytes:
        reading.set()
        go.wait(10)
        try:
            os.fstat(fd)
            still_open.append(True)
        except OSError:
            still_open.append(False)
        return pread(fd, n, offset)

    monkeypatch.setattr(dl.os, "pread", slow)
    asking = asyncio.ensure_future(chunk(kit, opened.download_id, 0))
    await asyncio.to_thread(reading.wait, 10)
    asking.cancel()
    cancel = asyncio.ensure_future(kit.ask(pf.DownloadCancelRequest(request_id="x", download_id=opened.download_id)))
    await asyncio.sleep(0.05)
    assert not cancel.done()  # the cancel waits for the read
    go.set()
    await cancel
    assert still_open == [True] and kit.api.downloads.open == 0
    with pytest.raises(asyncio.CancelledError):
        await asking


async def test_a_chunk_that_waited_for_a_cancel_is_not_found_not_a_read_of_a_closed_descriptor(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    opened = await start(kit, "a.txt")
    reading, go = threading.Event(), threading.Event()
    pread = os.pread

    def slow(fd: int, n: int, offset: int) -> bytes:
        reading.set()
        go.wait(10)
        return pread(fd, n, offset)

    monkeypatch.setattr(dl.os, "pread", slow)
    first = asyncio.ensure_future(chunk(kit, opened.download_id, 0))
    await asyncio.to_thread(reading.wait, 10)
    cancel = asyncio.ensure_future(kit.ask(pf.DownloadCancelRequest(request_id="x", download_id=opened.download_id)))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(kit.ask(pf.DownloadChunkRequest(request_id="c2", download_id=opened.download_id,
                                                                   offset=0)))
    await asyncio.sleep(0.05)  # both wait for the read's lock, the cancel first
    go.set()
    assert (await first).data == b"abc"
    await cancel
    with pytest.raises(dl.RequestFailed) as gone:
        await second
    assert gone.value.code == "not_found"


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
        # Until the server stops taking requests: no new one for a second. Looked at every 0.1 s, so the
        # test pays that second once, not a second's sleep before it too.
        seen, still_since = -1, time.monotonic()
        while time.monotonic() - still_since < 1.0:
            await asyncio.sleep(0.1)
            if asked != seen:
                seen, still_since = asked, time.monotonic()
        assert asked < sent, asked  # held back, not queued up
        c.ws.transport.resume_reading()
        got: dict[str, dict[str, object]] = {}
        async with asyncio.timeout(60):
            while len(got) < sent:
                if (frame := await c.recv(timeout=60)).get("request_id", "").startswith("c"):
                    got[frame["request_id"]] = frame
        assert set(got) == {f"c{n}" for n in range(sent)}  # every request was answered, once read:
        answered = [f for f in got.values() if f["type"] == "download_chunk_result"]
        busy = [f for f in got.values() if f["type"] == "error"]
        assert len(answered) == asked and all(f["code"] == "queue_full" for f in busy)  # past the queue


async def test_a_sweep_that_fails_once_goes_on_sweeping(tmp_path: Path) -> None:
    kit = Kit(tmp_path / "workspace")
    downloads = kit.api.downloads
    downloads.idle, downloads.sweep_every = 0.0, 0.01
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    real, failed = downloads.close_idle, []

    async def once_broken(now: float) -> None:
        if not failed:
            failed.append(now)
            raise OSError("a close failed")
        await real(now)

    downloads.close_idle = once_broken  # type: ignore[method-assign]
    await start(kit, "a.txt")
    await kit.api.start()
    try:
        async with asyncio.timeout(10):
            while downloads.open:
                await asyncio.sleep(0.01)
        assert failed  # it failed once, and the next sweep closed the idle download
    finally:
        await kit.api.stop()


async def test_a_download_is_its_connections_and_its_id_is_no_key_on_another(kit: Kit) -> None:
    (kit.layout.root / "a.txt").write_bytes(b"abc")
    opened = await on("a", start(kit, "a.txt"))
    ids = {opened.download_id, *[(await on("a", start(kit, "a.txt"))).download_id for _ in range(2)]}
    assert len(ids) == 3 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)  # 128 random bits each
    for request in (pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id, offset=0),
                    pf.DownloadCancelRequest(request_id="x", download_id=opened.download_id)):
        refused = await on("b", kit.refused(request))
        assert refused.code == "busy" and "another connection's" in refused.message
    assert (await on("a", chunk(kit, opened.download_id, 0))).data == b"abc"  # still a's, still open
    kit.api.downloads.left("a")  # a's connection ended: the next to ask goes on with it
    assert (await on("b", chunk(kit, opened.download_id, 0))).data == b"abc"
    refused = await on("c", kit.refused(pf.DownloadCancelRequest(request_id="x", download_id=opened.download_id)))
    assert refused.code == "busy"  # b's now


async def test_a_takeover_counts_in_the_connections_share(kit: Kit) -> None:
    # A page that reconnects and goes on with its downloads while starting new ones: at most PER_CLIENT.
    (kit.layout.root / "a.txt").write_bytes(b"x" * (pf.CHUNK_BYTES + 1))
    old = [await on("old", start(kit, "a.txt")) for _ in range(dl.PER_CLIENT)]
    kit.api.downloads.left("old")
    new = [await on("new", start(kit, "a.txt")) for _ in range(dl.PER_CLIENT)]  # the lingering ones don't count
    refused = await on("new", kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=old[0].download_id,
                                                                   offset=0)))
    assert refused.code == "busy" and refused.message.startswith(f"{dl.PER_CLIENT} downloads are under way on this")
    assert kit.api.downloads.under_way == dl.PER_CLIENT
    await on("new", chunk(kit, new[0].download_id, pf.CHUNK_BYTES))  # one finishes: a place on "new" is free
    assert (await on("new", chunk(kit, old[0].download_id, 0))).eof is False  # taken over, in its share
    refused = await on("new", kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=old[1].download_id,
                                                                   offset=0)))
    assert refused.code == "busy" and kit.api.downloads.under_way == dl.PER_CLIENT


async def test_a_finished_download_sends_only_its_last_chunk_again(kit: Kit) -> None:
    # Finished, it no longer counts in its connection's share: it must not be a free download of the rest.
    data = os.urandom(2 * pf.CHUNK_BYTES + 5)
    (kit.layout.root / "a.bin").write_bytes(data)
    opened = await start(kit, "a.bin")
    last = await chunk(kit, opened.download_id, 2 * pf.CHUNK_BYTES)  # the end first: finished at once
    assert last.eof and kit.api.downloads.under_way == 0
    assert (await chunk(kit, opened.download_id, 2 * pf.CHUNK_BYTES)).data == last.data == data[-5:]
    refused = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id, offset=0))
    assert refused.code == "not_found" and "only its last chunk" in refused.message
    # and it lingers LINGER from its end, however often it is asked for again
    await chunk(kit, opened.download_id, 2 * pf.CHUNK_BYTES)
    down = kit.api.downloads._open[opened.download_id]
    down.touched -= dl.LINGER + 1
    await chunk(kit, opened.download_id, 2 * pf.CHUNK_BYTES)
    await kit.api.downloads.close_idle(time.monotonic())
    assert kit.api.downloads.open == 0


async def test_a_file_rewritten_in_place_with_its_mtime_set_back_is_file_changed(kit: Kit) -> None:
    # Same size, same modification time (set back, as `cp -p`, `tar` or `rsync -t` do, or within one tick
    # of a coarse clock): the change time still moves, and no one can set it back.
    path = kit.layout.root / "report.pdf"
    old, new = b"A" * (pf.CHUNK_BYTES + 100), b"B" * (pf.CHUNK_BYTES + 100)
    path.write_bytes(old)
    before = path.stat()
    opened = await start(kit, "report.pdf")
    assert (await chunk(kit, opened.download_id, 0)).data == old[:pf.CHUNK_BYTES]
    with open(path, "r+b") as f:  # same inode, same size
        f.write(new)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    changed = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                        offset=pf.CHUNK_BYTES))
    assert changed.code == "file_changed" and kit.api.downloads.open == 0


def _bump_ctime(path: Path) -> None:
    """Move the file's change time only (a chmod, as a backup tool, `chown`, `ln` or the agent does),
    waiting out a coarse clock tick so that it really moves."""
    before = os.stat(path).st_ctime_ns
    mode = os.stat(path).st_mode & 0o777
    while os.stat(path).st_ctime_ns == before:
        os.chmod(path, mode ^ 0o004)
        os.chmod(path, mode)
        if os.stat(path).st_ctime_ns == before:
            time.sleep(0.002)


def _counting_pread(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    read: list[int] = []
    pread = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        data = pread(fd, n, offset)
        read.append(len(data))
        return data

    monkeypatch.setattr(dl.os, "pread", counted)
    return read


async def test_a_change_time_moving_every_chunk_costs_one_more_read_of_the_file(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent chmods the file in a loop, or a backup tool links it: re-reading what was sent at every
    # move cost the file's size squared (40 chunks: 20x the file). What was sent is read again once.
    chunks = 40
    path = kit.layout.root / "big.bin"
    data = os.urandom(chunks * pf.CHUNK_BYTES - 7)
    path.write_bytes(data)
    read = _counting_pread(monkeypatch)
    opened = await start(kit, "big.bin")
    got = []
    for n in range(chunks):
        _bump_ctime(path)
        got.append(await chunk(kit, opened.download_id, n * pf.CHUNK_BYTES))
    assert got[-1].eof and b"".join(c.data for c in got) == data
    assert sum(read) == 2 * len(data), f"read {sum(read) / len(data):.1f}x the file to send it once"


async def test_a_change_time_move_is_told_before_the_last_chunk_goes(kit: Kit) -> None:
    # Its bytes rewritten, same size, its modification time set back, while chunks go: the earlier chunks
    # went (the page keeps them in memory), the last one is file_changed, so the page saves nothing.
    path = kit.layout.root / "r.bin"
    path.write_bytes(b"A" * (3 * pf.CHUNK_BYTES))
    before = path.stat()
    opened = await start(kit, "r.bin")
    await chunk(kit, opened.download_id, 0)
    with open(path, "r+b") as f:
        f.write(b"B" * 10)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    await chunk(kit, opened.download_id, pf.CHUNK_BYTES)  # the move is noted, not re-read yet
    refused = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                        offset=2 * pf.CHUNK_BYTES))
    assert refused.code == "file_changed" and kit.api.downloads.open == 0


async def test_only_a_chunks_start_below_the_size_is_an_offset(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each distinct offset was recorded (and re-read at a change time's move): a client could grow the
    # server's memory without bound, and make one chmod cost many times the file.
    path = kit.layout.root / "a.bin"
    path.write_bytes(os.urandom(2 * pf.CHUNK_BYTES))
    opened = await start(kit, "a.bin")
    for offset in (1, 7, pf.CHUNK_BYTES - 1, pf.CHUNK_BYTES + 1, 2 * pf.CHUNK_BYTES, 10 * pf.CHUNK_BYTES):
        refused = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                            offset=offset))
        assert refused.code == "not_found" and "no chunk of this download starts" in refused.message
    for _ in range(3):
        await chunk(kit, opened.download_id, 0)
    assert len(kit.api.downloads._open[opened.download_id].sent) == 1
    read = _counting_pread(monkeypatch)
    _bump_ctime(path)
    last = await chunk(kit, opened.download_id, pf.CHUNK_BYTES)
    assert last.eof and sum(read) == 3 * pf.CHUNK_BYTES  # the last chunk, and the first read again once
    empty = kit.layout.root / "empty"
    empty.write_bytes(b"")
    opened = await start(kit, "empty")
    assert (await chunk(kit, opened.download_id, 0)).eof  # an empty file's one chunk


async def test_a_finished_download_sends_nothing_but_its_last_chunk_again(kit: Kit) -> None:
    (kit.layout.root / "a.bin").write_bytes(os.urandom(2 * pf.CHUNK_BYTES + 5))
    opened = await start(kit, "a.bin")
    assert (await chunk(kit, opened.download_id, 2 * pf.CHUNK_BYTES)).eof
    refused = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                        offset=pf.CHUNK_BYTES))  # past its start, not the last
    assert refused.code == "not_found" and "only its last chunk" in refused.message
    refused = await kit.refused(pf.DownloadChunkRequest(request_id="c", download_id=opened.download_id,
                                                        offset=2 * pf.CHUNK_BYTES + 1))
    assert refused.code == "not_found"


async def test_a_stop_cuts_a_read_going_over_what_was_sent(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server stops while a thread reads again what was sent: the read ends at its next chunk, and
    # the stop does not wait for it beyond STOP_WAIT.
    path = kit.layout.root / "a.bin"
    path.write_bytes(os.urandom(8 * pf.CHUNK_BYTES))
    opened = await start(kit, "a.bin")
    for n in range(7):
        await chunk(kit, opened.download_id, n * pf.CHUNK_BYTES)
    reading, go_on = threading.Event(), threading.Event()
    pread = os.pread
    read: list[int] = []

    def slow(fd: int, n: int, offset: int) -> bytes:
        read.append(offset)
        if len(read) == 2:  # the last chunk read, and the rehash's first: the stop comes now
            reading.set()
            go_on.wait(5)
        return pread(fd, n, offset)

    monkeypatch.setattr(dl.os, "pread", slow)
    _bump_ctime(path)
    last = asyncio.ensure_future(chunk(kit, opened.download_id, 7 * pf.CHUNK_BYTES))
    await asyncio.to_thread(reading.wait, 5)
    stopping = asyncio.ensure_future(kit.api.downloads.stop())
    await asyncio.sleep(0.05)
    go_on.set()
    await stopping
    with pytest.raises(rq.RequestFailed, match="the server is stopping"):
        await last
    assert len(read) == 2 and kit.api.downloads.open == 0  # no chunk read after the cut
