"""Recall's pure parts: the time cue, fusion, time order, corrections first, auto-recall's floor
and budget, the session summary in the curator's format, the boot prompt's recent sessions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from devkit.mock_bridge.demo_curator import curate
from sprite_os.memory.corrections import corrected
from sprite_os.memory.curation.curator import SESSIONS_ENDED, build_prompt
from sprite_os.memory.curation.reply import parse_reply
from sprite_os.memory.loader import assemble
from sprite_os.memory.memory_store import Learning
from sprite_os.memory.recall import auto
from sprite_os.memory.recall.hits import (
    Found,
    RecallHit,
    below_corrections,
    drop_echoes,
    fold_sources,
    snippet,
)
from sprite_os.memory.recall.ranking import (
    Candidate,
    fuse,
    lifted,
    never_below_words,
    order_by_time,
    weighted_rrf,
    with_neighbours,
)
from sprite_os.memory.recall.rarity import prior
from sprite_os.memory.recall.searcher import _fused_scores
from sprite_os.memory.recall.timeparse import When, anchor_cue, time_cue
from sprite_os.memory.transcript_store import Observation


def ts(year: int, month: int, day: int) -> float:
    return datetime(year, month, day, tzinfo=UTC).timestamp()


NOW = ts(2023, 7, 10)


@pytest.mark.parametrize(("query", "start", "end"), [
    ("what did I decide about the mortgage last spring?", ts(2023, 3, 1), ts(2023, 6, 1)),
    ("in March 2022, what was the plan?", ts(2022, 3, 1), ts(2022, 4, 1)),
    ("what did I say in March?", ts(2023, 3, 1), ts(2023, 4, 1)),
    ("what did I say in August?", ts(2022, 8, 1), ts(2022, 9, 1)),  # the latest August
    ("the plan in the summer of 2021", ts(2021, 6, 1), ts(2021, 9, 1)),
    ("last winter", ts(2022, 12, 1), ts(2023, 3, 1)),
    ("about 4 months ago", ts(2023, 2, 1), ts(2023, 5, 1)),
    ("back in 2020", ts(2020, 1, 1), ts(2021, 1, 1)),
])
def test_time_cue_finds_the_period_and_drops_its_words(query: str, start: float, end: float) -> None:
    cue = time_cue(query, NOW)
    assert cue.when is not None
    assert abs(cue.when.start - start) <= 3 * 86400 and abs(cue.when.end - end) <= 3 * 86400
    assert cue.when.text not in cue.rest


def test_time_cue_current_and_none() -> None:
    assert time_cue("where does Tom live now?", NOW).current
    assert time_cue("where does Tom work at present?", NOW).current
    plain = time_cue("which restaurant did Maya recommend?", NOW)
    assert plain.when is None and not plain.current and plain.rest == "which restaurant did Maya recommend?"


def test_every_generated_temporal_question_is_read_as_its_period() -> None:
    from bench.recall.generate import benchmark

    _, questions = benchmark(7)
    temporal = [q for q in questions if q.category == "temporal"]
    assert len(temporal) == 300
    for q in temporal:
        cue = time_cue(q.question, q.asked_at)
        assert cue.when is not None and q.window is not None, q.question
        assert cue.when.start <= q.window[0] + 86400 and q.window[1] - 86400 <= cue.when.end, q.question


def c(item: int, score: float = 0.0, at: float = 0.0, **kw: float) -> Candidate:
    return Candidate("episode", item, score, at, **kw)  # type: ignore[arg-type]


def test_weighted_rrf_rewards_agreement_keeps_both_signals_and_weights() -> None:
    lexical = [c(1, bm25=9.0), c(2, bm25=5.0), c(3, bm25=4.0)]
    dense = [c(3, cosine=0.9), c(4, cosine=0.8), c(1, cosine=0.7)]
    fused = weighted_rrf([lexical, dense], [1.0, 1.0], k=10)
    assert {f.id for f in fused[:2]} == {1, 3}  # in both lists
    first = next(f for f in fused if f.id == 1)
    assert (first.bm25, first.cosine) == (9.0, 0.7) and first.score == pytest.approx(1 / 11 + 1 / 13)
    assert weighted_rrf([lexical, dense], [1.0, 0.0], k=10)[0].id == 1  # dense weighted out
    assert weighted_rrf([lexical, dense], [0.0, 1.0], k=10)[0].id == 3


def test_order_by_time_puts_the_period_first_and_never_boosts_the_future() -> None:
    old, new, future = c(1, 1.0, NOW - 400 * 86400), c(2, 0.9, NOW - 86400), c(3, 0.95, NOW + 86400)
    assert [h.id for h in order_by_time([old, future, new], None, True, NOW)] == [2, 1, 3]
    assert [h.id for h in order_by_time([old, future, new], None, False, NOW)] == [1, 3, 2]
    cue = time_cue("last year", NOW).when
    assert [h.id for h in order_by_time([new, old], cue, False, NOW)] == [1, 2]


def test_a_memory_meaning_cannot_see_counts_as_if_meaning_agreed_with_words() -> None:
    """A turn without a vector yet (or a learning) is fused as if the dense retriever had ranked it where
    words did; without that, the first of words fell to last behind three with vectors."""
    lexical = [c(1), c(2), c(3), c(4)]
    dense = [c(4), c(2), c(3)]  # 1 has no vector
    plain = weighted_rrf([lexical, dense], [1.0, 1.0])
    assert [x.id for x in plain] == [2, 4, 3, 1]  # what fusion did
    fair = fuse(lexical, dense, lambda x: x.id != 1)
    assert fair[0].id == 1 and fair[0].score == pytest.approx(2 / 11)
    assert [x.id for x in fuse(lexical, dense, lambda x: True)] == [x.id for x in plain]  # all seen: plain RRF


def test_a_memory_meaning_cannot_see_is_never_ranked_below_its_place_in_words_alone() -> None:
    lexical = [c(1), c(2), c(3), c(4)]
    ranked = [c(5), c(6), c(7), c(2), c(1), c(8)]  # 1 and 2 have no vector
    out = never_below_words(ranked, lexical, lambda x: x.id not in (1, 2))
    assert [x.id for x in out] == [1, 2, 5, 6, 7, 8]
    assert [x.id for x in never_below_words(ranked, lexical, lambda x: True)] == [5, 6, 7, 2, 1, 8]
    # Already above its place: it stays; a list that holds a memory twice shows it once.
    assert [x.id for x in never_below_words([c(2), c(9), c(2), c(1)], lexical, lambda x: x.id != 1)] == [1, 2, 9]


def test_the_floor_brings_in_a_memory_the_fused_list_lacks_and_holds_on_shown_hits() -> None:
    """The floor is taken on what search shows: a turn without a vector that words alone show is shown
    at or above that place even when the fused list (cut before hydration) does not hold it, and a
    memory hydration left out on purpose (an echo, a turn shown as its learning) stays out."""
    words = [c(1), c(2), c(3)]
    fused = [c(5), c(6), c(7), c(8)]  # 1 and 3 lack a vector, and fell out of the fused list
    out = never_below_words(fused, words, lambda x: x.id not in (1, 3))
    assert [x.id for x in out] == [1, 5, 3, 6, 7, 8]
    assert [x.id for x in never_below_words(fused, words, lambda x: x.id not in (1, 3), {("episode", 1)})] == \
        [5, 6, 3, 7, 8]
    # hits, not candidates: the same rule over what hydration made of each list
    hit = lambda i: RecallHit("episode", i, 0.0, 0.0, "s", i, i, "EPISODE", "")  # noqa: E731
    shown_hits = never_below_words([hit(5), hit(2), hit(6)], [hit(2), hit(9)], lambda x: x.id != 2)
    assert [h.id for h in shown_hits] == [2, 5, 6]
    # one brought in from word search alone carries BM25: it takes the fused score of the hit it went above
    scored = lambda i, s: RecallHit("episode", i, s, 0.0, "s", i, i, "EPISODE", "")  # noqa: E731
    out = _fused_scores([scored(1, 9.5), scored(5, 0.2), scored(3, 7.0), scored(6, 0.1)], {("episode", 5),
                                                                                       ("episode", 6)}, lambda h: True)
    assert [h.score for h in out] == [0.2, 0.2, 0.1, 0.1]
    # one it moved up (meaning can't see it) takes at least the score of the hit below it; a seen one keeps its own
    out = _fused_scores([scored(1, 0.05), scored(5, 0.2), scored(6, 0.1), scored(7, 0.01)],
                        {("episode", i) for i in (1, 5, 6, 7)}, lambda h: h.id != 1)
    assert [h.score for h in out] == [0.2, 0.2, 0.1, 0.01]


@pytest.mark.parametrize(("query", "event", "before", "days", "rest"), [
    ("What did I buy the week before Mags's wedding?", "Mags's wedding", True, 7, "What did I buy  ?"),
    ("Where did we eat in the days after the move", "the move", False, 5, "Where did we eat"),
    ("what happened just before my operation?", "my operation", True, 3, "what happened  ?"),
    ("the month following Dad's birthday, what did I read?", "Dad's birthday", False, 31, ", what did I read?"),
])
def test_a_time_placed_by_another_event_names_the_event(query: str, event: str, before: bool, days: int,
                                                         rest: str) -> None:
    anchor = anchor_cue(query)
    assert anchor is not None and (anchor.event, anchor.before, anchor.days) == (event, before, days)
    assert anchor.rest == rest


def test_the_period_an_event_places_allows_a_week_either_side_of_when_it_was_told() -> None:
    day = 86_400.0
    week_before = anchor_cue("what did I cook the week before the wedding?")
    assert week_before is not None and week_before.window(100 * day) == When(86 * day, 107 * day, "the wedding")
    after = anchor_cue("what did I cook the day after the wedding?")
    assert after is not None and after.window(100 * day) == When(93 * day, 108 * day, "the wedding")
    assert anchor_cue("Have I been to Porto before?") is None and anchor_cue("before, after") is None


def test_a_specific_memory_weighs_more_up_to_a_bound() -> None:
    assert prior(0) == 1.0 and prior(1) == pytest.approx(1.4) and prior(6) == prior(60) == pytest.approx(3.4)


def test_a_turn_gains_a_share_of_the_better_turn_found_beside_it_in_its_session() -> None:
    """A fact told over two turns: the turn after the one that matched best comes up with it."""
    ranked = [c(1, 1.0), c(7, 0.5), c(2, 0.45), c(9, 0.44)]
    places = {("episode", 1): ("s", 3), ("episode", 2): ("s", 4), ("episode", 7): ("t", 1),
              ("episode", 9): ("s", 9)}
    out = with_neighbours(ranked, places, share=0.1)
    assert [x.id for x in out] == [1, 2, 7, 9]
    assert out[1].score == pytest.approx(0.45 + 0.1 * 1.0)  # the better of its two neighbours
    assert out[0].score == pytest.approx(1.0 + 0.1 * 0.45)
    assert out[3].score == pytest.approx(0.44)  # nothing found beside it, or another session: unchanged
    assert [x.id for x in with_neighbours(ranked, {}, share=0.1)] == [1, 7, 2, 9]  # learnings have no place


def test_a_period_placed_by_an_uncertain_event_lifts_its_memories_without_putting_them_first() -> None:
    week = When(ts(2023, 5, 1), ts(2023, 5, 8), "the wedding")
    inside, outside, far = c(1, 0.5, ts(2023, 5, 3)), c(2, 0.6, ts(2023, 1, 1)), c(3, 1.0, ts(2022, 1, 1))
    out = lifted([far, outside, inside], week, 0.3)
    assert [x.id for x in out] == [3, 1, 2] and out[1].score == pytest.approx(0.65)


def hit(kind: str, item: int, type_: str, text: str, at: float = 0.0, cosine: float | None = None,
        bm25: float | None = None, session: str | None = "s1", turn: int | None = 1) -> RecallHit:
    return RecallHit(kind, item, 1.0, at, session, turn, item, type_, text, bm25, cosine)


def test_a_correction_replaces_the_older_learning_it_restates_and_nothing_else() -> None:
    older = [(1, "Dates are written MM/DD/YYYY"), (2, "Likes green tea"), (3, "The user's name is Dana.")]
    assert corrected("Dates are DD/MM/YYYY, not MM/DD/YYYY", older) == 1
    assert corrected("The user's name is Daniela, not Dana.", older) == 3
    assert corrected("Prefers coffee in the morning", older) is None  # shares nothing with any of them
    assert corrected("The user's dog is called Rex", older) is None  # "user" alone says nothing
    # Of two candidates, the one it covers best.
    assert corrected("Lives in Porto now, not Lisbon", [(4, "Works in Lisbon at a bank"), (5, "Lives in Lisbon")]) == 5


def test_snippet_is_one_line_around_the_match() -> None:
    text = "x " * 300 + "Lotus Garden\nis by the river " + "y " * 300
    piece = snippet(text, ["lotus"])
    assert "Lotus Garden is by the river" in piece and "\n" not in piece and len(piece) <= 242
    assert snippet("short text", ["none"]) == "short text"


# ---------------------------------------------------------------- auto-recall


ASKS = auto.Cues(named=True, personal=True, spread=0.05)  # a message that asks for memory


def test_auto_recall_reads_a_name_memory_holds_and_the_person_in_a_message() -> None:
    held = {"Kasia", "Utrecht"}

    def known(words: Sequence[str]) -> bool:
        return any(w in held for w in words)

    assert auto.cues("What did Kasia recommend to me?", 0.04, known) == auto.Cues(True, True, 0.04)
    # a name memory has never seen, and the first word (capitalised in any sentence), name nothing held
    assert auto.cues("What's the capital of Australia?", None, known) == auto.Cues(False, False, None)
    assert not auto.cues("Kasia", None, known).named
    assert auto.cues("When was I in Utrecht?", None, known).named
    # the person: I (and I'm, I've), my, we, us...; not as part of another word
    assert not auto.cues("I'm back", None, known).named
    assert [auto.cues(m, None, known).personal for m in ("I'm back", "How much will it cost us?",
                                                         "Is a tomato a fruit?", "Mind the gap")] == [
        True, True, False, False]
    # a sentence's first word names nothing, whichever sentence; "US" the country is not "us"
    held.add("Can")
    assert not auto.cues("Thanks. Can you run the tests again?", None, known).named
    assert auto.cues("Thanks. Then ask Kasia?", None, known).named
    assert not auto.cues("What is the US GDP?", None, known).personal
    assert auto.cues("Us? Never.", None, known).personal


def test_auto_recall_sends_nothing_unless_the_message_asks_for_memory() -> None:
    found = [hit("episode", 1, "EPISODE", "Kasia recommended The Ninth Room", cosine=0.86, bm25=6.0),
             hit("episode", 2, "EPISODE", "cooked quinoa", cosine=0.85, bm25=3.0)]
    # a name memory holds, the person, a hit that stands out: every hit goes, best first
    assert [h.id for h in auto.select(found, "", 1500, ASKS)] == [1, 2]
    # an everyday how-to: the person, but no name, words that earn little, and nothing that stands out
    how_to = auto.Cues(named=False, personal=True, spread=0.02)
    assert not auto.asks(found, how_to) and auto.select(found, "", 1500, how_to) == []
    # ...unless a memory stands out from the rest by meaning, or matches many of its words
    assert auto.asks(found, auto.Cues(named=False, personal=True, spread=0.06))
    assert auto.asks([hit("episode", 3, "EPISODE", "quinoa", bm25=12.0)], how_to)
    # with words alone (no meaning: spread None), their own weights decide
    words_only = auto.Cues(named=True, personal=False, spread=None)
    assert auto.asks([hit("episode", 4, "EPISODE", "x", bm25=4.0)], words_only)
    assert not auto.asks([hit("episode", 4, "EPISODE", "x", bm25=2.0)], words_only)
    assert not auto.asks([], auto.Cues(named=False, personal=True, spread=None))
    assert auto.select([], "", 1500, ASKS) == []


def test_auto_recall_stays_within_its_budget_and_skips_what_the_boot_prompt_holds() -> None:
    long = [hit("episode", i, "EPISODE", f"memory {i} " + "word " * 60, cosine=0.9) for i in range(10)]
    picked = auto.select(long, "", 200, ASKS)
    assert 0 < len(picked) < 10
    assert len(auto.render(picked)) <= 200 * auto.CHARS_PER_TOKEN
    assert auto.tokens(picked) <= 200
    assert len(auto.select(long, "", 100_000, ASKS)) == auto.MAX_MEMORIES
    boot = auto.normalise("## What you know\n- The user's name is Ada Lovelace\n")
    known = hit("learning", 1, "FACT", "The user's  name is Ada Lovelace", cosine=0.95)
    new = hit("learning", 2, "FACT", "Ada lives in Lyon", cosine=0.95)
    assert auto.select([known, new], boot, 1500, ASKS) == [new]
    assert auto.select([], boot, 1500, ASKS) == []


def test_the_recalled_context_names_each_memory_and_its_source() -> None:
    memory = hit("episode", 3, "EPISODE", "Maya recommended Lotus Garden", cosine=0.9, session="c1", turn=4)
    context = auto.render([memory])
    assert context.startswith("<recalled-memories>") and context.rstrip().endswith("</recalled-memories>")
    assert "turn 4 of session c1] Maya recommended Lotus Garden" in context


# ---------------------------------------------------------------- summaries


def obs(n: int, session: str = "s1", said: str = "hello") -> Observation:
    return Observation(id=n, timestamp=1_700_000_000.0 + n, session_id=session, sequence_num=n, user_message=said,
                       tool_calls_json="[]", agent_response="ok")


def test_the_prompt_names_the_sessions_that_ended_and_a_summary_line_parses() -> None:
    prompt = build_prompt({}, [obs(3), obs(4, "s2"), obs(5, "s2")], ended={"s2"})
    assert f"{SESSIONS_ENDED} #5." in prompt and "SUMMARY" in prompt
    assert SESSIONS_ENDED not in build_prompt({}, [obs(3)])
    reply = parse_reply("FACT: Likes tea [#3]\nSUMMARY: Planned the trip to Lyon; booking still open [#5]",
                        [3, 4, 5], {3: "s1", 4: "s2", 5: "s2"})
    summary = reply.learnings[1]
    assert (summary.type, summary.content, summary.source_observation_id, summary.session_id) == (
        "SUMMARY", "Planned the trip to Lyon; booking still open", 5, "s2")
    assert parse_reply("**SUMMARY**: Fixed the build", [1]).learnings[0].type == "SUMMARY"


def test_the_demo_curator_summarises_a_session_that_ended() -> None:
    reply = curate(build_prompt({}, [obs(1, said="My name is Dana"), obs(2, said="bye for now")], ended={"s1"}))
    parsed = parse_reply(reply, [1, 2], {1: "s1", 2: "s1"})
    summaries = [x for x in parsed.learnings if x.type == "SUMMARY"]
    assert len(summaries) == 1 and "bye for now" in summaries[0].content and summaries[0].source_observation_id == 2
    assert curate(build_prompt({}, [obs(1, said="bye")])) == "NONE"  # no session ended: nothing to summarise


def learning(n: int, kind: str, content: str) -> Learning:
    return Learning(n, 1_700_000_000.0 + n, "s1", kind, content, None, 0.8)


def test_the_boot_prompt_lists_recent_sessions_after_the_context_file() -> None:
    summaries = [learning(2, "SUMMARY", "Planned the Lyon trip"), learning(1, "SUMMARY", "Fixed the build")]
    recent = [learning(3, "FACT", "Likes tea"), summaries[0]]
    prompt = assemble({"context.md": "- working on the trip"}, [], recent, summaries=summaries)
    section = prompt.index("## Recent sessions")
    assert prompt.index("working on the trip") < section < prompt.index("Planned the Lyon trip")
    assert prompt.count("Planned the Lyon trip") == 1  # not again among the last 48 hours
    assert "Likes tea" in prompt
    assert "## Recent sessions" not in assemble({}, [], recent, summaries=[])


def test_the_recalled_context_lists_memories_oldest_first_so_a_correction_follows_what_it_corrects() -> None:
    correction = hit("episode", 2, "EPISODE", "Sorry: my dog is called Max, not Rex", at=200.0, cosine=0.9)
    statement = hit("episode", 1, "EPISODE", "My dog is called Rex", at=100.0, cosine=0.95)
    context = auto.render([correction, statement])  # best first, as select() returns them
    assert context.index("My dog is called Rex") < context.index("my dog is called Max, not Rex")
    assert "the later one holds" in context


# ---------------------------------------------------------------- what hits show


def found(kind: str, item: int, text: str, at: float, source: int | None = None, type_: str = "FACT",
          persons: str | None = None, agents: str = "", replaced_by: int | None = None) -> Found:
    return Found(Candidate(kind, item, 1.0, at), "s", 1, source if kind == "learning" else item,  # type: ignore[arg-type]
                 "EPISODE" if kind == "episode" else type_, text, text if persons is None else persons, agents,
                 replaced_by)


def test_a_learning_and_the_turn_it_came_from_are_one_memory_at_the_better_place() -> None:
    turn = found("episode", 7, "My name is Dana and I live in Lisbon", 1.0)
    fact = found("learning", 1, "The user's name is Dana.", 2.0, source=7)
    summary = found("learning", 2, "A session about names", 3.0, source=7, type_="SUMMARY")
    other = found("episode", 8, "Dana's sister called", 4.0)
    also = found("learning", 3, "The user lives in Lisbon.", 5.0, source=7)
    out = fold_sources([turn, other, summary, fact, also])
    # The turn's place goes to the best-ranked learning from it, which carries the person's words; a
    # session's summary, which only names the turn as its last, folds nothing (whichever came first).
    assert [(f.candidate.kind, f.candidate.id) for f in out] == [
        ("learning", 1), ("episode", 8), ("learning", 2), ("learning", 3)]
    assert out[0].text == "The user's name is Dana. (said: My name is Dana and I live in Lisbon)"
    assert out[2].text == "A session about names" and out[3].text == "The user lives in Lisbon."
    assert fold_sources([other, fact]) == [other, fact]  # its turn not found: nothing to fold


def test_an_answer_found_only_by_its_words_repeating_an_older_memory_is_left_out() -> None:
    said = found("episode", 1, "My name is Dana", 1.0)
    echo = found("episode", 2, "What is my name?\nYour name is Dana.", 2.0, persons="What is my name?\n",
                 agents="Your name is Dana.")
    assert drop_echoes([said, echo], ["dana"]) == [said]
    assert drop_echoes([echo], ["dana"]) == [echo]  # nothing older says it: the answer is all there is
    assert drop_echoes([echo, said], ["name"]) == [echo, said]  # the person's own words match too
    told_later = found("episode", 3, "My name is Dana", 3.0)
    assert drop_echoes([told_later, echo], ["dana"]) == [told_later, echo]  # the memory is newer than the answer
    unknown = found("episode", 4, "What is my name?\nYour name is Dana.", 2.0)  # a row from before answer_at
    assert drop_echoes([said, unknown], ["dana"]) == [said, unknown]


def test_an_answer_sharing_only_a_common_word_of_the_question_with_an_older_turn_is_no_echo() -> None:
    """"Would Rav enjoy a steakhouse dinner?": the turn that answers it says "He has stopped drinking"
    (the name in the turn before) and the agent's "Noted for any dinner plans."; an older, unrelated
    turn says "dinner" too. The answer repeats nothing of it: the turn stays."""
    other = found("episode", 1, "Ravi came over for dinner, we just watched telly.", 1.0)
    told = found("episode", 2, "He has stopped drinking.\nNoted for any dinner plans.", 2.0,
                 persons="He has stopped drinking.\n", agents="Noted for any dinner plans.")
    assert drop_echoes([other, told], ["rav", "enjoy", "steakhouse", "dinner"]) == [other, told]
    # the same older turn, repeated by the answer beyond the question's word: an echo
    repeat = found("episode", 3, "Any plans?\nRavi came over for dinner, you watched telly.", 3.0,
                   persons="Any plans?\n", agents="Ravi came over for dinner, you watched telly.")
    assert drop_echoes([other, repeat], ["steakhouse", "dinner"]) == [other]


def test_a_replaced_learning_sits_just_below_its_correction_which_is_brought_in_if_missing() -> None:
    old = found("learning", 1, "Lives in Lisbon", 1.0, replaced_by=3)
    tea = found("learning", 2, "Likes tea", 2.0)
    fix = found("learning", 3, "Lives in Porto now, not Lisbon", 3.0, type_="CORRECTION")
    turn = found("episode", 9, "Lisbon was sunny", 0.5)
    assert [f.candidate.id for f in below_corrections([old, tea, fix, turn], {})] == [2, 3, 1, 9]
    brought = below_corrections([turn, old, tea], {1: fix})
    assert [f.candidate.id for f in brought] == [9, 3, 1, 2]
    assert brought[1].candidate.score == old.candidate.score  # at the replaced learning's place
    assert [f.candidate.id for f in below_corrections([old, tea], {})] == [1, 2]  # correction gone (forgotten)
