"""`sprite-os memory import FILE.jsonl`: past conversations in, through the workspace's one writer.

The file's lines are checked here (a bad line is reported with its number and skipped) and the
good ones written to the import inbox (memory/import_inbox.py). Then whoever writes the
workspace's memory applies them:

- no server runs: this command takes the writer lock, records the turns, and indexes them
  (newest first), so they are searchable when it returns; their vectors are made by the
  server, in the background, newest first, from its next start;
- a server runs (it holds the lock): the server applies the inbox and indexes and embeds the
  turns as it does live ones; this command waits for it and prints its progress, and gives up
  (exit 1, the file left queued) if the server stops first (the lock is free) or writes no new
  report for STALL_WAIT seconds (after a failed attempt, for its longest wait before the next one
  and STALL_WAIT more: every attempt reports, a failed one too); it exits 1 as well, saying so,
  when the server gives up on the file after its attempts kept failing and sets it aside;
- another `memory import` (it applies the inbox itself): this command waits for it, saying so and
  for how long; the other applies this file too if it was queued before it looked, else this one
  takes the lock once it is free and applies it here;
- a holder that takes no imports (`memory rebuild`, `migrate-v1`, `memory rollback`), or one that did
  not say what it is: the turns wait in the inbox for the server's next start, and this command says so;
  unless it lets go within TAKE_WAIT (a rollback's write takes a moment), when this command takes the
  lock and applies them, as after another import.

Who holds the lock is the lock's own answer (fsutil.WriterLock.holder: each holder writes its pid and
role into the lock file).

Only a regular file is read: a FIFO or a device named by mistake is refused at once rather than
read forever.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from pathlib import Path
from typing import TextIO

from ..config import Settings
from ..errors import LockHeld, UsageError
from ..fsutil import WriterLock

TAKE_WAIT = 15.0  # seconds a lock holder has to take the file before it is left queued
WAIT_POLL = 0.2  # how often the command looks at the writer's progress
SHOW_EVERY = 2.0
# Seconds a server that took the file may write no new report before this command gives up waiting (exit 1;
# the file stays queued). Its chunks commit between live turns' writes, each well within this; after a failed
# attempt, the retry's longest wait (IMPORT_RETRY.max) comes on top.
STALL_WAIT = 120.0


def open_regular(path: Path) -> TextIO:
    """The file, for reading text (a BOM is skipped), if it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open would wait for a writer
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise UsageError(f"{path} is {kind}, not a file: memory import reads a JSONL file")
    os.set_blocking(fd, True)
    return open(fd, encoding="utf-8-sig", errors="replace")


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def import_main(settings: Settings, path: Path) -> int:
    from ..memory.import_inbox import write
    from ..memory.importer import ReadReport, read_turns

    source = open_regular(path)
    layout = settings.layout
    layout.ensure()  # a workspace that never served: its memory folder is made here
    found = ReadReport()
    with source:
        inbox, n = write(layout, read_turns(source, found))
    for number, why in found.bad:
        _say(f"{path}:{number}: skipped: {why}")
    status = 1 if found.bad else 0
    if n == 0:
        inbox.unlink(missing_ok=True)
        print(f"imported 0 turns: no line of {path} holds one ({len(found.bad)} bad lines)")
        return status
    lock = WriterLock(layout.memory_lock, WriterLock.IMPORT)
    while True:
        try:
            lock.acquire(wait=False)  # held: _through_writer waits, and says for whom
        except LockHeld:
            code = _through_writer(inbox, found.sessions, len(found.bad), lock)
            if code == _TAKE_OVER:  # the other import is over and left this file: this one applies it
                continue
            return code or status
        try:
            _apply_here(settings, inbox, found.sessions, len(found.bad))
        finally:
            lock.release()
        return status


def _summary(added: int, already: int, sessions: int, bad: int) -> str:
    return f"imported {added} turns from {sessions} sessions ({already} already recorded, {bad} bad lines)"


def _apply_here(settings: Settings, inbox: Path, sessions: set[str], bad: int) -> None:
    """No server runs: this process is the writer. Every inbox file is applied (this one, and any an
    earlier import left), then the new turns indexed."""
    from ..memory.import_inbox import (
        DONE,
        apply_file,
        inbox_files,
        progress_path,
        read_progress,
    )
    from ..memory.memory_store import MemoryDB
    from ..memory.recall.documents import catch_up
    from ..memory.recall.index import RecallIndex
    from ..memory.recall.service import index_path
    from ..memory.transcript_store import TranscriptDB

    layout = settings.layout
    transcript, mine, show = TranscriptDB(layout.transcript_db), read_progress(inbox), Progress()
    try:
        # Another file's done report is its waiting CLI's to remove, never this one's (whether that CLI lives
        # is not known here: its pid may be another pid namespace's); the server's start sweeps an old one.
        for path in inbox_files(layout):
            done = apply_file(transcript, path, lambda p: show("recorded", p.applied, p.turns))
            mine = done if path == inbox else mine
        memory = MemoryDB(layout.memory_db)
        try:
            index = RecallIndex(index_path(layout.memory_dir), writable=True)
            try:
                catch_up(transcript, memory.conn, index, show)
            finally:
                index.close()
        finally:
            memory.close()
    finally:
        transcript.close()
    progress_path(inbox, DONE).unlink(missing_ok=True)
    if mine is None or not mine.done:  # applied by another writer, and its report of it gone (an older version's)
        print(f"these turns were recorded by another writer that held the workspace's memory, which left no "
              f"report of how many were new ({len(sessions)} sessions, {bad} bad lines); searchable now.")
        return
    print(_summary(mine.added, mine.already, len(sessions), bad) + "; searchable now. The server embeds them "
          "from its next start, newest first (`memory status` shows how many wait).")


class Progress:
    """Progress lines on stderr, one every SHOW_EVERY seconds, and the last."""

    def __init__(self) -> None:
        self.shown = 0.0

    def __call__(self, what: str, done: int, of: int) -> None:
        now = time.monotonic()
        if done >= of or now - self.shown >= SHOW_EVERY:
            self.shown = now
            _say(f"  {what}: {done:,} of {of:,}")


_TAKE_OVER = -1  # _through_writer: the lock is free after another import, and this file not applied


def _through_writer(inbox: Path, sessions: set[str], bad: int, lock: WriterLock) -> int:
    """The lock is held: by the server, which takes the file, by another import, which applies it if it
    was queued before it looked and is waited for meanwhile, or by something that takes no imports. Returns
    0 when the file was applied, 3 when nobody took it (it stays queued), _TAKE_OVER when another import let
    go of the lock without it (this one applies it), 1 when the server stopped before it was done (the lock
    free) or wrote no new report for STALL_WAIT seconds, past the retry's longest wait after a failed attempt
    (it stays queued: the server goes on trying)."""
    from ..memory.import_inbox import (
        DONE,
        IMPORT_RETRY,
        MAX_ATTEMPTS,
        SET_ASIDE_SUFFIX,
        progress_path,
        read_progress,
    )

    started, show, said = time.monotonic(), Progress(), None
    holder = last = lock.holder_checked()
    since = started  # when this holder was first seen: a server that wins the lock after another import has TAKE_WAIT
    while (p := read_progress(inbox)) is None:
        if holder is None:  # free: its holder let go, and (looked at again) the file is not taken
            if read_progress(inbox) is not None:
                continue
            # Another import left this file, or a command that takes the lock for a moment (`memory rollback`)
            # or takes no imports let go: this command applies it. Only a server's stop leaves it queued.
            if last is None or last.role not in (WriterLock.SERVER, None):
                return _TAKE_OVER
            return _gave_up(inbox, "the server stopped before it took them")
        waited = time.monotonic() - started
        if holder.role == WriterLock.IMPORT:  # it applies the inbox: this file, or else this command after it
            if said is None or waited - said >= TAKE_WAIT:
                said = waited
                _say(f"another import, {holder.describe()}, holds the workspace's memory: waiting for it to finish "
                     f"({waited:.0f} s so far); these turns are recorded by it or right after it")
        elif time.monotonic() - since > TAKE_WAIT:
            why = "which takes no imports" if holder.role in (WriterLock.REBUILD, WriterLock.MIGRATE,
                                                              WriterLock.ROLLBACK) \
                else f"which has not taken the turns in {TAKE_WAIT:.0f} s"
            print(f"the workspace's memory is held by {holder.describe()}, {why}: they wait in {inbox} and are "
                  "imported when the server next starts")
            return 3
        time.sleep(WAIT_POLL)
        if (holder := lock.holder_checked()) != last:
            since = time.monotonic()
        last = holder or last
    who = last.describe() if last is not None and last.role is not None else "the server"
    _say(f"{who} is recording the turns")
    seen, advanced, error = (p.applied, p.at), time.monotonic(), None
    set_aside = inbox.with_name(inbox.name + SET_ASIDE_SUFFIX)
    while not p.done:
        if set_aside.exists():  # seen by its name: on a full disk the report saying so may fail too
            _say(f"the server gave up after {MAX_ATTEMPTS} failed attempts ({p.error}) and set the file aside as "
                 f"{set_aside}, after recording {p.applied:,} of {p.turns:,}; `memory status` shows it. Rename it back "
                 f"to {inbox.name} to have the server apply it again (a turn already recorded is never recorded "
                 "twice), or remove it")
            return 1
        if p.error and p.error != error:
            _say(f"  the server failed to apply them ({p.error}); it tries again")
        error = p.error
        show("recorded", p.applied, p.turns)
        if (p.applied, p.at) != seen:  # a fresh report: an attempt at work, or one that failed (the server retries)
            seen, advanced = (p.applied, p.at), time.monotonic()
        elif time.monotonic() - advanced > STALL_WAIT + (IMPORT_RETRY.max if p.error else 0.0):
            why = f"it failed ({p.error})" if p.error else "it is busy or stuck"
            return _gave_up(inbox, f"the server recorded none of them for {STALL_WAIT:.0f} s: {why}", stays=True)
        if lock.nobody_holds() and not (p := read_progress(inbox) or p).done:
            return _gave_up(inbox, f"{who} stopped after {p.applied:,} of {p.turns:,}")
        time.sleep(WAIT_POLL)
        p = read_progress(inbox) or p
    then = f"; {who} indexes them before it ends; the server embeds them from its next start" \
        if last is not None and last.role == WriterLock.IMPORT else \
        "; the server indexes them now and embeds them in the background"
    print(_summary(p.added, p.already, len(sessions), bad) + then + ", newest first (`memory status` shows how "
          "many wait).")
    progress_path(inbox, DONE).unlink(missing_ok=True)
    return 0


def _gave_up(inbox: Path, why: str, stays: bool = False) -> int:
    then = "the server goes on trying" if stays else "they are imported when the server next starts"
    _say(f"gave up waiting: {why}. The turns wait in {inbox}; {then} (`memory status` shows them), "
         "and a turn already recorded is never recorded twice")
    return 1
