"""A forget's job in memory.db (`forget_jobs`): the turns' ids and the hashes of the file lines to take
out, never a word; whether it forgot a whole session, and when the daemon's pass first kept it for later
(what /healthz says of it across a restart). Written before any store loses the words, so that a forget a kill cuts short is
finished at the next start; deleted once the daemon's pass has taken the lines out of every file."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from ...database import transaction
from ..audit import record
from ..memory_store import MemoryDB
from .purge import tidy

FORGET_PASS = "forget"  # the reason a forget wakes the daemon with: its file pass alone, backoff or not


class Job(msgspec.Struct, frozen=True):
    id: int
    created_at: float
    observation_ids: list[int]
    sessions: list[str]
    line_hashes: list[str]
    decided: bool = True  # False: the lines the words found, not yet checked against what is kept
    whole_session: bool = False  # the person forgot a whole session (cut short: forgotten again as one)
    kept_since: float | None = None  # when the daemon's pass first kept it for later (wall clock), or None


def add_job(db: MemoryDB, ids: Sequence[int], sessions: Sequence[str], hashes: set[str], now: float, *,
            whole_session: bool = False) -> int:
    """A job whose lines are the words' first guess: undecided until `set_job_lines`. Written before any
    store loses the words: a forget cut short anywhere after this is finished at the next start
    (`TurnForgetting.resume`)."""
    job = Job(0, now, list(ids), list(sessions), sorted(hashes), decided=False, whole_session=whole_session)
    with transaction(db.conn) as c:
        cur = c.execute(_INSERT, _row(job))
    return int(cur.lastrowid or 0)


_INSERT = ("INSERT INTO forget_jobs (created_at, observation_ids, sessions, line_hashes, decided, whole_session, "
           "kept_since) VALUES (?, ?, ?, ?, ?, ?, ?)")


def _row(job: Job) -> tuple[float, str, str, str, int, int, float | None]:
    return job.created_at, json.dumps(job.observation_ids), json.dumps(job.sessions), json.dumps(job.line_hashes), \
        int(job.decided), int(job.whole_session), job.kept_since


def being_forgotten(db: MemoryDB, ids: Sequence[int]) -> list[int]:
    """Which of these turns a forget job names: a forget under way (its tombstone maybe not yet written), or
    one whose lines the daemon's pass has not yet taken out of the files."""
    return sorted(named(db) & set(ids))


def named(db: MemoryDB) -> set[int]:
    """Every turn a forget job names (see being_forgotten)."""
    return {i for job in jobs(db) for i in job.observation_ids}


def set_job_lines(db: MemoryDB, job_id: int, hashes: set[str]) -> None:
    """The job's lines, once decided (they replace the words' first guess)."""
    db.conn.execute("UPDATE forget_jobs SET line_hashes = ?, decided = 1 WHERE id = ?",
                    (json.dumps(sorted(hashes)), job_id))


def decide_current(db: MemoryDB, job_id: int, checked: set[str], found: set[str]) -> None:
    """An undecided job's current files' lines decided (`checked`, of which `found` came from the turns):
    they replace the words' guess there, for the boot prompt and for its pass if it is decided there."""
    row = db.conn.execute("SELECT line_hashes FROM forget_jobs WHERE id = ? AND decided = 0", (job_id,)).fetchone()
    if row is not None:
        db.conn.execute("UPDATE forget_jobs SET line_hashes = ? WHERE id = ?",
                        (json.dumps(sorted((set(json.loads(row[0])) - checked) | found)), job_id))


def jobs(db: MemoryDB) -> list[Job]:
    return jobs_in(db.conn)


def jobs_in(conn: sqlite3.Connection) -> list[Job]:
    """The jobs in the memory.db open on `conn` (a read-only open of one set aside too, which no start has
    migrated: a job from before `decided` counts as undecided, one from before `whole_session` as of turns,
    and one from before `kept_since` as never kept, as the migrations make them)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(forget_jobs)")}
    decided = "decided" if "decided" in columns else "0"
    whole = "whole_session" if "whole_session" in columns else "0"
    kept = "kept_since" if "kept_since" in columns else "NULL"
    found = conn.execute(f"SELECT id, created_at, observation_ids, sessions, line_hashes, {decided}, {whole}, "
                         f"{kept} FROM forget_jobs ORDER BY id").fetchall()
    return [Job(r[0], r[1], json.loads(r[2]), json.loads(r[3]), json.loads(r[4]), bool(r[5]), bool(r[6]), r[7])
            for r in found]


def mark_kept(db: MemoryDB, job_ids: Sequence[int], now: float) -> None:
    """These jobs kept for later by the daemon's pass: when it first did, for those not marked yet."""
    with transaction(db.conn) as c:
        c.executemany("UPDATE forget_jobs SET kept_since = ? WHERE id = ? AND kept_since IS NULL",
                      [(now, job_id) for job_id in job_ids])


class Waiting(NamedTuple):
    """The forgets not finished yet, by the names /healthz's memory.forget and `memory status` both show."""

    jobs_waiting: int
    oldest_job_at: float | None  # when the oldest was made


def waiting(db: MemoryDB) -> Waiting:
    """The jobs not finished yet: being decided, waiting for the daemon's pass, or kept by it for later."""
    return Waiting(*db.conn.execute("SELECT count(*), min(created_at) FROM forget_jobs").fetchone())


def carry_over(db: MemoryDB, unfinished: Sequence[Job]) -> None:
    """Jobs not finished in a memory.db `memory rebuild` set aside, written into the new one (their ids
    new): the next start finishes them (`TurnForgetting.resume`, then the daemon's pass)."""
    with transaction(db.conn) as c:
        c.executemany(_INSERT, [_row(job) for job in unfinished])


def hidden_lines(db: MemoryDB) -> set[str]:
    """The hashes of file lines a pending job may remove (an undecided job's first guess included): the
    boot prompt leaves them out now."""
    return {h for job in jobs(db) for h in job.line_hashes}


def finish_job(db: MemoryDB, job: Job, turns: int, now: float) -> None:
    with transaction(db.conn) as c:
        c.execute("DELETE FROM forget_jobs WHERE id = ?", (job.id,))
    record(db, "forget_turns", now, detail=f"{turns} turn{'s' if turns != 1 else ''} of "
           f"{', '.join(job.sessions)}: their words removed from the files, their history and backups")
    tidy(db.conn)
