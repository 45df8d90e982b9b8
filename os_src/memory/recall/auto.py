"""Auto-recall: the memories relevant to a person's message, handed to the agent with it.

Models skip memory tools, so the agent only saw past detail when it thought to search. Now,
before each message is sent, one search runs on it, and the best few memories go with the
message as added context, within a budget (SPRITE_AUTO_RECALL_TOKENS, 1,500 by default),
above a relevance floor, never repeating what the boot prompt already holds and never the
current session's own turns (the agent has those in its context). Capture records the
person's message, not this context.

Pure: `select` and `render` take the hits and decide; the memory system runs the search.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ...text import CHARS_PER_TOKEN, estimate_tokens, utc
from .searcher import RecallHit

MAX_MEMORIES = 5
SEARCHED = 12  # hits looked at for the few that pass
# The relevance floor, chosen on the recall benchmark (docs/memory.md): with both retrievers, a
# memory passes when both found it (cosine >= BOTH_COSINE and BM25 >= BOTH_BM25), or one of them
# is sure on its own (COSINE_ALONE, BM25_ALONE); with words only, BM25 >= LEXICAL_ONLY_BM25. Neither
# score alone separates relevant from not: multilingual-e5-small's cosines crowd 0.80-0.87 for
# unrelated messages, and a message's everyday words earn BM25 5-10 in any long memory.
BOTH_COSINE, BOTH_BM25 = 0.83, 6.0
COSINE_ALONE = 0.87
BM25_ALONE = 14.0
LEXICAL_ONLY_BM25 = 10.0
HEADER = ("<recalled-memories>\nSprite OS found these in your memory of earlier sessions; they may bear on "
          "the message below (the person did not write this part). Oldest first: where two disagree, the "
          "later one holds.")
FOOTER = "</recalled-memories>"

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    return _SPACE.sub(" ", text).strip().casefold()


def relevant(hit: RecallHit, dense: bool) -> bool:
    """Above the floor; `dense`: the search had the dense retriever."""
    cosine, bm25 = hit.cosine, hit.bm25
    if not dense:
        return bm25 is not None and bm25 >= LEXICAL_ONLY_BM25
    if cosine is not None and bm25 is not None and cosine >= BOTH_COSINE and bm25 >= BOTH_BM25:
        return True
    return (cosine is not None and cosine >= COSINE_ALONE) or (bm25 is not None and bm25 >= BM25_ALONE)


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


def select(hits: Sequence[RecallHit], boot: str, budget_tokens: int, dense: bool) -> list[RecallHit]:
    """The memories worth sending, best first: relevant, not in the boot prompt (`boot`,
    normalised), at most MAX_MEMORIES, and within `budget_tokens` once rendered."""
    chosen: list[RecallHit] = []
    used = len(HEADER) + len(FOOTER) + 2
    budget = budget_tokens * CHARS_PER_TOKEN
    for hit in hits:
        if len(chosen) == MAX_MEMORIES:
            break
        if not relevant(hit, dense) or held(hit, boot):
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
