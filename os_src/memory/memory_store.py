"""memory.db: what the curator extracted. Learnings (with an FTS5 index kept in sync by
triggers), pending actions, one row per curator batch (with what its reply said that was left
out), and a small key-value `meta`.

The daemon writes; search (memory/recall/learnings.py) and the boot loader read.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec

from ..database import open_store, rows, transaction, user_version
from .corrections import link as link_correction
from .schema import MEMORY_SCHEMA

LearningType = Literal["FACT", "PATTERN", "CORRECTION", "PREFERENCE", "ACTION", "TOOL_INSTALL", "SUMMARY"]
LEARNING_TYPES: tuple[str, ...] = ("FACT", "PATTERN", "CORRECTION", "PREFERENCE", "ACTION", "TOOL_INSTALL",
                                   "SUMMARY")  # SUMMARY: one line about a session that ended

_SPACE = re.compile(r"\s+")


def content_key(text: str) -> str:
    """Two learnings that differ only in case, spacing or end punctuation are the same."""
    norm = _SPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip().rstrip(".!;,")
    return hashlib.sha1(norm.encode()).hexdigest()


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


class LeftOut(msgspec.Struct, frozen=True):
    """What one curator call's reply said that memory did not keep, each a column of `batches` (schema step 9):
    learnings past the reply's bound (curation/reply.py's MAX_LEARNINGS, LEARNINGS_PER_TURN), lines that fit
    no rule of the format, and file rewrites not applied (given twice, empty, cut off, over their limit, or of a
    file the curator may not write: soul.md, or one memory has not)."""
    learnings_over_bound: int = 0
    lines_ignored: int = 0
    files_rejected: int = 0


NOTHING_LEFT_OUT = LeftOut()
_LEFT_OUT_COLUMNS = LeftOut.__struct_fields__


# What a forget job holds back (forget/jobs.py): until the job is finished, memory.db may still hold words of its
# turns (a forget cut short before memory.db lost them, whose run again at the start failed too). Nothing read from
# memory.db for the agent, the curator or the console shows them: the turns (their episodes, HELD_TURNS), the
# learnings drawn from them and their sessions' summaries (`held_back`), and the actions drawn from those. This is
# the one place that rule is written; every reader applies it through these.
HELD_TURNS = "SELECT j.value FROM forget_jobs f, json_each(f.observation_ids) j"
HELD_SESSIONS = "SELECT j.value FROM forget_jobs f, json_each(f.sessions) j"


def held_back(learning: str = "learnings") -> str:
    """SQL true of a row of `learnings` (named `learning` in the query) that a forget job holds back, false of
    any other: never NULL, so `NOT held_back()` keeps a learning with no turn or no session."""
    return (f"(coalesce({learning}.source_observation_id IN ({HELD_TURNS}), 0) OR ({learning}.type = 'SUMMARY' "
            f"AND coalesce({learning}.session_id IN ({HELD_SESSIONS}), 0)))")


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
    left_out: LeftOut = NOTHING_LEFT_OUT
    # Turns the batch carried but left pending, once: only learnings its reply dropped (past the bound, or the last
    # one cut off at the token limit) cited them.
    left_pending: list[int] = []

    @property
    def curated_ids(self) -> list[int]:
        """The turns the batch marks processed: all it carried but those it left pending for the next batch."""
        left = set(self.left_pending)
        return [i for i in self.observation_ids if i not in left]


_BATCH_COLUMNS = ("id, created_at, trigger, status, observation_ids, model, input_tokens, output_tokens, "
                  "cost_usd, learnings_added, file_updates, base_hashes, error, left_pending, "
                  + ", ".join(_LEFT_OUT_COLUMNS))
_LEARNING_COLUMNS = "id, created_at, session_id, type, content, source_observation_id, confidence"


class BatchTotals(msgspec.Struct, frozen=True):
    """The curator's calls recorded in `batches`, summed, with what their replies said that was left out."""
    batches: int
    failed_batches: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    learnings_over_bound: int
    lines_ignored: int
    files_rejected: int


class MemoryDB:
    def __init__(self, path: Path, *, reading: bool = False) -> None:
        self.path = path
        self.conn = open_store(path, MEMORY_SCHEMA, reading=reading)

    def close(self) -> None:
        self.conn.close()

    @property
    def schema_version(self) -> int:
        return user_version(self.conn)

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
        left_out: LeftOut = NOTHING_LEFT_OUT,
        left_pending: Sequence[int] = (),
    ) -> Batch:
        """Store a batch's learnings and actions and the file rewrites still to apply, in one
        transaction: after a crash, either all of it is here or none of it is. `left_out`: what the
        reply said that is not kept, counted in the batch's row. `left_pending`: turns of the batch it does not
        mark processed (only learnings dropped past the bound, or cut off, cite them), but those an earlier batch left
        pending already: once only, so a turn is never carried by more than two batches."""
        now = time.time()
        with transaction(self.conn) as c:
            left = sorted(set(left_pending) - self.left_pending_before(left_pending))
            batch_id = int(c.execute(
                f"""INSERT INTO batches (created_at, trigger, status, observation_ids, model, input_tokens,
                   output_tokens, cost_usd, file_updates, base_hashes, left_pending, {", ".join(_LEFT_OUT_COLUMNS)})
                   VALUES (?, ?, 'committed', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (now, trigger, json.dumps(observation_ids), model, input_tokens, output_tokens, cost_usd,
                 json.dumps(file_updates), json.dumps(base_hashes), json.dumps(left),
                 *msgspec.structs.astuple(left_out)),
            ).lastrowid or 0)
            added = sum(self._add_learning(item, now, batch_id) for item in learnings)
            for action_id in done_actions:
                c.execute("UPDATE pending_actions SET status = 'completed' WHERE id = ? AND status = 'pending'",
                          (action_id,))
            c.execute("UPDATE batches SET learnings_added = ? WHERE id = ?", (added, batch_id))
        batch = self.batch(batch_id)
        assert batch is not None
        return batch

    def _add_learning(self, item: NewLearning, now: float, batch_id: int) -> int:
        """Insert one learning (and its action) unless it is already known. Returns 1 if added."""
        key = content_key(item.content)
        cur = self.conn.execute(
            """INSERT OR IGNORE INTO learnings (created_at, session_id, type, content,
               source_observation_id, confidence, content_key, batch_id)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
            (now, item.session_id, item.type, item.content, item.source_observation_id,
             item.confidence, key, batch_id),
        )
        if item.type == "CORRECTION" and cur.rowcount and cur.lastrowid:
            link_correction(self.conn, cur.lastrowid, item.content, now)
        if item.type == "ACTION" and cur.rowcount:
            self.conn.execute(
                """INSERT OR IGNORE INTO pending_actions
                   (created_at, content, priority, status, source_learning_id, content_key)
                   VALUES (?, ?, 0, 'pending', ?, ?)""",
                (now, item.content, cur.lastrowid, key),
            )
        return cur.rowcount

    def left_pending_before(self, ids: Sequence[int]) -> set[int]:
        """Which of `ids` a batch left pending already (failed and superseded batches leave none: their turns
        all stay pending)."""
        if not ids:
            return set()
        rows = self.conn.execute(
            "SELECT DISTINCT j.value FROM batches b, json_each(b.left_pending) j WHERE b.left_pending != '[]' "
            "AND b.status NOT IN ('failed', 'superseded') AND j.value IN (SELECT value FROM json_each(?))",
            (json.dumps(list(ids)),)).fetchall()
        return {int(r[0]) for r in rows}

    def set_batch_status(self, batch_id: int, status: Literal["applied", "done", "superseded"]) -> None:
        self.conn.execute("UPDATE batches SET status = ? WHERE id = ?", (status, batch_id))

    def last_done_at(self) -> float | None:
        """When the newest batch that finished (`done`) was committed; None if none did."""
        value = self.conn.execute("SELECT max(created_at) FROM batches WHERE status = 'done'").fetchone()[0]
        return None if value is None else float(value)

    def batch(self, batch_id: int) -> Batch | None:
        found = self._batches("WHERE id = ?", (batch_id,))
        return found[0] if found else None

    def unfinished_batches(self) -> list[Batch]:
        """Batches a crash interrupted between committing and marking their observations
        (`superseded` ones are finished: their observations run again in a new batch)."""
        return self._batches("WHERE status IN ('committed', 'applied') ORDER BY id", ())

    def recent_batches(self, limit: int = 10) -> list[Batch]:
        return self._batches("ORDER BY id DESC LIMIT ?", (limit,))

    def _batches(self, where: str, args: tuple[Any, ...]) -> list[Batch]:
        cur = self.conn.execute(f"SELECT {_BATCH_COLUMNS} FROM batches {where}", args)
        out = []
        for row in cur.fetchall():
            (bid, created, trigger, status, ids, model, tin, tout, cost, added, files, hashes, error, left,
             *left_out) = row
            out.append(Batch(bid, created, trigger, status, json.loads(ids), model, tin, tout, cost, added,
                             json.loads(files), json.loads(hashes), error, LeftOut(*left_out), json.loads(left)))
        return out

    def cost_since(self, since: float) -> float:
        """What the calls recorded since `since` cost, failed ones included: they were paid for."""
        value = self.conn.execute("SELECT coalesce(sum(cost_usd), 0) FROM batches WHERE created_at >= ?",
                                  (since,)).fetchone()[0]
        return float(value)

    def batch_totals(self, since: float = -math.inf) -> BatchTotals:
        """The calls recorded since `since` (all of them by default), failed ones included."""
        left_out = "".join(f", coalesce(sum({name}), 0)" for name in _LEFT_OUT_COLUMNS)
        row = self.conn.execute(
            f"""SELECT count(*), coalesce(sum(status = 'failed'), 0), coalesce(sum(input_tokens), 0),
               coalesce(sum(output_tokens), 0), coalesce(sum(cost_usd), 0){left_out} FROM batches
               WHERE created_at >= ?""",
            (since,)).fetchone()
        return BatchTotals(row[0], row[1], row[2], row[3], round(row[4], 6), *row[5:])

    def totals(self) -> dict[str, Any]:
        last_ok = self.conn.execute(
            "SELECT max(created_at) FROM batches WHERE status NOT IN ('failed', 'superseded')").fetchone()[0]
        learnings = self.conn.execute("SELECT count(*) FROM learnings").fetchone()[0]
        actions = self.conn.execute("SELECT count(*) FROM pending_actions WHERE status = 'pending'").fetchone()[0]
        return {**msgspec.structs.asdict(self.batch_totals()), "last_success_at": last_ok, "learnings": learnings,
                "pending_actions": actions}

    # -- reading

    def learnings_since(self, since: float, limit: int = 50, until: float = math.inf) -> list[Learning]:
        """Learnings stamped in [since, until], newest first by the order they were learned in (ids),
        not by their clocks (a clock set back stamps a later learning before an earlier one); but those
        a correction replaced (they are told as the correction's "was: ..."), and those a forget job holds
        back (`held_back`)."""
        return rows(
            self.conn.execute(
                f"""SELECT {_LEARNING_COLUMNS} FROM learnings WHERE created_at >= ? AND created_at <= ?
                    AND forgotten_at IS NULL AND (replaced_by IS NULL OR replaced_by NOT IN
                        (SELECT id FROM learnings WHERE forgotten_at IS NULL)) AND NOT {held_back()}
                    ORDER BY id DESC LIMIT ?""",
                (since, until, limit),
            ),
            Learning,
        )

    def summaries(self, limit: int) -> list[Learning]:
        """The latest sessions' one-line summaries (SUMMARY learnings), newest first; none a forget job holds
        back (`held_back`)."""
        return rows(
            self.conn.execute(
                f"""SELECT {_LEARNING_COLUMNS} FROM learnings WHERE type = 'SUMMARY' AND forgotten_at IS NULL
                    AND NOT {held_back()} ORDER BY id DESC LIMIT ?""", (limit,)),
            Learning,
        )

    def all_learnings(self) -> list[Learning]:
        return rows(self.conn.execute(f"SELECT {_LEARNING_COLUMNS} FROM learnings ORDER BY id"), Learning)

    def pending_actions(self, limit: int = 20) -> list[PendingAction]:
        """The pending actions, but those drawn from a learning forgotten, or one a forget job holds back
        (`held_back`): the boot prompt and the curator's prompt get none of them."""
        return rows(
            self.conn.execute(
                f"""SELECT id, created_at, content, priority, status, source_learning_id FROM pending_actions
                   WHERE status = 'pending' AND (source_learning_id IS NULL OR source_learning_id NOT IN
                       (SELECT id FROM learnings WHERE forgotten_at IS NOT NULL OR {held_back()}))
                   ORDER BY priority DESC, id DESC LIMIT ?""",
                (limit,),
            ),
            PendingAction,
        )

    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))
