"""Episodes: every recorded turn, as recall searches it.

An episode is one observation rendered as text (the person's message, the tool calls that
say what was done, the agent's answer), with its session, its 1-based turn within the
session and its date. The rows live in memory.db's `episodes` table, derived from
transcript.db (which stays append-only) and rebuilt from it by `memory rebuild`.

Capture removes `<private>` text before a turn is stored; rendering removes it again, so
an imported or older row can never carry it into the index either.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence

import msgspec

from ...database import marks, rows, transaction
from ...text import clean_text, strip_private
from ..transcript_store import Observation
from .backlog import first_pass

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
    turn: int  # 1-based place within the session, by time (`add` sets it)
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


def wordless(obs: Observation) -> Episode:
    """The turn's episode without its words: a forget's, which takes them out (or will, at the next start)."""
    return Episode(obs.id, obs.session_id, obs.sequence_num, obs.timestamp, "")


# ---------------------------------------------------------------- memory.db's episodes table

_COLUMNS = "id, session_id, turn, at, text, answer_at"


def max_id(conn: sqlite3.Connection) -> int:
    return int(conn.execute("SELECT coalesce(max(id), 0) FROM episodes").fetchone()[0])


def add(conn: sqlite3.Connection, episodes: Sequence[Episode]) -> int:
    """Store episodes, each at its place in its session by time: its `turn` is 1 + the number of the
    session's episodes before it by (date, id). A turn that lands before others of its session (a past
    turn imported later) moves them down one. A known id is left as it is, but for where its answer
    begins, filled in if it was not known (a row from before). Returns how many were new."""
    if not episodes:
        return 0
    with transaction(conn) as c:
        known = {r for (r,) in c.execute(f"SELECT id FROM episodes WHERE id IN ({marks(episodes)})",
                                         [e.id for e in episodes])}
        fresh = sorted((e for e in episodes if e.id not in known), key=lambda e: (e.session_id, e.at, e.id))
        for session, group in itertools.groupby(fresh, key=lambda e: e.session_id):
            new = list(group)
            last = c.execute("SELECT turn, at, id FROM episodes WHERE session_id = ? ORDER BY at DESC, id DESC "
                             "LIMIT 1", (session,)).fetchone()
            after = last is None or (new[0].at, new[0].id) > (last[1], last[2])
            base = last[0] if last is not None else 0
            c.executemany(f"INSERT OR IGNORE INTO episodes ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
                          [(e.id, e.session_id, base + i + 1 if after else 0, e.at, e.text, e.answer_at)
                           for i, e in enumerate(new)])
            if not after:
                _keep_embedded_after(c, session)
                renumber(c, session)
                _embed_again_after(c, [e.id for e in new])
        c.executemany("UPDATE episodes SET answer_at = ? WHERE id = ? AND answer_at IS NULL",
                      [(e.answer_at, e.id) for e in episodes if e.id in known and e.answer_at is not None])
        return len(fresh)


def _keep_embedded_after(conn: sqlite3.Connection, session_id: str) -> None:
    """Before a session's turns move down for one landing between them: a vector from before (its
    `embedded_after` not known) was made after the turn then before it; say so, or a turn that lands
    between would be lent its place (turns_before)."""
    # The turns landing are in already, at turn 0 until the renumbering: not the turn before any.
    conn.execute("UPDATE episodes SET embedded_after = coalesce((SELECT p.id FROM episodes p WHERE "
                 "p.session_id = episodes.session_id AND p.turn = episodes.turn - 1 AND p.turn > 0), 0) "
                 "WHERE session_id = ? AND embedded_after IS NULL AND turn > 0", (session_id,))


def _embed_again_after(conn: sqlite3.Connection, ids: Sequence[int]) -> None:
    """The turn now just after each of `ids` (new turns that landed between others) was embedded after
    another turn: its vector is to be made again (`embed_again`), and lends nothing till then."""
    conn.execute("UPDATE episodes SET embedded_after = -1 WHERE id IN (SELECT n.id FROM episodes e JOIN episodes n "
                 "ON n.session_id = e.session_id AND n.turn = e.turn + 1 "
                 f"WHERE e.id IN ({marks(ids)}) AND n.id NOT IN ({marks(ids)}))", [*ids, *ids])


def embed_again(conn: sqlite3.Connection, limit: int) -> list[int]:
    """Turns whose vector was made after a turn that is no longer the one before them (_embed_again_after)."""
    return [r for (r,) in conn.execute("SELECT id FROM episodes WHERE embedded_after = -1 AND text != '' "
                                       "ORDER BY id DESC LIMIT ?", (limit,))]


def never_lend(conn: sqlite3.Connection, ids: Sequence[int]) -> None:
    """Vectors that could not be made again: they lend no turn their place (-2: no turn has that id)."""
    conn.execute(f"UPDATE episodes SET embedded_after = -2 WHERE id IN ({marks(ids)})", list(ids))


def renumber(conn: sqlite3.Connection, session_id: str) -> None:
    """Each of the session's episodes at its place by (date, id)."""
    conn.execute("UPDATE episodes SET turn = p.place FROM (SELECT id, row_number() OVER (ORDER BY at, id) AS place "
                 "FROM episodes WHERE session_id = ?) AS p WHERE episodes.id = p.id AND episodes.turn != p.place",
                 (session_id,))


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
    text kept when it must be cut. EMBED_RECIPE names this choice in the vectors' model name, so
    the store of another recipe's vectors is not searched (vectors.py)."""
    before = previous.persons_part.strip() if previous is not None else ""
    text = f"{before}\n{episode.text}" if before else episode.text
    return text[-EMBED_CHARS:]


def ids_between(conn: sqlite3.Connection, lo: int, hi: int, limit: int, skim_below: int = 0) -> list[int]:
    """Episode ids in [lo, hi], newest first, at most `limit`; at or below `skim_below`, only the turns of a
    backlog's first pass (backlog.first_pass)."""
    # The rule is backlog.first_pass itself, which SQLite calls for each turn below `skim_below`: no copy of
    # it in SQL to drift apart. It costs ~1.5x the SQL's CPU for a scan (~3 ms more for SCAN ids among 60,000
    # turns), beside the seconds its batch then takes to embed.
    conn.create_function("first_pass", 2, first_pass, deterministic=True)
    return [r for (r,) in conn.execute(
        "SELECT id FROM episodes e WHERE id BETWEEN ? AND ? AND (id > ? OR first_pass(turn, (SELECT max(turn) "
        "FROM episodes s WHERE s.session_id = e.session_id))) ORDER BY id DESC LIMIT ?",
        (lo, hi, skim_below, limit))]


def texts_to_embed(conn: sqlite3.Connection, ids: Sequence[int]
                   ) -> tuple[list[tuple[int, float, str]], list[tuple[int, int]]]:
    """(id, date, text to embed) of the episodes `ids`, in that order; a forgotten turn's (no text) is left
    out. With each, the turn it is embedded after, read in this same call (a turn that lands between later
    does not change what the vector holds): record_embedded_after, once the vectors are stored."""
    found = get(conn, ids)
    out, after = [], []
    for i in ids:
        if (e := found.get(i)) is not None and e.text:
            before = previous(conn, e)
            out.append((e.id, e.at, embed_text(before, e)))
            after.append((before.id if before is not None else 0, e.id))
    return out, after


def record_embedded_after(conn: sqlite3.Connection, after: Sequence[tuple[int, int]]) -> None:
    """Which turn each episode's stored vector was made after (turns_before): said once the vector holds
    those words, never before (a search would lend the old vector to the new turn; a stop between would
    leave it so for good)."""
    if after:
        with transaction(conn) as c:
            c.executemany("UPDATE episodes SET embedded_after = ? WHERE id = ?", after)


def carry_embedded_after(conn: sqlite3.Connection, made_after: Sequence[tuple[int, int]]) -> None:
    """What a memory.db made again (a full rebuild) is told of the vectors it keeps, from the memory.db
    before it (`made_after`: each turn's id and its `embedded_after` there), once all its turns are in:
    a vector made after the turn now before it says so; any other (made after another turn, or to be
    made again, or one that could not be) is to be made again (-1), lending nothing till then. What the
    rebuild's own adds guessed meanwhile (a turn landing between, in a later page of the transcript) is
    replaced: the memory.db before it knew which words each vector holds."""
    if made_after:
        with transaction(conn) as c:
            c.executemany(
                "UPDATE episodes SET embedded_after = CASE WHEN ?1 >= 0 AND ?1 = coalesce((SELECT p.id FROM episodes p "
                "WHERE p.session_id = episodes.session_id AND p.turn = episodes.turn - 1), 0) THEN ?1 ELSE -1 END "
                "WHERE id = ?2", [(after, i) for i, after in made_after])


def make_every_vector_again(conn: sqlite3.Connection) -> None:
    """Every turn's vector is to be made again (-1), lending nothing till then: a full rebuild that could
    not learn which turn each kept vector was made after (carry_embedded_after)."""
    with transaction(conn) as c:
        c.execute("UPDATE episodes SET embedded_after = -1")


def turns_before(conn: sqlite3.Connection, ids: Sequence[int], recorded: bool = True) -> dict[int, tuple[int, float]]:
    """For each of `ids`, the turn just before it in its session (its id and date), if it has text and the
    vector of the turn in `ids` was made after it (holds its words: embed_text). `recorded`: memory.db
    says which turn each vector was made after (a read-only connection to a database not migrated yet
    does not: a `memory search` in a shell before the server's first start on this version)."""
    if not ids:
        return {}
    made_after = "AND coalesce(e.embedded_after, p.id) = p.id" if recorded else ""
    return {int(r[0]): (int(r[1]), float(r[2])) for r in conn.execute(
        "SELECT e.id, p.id, p.at FROM episodes e JOIN episodes p ON p.session_id = e.session_id "
        f"AND p.turn = e.turn - 1 WHERE e.id IN ({marks(ids)}) AND p.text != '' {made_after}", list(ids))}


def records_embedded_after(conn: sqlite3.Connection) -> bool:
    """Does memory.db say which turn each vector was made after (schema 8 on)?"""
    return any(r[1] == "embedded_after" for r in conn.execute("PRAGMA table_info(episodes)"))


def turns_after(conn: sqlite3.Connection, ids: Sequence[int]) -> list[int]:
    """The turn just after each of `ids` in its session, when it has text (its vector holds what the
    person said in the turn before it: embed_text)."""
    if not ids:
        return []
    return sorted({int(r[0]) for r in conn.execute(
        "SELECT n.id FROM episodes e JOIN episodes n ON n.session_id = e.session_id AND n.turn = e.turn + 1 "
        f"WHERE e.id IN ({marks(ids)}) AND n.text != ''", list(ids))})


def forgotten_ids(conn: sqlite3.Connection) -> list[int]:
    """The episodes of turns a person forgot (their text is gone)."""
    return [r for (r,) in conn.execute("SELECT id FROM episodes WHERE text = '' ORDER BY id")]


def previous(conn: sqlite3.Connection, episode: Episode) -> Episode | None:
    found = session_window(conn, episode.session_id, episode.turn - 1, episode.turn - 1)
    return found[0] if found else None


def legacy_vectors(conn: sqlite3.Connection, model: str, limit: int) -> list[tuple[int, float, bytes]]:
    """(id, date, float32 vector) of vectors still in memory.db's `episode_vectors` (where they were
    kept before .os/memory/vectors/), a page at a time; `drop_legacy` takes them out once moved."""
    return [(int(r[0]), float(r[1]), bytes(r[2])) for r in conn.execute(
        "SELECT v.id, e.at, v.vector FROM episode_vectors v JOIN episodes e ON e.id = v.id "
        "WHERE v.model = ? ORDER BY v.id LIMIT ?", (model, limit))]


def drop_legacy(conn: sqlite3.Connection, model: str, through: int | None) -> None:
    """Take moved vectors out of `episode_vectors` (through an id, or all of them, those of other models
    and of episodes gone included, when `through` is None)."""
    if through is None:
        conn.execute("DELETE FROM episode_vectors")
    else:
        conn.execute("DELETE FROM episode_vectors WHERE model = ? AND id <= ?", (model, through))


def count(conn: sqlite3.Connection) -> int:
    """How many episodes there are."""
    return int(conn.execute("SELECT count(*) FROM episodes").fetchone()[0])
