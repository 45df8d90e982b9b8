"""Episodes: every recorded turn, as recall searches it.

An episode is one observation rendered as text (the person's message, the tool calls that
say what was done, the agent's answer), with its session, its 1-based turn within the
session and its date. The rows live in memory.db's `episodes` table, derived from
transcript.db (which stays append-only) and rebuilt from it by `memory rebuild`.

Capture removes `<private>` text before a turn is stored; rendering removes it again, so
an imported or older row can never carry it into the index either.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from ...database import marks, rows, transaction
from ...text import clean_text, strip_private
from ..transcript_store import Observation

USER_CHARS = 2_000
EPISODE_RESPONSE_CHARS = 2_000
TOOL_CALLS = 6  # the first few calls say what was done; outputs are left out
EPISODE_TOOL_INPUT_CHARS = 80  # an episode names a call's input; the transcript keeps more of it
NEIGHBOURS = 2  # turns either side, indexed as the episode's context
EMBED_CHARS = 2_000  # of the previous turn plus this one, for the dense retriever
EMBED_RECIPE = "said-before"  # what embed_text embeds: vectors of another recipe are made again


class Episode(msgspec.Struct, frozen=True):
    id: int  # the observation's id in transcript.db
    session_id: str
    turn: int  # 1-based within the session
    at: float
    text: str
    answer_at: int | None = None  # where the agent's words begin in `text` (None: not known, older rows)

    @property
    def persons_part(self) -> str:
        """What the person said (and the tools run): the text before the agent's answer."""
        return self.text if self.answer_at is None else self.text[:self.answer_at]

    @property
    def agents_part(self) -> str:
        return "" if self.answer_at is None else self.text[self.answer_at:]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def _tools(tool_calls_json: str) -> str:
    try:
        calls = json.loads(tool_calls_json)
    except ValueError:
        return ""
    if not isinstance(calls, list):
        return ""
    said = []
    for call in calls[:TOOL_CALLS]:
        if isinstance(call, dict) and call.get("name") not in (None, "(more)"):
            said.append(f"{call.get('name')} {_cut(str(call.get('input', '')), EPISODE_TOOL_INPUT_CHARS)}".strip())
    return ("(tools: " + "; ".join(said) + ")") if said else ""


def render(obs: Observation) -> str:
    """The episode's text: message, tools, answer; bounded, clean, without private text."""
    return _rendered(obs)[0]


def _rendered(obs: Observation) -> tuple[str, int | None]:
    """The text, and where the agent's answer begins in it (its length when there is none; None when
    private text left open in the person's part hides the answer too)."""
    said = "\n".join(p for p in (_cut(obs.user_message, USER_CHARS), _tools(obs.tool_calls_json)) if p.strip())
    answer = _cut(obs.agent_response, EPISODE_RESPONSE_CHARS)
    text = _clean("\n".join(p for p in (said, answer) if p.strip()))
    if not answer.strip():
        return text, len(text)
    if not said.strip():
        return text, 0
    persons = _clean(said)
    return text, (len(persons) + 1 if text.startswith(persons + "\n") else None)


def _clean(text: str) -> str:
    return strip_private(clean_text(text))


def from_observation(obs: Observation) -> Episode:
    text, answer_at = _rendered(obs)
    return Episode(obs.id, obs.session_id, obs.sequence_num, obs.timestamp, text, answer_at)


# ---------------------------------------------------------------- memory.db's episodes table

_COLUMNS = "id, session_id, turn, at, text, answer_at"


def max_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(id), 0) FROM episodes").fetchone()[0])


def add(conn: sqlite3.Connection, episodes: Sequence[Episode]) -> int:
    """Store episodes. A known id is left as it is, but for where its answer begins, filled in if
    it was not known (a row from before that was stored). Returns how many rows changed."""
    if not episodes:
        return 0
    with transaction(conn) as c:
        before = c.total_changes
        c.executemany(f"INSERT INTO episodes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE "
                      "SET answer_at = excluded.answer_at WHERE answer_at IS NULL AND excluded.answer_at IS NOT NULL",
                      [(e.id, e.session_id, e.turn, e.at, e.text, e.answer_at) for e in episodes])
        return c.total_changes - before


def get(conn: sqlite3.Connection, ids: Sequence[int]) -> dict[int, Episode]:
    found = rows(conn.execute(f"SELECT {_COLUMNS} FROM episodes WHERE id IN ({marks(ids)})", list(ids)), Episode)
    return {e.id: e for e in found}


def after(conn: sqlite3.Connection, last_id: int, limit: int) -> list[Episode]:
    return rows(conn.execute(f"SELECT {_COLUMNS} FROM episodes WHERE id > ? ORDER BY id LIMIT ?",
                             (last_id, limit)), Episode)


def session_window(conn: sqlite3.Connection, session_id: str, first: int, last: int) -> list[Episode]:
    return rows(conn.execute(f"SELECT {_COLUMNS} FROM episodes WHERE session_id = ? AND turn BETWEEN ? AND ? "
                             "ORDER BY turn", (session_id, first, last)), Episode)


def by_session(conn: sqlite3.Connection, chunk: int = 5_000) -> Iterator[list[Episode]]:
    """Every episode, a session at a time (in session and turn order), never all in memory."""
    last = ("", 0)
    while True:
        found = rows(conn.execute(
            f"SELECT {_COLUMNS} FROM episodes WHERE (session_id, turn) > (?, ?) ORDER BY session_id, turn LIMIT ?",
            (*last, chunk)), Episode)
        if not found:
            return
        whole = [e for e in found if e.session_id != found[-1].session_id] if len(found) == chunk else found
        if not whole:  # one session longer than a chunk: take it all
            whole = session_window(conn, found[0].session_id, 1, 1 << 62)
        yield from _sessions(whole)
        last = (whole[-1].session_id, whole[-1].turn)


def _sessions(episodes: Iterable[Episode]) -> Iterator[list[Episode]]:
    current: list[Episode] = []
    for e in episodes:
        if current and e.session_id != current[-1].session_id:
            yield current
            current = []
        current.append(e)
    if current:
        yield current


def context(window: Sequence[Episode], turn: int) -> str:
    """The neighbours of `turn` (NEIGHBOURS either side) within a session's episodes."""
    return "\n".join(e.text for e in window if e.turn != turn and abs(e.turn - turn) <= NEIGHBOURS)


def embed_text(previous: Episode | None, episode: Episode) -> str:
    """What the dense retriever embeds: the turn, after what the person said in the turn before it
    (an answer often follows its cue, a "she" names whom the turn before named; the agent's answer
    before it was mostly noise: measured on the dialogue benchmark, docs/benchmarks.md), the newest
    text kept when it must be cut. EMBED_RECIPE names this choice in the vectors' model name."""
    before = previous.persons_part.strip() if previous is not None else ""
    text = f"{before}\n{episode.text}" if before else episode.text
    return text[-EMBED_CHARS:]


def missing_vectors(conn: sqlite3.Connection, model: str, above: int, below: int, limit: int) -> list[Episode]:
    """Episodes with ids in (above, below) that have no vector from `model`, newest first."""
    return rows(conn.execute(
        "SELECT e.id, e.session_id, e.turn, e.at, e.text, e.answer_at FROM episodes e "
        "LEFT JOIN episode_vectors v ON v.id = e.id AND v.model = ? "
        "WHERE v.id IS NULL AND e.id > ? AND e.id < ? ORDER BY e.id DESC LIMIT ?",
        (model, above, below, limit)), Episode)


def previous(conn: sqlite3.Connection, episode: Episode) -> Episode | None:
    found = session_window(conn, episode.session_id, episode.turn - 1, episode.turn - 1)
    return found[0] if found else None


def put_vectors(conn: sqlite3.Connection, model: str, items: Sequence[tuple[int, bytes]]) -> None:
    with transaction(conn) as c:
        c.executemany("INSERT OR REPLACE INTO episode_vectors (id, model, vector) VALUES (?, ?, ?)",
                      [(item, model, blob) for item, blob in items])


def vectors(conn: sqlite3.Connection, model: str, after_id: int, limit: int) -> list[tuple[int, float, bytes]]:
    """(id, date, vector) of the episodes embedded by `model`, by id, a page at a time."""
    return [(int(r[0]), float(r[1]), bytes(r[2])) for r in conn.execute(
        "SELECT v.id, e.at, v.vector FROM episode_vectors v JOIN episodes e ON e.id = v.id "
        "WHERE v.model = ? AND v.id > ? ORDER BY v.id LIMIT ?", (model, after_id, limit))]


def count(conn: sqlite3.Connection, model: str | None) -> tuple[int, int]:
    """(episodes, episodes embedded by `model`)."""
    total = int(conn.execute("SELECT count(*) FROM episodes").fetchone()[0])
    if model is None:
        return total, 0
    return total, int(conn.execute("SELECT count(*) FROM episode_vectors WHERE model = ?", (model,)).fetchone()[0])
