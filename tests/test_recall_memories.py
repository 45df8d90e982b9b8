"""What a search shows, over real stores: facts that change (a correction replaces the older fact
everywhere, with "was: ... until"), no echo (an answer that repeats a memory is not one), a
learning and its turn as one memory, and bad rows (a date of 1e30 or 1e17) that stop nothing."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from devkit.harness import make_settings
from sprite_os.commands.memory_search import as_json, open_searcher, search_main
from sprite_os.config import Settings
from sprite_os.memory.corrections import link_all
from sprite_os.memory.forget.learnings import set_forgotten
from sprite_os.memory.loader import assemble_from, remembered_now, turns_section
from sprite_os.memory.memory_store import MemoryDB, NewLearning
from sprite_os.memory.recall import auto
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall.documents import build, write_marks
from sprite_os.memory.recall.index import swap_in
from sprite_os.memory.recall.service import auto_recalled, index_path
from sprite_os.memory.transcript_store import Observation, TranscriptDB
from sprite_os.tools.memory_search import render

T0 = 1_700_000_000.0


def lexical(tmp_path: Path) -> Settings:
    return make_settings(tmp_path / "ws", "http://127.0.0.1:9").with_overrides(embedding_model="off")


def observation(obs_id: int, session: str, n: int, user: str, answer: str, at: float) -> Observation:
    return Observation(obs_id, at, session, n, user, "[]", answer)


def learn(memory: MemoryDB, *items: NewLearning) -> None:
    memory.commit_batch(trigger="t", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0.0,
                        learnings=list(items), file_updates={}, base_hashes={})


def indexed(settings: Settings, memory: MemoryDB, observations: list[Observation]) -> None:
    """The episodes stored and a whole new index built, as `memory rebuild --index` does."""
    ep.add(memory.conn, [ep.from_observation(o) for o in observations])
    fresh = index_path(settings.layout.memory_dir).with_name("index.new")
    write_marks(memory.conn, build(memory.conn, fresh))
    swap_in(fresh, index_path(settings.layout.memory_dir))


# ---------------------------------------------------------------- auto-recall


def test_auto_recall_answers_a_message_about_what_memory_holds_and_leaves_the_rest_alone(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    indexed(settings, memory, [observation(1, "s1", 1, "Kasia lent me The Ninth Room, a novel", "Enjoy it!", T0),
                               observation(2, "s1", 2, "Talked about the capital for a while", "Nice.", T0 + 1),
                               observation(3, "s1", 3, "How do I cook quinoa?", "Rinse it, then simmer.", T0 + 2)])
    memory.close()
    searcher = open_searcher(settings, lexical=True)
    try:
        assert searcher.known(["Kasia"]) and searcher.known(["kasia's"]) and not searcher.known(["Australia"])
        asked = auto_recalled(searcher, "Which book did Kasia lend me?", T0 + 100, None, "", 1500)
        assert [h.id for h in asked][:1] == [1]
        # words memory holds, but nothing asked of it: the message goes alone
        assert auto_recalled(searcher, "What's the capital of Australia?", T0 + 100, None, "", 1500) == []
        assert auto_recalled(searcher, "How do I cook rice?", T0 + 100, None, "", 1500) == []
    finally:
        searcher.close()


# ---------------------------------------------------------------- facts that change


def test_a_correction_replaces_the_fact_in_the_boot_prompt_and_below_it_in_search(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    learn(memory, NewLearning("FACT", "The user lives in Lisbon"), NewLearning("PREFERENCE", "Likes green tea"))
    learn(memory, NewLearning("CORRECTION", "The user lives in Porto now, not Lisbon"))
    old, tea, fix = memory.all_learnings()
    assert memory.conn.execute("SELECT replaced_by FROM learnings WHERE id = ?", (old.id,)).fetchone()[0] == fix.id

    # The boot prompt: the old fact is gone from the recent learnings; the correction says what it was.
    remembered = remembered_now(memory, time.time())
    assert [x.content for x in remembered.recent] == [fix.content, tea.content]
    prompt = assemble_from({}, remembered, [])
    assert "CORRECTION: The user lives in Porto now, not Lisbon (was: The user lives in Lisbon until " in prompt
    assert "FACT: The user lives in Lisbon" not in prompt

    indexed(settings, memory, [])
    searcher = open_searcher(settings, lexical=True)
    # Both found: the correction first, the old fact just below it, marked.
    hits = searcher.search("where does the user live, Lisbon?", time.time(), 10)
    assert [(h.id, h.type) for h in hits][:2] == [(fix.id, "CORRECTION"), (old.id, "FACT")]
    assert "(was: The user lives in Lisbon until" in hits[0].snippet and hits[1].replaced
    # Only the old fact found ("lives" matches the correction too, so ask for what only it says):
    # the correction is brought in above it.
    memory.conn.execute("UPDATE learnings SET content = 'The user moved to Porto' WHERE id = ?", (fix.id,))
    indexed(settings, memory, [])
    searcher = open_searcher(settings, lexical=True)
    hits = searcher.search("Lisbon", time.time(), 10)
    assert [h.id for h in hits] == [fix.id, old.id]
    # Forgetting the correction brings the old fact back.
    set_forgotten(memory, fix.id, True, time.time())
    assert [x.id for x in remembered_now(memory, time.time()).recent] == [tea.id, old.id]
    assert [(h.id, h.replaced) for h in open_searcher(settings, lexical=True).search("Lisbon", time.time(), 10)] \
        == [(old.id, False)]
    # So does forgetting the turn it came from, which deletes the correction's row.
    set_forgotten(memory, fix.id, False, time.time())
    assert [x.id for x in remembered_now(memory, time.time()).recent] == [fix.id, tea.id]
    memory.conn.execute("DELETE FROM learnings WHERE id = ?", (fix.id,))
    assert [x.id for x in remembered_now(memory, time.time()).recent] == [tea.id, old.id]


def test_corrections_stored_before_the_upgrade_are_linked_by_the_migration(tmp_path: Path) -> None:
    memory = MemoryDB(tmp_path / "memory.db")
    learn(memory, NewLearning("FACT", "The user's name is Dana."))
    learn(memory, NewLearning("CORRECTION", "The user's name is Daniela, not Dana."))
    memory.conn.execute("UPDATE learnings SET replaced_by = NULL, replaced_at = NULL")
    assert link_all(memory.conn) == 1
    assert memory.conn.execute("SELECT replaced_by FROM learnings WHERE id = 1").fetchone()[0] == 2
    assert link_all(memory.conn) == 0  # linked once


# ---------------------------------------------------------------- no echo


def test_an_answer_that_repeats_a_memory_is_not_found_as_one(tmp_path: Path) -> None:
    """The README's walkthrough: "My name is Dana", a new session, "What is my name?" ("Your name is
    Dana."), then `search: Dana` shows one memory: the learning, with the words it came from."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    told = observation(1, "s1", 1, "My name is Dana and I live in Lisbon", "Nice to meet you!", T0)
    asked = observation(2, "s2", 1, "What is my name?", "Your name is Dana.", T0 + 600)
    indexed(settings, memory, [told, asked])
    searcher = open_searcher(settings, lexical=True)
    # Before the curator has run: the turn that said it; the answer that repeated it is left out.
    assert [(h.kind, h.id) for h in searcher.search("Dana", T0 + 700, 10)] == [("episode", 1)]
    learn(memory, NewLearning("FACT", "The user's name is Dana.", "s1", 1))
    indexed(settings, memory, [])
    searcher = open_searcher(settings, lexical=True)
    hits = searcher.search("Dana", T0 + 700, 10)
    assert [(h.kind, h.type) for h in hits] == [("learning", "FACT")]
    assert hits[0].snippet == "The user's name is Dana. (said: My name is Dana and I live in Lisbon)"
    assert render("Dana", hits).splitlines()[0] == "1 memories, best match first:"
    # A turn whose own words ask for it is found, though its answer repeats memory too.
    again = observation(3, "s3", 1, "Is Dana a nice name?", "Your name is Dana, and yes.", T0 + 900)
    indexed(settings, memory, [told, asked, again])
    found = {(h.kind, h.id) for h in open_searcher(settings, lexical=True).search("Dana", T0 + 1000, 10)}
    assert ("episode", 3) in found and ("episode", 2) not in found


# ---------------------------------------------------------------- bad rows


def test_a_date_no_calendar_holds_stops_neither_search_nor_auto_recall_nor_the_boot_prompt(tmp_path: Path) -> None:
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    rows = [observation(1, "s1", 1, "The boat is called Heron", "Noted.", 1e30),
            observation(2, "s1", 2, "The boat's mooring is in Lagos", "Noted.", 1e17),
            observation(3, "s1", 3, "The boat needs paint", "Noted.", T0)]
    indexed(settings, memory, rows)
    learn(memory, NewLearning("FACT", "The user owns a boat"))
    memory.conn.execute("UPDATE learnings SET created_at = 1e17")
    indexed(settings, memory, [])
    searcher = open_searcher(settings, lexical=True)
    for now_words in ("boat", "what about the boat now?", "the boat in March 2023"):
        hits = searcher.search(now_words, time.time(), 10)
        assert {h.id for h in hits if h.kind == "episode"} == {1, 2, 3}
    hits = searcher.search("boat", time.time(), 10)
    shown = render("boat", hits)
    assert "[turn, ?, session s1 turn 3] The boat is called Heron" in shown  # its place by time: last
    assert {as_json(h)["date"] for h in hits} >= {"?", "2023-11-14T22:13:20Z"}
    assert {as_json(h)["at"] for h in hits} >= {None, T0}  # JSON holds no 1e30 as a time, nor NaN
    assert "[?, turn 3 of session s1] The boat is called Heron" in auto.render(hits)
    out = io.StringIO()
    assert search_main(settings, "-", 10, True, True, stdin=io.StringIO("boat\n"), stdout=out) == 0
    assert len(json.loads(out.getvalue())["hits"]) == 4
    # The boot prompt: a learning dated in the year 3 billion is not "recent"; a pending turn of 1e30 shows.
    assert remembered_now(memory, time.time()).recent == []
    transcript = TranscriptDB(settings.layout.transcript_db)
    section = turns_section(rows)
    assert section is not None and "### ?\n" in section
    transcript.close()


# ---------------------------------------------------------------- memory.db read once


def test_a_search_reads_each_memory_from_memory_db_once_and_a_forget_shows_at_the_next(tmp_path: Path) -> None:
    """The rows that weigh what was found (its rare words, its place) are the rows hydration shows: one
    read of the episodes and one of the learnings a search. They are the search's own: a learning
    forgotten after it is gone from the next search."""
    settings = lexical(tmp_path)
    settings.layout.ensure()
    memory = MemoryDB(settings.layout.memory_db)
    learn(memory, NewLearning("FACT", "Kasia lent the user The Ninth Room.", "s1", 2))
    indexed(settings, memory, [observation(1, "s1", 1, "Kasia came over for tea", "Lovely.", T0),
                               observation(2, "s1", 2, "Kasia lent me The Ninth Room", "Enjoy it!", T0 + 1),
                               observation(3, "s1", 3, "Kasia likes quinoa", "Noted.", T0 + 2)])
    searcher = open_searcher(settings, lexical=True)
    read: list[str] = []
    searcher.conn.set_trace_callback(read.append)
    hits = searcher.search("What did Kasia lend me?", T0 + 700, 10)
    assert {(h.kind, h.id) for h in hits} >= {("learning", 1), ("episode", 1), ("episode", 3)}
    rechecks = [s for s in read if s.startswith("SELECT 0, id FROM episodes")]  # a forget since the weighing
    assert len([s for s in read if "FROM episodes WHERE id IN" in s and s not in rechecks]) == 1
    assert len([s for s in read if "FROM learnings l" in s and "l.content" in s]) == 1
    assert len(rechecks) == 1  # ids only, once for the lists hydrated (the ranked, the floor's)
    set_forgotten(memory, 1, True, T0 + 800)
    assert ("learning", 1) not in {(h.kind, h.id) for h in searcher.search("What did Kasia lend me?", T0 + 700, 10)}
    searcher.close()
    memory.close()
