"""`memory rebuild`: throw away what the curator made and make it again from transcript.db.

transcript.db is the source of truth, so memory.db and the curated files can
always be rebuilt. The old memory.db is kept beside the new one, and the
curated files' current versions stay in their history. Batches are replayed
with the same turn groupings as before, so the same curator replies rebuild
the same learnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

from ...config import Settings
from ...database import read_only
from ...db_worker import Worker
from ...errors import CuratorError, LockHeld, SpriteOSError
from ...fsutil import WriterLock, atomic_write
from ...logs import get_logger
from ..files import CURATED, MemoryFiles
from ..forget.jobs import Job, carry_over, jobs_in, named
from ..forget.learnings import forget_again, forgotten_keys
from ..memory_store import MemoryDB
from ..processor import BatchProcessor, CuratorClient
from ..schema import PENDING
from ..transcript_store import Observation, TranscriptDB
from .curator import split_batch
from .retry import CURATOR_BACKOFF

log = get_logger(__name__)

ATTEMPTS = 4  # calls per batch, then the rebuild stops (it can be run again)
CURATOR_RETRY = CURATOR_BACKOFF  # the same curator as the daemon's, the same waits


@dataclass
class RebuildReport:
    observations: int
    batches: int
    learnings: int
    backup: Path | None
    cost_usd: float
    # The memory.db whose record the rebuilt one takes on (which turn each kept vector was made after):
    # `backup`, or the one before an earlier rebuild that did not finish.
    before: Path | None = None
    forgets: int = 0  # forgets not finished, carried over: their turns left out, the next start finishes them


UNFINISHED = "rebuild-unfinished"  # beside memory.db: names the memory.db an unfinished rebuild set aside


class MemoryDbUnreadable(SpriteOSError):
    """A memory.db the rebuild must read is there but can't be read (a damaged page or header): refused,
    nothing set aside or rebuilt, since rebuilding would bring back what was forgotten in it. The caller
    says how to go on anyway (`rebuild(..., forgotten_unreadable_ok=True)`). `from_unfinished`: it is the
    copy an unfinished rebuild set aside."""

    def __init__(self, path: Path, error: str, *, from_unfinished: bool = False, step: str = "read") -> None:
        what = f"{path}, the memory.db from before a rebuild that did not finish" if from_unfinished else str(path)
        said = ("rebuilding would bring back the learnings forgotten in it, and send the turns of a forget not "
                "finished in it to the curator" if step == "read"
                else "nothing was set aside or rebuilt")
        super().__init__(f"cannot read {what} ({error}): {said}. Restore a readable copy at {path}")
        self.path, self.from_unfinished = path, from_unfinished


def _unfinished(memory_db: Path) -> Path | None:
    """The memory.db as it was before a rebuild that did not finish (the curator down past its retries,
    a kill -9): what was forgotten is there for certain (a kill between a batch and its forgetting
    again leaves it learned in the half-made memory.db). A marker naming a file that is gone is refused:
    starting from the half-made memory.db could bring a forgotten memory back."""
    marker = memory_db.with_name(UNFINISHED)
    try:
        name = marker.read_text().strip()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SpriteOSError(f"cannot read {marker} ({exc}), left by a rebuild that did not finish") from None
    before = memory_db.with_name(name) if name and "/" not in name else None
    if before is None or not before.name.startswith(f"{memory_db.name}.before-rebuild-") or not before.exists():
        raise SpriteOSError(
            f"{marker} names {name!r}, the memory.db from before a rebuild that did not finish, and it is "
            f"not in {memory_db.parent}: put it back there, or remove {UNFINISHED} to rebuild from the "
            "half-made memory.db (a memory forgotten before then may come back)")
    return before


class Before(NamedTuple):
    """What the rebuild takes from the memory.db it replaces."""

    groups: list[list[int]]  # the turn groupings of its batches, in order
    forgotten: dict[str, float]  # the learnings a person forgot: content_key -> forgotten_at
    forgets: list[Job]  # forgets not finished (cut short, or their file pass still to come)


def _read_before(path: Path, set_aside: bool) -> Before:
    """What the rebuild takes from the memory.db at `path`: the turn groupings of the batches it
    recorded (not failed calls, and not superseded batches: a person's edit made their turns run
    again, grouped anew), what a person forgot in it, and its forgets not finished. Nothing of a file
    that is not there, or older than batches and forgetting; sqlite3.Error: it is there and can't be read."""
    if not path.exists():
        return Before([], {}, [])
    with contextlib.closing(read_only(path, set_aside=set_aside)) as conn:
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = conn.execute("SELECT observation_ids FROM batches WHERE status NOT IN ('failed', 'superseded')"
                            " ORDER BY id").fetchall() if "batches" in tables else []
        return Before([json.loads(r[0]) for r in rows], forgotten_keys(conn),
                      jobs_in(conn) if "forget_jobs" in tables else [])


def read_before(memory_db: Path, unfinished: Path | None, *, unreadable_ok: bool = False) -> Before:
    """The earlier batches' turn groupings (the set-aside copy's, after an unfinished rebuild: it is the
    whole record), what a person forgot, which stays forgotten (the rebuild forgets it again after
    each batch), and the forgets not finished, whose jobs the new memory.db takes on (a forget on the
    half-made memory.db of an unfinished rebuild included), from memory.db and the copy an unfinished
    rebuild set aside. One rule for a file that is there but can't be read (a damaged page): refused
    (MemoryDbUnreadable), unless `unreadable_ok` (then logged): the rebuild would curate every turn
    again and forget nothing."""
    groups: list[list[int]] = []
    forgotten: dict[str, float] = {}
    forgets: dict[tuple[float, tuple[int, ...]], Job] = {}  # one job, read from both copies, is carried once
    for path, set_aside in ((memory_db, False), (unfinished, True)):
        if path is None:
            continue
        try:
            found = _read_before(path, set_aside)
        except sqlite3.Error as exc:
            if not unreadable_ok:
                raise MemoryDbUnreadable(path, str(exc), from_unfinished=set_aside) from None
            log.warning("rebuild_memory_db_unreadable", path=str(path), error=str(exc))
            continue
        if set_aside or unfinished is None:
            groups = found.groups
        forgotten.update(found.forgotten)
        forgets.update({(job.created_at, tuple(job.observation_ids)): job for job in found.forgets})
    return Before(groups, forgotten, list(forgets.values()))


def _checkpointed(path: Path, unreadable_ok: bool) -> bool:
    """Fold memory.db's WAL into it, so that it is whole on its own once set aside. False: it can't be
    read (a damaged header: "file is not a database"), and its -wal and -shm go aside with it. Looked at
    read-only first: closing a writable connection to such a file deletes its -wal and -shm."""
    try:
        with contextlib.closing(read_only(path)) as probe:
            probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except sqlite3.DatabaseError as exc:
        if not unreadable_ok:  # read as readable a moment ago, when what was forgotten was
            raise MemoryDbUnreadable(path, str(exc), step="checkpoint") from None
        log.warning("rebuild_set_aside_unreadable", path=str(path), error=str(exc))
        return False
    return True


def _set_aside(path: Path, mark: bool, unreadable_ok: bool = False) -> Path | None:
    """Rename memory.db aside for the rebuild. `mark`: first name it in the marker an unfinished rebuild
    leaves (UNFINISHED), which must be written before anything is set aside (a full disk: nothing is).
    One that can't be read (`unreadable_ok`) is set aside with its -wal and -shm, never without them:
    its WAL may hold what an operator's recovery needs."""
    if not path.exists():
        return None
    whole = _checkpointed(path, unreadable_ok)
    stamp = time.strftime('%Y%m%dT%H%M%S')
    backup, n = path.with_name(f"{path.name}.before-rebuild-{stamp}"), 1
    while backup.exists():  # a rebuild run again within the second: the copy set aside before it stays
        backup, n = path.with_name(f"{path.name}.before-rebuild-{stamp}-{n}"), n + 1
    marker = path.with_name(UNFINISHED)
    if mark:
        try:
            atomic_write(marker, backup.name.encode())
        except OSError as exc:
            raise SpriteOSError(f"cannot write {marker} ({exc}): nothing was set aside or rebuilt") from None
    try:
        path.rename(backup)
    except OSError:
        if mark:
            marker.unlink(missing_ok=True)
        raise
    for suffix in ("-wal", "-shm"):
        beside = Path(f"{path}{suffix}")
        if whole:
            beside.unlink(missing_ok=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                beside.rename(f"{backup}{suffix}")  # SQLite finds them by its name: they stay a pair
    return backup


async def _groups(transcript: Worker[TranscriptDB], previous: list[list[int]], held: set[int],
                  batch_turns: int) -> AsyncIterator[list[Observation]]:
    """The turns to curate, a batch at a time and never all in memory: first each earlier
    batch's turns (so the same replies rebuild the same learnings), then the rest in order; none of
    `held` (a forget's)."""
    for ids in previous:
        group = [o for o in await transcript.call(partial(TranscriptDB.get, ids=ids))
                 if o.processed == PENDING and o.id not in held]
        for chunk in split_batch(group):
            yield chunk
    while rest := await transcript.call(lambda t: t.pending(batch_turns, leaving_out=held)):
        for chunk in split_batch(rest):
            yield chunk


async def rebuild(settings: Settings, *, forgotten_unreadable_ok: bool = False) -> RebuildReport:
    """`forgotten_unreadable_ok`: go on when memory.db can't be read (what was forgotten in it comes back)."""
    layout = settings.layout
    lock = WriterLock(layout.memory_lock, WriterLock.REBUILD)
    try:
        lock.acquire()  # refuses while the server (or another rebuild) holds it
    except LockHeld as exc:
        raise LockHeld(f"{exc}: stop the server before rebuilding") from None
    try:
        unfinished = _unfinished(layout.memory_db)  # the one before an earlier rebuild that did not finish
        # The copy an unfinished rebuild set aside is read as one: nothing is left beside it, and
        # whatever is there (an operator's sqlite3 reading it) is not this rebuild's to remove.
        before = read_before(layout.memory_db, unfinished, unreadable_ok=forgotten_unreadable_ok)
        backup = _set_aside(layout.memory_db, mark=unfinished is None, unreadable_ok=forgotten_unreadable_ok)
        files = MemoryFiles(layout)
        for name in CURATED:
            _clear(files, name)
        transcript: Worker[TranscriptDB] = Worker("transcript", lambda: TranscriptDB(layout.transcript_db))
        memory: Worker[MemoryDB] = Worker("memory", lambda: MemoryDB(layout.memory_db))
        curator = CuratorClient(settings)
        processor = BatchProcessor(transcript, memory, files, curator)
        try:
            # First: a rebuild cut short leaves a memory.db a server may start on, which finishes them.
            await memory.call(lambda m: carry_over(m, before.forgets))
            # The turns those forgets name, as every reader of memory.db finds them (`named`: the boot prompt,
            # the recall made again): curated by no batch of the rebuild, their words may be in them still.
            held = await memory.call(named)
            if before.forgets:
                log.info("rebuild_forgets_carried", forgets=len(before.forgets), turns=len(held))
            await transcript.call(lambda t: t.reset_all_pending())
            total = await transcript.call(lambda t: t.counts()["total"])
            cost, batches, turns = 0.0, 0, 0
            async for group in _groups(transcript, before.groups, held, settings.memory_batch_turns):
                cost += await _with_retries(processor, group)
                # After every batch, not once at the end: a rebuild cut short leaves a memory.db a
                # server may start on before the rebuild runs again, and it must not recall the forgotten.
                await memory.call(lambda m: forget_again(m, before.forgotten))
                batches, turns = batches + 1, turns + len(group)
                log.info("rebuild_progress", batch=batches, turns=turns, of=total)
            layout.memory_db.with_name(UNFINISHED).unlink(missing_ok=True)
            learnings = await memory.call(lambda m: m.totals()["learnings"])
            return RebuildReport(turns, batches, learnings, backup, cost, unfinished or backup, len(before.forgets))
        finally:
            await curator.close()
            await asyncio.gather(transcript.close(), memory.close())
    finally:
        lock.release()


def _clear(files: MemoryFiles, name: str) -> None:
    """Keep the current text as a version, then remove the file: the curator starts afresh."""
    files.snapshot(name, source="before-rebuild")
    files.path(name).unlink(missing_ok=True)


async def _with_retries(processor: BatchProcessor, group: list[Observation]) -> float:
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return (await processor.process(group, "rebuild")).cost_usd
        except CuratorError as exc:
            if attempt == ATTEMPTS:
                raise CuratorError(f"rebuild stopped at turn #{group[0].id}: {exc}") from exc
            await asyncio.sleep(CURATOR_RETRY.delay(attempt, random.random()))
    raise AssertionError("unreachable")
