"""The import inbox: how `memory import` hands its turns to the workspace's one writer.

transcript.db has one writer: the running server, or whoever holds the writer lock. So the
CLI never writes beside a server: it checks the file's lines and writes the good ones, as
fsync'd JSON lines, to `.os/state/imports/<name>.jsonl` (renamed into place once whole),
and the writer applies it:

- the server looks for inbox files every INBOX_POLL seconds and applies one at a time, a chunk a
  transaction on transcript.db's thread (capture's writes go between chunks), writing
  `<name>.progress.json` as it goes and `<name>.done.json` when it is over; the CLI waits
  for that and prints it;
- a CLI that holds the writer lock (no server runs) applies the inbox itself, the same way.

A writer killed mid-file applies it again from the start at its next start: a turn's identity
makes the second pass add only what the first did not. A CLI killed while it wrote its file leaves
`.<name>.partial`, never handed over: the server's start removes it once no live CLI can own it
(`sweep_inbox`), as it removes a `<name>.done.json` a day old (its waiting CLI, which removes it, gone).

A failed attempt (a full disk, a turn transcript.db refuses) is made again after the one backoff
policy's growing wait (IMPORT_RETRY), from where the last one got to: the turns it reported applied
are committed, so they are skipped, not applied again. After MAX_ATTEMPTS failed in a row the file
is set aside as `<name>.jsonl.failed` (its report says why), for the operator: `memory status` names
it, and memory is degraded until it is renamed back (applied again) or removed.

While a file, being written by a live `memory import`, waiting, being applied or set aside, holds turns of a
session (`holding`), a forget of that session is refused as busy: the file's turns would be recorded after it,
words and all.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from ..backoff import Backoff
from ..db_worker import Worker
from ..fsutil import (
    NotDurable,
    atomic_write,
    make_dirs,
    sweep_files,
    sweep_temp_files,
    synced_after_rename,
)
from ..logs import get_logger
from ..paths import Layout
from ..procfs import alive
from .importer import APPLY_CHUNK, ApplyReport, chunks, end_sessions, record
from .transcript_store import ImportedTurn, TranscriptDB

log = get_logger(__name__)

INBOX = "imports"
INBOX_POLL = 1.0
# After a failed attempt at a file (or at reading the inbox), before the next: 5 s, doubling, up to 5 min.
IMPORT_RETRY = Backoff(first=5 * INBOX_POLL, max=300.0)
FAILED_ATTEMPTS_DEGRADED = 2  # failed attempts in a row that make memory degraded (one a retry mends is not)
MAX_ATTEMPTS = 8  # failed attempts in a row at one file (about 10 minutes of them), then it is set aside
SUFFIX, PROGRESS, DONE, SET_ASIDE_SUFFIX = ".jsonl", ".progress.json", ".done.json", ".failed"
SET_ASIDE_ENDING = SUFFIX + SET_ASIDE_SUFFIX  # a file set aside, the writer given up on it: `<name>.jsonl.failed`
# An inbox file's name, `<time>-<pid>-<n>` (the pid: the `memory import` that wrote it), made by
# inbox_name and read by _NAME, side by side. `write` makes `.<name>.partial` (partial_name), holding no
# lock, then renames it `<name>.jsonl`.
_NAME = r"\d{8}T\d{6}-(?P<pid>\d+)-\d{6}"
PARTIAL = re.compile(rf"^\.{_NAME}\.partial$")


def inbox_name(pid: int | None = None, n: int | None = None) -> str:
    """A new inbox file's name, without its ending, as _NAME reads it: the local time to the second, the pid
    of the `memory import` writing it (this process's by default), and 6 digits telling apart two names made
    the same second (the monotonic clock's nanoseconds by default)."""
    n = time.monotonic_ns() if n is None else n
    return f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid() if pid is None else pid}-{n % 10**6:06d}"


def partial_name(name: str) -> str:
    """The name an inbox file has while `write` writes it (PARTIAL reads it)."""
    return f".{name}.partial"


# A `.partial` unwritten this long, whose writer's pid is no process here, is a killed CLI's: swept at the
# server's start. A live CLI writes it without a pause (a regular file, read through, fsync'd, renamed).
PARTIAL_STALE = 3600.0
# A done report is its waiting CLI's to remove (no writer removes another's: its pid may be another namespace's);
# one older than this, whose CLI is long gone, is swept at the server's start.
DONE_STALE = 86400.0


class Progress(msgspec.Struct):
    """An inbox file as its writer reports it."""

    name: str
    turns: int  # in the file
    applied: int = 0
    added: int = 0
    already: int = 0
    done: bool = False
    error: str | None = None
    at: float = 0.0


def inbox_dir(layout: Layout) -> Path:
    return layout.state_dir / INBOX


def inbox_files(layout: Layout, ending: str = SUFFIX) -> list[Path]:
    """The inbox's files whose names end with `ending`, oldest first: those not yet applied (SUFFIX),
    or those set aside (SET_ASIDE_ENDING: given up on, the operator's to deal with)."""
    with contextlib.suppress(FileNotFoundError):
        return sorted(p for p in inbox_dir(layout).iterdir() if p.name.endswith(ending))
    return []


def write(layout: Layout, turns: Iterable[ImportedTurn]) -> tuple[Path, int]:
    """The turns as a new inbox file (whole or not at all). Returns its path and how many it holds."""
    folder = inbox_dir(layout)
    make_dirs(folder)  # its name synced into .os/state/ when it is new
    name = inbox_name()
    partial, final = folder / partial_name(name), folder / f"{name}{SUFFIX}"
    encoder, n = msgspec.json.Encoder(), 0
    try:
        with partial.open("wb") as f:
            for turn in turns:
                f.write(encoder.encode(turn) + b"\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.chmod(partial, 0o600)
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    try:
        synced_after_rename(final)  # the file's name survives a power loss, not just its bytes
    except NotDurable as exc:  # it is in the inbox and is applied; only a power loss now could lose it
        log.warning("import_inbox_not_durable", file=final.name, error=str(exc))
    return final, n


def writer_alive(name: str) -> bool | None:
    """For a `.partial` file's name: whether the `memory import` writing it (its pid, in the name) is a process
    here. None: the name is not a `.partial`'s."""
    return alive(int(m["pid"])) if (m := PARTIAL.match(name)) else None


def sweep_inbox(layout: Layout, now: float | None = None) -> list[Path]:
    """Remove the `.partial` files that a `memory import` killed before its rename left: never handed
    over, so no writer applies them, and nothing else ever removes them. Only one that no live CLI can
    own: its writer's pid (in its name) is no process here, and nothing has written it for PARTIAL_STALE
    seconds (a pid from another pid namespace means nothing here; a live writer never pauses that long).
    A CLI that wakes after its file was swept fails its rename and says so: nothing is lost unsaid.
    And the done reports DONE_STALE old: their waiting CLIs, which remove them, are gone. One it cannot
    remove stays. Returns what it removed."""
    now = time.time() if now is None else now

    def stale(entry: os.DirEntry[str]) -> bool:
        if entry.name.endswith(DONE):  # a report no waiting CLI took (it was killed, or in another namespace)
            return now - entry.stat(follow_symlinks=False).st_mtime > DONE_STALE
        if (writer := writer_alive(entry.name)) is not None:
            return now - entry.stat(follow_symlinks=False).st_mtime > PARTIAL_STALE and not writer
        return False

    return sweep_files(inbox_dir(layout), stale)


def read(path: Path) -> Iterator[ImportedTurn]:
    decoder = msgspec.json.Decoder(ImportedTurn)
    with path.open("rb") as f:
        for line in f:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):  # a torn line: never written whole
                yield decoder.decode(line)


def count(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


class _Place(msgspec.Struct, array_like=True):
    """An inbox line's session and time alone (an ImportedTurn is a JSON array, its session then its time first):
    the place a turn imported from it is recorded at."""

    session_id: str
    timestamp: float


def holding(layout: Layout, session_id: str | None = None, *, places: Collection[tuple[str, float]] = (),
            unreadable: bool = True) -> list[Path]:
    """The inbox files, being written by a live `memory import`, waiting or set aside, with a turn of
    `session_id`, or at one of `places` (a recorded turn's session and time): a turn not recorded yet (or recorded again when
    a file set aside is renamed back), which a forget of that session would miss; or one recorded already, whose
    words the file keeps on disk until it is applied (a file set aside: until the operator renames it back or
    removes it). A file that can't be read may hold one, and is counted unless `unreadable` is False (the
    turns at `places` cannot have come from an import). Those being written first: one renamed meanwhile is
    found under its new name."""
    wanted = set(places)
    decoder, out = msgspec.json.Decoder(_Place), []
    for path in [*_being_written(layout), *inbox_files(layout), *inbox_files(layout, SET_ASIDE_ENDING)]:
        try:
            with path.open("rb") as f:
                if any(at is not None and (at.session_id == session_id or (at.session_id, at.timestamp) in wanted)
                       for at in (_of(decoder, line) for line in f)):
                    out.append(path)
        except FileNotFoundError:  # applied (or removed) meanwhile
            continue
        except OSError:
            if unreadable:
                out.append(path)
    return out


def _being_written(layout: Layout) -> list[Path]:
    """The `.partial` files a `memory import` still running writes (its pid, in the name, a process here): it
    renames each into the inbox once written."""
    with contextlib.suppress(FileNotFoundError):
        return sorted(p for p in inbox_dir(layout).iterdir() if writer_alive(p.name))
    return []


def _of(decoder: msgspec.json.Decoder[_Place], line: bytes) -> _Place | None:
    try:
        return decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError):  # a torn line: never written whole, never applied
        return None


def progress_path(path: Path, kind: str) -> Path:
    return path.with_name(path.name.removesuffix(SET_ASIDE_SUFFIX).removesuffix(SUFFIX) + kind)


def report(path: Path, p: Progress) -> None:
    atomic_write(progress_path(path, DONE if p.done else PROGRESS), msgspec.json.encode(p))


def finish(path: Path, p: Progress) -> None:
    """The file is applied: say so, and take it out of the inbox."""
    p.done, p.at = True, time.time()
    report(path, p)
    path.unlink(missing_ok=True)
    progress_path(path, PROGRESS).unlink(missing_ok=True)


def read_progress(path: Path) -> Progress | None:
    """The writer's last word on an inbox file: done, in progress, or nothing yet."""
    for kind in (DONE, PROGRESS):
        with contextlib.suppress(OSError, msgspec.DecodeError, msgspec.ValidationError):
            return msgspec.json.decode(progress_path(path, kind).read_bytes(), type=Progress)
    return None


class Tally:
    """One inbox file's application, chunk by chunk: its progress, and each session's last turn."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.progress = Progress(path.name, count(path))
        self.totals = ApplyReport()
        self.last: dict[str, float] = {}

    def chunks(self) -> Iterator[list[ImportedTurn]]:
        """The turns not yet applied: all of them, or those after where an attempt that failed got to
        (what it reported applied is committed; the sessions they touched are known already)."""
        return chunks(itertools.islice(read(self.path), self.progress.applied, None), APPLY_CHUNK)

    def applied(self, chunk: list[ImportedTurn], ids: list[int | None]) -> Progress:
        record(self.totals, chunk, ids, self.last)
        p = self.progress
        p.applied, p.added, p.already, p.at = self.totals.turns, self.totals.added, self.totals.already, time.time()
        report(self.path, p)
        return p


def apply_file(transcript: TranscriptDB, path: Path, on_progress: Callable[[Progress], None] | None = None) -> Progress:
    """Apply one inbox file here (the caller is the writer: it holds the lock)."""
    tally = Tally(path)
    for chunk in tally.chunks():
        p = tally.applied(chunk, transcript.import_turns(chunk))
        if on_progress:
            on_progress(p)
    end_sessions(transcript, tally.last)
    finish(path, tally.progress)
    return tally.progress


class _Retries:
    """One inbox file's failed attempts in a row: when the next is due (time.monotonic()), and where the
    last one got to (its Tally, resumed by the next; None: the file could not be counted)."""

    def __init__(self) -> None:
        self.failures = 0
        self.due = 0.0
        self.tally: Tally | None = None


class ImportInbox:
    """The server's side: one task applies inbox files through transcript.db's thread, and tells the
    indexer each time turns land."""

    def __init__(self, layout: Layout, transcript: Worker[TranscriptDB], landed: Callable[[], None]) -> None:
        self.layout, self.transcript, self.landed = layout, transcript, landed
        self.current: Progress | None = None
        self.failing: int = 0  # attempts failed in a row
        self.failure: str | None = None  # the last one's error, until an attempt succeeds
        self._retries: dict[str, _Retries] = {}  # by file name: those whose last attempt failed
        self._set_aside_at: dict[str, float] = {}  # the files this task set aside (their names now), and when
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="import-inbox")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        """Never ends on an error: a failure (the inbox unreadable, a full disk that also fails the
        report saying so) is logged and tried again after IMPORT_RETRY's wait, and `status()` shows it."""
        swept = False
        while True:
            try:
                if not swept:
                    # What a kill between a progress report's temp file and its rename left (the server,
                    # holding the workspace's lock, is the inbox's one applier), a killed CLI's `.partial`,
                    # and the done reports a day old that no waiting CLI took.
                    await asyncio.to_thread(sweep_temp_files, inbox_dir(self.layout),
                                            lambda n: n.endswith((PROGRESS, DONE)))
                    if swept_files := await asyncio.to_thread(sweep_inbox, self.layout):
                        log.warning("import_inbox_swept", files=[p.name for p in swept_files])
                    swept = True
                ok = True
                files = await asyncio.to_thread(inbox_files, self.layout)
                self._retries = {p.name: r for p in files if (r := self._retries.get(p.name)) is not None}
                for path in files:
                    if (retries := self._retries.get(path.name)) is not None and retries.due > time.monotonic():
                        ok = False  # its failure stands while it waits for its next attempt
                        continue
                    ok = await self._attempt(path) and ok
                if ok:
                    self.failing, self.failure = 0, None
            except Exception as exc:  # the inbox itself unreadable (EIO): looked at again after a pause
                log.exception("import_inbox_failed", error=repr(exc)[:300])
                self._failed(exc)
                await asyncio.sleep(IMPORT_RETRY.delay(self.failing, random.random()))
            await asyncio.sleep(INBOX_POLL)

    def _failed(self, exc: BaseException) -> None:
        self.failing, self.failure = self.failing + 1, repr(exc)[:300]

    async def _attempt(self, path: Path) -> bool:
        """Apply one inbox file; False if it failed: the file stays, for an attempt after IMPORT_RETRY's
        wait from where this one got to, or is set aside after MAX_ATTEMPTS failed in a row."""
        retries = self._retries.setdefault(path.name, _Retries())
        try:
            await self._apply(path, retries)
            del self._retries[path.name]
            return True
        except Exception as exc:
            retries.failures += 1
            log.exception("import_failed", file=path.name, error=repr(exc)[:300], attempts=retries.failures)
            self._failed(exc)
            if retries.failures >= MAX_ATTEMPTS and await self._set_aside(path, retries):
                return False
            retries.due = time.monotonic() + IMPORT_RETRY.delay(retries.failures, random.random())
            if (p := self.current) is not None:
                p.error, p.at, p.done = self.failure, time.time(), False
                await self._report(path, p)
            return False
        finally:
            self.current = None

    async def _report(self, path: Path, p: Progress) -> None:
        try:  # on the same full disk this fails too: logged, and status() still says it
            await asyncio.to_thread(report, path, p)
        except OSError as again:
            log.warning("import_report_failed", file=path.name, error=repr(again)[:300])

    async def _set_aside(self, path: Path, retries: _Retries) -> bool:
        """Give up on a file whose attempts keep failing: renamed to `<name>.jsonl.failed`, for the operator
        (then its report, if the disk takes it, says why). False: it could not be renamed (tried again)."""
        set_aside = path.with_name(path.name + SET_ASIDE_SUFFIX)
        try:
            await asyncio.to_thread(os.replace, path, set_aside)
        except OSError as exc:
            log.warning("import_set_aside_failed", file=path.name, error=repr(exc)[:300])
            return False
        del self._retries[path.name]
        self._set_aside_at[set_aside.name] = time.time()
        p = retries.tally.progress if retries.tally is not None else Progress(path.name, 0)
        p.error, p.at, p.done = self.failure, time.time(), False
        await self._report(path, p)
        log.error("import_set_aside", file=path.name, aside=set_aside.name, attempts=retries.failures,
                  applied=p.applied, error=self.failure,
                  hint="its turns past those applied are not recorded: rename it back to apply it again, or remove it")
        return True

    async def _apply(self, path: Path, retries: _Retries) -> None:
        if retries.tally is None:
            retries.tally = await asyncio.to_thread(Tally, path)
        tally = retries.tally
        tally.progress.error = None  # said again if this attempt fails too
        self.current = tally.progress
        await asyncio.to_thread(report, path, tally.progress)  # taken: the CLI stops waiting for a writer
        chunks = await asyncio.to_thread(tally.chunks)
        while chunk := await asyncio.to_thread(next, chunks, None):
            ids = await self.transcript.call(partial(TranscriptDB.import_turns, turns=chunk))
            await asyncio.to_thread(tally.applied, chunk, ids)
            if any(i is not None for i in ids):
                self.landed()
        await self.transcript.call(partial(end_sessions, last=tally.last))
        p = tally.progress
        await asyncio.to_thread(finish, path, p)
        log.info("import_applied", file=path.name, turns=p.applied, added=p.added, already=p.already)

    def set_aside_files(self, listed: list[str], listed_at: float | None) -> list[str]:
        """The files set aside: as a listing of the folder begun at `listed_at` found them, and those this
        task set aside since it began (a listing that hangs, or fails, would not show them; one begun after
        is believed: the operator may have renamed a file back)."""
        self._set_aside_at = {name: at for name, at in self._set_aside_at.items()
                              if listed_at is None or at >= listed_at}
        return sorted({*listed, *self._set_aside_at})

    def status(self, set_aside: list[str]) -> dict[str, Any] | None:
        """The file being applied, the failure while attempts fail, and the files given up on, `set_aside`: as
        the caller's last listing of the folder, off the loop, found them, with those this inbox set aside since
        (MemorySystem.set_aside; the listing may be older when one is slow or fails) (None: nothing to say)."""
        p = self.current
        out: dict[str, Any] = {} if p is None else {"file": p.name, "turns": p.turns, "applied": p.applied,
                                                    "added": p.added, "already": p.already}
        if set_aside:
            out.update(set_aside=set_aside, degraded=True,
                       error=f"set aside after {MAX_ATTEMPTS} failed attempts: .os/state/{INBOX}/{set_aside[0]}")
        if self.failure is not None:
            out.update(failing=self.failing, error=self.failure,
                       degraded=self.failing >= FAILED_ATTEMPTS_DEGRADED or bool(set_aside))
        return out or None
