"""The schemas of transcript.db and memory.db, as ordered, idempotent migration steps.

Step N brings a database to `PRAGMA user_version` N (see database.migrate).
Add a step to change a schema; never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a step is given the database by database.migrate, which imports sqlite-utils only to run one
    import sqlite_utils
    from sqlite_utils.db import Table

# observations.processed (FORGOTTEN: a person forgot the turn; its words are gone, its tombstone stays)
PENDING, PROCESSED, STALE, FORGOTTEN = 0, 1, 2, 3

OBSERVATION_TRIGGERS = ("observations_append_only", "observations_no_delete")

# memory.db meta: set while recall's word index must be written anew (a forget); one writer sets it,
# RecallService.forget, first thing (a start finishes the rewrite it finds flagged)
PURGE_KEY = "recall_purge"
# The state of that rewrite (recall's `purge_state`), which the forget pass waits for
PURGED, PURGING, PURGE_FAILED = "purged", "purging", "failed"


def _table(db: sqlite_utils.Database, name: str) -> Table:
    return db.table(name)


def _transcript_v1(db: sqlite_utils.Database) -> None:
    _table(db, "observations").create(
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
    # A turn is recorded once, whoever asks to record it again.
    _table(db, "observations").create_index(["session_id", "sequence_num"], unique=True, if_not_exists=True)
    _table(db, "observations").create_index(["processed", "id"], if_not_exists=True)
    _table(db, "sessions").create(
        {"id": str, "started_at": float, "ended_at": float, "message_count": int, "observation_count": int},
        pk="id",
        defaults={"message_count": 0, "observation_count": 0},
        if_not_exists=True,
    )
    _v1_triggers(db.conn)


def _v1_triggers(conn: sqlite3.Connection) -> None:
    """A recorded turn is never changed or deleted (only `processed` moves): as first shipped."""
    conn.execute(
        """CREATE TRIGGER IF NOT EXISTS main.observations_append_only
        BEFORE UPDATE OF id, timestamp, session_id, sequence_num, user_message, tool_calls_json,
            agent_response ON observations
        BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END"""
    )
    _no_delete(conn)


def _no_delete(conn: sqlite3.Connection) -> None:
    conn.execute(
        """CREATE TRIGGER IF NOT EXISTS main.observations_no_delete BEFORE DELETE ON observations
        BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END"""
    )


def create_observation_triggers(conn: sqlite3.Connection) -> None:
    """A recorded turn is never changed or deleted (only `processed` moves), with one exception: a
    turn a person forgot, which has its tombstone in `forgotten_turns`, loses its words (its
    message, tool calls and answer become empty) and nothing else. Shared with migrate-v1, which
    drops them for one transaction to clear its own partial copy."""
    conn.execute(
        """CREATE TRIGGER IF NOT EXISTS main.observations_append_only
        BEFORE UPDATE OF id, timestamp, session_id, sequence_num, user_message, tool_calls_json,
            agent_response, turn_id, status, cost_usd ON observations
        WHEN NOT (NEW.id = OLD.id AND NEW.timestamp = OLD.timestamp AND NEW.session_id = OLD.session_id
                  AND NEW.sequence_num = OLD.sequence_num AND NEW.turn_id IS OLD.turn_id
                  AND NEW.status IS OLD.status AND NEW.cost_usd IS OLD.cost_usd
                  AND NEW.user_message = '' AND NEW.tool_calls_json = '[]' AND NEW.agent_response = ''
                  AND EXISTS (SELECT 1 FROM forgotten_turns f WHERE f.observation_id = OLD.id))
        BEGIN SELECT RAISE(ABORT, 'observations are append-only'); END"""
    )
    _no_delete(conn)


def _transcript_v2(db: sqlite_utils.Database) -> None:
    """A turn's identity is its session, its time and its text (memory import looks a turn up by them
    before adding it), so a session's turns are found by time."""
    _table(db, "observations").create_index(["session_id", "timestamp"], if_not_exists=True)


def _transcript_v3(db: sqlite_utils.Database) -> None:
    """What the console shows of a past turn beside its words: its id on the wire (`turn_id`, as in
    turn_started), how it ended (`status`: completed, interrupted, stopped or error) and its own cost (older
    turns have none: NULL). And forgetting: a turn a person forgot keeps a tombstone (who, when,
    which turn, never the words) in `forgotten_turns`, and its row loses its words."""
    columns = db["observations"].columns_dict
    for name, kind in (("turn_id", str), ("status", str), ("cost_usd", float)):
        if name not in columns:
            db["observations"].add_column(name, kind)  # type: ignore[union-attr]
    db.conn.execute("CREATE INDEX IF NOT EXISTS observations_turn_id ON observations(turn_id) "
                    "WHERE turn_id IS NOT NULL")
    _table(db, "forgotten_turns").create(
        {"observation_id": int, "session_id": str, "sequence_num": int, "forgotten_at": float, "forgotten_by": str},
        pk="observation_id", not_null={"session_id", "sequence_num", "forgotten_at", "forgotten_by"},
        if_not_exists=True,
    )
    _table(db, "forgotten_turns").create_index(["session_id", "sequence_num"], if_not_exists=True)
    db.conn.execute("DROP TRIGGER IF EXISTS main.observations_append_only")
    create_observation_triggers(db.conn)


def _transcript_v4(db: sqlite_utils.Database) -> None:
    """The id the sender gave a turn's message (`client_id`, as in user_message and turn_started), so
    that a page that never heard a turn start (its link dead, then a restart) finds which of its
    messages the agent took by id, not by words the record may hold changed or another device may
    have sent too. Only turns whose message had one have a row. Kept beside `observations`, keyed as
    a turn is, not as a column of it: the version before reads whole rows of `observations` into a
    struct that refuses a column it does not know, and a deploy runs that version on the new schema
    until its switch (and again after a rollback). A row is never changed or deleted: a forgotten
    turn keeps its id, which names the message and never says its words."""
    _table(db, "turn_clients").create(
        {"session_id": str, "sequence_num": int, "client_id": str},
        pk=("session_id", "sequence_num"), not_null={"client_id"}, if_not_exists=True,
    )
    _append_only(db, "turn_clients")


def _transcript_v5(db: sqlite_utils.Database) -> None:
    """The client id of a message the agent took that left no turn: a command the CLI ran itself (/compact,
    with no model turn). Kept so that a restarted runtime refuses its resend (`already_taken`) as it does a
    turn's, never as part of the conversation: no words, no observation, nothing for curation or search.
    Keyed by the client id (a replay of the write is a no-op); append-only, as turn_clients is."""
    _table(db, "command_clients").create(
        {"client_id": str, "session_id": str, "turn_id": str, "taken_at": float},
        pk="client_id", not_null={"session_id", "taken_at"}, if_not_exists=True,
    )
    _append_only(db, "command_clients")


def _append_only(db: sqlite_utils.Database, table: str) -> None:
    for event in ("UPDATE", "DELETE"):
        db.conn.execute(
            f"""CREATE TRIGGER IF NOT EXISTS main.{table}_no_{event.lower()} BEFORE {event} ON {table}
            BEGIN SELECT RAISE(ABORT, '{table} are append-only'); END"""
        )


TRANSCRIPT_SCHEMA = (_transcript_v1, _transcript_v2, _transcript_v3, _transcript_v4, _transcript_v5)


def _memory_v1(db: sqlite_utils.Database) -> None:
    learnings = _table(db, "learnings")
    learnings.create(
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
    learnings.create_index(["content_key"], unique=True, if_not_exists=True)
    learnings.create_index(["created_at"], if_not_exists=True)
    if not _table(db, "learnings_fts").exists():
        # External-content FTS5 kept in sync by triggers, so every write path indexes.
        learnings.enable_fts(["content", "type"], fts_version="FTS5", create_triggers=True, tokenize="porter")
    _pending_actions_v1(db)
    _batches_v1(db)
    _table(db, "meta").create({"key": str, "value": str}, pk="key", if_not_exists=True)


def _pending_actions_v1(db: sqlite_utils.Database) -> None:
    _table(db, "pending_actions").create(
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
    _table(db, "pending_actions").create_index(["content_key"], unique=True, if_not_exists=True)


def _batches_v1(db: sqlite_utils.Database) -> None:
    _table(db, "batches").create(
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
    _table(db, "batches").create_index(["status"], if_not_exists=True)


def _memory_v2(db: sqlite_utils.Database) -> None:
    """A person can forget a learning from the console: the row stays (with when), search and
    the boot prompt skip it, and each forgetting, undo and edit is recorded in memory_audit."""
    if "forgotten_at" not in db["learnings"].columns_dict:
        db["learnings"].add_column("forgotten_at", float)  # type: ignore[union-attr]
    db.conn.execute("CREATE INDEX IF NOT EXISTS learnings_forgotten ON learnings(id) WHERE forgotten_at IS NOT NULL")
    db["memory_audit"].create(  # type: ignore[union-attr]
        {"id": int, "at": float, "action": str, "learning_id": int, "file": str, "detail": str},
        pk="id",
        not_null={"at", "action", "detail"},
        defaults={"detail": ""},
        if_not_exists=True,
    )


def _memory_v3(db: sqlite_utils.Database) -> None:
    """Recall: every recorded turn as an episode (derived from transcript.db: `id` is the observation's
    id, `turn` its 1-based place in its session, `text` the rendered turn, private text already
    removed) and the episodes' embeddings, kept so a rebuild need not embed every turn again."""
    _table(db, "episodes").create(
        {"id": int, "session_id": str, "turn": int, "at": float, "text": str},
        pk="id", not_null={"session_id", "turn", "at", "text"}, if_not_exists=True,
    )
    _table(db, "episodes").create_index(["session_id", "turn"], if_not_exists=True)
    _table(db, "episode_vectors").create(
        {"id": int, "model": str, "vector": bytes}, pk="id", not_null={"model", "vector"}, if_not_exists=True,
    )


def _memory_v4(db: sqlite_utils.Database) -> None:
    """An episode's `turn` is its place in its session by time, so a session's episodes are found by
    time too. (The vectors moved out of `episode_vectors` into .os/memory/vectors/: the table stays,
    emptied as its rows move.)"""
    _table(db, "episodes").create_index(["session_id", "at", "id"], if_not_exists=True)


def _memory_v5(db: sqlite_utils.Database) -> None:
    """Forgetting turns: what the memory daemon's next pass still has to take out of the memory
    files, their history and backups. A job names the turns (their ids and sessions) and the sha256
    of each file line that came from them, never the words; it is deleted once done."""
    _table(db, "forget_jobs").create(
        {"id": int, "created_at": float, "observation_ids": str, "sessions": str, "line_hashes": str},
        pk="id", not_null={"created_at", "observation_ids", "sessions", "line_hashes"}, if_not_exists=True,
    )


def _memory_v6(db: sqlite_utils.Database) -> None:
    """Facts that change: a CORRECTION marks the older learning it replaces (memory/corrections.py),
    and corrections already stored are linked now. And an episode knows where the agent's answer
    begins in its text (`answer_at`), so an answer that only repeats a memory is not found as one
    (NULL for rows from before: `memory rebuild --index` fills them in)."""
    from .corrections import link_all

    if "answer_at" not in db["episodes"].columns_dict:
        db["episodes"].add_column("answer_at", int)  # type: ignore[union-attr]
    columns = db["learnings"].columns_dict
    if "replaced_by" not in columns:
        db["learnings"].add_column("replaced_by", int)  # type: ignore[union-attr]
    if "replaced_at" not in columns:
        db["learnings"].add_column("replaced_at", float)  # type: ignore[union-attr]
    db.conn.execute("CREATE INDEX IF NOT EXISTS learnings_replaced ON learnings(replaced_by) "
                    "WHERE replaced_by IS NOT NULL")
    link_all(db.conn)


def _memory_v7(db: sqlite_utils.Database) -> None:
    """A forget job says whether its lines are decided: written first with the lines the words find,
    unchecked (0), then decided (1). A job left undecided (a stop, a failed check) is decided at the
    daemon's pass, never applied unchecked. A job from before counts as undecided: one a kill left
    between its first guess and its decision must still get the kept-turn check, and a decided one
    loses nothing by getting it again."""
    if "decided" not in db["forget_jobs"].columns_dict:
        db.conn.execute("ALTER TABLE forget_jobs ADD COLUMN decided INTEGER NOT NULL DEFAULT 0")


def _memory_v8(db: sqlite_utils.Database) -> None:
    """Which turn an episode's vector was made after (`embedded_after`: the episode whose person's words it
    holds, 0 for none; NULL for a vector from before, made after the turn then before it; -1 when a turn
    landed before it since, so that its vector is made again), so that search lends a turn without a
    vector only the place of a vector that holds its words (recall/searcher.py)."""
    if "embedded_after" not in db["episodes"].columns_dict:
        db["episodes"].add_column("embedded_after", int)  # type: ignore[union-attr]
    db.conn.execute("CREATE INDEX IF NOT EXISTS episodes_embed_again ON episodes(id) WHERE embedded_after = -1")


def _memory_v9(db: sqlite_utils.Database) -> None:
    """What each curator call said that memory left out, kept beside its tokens and cost: the learnings past
    the reply's bound (curation/reply.py), the lines that fit no rule of the format, and the file rewrites
    not applied (given twice, empty, cut off, or over their limit). 0 for the calls from before, and for
    the rows the version before writes on this schema during a deploy (it names no such column)."""
    columns = db["batches"].columns_dict
    for name in ("learnings_over_bound", "lines_ignored", "files_rejected"):  # memory_store.LeftOut's fields
        if name not in columns:
            db["batches"].add_column(name, int, not_null_default=0)  # type: ignore[union-attr]


def _memory_v10(db: sqlite_utils.Database) -> None:
    """What a forget's job must say across a restart (forget/jobs.py): whether it forgot a whole session
    (`whole_session`: one cut short is forgotten again as a session, not as turns; 0 for a job from before,
    as it was counted then once a restart had passed), and when the daemon's pass first kept it for later
    (`kept_since`, wall clock: how long it has been kept goes on across a restart; NULL until a pass keeps it,
    and for a job from before, whose count starts again as it did)."""
    jobs = db["forget_jobs"]
    columns = jobs.columns_dict
    if "whole_session" not in columns:
        jobs.add_column("whole_session", int, not_null_default=0)  # type: ignore[union-attr]
    if "kept_since" not in columns:
        jobs.add_column("kept_since", float)  # type: ignore[union-attr]


def _memory_v11(db: sqlite_utils.Database) -> None:
    """The turns a batch left pending (`left_pending`, a JSON list of observation ids): those only the learnings
    its reply gave past the bound cite (curation/reply.py), so the next batch sees them again, once: a turn an
    earlier batch left pending is never left again. '[]' for the batches from before, and for the rows the
    version before writes on this schema during a deploy (it names no such column)."""
    if "left_pending" not in db["batches"].columns_dict:
        db["batches"].add_column("left_pending", str, not_null_default="[]")  # type: ignore[union-attr]
    db.conn.execute("CREATE INDEX IF NOT EXISTS batches_left_pending ON batches(id) WHERE left_pending != '[]'")


MEMORY_SCHEMA = (_memory_v1, _memory_v2, _memory_v3, _memory_v4, _memory_v5, _memory_v6, _memory_v7, _memory_v8,
                 _memory_v9, _memory_v10, _memory_v11)
