"""The two databases: schemas, append-only turns, deduplicated learnings, FTS kept in sync."""

import sqlite3
import threading
import time
from pathlib import Path

import msgspec
import pytest

from sprite_os.db_worker import Worker
from sprite_os.memory.memory_store import MemoryDB, NewLearning, content_key
from sprite_os.memory.recall.learnings import search_learnings
from sprite_os.memory.schema import MEMORY_SCHEMA, PENDING, PROCESSED, STALE, TRANSCRIPT_SCHEMA
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB


def obs(seq: int, session: str = "s1", ts: float = 100.0) -> NewObservation:
    return NewObservation(timestamp=ts, session_id=session, sequence_num=seq, user_message=f"m{seq}",
                          tool_calls_json="[]", agent_response=f"r{seq}")


def test_schemas_are_versioned_and_wal(tmp_path: Path) -> None:
    t, m = TranscriptDB(tmp_path / "t.db"), MemoryDB(tmp_path / "m.db")
    assert t.schema_version == 5 == len(TRANSCRIPT_SCHEMA) and m.schema_version == 11 == len(MEMORY_SCHEMA)
    for db in (t, m):
        assert db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    tables = {r[0] for r in m.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"learnings", "pending_actions", "learnings_fts", "batches", "meta", "memory_audit"} <= tables
    # Reopening runs no step twice and keeps data.
    t.append(obs(1))
    t.close()
    assert TranscriptDB(tmp_path / "t.db").counts()["total"] == 1


def test_a_turn_is_recorded_once_and_never_changed(tmp_path: Path) -> None:
    t = TranscriptDB(tmp_path / "t.db")
    first = t.append(obs(1))
    assert first is not None
    assert t.append(obs(1)) is None  # same session and sequence: already recorded
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        t.conn.execute("UPDATE observations SET user_message = 'rewritten'")
    with pytest.raises(sqlite3.IntegrityError, match="append-only"):
        t.conn.execute("DELETE FROM observations")
    session = t.session("s1")
    assert session is not None and (session.message_count, session.observation_count) == (1, 1)


def test_processed_states_and_staleness(tmp_path: Path) -> None:
    t = TranscriptDB(tmp_path / "t.db")
    ids = [t.append(obs(n, ts=float(n))) for n in range(1, 5)]
    assert [o.id for o in t.pending()] == ids
    t.set_processed(ids[:1], PROCESSED)
    assert t.mark_stale_before(3.0) == 1  # only pending turns older than the cutoff
    assert t.counts() == {"pending": 2, "processed": 1, "stale": 1, "total": 4}
    assert [o.processed for o in t.get(ids)] == [PROCESSED, STALE, PENDING, PENDING]
    assert t.reset_all_pending() == 2 and t.counts()["pending"] == 4


def test_learnings_are_deduplicated_and_searchable(tmp_path: Path) -> None:
    m = MemoryDB(tmp_path / "m.db")
    batch = m.commit_batch(
        trigger="t", observation_ids=[1, 2], model="claude-haiku-4-5", input_tokens=10, output_tokens=5,
        cost_usd=0.01, file_updates={"user.md": "# U\n"}, base_hashes={"user.md": "abc"},
        learnings=[NewLearning("PREFERENCE", "Dates as DD/MM/YYYY"), NewLearning("PREFERENCE", "dates as dd/mm/yyyy."),
                   NewLearning("ACTION", "Send the invoice on Friday")],
    )
    assert batch.learnings_added == 2 and batch.status == "committed"
    assert batch.file_updates == {"user.md": "# U\n"} and batch.observation_ids == [1, 2]
    hits = search_learnings(m, ["dates"], 5)
    assert [h.content for h in hits] == ["Dates as DD/MM/YYYY"]
    assert [a.content for a in m.pending_actions()] == ["Send the invoice on Friday"]
    # A second batch with the same learning adds nothing.
    again = m.commit_batch(trigger="t", observation_ids=[3], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                           learnings=[NewLearning("FACT", "DATES AS DD/MM/YYYY")], file_updates={}, base_hashes={})
    assert again.learnings_added == 0
    assert m.totals()["learnings"] == 2


def test_fts_follows_every_write_path(tmp_path: Path) -> None:
    m = MemoryDB(tmp_path / "m.db")
    m.commit_batch(trigger="t", observation_ids=[1], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                   learnings=[NewLearning("FACT", "The cat is called Miso")], file_updates={}, base_hashes={})
    m.conn.execute("UPDATE learnings SET content = 'The dog is called Miso'")
    assert search_learnings(m, ["cat"], 5) == [] and len(search_learnings(m, ["dog"], 5)) == 1
    m.conn.execute("DELETE FROM learnings")
    assert search_learnings(m, ["miso"], 5) == []


def test_batch_lifecycle_and_failures(tmp_path: Path) -> None:
    m = MemoryDB(tmp_path / "m.db")
    m.record_failed_batch(trigger="batch", observation_ids=[1], model="m", error="overloaded")
    b = m.commit_batch(trigger="batch", observation_ids=[1], model="m", input_tokens=1, output_tokens=1,
                       cost_usd=0.5, learnings=[], file_updates={}, base_hashes={})
    assert [x.id for x in m.unfinished_batches()] == [b.id]
    m.set_batch_status(b.id, "applied")
    assert [x.status for x in m.unfinished_batches()] == ["applied"]
    m.set_batch_status(b.id, "done")
    assert m.unfinished_batches() == []
    totals = m.totals()
    assert (totals["batches"], totals["failed_batches"], totals["cost_usd"]) == (2, 1, 0.5)
    assert m.last_done_at() == b.created_at == totals["last_success_at"]


def test_a_superseded_batch_is_finished_but_not_a_success(tmp_path: Path) -> None:
    m = MemoryDB(tmp_path / "m.db")
    assert m.last_done_at() is None
    b = m.commit_batch(trigger="batch", observation_ids=[1], model="m", input_tokens=1, output_tokens=1,
                       cost_usd=0.5, learnings=[], file_updates={}, base_hashes={})
    m.set_batch_status(b.id, "superseded")  # a person's edit: its turns run again in a new batch
    assert m.unfinished_batches() == []  # recovery leaves it alone
    assert m.last_done_at() is None and m.totals()["last_success_at"] is None


def test_content_key_normalises() -> None:
    assert content_key("  Likes  TEA. ") == content_key("likes tea")
    assert content_key("likes tea") != content_key("likes coffee")


async def test_worker_runs_every_call_on_its_one_thread(tmp_path: Path) -> None:
    worker = Worker("t", lambda: TranscriptDB(tmp_path / "t.db"))
    names = {await worker.call(lambda _db: threading.current_thread().name) for _ in range(5)}
    assert len(names) == 1 and next(iter(names)).startswith("db-t")
    futures = [worker.submit(lambda db, n=n: db.append(obs(n))) for n in range(1, 51)]
    assert all(f.result() for f in futures)
    assert await worker.call(lambda db: db.counts()["total"]) == 50
    await worker.close()


def test_a_transcript_from_before_forgetting_migrates_and_keeps_its_turns(tmp_path: Path) -> None:
    """A transcript.db at schema 1 (as shipped) gains the turn columns, tombstones and the new trigger."""
    import sqlite_utils

    from sprite_os.database import connect
    from sprite_os.memory.schema import _transcript_v1

    path = tmp_path / "old.db"
    conn = connect(path)
    _transcript_v1(sqlite_utils.Database(conn))
    conn.execute("PRAGMA user_version=1")
    conn.execute("INSERT INTO observations (timestamp, session_id, sequence_num, user_message, tool_calls_json, "
                 "agent_response) VALUES (1.0, 's', 1, 'I live in Lisbon', '[]', 'Noted')")
    conn.close()
    t = TranscriptDB(path)
    try:
        [old] = t.get([1])
        assert (old.user_message, old.turn_id, old.status, old.cost_usd) == ("I live in Lisbon", None, None, None)
        [gone] = t.forget([1], 2.0, "test")
        assert gone.user_message == "I live in Lisbon"
        assert t.get([1])[0].user_message == "" and t.tombstones("s")[1].forgotten_by == "test"
        with pytest.raises(sqlite3.IntegrityError):
            t.conn.execute("DELETE FROM observations")
    finally:
        t.close()


def test_a_transcript_from_before_client_ids_opens_reads_and_keeps_the_id_of_each_new_turn(tmp_path: Path) -> None:
    """A transcript.db at schema 3 (as shipped before client ids were kept) opens: its turns read as
    before, with no client id; a new turn keeps its own; a forgotten turn keeps it too (it names the
    message, never says its words), and nothing may change or delete it."""
    from sprite_os.console.session_queries import turns_page
    from sprite_os.database import connect, migrate

    path = tmp_path / "v3.db"
    conn = connect(path)
    migrate(conn, TRANSCRIPT_SCHEMA[:3])
    conn.execute("INSERT INTO observations (timestamp, session_id, sequence_num, user_message, tool_calls_json, "
                 "agent_response, turn_id, status, cost_usd) VALUES (1.0, 's', 1, 'yes', '[]', 'Done', 't1', "
                 "'completed', 0.001)")
    conn.close()
    t = TranscriptDB(path)
    try:
        assert t.schema_version == len(TRANSCRIPT_SCHEMA)
        assert [o.user_message for o in t.get([1])] == ["yes"]
        new = t.append(msgspec.structs.replace(obs(2, session="s"), turn_id="t2", client_id="web-1"))
        assert new is not None and t.append(msgspec.structs.replace(obs(2, session="s"), client_id="web-2")) is None
        t.append(obs(3, session="s"))  # sent without one
        t.forget([new], 2.0, "test")
        turns, _more = turns_page(t, "s", None, 10)
        assert [(o.sequence_num, o.turn_id, o.client_id, o.user_message) for o in turns] == [
            (1, "t1", None, "yes"), (2, "t2", "web-1", ""), (3, None, None, "m3")]
        for change in ("UPDATE turn_clients SET client_id = 'web-2'", "DELETE FROM turn_clients"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                t.conn.execute(change)
    finally:
        t.close()


def test_the_taken_client_ids_are_the_newest_recorded_first_forgotten_turns_too(tmp_path: Path) -> None:
    """What a restarted runtime seeds its taken ids from: newest first, with the turn each ran as."""
    t = TranscriptDB(tmp_path / "t.db")
    try:
        first = t.append(msgspec.structs.replace(obs(1, session="a"), turn_id="t1", client_id="web-1"))
        t.append(obs(2, session="a"))  # sent without one
        t.append(msgspec.structs.replace(obs(1, session="b"), turn_id="t3", client_id="web-3"))
        assert first is not None
        t.forget([first], 2.0, "test")
        assert [tuple(c) for c in (msgspec.to_builtins(x) for x in t.taken_clients(10))] == [
            ("web-3", "b", "t3"), ("web-1", "a", "t1")]
        assert [c.client_id for c in t.taken_clients(1)] == ["web-3"]
    finally:
        t.close()


def test_a_command_that_left_no_turn_is_taken_by_its_client_id_alone(tmp_path: Path) -> None:
    """A command the CLI ran itself (/compact) leaves no turn; its client id is kept beside the turns' (no
    words, no observation), among the taken ids by when it was taken, once however often it is written
    (a replay), and never changed or deleted."""
    t = TranscriptDB(tmp_path / "t.db")
    try:
        t.append(msgspec.structs.replace(obs(1, session="a"), timestamp=10.0, turn_id="t1", client_id="web-1"))
        for _ in range(2):
            t.record_command("web-compact", "a", "t2", 20.0)
        t.append(msgspec.structs.replace(obs(2, session="a"), timestamp=30.0, turn_id="t3", client_id="web-3"))
        assert [tuple(msgspec.to_builtins(c)) for c in t.taken_clients(10)] == [
            ("web-3", "a", "t3"), ("web-compact", "a", "t2"), ("web-1", "a", "t1")]
        assert [c.client_id for c in t.taken_clients(2)] == ["web-3", "web-compact"]
        assert [o.user_message for o in t.iter_all()] == ["m1", "m2"]
        for change in ("UPDATE command_clients SET client_id = 'web-2'", "DELETE FROM command_clients"):
            with pytest.raises(sqlite3.IntegrityError, match="append-only"):
                t.conn.execute(change)
    finally:
        t.close()


def test_a_turns_whole_row_is_what_the_version_before_reads(tmp_path: Path) -> None:
    """A deploy runs the version before on the new schema until its switch, and again after a rollback;
    it reads whole rows of `observations` into a struct that refuses a column it does not know. So a
    schema step adds no column to it: the client id is kept beside it."""
    t = TranscriptDB(tmp_path / "t.db")
    try:
        t.append(msgspec.structs.replace(obs(1), client_id="web-1"))
        columns = [d[0] for d in t.conn.execute("SELECT * FROM observations").description]
        assert columns == ["id", "timestamp", "session_id", "sequence_num", "user_message", "tool_calls_json",
                           "agent_response", "processed", "turn_id", "status", "cost_usd"]  # as schema 3 left them
        assert [o.user_message for o in t.pending()] == ["m1"]
    finally:
        t.close()


def test_a_column_a_later_version_added_is_left_out_of_the_rows_this_one_reads(tmp_path: Path) -> None:
    """After a rollback, this version runs on the schema a later one left. A column that version added to
    `observations` or `sessions` must not stop this one reading its turns (every `SELECT *` failed)."""
    t = TranscriptDB(tmp_path / "t.db")
    try:
        t.append(obs(1))
        for table in ("observations", "sessions"):
            t.conn.execute(f"ALTER TABLE {table} ADD COLUMN from_a_later_version TEXT DEFAULT 'x'")
        assert [o.user_message for o in t.pending()] == ["m1"]
        assert [o.user_message for o in t.after(0, 10)] == ["m1"]
        session = t.session(obs(1).session_id)
        assert session is not None and session.observation_count == 1
    finally:
        t.close()


def test_a_checkpoint_waits_out_a_readers_short_transaction_and_says_when_it_could_not(tmp_path: Path) -> None:
    """After a forget the WAL holds the words: a reader mid-transaction (a search run at that moment)
    kept them there for good when the one checkpoint found it busy. Now it is tried again."""
    from sprite_os.database import BUSY_TIMEOUT_MS, checkpoint, connect

    path = tmp_path / "x.db"
    writer = connect(path)
    writer.execute("CREATE TABLE t (x TEXT)")
    writer.execute("INSERT INTO t VALUES ('before')")
    reader = connect(path)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM t").fetchone()  # a read transaction pins the WAL
    writer.execute("UPDATE t SET x = 'Zanzibarquux'")
    started = time.monotonic()
    assert checkpoint(writer, tries=2) is False  # held through every try: said, not assumed
    assert time.monotonic() - started < 5  # each try answers at once, not at the busy timeout (5 s)
    assert writer.execute("PRAGMA busy_timeout").fetchone() == (BUSY_TIMEOUT_MS,)  # put back
    threading.Timer(0.1, reader.commit).start()  # the reader ends its transaction soon
    assert checkpoint(writer) is True
    assert (tmp_path / "x.db-wal").stat().st_size == 0
    reader.close()
    writer.close()


def test_migration_9_counts_nothing_left_out_of_the_calls_from_before(tmp_path: Path) -> None:
    """A memory.db of the version before (8) gets the batches' left-out counts at 0 for its calls, and a row the
    version before writes on the new schema (a deploy runs it until its switch) gets 0 too."""
    import sqlite_utils

    from sprite_os.memory.memory_store import LeftOut

    path = tmp_path / "memory.db"
    db = sqlite_utils.Database(sqlite3.connect(path, isolation_level=None))
    for version, step in enumerate(MEMORY_SCHEMA[:8], start=1):
        step(db)
        db.conn.execute(f"PRAGMA user_version={version}")
    before = """INSERT INTO batches (created_at, trigger, status, observation_ids, model, input_tokens,
                output_tokens, cost_usd, file_updates, base_hashes) VALUES (1, 'batch', 'done', '[1]', 'm', 10, 5,
                0.01, '{}', '{}')"""  # as the version before commits a batch
    db.conn.execute(before)
    db.conn.close()
    m = MemoryDB(path)
    assert m.schema_version == len(MEMORY_SCHEMA)
    m.conn.execute(before)
    assert [b.left_out for b in m.recent_batches(5)] == [LeftOut(), LeftOut()]
    totals = m.totals()
    assert (totals["batches"], totals["learnings_over_bound"], totals["lines_ignored"], totals["files_rejected"]) \
        == (2, 0, 0, 0)


def test_a_database_on_a_writable_file_system_is_never_read_as_immutable(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-only open is for a disk gone read-only; on a folder merely closed to the operator a server may be
    writing, and an immutable read (no locks, nothing checked for change) could read its pages half-written."""
    from sprite_os import database

    path = tmp_path / "memory.db"
    MemoryDB(path).close()  # closed: no -wal beside it, the case an immutable read would take on a read-only disk
    opened: list[str] = []
    real = sqlite3.connect
    monkeypatch.setattr(database.sqlite3, "connect", lambda name, **kw: opened.append(name) or real(name, **kw))
    database.read_only_disk(path).close()
    assert opened and "mode=ro" in opened[0] and "immutable" not in opened[0], opened
