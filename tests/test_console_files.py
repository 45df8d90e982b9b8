"""The person's files through the console, without a browser: browsing, reading and uploading
only inside user space (no `..`, no absolute path, nothing of `.os/`, no link followed, not even
one the agent plants mid-upload), the size limit, and uploads that land in documents/ under a name
no file has, with a chunk sent again after its answer was lost written once. Downloads:
test_console_downloads.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import stat
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from devkit.harness import make_settings, wait_for
from sprite_os import fsutil
from sprite_os import protocol as p
from sprite_os.commands.memory_status import disk
from sprite_os.console import files_api, user_files
from sprite_os.console import files_frames as pf
from sprite_os.console.files_api import FilesConsole
from sprite_os.console.requests import RequestFailed
from sprite_os.console.user_files import PathRefused, parts, upload_name
from sprite_os.paths import Layout
from tests.conftest import running


class Kit:
    def __init__(self, root: Path) -> None:
        self.layout = Layout(root)
        self.layout.ensure()
        self.published: list[p.ServerFrame] = []
        self.notes: list[str] = []
        self.api = FilesConsole(self.layout, self.published.append, self.notes.append)

    async def ask(self, request: object) -> object:
        return await self.api.handlers[type(request)](request)  # type: ignore[index]

    async def refused(self, request: object) -> RequestFailed:
        with pytest.raises(RequestFailed) as info:
            await self.ask(request)
        return info.value

    async def upload(self, name: str, data: bytes, chunk: int = pf.CHUNK_BYTES) -> str:
        start = await self.ask(pf.UploadStartRequest(request_id="s", name=name, size=len(data)))
        upload_id = start.upload_id  # type: ignore[attr-defined]
        for offset in range(0, len(data), chunk):
            await self.ask(pf.UploadChunkRequest(request_id="c", upload_id=upload_id, offset=offset,
                                                 data=data[offset:offset + chunk]))
        done = await self.ask(pf.UploadFinishRequest(request_id="f", upload_id=upload_id,
                                                     sha256=hashlib.sha256(data).hexdigest()))
        return done.path  # type: ignore[attr-defined]


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Kit]:
    k = Kit(tmp_path / "workspace")
    (k.layout.os_dir / "token").write_text("secret-token")
    yield k
    await k.api.stop()


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", ".os", ".os/token", "documents/../.os/token", "./x",
                                  "a/./b", "x\0y", "/", "a" * 300])
def test_paths_outside_user_space_are_refused(path: str) -> None:
    with pytest.raises(PathRefused):
        parts(path)


def test_paths_inside_are_their_parts() -> None:
    assert parts("") == [] and parts("documents//scans/") == ["documents", "scans"]
    assert parts("documents/.os/x") == ["documents", ".os", "x"]  # only the top-level .os is the system's


@pytest.mark.parametrize(("given", "kept"), [
    ("invoice.pdf", "invoice.pdf"), ("../../etc/passwd", "passwd"), ("C:\\Users\\ada\\scan.png", "scan.png"),
    ("invoice\u202egnp.exe", "invoicegnp.exe"), (".bashrc", "bashrc"), ("a\nb\tc.txt", "a_b_c.txt"),
    ("x" * 400 + ".pdf", "x" * 235 + ".pdf"),
])
def test_upload_names_are_one_plain_visible_name(given: str, kept: str) -> None:
    assert upload_name(given) == kept


def test_an_upload_name_of_nothing_usable_is_refused() -> None:
    for name in ("..", "/", "\u202e", "  "):
        with pytest.raises(PathRefused):
            upload_name(name)


async def test_browse_and_read_only_user_space(kit: Kit) -> None:
    root = kit.layout.root
    (root / "documents" / "notes.txt").write_text("hello")
    (root / "notes-link").symlink_to(root / ".os" / "token")
    (root / "os-link").symlink_to(root / ".os")
    os.mkfifo(root / "documents" / "pipe")
    listing = await kit.ask(pf.FilesListRequest(request_id="l"))
    names = {e.name: e.kind for e in listing.entries}  # type: ignore[attr-defined]
    assert ".os" not in names and names["documents"] == "folder" and names["notes-link"] == "link"
    inside = await kit.ask(pf.FilesListRequest(request_id="l", path="documents"))
    assert [(e.name, e.kind, e.size) for e in inside.entries] == [  # type: ignore[attr-defined]
        ("notes.txt", "file", 5), ("pipe", "other", 0)]
    read = await kit.ask(pf.FileReadRequest(request_id="r", path="documents/notes.txt", offset=1, length=2))
    assert (read.data, read.size, read.eof) == (b"el", 5, False)  # type: ignore[attr-defined]
    for path in ("notes-link", "os-link/token", ".os/token", "documents/pipe", "../workspace/.os/token"):
        assert (await kit.refused(pf.FileReadRequest(request_id="r", path=path))).code == "bad_path", path
    assert (await kit.refused(pf.FilesListRequest(request_id="l", path="os-link"))).code == "bad_path"
    assert (await kit.refused(pf.FileReadRequest(request_id="r", path="documents/nope"))).code == "not_found"


async def test_a_name_that_is_not_utf8_is_listed_escaped_and_never_fails_the_folder(kit: Kit) -> None:
    docs = os.fsencode(kit.layout.root / "documents")
    (Path(os.fsdecode(docs)) / "fine.txt").write_text("ok")
    with open(docs + b"/caf\xe9-\xff.txt", "wb") as f:
        f.write(b"abc")
    listing = await kit.ask(pf.FilesListRequest(request_id="l", path="documents"))
    decoded = msgspec.json.decode(p.encode(listing))  # what the gateway sends
    assert [(e["name"], e["size"], e["openable"]) for e in decoded["entries"]] == [
        ("caf\ufffd-\ufffd.txt", 3, False), ("fine.txt", 2, True)]


async def test_a_folder_past_the_listing_limit_is_listed_in_order_a_page_at_a_time(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder with more entries than one listing holds: each listing is the next of the whole folder
    in its order (folders first, then by name), so every entry can be reached. The first used to be
    whichever the disk gave first, sorted, and the rest could never be listed nor downloaded."""
    monkeypatch.setattr(user_files, "MAX_ENTRIES", 4)
    many = kit.layout.root / "many"
    many.mkdir()
    names = [f"file-{n:02}.txt" for n in range(10)]
    for name in reversed(names):  # created last first: the disk's order is not the listing's
        (many / name).write_text("x")
    (many / "zz-folder").mkdir()
    pages = []
    for offset in (0, 4, 8, 11):
        listing = await kit.ask(pf.FilesListRequest(request_id="l", path="many", offset=offset))
        pages.append(([e.name for e in listing.entries], listing.total))  # type: ignore[attr-defined]
    assert pages == [(["zz-folder", *names[:3]], 11), (names[3:7], 11), (names[7:], 11), ([], 11)]


async def test_a_page_asked_after_an_entry_goes_on_from_it_whatever_changed_above(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next page asked `after` the last entry listed (a folder's, or a file's) begins just after it,
    that entry gone or not, entries removed or added above it meanwhile; `rest` counts those after the
    page. An offset, counted against a folder that changed, skipped or repeated them."""
    monkeypatch.setattr(user_files, "MAX_ENTRIES", 2)
    many = kit.layout.root / "many"
    many.mkdir()
    for name in ("b", "a"):
        (many / name).mkdir()
    for name in ("B.txt", "a.txt", "c.txt"):
        (many / name).write_text("x")

    async def page(after: str | None, folder: bool = False) -> tuple[list[str], int, int]:
        listing = await kit.ask(pf.FilesListRequest(request_id="l", path="many", after=after, after_folder=folder))
        return [e.name for e in listing.entries], listing.total, listing.rest  # type: ignore[attr-defined]

    assert await page(None) == (["a", "b"], 5, 3)
    assert await page("b", folder=True) == (["a.txt", "B.txt"], 5, 1)
    (many / "a.txt").unlink()  # removed above the cursor, and the cursor itself
    (many / "a").rmdir()
    assert await page("a.txt") == (["B.txt", "c.txt"], 3, 0)
    assert await page("B.txt") == (["c.txt"], 3, 0)
    assert await page("zz") == ([], 3, 0)


async def test_an_upload_lands_in_documents_under_a_free_name_and_everyone_is_told(kit: Kit) -> None:
    data = os.urandom(3 * 1024 * 1024 + 17)  # several chunks
    assert await kit.upload("Scan 2026.pdf", data, chunk=1024 * 1024) == "documents/Scan 2026.pdf"
    assert (kit.layout.root / "documents" / "Scan 2026.pdf").read_bytes() == data
    assert await kit.upload("Scan 2026.pdf", b"again") == "documents/Scan 2026 (2).pdf"  # never replaced
    assert await kit.upload("../../.os/token", b"not the token") == "documents/token"
    assert (kit.layout.os_dir / "token").read_text() == "secret-token"
    assert [f.path for f in kit.published] == [  # type: ignore[attr-defined]
        "documents/Scan 2026.pdf", "documents/Scan 2026 (2).pdf", "documents/token"]
    assert kit.notes[0] == "The person uploaded documents/Scan 2026.pdf (3.0 MB) through the console."
    assert list((kit.layout.state_dir / "uploads").iterdir()) == []  # nothing left half-way
    mode = stat.S_IMODE((kit.layout.root / "documents" / "token").stat().st_mode)
    assert mode == 0o664


async def test_a_documents_folder_swapped_for_a_link_takes_no_upload(kit: Kit) -> None:
    docs = kit.layout.root / "documents"
    start = await kit.ask(pf.UploadStartRequest(request_id="s", name="x.txt", size=3))
    await kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=start.upload_id, offset=0, data=b"abc"))  # type: ignore[attr-defined]
    docs.rmdir()
    docs.symlink_to(kit.layout.memory_dir)  # the agent plants a link to .os/memory mid-upload
    failed = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=start.upload_id))  # type: ignore[attr-defined]
    assert failed.code == "bad_path"
    assert not (kit.layout.memory_dir / "x.txt").exists() and list((kit.layout.state_dir / "uploads").iterdir()) == []
    docs.unlink()  # and a documents/ the agent removed comes back as a folder
    assert await kit.upload("x.txt", b"abc") == "documents/x.txt" and docs.is_dir() and not docs.is_symlink()


async def test_a_planted_file_name_is_not_written_through(kit: Kit) -> None:
    target = kit.layout.os_dir / "token"
    (kit.layout.root / "documents" / "report.txt").symlink_to(target)  # a link where the upload would land
    assert await kit.upload("report.txt", b"mine") == "documents/report (2).txt"
    assert target.read_text() == "secret-token"


async def test_the_size_limit_order_of_chunks_and_a_changed_file_are_clear_errors(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf, "MAX_TRANSFER_BYTES", 1000)
    big = await kit.refused(pf.UploadStartRequest(request_id="s", name="big.bin", size=1001))
    assert big.code == "too_large" and big.message == "1,001 bytes is over the upload limit of 1,000 bytes; nothing was uploaded"
    start = await kit.ask(pf.UploadStartRequest(request_id="s", name="a.bin", size=10))
    uid = start.upload_id  # type: ignore[attr-defined]
    late = await kit.refused(pf.UploadChunkRequest(request_id="c", upload_id=uid, offset=5, data=b"x"))
    assert late.code == "upload_failed" and "in order" in late.message
    await kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=uid, offset=0, data=b"0123456789"))
    changed = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=uid, sha256="0" * 64))
    assert changed.code == "upload_failed" and "sha256" in changed.message
    gone = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=uid))
    assert gone.code == "not_found"
    short = await kit.ask(pf.UploadStartRequest(request_id="s", name="b.bin", size=10))
    early = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=short.upload_id))  # type: ignore[attr-defined]
    assert early.code == "upload_failed" and "0 of 10 bytes" in early.message
    over = await kit.refused(pf.UploadChunkRequest(request_id="c", upload_id=short.upload_id, offset=0,  # type: ignore[attr-defined]
                                                   data=b"x" * 11))
    assert over.code == "too_large"
    assert kit.published == [] and not any((kit.layout.root / "documents").iterdir())


async def test_a_chunk_sent_again_after_its_answer_was_lost_is_written_once(kit: Kit) -> None:
    data = b"first half|second half"
    start = await kit.ask(pf.UploadStartRequest(request_id="s", name="twice.txt", size=len(data)))
    uid = start.upload_id  # type: ignore[attr-defined]
    first = pf.UploadChunkRequest(request_id="c1", upload_id=uid, offset=0, data=data[:11])
    assert (await kit.ask(first)).received == 11  # type: ignore[attr-defined]
    again = await kit.ask(pf.UploadChunkRequest(request_id="c2", upload_id=uid, offset=0, data=data[:11]))
    assert again.received == 11  # type: ignore[attr-defined]  # answered, not written a second time
    # Only the same offset *and* length is a repeat: a chunk of another length there is out of order.
    other = await kit.refused(pf.UploadChunkRequest(request_id="c2", upload_id=uid, offset=0, data=data[:5]))
    assert other.code == "upload_failed" and "in order" in other.message
    await kit.ask(pf.UploadChunkRequest(request_id="c3", upload_id=uid, offset=11, data=data[11:]))
    older = await kit.refused(pf.UploadChunkRequest(request_id="c4", upload_id=uid, offset=0, data=data[:11]))
    assert older.code == "upload_failed" and "in order" in older.message  # only the last one is repeatable
    done = await kit.ask(pf.UploadFinishRequest(request_id="f", upload_id=uid, sha256=hashlib.sha256(data).hexdigest()))
    assert (kit.layout.root / done.path).read_bytes() == data  # type: ignore[attr-defined]


async def test_idle_and_cancelled_uploads_and_those_a_stopped_server_left_are_dropped(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    incoming = kit.layout.state_dir / "uploads"
    incoming.mkdir(exist_ok=True)
    (incoming / "left-by-a-kill.part").write_bytes(b"half")
    await kit.api.start()
    assert list(incoming.iterdir()) == []
    first = await kit.ask(pf.UploadStartRequest(request_id="s", name="a", size=1))
    second = await kit.ask(pf.UploadStartRequest(request_id="s", name="b", size=1))
    await kit.ask(pf.UploadCancelRequest(request_id="x", upload_id=second.upload_id))  # type: ignore[attr-defined]
    monkeypatch.setattr(files_api, "UPLOAD_IDLE", -1.0)
    await kit.ask(pf.UploadStartRequest(request_id="s", name="c", size=1))  # sweeps the idle one
    assert (await kit.refused(pf.UploadChunkRequest(request_id="c", upload_id=first.upload_id,  # type: ignore[attr-defined]
                                                    offset=0, data=b"x"))).code == "not_found"
    assert len(list(incoming.iterdir())) == 1


async def test_an_idle_upload_is_dropped_by_the_sweep_with_no_other_upload_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page that went away mid-upload sends nothing more: its part file and descriptor go within
    UPLOAD_IDLE and a sweep, not only when another upload starts (which may be never)."""
    layout = Layout(tmp_path / "workspace")
    layout.ensure()
    api = FilesConsole(layout, lambda _frame: None, lambda _note: None, sweep_every=0.01)
    await api.start()
    try:
        incoming = layout.state_dir / "uploads"
        start = await api.handlers[pf.UploadStartRequest](pf.UploadStartRequest(request_id="s", name="a", size=4))
        uid = start.upload_id  # type: ignore[attr-defined]
        await api.handlers[pf.UploadChunkRequest](pf.UploadChunkRequest(request_id="c", upload_id=uid, offset=0,
                                                                          data=b"ha"))
        assert len(list(incoming.iterdir())) == 1
        monkeypatch.setattr(files_api, "UPLOAD_IDLE", -1.0)
        await wait_for(lambda: not list(incoming.iterdir()), timeout=10)
        with pytest.raises(RequestFailed) as gone:
            await api.handlers[pf.UploadChunkRequest](pf.UploadChunkRequest(request_id="c", upload_id=uid,
                                                                              offset=2, data=b"lf"))
        assert gone.value.code == "not_found"
    finally:
        await api.stop()


async def test_a_cancel_waits_for_the_chunk_being_written_so_no_other_file_gets_its_bytes(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """Closed under a write still in its thread, the upload's descriptor number could be reused by
    the next file opened, and the chunk written into that one."""
    writing, go_on = threading.Event(), threading.Event()
    real_pwrite = os.pwrite

    def held_pwrite(fd: int, data: bytes, offset: int) -> int:
        writing.set()
        go_on.wait(30)
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", held_pwrite)
    start = await kit.ask(pf.UploadStartRequest(request_id="s", name="a.bin", size=5))
    uid = start.upload_id  # type: ignore[attr-defined]
    chunk = asyncio.create_task(kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=uid, offset=0, data=b"bytes")))
    await asyncio.to_thread(writing.wait, 30)
    cancel = asyncio.create_task(kit.ask(pf.UploadCancelRequest(request_id="x", upload_id=uid)))
    await asyncio.sleep(0)  # the cancel runs up to where it waits
    victim = kit.layout.root / "victim.txt"
    fd = os.open(victim, os.O_WRONLY | os.O_CREAT, 0o600)  # the lowest free number: the upload's, if it was closed
    try:
        go_on.set()
        assert (await chunk).received == 5  # type: ignore[attr-defined]
        await cancel
    finally:
        os.close(fd)
    assert victim.read_bytes() == b""
    assert (await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=uid))).code == "not_found"
    assert list((kit.layout.state_dir / "uploads").iterdir()) == []


async def test_uploads_under_way_keep_the_room_they_announced(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each upload checks the free space counting what the others will still write, or four
    started at once could each see room for itself and fill the disk together."""
    written: list[int] = [0]
    monkeypatch.setattr(files_api, "free_bytes", lambda _path: files_api.DISK_RESERVE + 100 - written[0])
    first = await kit.ask(pf.UploadStartRequest(request_id="s", name="a", size=60))
    refused = await kit.refused(pf.UploadStartRequest(request_id="s", name="b", size=60))
    assert refused.code == "too_large" and "uploads under way counted" in refused.message
    await kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=first.upload_id, offset=0,  # type: ignore[attr-defined]
                                        data=b"x" * 30))
    written[0] = 30  # on the disk now: the first still needs 30 of what is left
    await kit.ask(pf.UploadStartRequest(request_id="s", name="b", size=40))
    assert (await kit.refused(pf.UploadStartRequest(request_id="s", name="c", size=1))).code == "too_large"


def test_free_space_is_one_measure_for_uploads_memory_status_and_the_stop_account(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload's room, `memory status`'s disk line and `service stop`'s account read the free space
    through fsutil.free_bytes: the blocks a process that is not root may use (root's reserve not
    counted), each caller with its own answer to a disk it can't read."""
    real = os.statvfs

    def statvfs(path: os.PathLike[str] | str) -> os.statvfs_result:
        st = real(path)
        return os.statvfs_result((st.f_bsize, 4096, st.f_blocks, 9, 7, *st[5:]))  # 9 free, 7 not root's

    monkeypatch.setattr(os, "statvfs", statvfs)
    assert fsutil.free_bytes(tmp_path) == 7 * 4096
    assert files_api.free_bytes is fsutil.free_bytes
    assert disk(tmp_path) == {"free_bytes": 7 * 4096, "low": True}
    with pytest.raises(FileNotFoundError):
        fsutil.free_bytes(tmp_path / "gone")
    assert disk(tmp_path / "gone")["error"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root (CI runs as root)")
async def test_as_root_an_upload_belongs_to_whoever_owns_documents(kit: Kit) -> None:
    docs = kit.layout.root / "documents"
    os.chown(docs, 54321, 54322)  # the agent's user, in user isolation
    await kit.upload("mine.txt", b"x")
    st = (docs / "mine.txt").stat()
    assert (st.st_uid, st.st_gid) == (54321, 54322)


def unix_socket(root: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A Unix socket in documents/ (bound from there: a socket's path has a short length limit)."""
    monkeypatch.chdir(root / "documents")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("a.sock")
    return "a.sock"


async def test_the_protocol_refuses_the_same_through_the_real_socket(tmp_path: Path) -> None:
    from tests.conftest import client_factory

    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    async with running(settings) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="file_read", request_id="r1", path=".os/token")
        await c.send(type="files_list", request_id="r2", path="../")
        await c.send(type="upload_start", request_id="r3", name="..", size=1)
        errors = [await c.until("error") for _ in range(3)]
        assert [(e["request_id"], e["code"]) for e in errors] == [("r1", "bad_path"), ("r2", "bad_path"),
                                                                  ("r3", "bad_path")]
        await c.send(type="files_list", request_id="r4")
        listing = await c.until("files_list_result")
        assert ".os" not in [e["name"] for e in listing["entries"]] and "documents" in [e["name"] for e in listing["entries"]]


async def test_numbers_past_64_bits_and_a_socket_are_clear_errors_not_internal_ones(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import client_factory

    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    async with running(settings) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        (app.settings.layout.root / "documents" / "a.txt").write_text("abc")
        name = unix_socket(app.settings.layout.root, monkeypatch)
        for n, frame in enumerate([
                {"type": "file_read", "path": "documents/a.txt", "offset": 2**63},
                {"type": "session_turns", "before": 2**63},
                {"type": "forget_turns", "observation_ids": [2**63]},
                {"type": "upload_start", "name": "a", "size": 2**63},
                {"type": "memory_version", "name": "user.md", "number": 2**63}]):
            await c.send(request_id=f"big{n}", **frame)
            error = await c.until("error")
            assert (error["request_id"], error["code"]) == (f"big{n}", "invalid_frame"), error
        await c.send(type="file_read", request_id="near", path="documents/a.txt", offset=2**63 - 1)
        assert (await c.until("file_read_result"))["data"] == ""  # past the end: nothing, as at any offset
        await c.send(type="file_read", request_id="sock", path=f"documents/{name}")
        error = await c.until("error")
        assert (error["request_id"], error["code"]) == ("sock", "bad_path") and "a socket" in error["message"]





FILES_REPLIES: list[object] = [  # test_protocol round-trips each
    pf.FilesListResult(request_id="r", path="documents", total=1,
                       entries=[pf.FileEntry(name="a.pdf", kind="file", size=3, modified=1.0)]),
    pf.FileReadResult(request_id="r", path="documents/a.pdf", offset=0, size=3, data=b"\x00\xffa", eof=True),
    pf.UploadStartResult(request_id="r", upload_id="u", chunk_bytes=pf.CHUNK_BYTES, max_bytes=pf.MAX_TRANSFER_BYTES),
    pf.UploadChunkResult(request_id="r", upload_id="u", received=3),
    pf.UploadFinishResult(request_id="r", path="documents/a.pdf", size=3),
    pf.UploadCancelResult(request_id="r", upload_id="u"),
    pf.DownloadStartResult(request_id="r", download_id="d", name="a.pdf", size=3, chunk_bytes=pf.CHUNK_BYTES),
    pf.DownloadChunkResult(request_id="r", download_id="d", offset=0, data=b"\x00\xffa", eof=True),
    pf.DownloadCancelResult(request_id="r", download_id="d"),
    p.FileUploaded(path="documents/a.pdf", size=3),
]


async def test_across_file_systems_an_upload_is_copied_in_and_still_never_replaces(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    cross_mount(monkeypatch)
    (kit.layout.root / "documents" / "scan.pdf").write_bytes(b"older")
    assert await kit.upload("scan.pdf", b"newer" * 1000) == "documents/scan (2).pdf"
    assert (kit.layout.root / "documents" / "scan.pdf").read_bytes() == b"older"
    assert (kit.layout.root / "documents" / "scan (2).pdf").read_bytes() == b"newer" * 1000
    assert list((kit.layout.state_dir / "uploads").iterdir()) == []
    assert sorted(p.name for p in (kit.layout.root / "documents").iterdir()) == ["scan (2).pdf", "scan.pdf"]


def cross_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    """documents/ on another file system than .os/state/uploads: a link from one to the other is EXDEV
    (a link within documents/ works)."""
    import errno

    from sprite_os.console import user_files

    real = os.link

    def link(src: str, dst: str, *, src_dir_fd: int, dst_dir_fd: int, follow_symlinks: bool = True) -> None:
        if os.path.samestat(os.fstat(src_dir_fd), os.fstat(dst_dir_fd)):
            return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks)
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(user_files.os, "link", link)


async def test_an_upload_copied_across_mounts_that_fails_mid_copy_leaves_nothing_under_its_name(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy was made in place under the person's name: a full disk (or a kill) mid-copy left a
    truncated file there, and the answer said "nothing was kept"."""
    import errno

    from sprite_os.console import user_files

    cross_mount(monkeypatch)
    real = os.sendfile

    def full_disk(out: int, src: int, offset: int, count: int) -> int:
        if offset:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(out, src, offset, min(count, 1000))

    monkeypatch.setattr(user_files.os, "sendfile", full_disk)
    error = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=await started(kit, b"x" * 5000),
                                                     sha256=None))
    assert error.code == "upload_failed" and "nothing was kept" in error.message
    assert list((kit.layout.root / "documents").iterdir()) == []  # no partial file, no temp
    assert list((kit.layout.state_dir / "uploads").iterdir()) == []
    assert kit.published == []


async def test_a_copy_a_kill_left_in_documents_is_swept_at_start(kit: Kit) -> None:
    docs = kit.layout.root / "documents"
    (docs / ".sprite-upload-0123456789abcdef.tmp").write_bytes(b"half")
    (docs / ".sprite-upload-notes.tmp").write_bytes(b"the person's")  # not a name the copy makes
    await kit.api.start()
    assert sorted(p.name for p in docs.iterdir()) == [".sprite-upload-notes.tmp"]


async def test_a_folder_or_link_with_a_copys_name_is_left_and_the_start_goes_on(kit: Kit) -> None:
    """The agent (who owns documents/) or the person made a folder, or a link, of a copy's name: the start
    neither fails on it (every start did, a folder's unlink raising) nor removes what is not its own."""
    docs = kit.layout.root / "documents"
    (docs / ".sprite-upload-00000000000000aa.tmp").mkdir()
    (docs / ".sprite-upload-00000000000000bb.tmp").symlink_to(docs / "kept.txt")
    (docs / "kept.txt").write_bytes(b"the person's")
    (docs / ".sprite-upload-00000000000000cc.tmp").write_bytes(b"half")
    await kit.api.start()
    assert sorted(p.name for p in docs.iterdir()) == [
        ".sprite-upload-00000000000000aa.tmp", ".sprite-upload-00000000000000bb.tmp", "kept.txt"]


async def test_an_upload_placed_before_a_later_step_failed_is_not_said_to_be_lost(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """documents/' fsync failed after the link: the answer said "nothing was kept" for a file that was
    there, and the person uploading again made "name (2)"; then it said so in words only, as
    `upload_failed`, a code a client takes for "send it again". It is `not_durable`: done."""
    from devkit.faults import FsyncSpy

    spy = FsyncSpy()
    monkeypatch.setattr(os, "fsync", spy)
    spy.failing.add(kit.layout.root / "documents")
    error = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=await started(kit, b"whole"),
                                                     sha256=None))
    assert error.code == "not_durable" and "nothing was kept" not in error.message
    assert "the upload is in documents/a.txt" in error.message
    assert (kit.layout.root / "documents" / "a.txt").read_bytes() == b"whole"
    assert [f.path for f in kit.published] == ["documents/a.txt"]  # type: ignore[attr-defined]


async def test_a_documents_folder_whose_name_cannot_be_synced_is_not_left_behind(
        kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    """An upload makes documents/ when it is missing; the workspace's fsync after the mkdir failed, and the
    folder stayed, its name not durable, while every other folder Sprite OS makes is removed then (one rule:
    deploy_contract.make_dir)."""
    from devkit.faults import FsyncSpy

    documents = kit.layout.root / "documents"
    documents.rmdir()
    upload_id = await started(kit, b"whole")
    spy = FsyncSpy()
    monkeypatch.setattr(os, "fsync", spy)
    spy.failing.add(kit.layout.root)
    error = await kit.refused(pf.UploadFinishRequest(request_id="f", upload_id=upload_id, sha256=None))
    assert error.code == "upload_failed" and "nothing was kept" in error.message
    assert not documents.exists()


async def started(kit: Kit, data: bytes) -> str:
    """An upload of `data` as a.txt, every byte sent: its id."""
    start = await kit.ask(pf.UploadStartRequest(request_id="s", name="a.txt", size=len(data)))
    upload_id: str = start.upload_id  # type: ignore[attr-defined]
    await kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=upload_id, offset=0, data=data))
    return upload_id


async def test_an_upload_is_its_connections_as_a_download_is(kit: Kit) -> None:
    # Another connection is answered busy until the owner's has ended; then the first to ask takes it over.
    from tests.test_console_downloads import on
    started = await on("a", kit.ask(pf.UploadStartRequest(request_id="u", name="x.txt", size=3)))
    assert isinstance(started, pf.UploadStartResult)
    for other in (pf.UploadCancelRequest(request_id="x", upload_id=started.upload_id),
                  pf.UploadChunkRequest(request_id="x", upload_id=started.upload_id, offset=0, data=b"abc"),
                  pf.UploadFinishRequest(request_id="x", upload_id=started.upload_id)):
        refused = await on("b", kit.refused(other))
        assert refused.code == "busy" and "upload is another connection's" in refused.message
    await on("a", kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=started.upload_id, offset=0, data=b"ab")))
    kit.api.left("a")
    await on("b", kit.ask(pf.UploadChunkRequest(request_id="c", upload_id=started.upload_id, offset=2, data=b"c")))
    refused = await on("a", kit.refused(pf.UploadCancelRequest(request_id="x", upload_id=started.upload_id)))
    assert refused.code == "busy"  # b's now
    done = await on("b", kit.ask(pf.UploadFinishRequest(request_id="f", upload_id=started.upload_id)))
    assert isinstance(done, pf.UploadFinishResult)
