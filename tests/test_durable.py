"""Durable, then acknowledged: a closed turn is on disk (transcript.db, or the turn journal, whichever
first) before the runtime may say `turn_complete`; the journal's save costs one fsync; transcript
writes waiting together commit together; both databases sync every commit."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
from claude_agent_sdk import AssistantMessage, ResultMessage, TextBlock
from structlog.testing import capture_logs

from sprite_os.backoff import Backoff
from sprite_os.console.session_queries import turns_page
from sprite_os.database import connect
from sprite_os.db_worker import Worker
from sprite_os.memory.capture import health as health_mod
from sprite_os.memory.capture import journal as journal_mod
from sprite_os.memory.capture.acks import Acks
from sprite_os.memory.capture.journal import (
    STOPPED_NOTE,
    Entry,
    JournalFile,
    TurnJournal,
    journal_path,
    read_state,
    recover,
)
from sprite_os.memory.capture.pipeline import Capture
from sprite_os.memory.capture.spill import (
    CommandWrite,
    ObservationWrite,
    SessionWrite,
    SpillFile,
    read_spill,
    spill_path,
)
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.paths import Layout
from tests.conftest import wait_for


def obs(n: int, session: str = "s1", text: str | None = None) -> NewObservation:
    return NewObservation(timestamp=1_790_000_000.0 + n, session_id=session, sequence_num=n,
                          user_message=f"turn {n}", tool_calls_json="[]", agent_response=text or f"answer {n}")


def result(text: str = "the whole answer") -> ResultMessage:
    return ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=1,
                         session_id="x", result=text, usage={"input_tokens": 3, "output_tokens": 2})


# ---------------------------------------------------------------- the acks: which way came first


async def test_a_turn_is_durable_by_whichever_way_comes_first() -> None:
    acks = Acks()
    by_db, by_journal = acks.expect(("s", 1)), acks.expect(("s", 2))
    acks.durable(("s", 1))
    acks.journal_saved([("s", 2)], None)
    assert by_db.result() is True and by_journal.result() is True
    assert acks.waiting == 0


async def test_a_turn_neither_way_can_take_is_not_durable_at_once_and_one_way_alone_failing_is_not_enough() -> None:
    acks = Acks()
    first, second = acks.expect(("s", 1)), acks.expect(("s", 2))
    acks.journal_saved([("s", 1), ("s", 2)], OSError(errno.ENOSPC, "No space left on device"))
    assert not first.done()  # transcript.db may still take it
    acks.transcript_failed([("s", 1), ("s", 2)])  # refused, and the spill file could not take them
    assert first.result() is False and second.result() is False
    acks.durable(("s", 1))  # it landed later: no one waits any more, and nothing is left behind
    assert acks.waiting == 1


# ---------------------------------------------------------------- the journal's file: one fsync a save


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every fsync, fdatasync and rename, as they happen."""
    calls: list[str] = []
    for name in ("fsync", "fdatasync", "replace"):
        real = getattr(os, name)

        def spy(*args: Any, _name: str = name, _real: Any = real) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(os, name, spy)
    yield calls


def state(path: Path) -> list[tuple[int, bool]]:
    return [(e.observation.sequence_num, e.ended) for e in read_state(path) or []]


def entries(*items: tuple[int, bool]) -> bytes:
    return msgspec.json.encode([Entry(obs(n), ended) for n, ended in items])


def test_a_save_appends_one_line_with_one_fdatasync_after_the_first_rewrite(tmp_path: Path, syncs: list[str]) -> None:
    f = JournalFile(tmp_path / "turn-journal.json")
    f.save(entries((1, False)))  # the first save of a run: whole, through a temp file (a kill may have torn the tail)
    assert "replace" in syncs
    syncs.clear()
    f.save(entries((1, True)))
    f.save(entries((1, True), (2, False)))
    assert syncs == ["fdatasync", "fdatasync"]  # no rename, no second fsync
    assert state(f.path) == [(1, True), (2, False)]
    f.save(entries((2, False)), sync=False)  # the open turn alone: a kill -9 leaves the page cache
    assert syncs == ["fdatasync", "fdatasync"] and state(f.path) == [(2, False)]
    f.save(None, sync=False)  # nothing left: emptied, not synced, and kept (its name needs no new fsync)
    assert f.path.read_bytes() == b"" and syncs == ["fdatasync", "fdatasync"]
    f.save(entries((3, False)))
    assert state(f.path) == [(3, False)] and syncs[-1] == "fdatasync"


def test_the_spill_files_first_append_syncs_its_folder_too(tmp_path: Path, syncs: list[str]) -> None:
    """A new spill file's lines were fsync'd, its name was not: a power cut could lose the file."""
    spill = SpillFile(tmp_path / "capture-spill.jsonl")
    spill.append([SessionWrite("s", "start", 1.0)])
    assert syncs == ["fsync", "fsync"]  # the file, then its folder
    syncs.clear()
    spill.append([SessionWrite("s", "end", 2.0)])
    assert syncs == ["fsync"]  # its name is durable already


async def test_a_cancelled_journal_save_is_not_taken_for_a_save(tmp_path: Path) -> None:
    """A save future cancelled before it ran was reported as on disk, acknowledging its turns."""
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    busy = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as files:
        files.submit(busy.wait, 10)  # the save waits behind this
        journal = TurnJournal(tmp_path / "j.json", files, on_saved=lambda k, e: saved.append((k, e)))
        journal.closed(obs(1))
        await wait_for(lambda: journal._written is not None, what="the save handed out")
        assert journal._written is not None
        journal._written.cancel()
        await wait_for(lambda: bool(saved), what="the save's end reported")
        busy.set()
    [(keys, error)] = saved
    assert keys == [("s1", 1)] and error is not None


async def test_only_a_save_someone_waits_for_wakes_the_event_loop(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wake-up of the event loop from a thread costs a turn the GIL's hand-over. The open turn's
    saves (one or two in every turn) woke it when they ended, for nothing: no one waits on them.
    Now only a save holding a closed turn does, once (the turn's ack may wait on it), or a failed one."""
    loop = asyncio.get_running_loop()
    wakes: list[object] = []
    real = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda cb, *a, **k: (wakes.append(cb), real(cb, *a, **k))[1])
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(tmp_path / "j.json", files, delay=0.0, on_saved=lambda k, e: saved.append((k, e)))
        journal.opened(lambda: obs(1, text="so far"))
        await wait_for(lambda: journal._written is not None and journal._written.done(), what="the open turn saved")
        assert state(tmp_path / "j.json") == [(1, False)]
        assert wakes == [] and saved == []
        journal.closed(obs(1))
        await wait_for(lambda: bool(saved), what="the closed turn's save reported")
        assert saved == [([("s1", 1)], None)] and len(wakes) == 1

        def full(_data: bytes | None, sync: bool = True) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(journal._file, "save", full)  # the next save fails: that is heard of too
        journal.durable(("s1", 1))
        journal.opened(lambda: obs(2, text="so far"))
        await wait_for(lambda: len(saved) == 2, what="the failed save reported")
        assert saved[1][0] == [] and isinstance(saved[1][1], OSError) and len(wakes) == 2


class CountedSaves:
    """The journal's saves as handed to its thread: (what, synced), in order."""

    def __init__(self, journal: TurnJournal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.saves: list[tuple[list[tuple[int, bool]] | None, bool]] = []
        real = journal._file.save

        def save(data: bytes | None, sync: bool = True) -> None:
            got = None if data is None else [(e.observation.sequence_num, e.ended)
                                              for e in msgspec.json.decode(data, type=list[Entry])]
            self.saves.append((got, sync))
            real(data, sync)

        monkeypatch.setattr(journal._file, "save", save)


async def test_a_turn_that_ends_within_its_open_grace_saves_only_its_close(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A zero-latency model's turn (60-150 ms) had its open turn saved at 50 ms, on the files' thread in
    the middle of the turn, for nothing: the turn's close makes it durable. A turn that closes within
    OPEN_GRACE of its start never has its open snapshot saved. Its close is saved at once, synced,
    racing transcript.db's commit (whichever is on disk first answers the turn's wait), and the file is
    emptied once the commit lands. A longer turn is still saved as it goes."""
    with ThreadPoolExecutor(max_workers=1) as files:
        # Longer than OPEN_GRACE: a loaded machine's late wake-up can't outlast it (the turn closes 75 ms
        # after it opens; a wake-up 0.4 s late was seen at a load of 14, so not shorter).
        grace = 1.0
        journal = TurnJournal(tmp_path / "j.json", files, open_grace=grace)
        counted = CountedSaves(journal, monkeypatch)
        journal.restore([])  # a run's first save, whatever the file held
        await wait_for(lambda: len(counted.saves) == 1, what="the first save")
        journal.opened(lambda: obs(1, text="so far"))
        journal.touched()  # a tool call
        await asyncio.sleep(journal_mod.DELAY * 1.5)  # past DELAY: its save was made here
        journal.touched()
        journal.closed(obs(1))  # handed to the files' thread now, beside transcript.db's commit
        assert journal._written is not None
        journal.durable(("s1", 1))  # the commit landed
        await wait_for(lambda: len(counted.saves) == 3, what="the file emptied")
        await asyncio.sleep(grace + journal_mod.DELAY)
        assert counted.saves == [(None, False), ([(1, True)], True), (None, False)]  # no open snapshot
        journal.opened(lambda: obs(2, text="so far"))  # a turn of seconds: saved, unsynced, from OPEN_GRACE on
        await wait_for(lambda: len(counted.saves) == 4, what="the open turn's save")
        assert counted.saves[3] == ([(2, False)], False)
        journal.touched()
        await wait_for(lambda: len(counted.saves) == 5, what="its change's save")
        journal.closed(obs(2))
        journal.durable(("s1", 2))
        await wait_for(lambda: len(counted.saves) == 7, what="the file emptied")
        assert counted.saves[5:] == [([(2, True)], True), (None, False)] and state(tmp_path / "j.json") == []


async def test_changes_within_the_open_grace_keep_the_one_timer_set_for_its_end(tmp_path: Path) -> None:
    """Each change of the open turn (a tool call, the agent's text: three a zero-latency turn) measured its
    save's delay anew from the loop's clock, which came out a hair before the grace's timer, and replaced
    it: a timer made and a cancelled one left in the loop's heap per change. They keep the one timer now,
    and a change after the grace is saved within DELAY, as before."""
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(tmp_path / "j.json", files, open_grace=1.0)
        journal.opened(lambda: obs(1, text="so far"))
        timer = journal._timer
        assert timer is not None and timer.when() == journal._open_due
        for _ in range(3):
            await asyncio.sleep(0)
            journal.touched()
            assert journal._timer is timer and not timer.cancelled()
        journal._open_due = asyncio.get_running_loop().time()  # the grace is over: DELAY from the change
        timer.cancel()
        journal._timer = None
        journal.touched()
        assert journal._timer is not None
        assert journal._timer.when() - asyncio.get_running_loop().time() == pytest.approx(journal_mod.DELAY, abs=0.01)
        journal._timer.cancel()


async def test_a_turn_opened_right_after_a_close_waits_its_own_open_grace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A queued message starts as the turn before closes: the saves due for that close (its commit's
    emptying one) came within the new turn's first milliseconds and took its open snapshot with them,
    so back-to-back turns cost the journal an open save each. The open turn waits its own OPEN_GRACE
    whatever save comes first."""
    with ThreadPoolExecutor(max_workers=1) as files:
        grace = 1.0  # longer than OPEN_GRACE: a loaded machine's late wake-up can't outlast it
        journal = TurnJournal(tmp_path / "j.json", files, open_grace=grace)
        counted = CountedSaves(journal, monkeypatch)
        journal.restore([])
        await wait_for(lambda: len(counted.saves) == 1, what="the first save")
        journal.opened(lambda: obs(1))
        journal.closed(obs(1))
        journal.opened(lambda: obs(2, text="so far"))  # the next message, at once
        await wait_for(lambda: len(counted.saves) == 2, what="the closed turn's save")
        assert counted.saves[1] == ([(1, True)], True)  # synced, and without the open turn
        journal.durable(("s1", 1))  # its commit lands: the journal lets go of it
        await wait_for(lambda: len(counted.saves) == 3, what="the file emptied")
        assert counted.saves[2] == (None, False)  # without the open turn, still in its grace
        journal.closed(obs(2))  # within its grace
        journal.durable(("s1", 2))
        await wait_for(lambda: len(counted.saves) == 5, what="the file emptied again")
        await asyncio.sleep(grace + journal_mod.DELAY)
        assert counted.saves[3:] == [([(2, True)], True), (None, False)] and state(tmp_path / "j.json") == []
        journal.opened(lambda: obs(3, text="so far"))  # a long turn is still saved from its grace on
        await wait_for(lambda: len(counted.saves) == 6, what="the open turn's save")
        assert counted.saves[5] == ([(3, False)], False)


async def test_a_closed_turn_is_saved_at_once_and_its_open_save_due_is_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A closed turn waited 20 ms before the journal saved it, so that its transcript.db commit, usually
    first, made it the turn's one fsync: the turn's wait before turn_complete was the commit's whole
    fsync. It is saved at once now, synced, on the files' thread beside the commit, and the first of
    the two answers the wait (about half the commit's alone on this VM's disk, for a second fsync). The
    open turn's save that was due is dropped: the close's save supersedes it."""
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(tmp_path / "j.json", files, open_grace=0.1,
                              on_saved=lambda k, e: saved.append((k, e)))
        counted = CountedSaves(journal, monkeypatch)
        journal.opened(lambda: obs(1, text="so far"))  # its save due in 0.1 s
        journal.closed(obs(1))  # transcript.db takes it at once too
        assert journal._written is not None  # handed out now, not after a grace
        await wait_for(lambda: bool(saved), what="the closed turn's save")
        assert saved == [([("s1", 1)], None)] and counted.saves == [([(1, True)], True)]
        await asyncio.sleep(0.3)  # the open turn's save would have been made by now
        assert counted.saves == [([(1, True)], True)]


async def test_a_closed_turns_save_the_commit_beat_does_not_wake_the_loop(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """With the journal's save racing the commit at every close, the save that ends second woke the loop
    for nothing when it was the journal's: the turn's ack had come from transcript.db already. It calls
    back now only while the turn is not durable yet (or a moved turn's write waits on it)."""
    loop = asyncio.get_running_loop()
    wakes: list[object] = []
    real = loop.call_soon_threadsafe
    monkeypatch.setattr(loop, "call_soon_threadsafe", lambda cb, *a, **k: (wakes.append(cb), real(cb, *a, **k))[1])
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    busy = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(tmp_path / "j.json", files, on_saved=lambda k, e: saved.append((k, e)))
        files.submit(busy.wait, 10)  # the files' thread is slower than the commit this time
        journal.closed(obs(1))
        journal.durable(("s1", 1))  # the commit landed first
        busy.set()
        written = journal._written
        assert written is not None
        await asyncio.wrap_future(written)
        await asyncio.sleep(0.05)
        assert saved == [] and not any(getattr(w, "__self__", None) is journal for w in wakes)
        journal.closed(obs(2))  # the journal first this time: heard of, once
        await wait_for(lambda: bool(saved), what="the closed turn's save reported")
        assert saved == [([("s1", 2)], None)]


async def test_an_emptying_save_that_failed_is_made_for_the_next_empty_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The journal passes over a save that would leave the file empty when the last save it handed out
    emptied it. One that failed (a full disk) left the file as it was, holding a turn: the next empty
    state (a quick turn, closed and durable within its grace) is saved, not passed over."""
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    path = tmp_path / "j.json"
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(path, files, delay=0.0, open_grace=0.0, on_saved=lambda k, e: saved.append((k, e)))
        journal.opened(lambda: obs(1, text="so far"))  # a long turn: saved open
        await wait_for(lambda: path.exists() and state(path) == [(1, False)], what="the open turn saved")
        real = journal._file.save

        def full(_data: bytes | None, sync: bool = True) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(journal._file, "save", full)
        journal.closed(obs(1))
        journal.durable(("s1", 1))  # committed first: the file is to be emptied, and that save fails
        await wait_for(lambda: any(e is not None for _, e in saved), what="the failed save reported")
        assert state(path) == [(1, False)]
        monkeypatch.setattr(journal._file, "save", real)  # the disk has room again
        journal.opened(lambda: obs(2, text="so far"))
        journal.closed(obs(2))
        journal.durable(("s1", 2))
        await wait_for(lambda: state(path) == [], what="the file emptied")


async def test_a_failed_journal_save_is_made_again_on_its_own_once_the_disk_allows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a failed save (EIO, a full disk) nothing saved again before the next change: the file
    still held a recorded turn as open (a restart replays it, cut short), and a closed turn that
    transcript.db had not taken yet had no copy on disk. Now the save is made again, with backoff."""
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    path = tmp_path / "j.json"
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(path, files, delay=0.0, open_grace=0.0, backoff=Backoff(0.01, 0.05),
                              on_saved=lambda k, e: saved.append((k, e)))
        journal.opened(lambda: obs(1, text="so far"))
        await wait_for(lambda: path.exists() and state(path) == [(1, False)], what="the open turn saved")
        real = journal._file.save
        failed = 0

        def broken(_data: bytes | None, sync: bool = True) -> None:
            nonlocal failed
            failed += 1
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(journal._file, "save", broken)
        journal.closed(obs(1))
        journal.durable(("s1", 1))  # in transcript.db: the save that empties the file fails
        journal.closed(obs(2))  # transcript.db can't take this one: its save fails too
        await wait_for(lambda: failed >= 3, what="the failed save made again")
        assert state(path) == [(1, False)] and ([("s1", 2)], None) not in saved
        made = 0

        def works(data: bytes | None, sync: bool = True) -> None:
            nonlocal made
            made += 1
            real(data, sync)

        monkeypatch.setattr(journal._file, "save", works)  # the disk works again; nothing else changes
        await wait_for(lambda: ([("s1", 2)], None) in saved, what="the closed turn saved on its own")
        assert state(path) == [(2, True)]  # no longer turn 1 as open: a restart would replay it cut short
        attempts = made
        await asyncio.sleep(0.2)  # four times the longest backoff: a retry still due would have saved
        assert made == attempts  # a save that succeeded ends the retries


class CountedExecutor(ThreadPoolExecutor):
    """A files' thread that counts what is handed to it."""

    submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(*args, **kwargs)


async def test_a_stuck_journal_makes_no_save_and_tells_acks_at_each_close(tmp_path: Path) -> None:
    """A journal a start could neither read nor set aside made a save every few seconds for the whole run,
    each failing with an I/O error it made up itself, logged as if the disk had failed. Now it makes none,
    and each closed turn's ack hears at its close, once, that the journal's way failed: it waits for
    transcript.db's way alone."""
    saved: list[tuple[list[tuple[str, int]], BaseException | None]] = []
    path = tmp_path / "j.json"
    path.write_bytes(b"in the way\n")
    with CountedExecutor(max_workers=1) as files:
        journal = TurnJournal(path, files, delay=0.0, open_grace=0.0, backoff=Backoff(0.01, 0.02, jitter=0.0),
                              on_saved=lambda k, e: saved.append((k, e)))
        journal.restore([], stuck=True)
        journal.opened(lambda: obs(1, text="so far"))
        journal.touched()
        journal.closed(obs(1))
        [(keys, error)] = saved
        assert keys == [("s1", 1)] and error is not None and not isinstance(error, OSError)
        journal.opened(lambda: obs(2, text="so far"))
        journal.closed(obs(2))
        waited: list[int] = []
        journal.after_save(("s1", 2), lambda: waited.append(2))  # a moved turn's write waits on no save
        assert waited == [2]
        await asyncio.sleep(0.2)  # ten times the longest backoff: a retry would have been made
        assert [k for k, _e in saved] == [[("s1", 1)], [("s1", 2)]] and files.submitted == 0
        await journal.flush()
    assert path.read_bytes() == b"in the way\n" and files.submitted == 0


async def test_a_journal_outage_is_logged_at_its_start_and_its_end_and_its_retries_quietly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a disk that stays full the save is retried every few seconds: each failure was a warning (720
    lines an hour). Now the outage's first failure is, its retries are debug, and the save that works
    again says at info how long the outage lasted and how many tries it took."""
    path = tmp_path / "j.json"
    with ThreadPoolExecutor(max_workers=1) as files:
        journal = TurnJournal(path, files, delay=0.0, open_grace=0.0, backoff=Backoff(0.01, 0.02, jitter=0.0))
        failed = 0

        def full(_data: bytes | None, sync: bool = True) -> None:
            nonlocal failed
            failed += 1
            raise OSError(errno.ENOSPC, "No space left on device")

        real = journal._file.save
        with capture_logs() as logs:
            monkeypatch.setattr(journal._file, "save", full)
            journal.closed(obs(1))
            await wait_for(lambda: failed >= 4, what="the save retried")
            monkeypatch.setattr(journal._file, "save", real)
            await wait_for(lambda: any(x["event"] == "turn_journal_write_recovered" for x in logs),
                           what="the save made again")
    failures = [x for x in logs if x["event"] == "turn_journal_write_failed"]
    assert [x["log_level"] for x in failures][:4] == ["warning", "debug", "debug", "debug"]
    assert [x["log_level"] for x in failures].count("warning") == 1 and "No space" in failures[0]["error"]
    [back] = [x for x in logs if x["event"] == "turn_journal_write_recovered"]
    assert back["log_level"] == "info" and back["failed_tries"] == len(failures) and back["failed_for_s"] > 0
    assert state(path) == [(1, True)]


def test_the_last_whole_line_is_the_state_and_a_torn_append_leaves_the_one_before(tmp_path: Path) -> None:
    path = tmp_path / "turn-journal.json"
    path.write_bytes(entries((1, True)) + b"\n" + entries((1, True), (2, False))[:-7])  # killed mid-append
    assert state(path) == [(1, True)]
    [one] = recover(path)
    assert one.sequence_num == 1 and one.agent_response == "answer 1"
    path.write_bytes(entries((1, True), (2, False)))  # a journal an older version wrote: one array, no newline
    assert [(o.agent_response, o.status) for o in recover(path)] == [
        ("answer 1", None), (f"answer 2\n{STOPPED_NOTE}", "stopped")]  # as a turn the server's stop cut short


def test_a_failed_append_is_cut_off_again_and_a_long_journal_is_rewritten(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    f = JournalFile(tmp_path / "turn-journal.json")
    f.save(entries((1, False)))
    before = f.path.read_bytes()

    def full(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdatasync", full)
    with pytest.raises(OSError):
        f.save(entries((1, True)))
    assert f.path.read_bytes() == before  # no torn line for the next append to run into
    monkeypatch.undo()
    for n in range(2, 400):  # long turns, many saves
        f.save(entries(*((k, True) for k in range(1, 6)), (n, False)))
    assert f.path.stat().st_size <= journal_mod.COMPACT_BYTES + 2 * len(entries(*((k, True) for k in range(1, 7))))
    assert state(f.path)[-1] == (399, False)


async def test_a_closed_turn_is_saved_at_once_and_kept_until_durable(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    saved: list[tuple[list[Any], BaseException | None]] = []
    files = ThreadPoolExecutor(max_workers=1)
    journal = TurnJournal(journal_path(layout), files, delay=60.0,
                          on_saved=lambda keys, exc: saved.append((keys, exc)))
    journal.opened(lambda: obs(1, text="so far"))  # saved within the (here very long) delay
    journal.closed(obs(1))
    await wait_for(lambda: saved, timeout=5, what="the closed turn's save")
    assert saved == [([("s1", 1)], None)] and state(journal_path(layout)) == [(1, True)]
    journal.opened(lambda: obs(2, text="so far"))
    journal.closed(obs(2))  # saved at once too, beside turn 1, still waiting for transcript.db
    await wait_for(lambda: len(saved) == 2, timeout=5, what="the next save")
    assert saved[1] == ([("s1", 1), ("s1", 2)], None) and state(journal_path(layout)) == [(1, True), (2, True)]
    journal.durable(("s1", 2))  # in transcript.db: the journal lets go of it
    assert list(journal._closed) == [("s1", 1)]  # saved again within the (long) delay
    journal.durable(("s1", 1))
    synced: list[bool] = []
    real = journal._file.save
    journal._file.save = lambda data, sync=True: (synced.append(sync), real(data, sync))[1]  # type: ignore[method-assign]
    journal.opened(lambda: obs(3, text="so far"))
    journal.touched()
    await journal.flush()
    assert synced and not any(synced)  # the open turn alone is never synced: only a closed one waits on it
    files.shutdown()


# ---------------------------------------------------------------- capture, wired: the busy thread


class BusyDB(TranscriptDB):
    """transcript.db whose thread can be held busy (a long read), and whose transactions are counted."""

    hold: threading.Event | None = None
    groups = 0

    def group(self) -> Any:
        if self.hold is not None:
            self.hold.wait(30)
        if not self.conn.in_transaction:  # a transaction of its own, not one joined
            BusyDB.groups += 1
        return super().group()


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[Capture]:
    layout = Layout(tmp_path)
    layout.ensure()
    BusyDB.hold, BusyDB.groups = None, 0
    db: Worker[TranscriptDB] = Worker("t", lambda: BusyDB(layout.transcript_db))
    c = Capture(db, layout, on_recorded=lambda: None)
    await c.start(1.0)
    c.recorder.start_session("s1")
    assert await c.writer.drained(5)
    yield c
    if BusyDB.hold is not None:
        BusyDB.hold.set()
    await c.stop(5)
    await db.close()


def close_turn(c: Capture, prompt: str) -> Any:
    record = c.recorder.open(prompt)
    record.observe(AssistantMessage(content=[TextBlock(text="the whole answer")], model="m"))
    record.close(result())
    return record


async def test_a_turn_closed_while_transcript_db_is_busy_is_durable_through_the_journal(capture: Capture) -> None:
    """Found by a kill -9 right after turn_complete: with transcript.db's thread busy, a 10 ms turn
    was acknowledged and lost, 2 of 2. Now the turn is durable, by the journal, before it may be."""
    BusyDB.hold = threading.Event()
    capture.writer.submit(SessionWrite("s0", "end", 1.0))  # the thread is now held in a write
    record = close_turn(capture, "a quick one")
    assert await record.durable(budget=10) is True  # what the runtime waits for before turn_complete
    [turn] = recover(journal_path(capture._layout))  # what a restart after a kill -9 right now finds
    assert (turn.user_message, turn.agent_response) == ("a quick one", "the whole answer")  # whole, not cut short
    BusyDB.hold.set()
    assert await capture.writer.drained(10)


async def test_a_turn_closed_while_transcript_db_is_free_is_durable_by_its_commit_alone(capture: Capture) -> None:
    record = close_turn(capture, "one")
    assert await record.durable(budget=10) is True
    rows = await capture.writer._db.call(lambda t: [(o.user_message, o.agent_response) for o in t.iter_all()])
    assert rows == [("one", "the whole answer")]


async def test_a_turn_cut_short_keeps_its_client_id_through_the_journal(capture: Capture, tmp_path: Path) -> None:
    """A server killed mid-turn: the next start records the turn from the journal, and the page that
    sent it finds it in the record by its client id, as it would the turn had it ended."""
    record = capture.recorder.open("yes, go on", "t-1", "web-1")
    record.observe(AssistantMessage(content=[TextBlock(text="so far")], model="m"))
    await wait_for(lambda: [o.client_id for o in recover(journal_path(capture._layout))] == ["web-1"],
                   what="the open turn saved")
    after = Layout(tmp_path / "after")  # what the kill left, as the next start finds it
    after.ensure()
    journal_path(after).write_bytes(journal_path(capture._layout).read_bytes())
    db: Worker[TranscriptDB] = Worker("t2", lambda: TranscriptDB(after.transcript_db))
    c = Capture(db, after, on_recorded=lambda: None)
    await c.start(5.0)
    assert await c.writer.drained(10)
    rows = await db.call(lambda t: [(o.user_message, o.turn_id, o.client_id, o.agent_response)
                                    for o in turns_page(t, "s1", None, 10)[0]])
    await c.stop(5)
    await db.close()
    assert rows == [("yes, go on", "t-1", "web-1", f"so far\n{STOPPED_NOTE}")]


async def test_a_command_that_left_no_turn_is_durable_by_its_client_id_alone(capture: Capture) -> None:
    """/compact, run by the CLI itself, leaves no turn, but the agent took it: its client id must be on
    disk before the person is told it is done, or a restart would run its resend again. The journal never
    holds it, so the spill file takes it at once (transcript.db later); no observation is written."""
    BusyDB.hold = threading.Event()
    capture.writer.submit(SessionWrite("s0", "end", 1.0))  # the thread is now held in a write
    record = capture.recorder.open("/compact", "t-c", "web-c")
    record.close(ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=0,
                               session_id="x", result=""))
    assert await record.durable(budget=10) is True  # by the spill file, transcript.db still locked
    spilled = read_spill(spill_path(capture._layout))
    assert [w.client_id for w in spilled if isinstance(w, CommandWrite)] == ["web-c"]
    assert [c.client_id for c in capture.writer.waiting_commands()] == ["web-c"]  # a start meanwhile knows it
    BusyDB.hold.set()
    assert await capture.writer.drained(10)
    turns, taken = await capture.writer._db.call(lambda t: (list(t.iter_all()), t.taken_clients(10)))
    assert turns == [] and [(c.client_id, c.session_id, c.turn_id) for c in taken] == [("web-c", "s1", "t-c")]


async def test_a_commands_client_id_is_on_disk_before_the_journal_lets_its_running_entry_go(
        capture: Capture) -> None:
    """While /compact runs, the journal holds it (a kill then records a cut turn, which names its client id).
    Once it ended, the journal let it go within DELAY, while its client id was only queued in memory for a
    transcript.db that was locked or slow: a kill then left it on no disk, and the console's question after
    the restart (the same client id) ran /compact a second time. The spill file takes it first."""
    layout = capture._layout
    record = capture.recorder.open("/compact", "t-c", "web-c")
    await wait_for(lambda: [o.client_id for o in recover(journal_path(layout))] == ["web-c"],
                   what="the running command saved")
    BusyDB.hold = threading.Event()
    capture.writer.submit(SessionWrite("s0", "end", 1.0))  # transcript.db is locked: the write waits
    record.close(ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=0,
                               session_id="x", result=""))
    await wait_for(lambda: recover(journal_path(layout)) == [], what="the journal letting the command go")
    await asyncio.sleep(0.2)  # the kill comes now: what is on disk is what the next start knows
    spilled = [w.client_id for w in read_spill(spill_path(layout)) if isinstance(w, CommandWrite)]
    assert spilled == ["web-c"]


@pytest.mark.parametrize("client_id", ["web-c", None])
async def test_a_command_told_done_is_never_replayed_as_a_turn_cut_short(
        capture: Capture, client_id: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A command the CLI ran itself (/compact) that ran past its open grace is in the journal as a running
    turn. Its close let that entry go only within DELAY, unsynced, while its acknowledgement waited for its
    client id alone (or for nothing, without one): a kill -9 right after its turn_complete left the running
    entry (a power cut, later too), and the restart recorded a /compact the person saw done as a turn the
    server's stop cut short."""
    layout = capture._layout
    record = capture.recorder.open("/compact", "t-c", client_id)
    await wait_for(lambda: [o.turn_id for o in recover(journal_path(layout))] == ["t-c"],
                   what="the running command saved")
    synced: list[str] = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def spy(fd: int, _real: Any = real) -> Any:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
            return _real(fd)

        monkeypatch.setattr(os, name, spy)
    record.close(ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=0,
                               session_id="x", result=""))
    assert await record.durable(budget=10) is True
    assert recover(journal_path(layout)) == []  # what a kill -9 right after turn_complete leaves to replay
    assert str(journal_path(layout)) in synced  # and a power cut: the entry's leaving is on disk


async def test_a_command_whose_spill_fails_on_a_full_disk_is_still_saved_by_transcript_db(
        capture: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The spill file takes a command's id at once; on a full disk that append fails, while transcript.db
    (its pages free) takes the id a moment later. The failed append alone was taken for both ways failing:
    the person was told /compact was not saved while its id was on disk. Only transcript.db's own failure
    makes it so."""
    def full(*_args: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(SpillFile, "append", full)
    record = capture.recorder.open("/compact", "t-c", "web-c")
    record.close(ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=0,
                               session_id="x", result=""))
    assert await record.durable(budget=5) is True
    taken = await capture.writer._db.call(lambda t: t.taken_clients(10))
    assert [c.client_id for c in taken] == ["web-c"]

    def db_full(*_args: Any) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    with monkeypatch.context() as m:  # the whole disk full: transcript.db fails too, and the person is told
        m.setattr(TranscriptDB, "record_command", db_full)
        record = capture.recorder.open("/compact", "t-d", "web-d")
        record.close(ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False,
                                   num_turns=0, session_id="x", result=""))
        assert await record.durable(budget=5) is False
    monkeypatch.undo()
    assert await capture.writer.drained(10)


def test_a_spilled_commands_client_id_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "spill"
    SpillFile(path).append([CommandWrite("web-c", "s1", "t-c", 1.0)])
    assert read_spill(path) == [CommandWrite("web-c", "s1", "t-c", 1.0)]


def test_a_spilled_turn_keeps_its_client_id(tmp_path: Path) -> None:
    """The writer's spill file holds a turn transcript.db could not take: its client id with it."""
    path = tmp_path / "spill"
    SpillFile(path).append([ObservationWrite(msgspec.structs.replace(obs(1), client_id="web-1"))])
    [write] = read_spill(path)
    assert isinstance(write, ObservationWrite) and write.observation.client_id == "web-1"


def on_disk(layout: Layout) -> set[str]:
    """The turns a kill -9 now leaves, by message: the journal, the spill file, transcript.db."""
    found = {o.user_message for o in recover(journal_path(layout))}
    found |= {w.observation.user_message for w in read_spill(spill_path(layout)) if isinstance(w, ObservationWrite)}
    conn = sqlite3.connect(f"file:{layout.transcript_db}?mode=ro", uri=True, timeout=0.1)
    try:
        found |= {m for (m,) in conn.execute("SELECT user_message FROM observations")}
    finally:
        conn.close()
    return found


async def test_more_closed_turns_than_the_journal_keeps_are_spilled_never_dropped(capture: Capture) -> None:
    """With transcript.db's thread held, each turn is durable by the journal alone; the journal
    dropped its oldest past MAX_CLOSED while the writer held it in memory only: acknowledged, on no disk."""
    BusyDB.hold = threading.Event()
    capture.writer.submit(SessionWrite("s0", "end", 1.0))  # the thread is now held in a write
    acknowledged = []
    for n in range(journal_mod.MAX_CLOSED + 8):
        record = close_turn(capture, f"turn {n}")
        assert await record.durable(budget=10) is True
        acknowledged.append(f"turn {n}")
        missing = [m for m in acknowledged if m not in on_disk(capture._layout)]
        assert not missing, f"acknowledged, then on no disk: {missing}"
    BusyDB.hold.set()
    assert await capture.writer.drained(10)
    assert set(acknowledged) <= on_disk(capture._layout)


async def test_a_turn_resent_to_a_fresh_session_leaves_no_entry_under_its_old_key(capture: Capture) -> None:
    """A turn opened in one session and closed in the next (the reused CLI was found dead, the turn
    resent to a fresh one) stayed in the journal under its first key, unfinished: a kill -9 after
    its turn_complete replayed it as a second, cut-short copy."""
    record = capture.recorder.open("resent")
    await wait_for(lambda: [o.session_id for o in recover(journal_path(capture._layout))] == ["s1"],
                   what="the open turn saved")
    files = threading.Event()
    capture._files.submit(files.wait, 30)  # the journal's saves wait (a slow disk): transcript.db is free
    try:
        capture.recorder.end_session("s1")
        capture.recorder.start_session("s2")  # the fresh CLI's session
        await asyncio.sleep(0.3)  # its connect
        record.close(result("the answer"))
        durable = asyncio.ensure_future(record.durable(budget=10))
        await asyncio.sleep(0.5)  # time enough for transcript.db's commit
        left = recover(journal_path(capture._layout))
        assert not durable.done() or ("s1", 1) not in [(o.session_id, o.sequence_num) for o in left]
    finally:
        files.set()
    assert await durable is True
    left = recover(journal_path(capture._layout))  # what a kill -9 right after turn_complete replays
    assert [(o.session_id, o.sequence_num, o.user_message) for o in left] in ([], [("s2", 1, "resent")])


async def test_a_restart_never_records_again_a_turn_the_journal_holds_under_another_key(
        capture: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn resent to a fresh session closes under a new key. With the journal's saves failing, the
    file kept it open under its first key while transcript.db recorded it under the new one: a restart
    replayed it as a second, cut-short copy. A turn is recorded once by its wire id too. (Under the same
    key a replay was already ignored: the unique (session, sequence).)"""
    record = capture.recorder.open("resent", turn_id="t-resent")
    await wait_for(lambda: [o.session_id for o in recover(journal_path(capture._layout))] == ["s1"],
                   what="the open turn saved")

    def broken(_data: bytes | None, sync: bool = True) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(capture.journal._file, "save", broken)
    capture.recorder.end_session("s1")
    capture.recorder.start_session("s2")
    record.close(result("the answer"))
    assert await record.durable(budget=10) is True  # by transcript.db's commit
    left = recover(journal_path(capture._layout))  # what a kill -9 now leaves
    assert [(o.session_id, o.turn_id) for o in left] == [("s1", "t-resent")]
    ids = await capture.writer._db.call(lambda t: [t.append(o) for o in left])  # the restart's replay
    assert ids == [None]
    rows = await capture.writer._db.call(lambda t: [(o.session_id, o.agent_response) for o in t.iter_all()])
    assert rows == [("s2", "the answer")]


async def test_capture_is_degraded_while_a_turn_told_not_saved_is_not_durable_or_a_write_stalls(
        capture: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that hangs fails nothing: capture said it was fine while every turn was not_saved."""
    BusyDB.hold = threading.Event()
    files = threading.Event()
    capture.writer.submit(SessionWrite("s0", "end", 1.0))  # transcript.db's commit hangs
    capture._files.submit(files.wait, 30)  # so does the journal's fsync
    try:
        record = close_turn(capture, "during the hang")
        assert await record.durable(budget=0.2) is False  # what the runtime tells the person
        status = capture.status([])
        assert status["degraded"] and status["not_saved"] == 1 and status["not_saved_total"] == 1
        assert status["failing_since"] is None  # nothing failed: only hung
        monkeypatch.setattr(health_mod, "STALLED_AFTER", 0.0)
        capture.acks.unsaved.clear()
        assert capture.status([])["degraded"]  # the oldest queued write is past the bound
        monkeypatch.undo()
    finally:
        files.set()
        BusyDB.hold.set()
    assert await capture.writer.drained(10)
    status = capture.status([])
    assert not status["degraded"] and status["not_saved"] == 0 and status["not_saved_total"] == 1


async def test_writes_waiting_together_land_in_one_transaction(capture: Capture) -> None:
    BusyDB.hold = threading.Event()
    capture.writer.submit(SessionWrite("s0", "end", 1.0))  # sent at once, and held
    records = [close_turn(capture, f"turn {n}") for n in range(10)]
    groups = BusyDB.groups
    BusyDB.hold.set()
    assert all([await r.durable(budget=10) for r in records])
    assert await capture.writer.drained(10)
    assert BusyDB.groups - groups <= 2  # the held write, then the ten together: one fsync, not ten


async def test_a_turn_neither_disk_way_takes_is_reported_not_durable_within_moments(
        capture: Capture, monkeypatch: pytest.MonkeyPatch) -> None:
    def read_only(*_a: Any, **_k: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(JournalFile, "save", read_only)
    monkeypatch.setattr(SpillFile, "append", read_only)  # the spill file
    monkeypatch.setattr(BusyDB, "_append", lambda *_a: (_ for _ in ()).throw(sqlite3.OperationalError(
        "attempt to write a readonly database")))
    record = close_turn(capture, "on a read-only disk")
    assert await record.durable(budget=10) is False  # known at once, not after the budget
    assert capture.writer.waiting()  # kept in memory, to land when the disk allows
    monkeypatch.undo()
    assert await capture.writer.drained(10)


# ---------------------------------------------------------------- the databases sync every commit


def test_both_databases_sync_every_commit(tmp_path: Path) -> None:
    """synchronous=FULL under WAL: a commit that returned is on disk, power loss included."""
    for db in (TranscriptDB(tmp_path / "transcript.db"), MemoryDB(tmp_path / "memory.db")):
        assert db.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        db.close()
    assert connect(tmp_path / "other.db").execute("PRAGMA synchronous").fetchone()[0] == 2


def test_a_group_that_fails_rolls_back_every_write_in_it(tmp_path: Path) -> None:
    db = TranscriptDB(tmp_path / "transcript.db")
    with pytest.raises(RuntimeError), db.group():
        db.append(obs(1))
        ObservationWrite(obs(2)).apply(db)
        raise RuntimeError("the disk")
    assert not db.conn.in_transaction and list(db.iter_all()) == []
    with db.group():
        db.append(obs(1))
        db.start_session("s2", 1.0)
    assert [o.sequence_num for o in db.iter_all()] == [1] and db.session("s2") is not None
    db.close()


def test_an_import_commits_in_groups_and_what_it_reports_is_committed(tmp_path: Path) -> None:
    """An import acknowledges what it added: each group of turns is one synced transaction (one
    fsync), not one per turn, so a 1,200-turn file costs 4 (three chunks, then the sessions' ends) and a long one stays
    fast under FULL."""
    import io

    from sprite_os.memory.importer import APPLY_CHUNK, ReadReport, apply, read_turns

    BusyDB.hold, BusyDB.groups = None, 0
    db = BusyDB(tmp_path / "transcript.db")
    lines = [json.dumps({"session": f"s{n // 100}", "timestamp": 1_700_000_000 + n, "user": f"q{n}",
                         "assistant": f"a{n}"}) for n in range(1200)]
    report = apply(db, read_turns(io.StringIO("\n".join(lines)), ReadReport(), now=1_700_100_000))
    assert report.added == 1200 and BusyDB.groups == -(-1200 // APPLY_CHUNK) + 1  # the groups, then the sessions' ends
    db.close()
    reread = TranscriptDB(tmp_path / "transcript.db")  # what another process finds: all of it
    assert reread.counts()["total"] == 1200
    reread.close()


async def test_a_spilled_turns_message_is_known_taken_after_a_restart_on_a_disk_that_still_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An earlier run left a turn in the spill file (transcript.db could not take it) and the disk still
    refuses writes at the restart: the record does not hold it yet, but its message was taken. Were its
    client id unknown, the page would offer Send again, the server accept it, and the agent do it twice."""
    from devkit.harness import make_settings
    from sprite_os.memory import system as system_mod
    from sprite_os.memory.system import MemorySystem

    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    settings.layout.ensure()
    obs = NewObservation(timestamp=1_790_000_000.0, session_id="s1", sequence_num=1, user_message="do it once",
                         tool_calls_json="[]", agent_response="done", turn_id="t-1", client_id="web-spilled")
    SpillFile(spill_path(settings.layout)).append([ObservationWrite(obs)])

    def full(_db: TranscriptDB, _obs: NewObservation) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(TranscriptDB, "append", full)
    monkeypatch.setattr(system_mod, "REPLAY_BUDGET", 0.3)
    memory = MemorySystem(settings)
    await memory.start()
    try:
        taken = await memory.taken_messages(10_000)
        assert [(t.client_id, t.session_id, t.turn_id) for t in taken] == [("web-spilled", "s1", "t-1")]
    finally:
        monkeypatch.undo()  # the stop may land it now
        await memory.stop()
