"""The turns not yet safe in transcript.db, on disk as they happen (.os/state/turn-journal.json).

Capture records a turn when it ends. A server killed mid-turn would lose it, and with it
the task a "Continue" must pick up. So the open turn (the person's message, the tool calls
so far, the last thing the agent said) is kept in this file as it goes, and so is a closed
turn until its observation is durable (in transcript.db, or in the writer's spill file).
At the next start, whatever the file holds is recorded: a turn that never ended with a note
that the server stopped before it did. Replaying a turn that had landed changes nothing
(the unique (session, sequence) key). A journal the start cannot read is renamed aside
(turn-journal.json.io-error-<time> or .damaged-<time>: health.py) before a new one is written, and
capture says degraded until the operator replays or removes it: it may hold turns the person was
told were done.

The journal is also one of the two ways a closed turn becomes durable before the person is
told it is done (capture/acks.py): the closed turn is saved here at once, beside transcript.db's
commit, and whichever of the two is synced first answers the turn's wait. Each way is one
fsync, on its own thread: racing them cost a turn a second fsync and took the wait from the
commit's to the quicker of the two (about half the commit's alone on this VM's disk).

Each save appends the journal's whole state as one JSON line. A save that holds a closed turn
not yet durable elsewhere is fsync'd (one fsync: a rewrite through a temp file and a rename takes
two); a save of the open turn alone is not: a kill -9 leaves the page cache as it was, and a
power cut mid-turn loses only a turn no one was told was done (and the record that its message's
client id was taken: a resend after the restart runs again, as docs/protocol.md says, rather than
every turn paying a fsync before its prompt reaches the CLI). The save that lets a command's running
entry go (the CLI ran it itself: no turn closes) is fsync'd too, since its acknowledgement waits for it.
Reading takes the last whole line, so
a kill mid-append leaves the state before it. The first save of a run, and one past
COMPACT_BYTES, rewrites the file whole (atomically); an empty state truncates it. Saves run off
the event loop, at most every DELAY seconds while a turn goes on (changes in between are
coalesced), and at once at a turn's close. An open turn is first saved OPEN_GRACE after it
opens: a turn that ends sooner (a quick answer) never needs its snapshot, since its close makes it
durable, and a kill -9 before then loses only a turn no one was told was done.
A save that would leave the file as the last one left it (empty) is not made. Only a save someone
still waits on (it holds a closed turn the commit has not made durable yet, or one an `after_save`
waits for), one that failed, or one made while saves fail calls back to the loop: a wake-up from a
thread costs a turn in flight, and a closed turn's save that the commit beat has no one to tell.

A save that fails (EIO, a full disk) is made again on its own, with backoff (health.LOCAL_DISK, a local
disk's), until one succeeds: the file holds what it did before, which may be a turn as still open
that is recorded since, or no copy of a closed turn waiting to be durable. Nothing else would save
again before the next change.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from functools import partial
from pathlib import Path
from typing import NamedTuple

import msgspec

from ...backoff import Backoff
from ...errors import SpriteOSError
from ...fsutil import TornAppend, append_whole, atomic_write, sync_dir
from ...logs import get_logger
from ...paths import Layout
from ..transcript_store import NewObservation
from .health import JOURNAL_NAME, LOCAL_DISK, advice, set_aside_name

log = get_logger(__name__)

DELAY = 0.05  # seconds: a tool call's events within it cost one save
# An open turn's first save waits this long after it opens (its later changes, DELAY): a zero-latency
# model's turn (60-150 ms) closes within it and costs the journal nothing; a model's turn of seconds is
# saved from here on, as it goes.
OPEN_GRACE = 0.2
COMPACT_BYTES = 256 * 1024  # past this the next save rewrites the file whole
# Past this many closed turns waiting, the journal asks for them to be spilled (the writer's fsync'd
# file), which makes them durable there and lets the journal forget them. It never drops one itself:
# it may be the turn's only copy on disk.
MAX_CLOSED = 32
STOPPED_NOTE = "(the server stopped before the turn ended)"
STOPPED = "stopped"  # the status of a turn the server's stop or restart cut short (not the person: "interrupted")

Key = tuple[str, int]  # (session_id, sequence_num)
# What a save holds of the closed turns, and whether it failed (None: it is on disk).
Saved = Callable[[list[Key], BaseException | None], None]


def journal_path(layout: Layout) -> Path:
    return layout.state_dir / JOURNAL_NAME


class Entry(msgspec.Struct, frozen=True):
    observation: NewObservation
    ended: bool


_decoder = msgspec.json.Decoder(list[Entry])


def _last_state(data: bytes, path: Path) -> list[Entry] | None:
    """The journal's state: its last line that reads whole (a kill mid-append tears only the last).
    None: a whole line is there and none reads (the file is damaged, not torn by a kill)."""
    lines = data.splitlines()
    for line in reversed(lines):
        if not line.strip():
            continue
        try:
            return _decoder.decode(line)
        except msgspec.MsgspecError as exc:
            log.warning("turn_journal_line_unreadable", path=str(path), error=str(exc)[:200])
    whole = data[:data.rfind(b"\n") + 1]  # a tail with no newline is an append a kill tore
    return None if whole.strip() else []


def read_state(path: Path) -> list[Entry] | None:
    """The journal's state as a start reads it: [] when there is no file, or nothing whole in it; None
    when a whole line is there and none decodes (damaged). OSError: the file could not be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return _last_state(data, path)


def _set_aside(path: Path, why: str, damaged: bool) -> bool:
    """Rename an unreadable journal out of the way, its folder synced, before a new one is written:
    its turns may be the only copy of ones the person was told were done. Its new name says whether
    the disk failed to read it or its bytes are `damaged` (health.py). False: it could not be renamed."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    aside = next(p for n in itertools.count()
                 if not (p := path.with_name(set_aside_name(damaged, stamp + (f"-{n}" if n else "")))).exists())
    try:
        os.rename(path, aside)  # the one writer (the start holds memory's lock): the name is free
    except OSError as exc:
        log.error("turn_journal_not_set_aside", path=str(path), why=why, error=str(exc)[:200],
                  hint="no journal is written this run, so as not to write over it")
        return False
    try:
        sync_dir(path.parent)
    except OSError as exc:  # renamed all the same: the file to keep, and no journal is in the way
        log.error("turn_journal_set_aside_not_synced", aside=str(aside), error=str(exc)[:200])
        return True
    log.error("turn_journal_set_aside", path=str(path), aside=str(aside), why=why,
              hint=f"its turns are not recorded: {advice(aside.name)}")
    return True


class JournalUnreadable(SpriteOSError):
    """The journal could not be read (EIO), or has a whole line and none that decodes (`damaged`)."""

    def __init__(self, why: str, damaged: bool = False) -> None:
        super().__init__(why)
        self.damaged = damaged


class Recovered(NamedTuple):
    """What a start found in the journal: the turns to record, and whether an unreadable journal is still in
    place (it could not be set aside: none may be written). One set aside is found by its name (health.py)."""

    observations: list[NewObservation]
    stuck: bool = False


def recover_at_start(path: Path) -> Recovered:
    """`recover`, at a start: a journal that can't be read is set aside, never written over, since it
    may hold turns the person was told were done (capture is then degraded)."""
    try:
        return Recovered(recover(path))
    except JournalUnreadable as exc:
        log.error("turn_journal_unreadable", path=str(path), error=str(exc)[:200])
        return Recovered([], stuck=not _set_aside(path, str(exc), exc.damaged))


def recover(path: Path) -> list[NewObservation]:
    """The turns an earlier run left in its journal, as observations to record, in the order
    they were taken (never by their clocks, which may have jumped). JournalUnreadable: it could
    not be read, or no whole line of it decodes (a tail a kill tore is not that: it is skipped).
    (Temp files a kill left are the start's sweep's: memory/system.py.)"""
    try:
        entries = read_state(path)
    except OSError as exc:
        raise JournalUnreadable(f"{type(exc).__name__}: {exc}") from exc
    if entries is None:
        raise JournalUnreadable("no line decodes", damaged=True)
    out = []
    for entry in entries:
        obs = entry.observation
        if not entry.ended:
            obs = msgspec.structs.replace(obs, agent_response=f"{obs.agent_response}\n{STOPPED_NOTE}".strip(),
                                          status=STOPPED)
        out.append(obs)
    if out:
        log.warning("turn_journal_recovered", turns=len(out), unfinished=sum(not e.ended for e in entries))
    return out


class JournalFile:
    """The file's one writer, on the capture files' thread: appends, fsync'd; rewrites when it must."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._size: int | None = None  # bytes known to end with a whole line; None: rewrite first

    def save(self, data: bytes | None, sync: bool = True) -> None:
        """Make `data` the journal's state (None: empty); `sync`: fsync'd before it returns."""
        if data is None:
            self._truncate(sync)
            return
        line = data + b"\n"
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND) if self._size is not None else None
        except FileNotFoundError:
            fd = None
        size = self._size
        if fd is None or size is None or size > COMPACT_BYTES:
            if fd is not None:
                os.close(fd)
            self._size = None
            atomic_write(self.path, line, mode=0o600)  # its directory is synced too: the name is durable
            self._size = len(line)
            return
        try:
            append_whole(fd, line, size, os.fdatasync if sync else None)
        except TornAppend:
            self._size = None  # the tail is torn: the next save rewrites the file whole
            raise
        finally:
            os.close(fd)
        self._size = size + len(line)

    def _truncate(self, sync: bool) -> None:
        """Empty the file. Synced only when asked (a command's running entry leaving): otherwise after a
        power loss the file may hold turns again that are in transcript.db, and a replay of those changes
        nothing. Kept, so that its name needs no new fsync."""
        try:
            fd = os.open(self.path, os.O_WRONLY)
        except FileNotFoundError:
            self._size = None
            return
        try:
            os.ftruncate(fd, 0)
            self._size = 0
            if sync:
                os.fdatasync(fd)
        finally:
            os.close(fd)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self._size = None


class JournalStuck(Exception):
    """What acks hear of a closed turn while the journal is stuck: no save holds it, nor will."""


class TurnJournal:
    """The journal's state. Called from the event loop; saves on `executor`'s thread, in order.

    While it is `stuck` (an unreadable journal a start could neither read nor set aside is in the way)
    it saves nothing and removes nothing: each closed turn is told failed to acks at its close, once,
    so its acknowledgement waits for transcript.db's way alone, and what waits on a save (`after_save`)
    is called at once."""

    def __init__(self, path: Path, executor: Executor, delay: float = DELAY,
                 on_saved: Saved | None = None, on_full: Callable[[], None] | None = None,
                 open_grace: float = OPEN_GRACE, backoff: Backoff = LOCAL_DISK) -> None:
        """`on_full()`: more than MAX_CLOSED closed turns wait; spill them (each then comes back
        through `durable`)."""
        self._file = JournalFile(path)
        self._executor = executor
        self._delay = delay
        self._open_grace = open_grace
        self._backoff = backoff
        self._failures = 0  # saves failed in a row: the next is made again on its own after the backoff
        self._failing_since = 0.0  # the loop's time of the first of them: how long the outage lasted
        self._open_due = 0.0  # the loop's time before which the open turn is not saved (OPEN_GRACE)
        # The save pending (`_timer`; read only while one is) is due for the open turn's sake alone.
        self._for_open = False
        # The last save handed out emptied the file, so another empty state is not saved again. None
        # (at start, and after a failed save): what the file holds is not known, the next save is made.
        self._empty: bool | None = None
        self._on_saved = on_saved or (lambda _keys, _exc: None)
        self._on_full = on_full or (lambda: None)
        self._open: Callable[[], NewObservation] | None = None  # the open turn, as it would record now
        self._closed: dict[Key, NewObservation] = {}
        self._after: dict[Key, Callable[[], None]] = {}  # called once a save holding that closed turn ends
        self._timer: asyncio.TimerHandle | None = None
        self._written: Future[None] | None = None  # the last save handed out
        self._shut_down = False  # flushed at shutdown: the files' thread takes no more saves, none is retried
        self._stuck = False

    @property
    def stuck(self) -> bool:
        """An unreadable journal could not be set aside: none is written this run."""
        return self._stuck

    def restore(self, observations: list[NewObservation], stuck: bool = False) -> None:
        """Keep what `recover` found until it is durable again (a second crash must not lose it).
        `stuck`: it found a journal it could neither read nor set aside: nothing is written over it."""
        self._stuck = stuck
        for obs in observations:
            self._closed[(obs.session_id, obs.sequence_num)] = obs
        self._changed(0.0)

    def opened(self, snapshot: Callable[[], NewObservation]) -> None:
        """A turn began; `snapshot()` is what it would record now. A turn still open was never
        sent (the runtime closes every turn it sent): it is forgotten."""
        self._open = snapshot
        self._open_due = asyncio.get_running_loop().time() + self._open_grace
        self._due(self._open_due, for_open=True)

    def touched(self) -> None:
        """The open turn changed (a tool call, a result, the agent's text): saved within DELAY, though
        not before its OPEN_GRACE is over."""
        if self._open is not None:
            self._due(max(asyncio.get_running_loop().time() + self._delay, self._open_due), for_open=True)

    def moved(self) -> None:
        """The session changed: an open turn's saved entry holds its old key. Saved again at once, so
        that a replay never finds it under that key beside the turn it closes as (a duplicate)."""
        if self._open is not None:
            self._changed(0.0)

    def closed(self, obs: NewObservation | None, sync: bool = False) -> None:
        """The open turn ended: as `obs` (its observation, kept until durable), or not recorded. A closed
        turn is saved at once, fsync'd, racing transcript.db's commit: the first of the two answers its wait.
        One not recorded (a command the CLI ran itself) leaves at once too, fsync'd if `sync`: its
        acknowledgement waits for that save (`saved`), so that neither a kill nor a power cut after it
        replays the command as a turn cut short."""
        self._open = None
        if obs is not None and self._stuck:
            self._on_saved([(obs.session_id, obs.sequence_num)], JournalStuck("no journal is written this run"))
            return
        if obs is not None:
            self._closed[(obs.session_id, obs.sequence_num)] = obs
            if len(self._closed) > MAX_CLOSED:
                self._on_full()
        if not self._stuck:  # handed to the files' thread now, not a pass of the loop later
            if self._timer is not None:
                self._timer.cancel()
            self._write(sync)

    def after_save(self, key: Key, then: Callable[[], None]) -> None:
        """Call `then()` once a save holding the closed turn `key` has ended, on disk or failed (at once
        while the journal is stuck: none will)."""
        if self._stuck:
            then()
            return
        self._after[key] = then

    def durable(self, key: Key) -> None:
        if self._closed.pop(key, None) is not None:
            self._changed(self._delay)

    async def flush(self) -> None:
        """At shutdown, once the runtime has stopped: write what is pending, and wait for it. A turn
        still open then was never sent (every turn sent is closed, at worst as cut short). A journal
        left with nothing in it is removed."""
        if self._open is not None:
            self._open = None
            self._changed(self._delay)
        if self._timer is not None:
            self._timer.cancel()
            self._write()
        await self.saved()
        self._shut_down = True
        # A retry of the save awaited above, which failed: its `_saved` has run and set this timer already.
        # `_ended` was added to that future before wrap_future's callback, a concurrent Future calls its
        # callbacks in the order they were added, and each posts to the loop in turn: `_saved` runs before
        # the await above returns. Cancelling it loses nothing: the file keeps what the failed save did not
        # replace, and the next start recovers it. (A `_saved` that came later would see `_shut_down`.)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._closed and not self._stuck:
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(self._executor, self._file.remove)

    async def saved(self) -> None:
        """Wait until the last save handed out has ended, on disk or failed (its failure is the
        `on_saved` callback's to hear)."""
        if self._written is not None:
            with contextlib.suppress(Exception):
                await asyncio.wrap_future(self._written)

    # ------------------------------------------------------------ writing

    def _changed(self, delay: float, for_open: bool = False) -> None:
        """Save within `delay` seconds (sooner if a save is due sooner anyway). `for_open`: only the
        open turn needs it (a save its close may drop). Never while the journal is stuck."""
        self._due(asyncio.get_running_loop().time() + delay, for_open)

    def _due(self, when: float, for_open: bool = False) -> None:
        """Save at the loop's time `when`, or sooner if a save is due sooner anyway. The open turn's saves are
        due at its OPEN_GRACE's end, the very time its first timer was set for: each change in the grace (a
        tool call, the agent's text) then keeps that timer, where a delay measured anew from the loop's clock
        came out a hair earlier than the timer's and replaced it, two or three times a turn (and a cancelled
        timer stays in the loop's heap until its time)."""
        if self._stuck:
            return
        pending = self._timer
        self._for_open = for_open and (pending is None or self._for_open)
        if pending is not None:
            if pending.when() <= when:
                return
            pending.cancel()
        self._timer = asyncio.get_running_loop().call_at(when, self._write)

    def _write(self, sync: bool = False) -> None:
        """Hand the state to the files' thread; fsync'd when a closed turn waits for it, or `sync`."""
        self._timer = None
        loop = asyncio.get_running_loop()
        entries = [Entry(obs, ended=True) for obs in self._closed.values()]
        # A save due for something else (the turn before's close, its commit) that comes inside the open
        # turn's grace leaves it out: a queued message starts right after a close, and the open turn then
        # waits its own grace, as any does, rather than costing this save a snapshot and its close a second.
        early = self._open is not None and loop.time() < self._open_due
        if self._open is not None and not early:
            try:
                entries.append(Entry(self._open(), ended=False))
            except Exception as exc:  # a bug in capture: the journal goes on without the open turn
                log.error("turn_journal_snapshot_failed", error=repr(exc)[:200])
        if early:
            self._due(self._open_due, for_open=True)
        data = msgspec.json.encode(entries) if entries else None
        if data is None and self._empty:
            return  # the file is empty already (or will be, once the saves handed out end)
        self._empty = data is None
        keys = list(self._closed)  # synced only when a closed turn waits for it
        written = self._executor.submit(self._file.save, data, bool(keys) or sync)
        written.add_done_callback(partial(self._ended, loop, keys, self._failures > 0))
        self._written = written

    def _ended(self, loop: asyncio.AbstractEventLoop, keys: list[Key], failing: bool, future: Future[None]) -> None:
        """On the files' thread: the loop hears of a save only when someone waits on it (a closed turn in
        it that is not durable by transcript.db yet, or one `after_save` waits for), it failed, or saves
        were failing (its success ends the retries). The open turn's saves, and a closed turn's that the
        commit beat, wake it for nothing otherwise, and each wake-up from a thread costs the loop the
        GIL's hand-over in the turn. (`_closed` and `_after` are read here, off the loop: a key the loop
        is letting go of at this moment reads as still there, and the save then calls back, harmlessly.)"""
        if (not failing and not future.cancelled() and future.exception() is None
                and not any(k in self._closed or k in self._after for k in keys)):
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: no one is left to tell
            loop.call_soon_threadsafe(self._saved, future, keys)

    def _saved(self, future: Future[None], keys: list[Key]) -> None:
        # A cancelled save (the loop or the files' thread shutting down) may never have run: not saved.
        exc = asyncio.CancelledError("the save was cancelled") if future.cancelled() else future.exception()
        if exc is not None:
            self._empty = None  # the file holds what it did before: the next save is made whatever it holds
            self._failures += 1
            if self._failures == 1:
                self._failing_since = asyncio.get_running_loop().time()
            delay = self._backoff.delay(self._failures, random.random())
            # An outage's start is a warning; its retries (every few seconds on a disk that stays full)
            # are debug: the operator sees it begin, and end (turn_journal_write_recovered).
            log.log(logging.WARNING if self._failures == 1 else logging.DEBUG, "turn_journal_write_failed",
                    error=repr(exc)[:200], failures=self._failures, retry_in_s=round(delay, 2))
            if not self._shut_down:
                self._changed(delay)
        elif self._failures:
            log.info("turn_journal_write_recovered", failed_tries=self._failures,
                     failed_for_s=round(asyncio.get_running_loop().time() - self._failing_since, 2))
            self._failures = 0
        self._on_saved(keys, exc)
        for key in keys:
            if (then := self._after.pop(key, None)) is not None:
                then()
