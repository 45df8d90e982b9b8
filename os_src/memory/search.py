"""search_memory's query handling: any text in, plain search terms out.

The user's words never reach FTS5 syntax: only runs of word characters survive,
and each is quoted as an FTS5 string, so operators, quotes, parentheses and
column filters in the input are inert. Learnings are ranked by BM25, or by the
rarity of the terms they contain when memory is large (see
database.MemoryDB.search), so a natural question ("what date format does she
like?") finds learnings that share its meaningful words.
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


def search_terms(text: str) -> list[str]:
    """The words of `text` worth searching for: lowercase, stopwords dropped (unless
    nothing else is left), each at most 64 characters, at most 12."""
    words = [w.lower() for w in _WORD.findall(text[:MAX_QUERY_CHARS])]
    meaningful = [w for w in words if w not in STOPWORDS and len(w) > 1] or words
    return list(dict.fromkeys(w[:MAX_TERM_CHARS] for w in meaningful))[:MAX_TERMS]


def clamp_limit(limit: object) -> int:
    try:
        value = int(limit)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 10
    return max(1, min(MAX_LIMIT, value))
