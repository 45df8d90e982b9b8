"""Auto-recall: the memories relevant to a person's message, handed to the agent with it.

Models skip memory tools, so the agent only saw past detail when it thought to search. Now,
before each message is sent, one search runs on it, and the best few memories go with the
message as added context, within a budget (SPRITE_AUTO_RECALL_TOKENS, 1,500 by default),
when the message asks for memory at all (`asks`: most messages do not), never repeating what the boot prompt already holds and never the
current session's own turns (the agent has those in its context). Capture records the
person's message, not this context.

Pure: `select` and `render` take the hits and decide; the memory system runs the search.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...text import CHARS_PER_TOKEN, estimate_tokens, utc
from .searcher import RecallHit

MAX_MEMORIES = 8
SEARCHED = 12  # hits looked at for the few that go


@dataclass(frozen=True)
class Cues:
    """What says a message asks something of memory, beside its hits' BM25."""

    named: bool  # it names something memory holds: a capitalised word, not a sentence's first, found in the index
    personal: bool  # it speaks of the person: I, my, we, us...
    spread: float | None  # the nearest memory's cosine above the 50th nearest's (searcher.py; None: no meaning)


@dataclass(frozen=True)
class Gate:
    """A message asks for memory when named * `named` + personal * `personal` + its best hit's BM25 *
    `bm25` + the spread * `spread` reaches `threshold`."""

    named: float
    personal: float
    bm25: float
    spread: float
    threshold: float


# Neither retriever's score says on its own whether a message asks for memory at all: e5's cosines crowd
# 0.80-0.87 for any message, and everyday words earn BM25 5-10 in a long memory. What separates them on
# the dialogue benchmark (docs/benchmarks.md): the message names someone or something memory holds, it
# speaks of the person, its best BM25, and how far its nearest memory stands out from the message's 50th
# nearest (a message about nothing in memory is about as near to all of it). Weights fitted there on both
# workspaces, the threshold where at most 1 in 10 unrelated messages passes; the two workspaces agree.
WITH_MEANING = Gate(named=2.0, personal=1.5, bm25=0.1, spread=25.0, threshold=3.0)
WORDS_ONLY = Gate(named=1.4, personal=0.8, bm25=0.1, spread=0.0, threshold=1.7)
HEADER = ("<recalled-memories>\nSprite OS found these in your memory of earlier sessions; they may bear on "
          "the message below (the person did not write this part). Oldest first: where two disagree, the "
          "later one holds.")
FOOTER = "</recalled-memories>"

_SPACE = re.compile(r"\s+")
# The person's own words, as written: "US" (the country) and "IT" are not "us" and "it".
_PERSONAL = re.compile(r"\b(?:[Ii]|[Mm]y|[Mm]e|[Mm]ine|[Ww]e|[Uu]s|[Oo]ur|[Oo]urs)\b")
_SENTENCES = re.compile(r"(?<=[.!?…])\s+")
_WORD = re.compile(r"\w[\w'’]*")
_SELF = re.compile(r"I(['’]\w+)?")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def cues(message: str, spread: float | None, known: Callable[[Sequence[str]], bool]) -> Cues:
    """The message's cues; `known(words)`: does memory hold any of these words (the index's own counts)."""
    # a capital that starts a sentence names nothing ("Thanks. Can you run the tests again?")
    names = [w for sentence in _SENTENCES.split(message) for w in _WORD.findall(sentence)[1:]
             if w[0].isupper() and not _SELF.fullmatch(w)]
    return Cues(named=bool(names) and known(names), personal=_PERSONAL.search(message) is not None, spread=spread)


def asks(hits: Sequence[RecallHit], cue: Cues) -> bool:
    """Does the message ask for memory, and do these hits answer it? (the gate; each hit then goes)"""
    return could_ask(max((h.bm25 for h in hits if h.bm25 is not None), default=0.0), cue)


def could_ask(best_bm25: float, cue: Cues) -> bool:
    """The gate, when the message's best hit by words scores `best_bm25` (BM25, 0 for none): the score only
    rises with it, so a search whose every candidate scores below the line need show none (searcher.py)."""
    gate = WORDS_ONLY if cue.spread is None else WITH_MEANING
    score = (gate.named * cue.named + gate.personal * cue.personal + gate.bm25 * best_bm25
             + gate.spread * (cue.spread or 0.0))
    return score >= gate.threshold


def held(hit: RecallHit, boot: str) -> bool:
    """True if the boot prompt (normalised) already says this memory."""
    core = normalise(hit.snippet.strip("…"))[:160]
    return bool(core) and core in boot


def line(hit: RecallHit) -> str:
    day = utc(hit.at, "%Y-%m-%d")
    if hit.kind == "episode":
        where = f"turn {hit.turn} of session {hit.session_id}"
        return f"- [{day}, {where}] {hit.snippet}"
    return f"- [{hit.type}, {day}] {hit.snippet}"


def select(hits: Sequence[RecallHit], boot: str, budget_tokens: int, cue: Cues) -> list[RecallHit]:
    """The memories worth sending, best first: none unless the message asks for memory (`asks`),
    then the first MAX_MEMORIES not in the boot prompt (`boot`, normalised) within `budget_tokens`
    once rendered."""
    if not asks(hits, cue):
        return []
    chosen: list[RecallHit] = []
    used = len(HEADER) + len(FOOTER) + 2
    budget = budget_tokens * CHARS_PER_TOKEN
    for hit in hits:
        if len(chosen) == MAX_MEMORIES:
            break
        if held(hit, boot):
            continue
        cost = len(line(hit)) + 1
        if used + cost > budget:
            continue  # a shorter one further down may still fit
        chosen.append(hit)
        used += cost
    return chosen


def render(hits: Sequence[RecallHit]) -> str:
    """The memories as the agent reads them, oldest first, so a correction comes after what it corrects."""
    ordered = sorted(hits, key=lambda h: h.at)
    return "\n".join([HEADER, *(line(h) for h in ordered), FOOTER])


def tokens(hits: Sequence[RecallHit]) -> int:
    return estimate_tokens(len(render(hits))) if hits else 0
