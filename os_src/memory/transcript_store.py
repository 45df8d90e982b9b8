"""transcript.db: the black-box recorder. One row per agent turn, append-only.

Triggers refuse any change to a recorded turn; only its `processed` state moves
(pending -> processed, or stale when it can no longer be curated), and a turn a person forgot,
which keeps a tombstone in `forgotten_turns`, loses its words and nothing else (memory/schema.py).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

import msgspec

from ..database import (
    BUSY_TIMEOUT_MS,
    checkpoint,
    marks,
    open_store,
    rows,
    transaction,
    user_version,
)
from .schema import FORGOTTEN, PENDING, PROCESSED, STALE, TRANSCRIPT_SCHEMA


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
    turn_id: str | None = None  # the turn's id on the wire (turn_started), when it came from the runtime
    status: str | None = None  # completed | interrupted | stopped (by the server's stop) | error (None: recorded before it was kept)
    cost_usd: float | None = None  # what the turn cost, when the agent's CLI reported it


class ClientObservation(Observation, frozen=True):
    """A turn with the id its sender gave its message (user_message's `client_id`, kept in `turn_clients`):
    None when it came without one, or was recorded before ids were kept."""

    client_id: str | None = None


class TakenClient(msgspec.Struct, frozen=True, array_like=True):
    """A message a recorded turn ran, by the id its sender gave it (turn_clients): the session it ran in,
    and the turn's id on the wire (None once the turn is forgotten, or when it had none)."""

    client_id: str
    session_id: str
    turn_id: str | None


class NewObservation(msgspec.Struct, frozen=True):
    timestamp: float
    session_id: str
    sequence_num: int
    user_message: str
    tool_calls_json: str
    agent_response: str
    turn_id: str | None = None
    status: str | None = None
    cost_usd: float | None = None
    client_id: str | None = None  # recorded beside it, in turn_clients


class ImportedTurn(msgspec.Struct, frozen=True, array_like=True):
    """A past turn brought in by `memory import`. Its identity is (session, timestamp, user message,
    answer); `occurrence` says which copy of that turn in its file it is (1 for the first), so a file
    that repeats a turn gets it as often as it holds it, and importing the file again adds nothing."""

    session_id: str
    timestamp: float
    user_message: str
    tool_calls_json: str
    agent_response: str
    occurrence: int = 1


class SessionRow(msgspec.Struct, frozen=True):
    id: str
    started_at: float
    ended_at: float | None
    message_count: int
    observation_count: int


class Tombstone(msgspec.Struct, frozen=True):
    """A turn a person forgot: which, when and by whom; never its words."""

    observation_id: int
    session_id: str
    sequence_num: int
    forgotten_at: float
    forgotten_by: str


class TranscriptDB:
    """The raw turns: the runtime's capture writes, the curator reads."""

    def __init__(self, path: Path, *, reading: bool = False) -> None:
        self.path = path
        self.conn = open_store(path, TRANSCRIPT_SCHEMA, reading=reading)

    def close(self) -> None:
        self.conn.close()

    @property
    def schema_version(self) -> int:
        return user_version(self.conn)

    def append(self, obs: NewObservation) -> int | None:
        """Record a turn. Returns its id, or None if that turn was already recorded, by its key or its
        wire id (so a replay of the same turn, after a failed write or a crash, is harmless)."""
        with self.group():
            return self._append(obs)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """One transaction, so one fsync, for every write inside (group commit); a write that
        fails rolls them all back. Writes inside a group join it."""
        if self.conn.in_transaction:
            yield
            return
        try:
            with transaction(self.conn):
                yield
        except BaseException:
            # A COMMIT that failed (a full disk) can leave the transaction open; the retry must
            # find the connection usable.
            if self.conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    self.conn.execute("ROLLBACK")
            raise

    def _append(self, obs: NewObservation) -> int | None:
        c = self.conn
        # A turn has one wire id, whatever session it closed in: a turn resent to a fresh CLI closes under
        # a new key, and the turn journal may still hold it, open, under its first one (its save failed).
        # Looked up (observations_turn_id), not a UNIQUE index: a transcript recorded before this check
        # may hold such a second copy already, and the index could not be made on it.
        if obs.turn_id is not None and c.execute("SELECT 1 FROM observations WHERE turn_id = ?",
                                                 (obs.turn_id,)).fetchone() is not None:
            return None
        cur = c.execute(
            """INSERT OR IGNORE INTO observations
            (timestamp, session_id, sequence_num, user_message, tool_calls_json, agent_response,
             turn_id, status, cost_usd)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (obs.timestamp, obs.session_id, obs.sequence_num, obs.user_message,
             obs.tool_calls_json, obs.agent_response, obs.turn_id, obs.status, obs.cost_usd),
        )
        if cur.rowcount == 0:
            return None
        if obs.client_id is not None:
            c.execute("INSERT OR IGNORE INTO turn_clients (session_id, sequence_num, client_id) VALUES (?, ?, ?)",
                      (obs.session_id, obs.sequence_num, obs.client_id))
        c.execute(
            """INSERT INTO sessions (id, started_at, message_count, observation_count)
            VALUES (?, ?, 1, 1)
            ON CONFLICT(id) DO UPDATE SET message_count = message_count + 1,
                observation_count = observation_count + 1""",
            (obs.session_id, obs.timestamp),
        )
        return cur.lastrowid

    def record_command(self, client_id: str, session_id: str, turn_id: str | None, at: float) -> None:
        """A message the agent took that left no turn (a command the CLI ran itself): its client id alone,
        so that a restart knows it taken. A second write of the same id is a no-op (a replay)."""
        self.conn.execute("INSERT OR IGNORE INTO command_clients (client_id, session_id, turn_id, taken_at) "
                          "VALUES (?, ?, ?, ?)", (client_id, session_id, turn_id, at))

    def taken_clients(self, limit: int) -> list[TakenClient]:
        """The newest `limit` client ids the record holds, newest first: the turns' (turn_clients) and the
        commands' that left no turn (command_clients). Each table's newest `limit`, by the order they were
        recorded, then both together by when the message was taken (a turn's start), so the read stays
        bounded by `limit` however long the record is."""
        rows = self.conn.execute(
            """SELECT client_id, session_id, turn_id FROM (
                SELECT * FROM (SELECT c.client_id, c.session_id, o.turn_id, coalesce(o.timestamp, 0) AS at,
                    c.rowid AS n FROM turn_clients c LEFT JOIN observations o
                    ON o.session_id = c.session_id AND o.sequence_num = c.sequence_num
                    ORDER BY c.rowid DESC LIMIT :limit)
                UNION ALL
                SELECT * FROM (SELECT client_id, session_id, turn_id, taken_at AS at, rowid AS n
                    FROM command_clients ORDER BY rowid DESC LIMIT :limit))
            ORDER BY at DESC, n DESC LIMIT :limit""", {"limit": limit}).fetchall()
        return [TakenClient(*row) for row in rows]

    def import_turns(self, turns: Iterable[ImportedTurn]) -> list[int | None]:
        """Record past turns in one transaction: each turn's id, or None for a turn already recorded
        (as many copies of it as its `occurrence`). A new turn is numbered after its session's last."""
        with self.group():  # one synced transaction, rolled back whole if it fails
            return [self._import_one(self.conn, t) for t in turns]

    def _import_one(self, c: sqlite3.Connection, t: ImportedTurn) -> int | None:
        # A turn a person forgot keeps its session and time, not its words: it counts as a copy of the turn at
        # its place, so importing its file again never brings the words back (a different line at that very
        # time in that session is taken for it too: precision first).
        copies = sum(1 for user, answer, processed in c.execute(
            "SELECT user_message, agent_response, processed FROM observations WHERE session_id = ? AND timestamp = ?",
            (t.session_id, t.timestamp))
            if processed == FORGOTTEN or (user == t.user_message and answer == t.agent_response))
        if copies >= t.occurrence:
            return None
        number = c.execute("SELECT coalesce(max(sequence_num), 0) + 1 FROM observations WHERE session_id = ?",
                           (t.session_id,)).fetchone()[0]
        cur = c.execute(
            """INSERT INTO observations (timestamp, session_id, sequence_num, user_message, tool_calls_json,
            agent_response) VALUES (?, ?, ?, ?, ?, ?)""",
            (t.timestamp, t.session_id, number, t.user_message, t.tool_calls_json, t.agent_response))
        c.execute(
            """INSERT INTO sessions (id, started_at, message_count, observation_count) VALUES (?, ?, 1, 1)
            ON CONFLICT(id) DO UPDATE SET message_count = message_count + 1,
                observation_count = observation_count + 1, started_at = min(started_at, excluded.started_at)""",
            (t.session_id, t.timestamp))
        return cur.lastrowid

    @contextlib.contextmanager
    def busy_timeout(self, ms: int) -> Iterator[None]:
        """Wait at most `ms` for another writer's lock, for the writes inside."""
        self.conn.execute(f"PRAGMA busy_timeout={int(ms)}")
        try:
            yield
        finally:
            self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")

    def start_session(self, session_id: str, started_at: float) -> None:
        self.conn.execute(
            "INSERT OR IGNORE INTO sessions (id, started_at) VALUES (?, ?)", (session_id, started_at)
        )

    def end_session(self, session_id: str, ended_at: float) -> None:
        self.conn.execute(
            "UPDATE sessions SET ended_at = ? WHERE id = ? AND ended_at IS NULL", (ended_at, session_id)
        )

    def session(self, session_id: str) -> SessionRow | None:
        found = rows(self.conn.execute("SELECT * FROM sessions WHERE id = ?", (session_id,)), SessionRow)
        return found[0] if found else None

    def pending(self, limit: int = 10_000, leaving_out: Collection[int] = ()) -> list[Observation]:
        return rows(
            self.conn.execute(
                "SELECT * FROM observations WHERE processed = ? AND id NOT IN (SELECT value FROM json_each(?)) "
                "ORDER BY id LIMIT ?", (PENDING, json.dumps(sorted(leaving_out)), limit)
            ),
            Observation,
        )

    def recent_pending(self, limit: int, leaving_out: Collection[int] = ()) -> list[Observation]:
        """The newest `limit` pending turns, newest first (the boot prompt's turns not yet curated)."""
        return rows(
            self.conn.execute(
                "SELECT * FROM observations WHERE processed = ? AND id NOT IN (SELECT value FROM json_each(?)) "
                "ORDER BY id DESC LIMIT ?", (PENDING, json.dumps(sorted(leaving_out)), limit)
            ),
            Observation,
        )

    def get(self, ids: Iterable[int]) -> list[Observation]:
        wanted = list(ids)
        return rows(
            self.conn.execute(f"SELECT * FROM observations WHERE id IN ({marks(wanted)}) ORDER BY id", wanted),
            Observation,
        )

    def iter_all(self, chunk: int = 1000) -> Iterator[Observation]:
        last = 0
        while found := self.after(last, chunk):
            yield from found
            last = found[-1].id

    def after(self, last_id: int, limit: int) -> list[Observation]:
        """The turns recorded after `last_id`, oldest first."""
        return rows(
            self.conn.execute("SELECT * FROM observations WHERE id > ? ORDER BY id LIMIT ?", (last_id, limit)),
            Observation,
        )

    def between(self, lo: int, hi: int, limit: int) -> list[Observation]:
        """The turns with ids in [lo, hi], newest first, at most `limit`."""
        return rows(
            self.conn.execute("SELECT * FROM observations WHERE id BETWEEN ? AND ? ORDER BY id DESC LIMIT ?",
                              (lo, hi, limit)),
            Observation,
        )

    def ended_sessions(self, session_ids: Iterable[str]) -> set[str]:
        """Which of these sessions have ended (the curator writes a summary of each)."""
        wanted = list(set(session_ids))
        return {r for (r,) in self.conn.execute(
            f"SELECT id FROM sessions WHERE ended_at IS NOT NULL AND id IN ({marks(wanted)})", wanted)}

    def set_processed(self, ids: Iterable[int], state: int) -> int:
        wanted = list(ids)
        if not wanted:
            return 0
        with transaction(self.conn) as c:  # a forgotten turn stays forgotten, whatever a batch says
            return c.execute(f"UPDATE observations SET processed = ? WHERE id IN ({marks(wanted)}) AND processed != ?",
                             [state, *wanted, FORGOTTEN]).rowcount

    def mark_stale_before(self, cutoff: float) -> int:
        """Pending turns older than `cutoff` stop being retried; `memory rebuild` still uses them."""
        return self.conn.execute(
            "UPDATE observations SET processed = ? WHERE processed = ? AND timestamp < ?",
            (STALE, PENDING, cutoff),
        ).rowcount

    def reset_all_pending(self) -> int:
        """Every turn pending again (a rebuild), but a forgotten one: it has no words to curate."""
        return self.conn.execute("UPDATE observations SET processed = ? WHERE processed NOT IN (?, ?)",
                                 (PENDING, PENDING, FORGOTTEN)).rowcount

    # -- forgetting

    def forget(self, ids: Iterable[int], at: float, by: str) -> list[Observation]:
        """Take the words out of these turns, each keeping a tombstone (which turn, when, by whom).
        Returns the turns as they were (their words, for the caller to find what came from them),
        leaving out those already forgotten. The freed pages are zeroed (secure_delete) and the
        WAL, which held copies of them, is checkpointed and emptied."""
        wanted = list(ids)
        with transaction(self.conn) as c:
            found = rows(c.execute(f"SELECT * FROM observations WHERE id IN ({marks(wanted)}) AND processed != ? "
                                   "ORDER BY id", [*wanted, FORGOTTEN]), Observation)
            c.executemany("INSERT OR IGNORE INTO forgotten_turns (observation_id, session_id, sequence_num, "
                          "forgotten_at, forgotten_by) VALUES (?, ?, ?, ?, ?)",
                          [(o.id, o.session_id, o.sequence_num, at, by) for o in found])
            c.execute(f"UPDATE observations SET user_message = '', tool_calls_json = '[]', agent_response = '', "
                      f"processed = ? WHERE id IN ({marks(found)})", [FORGOTTEN, *(o.id for o in found)])
        checkpoint(self.conn)
        return found

    def tombstones(self, session_id: str) -> dict[int, Tombstone]:
        """The forgotten turns of a session, by their number in it."""
        found = rows(self.conn.execute("SELECT * FROM forgotten_turns WHERE session_id = ?", (session_id,)),
                     Tombstone)
        return {t.sequence_num: t for t in found}

    def forgotten_ids(self) -> list[int]:
        """Every forgotten turn's id (a start checks memory.db holds none of their words)."""
        return [r for (r,) in self.conn.execute("SELECT observation_id FROM forgotten_turns ORDER BY observation_id")]

    def forgotten_among(self, ids: Iterable[int]) -> list[int]:
        wanted = list(ids)
        return [r for (r,) in self.conn.execute(
            f"SELECT observation_id FROM forgotten_turns WHERE observation_id IN ({marks(wanted)})", wanted)]

    def ids_of(self, *, session_id: str | None = None, turn_ids: Iterable[str] = ()) -> list[int]:
        """The recorded turns of a session, or those with these wire ids."""
        if session_id is not None:
            return [r for (r,) in self.conn.execute("SELECT id FROM observations WHERE session_id = ? ORDER BY id",
                                                    (session_id,))]
        wanted = list(turn_ids)
        return [r for (r,) in self.conn.execute(
            f"SELECT id FROM observations WHERE turn_id IN ({marks(wanted)}) ORDER BY id", wanted)]

    def counts(self) -> dict[str, int]:
        out = {"pending": 0, "processed": 0, "stale": 0}
        names = {PENDING: "pending", PROCESSED: "processed", STALE: "stale", FORGOTTEN: "forgotten"}
        for state, n in self.conn.execute("SELECT processed, count(*) FROM observations GROUP BY processed"):
            out[names.get(state, f"state_{state}")] = n
        out["total"] = sum(out.values())
        return out

    def max_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM observations").fetchone()[0])

    def oldest_pending_timestamp(self) -> float | None:
        """When the first pending turn (by order of recording, not by its clock) was recorded."""
        row = self.conn.execute("SELECT timestamp FROM observations WHERE processed = ? ORDER BY id LIMIT 1",
                                (PENDING,)).fetchone()
        return None if row is None else float(row[0])
