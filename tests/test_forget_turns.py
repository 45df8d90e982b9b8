"""Forgetting a turn means gone: which file lines came from it (a pure rule), and, on a real memory
system with the dense retriever on, the words leaving search, auto-recall, the boot prompt, the
vectors, the word index (its segments on disk), the raw bytes of both databases and their WALs,
every version of the memory files, the curator's batch records and the backups, each with a note;
the transcript keeps a tombstone."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import json
import os
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from devkit.harness import make_settings, wait_for
from devkit.mock_bridge import MockBridge
from sprite_os.config import Settings
from sprite_os.memory.files import SPECS, MemoryFiles
from sprite_os.memory.forget.context import NOTHING, SessionContext
from sprite_os.memory.forget.history import strip_files
from sprite_os.memory.forget.jobs import Job, jobs
from sprite_os.memory.forget.lines import (
    DENSE_MARGIN,
    DENSE_THRESHOLD,
    REMOVED,
    came_from,
    content_words,
    kept_holds,
    line_hash,
    meaningful_lines,
    nearest,
    reworded,
    without,
)
from sprite_os.memory.forget.purge import purge_memory
from sprite_os.memory.forget.turns import PASS_RETRY, TurnForgetting
from sprite_os.memory.memory_store import LeftOut, MemoryDB, NewLearning
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall.documents import Marks, stage_turns
from sprite_os.memory.recall.service import vectors_path
from sprite_os.memory.recall.vectors import VectorReader, VectorWriter, read_meta
from sprite_os.memory.schema import FORGOTTEN
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.paths import Layout

# What is recalled and forgotten, not how fast: a failed curator call retried soon, the index's commits
# close together (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("recall_unhurried", "quick_curator_retry", "quick_commits")

T0 = 1_800_000_000.0
WORDS = (b"lisbon", b"tagus", b"alfama")  # only the forgotten turn says them


@pytest.mark.parametrize(("line", "came"), [
    ("- Lives in: Lisbon, by the Tagus", True),
    ("- Lisbon", True),
    ("- Name: Ada", False),
    ("- Likes green tea in the morning", False),  # "morning" alone is not more than half
    ("# User", False),  # headings stay
    ("", False),
    ("(text removed here: a person forgot the turn it came from, on 2026-11-25)", False),
    ("- The user lives in Lisbon", True),  # common words ("the", "user") count for nothing
])
def test_a_line_came_from_the_turn_when_most_of_its_words_did(line: str, came: bool) -> None:
    forgotten = content_words("I live in Lisbon, near the river Tagus, every morning")
    assert came_from(line, forgotten) is came



def test_a_texts_meaningful_lines_are_each_there_once_by_hash_and_never_a_heading_or_a_note() -> None:
    text = f"# User\n\n- Name: Ada\n  - Name: Ada  \n{REMOVED.format(day='2026-11-25')}\n- Lives in: Lisbon\n"
    assert meaningful_lines(text) == {line_hash("- Name: Ada"): "- Name: Ada",
                                      line_hash("- Lives in: Lisbon"): "- Lives in: Lisbon"}

def test_removed_lines_leave_one_note_per_run() -> None:
    text = "# User\n- a\n- b\n- c\n- d\n"
    hashes = {line_hash("- b"), line_hash("- c")}
    assert without(text, hashes) == "# User\n- a\n- d\n"
    assert without(text, hashes, "(gone)") == "# User\n- a\n(gone)\n- d\n"


def test_a_line_is_reworded_when_close_to_the_forgotten_and_closer_to_them_than_to_what_is_kept() -> None:
    def unit(*v: float) -> np.ndarray:
        a = np.asarray(v, dtype=np.float32)
        return a / np.linalg.norm(a)

    anchors = np.stack([unit(1, 0, 0), unit(0, 1, 0)])
    assert nearest(anchors, np.stack([unit(0.1, 1, 0.1), unit(1, 1, 1.2)])) == pytest.approx([0.990, 0.539], abs=1e-3)
    assert nearest(anchors[:0], np.stack([unit(1, 0, 0)])) == [-1.0]  # nothing to be near
    assert nearest(anchors, np.zeros((0, 3), dtype=np.float32)) == []
    t, m = DENSE_THRESHOLD, DENSE_MARGIN
    assert reworded(t, -1.0) and reworded(0.95, 0.95 - m - 0.005)
    assert not reworded(t - 0.001, -1.0)  # not close enough to the forgotten turn
    assert not reworded(0.95, 0.95 - m + 0.005)  # a kept turn says it nearly as well: it stays
    assert not reworded(0.90, 0.97)  # a kept turn says it better


def test_a_line_a_kept_turn_says_as_well_is_that_turns_too() -> None:
    father = ["Noted.", "My father's birthday is on 9 May."]
    assert came_from("- Father's birthday: 9 May", content_words("My mother Rosa's birthday is on 3 May."))
    assert kept_holds("- Father's birthday: 9 May", father)
    assert not kept_holds("- Mother Rosa's birthday: 3 May", father)  # "birthday", "may": not most of it
    assert not kept_holds("- Lives in: Lisbon", ["I'm visiting Porto in May"])
    assert not kept_holds("- Lives in: Lisbon", [])


def test_forgetting_needs_the_operator_once_a_job_is_kept_a_minute_or_while_a_forget_is_cut_short() -> None:
    from sprite_os.memory.forget.turns import KEPT_STUCK, stuck

    assert not stuck(None, 0) and not stuck(KEPT_STUCK - 0.1, 0)  # a moment's failure: tried again soon
    assert stuck(KEPT_STUCK, 0) and stuck(None, 1) and stuck(0.0, 2)


def turn(n: int, user: str, answer: str, tools: str = "[]") -> NewObservation:
    return NewObservation(timestamp=T0 + n, session_id="s1", sequence_num=n, user_message=user,
                          tool_calls_json=tools, agent_response=answer, turn_id=f"t{n}", status="completed")


@pytest.fixture
async def system(tmp_path: Path) -> AsyncIterator[MemorySystem]:
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")  # the dense retriever on: vectors too
    settings.layout.ensure()
    memory = MemorySystem(settings)
    await memory.start()
    yield memory
    await memory.stop()


def raw(path: Path) -> bytes:
    """A file's bytes and its WAL's, case folded."""
    out = b""
    for p in (path, Path(f"{path}-wal")):
        with contextlib.suppress(FileNotFoundError):
            out += p.read_bytes()
    return out.lower()


def stored_vector(store: Path, episode: int) -> np.ndarray:
    """The episode's vector as the store's files hold it, read up to the committed count as the store's
    readers do: the embedder may be appending beside the test, one file after the other. The caller waits
    for the vector first (a store has no meta.json before its first commit)."""
    meta = read_meta(store)
    assert meta is not None, f"no vector committed at {store}"
    ids = np.fromfile(store / "ids.i64", dtype=np.int64, count=meta.count)
    [row] = np.flatnonzero(ids == episode)
    vectors = np.fromfile(store / "vectors.f16", dtype=np.float16, count=meta.count * meta.dim)
    return vectors.reshape(meta.count, meta.dim)[row].astype(np.float32)


def said(path: Path) -> list[bytes]:
    return [w for w in WORDS if w in raw(path)]


async def seed(system: MemorySystem, tmp_path: Path) -> list[int]:
    layout = system.settings.layout

    def write(t: TranscriptDB) -> list[int]:
        t.start_session("s1", T0)
        return [t.append(o) or 0 for o in (
            turn(1, "My name is Ada", "Nice to meet you, Ada."),
            turn(2, "I live in Lisbon, in Alfama, near the river Tagus", "Lisbon by the Tagus, noted.",
                 json.dumps([{"name": "Bash", "input": "echo Alfama", "output": "Alfama", "is_error": False}])),
            turn(3, "I like green tea in the morning", "Green tea it is."))]

    ids = await system.transcript.call(write)
    user_md = "# User\n- Name: Ada\n- Lives in: Lisbon (Alfama), by the Tagus\n- Likes green tea in the morning\n"
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=ids, model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[NewLearning("FACT", "The user's name is Ada", "s1", ids[0]),
                   NewLearning("FACT", "The user lives in Lisbon, in Alfama", "s1", ids[1]),
                   NewLearning("ACTION", "Send Ada a map of the Tagus walk", "s1", ids[1]),
                   NewLearning("PREFERENCE", "Likes green tea", "s1", ids[2])],
        file_updates={"user.md": user_md}, base_hashes={}, left_out=LeftOut(learnings_over_bound=4, lines_ignored=1)))
    system.files.write("user.md", "# User\n- Lives in: Lisbon\n", "batch-0")  # an older version says it too
    system.files.write("user.md", user_md, "batch-1")
    # the backups: an older memory.db (memory rebuild keeps one), and v1's data (migrate-v1 keeps it)
    await system.memory.call(lambda m: m.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
    shutil.copy(layout.memory_db, layout.memory_dir / "memory.db.before-rebuild-20260101T000000")
    v1 = layout.os_dir / "backup" / "v1-20260101T000000Z"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "user.md").write_text("# User\n- Home: Lisbon, Alfama\n- Name: Ada\n")
    with contextlib.closing(sqlite3.connect(v1 / "agent.db")) as old:
        old.execute("CREATE TABLE observations (id INTEGER PRIMARY KEY, user_message TEXT, tool_calls_json TEXT, "
                    "agent_response TEXT)")
        old.execute("INSERT INTO observations VALUES (?, 'I live in Lisbon, in Alfama', '[]', 'Noted, the Tagus')",
                    (ids[1],))
        old.commit()
    system.recall.indexer.nudge()
    await wait_for(lambda: system.recall.indexer.health.embedded >= 3, timeout=60, what="three vectors")
    await asyncio.wait_for(system.recall.indexer.current.wait(), 30)
    return ids


async def test_a_forgotten_turns_words_leave_every_store_and_keep_a_tombstone(
        system: MemorySystem, tmp_path: Path) -> None:
    layout = system.settings.layout
    ids = await seed(system, tmp_path)
    # before: the words are there (so that each check below can fail)
    assert [h.kind for h in await system.search("Lisbon Tagus", 10)]
    assert said(layout.transcript_db) and said(layout.memory_db)
    assert "Lisbon" in await system.boot_prompt()
    doc_freq = lambda: system.recall.index.call(lambda i: i.index.searcher().doc_freq("text", "lisbon"))  # noqa: E731
    assert await doc_freq() > 0
    store = vectors_path(layout.memory_dir, system.recall.status()["dense"]["model"])
    its_vector = stored_vector(store, ids[1])
    assert its_vector.any() and ids[1] in {h[0] for h in VectorReader(store).search(its_vector, 3)}

    done = await system.forget_turns([ids[1]], by="the person, in the console")
    assert [o.id for o in done.turns] == [ids[1]] and done.learnings == 2  # the fact and the action from it

    # at once: search, auto-recall, the boot prompt, the vectors, the index on disk
    for hit in await system.search("Lisbon Tagus Alfama", 10):  # the dense half still finds the nearest others
        assert hit.observation_id != ids[1] and not any(w.decode() in hit.snippet.lower() for w in WORDS), hit
    recalled = await system.recall_for("Do you remember Lisbon and the Tagus?", "s2", "t9")
    assert recalled is None or not any(w.decode() in recalled.context.lower() for w in WORDS)
    prompt = await system.boot_prompt()
    assert not any(w.decode() in prompt.lower() for w in WORDS), prompt
    assert "Name: Ada" in prompt and "green tea" in prompt, prompt  # what else was said stays
    assert not stored_vector(store, ids[1]).any()  # zeros on disk, in place
    assert [h[0] for h in VectorReader(store).search(its_vector, 3)] != [] and \
        ids[1] not in {h[0] for h in VectorReader(store).search(its_vector, 3)}
    assert await system.recall.purged(60)  # the index written anew, in the background
    assert await doc_freq() == 0  # a deletion alone leaves the term in old segments; the index was rewritten
    assert [h.kind for h in await system.search("green tea", 5)]

    # the daemon's next pass: the files, their history, the batch records and the backups
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=30, what="the daemon's forget pass")
    assert system.files.read("user.md") == "# User\n- Name: Ada\n- Likes green tea in the morning\n"
    history = system.files.history("user.md")
    assert history[-1].source == "forget"
    for version in history:
        assert not any(w.decode() in version.text.lower() for w in WORDS), version
    assert any("(text removed here: a person forgot the turn it came from" in v.text for v in history)
    for db in (layout.transcript_db, layout.memory_db):
        assert said(db) == [], db
    backup = layout.memory_dir / "memory.db.before-rebuild-20260101T000000"
    assert said(backup) == []
    with contextlib.closing(sqlite3.connect(backup)) as b:
        assert b.execute("SELECT count(*) FROM forget_notes").fetchone()[0] == 1
    v1 = layout.os_dir / "backup" / "v1-20260101T000000Z"
    assert said(v1 / "agent.db") == []
    assert (v1 / "memory" / "user.md").read_text().startswith("# User\n(text removed here")

    # the tombstone: which turn, when, by whom; never the words. The other turns are as they were.
    t = TranscriptDB(layout.transcript_db)
    try:
        [stone] = t.tombstones("s1").values()
        assert (stone.observation_id, stone.sequence_num, stone.forgotten_by) == (ids[1], 2, "the person, in the console")
        first, second, third = t.get(ids)
        assert (second.user_message, second.agent_response, second.processed) == ("", "", FORGOTTEN)
        assert first.user_message == "My name is Ada" and third.agent_response == "Green tea it is."
        with pytest.raises(sqlite3.IntegrityError):  # still append-only for everything else
            t.conn.execute("UPDATE observations SET user_message = 'back' WHERE id = ?", (ids[1],))
        with pytest.raises(sqlite3.IntegrityError):
            t.conn.execute("UPDATE observations SET user_message = '' WHERE id = ?", (ids[0],))  # no tombstone
    finally:
        t.close()
    m = MemoryDB(layout.memory_db)
    try:
        entry = m.conn.execute("SELECT action, detail FROM memory_audit ORDER BY id DESC LIMIT 1").fetchone()
        assert entry[0] == "forget_turns" and "1 turn of s1" in entry[1]
        # The batch's books outlive the forget, as its tokens and cost do: counts of what its call did, no word.
        totals = m.totals()
        assert (totals["learnings_over_bound"], totals["lines_ignored"]) == (4, 1)
    finally:
        m.close()
    again = await system.forget_turns([ids[1]], by="again")
    assert again.turns == []  # forgotten once: nothing more to do


async def test_a_batch_under_way_when_its_turn_is_forgotten_learns_nothing_from_it(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    from sprite_os.errors import EditConflict

    ids = await system.transcript.call(lambda t: [t.append(turn(1, "I live in Lisbon", "Noted.")) or 0])
    observations = await system.transcript.call(lambda t: t.get(ids))

    async def reply(messages: object) -> object:
        from sprite_os.memory.processor import Completion

        await system.forgetting.forget(ids, by="test")  # forgotten while the curator call is out
        return Completion("FACT: The user lives in Lisbon [#1]\nUSER_MD_UPDATE:\n# User\n- Lisbon\n", 10, 10)

    monkeypatch.setattr(system.curator, "complete", reply)
    with pytest.raises(EditConflict):
        await system.processor.process(observations, "test")
    assert await system.memory.call(lambda m: m.all_learnings()) == []
    assert "Lisbon" not in system.files.read("user.md")


async def test_a_batch_whose_reply_lands_while_a_forget_takes_its_turn_out_learns_nothing(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The forget's job is on disk, its tombstone not yet written (it comes last): the batch is discarded."""
    from sprite_os.errors import EditConflict
    from sprite_os.memory.forget.jobs import add_job

    ids = await system.transcript.call(lambda t: [t.append(turn(1, "I live in Lisbon", "Noted.")) or 0])
    observations = await system.transcript.call(lambda t: t.get(ids))

    async def reply(messages: object) -> object:
        from sprite_os.memory.processor import Completion

        await system.memory.call(lambda m: add_job(m, ids, ["s1"], set(), T0))  # a forget's first step
        return Completion("FACT: The user lives in Lisbon [#1]\nUSER_MD_UPDATE:\n# User\n- Lisbon\n", 10, 10)

    monkeypatch.setattr(system.curator, "complete", reply)
    with pytest.raises(EditConflict):
        await system.processor.process(observations, "test")
    assert await system.memory.call(lambda m: m.all_learnings()) == []


async def test_a_forget_that_lands_between_the_batchs_check_and_its_commit_leaves_no_learning_of_the_turn(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch looks for a forget of its turns once its reply is in, then reads the files (a person's edit)
    and commits: a forget that takes the turn out in between (its job, memory.db, recall, the tombstone)
    must still find nothing of the turn in memory.db afterwards; the learnings the batch drew from it used to
    be committed after the forget's purge, searchable until the next start."""
    from sprite_os.errors import EditConflict
    from sprite_os.memory.processor import Completion

    ids = await system.transcript.call(lambda t: [t.append(turn(1, "I live in Lisbon", "Noted.")) or 0])
    observations = await system.transcript.call(lambda t: t.get(ids))

    async def reply(messages: object) -> object:
        return Completion(f"FACT: The user lives in Lisbon [#{ids[0]}]\n", 10, 10)

    real, forgot = system.processor._drop_edited, []

    async def forget_meanwhile(*args: object) -> list[str]:
        forgot.append(await system.forget_turns(ids, by="test"))
        return await real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(system.curator, "complete", reply)
    monkeypatch.setattr(system.processor, "_drop_edited", forget_meanwhile)
    with contextlib.suppress(EditConflict):
        await system.processor.process(observations, "test")
    assert forgot and [o.id for o in forgot[0].turns] == ids
    assert [lr.content for lr in await system.memory.call(lambda m: m.all_learnings())] == []


async def test_until_the_daemons_pass_the_boot_prompt_leaves_the_lines_out(system: MemorySystem,
                                                                         tmp_path: Path) -> None:
    async def busy() -> None:  # the daemon is in a long curator call: its pass waits
        pass

    system.daemon.before_batches = busy
    ids = await seed(system, tmp_path)
    await system.forget_turns([ids[1]], by="test")
    assert "Lisbon" in system.files.read("user.md")  # not rewritten yet
    prompt = await system.boot_prompt()
    assert "Lisbon" not in prompt and "- Name: Ada" in prompt
    assert await system.forgetting.decided(60)  # the boot waited for the current files' lines alone
    assert await system.forgetting.rewrite_files() == 1  # the pass, when it comes
    assert "Lisbon" not in system.files.read("user.md") and await system.memory.call(jobs) == []


async def _no_pass() -> None:
    pass


REWORDED = "- Home: the Alfama district, in Portugal's capital city"  # the curator's words, not the turn's
UNRELATED = "- Visiting Porto in May for a conference"


async def test_a_line_the_curator_reworded_leaves_the_file_and_an_unrelated_one_stays(system: MemorySystem) -> None:
    said_it = "I live in Lisbon, in Alfama, since last spring"
    assert not came_from(REWORDED, content_words(said_it))  # the words alone would keep it

    def write(t: TranscriptDB) -> list[int]:
        t.start_session("s1", T0)
        return [t.append(o) or 0 for o in (turn(1, "My name is Ada", "Hello Ada."),
                                           turn(2, said_it, "Alfama, noted."),
                                           turn(3, "I'm going to a conference in Porto in May", "Noted."))]

    ids = await system.transcript.call(write)
    user_md = f"# User\n- Name: Ada\n{REWORDED}\n{UNRELATED}\n"
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=ids, model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[NewLearning("FACT", "The user lives in Alfama, Lisbon", "s1", ids[1])],
        file_updates={"user.md": user_md}, base_hashes={}))
    system.files.write("user.md", user_md, "batch-1")
    system.daemon.before_batches = _no_pass  # the pass comes later: the prompt hides the lines alone
    await system.forget_turns([ids[1]], by="test")
    prompt = await system.boot_prompt()  # a new session (one the forget restarted) waits for the decision
    assert "Alfama" not in prompt and UNRELATED in prompt
    system.daemon.before_batches = system.forgetting.rewrite_files
    system.daemon.trigger("test")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's forget pass")
    assert system.files.read("user.md") == f"# User\n- Name: Ada\n{UNRELATED}\n"
    for version in system.files.history("user.md"):
        assert "Alfama" not in version.text, version
    batches = await system.memory.call(lambda m: m.conn.execute("SELECT file_updates FROM batches").fetchall())
    assert "Alfama" not in json.dumps(batches) and UNRELATED in json.loads(batches[0][0])["user.md"]


async def test_a_purge_cut_short_by_a_stop_is_done_at_the_next_start(tmp_path: Path) -> None:
    from sprite_os.memory.schema import PURGE_KEY

    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9").with_overrides(embedding_model="off")
    first = MemorySystem(settings)
    await first.start()
    await first.memory.call(lambda m: m.set_meta(PURGE_KEY, "1"))  # as a forget leaves it, before its rewrite
    # a turn forgotten (its episode has no text) whose vector the stop left in a store; the turn after it,
    # whose vector holds the forgotten turn's words; one of another session
    await first.memory.call(lambda m: ep.add(m.conn, [ep.Episode(1, "s1", 1, T0, ""),
                                                      ep.Episode(2, "s1", 2, T0 + 1, "kept"),
                                                      ep.Episode(3, "s2", 1, T0 + 2, "kept too")]))
    await first.stop()
    store = vectors_path(settings.layout.memory_dir, "an-earlier-model")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 384)).astype(np.float32)
    VectorWriter(store, "an-earlier-model").add([1, 2, 3], [T0, T0 + 1, T0 + 2],
                                                x / np.linalg.norm(x, axis=1, keepdims=True))
    again = MemorySystem(settings)
    await again.start()
    try:
        assert again.recall._purge is not None  # the start took the rewrite up
        assert await again.recall.purged(30)
        assert await again.memory.call(lambda m: m.get_meta(PURGE_KEY)) is None
        # with no embedder running: the turn after the forgotten one can't be embedded again, so its vector goes
        assert not stored_vector(store, 1).any() and not stored_vector(store, 2).any()
        assert stored_vector(store, 3).any()
        assert [h[0] for h in VectorReader(store).search(x[0], 5)] == [3]
    finally:
        await again.stop()


async def test_a_turn_forgotten_before_it_was_indexed_stays_without_words(tmp_path: Path) -> None:
    """The indexer may hold a turn as it read it before the forget: staging it afterwards brings nothing back."""
    t, m = TranscriptDB(tmp_path / "t.db"), MemoryDB(tmp_path / "m.db")
    try:
        t.append(turn(1, "I live in Lisbon", "Noted, Lisbon."))
        held = t.between(1, 1, 10)  # read by the indexer, not staged yet
        purge_memory(m, t.forget([held[0].id], T0 + 5, "test"))
        staged = stage_turns(m.conn, held, (1, 1), Marks())
        assert staged.docs == [] and ep.get(m.conn, [held[0].id])[held[0].id].text == ""
    finally:
        t.close()
        m.close()


# ---------------------------------------------------------------- near misses: what a kept turn says stays

async def _seed(system: MemorySystem, turns: Sequence[NewObservation], user_md: str,
                learnings: Sequence[tuple[int, str]]) -> list[int]:
    def write(t: TranscriptDB) -> list[int]:
        t.start_session("s1", T0)
        return [t.append(o) or 0 for o in turns]

    ids = await system.transcript.call(write)
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=ids, model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[NewLearning("FACT", text, "s1", ids[i]) for i, text in learnings],
        file_updates={"user.md": user_md}, base_hashes={}))
    system.files.write("user.md", user_md, "batch-1")
    return ids


KEPT = ("- Doctor appointment on 5 April at 10am", "- Brother Rui lives in Porto",
        "- Daughter Ana plays tennis on Sundays")


async def test_forgetting_a_turn_keeps_other_turns_facts_on_the_same_subject(system: MemorySystem) -> None:
    turns = (turn(1, "My dentist appointment is on 3 March at 9am.", "Saved."),
             turn(2, "I also have a doctor appointment on 5 April at 10am.", "Saved too."),
             turn(3, "My sister Bea lives in Porto.", "Noted."),
             turn(4, "And my brother Rui lives in Porto too.", "Noted."),
             turn(5, "My son Pedro plays football on Saturdays.", "Nice."),
             turn(6, "My daughter Ana plays tennis on Sundays.", "Nice."))
    user_md = "# User\n" + "\n".join(KEPT) + "\n"
    ids = await _seed(system, turns, user_md, [(1, "The user has a doctor appointment on 5 April."),
                                               (3, "The user's brother Rui lives in Porto."),
                                               (5, "The user's daughter Ana plays tennis on Sundays.")])
    await system.forget_turns([ids[0], ids[2], ids[4]], by="test")  # the dentist, the sister, the son
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert [line for line in KEPT if line not in system.files.read("user.md")] == []
    assert not any("text removed" in v.text for v in system.files.history("user.md"))


async def test_a_line_of_the_forgotten_turns_words_that_a_kept_turn_says_too_stays(system: MemorySystem) -> None:
    mum, dad = "- Mother Rosa's birthday: 3 May", "- Father's birthday: 9 May"
    ids = await _seed(system, (turn(1, "My mother Rosa's birthday is on 3 May.", "I'll remind you."),
                               turn(2, "My father's birthday is on 9 May.", "Noted.")),
                      f"# User\n{mum}\n{dad}\n", [])
    await system.forget_turns([ids[0]], by="test")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert system.files.read("user.md") == f"# User\n{dad}\n"  # most of its words were the forgotten turn's


async def test_a_fact_another_kept_turn_also_says_stays(system: MemorySystem) -> None:
    user_md = f"# User\n- Name: Ada\n{REWORDED}\n"
    ids = await _seed(system, (turn(1, "I live in Lisbon, in Alfama, since last spring", "Alfama, noted."),
                               turn(2, "Still loving my flat in Alfama, Lisbon is home now.", "Glad to hear.")),
                      user_md, [(0, "The user lives in Alfama, Lisbon"), (1, "The user lives in Alfama, Lisbon")])
    await system.forget_turns([ids[0]], by="test")  # the second turn, which says the same, is kept
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert REWORDED in system.files.read("user.md")


async def test_the_meaning_is_decided_at_the_forget_so_a_pass_meanwhile_misses_nothing(system: MemorySystem) -> None:
    user_md = f"# User\n- Name: Ada\n{REWORDED}\n"
    ids = await _seed(system, (turn(1, "My name is Ada", "Hello Ada."),
                               turn(2, "I live in Lisbon, in Alfama, since last spring", "Alfama, noted.")),
                      user_md, [(1, "The user lives in Alfama, Lisbon")])
    forgetting = system.forgetting
    real_embed = forgetting.judge.embed
    assert real_embed is not None
    passes: list[int] = []

    async def slow_embed(texts: Sequence[str]) -> np.ndarray | None:  # the daemon's pass runs meanwhile
        if not passes:
            passes.append(await forgetting.rewrite_files())
        return await real_embed(texts)

    forgetting.judge.embed = slow_embed
    wake, forgetting.wake_daemon = forgetting.wake_daemon, lambda reason: None
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    assert passes == [0]  # the job is being decided: the pass leaves it alone
    found = (await system.memory.call(jobs))[0].line_hashes
    assert line_hash(REWORDED) in found  # kept as a hash: a restart before the pass loses nothing
    wake("forget")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert REWORDED not in system.files.read("user.md") and "- Name: Ada" in system.files.read("user.md")


SOUL = Path(__file__).resolve().parents[1] / "bootstrap" / "templates" / "soul.md"


async def test_forgetting_a_preference_leaves_the_deploys_files_and_their_history_whole(system: MemorySystem) -> None:
    assert {n for n, spec in SPECS.items() if spec.owner == "deploy"} == {"soul.md", "os.md"}
    soul = SOUL.read_text()
    system.files.write("soul.md", soul, "deploy")
    system.files.write("soul.md", soul + "\n", "deploy")  # a second deploy: the first is a version now
    before = [v.text for v in system.files.history("soul.md")]

    def write(t: TranscriptDB) -> list[int]:
        t.start_session("s1", T0)
        return [t.append(turn(1, "Please ask me before you delete any of my files, and never share my personal "
                                 "details.", "I'll ask first and keep your details private.")) or 0]

    ids = await system.transcript.call(write)
    await system.forget_turns(ids, by="test")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert system.files.read("soul.md") == soul + "\n"
    assert [v.text for v in system.files.history("soul.md")] == before


MUM, DAD = "- Mother Rosa's birthday: 3 May", "- Father's birthday: 9 May"  # the father's: most words the mother's turn's
BIRTHDAYS = (turn(1, "My mother Rosa's birthday is on 3 May.", "I'll remind you."),
             turn(2, "My father's birthday is on 9 May.", "Noted."))


async def test_a_forget_cut_short_is_decided_at_the_next_start_with_the_kept_turn_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The transcript loses the words first, and the job is on disk, undecided: a stop while the lines
    are decided (the kept-turn search, the embedding) cancels the decision at once, and the pass at the
    next start decides it: the forgotten turn's line goes, the line a kept turn says stays."""
    monkeypatch.setattr("sprite_os.stopping.DECISION", 0.5)  # the stop's wait for the hung decision: not 10 s
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await _seed(first, BIRTHDAYS, f"# User\n{MUM}\n{DAD}\n", [])
    stuck = asyncio.Event()

    async def hung(lines: object) -> list[list[str]]:
        stuck.set()
        await asyncio.sleep(3600)  # the index lagging, the embedder busy: a stop meanwhile
        return []

    first.forgetting.judge.kept_near = hung
    await asyncio.wait_for(first.forget_turns([ids[0]], by="test"), 60)  # answers once the words are out
    await asyncio.wait_for(stuck.wait(), 60)
    assert await first.forgetting.rewrite_files() == 0  # a job being decided waits for its decision
    await asyncio.wait_for(first.stop(), 60)  # the stop waits for the decision a while, then cuts it short
    row = await asyncio.to_thread(lambda: sqlite3.connect(settings.layout.transcript_db).execute(
        "SELECT processed FROM observations WHERE id = ?", (ids[0],)).fetchone())
    assert row[0] == FORGOTTEN
    [job] = _jobs(settings.layout.memory_db)
    assert not job.decided and line_hash(MUM) in job.line_hashes and line_hash(DAD) in job.line_hashes
    again = MemorySystem(settings)
    await again.start()
    try:
        await wait_for(lambda: again.memory.call(lambda m: not jobs(m)), timeout=60, what="the pass at the start")
        assert again.files.read("user.md") == f"# User\n{DAD}\n"
    finally:
        await again.stop()


def _jobs(path: Path) -> list[Job]:
    db = MemoryDB(path)
    try:
        return jobs(db)
    finally:
        db.close()


@pytest.mark.parametrize(("failure", "said"), [("raises", "failed: OSError"), ("times out", "took over 0.2 s"),
                                              ("gives up", "gave up: the word index is still behind")])
async def test_a_failed_kept_turn_check_keeps_the_line_until_a_check_succeeds(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch, failure: str, said: str) -> None:
    """A check that fails leaves the lines in the files (out of the boot prompt), and the decision tries
    again on its own timer, the last pause again and again, with no new turn or daemon pass to wake it."""
    import sprite_os.memory.forget.judge as ft

    ids = await _seed(system, BIRTHDAYS, f"# User\n{MUM}\n{DAD}\n", [])
    forgetting = system.forgetting
    real, forgetting.retries = forgetting.judge.kept_near, (0.01, 0.05)
    assert real is not None
    tries: list[int] = []
    checked = asyncio.Event()

    async def failing(lines: Sequence[tuple[str, bool]]) -> list[list[str]]:
        tries.append(len(lines))
        if len(tries) > 4:
            return await real(lines)
        if len(tries) == 4:
            # the tries after this one check for real, with the usual time: under load they began before
            # the test had looked (the file, the boot prompt) and timed out at 0.2 s, failures of their own
            monkeypatch.setattr(ft, "KEPT_CHECK_TIMEOUT", 120.0)  # this try's limit is taken: 0.2 s
            checked.set()
            await asyncio.sleep(0.5)  # the file and the boot prompt, looked at meanwhile
        if failure == "raises":
            raise OSError("the vector store is unreadable")
        if failure == "gives up":
            raise TimeoutError("the word index is still behind what is recorded after 30 s")
        await asyncio.sleep(3600)
        return []

    monkeypatch.setattr(ft, "KEPT_CHECK_TIMEOUT", 0.2)
    forgetting.judge.kept_near = failing
    forgetting.wake_daemon = lambda reason: None  # no pass: the decision's own timer alone
    with capture_logs() as logs:
        await system.forget_turns([ids[0]], by="test")
        await asyncio.wait_for(checked.wait(), 60)
        assert system.files.read("user.md") == f"# User\n{MUM}\n{DAD}\n"  # nothing unchecked left the file
        prompt = await system.boot_prompt(settle=False)
        assert "Rosa" not in prompt and "Father" not in prompt  # both out of the boot prompt until decided
        assert await forgetting.decided(60)
    failed = [e for e in logs if e["event"] == "forget_check_failed"]
    assert [e["next_try_s"] for e in failed] == [0.01, 0.05, 0.05, 0.05] and said in failed[0]["error"]
    assert await forgetting.rewrite_files() == 1
    assert system.files.read("user.md") == f"# User\n{DAD}\n"


async def test_a_line_the_curator_writes_after_the_forget_gets_the_kept_turn_check(system: MemorySystem) -> None:
    """A batch under way writes lines after the forget decided: the pass judges them as the forget
    would have, the kept-turn check included."""
    ids = await _seed(system, BIRTHDAYS, "# User\n- Name: Ada\n", [])
    # The seeded batch is left committed, as after a crash: finished here, with any run of the daemon's
    # under way (its retry after the unreachable curator recovers it too), before the batch below writes.
    await system.daemon.processor.recover()
    await wait_for(lambda: system.daemon.settle(30), timeout=60, what="the daemon idle, nothing left to recover")
    forgetting = system.forgetting
    forgetting.wake_daemon = lambda reason: None

    async def no_pass() -> None:  # no pass of the daemon's own meanwhile
        pass

    system.daemon.before_batches = no_pass
    await system.forget_turns([ids[0]], by="test")
    assert await forgetting.decided(60)
    assert (await system.memory.call(jobs))[0].line_hashes == []  # nothing in the files came from it yet
    system.files.write("user.md", f"# User\n- Name: Ada\n{MUM}\n{DAD}\n", "batch-2")  # the batch under way
    assert await forgetting.rewrite_files() == 1
    assert system.files.read("user.md") == f"# User\n- Name: Ada\n{DAD}\n"


async def test_a_line_vector_cache_lets_go_of_the_least_recently_used_only(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    import sprite_os.memory.forget.judge as ft

    embedded: list[str] = []

    async def embed(texts: Sequence[str]) -> np.ndarray:
        embedded.extend(texts)
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    monkeypatch.setattr(ft, "LINE_VECTORS_KEPT", 3)
    forgetting = system.forgetting
    forgetting.judge.embed = embed
    await forgetting.judge._vectors(["a", "b", "c"])
    await forgetting.judge._vectors(["a", "d"])  # "a" used again: "b" is the oldest
    assert embedded == ["a", "b", "c", "d"]
    embedded.clear()
    out = await forgetting.judge._vectors(["a", "b", "c", "d"])
    assert out is not None and out.shape == (4, 4) and embedded == ["b"]  # only the one let go, not all


async def test_the_agents_echo_in_a_kept_turn_does_not_keep_a_forgotten_line(system: MemorySystem) -> None:
    line = "- Lives in Alfama, Lisbon"
    ids = await _seed(system, (turn(1, "I live in Alfama, Lisbon.", "Noted."),
                               turn(2, "What's the weather like today?",
                                    "Sunny in Lisbon today, a fine day to live in Alfama.")),
                      f"# User\n{line}\n", [])
    await system.forget_turns([ids[0]], by="test")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert line not in system.files.read("user.md")  # the person never said it again; only the agent echoed it


async def test_a_long_kept_turn_that_says_the_fact_keeps_it(system: MemorySystem) -> None:
    line = "- Brother Rui lives in Porto"
    filler = "we talked about the weather, the garden, the old car and the new kitchen tiles at length; " * 4
    ids = await _seed(system, (turn(1, "Rui lives in Porto.", "Noted."),
                               turn(2, f"My brother Rui, {filler} he lives in Porto.", "Noted.")),
                      f"# User\n{line}\n", [])
    await system.forget_turns([ids[0]], by="test")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the daemon's pass")
    assert line in system.files.read("user.md")  # turn 2, kept, says every word of it


async def _left(memory: MemorySystem) -> list[str]:
    """Where 'Lisbon' can still be found, by the agent or a person."""
    left = []
    if "Lisbon" in memory.files.read("user.md"):
        left.append("user.md")
    if "Lisbon" in await memory.boot_prompt(settle=False):
        left.append("boot prompt")
    if any("Lisbon" in h.snippet or "Tagus" in h.snippet for h in await memory.search("Lisbon Tagus", limit=10)):
        left.append("search")
    if any("Lisbon" in lr.content for lr in await memory.memory.call(lambda m: m.all_learnings())):
        left.append("learnings")
    return left


class _Killed(Exception):
    """A step of the forget fails: what it leaves on disk is what a kill there leaves."""


async def _cut_short_at_recall(system: MemorySystem, turn_id: int, error: Exception | None = None) -> None:
    """A forget of `turn_id` that an error (`_Killed` unless given) cuts short at recall's purge: its job on disk,
    memory.db purged, no tombstone, the turn's words in the transcript. Recall's purge works again after it."""
    forgetting = system.forgetting
    real = forgetting.purge_recall
    failure = error or _Killed()

    async def purge(*_: object) -> None:
        raise failure

    forgetting.purge_recall = purge
    try:
        with pytest.raises(type(failure)):
            await system.forget_turns([turn_id], by="test")
    finally:
        forgetting.purge_recall = real


@contextlib.asynccontextmanager
async def _finished_at_the_next_start(settings: Settings, ids: list[int], forgotten: int) -> AsyncIterator[MemorySystem]:
    """The next start, once it has finished the forget of `forgotten` (every step again, then the pass)."""
    again = MemorySystem(settings)
    await again.start()
    try:
        assert await again.transcript.call(lambda t: t.forgotten_among(ids)) == [forgotten]
        assert await again.forgetting.decided(60)
        await wait_for(lambda: again.memory.call(lambda m: not jobs(m)), timeout=60, what="the pass")
        yield again
    finally:
        await again.stop()


async def _cut_short_then_stopped(settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  forget: Callable[[MemorySystem, list[int]], Awaitable[object]]) -> list[int]:
    """A server's memory, seeded, whose `forget` fails at the tombstone (until `monkeypatch.undo()`), then
    stopped: the job on disk, the turns' words in the transcript. Returns the turns."""
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await seed(first, tmp_path)
    _fail_at_the_tombstone(monkeypatch)
    with pytest.raises(_Killed):
        await forget(first, ids)
    await first.stop()
    return ids


def _fail_at_the_tombstone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forget's last step fails (until `monkeypatch.undo()`): its job on disk, the turn's words in the transcript."""
    def tombstone(*_: object) -> None:
        raise _Killed

    monkeypatch.setattr(TranscriptDB, "forget", tombstone)


async def test_a_rebuild_carries_a_forget_not_finished_over_and_curates_none_of_its_turns(
        tmp_path: Path, bridge: MockBridge, monkeypatch: pytest.MonkeyPatch) -> None:
    """`memory rebuild` sets memory.db aside, forget jobs and all, and curates every turn again: a forget an
    error cut short (its turn still pending, words and all) went to the curator, its learnings came back,
    and no start would finish it, the job being in the copy set aside. Now the rebuild carries the job over
    and leaves its turns out; the next start finishes the forget, copy set aside included."""
    from sprite_os.commands.memory_search import search_main
    from sprite_os.memory.curation import rebuild as module
    from sprite_os.memory.recall.rebuild import rebuild_recall

    settings = make_settings(tmp_path / "ws", bridge.url)
    ids = await _cut_short_then_stopped(settings, tmp_path, monkeypatch,
                                        lambda m, ids: m.forget_turns([ids[1]], by="test"))
    monkeypatch.undo()
    bridge.curator.script("FACT: The user's name is Ada [#1]\nPREFERENCE: Likes green tea [#3]")
    earlier = len(bridge.curator_requests())  # the first server's batch of the seeded turns, before the forget
    report = await module.rebuild(settings)
    sent = " ".join(json.dumps(r.body) for r in bridge.curator_requests()[earlier:]).lower()
    assert sent and not [w.decode() for w in WORDS if w.decode() in sent]  # the forgotten turn went to no call
    assert report.forgets == 1 and report.backup is not None
    new = MemoryDB(settings.layout.memory_db)
    try:
        assert [job.observation_ids for job in jobs(new)] == [[ids[1]]]
    finally:
        new.close()
    # The command then makes recall again from transcript.db, where the turn's words still are: its episode
    # is made without them (it wrote them into memory.db and the word index, and `memory search` found them
    # until the next start).
    rebuild_recall(settings, lambda *_: None, report.before)
    assert said(settings.layout.memory_db) == []
    found = io.StringIO()
    search_main(settings, "Lisbon Tagus Alfama green tea", 10, True, True, stdout=found)
    hits = json.dumps(json.loads(found.getvalue())["hits"]).lower()
    assert "green tea" in hits and not [w for w in WORDS if w.decode() in hits], hits
    async with _finished_at_the_next_start(settings, ids, ids[1]) as again:
        assert said(settings.layout.transcript_db) == [] and said(report.backup) == []
        assert await _left(again) == []


async def test_a_rebuild_carries_a_forget_whose_file_pass_is_to_come_and_the_next_start_takes_its_lines_out(
        tmp_path: Path, bridge: MockBridge) -> None:
    """A forget whose words are gone but whose lines are still in the files (the daemon's pass to come) when
    `memory rebuild` runs: the rebuild keeps the files' text as a version and sets memory.db aside, lines and
    all, and carries the job over; the next start's pass takes the lines out of both."""
    from sprite_os.memory.curation import rebuild as module

    settings = make_settings(tmp_path / "ws", bridge.url)
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await seed(first, tmp_path)

    async def no_pass() -> int:
        return 0

    first.daemon.before_batches = no_pass
    await first.forget_turns([ids[1]], by="test")
    assert await first.forgetting.decided(60)
    await first.stop()
    assert "Lisbon" in first.files.read("user.md")  # the pass to come
    bridge.curator.script("FACT: The user's name is Ada [#1]\nPREFERENCE: Likes green tea [#3]")
    report = await module.rebuild(settings)
    assert report.forgets == 1 and report.backup is not None
    assert not first.files.read("user.md") and any("Lisbon" in v.text for v in first.files.history("user.md"))
    async with _finished_at_the_next_start(settings, ids, ids[1]) as again:
        assert not [v.number for v in again.files.history("user.md") if "lisbon" in v.text.lower()]
        assert said(report.backup) == [] and await _left(again) == []


@pytest.mark.parametrize("killed_after", ["the job's write, its answer lost", "the job", "memory.db", "recall",
                                          "the tombstone, before the job"])
async def test_a_forget_cut_short_anywhere_is_finished_at_the_next_start(
        tmp_path: Path, killed_after: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job goes on disk before any store loses the words, the transcript's tombstone last: a forget cut
    short at any step is finished at the next start (every step again), and forgetting the turn again
    finds nothing left to forget. 'the tombstone, before the job': the order of steps before (the
    tombstone first, nothing else), which memory.db's words still allow to finish. "the job's write, its answer
    lost": a cancel (a stop cutting the request) that lands as memory.db's thread commits the job."""
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await seed(first, tmp_path)
    if killed_after == "the tombstone, before the job":
        await first.transcript.call(lambda t: t.forget([ids[1]], T0 + 50, "test"))
    else:
        forgetting = first.forgetting
        if killed_after.startswith("the job"):
            real_apply, calls = forgetting.apply, []

            async def apply(change: object) -> object:
                calls.append(1)
                if killed_after == "the job" and len(calls) == 2:  # purge_memory
                    raise _Killed
                done = await real_apply(change)  # type: ignore[arg-type]
                if len(calls) == 1 and killed_after != "the job":  # add_job committed, its answer lost
                    raise _Killed
                return done

            forgetting.apply = apply  # type: ignore[assignment]
        elif killed_after == "memory.db":
            async def purge(*_: object) -> None:
                raise _Killed

            forgetting.purge_recall = purge
        else:
            _fail_at_the_tombstone(monkeypatch)
        with pytest.raises(_Killed):
            await first.forget_turns([ids[1]], by="test")
        monkeypatch.undo()
        # The daemon's pass, should it run before the stop, leaves the job to the next start: finishing it
        # would end the forget with the turn's words still in the transcript.
        assert await first.forgetting.rewrite_files() == 0
        assert len(await first.memory.call(jobs)) == 1
        # ...and says so: its turns keep their words until the next start, or the person's forget again
        assert (await first.status())["forget"]["cut_short_jobs"] == 1 and (await first.status())["degraded"]
    await first.stop()
    async with _finished_at_the_next_start(settings, ids, ids[1]) as again:
        assert await again.recall.purged(30)
        redo = await again.forget_turns([ids[1]], by="test")  # the person tries again: nothing left
        assert (await _left(again), len(redo.turns)) == ([], 0)
        assert "Green tea" in again.files.read("user.md") or "green tea" in again.files.read("user.md")


@pytest.mark.parametrize("fails_at", ["the tombstone", "the files' lines"])
async def test_a_forget_cut_short_whose_retry_at_the_start_fails_too_leaves_memory_started_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_at: str) -> None:
    """A forget an error cut short is run again at the next start, before the daemon starts. When that failed too
    (the same disk error, a store locked), memory's start failed with it, and the server with it, at every start
    until the cause was gone. Now the start goes on: the forget stays cut short, said so (memory degraded), for
    the next start or the person's forget again, which finishes it once the cause is gone. A whole session's
    forget is still said to be one after the restart: the mark lived in memory only, and Health then told the
    person to forget "the turn" again. `fails_at`: where the start's retry fails (the files' lines: before it
    could say anything of the job, so only the job's row says it was a session's)."""
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    ids = await _cut_short_then_stopped(settings, tmp_path, monkeypatch,
                                        lambda m, _: m.forget_turns(session_id="s1", by="test"))
    if fails_at == "the files' lines":
        async def unreadable(_self: object) -> object:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(TurnForgetting, "_lines", unreadable)
    again = MemorySystem(settings)
    try:
        with capture_logs() as logs:
            await again.start()  # its retry of the forget fails as the forget did
        assert [e["job"] for e in logs if e["event"] == "forget_resume_failed"] == [1], logs
        await wait_for(lambda: _cut_short_counted(again, 1), timeout=30, what="the forget counted cut short")
        assert (await again.status())["degraded"] is True
        # ...as a whole session's: Health says to forget the session again (it said "the turn" after a restart)
        assert again.forgetting.cut_short_whole_sessions == 1
        await again.forgetting.rewrite_files()  # the pass's count says the same
        assert again.forgetting.cut_short_whole_sessions == 1
        monkeypatch.undo()  # the cause gone: the person's forget again finishes it
        await again.forget_turns(session_id="s1", by="test")
        assert await again.forgetting.decided(60)
        await wait_for(lambda: again.memory.call(lambda m: not jobs(m)), timeout=60, what="both jobs finished")
        assert sorted(await again.transcript.call(lambda t: t.forgotten_among(ids))) == sorted(ids)
        await wait_for(lambda: _cut_short_counted(again, 0), timeout=30, what="memory well again")
    finally:
        await again.stop()


@pytest.mark.parametrize("fails_at", ["memory.db", "the files' lines"])
async def test_a_start_whose_retry_of_a_forgotten_turns_words_memory_still_holds_fails_says_so_and_finishes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails_at: str) -> None:
    """A forgotten turn (its tombstone written) whose words memory.db still holds is taken out again at the start,
    under a job of its own. When that failed, the start went on with nothing said: its turn has its tombstone, so the
    pass took the job for done, finished it, and memory was ok while memory.db kept the turn's learnings and text,
    which search and the boot prompt then served. Now a job whose turns memory.db holds words of is cut short like
    one without its tombstones: counted, memory degraded, left for the person's forget again, which finishes it.
    `fails_at`: where the start's retry fails (the files' lines: before it wrote its job, so none said it at all)."""
    from sprite_os.memory.forget import turns as turns_module

    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await seed(first, tmp_path)
    await first.transcript.call(lambda t: t.forget([ids[1]], T0 + 50, "test"))  # its words left in memory.db
    await first.stop()

    def failing(*_: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    async def unreadable(_self: object) -> object:
        raise OSError(5, "Input/output error")

    if fails_at == "memory.db":
        monkeypatch.setattr(turns_module, "purge_memory", failing)
    else:
        monkeypatch.setattr(TurnForgetting, "_lines", unreadable)
    again = MemorySystem(settings)
    try:
        with capture_logs() as logs:
            await again.start()
        assert [e["event"] for e in logs if e["event"] == "forget_resume_failed"] == ["forget_resume_failed"]
        await wait_for(lambda: _cut_short_counted(again, 1), timeout=30, what="the forget counted cut short")
        assert (await again.status())["degraded"] is True
        await again.forgetting.rewrite_files()
        assert len(await again.memory.call(jobs)) == 1  # not finished while memory.db holds the words
        assert await _cut_short_counted(again, 1)
        monkeypatch.undo()  # the cause gone: the person's forget again finishes it
        await again.forget_turns([ids[1]], by="test")
        assert await again.forgetting.decided(60)
        await wait_for(lambda: again.memory.call(lambda m: not jobs(m)), timeout=60, what="both jobs finished")
        assert await again.recall.purged(30)
        assert await _left(again) == []
        await wait_for(lambda: _cut_short_counted(again, 0), timeout=30, what="memory well again")
    finally:
        await again.stop()


async def test_a_forget_cut_short_before_memory_lost_its_words_is_searched_by_no_one_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget an error cut short before memory.db lost the turn's words (a disk error there) keeps its job, and a
    start whose run again of it fails too now comes up, degraded, rather than failing. Search and auto-recall read
    memory.db: they served the turn's text and the learnings drawn from it, to the agent and the console, while
    the person had asked to forget it (the server used to stay down instead). Now what a forget job names is
    found by no search, as no batch and no boot prompt takes it."""
    from sprite_os.console.memory_queries import learnings_by_id, listed_learnings
    from sprite_os.console.session_queries import summaries
    from sprite_os.memory.forget import turns as turns_module

    def failing(*_: object) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await seed(first, tmp_path)
    await first.memory.call(lambda m: m.commit_batch(  # the session's summary, which may repeat the turn
        trigger="t", observation_ids=[ids[2]], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[NewLearning("SUMMARY", "A session about where Ada lives, Lisbon", "s1")], file_updates={},
        base_hashes={}))
    monkeypatch.setattr(turns_module, "purge_memory", failing)
    with pytest.raises(sqlite3.OperationalError):
        await first.forget_turns([ids[1]], by="test")
    await first.stop()
    again = MemorySystem(settings)
    try:
        await again.start()  # its run again fails as the forget did
        await wait_for(lambda: _cut_short_counted(again, 1), timeout=30, what="the forget counted cut short")
        assert [where for where in await _left(again) if where != "user.md"] == ["learnings"]  # in memory.db only
        # nor the action drawn from it ("Send Ada a map of the Tagus walk"): not in the boot prompt, nor the curator's
        assert "Tagus" not in await again.boot_prompt(settle=False)
        assert [a.content for a in await again.memory.call(lambda m: m.pending_actions())] == []
        # nor the console's list of learnings, nor its session's summary in Past sessions
        listed = await again.memory.call(lambda m: learnings_by_id(m, listed_learnings(m, [], False, 50)))
        assert sorted(row.content for row in listed.values()) == ["Likes green tea", "The user's name is Ada"]
        assert await again.memory.call(lambda m: summaries(m, ["s1"])) == {}
        recalled = await again.recall_for("Where do I live, Lisbon or Alfama?", "s2", "t1")
        assert recalled is None or not any(w in recalled.context for w in ("Lisbon", "Alfama", "Tagus")), recalled
        monkeypatch.undo()  # the cause gone: the person's forget again finishes it
        await again.forget_turns([ids[1]], by="test")
        assert await again.forgetting.decided(60)
        await wait_for(lambda: again.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
        assert await _left(again) == []
    finally:
        await again.stop()


def test_every_reader_of_memory_db_holds_back_what_a_forget_job_names_and_nothing_else(tmp_path: Path) -> None:
    """What a forget job holds back (memory_store.held_back: the learnings drawn from its turns, its sessions'
    summaries, the actions drawn from those) is left out by each read of memory.db for the agent, the curator and
    the console, by one rule. Nothing else is: a learning with no turn or no session stays (the console's list
    of learnings used to drop a summary with no session while any job was on disk), and the boot prompt's recent
    learnings are the newest of those not held back (it used to take MAX_RECENT, then drop the held ones, showing
    fewer while a job named many)."""
    from sprite_os.console.memory_queries import listed_learnings
    from sprite_os.console.session_queries import summaries
    from sprite_os.memory.forget.jobs import add_job
    from sprite_os.memory.loader import MAX_RECENT, remembered_now
    from sprite_os.memory.recall.hits import Rows

    m = MemoryDB(tmp_path / "m.db")
    kept = [NewLearning("FACT", "No turn of its own"), NewLearning("SUMMARY", "A summary of no session"),
            NewLearning("FACT", "Lives in Porto", "s2", 9), NewLearning("SUMMARY", "Talked of Porto", "s2"),
            NewLearning("ACTION", "Book the Porto train", "s2", 9)]
    held = [NewLearning("FACT", f"Held fact {i}", "s1", 7) for i in range(MAX_RECENT)]
    held += [NewLearning("SUMMARY", "Talked of Lisbon", "s1"), NewLearning("ACTION", "Send the Lisbon map", "s1", 7)]
    m.commit_batch(trigger="t", observation_ids=[7, 9], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
                   learnings=[*kept, *held], file_updates={}, base_hashes={})  # the held ones newest
    add_job(m, [7], ["s1"], set(), time.time())
    everything = {x.content: x.id for x in m.all_learnings()}
    shown = {x.content for x in kept}
    summaries_shown = {x.content for x in kept if x.type == "SUMMARY"}

    boot = remembered_now(m, time.time())
    assert {x.content for x in boot.recent} == shown
    assert {x.content for x in boot.summaries} == summaries_shown
    assert [a.content for a in boot.actions] == ["Book the Porto train"]
    assert [a.content for a in m.pending_actions()] == ["Book the Porto train"]  # the curator's prompt's
    assert {x.content for x in m.learnings_since(0, limit=len(shown))} == shown
    listed = {m.conn.execute("SELECT content FROM learnings WHERE id = ?", (i,)).fetchone()[0]
              for i in listed_learnings(m, [], False, 100)}
    assert listed == shown
    assert summaries(m, ["s1", "s2"]) == {"s2": "Talked of Porto"}
    assert {f.text for f in Rows(m.conn).learnings(list(everything.values())).values()} == shown  # search's


async def test_a_forget_an_error_cut_short_then_made_again_leaves_no_job_behind(system: MemorySystem,
                                                                              tmp_path: Path) -> None:
    """A forget an error cut short keeps its job for the next start; the person forgets the turn again, which
    succeeds: the pass then finishes both jobs at once, not the new one alone (the old one waited for a restart)."""
    ids = await seed(system, tmp_path)
    forgetting = system.forgetting
    await _cut_short_at_recall(system, ids[1])
    assert await forgetting.rewrite_files() == 0  # cut short: its turn still holds its words
    redo = await system.forget_turns([ids[1]], by="test")
    assert [o.id for o in redo.turns] == [ids[1]]
    assert await forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="both jobs finished")
    assert await _left(system) == []


async def test_a_forget_an_error_cut_short_shows_in_healthz_at_once(system: MemorySystem, tmp_path: Path) -> None:
    """The pass counts the forgets cut short, and nothing asked for one after a forget an error cut short:
    /healthz said memory was fine (`cut_short_jobs` 0) until some later pass (a batch's, a session's end),
    its turn keeping its words meanwhile. Now the forget's error asks for the pass; the forget again clears it."""
    ids = await seed(system, tmp_path)
    await _cut_short_at_recall(system, ids[1], OSError("disk I/O error"))

    async def cut_short(count: int) -> bool:
        health = await system.health()
        return health["forget"]["cut_short_jobs"] == count and health["degraded"] is (count > 0)

    await wait_for(lambda: cut_short(1), timeout=10, what="the forget cut short shown, memory degraded")
    await system.forget_turns([ids[1]], by="test")  # the person's forget again finishes it
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="both jobs finished")
    await wait_for(lambda: cut_short(0), timeout=10, what="memory well again")


async def test_a_turn_of_a_forget_an_error_cut_short_goes_to_no_curator_call_nor_boot_prompt(
        system: MemorySystem) -> None:
    """A forget an error cut short keeps its job, and its turn stays pending with its words until the next start
    or the forget again: the batches leave it out. Each batch carrying it was discarded as forgotten during
    its call and ran again 2 s later, the words sent to the curator and paid for each time; and every new
    session's boot prompt showed them among the turns not yet curated."""
    def write(t: TranscriptDB) -> list[int]:
        t.start_session("s1", T0)
        return [t.append(o) or 0 for o in (turn(1, "I walk to Belem every evening", "Noted."),
                                           turn(2, "I like green tea", "Green tea it is."))]

    ids = await system.transcript.call(write)  # not curated (the curator does not answer): pending
    await _cut_short_at_recall(system, ids[0])
    assert await system.transcript.call(lambda t: [o.id for o in t.pending()]) == ids  # it holds its words
    assert [o.id for o in await system.processor.pending(100)] == [ids[1]]
    assert [o.id for o in await system.processor.pending(1)] == [ids[1]]
    prompt = await system.boot_prompt(settle=False)
    assert "green tea" in prompt and "Belem" not in prompt  # nor to a new session's boot prompt


async def test_forgetting_again_a_turn_whose_words_memory_still_holds_takes_them_out(system: MemorySystem,
                                                                                     tmp_path: Path) -> None:
    """A turn forgotten under the order of steps before, cut short after its tombstone: forgetting it
    again takes out what memory.db, recall and the files still hold, instead of answering not found."""
    ids = await seed(system, tmp_path)
    await system.transcript.call(lambda t: t.forget([ids[1]], T0 + 50, "test"))
    redo = await system.forget_turns([ids[1]], by="test")
    assert [o.id for o in redo.turns] == [ids[1]]
    assert await system.forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the pass")
    assert await system.recall.purged(30)
    assert await _left(system) == []


def test_migration_7_leaves_a_job_in_flight_undecided(tmp_path: Path) -> None:
    """A job a kill left with the words' unchecked guess, from the code before step 7: undecided, so the
    pass gives it the kept-turn check."""
    import sqlite_utils

    from sprite_os.memory.schema import MEMORY_SCHEMA

    path = tmp_path / "memory.db"
    db = sqlite_utils.Database(sqlite3.connect(path, isolation_level=None))
    for version, step in enumerate(MEMORY_SCHEMA[:6], start=1):
        step(db)
        db.conn.execute(f"PRAGMA user_version={version}")
    db.conn.execute("INSERT INTO forget_jobs (created_at, observation_ids, sessions, line_hashes) "
                    "VALUES (1, '[1]', '[\"s1\"]', '[]')")
    db.conn.close()
    [job] = _jobs(path)
    assert not job.decided


async def test_a_stop_during_the_decision_lets_it_finish_and_the_last_pass_judges_later_lines(tmp_path: Path) -> None:
    """The turns' words (which judge a line a batch writes after the forget) are in memory only: a stop
    while the lines are decided gives the decision the flush's budget, and the shutdown's last pass
    takes out the line written after the forget, instead of the next start missing it for good."""
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await _seed(first, BIRTHDAYS, f"# User\n- Name: Ada\n{DAD}\n", [])  # the words find DAD: checked
    real = first.forgetting.judge.kept_near
    assert real is not None
    checking, go = asyncio.Event(), asyncio.Event()

    async def slow(lines: object) -> list[list[str]]:
        checking.set()
        await go.wait()  # the check under way when the stop comes
        return await real(lines)  # type: ignore[arg-type]

    first.forgetting.judge.kept_near = slow
    await first.forget_turns([ids[0]], by="test")
    await asyncio.wait_for(checking.wait(), 60)
    later = f"# User\n- Name: Ada\n{MUM}\n{DAD}\n"  # a batch under way lands (it read turn 2 before the forget)
    await first.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=[ids[1]], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[], file_updates={"user.md": later}, base_hashes={}))
    first.files.write("user.md", later, "batch-2")
    stopping = asyncio.create_task(first.stop())
    await asyncio.sleep(0.2)
    go.set()
    await asyncio.wait_for(stopping, 60)
    assert not _jobs(settings.layout.memory_db)  # the shutdown's last pass did it
    assert "Rosa" not in (settings.layout.memory_dir / "user.md").read_text() and DAD in (
        settings.layout.memory_dir / "user.md").read_text()


async def test_the_restarted_sessions_boot_waits_for_the_current_files_lines_only(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision takes the current files' lines first: a new session's boot prompt waits for those
    (tens of lines) alone, not for the history's (up to thousands), and holds what they decided: the
    forgotten turn's line out, the line a kept turn says in."""
    old = "- Rosa, the mother: 3 May birthday"  # in an older version only
    ids = await _seed(system, BIRTHDAYS, f"# User\n{old}\n", [])
    now = f"# User\n{MUM}\n{DAD}\n"
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=ids, model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[], file_updates={"user.md": now}, base_hashes={}))
    system.files.write("user.md", now, "batch-2")
    real = system.forgetting.judge.kept_near
    assert real is not None
    history, done = asyncio.Event(), asyncio.Event()

    async def slow_history(lines: Sequence[tuple[str, bool]]) -> list[list[str]]:
        if any(text == old for text, _ in lines):
            history.set()
            await done.wait()  # the history's thousand lines, until the test has its answer
        return await real(lines)

    system.forgetting.judge.kept_near = slow_history
    monkeypatch.setattr("sprite_os.memory.system.BOOT_DECIDE_BUDGET", 60.0)  # however slow the first embedding
    await system.forget_turns([ids[0]], by="test")
    try:
        prompt = await asyncio.wait_for(system.boot_prompt(), 45)
        assert history.is_set() and not await system.forgetting.decided(0)  # the history still being decided
        assert MUM not in prompt and DAD in prompt
    finally:
        done.set()  # else the fixture's stop waits out the decision's share of it (10 s)


async def test_forgetting_a_past_turn_the_current_boot_prompt_holds_restarts_the_session(
        system: MemorySystem, tmp_path: Path) -> None:
    """The current session booted with '- Lives in: Lisbon' from a past session's turn: forgetting that turn
    restarts it too, so the agent's context lets go of the line (its answer could say it, in a kept turn)."""
    from sprite_os.console import session_frames as ps
    from sprite_os.console.sessions_api import SessionsConsole

    ids = await seed(system, tmp_path)
    await system.transcript.call(lambda t: t.start_session("s2", T0 + 100))
    assert "Lisbon" in await system.boot_prompt(settle=False)  # the current session, s2, boots with it
    from tests.test_console_sessions import FakeAgent

    agent = FakeAgent()
    api = SessionsConsole(system, lambda: "s2", holding_turns=agent.holding_turns)
    done = await api.handlers[ps.ForgetTurnsRequest](ps.ForgetTurnsRequest(request_id="g", observation_ids=[ids[1]]))
    assert done.restarted and ("restart", "s2") in agent.events  # type: ignore[attr-defined]


async def test_forgetting_a_past_turn_auto_recall_brought_restarts_the_session(
        system: MemorySystem, tmp_path: Path) -> None:
    from sprite_os.console import session_frames as ps
    from sprite_os.console.sessions_api import SessionsConsole

    ids = await seed(system, tmp_path)
    system.files.write("user.md", "# User\n", "batch-2")  # the boot prompt holds nothing of it
    await system.transcript.call(lambda t: t.start_session("s2", T0 + 100))
    await system.boot_prompt(settle=False)
    recalled = await system.recall_for("Do you remember where I said I live, near which river?", "s2", "t9")
    assert recalled is not None and ids[1] in {m.observation_id for m in recalled.memories}
    from tests.test_console_sessions import FakeAgent

    agent = FakeAgent()
    api = SessionsConsole(system, lambda: "s2", holding_turns=agent.holding_turns)
    done = await api.handlers[ps.ForgetTurnsRequest](ps.ForgetTurnsRequest(request_id="g", observation_ids=[ids[1]]))
    assert done.restarted and ("restart", "s2") in agent.events  # type: ignore[attr-defined]


async def test_forgetting_a_past_turn_not_yet_curated_that_the_boot_prompt_shows_restarts_the_session(
        system: MemorySystem) -> None:
    """A session ended before the curator ran: the next one boots with its turns word for word (no file
    line came from them yet). Forgetting one of them restarts the new session, so it lets go of them."""
    from sprite_os.console import session_frames as ps
    from sprite_os.console.sessions_api import SessionsConsole
    from tests.test_console_sessions import FakeAgent

    def write(t: TranscriptDB) -> list[int]:
        t.start_session("s1", T0)
        ids = [t.append(turn(1, "My locker code at the Alcantara gym is 4471", "Noted: Alcantara gym locker 4471.")) or 0]
        t.end_session("s1", T0 + 10)
        t.start_session("s2", T0 + 100)
        return ids

    [kept_out] = await system.transcript.call(write)
    assert "4471" in await system.boot_prompt(settle=False)  # the turn not yet curated, as it was said
    agent = FakeAgent()
    api = SessionsConsole(system, lambda: "s2", holding_turns=agent.holding_turns)
    done = await api.handlers[ps.ForgetTurnsRequest](ps.ForgetTurnsRequest(request_id="g", observation_ids=[kept_out]))
    assert done.restarted and ("restart", "s2") in agent.events  # type: ignore[attr-defined]



def test_a_session_context_holds_a_forgets_lines_the_lines_its_words_make_or_its_turns() -> None:
    """What the current session holds is a value the forget is given (memory calls nothing of the
    runtime's): a boot prompt's line the turns' words found, a line most of whose words they said (a
    turn not yet curated, a learning), or a turn auto-recall brought it."""
    line = "- Lives in: Lisbon (Alfama)"
    held = SessionContext(frozenset({line_hash(line)}), (line,), frozenset({7}))
    assert held.holds({line_hash(line)}, set(), [])
    assert held.holds(set(), content_words("I live in Lisbon, in Alfama"), [])
    assert held.holds(set(), set(), [3, 7])
    assert not held.holds({line_hash("- Name: Ada")}, content_words("My name is Ada"), [8])
    assert not NOTHING.holds({line_hash(line)}, content_words("I live in Lisbon, in Alfama"), [7])


async def test_the_forget_answers_whether_the_context_it_was_given_holds_the_turns(
        system: MemorySystem, tmp_path: Path) -> None:
    ids = await seed(system, tmp_path)
    assert (await system.forgetting.forget([ids[1]], "test", SessionContext(recalled=frozenset({ids[1]})))).in_context
    assert not (await system.forgetting.forget([ids[2]], "test")).in_context  # no context: it holds nothing

async def test_what_auto_recall_brought_an_earlier_session_does_not_restart_the_next(
        system: MemorySystem, tmp_path: Path) -> None:
    """After a restart, the turns auto-recall brought the old session are no longer in the agent's context:
    forgetting one of them restarts nothing."""
    from sprite_os.console import session_frames as ps
    from sprite_os.console.sessions_api import SessionsConsole
    from tests.test_console_sessions import FakeAgent

    ids = await seed(system, tmp_path)
    await system.transcript.call(lambda t: t.start_session("s2", T0 + 100))
    system.session_started("s2")  # no boot prompt taken: only auto-recall holds the turn
    recalled = await system.recall_for("Do you remember where I said I live, near which river?", "s2", "t9")
    assert recalled is not None and ids[1] in {m.observation_id for m in recalled.memories}
    system.session_started("s3")  # a restart: s2's context is gone
    agent = FakeAgent()
    api = SessionsConsole(system, lambda: "s3", holding_turns=agent.holding_turns)
    done = await api.handlers[ps.ForgetTurnsRequest](ps.ForgetTurnsRequest(request_id="g", observation_ids=[ids[1]]))
    assert done.forgotten == 1 and not done.restarted and agent.events == ["held", "released"]  # type: ignore[attr-defined]


async def test_the_forgets_file_pass_does_not_wait_out_the_curators_backoff(system: MemorySystem) -> None:
    """The pass needs no model: a forget's wake runs it while the curator's backoff holds the batches (a
    spent budget: 300 s at a time)."""
    ids = await _seed(system, BIRTHDAYS, f"# User\n{MUM}\n{DAD}\n", [])
    loop = asyncio.get_running_loop()
    system.daemon._not_before = loop.time() + 300  # as a spent budget leaves it (the stop then skips its flush)
    await system.forget_turns([ids[0]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=20, what="the forget's pass")
    assert "Rosa" not in system.files.read("user.md")


async def test_two_forgets_in_a_row_embed_the_files_lines_once(system: MemorySystem) -> None:
    """Decisions take turns: the second finds the line vectors the first kept, instead of both embedding
    every line of the files and their history at once (about 20 ms of CPU a line)."""
    lines = [f"- Note {i}: item{i} alpha{i} beta{i}" for i in range(150)]
    ids = await _seed(system, (turn(1, "item0 alpha0", "ok"), turn(2, "item1 alpha1", "ok"),
                               turn(3, "something else entirely", "ok")),
                      "# User\n" + "\n".join(lines) + "\n", [])
    embedded: list[str] = []
    rng = np.random.default_rng(0)

    async def embed(texts: Sequence[str]) -> np.ndarray:
        batch = list(texts)
        embedded.extend(batch)
        await asyncio.sleep(0.02)  # the embedder's thread
        x = rng.standard_normal((len(batch), 8)).astype(np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    system.forgetting.judge.embed = embed
    await system.forget_turns([ids[0]], by="test")
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    line_embeds = [t for t in embedded if t.startswith("- Note")]
    assert len(line_embeds) <= len(lines) + 10, f"{len(line_embeds)} line embeddings for {len(lines)} lines"


async def test_a_fact_said_again_after_the_forget_keeps_its_line(system: MemorySystem) -> None:
    """The person forgets 'I live in Alfama, Lisbon', then says it again before the daemon's pass: the pass
    checks the decided lines still in the files against what is kept now, and the fact stays."""
    line = "- Lives in Alfama, Lisbon"
    ids = await _seed(system, (turn(1, "I live in Alfama, Lisbon.", "Noted."),), f"# User\n{line}\n", [])
    forgetting = system.forgetting
    forgetting.wake_daemon = lambda reason: None
    system.daemon.before_batches = _no_pass
    await system.forget_turns([ids[0]], by="test")
    assert await forgetting.decided(60)
    await system.transcript.call(lambda t: t.append(turn(2, "Yes, I do live in Alfama, Lisbon.", "Noted again.")))
    system.recall.indexer.nudge()
    assert await system.recall.settle(30)
    assert await forgetting.rewrite_files() == 1
    assert line in system.files.read("user.md")


async def test_recall_sets_its_purge_flag_itself_even_with_no_index_open(tmp_path: Path) -> None:
    """The flag has one writer, recall's forget, first thing: the job alone sets none, and a forget
    with no index open here (a tool that only reads) leaves it for the server's start."""
    from sprite_os.db_worker import Worker
    from sprite_os.memory.forget.jobs import add_job
    from sprite_os.memory.recall.service import RecallService
    from sprite_os.memory.schema import PURGE_KEY

    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9").with_overrides(embedding_model="off")
    settings.layout.memory_dir.mkdir(parents=True, exist_ok=True)
    memory: Worker[MemoryDB] = Worker("m", lambda: MemoryDB(settings.layout.memory_db))
    transcript: Worker[TranscriptDB] = Worker("t", lambda: TranscriptDB(settings.layout.transcript_db))
    try:
        await memory.call(lambda m: add_job(m, [1], ["s1"], set(), T0))
        assert await memory.call(lambda m: m.get_meta(PURGE_KEY)) is None
        await RecallService(settings, transcript, memory).forget([1], [])
        assert await memory.call(lambda m: m.get_meta(PURGE_KEY)) == "1"
    finally:
        await memory.close()
        await transcript.close()


async def test_the_pass_a_decision_wakes_finds_its_job_no_longer_being_decided(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision wakes the daemon and stops counting as under way with no await between: the pass
    it wakes (which leaves a job under way alone) runs only after, and takes the job."""
    ids = await _seed(system, BIRTHDAYS, "# User\n- Name: Ada\n", [])
    forgetting = system.forgetting
    loop = asyncio.get_running_loop()
    seen: list[set[int]] = []
    forgetting.wake_daemon = lambda reason: loop.call_soon(lambda: seen.append(set(forgetting._deciding)))
    monkeypatch.setattr(forgetting, "purge_ended", lambda purged: None)  # the index's rewrite wakes it too

    async def no_pass() -> None:
        pass

    system.daemon.before_batches = no_pass
    await system.forget_turns([ids[0]], by="test")
    assert await forgetting.decided(60)
    await asyncio.sleep(0)
    assert seen == [set()]


async def test_the_lines_a_forget_judges_read_each_memory_file_once(system: MemorySystem) -> None:
    await _seed(system, BIRTHDAYS, "# User\n- Name: Ada\n", [])
    reads: list[str] = []

    class Counted(MemoryFiles):
        def read(self, name: str) -> str:
            reads.append(name)
            return super().read(name)

    forgetting = dataclasses.replace(system.forgetting, files=Counted(system.settings.layout))
    lines = await forgetting._lines()
    assert "- Name: Ada" in lines.texts().values() and lines.current
    assert reads and sorted(reads) == sorted(set(reads))


def test_a_backup_loses_the_same_rows_as_the_live_db(tmp_path: Path) -> None:
    """What a forget deletes is one list: an older memory.db kept as a backup comes out of the daemon's
    pass as the live one comes out of the forget."""
    from sprite_os.memory.forget.backups import _purge_copy
    from sprite_os.memory.transcript_store import Observation

    db = MemoryDB(tmp_path / "memory.db")
    try:
        db.commit_batch(
            trigger="t", observation_ids=[1, 2, 3], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
            learnings=[NewLearning("FACT", "Lives in Lisbon", "s1", 1),
                       NewLearning("ACTION", "Send a map of the Tagus walk", "s1", 1),
                       NewLearning("SUMMARY", "A session about Lisbon and tea", "s1"),
                       NewLearning("FACT", "Likes green tea", "s1", 2),
                       NewLearning("FACT", "Has a cat", "s2", 3)],
            file_updates={}, base_hashes={})
        ep.add(db.conn, [ep.Episode(1, "s1", 1, T0, "I live in Lisbon"), ep.Episode(2, "s1", 2, T0 + 1, "tea"),
                         ep.Episode(3, "s2", 1, T0 + 2, "a cat")])
        db.conn.execute("INSERT INTO episode_vectors (id, model, vector) VALUES (1, 'm', x'00'), (3, 'm', x'00')")
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        backup = tmp_path / "memory.db.before-rebuild-20260101T000000"
        shutil.copy(tmp_path / "memory.db", backup)

        purge_memory(db, [Observation(1, T0, "s1", 1, "I live in Lisbon", "[]", "Noted")])
        assert _purge_copy(backup, [1], ["s1"], set(), "a note")

        def rows(conn: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
            return {table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
                    for table in ("episodes", "episode_vectors", "learnings", "pending_actions", "memory_audit")}

        live = rows(db.conn)
        assert [row[0] for row in live["episodes"]] == [1, 2, 3]
        assert db.conn.execute("SELECT text FROM episodes WHERE id = 1").fetchone() == ("",)
        assert len(live["learnings"]) == 2
        with contextlib.closing(sqlite3.connect(backup)) as b:
            assert rows(b) == live
    finally:
        db.close()


async def test_a_backup_the_disk_fails_to_purge_keeps_the_job_until_it_is_purged(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backup the daemon's pass can read but not rewrite (a full disk, an I/O error: sqlite's
    OperationalError) keeps the forget's job: finishing it would leave the turn's words in that backup for
    good. The next pass, the disk well again, purges it and finishes the job."""
    from sprite_os.memory.forget import backups

    layout = system.settings.layout
    ids = await seed(system, tmp_path)
    real = backups.delete_drawn

    def full(*_: object, **__: object) -> object:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(backups, "delete_drawn", full)
    with capture_logs() as logs:
        await system.forget_turns([ids[1]], by="test")
        await wait_for(lambda: any(e["event"] in ("forget_pass_failed", "forget_files_rewritten") for e in logs),
                       timeout=60, what="the daemon's forget pass")
    backup = layout.memory_dir / "memory.db.before-rebuild-20260101T000000"
    assert said(backup)  # the disk kept it as it was
    assert len(await system.memory.call(jobs)) == 1  # so the job stays, for the next pass
    monkeypatch.setattr(backups, "delete_drawn", real)
    system.daemon.trigger("forget")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    assert said(backup) == [] and said(layout.os_dir / "backup" / "v1-20260101T000000Z" / "agent.db") == []


async def test_what_an_interrupted_write_left_of_a_v1_memory_file_in_the_backup_loses_the_forgotten_lines(
        system: MemorySystem, tmp_path: Path) -> None:
    """migrate-v1 moves v1's memory/ into the backup whole: a temp file an interrupted write of v1's left there
    (`.user.md.<random>.tmp`, maybe v1's latest text) comes with it, and the start's sweep keeps it (older than the
    backup: not this server's). The forget pass took the lines out of the `.md` files alone: a forgotten line in
    such a file stayed in the backup for good. Now the pass rewrites it too, and it keeps its time, so that the
    sweep still tells it from what a kill of the pass's own rewrite leaves (which it removes)."""
    from sprite_os.memory.forget.backups import sweep_backup_temps

    layout = system.settings.layout
    ids = await seed(system, tmp_path)
    v1 = layout.os_dir / "backup" / "v1-20260101T000000Z" / "memory"
    leftover = v1 / ".user.md.a1b2c3d4.tmp"
    leftover.write_text("# User\n- Home: Lisbon, Alfama, by the river Tagus\n- Name: Ada\n")
    os.utime(leftover, (1_767_225_000, 1_767_225_000))  # 2025-12-31, v1's time, before the backup was made
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the pass")
    text = leftover.read_text()
    assert "Lisbon" not in text and "Alfama" not in text and "- Name: Ada" in text, text
    assert leftover.stat().st_mtime == 1_767_225_000  # v1's still, as the sweep tells them apart
    assert sweep_backup_temps(layout) == [] and leftover.exists()


async def test_a_reader_that_kept_the_transcripts_wal_through_the_forget_does_not_keep_the_words_there(
        system: MemorySystem, tmp_path: Path) -> None:
    """A reader mid-transaction (another process reading transcript.db, `memory status`, a backup tool) keeps
    the forget's checkpoint from emptying the transcript's WAL, which holds old copies of the turn's pages:
    the daemon's pass empties it before it calls the forget done, or leaves the job for the next pass."""
    layout = system.settings.layout
    ids = await seed(system, tmp_path)
    # the turn's words in the database file, where a checkpoint has put them (a live server's turns get there)
    await system.transcript.call(lambda t: t.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
    wal = Path(f"{layout.transcript_db}-wal")
    with _reading_mid_transaction(layout.transcript_db):
        await system.forget_turns([ids[1]], by="test")
        assert await system.forgetting.decided(60)
    await system.transcript.call(lambda t: t.start_session("s10", T0 + 91))  # the server goes on writing
    system.daemon.trigger("forget")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    assert said(layout.transcript_db) == [], wal.stat().st_size


def test_a_persons_edit_saved_while_the_pass_takes_lines_out_is_kept(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass reads a file, takes the forgotten lines out and writes it: a person's Save that lands between
    the read and the write (the console saves on its own thread) is kept, the forgotten line out of it too;
    the pass wrote over it, and the person's acknowledged edit was gone from the file."""
    from sprite_os.console.memory_files import PERSON_EDIT
    from sprite_os.memory.files import sha
    from sprite_os.memory.forget import history

    layout = make_settings(tmp_path / "ws", "http://127.0.0.1:9").layout
    layout.ensure()
    files = MemoryFiles(layout)
    before = "# User\n- Name: Ada\n- Lives in: Lisbon\n"
    files.write("user.md", before, "batch-1")
    edited = before + "- Has a cat called Miso\n"
    real, saved = history.without, []

    def person_saves_meanwhile(text: str, *args: object) -> str:
        if text == before and not saved:
            saved.append(files.write("user.md", edited, PERSON_EDIT, expect=sha(before)))
        return real(text, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(history, "without", person_saves_meanwhile)
    assert history.strip_files(files, {line_hash("- Lives in: Lisbon")}, "(gone)") == ["user.md"]
    assert saved and files.read("user.md") == "# User\n- Name: Ada\n- Has a cat called Miso\n"


def test_a_rollback_made_while_the_pass_redacts_the_history_does_not_bring_the_line_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A person's rollback (in the console) to a version the pass has not redacted yet, made after the pass
    took the lines out of the current file: the current file and the rollback's version lose the lines too,
    and the job is done only then. The rolled-back text used to stay current, the forgotten line in the boot
    prompt once the job was finished."""
    layout = make_settings(tmp_path / "ws", "http://127.0.0.1:9").layout
    layout.ensure()
    files = MemoryFiles(layout)
    files.write("user.md", "# User\n- Name: Ada\n- Lives in: Lisbon\n", "batch-1")
    files.write("user.md", "# User\n- Name: Ada\n- Lives in: Lisbon\n- Likes tea\n", "batch-2")
    real, rolled = files.redact_history, []

    def rollback_meanwhile(name: str, change: object) -> int:
        if name == "user.md" and not rolled:
            rolled.append(files.rollback("user.md", 1))
        return real(name, change)  # type: ignore[arg-type]

    monkeypatch.setattr(files, "redact_history", rollback_meanwhile)
    strip_files(files, {line_hash("- Lives in: Lisbon")}, "(gone)")
    assert rolled and "Lisbon" not in files.read("user.md")
    assert [v.number for v in files.history("user.md") if "Lisbon" in v.text] == []


async def test_a_reader_that_keeps_a_wal_for_long_makes_the_pass_try_again_less_and_less_often(
        system: MemorySystem, tmp_path: Path) -> None:
    """Each pass that finds a WAL kept does the job's steps again (backups vacuumed included): while a reader
    keeps it (a shell left in a transaction), the next try waits longer each time, up to 5 minutes, not 5 s
    forever."""
    layout = system.settings.layout
    ids = await seed(system, tmp_path)
    with _reading_mid_transaction(layout.transcript_db), capture_logs() as logs:
        await _forgotten_with_the_wal_kept(system, ids[1], logs)
        for _ in range(3):
            assert await system.forgetting.rewrite_files() == 0
    waits = [e["next_try_s"] for e in logs if e["event"] == "forget_wal_kept"]
    assert len(waits) == 4 and waits[-1] > 2 * waits[0] and max(waits) <= 300, waits


@contextlib.contextmanager
def _reading_mid_transaction(database: Path) -> Iterator[None]:
    """Another process reading `database` mid-transaction (a shell, `memory status`, a backup tool): the WAL
    cannot be emptied until it ends."""
    reader = sqlite3.connect(database)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM observations").fetchone()
        yield
    finally:
        reader.close()


async def _forgotten_with_the_wal_kept(system: MemorySystem, turn_id: int, logs: list[dict[str, Any]]) -> None:
    """`turn_id` forgotten while a reader keeps the transcript's WAL, until the pass has kept its job for it."""
    await system.forget_turns([turn_id], by="test")
    await wait_for(lambda: any(e["event"] == "forget_wal_kept" for e in logs), timeout=60,
                   what="the pass kept the job for the reader")


def _undeletable_index_set_aside(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A recall index set aside, holding the turns' words, whose segment the disk will not delete (EIO) until
    `monkeypatch.undo()`."""
    import errno
    import os

    aside = layout.memory_dir / "index.broken-20260101T000000"
    aside.mkdir()
    (aside / "segment.idx").write_bytes(b"lisbon tagus")
    real = os.unlink

    def failing(path: object, *args: object, **kwargs: object) -> None:
        if str(path) == "segment.idx" or str(path).endswith("/segment.idx"):
            raise OSError(errno.EIO, "Input/output error")
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", failing)
    return aside


async def test_the_pass_keeps_the_job_while_the_disk_will_not_delete_a_recall_index_set_aside(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the daemon's pass (not purge_backups alone): an index set aside whose segment the disk will
    not delete (an OSError, not sqlite's) keeps the forget's job, logged as forget_pass_failed; a pass asked
    for later, the disk well again, deletes it and finishes the job, with nothing else to wake the daemon (it
    waited for the next batch, session or forget: on an idle Sprite, for good)."""
    from sprite_os.backoff import Backoff
    from sprite_os.memory.forget import turns as turns_module

    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=0.2, max=0.2))
    layout = system.settings.layout
    ids = await seed(system, tmp_path)
    aside = _undeletable_index_set_aside(layout, monkeypatch)
    with capture_logs() as logs:
        await system.forget_turns([ids[1]], by="test")
        await wait_for(lambda: any(e["event"] in ("forget_pass_failed", "forget_files_rewritten") for e in logs),
                       timeout=60, what="the daemon's forget pass")
    assert (aside / "segment.idx").exists()  # the disk kept it
    assert len(await system.memory.call(jobs)) == 1  # so the job stays, for a later pass
    monkeypatch.undo()  # the disk well again
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    assert not aside.exists()


async def test_a_job_the_pass_keeps_shows_in_healthz_metrics_and_memory_status_until_it_is_done(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A job kept for later said so only in the log: /healthz, /metrics and `memory status` showed a healthy
    memory while the words of a forget the person was told done stayed on disk. Now each says how many jobs
    wait, and, past KEPT_STUCK, /healthz and /metrics call memory degraded; once the pass finishes, it clears."""
    from sprite_os.backoff import Backoff
    from sprite_os.commands.main import main
    from sprite_os.memory.forget import turns as turns_module
    from sprite_os.metrics import Metrics

    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=600.0, max=600.0))  # no retry of its own
    ids = await seed(system, tmp_path)
    aside = _undeletable_index_set_aside(system.settings.layout, monkeypatch)
    with capture_logs() as logs:
        await system.forget_turns([ids[1]], by="test")
        await wait_for(lambda: any(e["event"] == "forget_pass_failed" for e in logs), timeout=60,
                       what="the daemon's forget pass")

    async def forget_health() -> dict[str, object]:
        return (await system.health())["forget"]  # type: ignore[no-any-return]

    await wait_for(lambda: _waiting(forget_health, 1), timeout=30, what="the job counted")
    kept = await forget_health()
    assert (kept["kept_passes"], kept["kept_why"], kept["cut_short_jobs"]) == (1, "disk", 0), kept
    assert kept["degraded"] is False  # a moment's failure: not yet
    monkeypatch.setattr(turns_module, "KEPT_STUCK", 0.0)
    health = await system.health()
    assert health["degraded"] is True and health["forget"]["degraded"] is True
    scraped = Metrics().render({"status": "degraded", "uptime_s": 1.0, "clients": 0,
                                "agent": {"state": "idle", "queued_messages": 0, "failure": None}, "memory": health})
    assert b"sprite_forget_jobs_waiting 1.0" in scraped and b"sprite_memory_degraded 1.0" in scraped
    assert await asyncio.to_thread(main, ["--workspace", str(system.settings.layout.root), "memory", "status",
                                          "--json"]) == 0
    out = capsys.readouterr().out  # the daemon's failed batches log on this process's stdout too
    said = json.JSONDecoder().raw_decode(out[out.index("{"):] if out.startswith("{") else
                                         out[out.index("\n{") + 1:])[0]["forgets"]  # as /healthz names them
    assert said == {k: v for k, v in (await system.health())["forget"].items() if k in said}, said
    assert said["jobs_waiting"] == 1
    assert await asyncio.to_thread(main, ["--workspace", str(system.settings.layout.root), "memory", "status"]) == 0
    assert "forgets          1 waiting for the daemon's pass" in capsys.readouterr().out
    monkeypatch.undo()  # the disk well again
    system.daemon.trigger("forget")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    await wait_for(lambda: _waiting(forget_health, 0), timeout=30, what="the job no longer counted")
    done = await forget_health()
    assert (done["kept_passes"], done["kept_for_s"], done["kept_why"], done["degraded"]) == (0, None, None, False)
    assert not aside.exists() and (await system.health())["degraded"] is False


async def test_a_job_kept_for_an_hour_reads_as_kept_for_an_hour_after_a_restart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """How long the pass has kept a job for later (`kept_for_s`, degraded past KEPT_STUCK) was counted from the
    first pass of this process: a job kept for an hour read as kept for 0 s after a restart, memory ok, for
    another minute each restart. Now a job says when a pass first kept it (in its row), and the count goes on."""
    from sprite_os.backoff import Backoff
    from sprite_os.memory.forget import turns as turns_module

    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=600.0, max=600.0))  # one pass each, no retry
    settings = make_settings(tmp_path / "ws", "http://127.0.0.1:9")
    settings.layout.ensure()
    first = MemorySystem(settings)
    await first.start()
    ids = await seed(first, tmp_path)
    _undeletable_index_set_aside(settings.layout, monkeypatch)  # the disk keeps the job, across the restart
    first.forgetting.clock = lambda: time.time() - 3600  # the forget, and the pass that kept it, an hour ago
    await first.forget_turns([ids[1]], by="test")
    await wait_for(lambda: first.forgetting.status(time.monotonic())["kept_why"] == "disk", timeout=60,
                   what="the job kept")
    await first.stop()
    again = MemorySystem(settings)
    await again.start()
    try:
        await wait_for(lambda: again.forgetting.status(time.monotonic())["kept_why"] == "disk", timeout=60,
                       what="the restart's pass kept it too")
        forget = again.forgetting.status(time.monotonic())
        assert forget["kept_for_s"] >= 3600 - 60 and forget["degraded"] is True, forget
    finally:
        await again.stop()


async def test_a_job_kept_whose_row_cannot_say_when_is_still_kept_and_counted(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """memory.db refusing the mark of when a pass first kept a job (locked) costs the count across a restart only:
    the job is kept and counted as before, and the pass goes on."""
    from sprite_os.memory.forget import turns as turns_module

    def locked(*_: object) -> None:
        raise sqlite3.OperationalError("database is locked")

    ids = await seed(system, tmp_path)
    _undeletable_index_set_aside(system.settings.layout, monkeypatch)
    monkeypatch.setattr(turns_module, "mark_kept", locked)
    with capture_logs() as logs:
        await system.forget_turns([ids[1]], by="test")
        await wait_for(lambda: any(e["event"] == "forget_kept_unmarked" for e in logs), timeout=60,
                       what="the mark refused")
    forget = system.forgetting.status(time.monotonic())
    assert (forget["kept_why"], forget["kept_for_s"] is not None) == ("disk", True), forget
    assert [job.kept_since for job in await system.memory.call(jobs)] == [None]
    monkeypatch.undo()  # the disk well again
    system.daemon.trigger("forget")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")


async def test_a_pass_that_fails_unexpectedly_keeps_its_job_says_why_and_is_no_curator_failure(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that raised what it did not expect (a bug, a database error reading its jobs) went up into the
    daemon's run and counted as a failed curator call: memory said the curator failed, curation backed off
    (and with a bug, never ran again), and the forget state gave no reason and started no minute's clock while
    the words stayed in the files. Now the pass keeps the job for a later try like any other, says why
    (`error`), and curation goes on."""
    from sprite_os.backoff import Backoff
    from sprite_os.memory.forget import turns as turns_module

    ids = await seed(system, tmp_path)

    async def broken(_self: object, _job: object) -> set[str]:
        raise RuntimeError("a bug in the pass")

    # Tried again soon, and failing again while broken: what is asserted below holds however many tries a busy
    # machine fits in before it is read, and the fixed pass's try comes without PASS_RETRY's 5 s.
    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=0.2, max=0.2))
    monkeypatch.setattr(turns_module.TurnForgetting, "_settled", broken)
    with capture_logs() as logs:
        await system.forget_turns([ids[1]], by="test")
        await wait_for(lambda: any(e["event"] == "forget_pass_failed" for e in logs), timeout=60,
                       what="the daemon's forget pass")
        forget = (await system.status())["forget"]
        assert forget["kept_passes"] >= 1 and (forget["kept_why"], forget["kept_for_s"] is not None) == (
            "error", True), forget
        assert "a bug in the pass" not in str(system.daemon.status()["last_error"])
        assert len(await system.memory.call(jobs)) == 1  # the words' lines wait for a later pass
        monkeypatch.undo()  # the pass tries again on its own (PASS_RETRY), as for a disk
        await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    # The curator's own calls fail here (no proxy), as they would without the forget: none of it is the pass's.
    assert not [e for e in logs if e["event"] in ("memory_daemon_error", "memory_batch_failed")
                and "a bug in the pass" in str(e.get("error"))], logs
    forget = (await system.status())["forget"]
    assert (forget["kept_passes"], forget["kept_why"]) == (0, None), forget


async def test_a_pass_that_kept_a_job_then_failed_counts_one_pass_kept(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that kept one job for later (its check failed) and then failed on the next in a way it did not
    expect asked for the pass again twice: it counted two passes in a row that kept a job where one ran, and the
    next try came a step later in PASS_RETRY than said (the minute /healthz waits counts on those steps)."""
    from sprite_os.backoff import Backoff
    from sprite_os.memory.forget import judge
    from sprite_os.memory.forget import turns as turns_module

    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=600.0, max=600.0))  # no retry's pass meanwhile
    ids = await seed(system, tmp_path)

    async def unchecked(_self: object, _job: object) -> set[str]:
        raise judge.CheckFailed("no check now")

    monkeypatch.setattr(turns_module.TurnForgetting, "_settled", unchecked)
    await system.forget_turns([ids[0]], by="test")
    await system.forget_turns([ids[1]], by="test")
    forgetting = system.forgetting
    await wait_for(lambda: system.memory.call(lambda m: len(jobs(m)) == 2), timeout=30, what="both jobs kept")
    await wait_for(lambda: forgetting.status(time.monotonic())["kept_why"] == "check", timeout=30,
                   what="a pass kept them")
    assert await forgetting.decided(60)  # a job still being decided is left alone by the pass below
    first = min(job.id for job in await system.memory.call(jobs))

    async def one_kept_one_broken(_self: object, job: Job) -> set[str]:
        if job.id == first:
            raise judge.CheckFailed("no check now")
        raise RuntimeError("a bug in the pass")

    monkeypatch.setattr(turns_module.TurnForgetting, "_settled", one_kept_one_broken)
    asks = _asks_for_the_pass(monkeypatch)
    await forgetting.rewrite_files()
    assert len(asks) == 1, f"one pass asked for the next {len(asks)} times"
    # The daemon's own pass (at the start of each of its runs) may be half-way, on job 1 ("check"): its end says
    # the last job's reason, as this pass's did.
    await wait_for(lambda: forgetting.status(time.monotonic())["kept_why"] == "error", timeout=30,
                   what="the job that failed said last")


async def test_one_jobs_unexpected_failure_holds_back_that_job_alone(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that failed in a way it did not expect on one job (a bug, a database error) kept that job for a later
    try, and held back every job after it too, until that try (up to 5 minutes later): their lines stayed in the
    memory files meanwhile. Now only the failing job waits, said `error`, the pass asked for again once; the
    others finish in the same pass."""
    from sprite_os.backoff import Backoff
    from sprite_os.memory.forget import turns as turns_module

    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=600.0, max=600.0))  # no try again in this test
    ids = await seed(system, tmp_path)
    real = turns_module.TurnForgetting._settled

    async def broken_for_the_first(self: turns_module.TurnForgetting, job: Job) -> set[str]:
        if ids[0] in job.observation_ids:
            raise RuntimeError("a bug in the pass")
        return await real(self, job)

    monkeypatch.setattr(turns_module.TurnForgetting, "_settled", broken_for_the_first)
    forgetting = system.forgetting
    with capture_logs() as logs:
        await system.forget_turns([ids[0]], by="test")
        await wait_for(lambda: any(e["event"] == "forget_pass_failed" for e in logs), timeout=60,
                       what="the first job kept")
        await system.forget_turns([ids[1]], by="test")  # its job comes after the failing one
        await wait_for(lambda: system.memory.call(lambda m: [j.observation_ids for j in jobs(m)] == [[ids[0]]]),
                       timeout=30, what="the second job finished, in a pass that failed on the first")
    assert "Lisbon" not in system.files.read("user.md")
    assert forgetting.status(time.monotonic())["kept_why"] == "error"
    # Two jobs failing in one pass: the pass is asked for again once, as for any pass that kept a job.
    await system.forget_turns([ids[2]], by="test")
    assert await forgetting.decided(60)
    monkeypatch.setattr(turns_module.TurnForgetting, "_settled", _always_broken)
    asks = _asks_for_the_pass(monkeypatch)
    assert await forgetting.rewrite_files() == 0
    assert len(asks) == 1, f"one pass asked for the next {len(asks)} times"

    def unreadable(_db: object) -> list[Job]:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(turns_module, "jobs", unreadable)  # no job read at all: the pass fails as a whole
    assert await forgetting.rewrite_files() == 0
    assert len(asks) == 2 and forgetting.status(time.monotonic())["kept_why"] == "error"


def _asks_for_the_pass(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The passes asked for again by this task from now (each the count of passes in a row that kept a job): the
    daemon's own passes (its retry's timer) may run meanwhile on its task, and only this task's asks count."""
    from sprite_os.memory.forget import turns as turns_module

    mine, asks = asyncio.current_task(), []
    ask = turns_module.TurnForgetting._try_again_later

    def counted(self: turns_module.TurnForgetting) -> float:
        if asyncio.current_task() is mine:
            asks.append(self._kept_passes)
        return ask(self)

    monkeypatch.setattr(turns_module.TurnForgetting, "_try_again_later", counted)
    return asks


async def _always_broken(_self: object, _job: object) -> set[str]:
    raise RuntimeError("a bug in the pass")


async def _waiting(forget_health: Callable[[], Awaitable[dict[str, object]]], count: int) -> bool:
    return (await forget_health())["jobs_waiting"] == count


def test_a_recall_index_set_aside_that_the_disk_will_not_delete_keeps_the_forgets_job(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recall index set aside (broken, or mid-swap) holds the turns' words in its segments: when the disk
    fails its deletion, purge_backups says so (the pass keeps the job for its next try) instead of going on
    as if it were gone."""
    from sprite_os.memory.forget.backups import purge_backups

    layout = make_settings(tmp_path / "ws", "http://127.0.0.1:9").layout
    layout.ensure()
    aside = _undeletable_index_set_aside(layout, monkeypatch)
    with pytest.raises(OSError):
        purge_backups(layout, [1], ["s1"], set(), "(gone)")
    monkeypatch.undo()  # the disk well again
    assert (aside / "segment.idx").exists()
    assert purge_backups(layout, [1], ["s1"], set(), "(gone)") == 1 and not aside.exists()


async def _forget_status(system: MemorySystem) -> dict[str, object]:
    return (await system.status())["forget"]  # type: ignore[no-any-return]


async def _cut_short_counted(system: MemorySystem, count: int) -> bool:
    return (await _forget_status(system))["cut_short_jobs"] == count


async def test_a_decision_a_database_error_ends_asks_for_the_pass_that_finishes_it(
        system: MemorySystem, tmp_path: Path) -> None:
    """A forget's decision ended by a database error leaves its job undecided "for the daemon's pass", and asked
    for none: on an idle Sprite the lines stayed in the memory files for good, /healthz ok."""
    ids = await seed(system, tmp_path)
    forgetting = system.forgetting
    failed: list[int] = []
    real_apply = forgetting.apply

    async def apply(change: object) -> object:
        task = asyncio.current_task()
        if not failed and task is not None and task.get_name().startswith("forget-decide-"):
            failed.append(1)
            raise sqlite3.OperationalError("database is locked")
        return await real_apply(change)  # type: ignore[arg-type]

    forgetting.apply = apply  # type: ignore[assignment]
    await system.forget_turns([ids[1]], by="test")
    assert await forgetting.decided(60) and failed
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=30, what="the pass finished the job")
    assert "Lisbon" not in system.files.read("user.md")


async def test_a_forget_cut_short_behind_a_job_a_reader_keeps_is_still_counted(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader holding transcript.db's WAL kept one job, and the pass stopped there: a forget cut short behind
    it went uncounted (memory ok, the moment before degraded: a flap) while its turn kept its words."""
    from sprite_os.backoff import Backoff
    from sprite_os.memory.forget import turns as turns_module

    monkeypatch.setattr(turns_module, "PASS_RETRY", Backoff(first=600.0, max=600.0))
    ids = await seed(system, tmp_path)
    with _reading_mid_transaction(system.settings.layout.transcript_db):
        with capture_logs() as logs:
            await _forgotten_with_the_wal_kept(system, ids[0], logs)
            await _cut_short_at_recall(system, ids[2])
            await wait_for(lambda: _cut_short_counted(system, 1), timeout=30, what="the forget cut short counted")
        forget = await _forget_status(system)
        assert forget["kept_why"] == "reader" and forget["degraded"] is True, forget


async def test_a_pass_while_a_forget_takes_words_out_leaves_what_healthz_says_as_it_was(
        system: MemorySystem, tmp_path: Path) -> None:
    """A pass that ran while another forget took words out left every undecided job alone, a forget cut short
    among them, and said none was cut short: /healthz flapped to ok."""
    ids = await seed(system, tmp_path)
    forgetting = system.forgetting
    real_purge = forgetting.purge_recall
    await _cut_short_at_recall(system, ids[0])
    await forgetting.rewrite_files()
    assert (await _forget_status(system))["cut_short_jobs"] == 1
    go, purging = asyncio.Event(), asyncio.Event()

    async def slow(*args: object) -> None:
        purging.set()
        await go.wait()
        await real_purge(*args)  # type: ignore[arg-type]

    forgetting.purge_recall = slow
    other = asyncio.create_task(system.forget_turns([ids[2]], by="test"))
    try:
        await asyncio.wait_for(purging.wait(), 60)
        # A job kept for later by the passes before (as a disk that would not rewrite leaves it): its minute goes on.
        forgetting._kept_passes, forgetting._kept_since, forgetting._kept_why = 2, time.monotonic() - 30, "disk"
        await forgetting.rewrite_files()
        forget = await _forget_status(system)
        assert forget["cut_short_jobs"] == 1 and forget["degraded"] is True, forget
        kept_for = forget["kept_for_s"]
        assert (forget["kept_passes"], forget["kept_why"]) == (2, "disk"), forget
        assert isinstance(kept_for, float) and kept_for >= 30, forget
    finally:
        go.set()
        await other


async def test_a_decision_whose_check_keeps_failing_shows_as_kept(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass leaves a job being decided alone, and a decision retries a failing kept-turn check for as long as
    it fails: the job waited, its lines in the files, and /healthz said ok however long it lasted. Now it shows as
    kept for `check`, degraded past KEPT_STUCK, and clears once the check succeeds."""
    from sprite_os.memory.forget import turns as turns_module

    ids = await _seed(system, BIRTHDAYS, f"# User\n{MUM}\n{DAD}\n", [])
    forgetting = system.forgetting
    real, forgetting.retries = forgetting.judge.kept_near, (0.05,)
    assert real is not None
    broken = True

    async def failing(lines: Sequence[tuple[str, bool]]) -> list[list[str]]:
        if broken:
            raise OSError("the vector store is unreadable")
        return await real(lines)

    forgetting.judge.kept_near = failing
    with capture_logs() as logs:
        await system.forget_turns([ids[0]], by="test")
        await wait_for(lambda: any(e["event"] == "forget_check_failed" for e in logs), timeout=60,
                       what="the check failed")
    forget = await _forget_status(system)
    assert forget["kept_why"] == "check" and forget["kept_for_s"] is not None and not forget["degraded"], forget
    assert forget["kept_passes"] == 0, forget  # the decision's own tries: no pass kept it (docs/protocol.md)
    monkeypatch.setattr(turns_module, "KEPT_STUCK", 0.0)
    assert (await system.status())["degraded"] is True
    broken = False
    assert await forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    forget = await _forget_status(system)
    assert (forget["kept_for_s"], forget["kept_why"], forget["degraded"]) == (None, None, False), forget


@pytest.mark.parametrize("case", ["again", "fresh", "job-refused", "job-refused-in-parts"])
async def test_a_forget_that_fails_before_its_job_is_written_is_counted_cut_short_until_forgotten_again(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """A forget (`fresh`), or a person's forget again of a turn memory.db still holds words of (`again`), that an
    error ended before its job was written (the files' lines unreadable) left nothing on disk nor in memory saying
    so: the person got an error, and /healthz and memory status said memory was fine while the turn kept its
    words. Now a job with no line of its own is written for it, so it counts cut short (`job-refused`: memory.db
    refuses that job too, and this process counts it), and the person's forget again clears it: of its turns a
    part at a time too (`job-refused-in-parts`: a forget again of them all, one forgotten already, left it counted
    until a restart)."""
    ids = await seed(system, tmp_path)
    named = [ids[0], ids[1]] if case == "job-refused-in-parts" else [ids[1]]
    if case == "again":
        await system.transcript.call(lambda t: t.forget([ids[1]], T0 + 50, "test"))  # its words left in memory.db

    async def unreadable(_self: object) -> object:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(TurnForgetting, "_lines", unreadable)
    if case.startswith("job-refused"):
        real_apply = system.forgetting.apply

        async def refusing(change: Callable[[MemoryDB], Any]) -> Any:
            raise sqlite3.OperationalError("database or disk is full")

        system.forgetting.apply = refusing
    with pytest.raises(OSError):
        await system.forget_turns(named, by="test")
    assert await _cut_short_counted(system, 1)
    assert (await system.status())["degraded"] is True
    await system.forgetting.rewrite_files()  # the pass counts it too (the job on disk) or leaves the count alone
    assert await _cut_short_counted(system, 1)
    monkeypatch.undo()
    if case.startswith("job-refused"):
        system.forgetting.apply = real_apply
    if case == "job-refused-in-parts":
        await system.forget_turns(named[:1], by="test")
        assert await _cut_short_counted(system, 1)  # the other turn keeps its words
    await system.forget_turns(named, by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="every job finished")
    await wait_for(lambda: _cut_short_counted(system, 0), timeout=30, what="memory well again")


async def test_a_failed_rewrite_of_the_word_index_keeps_the_job_and_is_tried_again_by_the_pass(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget deletes its turn's documents from the word index (a mark: the words stay in the segment files),
    then rewrites the index in the background. When that rewrite failed, it was tried again only at the next forget
    or start, while the pass finished the forget's job: the index's files held the turn's words with nothing
    waiting for them. Now the pass keeps the job while the rewrite has not succeeded, tries it again (as for a
    file the disk would not rewrite), and finishes the job once it has, no restart needed; search serves nothing
    of the turn meanwhile."""
    from sprite_os.memory.recall import service

    ids = await seed(system, tmp_path)
    real, failures = service.rewrite, []

    def failing(*args: Any) -> Any:
        if len(failures) < 2:
            failures.append(1)
            raise OSError(28, "No space left on device")
        return real(*args)

    monkeypatch.setattr(service, "rewrite", failing)
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: asyncio.sleep(0, result=len(failures) >= 1), timeout=30, what="the rewrite failed")
    assert not await system.recall.purged(0)
    await system.forgetting.rewrite_files()
    assert len(await system.memory.call(jobs)) == 1  # kept: the index's files may hold the words
    assert (await _forget_status(system))["kept_why"] == "index"
    assert not any("Lisbon" in h.snippet or "Tagus" in h.snippet for h in await system.search("Lisbon Tagus", 10))
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    assert len(failures) == 2 and await system.recall.purged(0)  # tried again by the pass, then done
    assert (await _forget_status(system))["kept_why"] is None



async def test_a_backup_sqlite_cannot_read_is_passed_over_and_said_until_it_is_gone(
        system: MemorySystem, tmp_path: Path) -> None:
    """A damaged backup (a copy of memory.db sqlite will not take as a database) can't be rewritten: the pass passes
    it over and finishes the job, as nothing it can do would change that. Its other pages may still hold the
    forgotten words, and only the log said so: the forget was said done, /healthz ok. Now /healthz (and memory
    status) name it, memory degraded, until it is gone (the operator removed it): looked at by the listing /healthz
    makes of what waits for the operator, as a pass runs only for a forget (it was said until the next forget)."""
    ids = await seed(system, tmp_path)
    damaged = system.settings.layout.memory_dir / "memory.db.before-rebuild-20250101T000000"
    damaged.write_bytes(b"SQLite format 3\x00" + b"I live in Lisbon, in Alfama " * 400)
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the job finished")
    status = await system.status()
    assert status["forget"]["unreadable_backups"] == ["memory/" + damaged.name] and status["degraded"] is True
    damaged.unlink()

    async def said() -> bool:
        status = await system.status()
        return status["forget"]["unreadable_backups"] == [] and not status["forget"]["degraded"]

    await wait_for(said, timeout=10, what="the removed backup no longer said, with no forget since")
    await system.forget_turns([ids[2]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=60, what="the second job finished")
    status = await system.status()
    assert status["forget"]["unreadable_backups"] == [] and status["degraded"] is False


async def test_memory_status_names_what_the_servers_forget_pass_keeps_for_the_operator(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A backup the pass could not read, and why it keeps a job, are the running server's knowledge alone (its
    /healthz): `memory status` printed the jobs waiting only, though /healthz's docs sent the operator to it."""
    from sprite_os.commands import memory_status
    from sprite_os.commands.main import main
    from sprite_os.fsutil import Holder
    from sprite_os.memory.forget.jobs import add_job

    await system.memory.call(lambda m: add_job(m, [1], ["s1"], set(), time.time()))
    backup = "memory/memory.db.before-rebuild-20250101T000000"
    said = {"pid": 4242, "memory": {"forget": {"unreadable_backups": [backup], "kept_why": "index"}}}
    monkeypatch.setattr(memory_status, "ask_server",
                        lambda settings: memory_status.Asked(Holder(4242, "server"), 8765, said, said["pid"]))
    workspace = str(system.settings.layout.root)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--workspace", workspace, "memory", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["server_forget"] == {"unreadable_backups": [backup],
                                                                    "kept_why": "index"}
    assert await asyncio.to_thread(main, ["--workspace", workspace, "memory", "status"]) == 0
    text = capsys.readouterr().out
    assert f"UNREADABLE: .os/{backup}" in text and "the search index's rewrite" in text, text
    said["pid"] = 99  # another workspace's server on the port: its word is not this workspace's
    assert await asyncio.to_thread(main, ["--workspace", workspace, "memory", "status"]) == 0
    assert "UNREADABLE" not in capsys.readouterr().out


@pytest.mark.parametrize("memory", ["garbage", {"forget": [1]},
                                    {"forget": {"unreadable_backups": "abc", "kept_why": ["x"]}}])
async def test_memory_status_takes_an_answer_of_another_shape_from_the_holder_as_none(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], memory: Any) -> None:
    """The holder's own /healthz whose memory or memory.forget is of another shape (a server of another version,
    a damaged answer) failed `memory status` with a traceback, or named each letter of a string as a backup. It is
    taken as saying nothing: exit 0, no backup named."""
    from sprite_os.commands import memory_status
    from sprite_os.commands.main import main
    from sprite_os.fsutil import Holder
    from sprite_os.memory.forget.jobs import add_job

    await system.memory.call(lambda m: add_job(m, [1], ["s1"], set(), time.time()))
    said = {"pid": 4242, "memory": memory}
    monkeypatch.setattr(memory_status, "ask_server",
                        lambda settings: memory_status.Asked(Holder(4242, "server"), 8765, said, said["pid"]))
    workspace = str(system.settings.layout.root)
    capsys.readouterr()
    assert await asyncio.to_thread(main, ["--workspace", workspace, "memory", "status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["server_forget"] == {"unreadable_backups": [], "kept_why": None}
    assert await asyncio.to_thread(main, ["--workspace", workspace, "memory", "status"]) == 0
    assert "UNREADABLE" not in capsys.readouterr().out


@pytest.mark.parametrize("answer", ["trickled", "endless"])
async def test_memory_status_asks_the_server_on_its_port_for_2_s_at_most(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch, answer: str) -> None:
    """Whatever answers on the server's port (a hung server, another process) is asked for 2 s at most: the 2 s
    were each read's, so an answer that came a byte at a time, or a body without end, held `memory status` as
    long as it went on. It now ends at 2 s, says the holder did not answer, and exits 0."""
    import socket
    import threading

    from devkit.processes import free_port
    from sprite_os.commands.main import main
    from sprite_os.fsutil import Holder, WriterLock

    port, stop = free_port(), threading.Event()
    listener = socket.create_server(("127.0.0.1", port))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         + (b"Content-Length: 100000\r\n\r\n{" if answer == "trickled" else b"\r\n{\"pid\": 1, \"x\": \""))
            while not stop.wait(0.3 if answer == "trickled" else 0):
                conn.sendall(b" " if answer == "trickled" else b"x" * 65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    monkeypatch.setenv("SPRITE_OS_PORT", str(port))
    monkeypatch.setattr(WriterLock, "holder", lambda self: Holder(os.getpid(), WriterLock.SERVER))
    workspace = str(system.settings.layout.root)
    began = time.monotonic()
    try:
        assert await asyncio.to_thread(main, ["--workspace", workspace, "memory", "status", "--json"]) == 0
        took = time.monotonic() - began
    finally:
        stop.set()
        listener.close()
        thread.join(10)
    assert took < 8, took  # 2 s asked, and the status's own reading on a loaded machine


def test_a_kill_of_the_passs_rewrite_of_a_backup_is_swept_though_the_clock_was_set_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start's sweep told what a kill of the pass's rewrite left in v1's backup (a temp file, the file's text)
    from v1's own leftovers by their time: written since the backup was made. With the clock set back past the
    backup's time, the pass's temp file looked older than the backup and stayed for good. The pass's temp files
    now bear a name of their own, which the sweep goes by; v1's leftovers stay as before."""
    from sprite_os.memory.forget import backups
    from sprite_os.memory.forget.backups import sweep_backup_temps

    layout = Layout(tmp_path / "ws")
    v1 = layout.os_dir / "backup" / "v1-20990101T000000Z" / "memory"  # made after "now": the clock was set back since
    v1.mkdir(parents=True)
    (v1 / "user.md").write_text("# User\n- Name: Ada\n")
    leftover = v1 / ".tools.md.a1s2d3f4.tmp"  # v1's own, older than the backup
    leftover.write_text("# Tools\n")
    os.utime(leftover, (1_767_225_000, 1_767_225_000))

    class Killed(BaseException):
        pass

    real = backups.atomic_write

    def killed(path: Path, data: bytes, *args: Any, before_rename: Any, **kwargs: Any) -> None:
        def kill(tmp: str) -> None:  # a kill -9 between the temp file and its rename: nothing cleans up
            before_rename(tmp)
            os.link(tmp, tmp + ".kept")  # the temp file as the kill leaves it, past the cleanup of an exception
            raise Killed

        real(path, data, *args, before_rename=kill, **kwargs)

    monkeypatch.setattr(backups, "atomic_write", killed)
    with pytest.raises(Killed):
        backups._rewrite(v1 / "user.md", "# User\n(text removed here)\n")
    for kept in v1.glob("*.kept"):
        kept.rename(kept.with_suffix(""))
    temps = [p for p in v1.iterdir() if p.name.startswith(".user.md.")]
    assert len(temps) == 1
    assert sweep_backup_temps(layout) == temps
    assert sorted(p.name for p in v1.iterdir()) == [leftover.name, "user.md"]


async def test_a_rewrite_of_the_word_index_that_keeps_failing_is_tried_again_at_the_passs_pace(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rewrite of the word index that fails (a full disk) ended by asking for the daemon's pass, and the pass,
    finding it failed, started it again at once: each failure asked for the next pass, each pass for the next
    failure, without a pause. A disk that stayed full turned that into a loop as fast as the disk refused (every
    backup rewritten, a traceback logged, each time). The rewrite is now tried again at the pass's own pace (5 s,
    10 s, … up to 5 minutes), the job kept meanwhile."""
    from sprite_os.memory.recall import service
    from sprite_os.memory.schema import PROCESSED

    ids = await seed(system, tmp_path)
    await system.transcript.call(lambda t: t.set_processed(ids, PROCESSED))  # the daemon has nothing to curate
    tries: list[float] = []

    def full(*_: Any) -> Any:
        tries.append(time.monotonic())
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(service, "rewrite", full)
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    # The first pass starts again at once the forget's own rewrite that failed; the next try waits for the pass's
    # first try again (a loop would have tried it again within milliseconds)
    await wait_for(lambda: asyncio.sleep(0, result=len(tries) >= 3), timeout=30, what="the pass tried it again")
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(tries)]
    assert gaps[1] >= PASS_RETRY.first * (1 - PASS_RETRY.jitter), gaps
    assert len(await system.memory.call(jobs)) == 1
    assert (await _forget_status(system))["kept_why"] == "index"


async def test_a_rewrite_of_the_word_index_whose_record_fails_still_lets_the_pass_finish_the_job(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pass leaves a job for the word index's rewrite under way, whose end asks for the pass again. A rewrite
    that succeeded but whose record in memory.db failed (a lock held past the busy timeout, a full disk) ended
    with an error nothing awaited, and asked for no pass: on an idle Sprite the job stayed for good, counted
    nowhere. The rewrite's end asks for the pass however its record went (the flag stays: the next start rewrites
    the index again)."""
    from sprite_os.memory.recall import service
    from sprite_os.memory.schema import PROCESSED

    ids = await seed(system, tmp_path)
    await system.transcript.call(lambda t: t.set_processed(ids, PROCESSED))  # the daemon has nothing to curate
    real_rewrite, real_marks, refused = service.rewrite, service.write_marks, []

    def slow(*args: Any) -> Any:  # under way when the pass looks
        time.sleep(1.5)
        return real_rewrite(*args)

    def locked(*args: Any) -> Any:
        if not refused:
            refused.append(1)
            raise sqlite3.OperationalError("database is locked")
        return real_marks(*args)

    monkeypatch.setattr(service, "rewrite", slow)
    monkeypatch.setattr(service, "write_marks", locked)
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: asyncio.sleep(0, result=bool(refused)), timeout=30, what="the record refused")
    await wait_for(lambda: system.memory.call(lambda m: not jobs(m)), timeout=20, what="the job finished")



async def test_a_job_kept_for_a_failing_rewrite_of_the_word_index_stays_kept_while_the_rewrite_is_tried_again(
        system: MemorySystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that found the index's rewrite under way left the job for its end, as not kept: when that rewrite
    was the pass's own try again of one that failed (a disk that stays full, a large index whose rewrite takes
    longer than the pass's wait), the pass cleared what /healthz says of the job kept (ok, where it had said
    degraded) and the count of passes that kept it (the tries again back at 5 s, never backing off). While the
    rewrite keeps failing, a pass that finds it under way keeps the job for the disk."""
    from sprite_os.memory.recall import service
    from sprite_os.memory.schema import PROCESSED

    ids = await seed(system, tmp_path)
    await system.transcript.call(lambda t: t.set_processed(ids, PROCESSED))  # the daemon has nothing to curate
    tries: list[float] = []

    def full_at_last(*_: Any) -> Any:
        tries.append(time.monotonic())
        time.sleep(2)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(service, "rewrite", full_at_last)
    await system.forget_turns([ids[1]], by="test")
    assert await system.forgetting.decided(60)
    await wait_for(lambda: asyncio.sleep(0, result=len(tries) >= 2), timeout=30, what="the pass tried it again")
    assert system.recall.purge_state() == "purging" and (await _forget_status(system))["kept_why"] == "index"
    passes = (await _forget_status(system))["kept_passes"]
    await system.forgetting.rewrite_files()  # a pass another cause asks for (a batch), the try again under way
    forget = await _forget_status(system)
    assert (forget["kept_why"], forget["kept_passes"]) == ("index", passes + 1)
    assert len(await system.memory.call(jobs)) == 1
