"""The two memory databases: schemas, typed rows, and the thread that owns each connection.

`transcript.db` is the black-box recorder: one row per agent turn, append-only
(triggers refuse any change to a recorded turn; only its `processed` state
moves). `memory.db` holds what the curator extracted: learnings with an FTS5
index kept in sync by triggers, pending actions, and one row per curator batch.

The classes here are synchronous and own one connection each. In the server,
each lives on its own thread behind a `Worker`, so the event loop never waits
on SQLite; the operator commands use them directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import heapq
import json
import math
import re
import sqlite3
import time
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import msgspec
import sqlite_utils

BUSY_TIMEOUT_MS = 5000

# observations.processed
PENDING, PROCESSED, STALE = 0, 1, 2

SEARCH_CANDIDATES = 300  # matches read per query term (see MemoryDB.search)
BM25_MATCHES = 600  # up to this many matches in all, FTS5's bm25() ranks them

LearningType = Literal["FACT", "PATTERN", "CORRECTION", "PREFERENCE", "ACTION", "TOOL_INSTALL"]
LEARNING_TYPES: tuple[str, ...] = ("FACT", "PATTERN", "CORRECTION", "PREFERENCE", "ACTION", "TOOL_INSTALL")


def connect(path: Path) -> sqlite3.Connection:
    """Open a database with WAL and a busy timeout, as both databases need."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # durable at each commit under WAL except on power loss
    return conn


class transaction:
    """`with tx(conn):` -- BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.conn.execute("ROLLBACK" if exc_type else "COMMIT")


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _migrate(conn: sqlite3.Connection, steps: Sequence[Callable[[sqlite_utils.Database], None]]) -> None:
    """Run each schema step past PRAGMA user_version, each in its own transaction.
    Steps are idempotent, so a migration interrupted part-way simply runs again."""
    db = sqlite_utils.Database(conn)
    for version, step in enumerate(steps, start=1):
        if _user_version(conn) >= version:
            continue
        with transaction(conn):
            step(db)
            conn.execute(f"PRAGMA user_version={version}")


# ---------------------------------------------------------------- typed rows


class Observation(msgspec.Struct, frozen=True):
    """One agent turn: the user's message, the tools it ran, and its final response."""

    id: int
    timestamp: float
    session_id: str
    sequence_num: int
    user_message: str
    tool_calls_json: str
    agent_response: str
    processed: int = PENDING


class NewObservation(msgspec.Struct, frozen=True):
    timestamp: float
    session_id: str
    sequence_num: int
    user_message: str
    tool_calls_json: str
    agent_response: str


class SessionRow(msgspec.Struct, frozen=True):
    id: str
    started_at: float
    ended_at: float | None
    message_count: int
    observation_count: int


class Learning(msgspec.Struct, frozen=True):
    id: int
    created_at: float
    session_id: str | None
    type: str
    content: str
    source_observation_id: int | None
    confidence: float


class NewLearning(msgspec.Struct, frozen=True):
    type: str
    content: str
    session_id: str | None = None
    source_observation_id: int | None = None
    confidence: float = 0.8


class PendingAction(msgspec.Struct, frozen=True):
    id: int
    created_at: float
    content: str
    priority: int
    status: str
    source_learning_id: int | None


class SearchHit(msgspec.Struct, frozen=True):
    id: int
    type: str
    content: str
    created_at: float
    confidence: float
    score: float  # higher is better


class Batch(msgspec.Struct, frozen=True):
    """One curator call and what it produced.

    `status`: failed (nothing stored) | committed (learnings stored, files not yet
    written) -> applied (files written) -> done (its observations marked processed)
    | committed -> superseded (a person edited a file it rewrites after the batch read
    it: its learnings and other files stand, its observations stay pending and run
    again in a new batch; never finished by recovery, never replayed by a rebuild).
    """

    id: int
    created_at: float
    trigger: str
    status: str
    observation_ids: list[int]
    model: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    learnings_added: int
    file_updates: dict[str, str]
    base_hashes: dict[str, str]
    error: str | None


def _rows(cursor: sqlite3.Cursor, cls: type[msgspec.Struct]) -> list[Any]:
    names = [d[0] for d in cursor.description]
    return [cls(**dict(zip(names, row, strict=True))) for row in cursor.fetchall()]


# ---------------------------------------------------------------- transcript.db


def _transcript_v1(db: sqlite_utils.Database) -> None:
    db["observations"].create(
        {
            "id": int,
            "timestamp": float,
            "session_id": str,
            "sequence_num": int,
            "user_message": str,
            "tool_calls_json": str,
            "agent_response": str,
            "processed": int,
        },
        pk="id",
        not_null={"timestamp", "session_id", "sequence_num", "user_message", "tool_calls_json", "agent_response"},
        defaults={"processed": PENDING},
        if_not_exists=True,
    )
    # A turn is recorded once: the Stop hook and the ResultMessage may both try.
    db["observations"].create_index(["session_id", "sequence_num"], unique=True, if_not_exists=True)
    db["observations"].create_index(["processed", "id"], if_not_exists=True)
    db["sessions"].create(
        {"id": str, "started_at": float, "ended_at": float, "message_count": int, "observation_count": int},
        pk="id",
        defaults={"message_count": 0, "observation_count": 0},
        if_not_exists=True,
    )
    create_observation_triggers(db.conn)


OBSERVATION_TRIGGERS = ("observations_append_only", "observations_no_delete")


def create_observation_triggers(conn: sqlite3.Connection) -> None:
    """A recorded turn is never changed or deleted (only `processed` moves). Shared with
    migrate-v1, which drops them for one transaction to clear its own partial copy."""
    conn.execute(
        """CREATE TRIGGER IF NOT EXISTS main.observations_append_only
        BEFORE UPDATE OF id, timestamp, session_id, sequence_num, user_message, tool_calls_json,
            agent_response ON observations
        BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END"""
    )
    conn.execute(
        """CREATE TRIGGER IF NOT EXISTS main.observations_no_delete BEFORE DELETE ON observations
        BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END"""
    )


TRANSCRIPT_SCHEMA = (_transcript_v1,)


class TranscriptDB:
    """transcript.db: the raw turns, hooks write and the curator reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = connect(path)
        _migrate(self.conn, TRANSCRIPT_SCHEMA)

    def close(self) -> None:
        self.conn.close()

    @property
    def schema_version(self) -> int:
        return _user_version(self.conn)

    def append(self, obs: NewObservation) -> int | None:
        """Record a turn. Returns its id, or None if that turn was already recorded."""
        with transaction(self.conn) as c:
            cur = c.execute(
                """INSERT OR IGNORE INTO observations
                (timestamp, session_id, sequence_num, user_message, tool_calls_json, agent_response)
                VALUES (?, ?, ?, ?, ?, ?)""",
                (obs.timestamp, obs.session_id, obs.sequence_num, obs.user_message,
                 obs.tool_calls_json, obs.agent_response),
            )
            if cur.rowcount == 0:
                return None
            c.execute(
                """INSERT INTO sessions (id, started_at, message_count, observation_count)
                VALUES (?, ?, 1, 1)
                ON CONFLICT(id) DO UPDATE SET message_count = message_count + 1,
                    observation_count = observation_count + 1""",
                (obs.session_id, obs.timestamp),
            )
            return cur.lastrowid

    def start_session(self, session_id: str, started_at: float) -> None:
        self.conn.execute(
            "INSERT OR IGNORE INTO sessions (id, started_at) VALUES (?, ?)", (session_id, started_at)
        )

    def end_session(self, session_id: str, ended_at: float) -> None:
        self.conn.execute(
            "UPDATE sessions SET ended_at = ? WHERE id = ? AND ended_at IS NULL", (ended_at, session_id)
        )

    def session(self, session_id: str) -> SessionRow | None:
        rows = _rows(self.conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)), SessionRow)
        return rows[0] if rows else None

    def pending(self, limit: int = 10_000) -> list[Observation]:
        return _rows(
            self.conn.execute(
                "SELECT * FROM observations WHERE processed = ? ORDER BY id LIMIT ?", (PENDING, limit)
            ),
            Observation,
        )

    def get(self, ids: Iterable[int]) -> list[Observation]:
        ids = list(ids)
        marks = ",".join("?" * len(ids))
        return _rows(
            self.conn.execute(f"SELECT * FROM observations WHERE id IN ({marks}) ORDER BY id", ids),
            Observation,
        )

    def iter_all(self, chunk: int = 1000) -> Iterator[Observation]:
        last = 0
        while True:
            rows = _rows(
                self.conn.execute("SELECT * FROM observations WHERE id > ? ORDER BY id LIMIT ?", (last, chunk)),
                Observation,
            )
            if not rows:
                return
            yield from rows
            last = rows[-1].id

    def set_processed(self, ids: Iterable[int], state: int) -> int:
        ids = list(ids)
        if not ids:
            return 0
        with transaction(self.conn) as c:
            marks = ",".join("?" * len(ids))
            return c.execute(f"UPDATE observations SET processed = ? WHERE id IN ({marks})", [state, *ids]).rowcount

    def mark_stale_before(self, cutoff: float) -> int:
        """Pending turns older than `cutoff` stop being retried; `memory rebuild` still uses them."""
        return self.conn.execute(
            "UPDATE observations SET processed = ? WHERE processed = ? AND timestamp < ?",
            (STALE, PENDING, cutoff),
        ).rowcount

    def reset_all_pending(self) -> int:
        return self.conn.execute("UPDATE observations SET processed = ? WHERE processed != ?", (PENDING, PENDING)).rowcount

    def counts(self) -> dict[str, int]:
        out = {"pending": 0, "processed": 0, "stale": 0}
        names = {PENDING: "pending", PROCESSED: "processed", STALE: "stale"}
        for state, n in self.conn.execute("SELECT processed, count(*) FROM observations GROUP BY processed"):
            out[names.get(state, f"state_{state}")] = n
        out["total"] = sum(out.values())
        return out

    def max_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM observations").fetchone()[0])

    def oldest_pending_timestamp(self) -> float | None:
        row = self.conn.execute("SELECT min(timestamp) FROM observations WHERE processed = ?", (PENDING,)).fetchone()
        return row[0]


# ---------------------------------------------------------------- memory.db


def _memory_v1(db: sqlite_utils.Database) -> None:
    db["learnings"].create(
        {
            "id": int,
            "created_at": float,
            "session_id": str,
            "type": str,
            "content": str,
            "source_observation_id": int,
            "confidence": float,
            "content_key": str,  # normalised content hash: a learning is stored once
            "batch_id": int,
        },
        pk="id",
        not_null={"created_at", "type", "content", "content_key"},
        if_not_exists=True,
    )
    db["learnings"].create_index(["content_key"], unique=True, if_not_exists=True)
    db["learnings"].create_index(["created_at"], if_not_exists=True)
    if not db["learnings_fts"].exists():
        # External-content FTS5 kept in sync by triggers, so every write path indexes.
        db["learnings"].enable_fts(["content", "type"], fts_version="FTS5", create_triggers=True, tokenize="porter")
    db["pending_actions"].create(
        {
            "id": int,
            "created_at": float,
            "content": str,
            "priority": int,
            "status": str,  # pending | completed | dismissed
            "source_learning_id": int,
            "content_key": str,
        },
        pk="id",
        not_null={"created_at", "content", "status", "content_key"},
        defaults={"priority": 0, "status": "pending"},
        if_not_exists=True,
    )
    db["pending_actions"].create_index(["content_key"], unique=True, if_not_exists=True)
    db["batches"].create(
        {
            "id": int,
            "created_at": float,
            "trigger": str,
            "status": str,
            "observation_ids": str,
            "model": str,
            "input_tokens": int,
            "output_tokens": int,
            "cost_usd": float,
            "learnings_added": int,
            "file_updates": str,
            "base_hashes": str,
            "error": str,
        },
        pk="id",
        not_null={"created_at", "trigger", "status"},
        defaults={"input_tokens": 0, "output_tokens": 0, "cost_usd": 0.0, "learnings_added": 0,
                  "observation_ids": "[]", "file_updates": "{}", "base_hashes": "{}", "model": ""},
        if_not_exists=True,
    )
    db["batches"].create_index(["status"], if_not_exists=True)
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)


MEMORY_SCHEMA = (_memory_v1,)

_SPACE = re.compile(r"\s+")


def content_key(text: str) -> str:
    """Two learnings that differ only in case, spacing or end punctuation are the same."""
    norm = _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip().rstrip(".!;,")
    return hashlib.sha1(norm.encode()).hexdigest()


class MemoryDB:
    """memory.db: learnings (FTS5), pending actions and curator batches. The daemon writes,
    `search_memory` reads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.conn = connect(path)
        _migrate(self.conn, MEMORY_SCHEMA)

    def close(self) -> None:
        self.conn.close()

    @property
    def schema_version(self) -> int:
        return _user_version(self.conn)

    # -- batches: the curator's unit of work, committed with its learnings

    def record_failed_batch(self, *, trigger: str, observation_ids: list[int], model: str, error: str,
                            input_tokens: int = 0, output_tokens: int = 0, cost_usd: float = 0.0) -> int:
        cur = self.conn.execute(
            """INSERT INTO batches (created_at, trigger, status, observation_ids, model, error,
               input_tokens, output_tokens, cost_usd) VALUES (?, ?, 'failed', ?, ?, ?, ?, ?, ?)""",
            (time.time(), trigger, json.dumps(observation_ids), model, error[:2000],
             input_tokens, output_tokens, cost_usd),
        )
        return int(cur.lastrowid or 0)

    def commit_batch(
        self,
        *,
        trigger: str,
        observation_ids: list[int],
        model: str,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float,
        learnings: Sequence[NewLearning],
        file_updates: dict[str, str],
        base_hashes: dict[str, str],
        done_actions: Sequence[int] = (),
    ) -> Batch:
        """Store a batch's learnings and actions and the file rewrites still to apply, in one
        transaction: after a crash, either all of it is here or none of it is."""
        now = time.time()
        with transaction(self.conn) as c:
            batch_id = c.execute(
                """INSERT INTO batches (created_at, trigger, status, observation_ids, model, input_tokens,
                   output_tokens, cost_usd, file_updates, base_hashes)
                   VALUES (?, ?, 'committed', ?, ?, ?, ?, ?, ?, ?)""",
                (now, trigger, json.dumps(observation_ids), model, input_tokens, output_tokens, cost_usd,
                 json.dumps(file_updates), json.dumps(base_hashes)),
            ).lastrowid
            added = 0
            for item in learnings:
                cur = c.execute(
                    """INSERT OR IGNORE INTO learnings (created_at, session_id, type, content,
                       source_observation_id, confidence, content_key, batch_id)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                    (now, item.session_id, item.type, item.content, item.source_observation_id,
                     item.confidence, content_key(item.content), batch_id),
                )
                added += cur.rowcount
                if item.type == "ACTION" and cur.rowcount:
                    c.execute(
                        """INSERT OR IGNORE INTO pending_actions
                           (created_at, content, priority, status, source_learning_id, content_key)
                           VALUES (?, ?, 0, 'pending', ?, ?)""",
                        (now, item.content, cur.lastrowid, content_key(item.content)),
                    )
            for action_id in done_actions:
                c.execute("UPDATE pending_actions SET status = 'completed' WHERE id = ? AND status = 'pending'",
                          (action_id,))
            c.execute("UPDATE batches SET learnings_added = ? WHERE id = ?", (added, batch_id))
        batch = self.batch(int(batch_id or 0))
        assert batch is not None
        return batch

    def set_batch_status(self, batch_id: int, status: Literal["applied", "done", "superseded"]) -> None:
        self.conn.execute("UPDATE batches SET status = ? WHERE id = ?", (status, batch_id))

    def last_done_at(self) -> float | None:
        """When the newest batch that finished (`done`) was committed; None if none did."""
        return self.conn.execute("SELECT max(created_at) FROM batches WHERE status = 'done'").fetchone()[0]

    def batch(self, batch_id: int) -> Batch | None:
        rows = self._batches("WHERE id = ?", (batch_id,))
        return rows[0] if rows else None

    def unfinished_batches(self) -> list[Batch]:
        """Batches a crash interrupted between committing and marking their observations
        (`superseded` ones are finished: their observations run again in a new batch)."""
        return self._batches("WHERE status IN ('committed', 'applied') ORDER BY id", ())

    def recent_batches(self, limit: int = 10) -> list[Batch]:
        return self._batches("ORDER BY id DESC LIMIT ?", (limit,))

    def _batches(self, where: str, args: tuple[Any, ...]) -> list[Batch]:
        cur = self.conn.execute(
            f"""SELECT id, created_at, trigger, status, observation_ids, model, input_tokens, output_tokens,
                cost_usd, learnings_added, file_updates, base_hashes, error FROM batches {where}""",
            args,
        )
        out = []
        for row in cur.fetchall():
            (bid, created, trigger, status, ids, model, tin, tout, cost, added, files, hashes, error) = row
            out.append(Batch(bid, created, trigger, status, json.loads(ids), model, tin, tout, cost, added,
                             json.loads(files), json.loads(hashes), error))
        return out

    def totals(self) -> dict[str, Any]:
        row = self.conn.execute(
            """SELECT count(*), coalesce(sum(status = 'failed'), 0), coalesce(sum(input_tokens), 0),
               coalesce(sum(output_tokens), 0), coalesce(sum(cost_usd), 0) FROM batches"""
        ).fetchone()
        last_ok = self.conn.execute(
            "SELECT max(created_at) FROM batches WHERE status NOT IN ('failed', 'superseded')").fetchone()[0]
        learnings = self.conn.execute("SELECT count(*) FROM learnings").fetchone()[0]
        actions = self.conn.execute("SELECT count(*) FROM pending_actions WHERE status = 'pending'").fetchone()[0]
        return {
            "batches": row[0], "failed_batches": row[1], "input_tokens": row[2], "output_tokens": row[3],
            "cost_usd": round(row[4], 6), "last_success_at": last_ok, "learnings": learnings,
            "pending_actions": actions,
        }

    # -- reading

    def search(self, terms: Sequence[str], limit: int) -> list[SearchHit]:
        """Learnings matching any of `terms`, best first.

        When the terms match few learnings (the usual case), FTS5 ranks them by BM25. FTS5's
        bm25() costs time per match, though: it scans each term's doclist for IDF and scores
        every match (~6 us each), so one common term among a million learnings costs seconds
        (measured: 2.8 s for a term in 79% of rows). So each term first reads at most
        SEARCH_CANDIDATES matches, newest first; when any term has more, or all together more
        than BM25_MATCHES, learnings are ranked instead by the summed IDF of the terms they
        contain (newest first on ties): a rare term's matches are all read, a common term adds
        only its recent matches, with the little weight it deserves. Either way the cost is
        bounded. Terms must be plain words (memory.search makes them so); each is quoted.
        """
        cap = SEARCH_CANDIDATES
        matches: dict[str, list[int]] = {}
        for term in terms:
            rows = [r for (r,) in self.conn.execute(
                "SELECT rowid FROM learnings_fts WHERE learnings_fts MATCH ? ORDER BY rowid DESC LIMIT ?",
                (f'"{term}"', cap + 1))]
            if rows:
                matches[term] = rows
        if not matches:
            return []
        if all(len(r) <= cap for r in matches.values()) and sum(map(len, matches.values())) <= BM25_MATCHES:
            best = [(rowid, -rank) for rowid, rank in self.conn.execute(
                "SELECT rowid, rank FROM learnings_fts WHERE learnings_fts MATCH ? ORDER BY rank LIMIT ?",
                (" OR ".join(f'"{t}"' for t in matches), limit))]
        else:
            best = self._rank_by_idf(matches, limit)
        marks = ",".join("?" * len(best))
        found = {row[0]: row for row in self.conn.execute(
            f"SELECT id, type, content, created_at, confidence FROM learnings WHERE id IN ({marks})",
            [rowid for rowid, _ in best])}
        return [SearchHit(*found[rowid], score=round(score, 4)) for rowid, score in best if rowid in found]

    def _rank_by_idf(self, matches: dict[str, list[int]], limit: int) -> list[tuple[int, float]]:
        cap = SEARCH_CANDIDATES
        top = self.conn.execute("SELECT max(rowid) FROM learnings").fetchone()[0] or 0
        scores: dict[int, float] = {}
        for rows in matches.values():
            # A common term's document count, estimated from how densely it matches recent rows.
            df = len(rows) if len(rows) <= cap else cap * top / max(1, top - rows[cap - 1] + 1)
            idf = math.log(1 + (top - df + 0.5) / (df + 0.5))
            for rowid in rows[:cap]:
                scores[rowid] = scores.get(rowid, 0.0) + idf
        return heapq.nlargest(limit, scores.items(), key=lambda kv: (kv[1], kv[0]))

    def learnings_since(self, since: float, limit: int = 50) -> list[Learning]:
        return _rows(
            self.conn.execute(
                """SELECT id, created_at, session_id, type, content, source_observation_id, confidence
                   FROM learnings WHERE created_at >= ? ORDER BY created_at DESC, id DESC LIMIT ?""",
                (since, limit),
            ),
            Learning,
        )

    def all_learnings(self) -> list[Learning]:
        return _rows(
            self.conn.execute(
                """SELECT id, created_at, session_id, type, content, source_observation_id, confidence
                   FROM learnings ORDER BY id"""
            ),
            Learning,
        )

    def pending_actions(self, limit: int = 20) -> list[PendingAction]:
        return _rows(
            self.conn.execute(
                """SELECT id, created_at, content, priority, status, source_learning_id FROM pending_actions
                   WHERE status = 'pending' ORDER BY priority DESC, id DESC LIMIT ?""",
                (limit,),
            ),
            PendingAction,
        )

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))


# ---------------------------------------------------------------- ownership

T = TypeVar("T")
R = TypeVar("R")


class Worker(Generic[T]):
    """Owns one database object on one thread. Coroutines await `call`; hooks, which must
    never wait, use `submit` and go on. The database is opened on first use, in that thread,
    so constructing a Worker touches nothing (the owner may still have a lock to take)."""

    def __init__(self, name: str, opener: Callable[[], T]) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"db-{name}")
        self._opener = opener
        self._obj: T | None = None
        self.name = name

    def _get(self) -> T:  # runs only on the worker's thread
        if self._obj is None:
            self._obj = self._opener()
        return self._obj

    async def call(self, fn: Callable[[T], R]) -> R:
        return await asyncio.wrap_future(self._executor.submit(lambda: fn(self._get())))

    def submit(self, fn: Callable[[T], R]) -> Future[R]:
        return self._executor.submit(lambda: fn(self._get()))

    async def close(self) -> None:
        """Finish every queued call, then close the connection."""

        def _close() -> None:
            if self._obj is not None:
                self._obj.close()  # type: ignore[attr-defined]
                self._obj = None

        await asyncio.wrap_future(self._executor.submit(_close))
        self._executor.shutdown(wait=True)
