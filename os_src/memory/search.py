"""search_memory's query handling: any text in, a safe FTS5 query out.

The user's words never reach FTS5 syntax: each word becomes a quoted term, so
operators, quotes, parentheses and column filters in the input are inert.
Terms are OR-ed and ranked by BM25, so a natural question ("what date format
does she like?") finds learnings that share its meaningful words.
"""

from __future__ import annotations

import re

MAX_QUERY_CHARS = 2_000  # of input looked at; the rest of a huge query is ignored
MAX_TERMS = 12
MAX_TERM_CHARS = 64
MAX_LIMIT = 50

_WORD = re.compile(r"\w+")
STOPWORDS = frozenset(
    """a about after again all also am an and any are as at be been before being but by can could did do
    does doing for from had has have having he her here hers him his how i if in into is it its just me
    more most my no nor not now of on once only or other our out over own same she should so some such
    than that the their them then there these they this those through to too under until up very was we
    were what when where which while who whom why will with would you your yours""".split()
)


def fts_query(text: str) -> str | None:
    """The FTS5 MATCH expression for `text`, or None if it has no searchable words."""
    words = [w.lower() for w in _WORD.findall(text[:MAX_QUERY_CHARS])]
    meaningful = [w for w in words if w not in STOPWORDS and len(w) > 1] or words
    terms = list(dict.fromkeys(w[:MAX_TERM_CHARS] for w in meaningful))[:MAX_TERMS]
    if not terms:
        return None
    return " OR ".join(f'"{term}"' for term in terms)


def clamp_limit(limit: object) -> int:
    try:
        value = int(limit)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 10
    return max(1, min(MAX_LIMIT, value))
