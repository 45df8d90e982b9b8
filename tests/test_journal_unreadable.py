"""A turn journal a start cannot read is set aside, never written over: it may hold the only copy of
turns the person was told were done (closed while transcript.db was busy, then a kill)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import AssistantMessage, ResultMessage, TextBlock

from devkit.harness import loop_ticks
from sprite_os.commands.main import main as cli
from sprite_os.db_worker import Worker
from sprite_os.memory import import_inbox
from sprite_os.memory.capture.health import JOURNAL_NAME, advice, set_aside_journals
from sprite_os.memory.capture.journal import journal_path, recover
from sprite_os.memory.capture.pipeline import Capture
from sprite_os.memory.capture.spill import read_status
from sprite_os.memory.system import MemorySystem, list_set_aside
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.paths import Layout
from tests.test_recall import lexical

# A whole line that does not decode: a damaged file, not an append a kill tore.
DAMAGED = b'[{"observation":{"session_id":"s1","sequence_num":7,"user_message":"the acknowledged turn"\x00\x00\n'


class Started:
    def __init__(self, root: Path) -> None:
        self.layout = Layout(root)
        self.layout.ensure()
        self.db: Worker[TranscriptDB] = Worker("t", lambda: TranscriptDB(self.layout.transcript_db))
        self.capture = Capture(self.db, self.layout, on_recorded=lambda: None)

    async def start(self) -> None:
        await self.capture.start(1.0)
        self.capture.recorder.start_session("s1")

    async def close_a_turn(self) -> None:
        """A turn closed and its journal save handed out: the journal is written now, if it may be."""
        record = self.capture.recorder.open("a turn after the start")
        record.observe(AssistantMessage(content=[TextBlock(text="the answer")], model="m"))
        record.close(ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=1,
                                   session_id="x", result="the answer"))
        await record.durable(budget=5)
        await self.capture.writer.drained(5)
        await asyncio.sleep(0.2)  # the journal's saves after it (DELAY): they write the file, if anything may
        await self.capture.journal.saved()

    def set_aside(self) -> list[Path]:
        return set_aside_journals(self.layout.state_dir)

    def status(self) -> dict[str, Any]:
        """Capture's status with the folder listed now by the product's own listing, MemorySystem.status's
        (which it runs on a thread)."""
        return self.capture.status(list_set_aside(self.layout).journals)


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[Started]:
    s = Started(tmp_path)
    yield s
    await s.capture.stop(5)
    await s.db.close()


async def test_a_journal_no_line_of_which_decodes_is_set_aside_and_its_bytes_survive_a_start(
        started: Started, capsys: pytest.CaptureFixture[str]) -> None:
    """It used to be logged, read as empty, and truncated by the start's first save."""
    journal_path(started.layout).write_bytes(DAMAGED)
    await started.start()
    await started.close_a_turn()
    [aside] = started.set_aside()
    assert aside.read_bytes() == DAMAGED
    status = started.status()
    assert status["degraded"] and status["journals_set_aside"] == [aside.name] and not status["journal_stuck"]
    on_disk = read_status(started.layout)  # what `memory status` shows, from another process
    assert on_disk["degraded"] and on_disk["journals_set_aside"] == [aside.name]
    capsys.readouterr()
    assert cli(["--workspace", str(started.layout.root), "memory", "status"]) == 0
    said = capsys.readouterr().out
    assert aside.name.startswith(f"{JOURNAL_NAME}.damaged-")  # its name says why: a start would read the same bytes
    assert f"turn journal     DAMAGED: a start could not read it and set it aside as .os/state/{aside.name}" in said
    assert "do not rename it back" in said and f"tail -n 1 .os/state/{aside.name}" in said and "mv " not in said
    assert "writes waiting in the spill file" not in said


async def test_a_journal_the_disk_fails_to_read_is_set_aside_not_written_over(
        started: Started, monkeypatch: pytest.MonkeyPatch) -> None:
    """A transient EIO at the start's read: the journal was taken for empty and emptied."""
    whole = b'[{"observation":{"not":"checked"},"ended":true}]\n'
    journal = journal_path(started.layout)
    journal.write_bytes(whole)
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self == journal:
            raise OSError(errno.EIO, "Input/output error")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    await started.start()
    monkeypatch.undo()
    await started.close_a_turn()
    [aside] = started.set_aside()
    assert aside.read_bytes() == whole and aside.name.startswith(f"{JOURNAL_NAME}.io-error-")


def test_the_replay_advice_never_writes_over_a_live_journal(tmp_path: Path) -> None:
    """The advice was "rename it back": a plain `mv` over a journal a crash left since destroys its turns."""
    state = tmp_path / ".os" / "state"
    state.mkdir(parents=True)
    aside, live = state / f"{JOURNAL_NAME}.io-error-20261127T090000", state / JOURNAL_NAME
    aside.write_bytes(b"the set-aside journal\n")
    live.write_bytes(b"a live journal, its turns not recorded yet\n")
    said = advice(aside.name)
    assert f".os/state/{JOURNAL_NAME} is there, start the server and stop it once first" in said
    [command] = [part for part in said.split("`")[1::2] if part.startswith("mv ")]
    subprocess.run(command, shell=True, cwd=tmp_path, check=False)
    assert live.read_bytes() == b"a live journal, its turns not recorded yet\n" and aside.exists()
    live.unlink()  # the start and stop that recorded it
    subprocess.run(command, shell=True, cwd=tmp_path, check=True)
    assert live.read_bytes() == b"the set-aside journal\n" and not aside.exists()


async def test_a_journal_that_can_be_neither_read_nor_set_aside_is_never_written_over(
        started: Started, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = journal_path(started.layout)
    journal.write_bytes(DAMAGED)
    real = os.rename

    def rename(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        if Path(src) == journal:
            raise OSError(errno.EIO, "Input/output error")
        real(src, dst, *a, **k)

    monkeypatch.setattr(os, "rename", rename)
    await started.start()
    await started.close_a_turn()
    assert journal.read_bytes() == DAMAGED and started.set_aside() == []
    status = started.status()
    assert status["degraded"] and status["journal_stuck"]
    await started.capture.stop(5)  # its flush removes no journal either
    assert journal.read_bytes() == DAMAGED
    started.capture = Capture(started.db, started.layout, on_recorded=lambda: None)  # for the fixture's stop


async def test_a_tail_a_kill_tore_is_no_reason_to_set_a_journal_aside(started: Started) -> None:
    """A kill mid-append, right after the file was emptied, leaves one line with no newline: that save's
    turns were never acknowledged (its sync never returned), so nothing is lost and capture is not degraded."""
    journal_path(started.layout).write_bytes(DAMAGED.rstrip(b"\n"))
    assert recover(journal_path(started.layout)) == []
    await started.start()
    assert started.set_aside() == [] and not started.status()["degraded"]


async def test_healthz_and_memory_status_see_a_set_aside_journal_as_it_is_now(started: Started) -> None:
    """/healthz listed the files the start found, for the whole run: one the operator removed kept it degraded
    until a restart, while `memory status` (which looks at the folder) already said fine."""
    journal_path(started.layout).write_bytes(DAMAGED)
    await started.start()
    [aside] = started.set_aside()
    assert started.status()["journals_set_aside"] == read_status(started.layout)["journals_set_aside"] \
        == [aside.name]
    aside.unlink()  # the operator dealt with it, the server running
    status, on_disk = started.status(), read_status(started.layout)
    assert status["journals_set_aside"] == on_disk["journals_set_aside"] == []
    assert not status["degraded"] and not on_disk["degraded"]
    later = started.layout.state_dir / aside.name.replace("2", "1", 1)  # one another start set aside, say
    later.write_bytes(DAMAGED)
    assert started.status()["journals_set_aside"] == [later.name] and started.status()["degraded"]
    later.unlink()


@contextlib.contextmanager
def _listing_hangs(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The disk under .os/state hangs for the block: listing the two folders waits (up to 3 s)."""
    hang = threading.Event()
    watched = {str(layout.state_dir), str(import_inbox.inbox_dir(layout))}

    def hanging(real: Callable[..., Any]) -> Callable[..., Any]:
        def listing(path: Any = ".") -> Any:
            if str(path) in watched:
                hang.wait(3)
            return real(path)
        return listing

    with monkeypatch.context() as m:
        m.setattr(os, "scandir", hanging(os.scandir))
        m.setattr(os, "listdir", hanging(os.listdir))
        try:
            yield
        finally:
            hang.set()


async def test_healthz_knows_what_is_set_aside_from_the_start_and_what_the_inbox_set_aside_since(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The last listing began empty and the start never listed: on a disk slow enough that /healthz's first
    listing took more than HEALTH_WAIT, it said `ok` after a start that had set a file aside. And a file the
    inbox set aside while a listing hung was known to nothing (its own failure cleared at the next pass)."""
    settings = lexical(tmp_path)
    layout = settings.layout
    layout.ensure()
    inbox = import_inbox.inbox_dir(layout)
    inbox.mkdir(parents=True, exist_ok=True)
    before = inbox / (import_inbox.inbox_name(1, 1) + import_inbox.SET_ASIDE_ENDING)
    before.write_text("")
    system = MemorySystem(settings)
    await system.start()
    try:
        with _listing_hangs(layout, monkeypatch):
            health = await system.health()
            assert health["recall"]["import"]["set_aside"] == [before.name] and health["degraded"]
            assert health["set_aside_listed_at"] is not None and health["set_aside_listing_error"] is None
            now = inbox / (import_inbox.inbox_name(1, 2) + import_inbox.SUFFIX)
            now.write_text("")
            retries = system.imports._retries.setdefault(now.name, import_inbox._Retries())  # its attempts failed
            assert await system.imports._set_aside(now, retries)
            health = await system.health()
            assert health["recall"]["import"]["set_aside"] == sorted([before.name, now.name + import_inbox.SET_ASIDE_SUFFIX])
        before.unlink()  # the operator dealt with both
        (inbox / (now.name + import_inbox.SET_ASIDE_SUFFIX)).unlink()
        for _ in range(300):
            if (health := await system.health())["recall"]["import"] is None:
                break
            await asyncio.sleep(0.01)
        assert health["recall"]["import"] is None and not health["degraded"]  # a listing begun since is believed
    finally:
        await system.stop()


@contextlib.asynccontextmanager
async def _healthy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[MemorySystem]:
    """A started memory whose /healthz says ok, then with its bounds made short (a listing under way 0.5 s is
    hung; /healthz waits 0.1 s for one); stopped after."""
    from sprite_os.memory import system as system_module

    system = MemorySystem(lexical(tmp_path))
    await system.start()
    try:
        assert not (await system.health())["degraded"]
        monkeypatch.setattr(system_module, "SET_ASIDE_STALE", 0.5)
        monkeypatch.setattr(system_module, "HEALTH_CACHE_SECONDS", 0.0)
        monkeypatch.setattr(system_module, "HEALTH_WAIT", 0.1)
        yield system
    finally:
        monkeypatch.undo()
        await system.stop()


async def test_a_slow_listing_after_a_long_quiet_is_not_taken_for_a_hung_disk(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz polled seldom (once a minute) on a loaded machine: its listing took more than HEALTH_WAIT, the one
    shown was the last poll's, a minute old, and memory said degraded though nothing hung. Only a listing under
    way for longer than SET_ASIDE_STALE is a hung disk."""
    async with _healthy(tmp_path, monkeypatch) as system:
        await asyncio.sleep(0.6)  # the last listing is now older than the bound: no one asked meanwhile
        with _listing_hangs(system.settings.layout, monkeypatch):  # this one is slow: past HEALTH_WAIT
            health = await system.health()
            assert time.time() - health["set_aside_listed_at"] > 0.5  # the last listing shown, older than the bound
            assert not health["degraded"], "a listing under way for a tenth of a second is no hung disk"
            await asyncio.sleep(0.6)
            assert (await system.health())["degraded"], "under way for longer than the bound: a hung disk"


async def test_a_hung_listing_is_said_after_the_bound_though_the_clock_is_set_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """How long a listing has been under way is read on a clock no one sets: the wall clock set back an hour (a
    time sync) while the disk hung kept /healthz saying ok for that hour."""
    async with _healthy(tmp_path, monkeypatch) as system:
        with _listing_hangs(system.settings.layout, monkeypatch):
            assert not (await system.health())["degraded"]  # the listing is under way
            real = time.time
            monkeypatch.setattr(time, "time", lambda: real() - 3600)  # the clock set back
            await asyncio.sleep(0.6)
            assert (await system.health())["degraded"], "under way for longer than the bound: a hung disk"


async def test_healthz_is_degraded_while_what_is_set_aside_is_not_known(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing that failed, or hung, kept the last one shown forever, and nothing said how old it was."""
    from sprite_os.memory import system as system_module

    settings = lexical(tmp_path)
    system = MemorySystem(settings)
    await system.start()
    try:
        health = await system.health()
        assert not health["degraded"] and time.time() - health["set_aside_listed_at"] < 10
        monkeypatch.setattr(system_module, "SET_ASIDE_STALE", 0.0)
        with _listing_hangs(settings.layout, monkeypatch):
            await asyncio.sleep(0.01)
            health = await system.health()  # the last listing, older than the bound
            assert health["degraded"] and health["set_aside_listing_error"] is None
        monkeypatch.undo()

        def unreadable(*_: Any) -> Any:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(system_module, "list_set_aside", unreadable)
        for _ in range(300):  # once the hung listing is over: the next one fails
            if (health := await system.health())["set_aside_listing_error"] is not None:
                break
            await asyncio.sleep(0.01)
        assert health["degraded"] and "Input/output error" in health["set_aside_listing_error"]
        monkeypatch.undo()
        # A healthy disk: this call waits for its listing (on a loaded machine one can take more than HEALTH_WAIT).
        monkeypatch.setattr(system_module, "HEALTH_WAIT", 60.0)
        health = await system.health()
        assert not health["degraded"] and health["set_aside_listing_error"] is None
    finally:
        await system.stop()


async def test_healthz_lists_what_is_set_aside_off_the_loop_and_as_it_is_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/healthz listed .os/state and the import inbox's folder on the event loop: a disk that hangs held
    the whole server, every client with it. They are listed on a thread now: the loop runs on while the
    listing hangs, /healthz answers within HEALTH_WAIT with the last listing, and with a healthy disk a
    journal set aside, or removed by the operator, shows at the very next call."""
    from sprite_os.memory import system as system_module

    settings = lexical(tmp_path)
    layout = settings.layout
    system = MemorySystem(settings)
    await system.start()
    try:
        with monkeypatch.context() as healthy:  # each call waits for its listing: a loaded machine's can take 0.5 s
            healthy.setattr(system_module, "HEALTH_WAIT", 60.0)
            aside = layout.state_dir / f"{JOURNAL_NAME}.damaged-20261127T090000"
            aside.write_bytes(DAMAGED)
            health = await system.health()
            assert health["capture"]["journals_set_aside"] == [aside.name] and health["degraded"]
            aside.unlink()  # the operator dealt with it
            health = await system.health()
            assert health["capture"]["journals_set_aside"] == [] and not health["degraded"]

        hang = threading.Event()
        watched = {str(layout.state_dir), str(import_inbox.inbox_dir(layout))}

        def hanging(real: Callable[..., Any]) -> Callable[..., Any]:
            def listing(path: Any = ".") -> Any:
                if str(path) in watched:
                    hang.wait(60)  # the disk under .os/state hangs (until the test lets it go)
                return real(path)
            return listing

        monkeypatch.setattr(os, "scandir", hanging(os.scandir))
        monkeypatch.setattr(os, "listdir", hanging(os.listdir))
        aside.write_bytes(DAMAGED)  # set aside meanwhile: the hung listing cannot see it yet
        try:
            async with loop_ticks() as ticks:
                started = time.monotonic()
                health = await system.health()
                took = time.monotonic() - started
        finally:
            hang.set()
            monkeypatch.undo()
        # The loop served on, and /healthz answered within its bound, not the hang's minute (well under it:
        # a loaded machine may wake this test late).
        assert took < 20 and ticks.count >= 10
        assert health["capture"]["journals_set_aside"] == []  # the last listing, until a listing comes back
        for _ in range(100):
            if (await system.health())["capture"]["journals_set_aside"] == [aside.name]:
                break
            await asyncio.sleep(0.01)
        assert (await system.health())["capture"]["journals_set_aside"] == [aside.name]
    finally:
        await system.stop()
