"""What the ranked memories show, and which of them show: memory.db read once for all of them,
then three rules, each a pure function of what was found.

- **One memory, one hit.** A learning and the turn it came from, both found, are one hit: the
  learning, at the better of their two places, with the person's words from that turn.
- **No echo.** An answer that repeats a memory is not a memory: a turn found only through the
  agent's words, when an older memory found beside it holds those words, is left out (the
  agent's "Your name is Dana." does not come back beside "The user's name is Dana.").
- **Facts that change.** A learning a correction replaced sits just below that correction (which
  is brought in if the search did not find it), and the correction says "was: ... until <date>".

Forgotten learnings, and rows gone since the index was written, are dropped here.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, replace

import msgspec

from ...database import marks
from .. import corrections
from ..memory_store import HELD_TURNS, held_back
from . import episodes as ep
from .learnings import stems
from .ranking import Candidate, Keyed

SNIPPET_CHARS = 240
LEARNING_SNIPPET_CHARS = 600  # a learning is short: shown whole up to this
SAID_CHARS = 160  # of the person's words, shown with the learning made from them


class RecallHit(msgspec.Struct, frozen=True):
    kind: str  # episode | learning
    id: int  # an episode's observation id, or a learning's id
    score: float  # higher is better (fused: reciprocal-rank; lexical only: BM25)
    at: float  # the turn's date, or when the learning was made
    session_id: str | None  # the episode's session, or the session the learning came from
    turn: int | None  # 1-based turn within that session (for a learning, the turn it came from)
    observation_id: int | None  # the turn in transcript.db
    type: str  # EPISODE, or the learning's type (FACT, CORRECTION, SUMMARY...)
    snippet: str
    bm25: float | None = None
    cosine: float | None = None
    replaced: bool = False  # a learning a correction replaced (auto-recall never sends it)


@dataclass(frozen=True)
class Found:
    """A ranked memory with what memory.db holds of it."""

    candidate: Candidate
    session_id: str | None
    turn: int | None
    observation_id: int | None
    type: str
    text: str  # the whole episode, or the learning
    persons: str  # an episode's person's part (the whole text when not known); a learning's text
    agents: str  # an episode's answer, when known to be apart
    replaced_by: int | None = None


def snippet(text: str, words: Sequence[str], width: int = SNIPPET_CHARS) -> str:
    """About `width` characters of `text` around its first matching word, on one line."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    lower = flat.lower()
    at = min((i for w in words if (i := lower.find(w[:5])) >= 0), default=0)
    start = max(0, at - width // 3)
    piece = flat[start:start + width]
    return ("…" if start else "") + piece + ("…" if start + width < len(flat) else "")


# ---------------------------------------------------------------- the rules (pure)


def fold_sources(found: Sequence[Found]) -> list[Found]:
    """A learning and the episode it came from, both found: the learning, at the better place,
    carrying the person's words of that turn (the best-ranked learning from a turn; others from it
    stay as they are). A session's summary names its last turn but was not learned from it: it
    folds nothing, whichever of the two ranks first."""
    learned: dict[int, Found] = {}
    for f in found:
        if f.candidate.kind == "learning" and f.observation_id is not None and f.type != "SUMMARY":
            learned.setdefault(f.observation_id, f)
    folded = {f.candidate.id: f for f in found if f.candidate.kind == "episode" and f.candidate.id in learned}
    out: list[Found] = []
    seen: set[tuple[str, int]] = set()
    for f in found:
        if f.candidate.kind == "episode" and f.candidate.id in folded:
            f = learned[f.candidate.id]  # the learning takes its turn's place, if that was better
        if (f.candidate.kind, f.candidate.id) in seen:
            continue
        seen.add((f.candidate.kind, f.candidate.id))
        src = folded.get(f.observation_id or -1) if f.candidate.kind == "learning" else None
        if src is not None and learned[src.candidate.id] is f:
            f = replace(f, text=f"{f.text} (said: {snippet(src.persons, [], SAID_CHARS)})")
        out.append(f)
    return out


def drop_echoes(found: Sequence[Found], words: Sequence[str], said: dict[str, set[str]] | None = None
                ) -> list[Found]:
    """Leave out a turn found only through the agent's words when an older memory found beside it
    holds those words and the answer says more of what that memory's person said than the question's
    words: the answer repeated a memory ("Your name is Dana." after "My name is Dana"). A common word the
    question used ("dinner", "go") shared with an unrelated older turn is no repeat: the answer is then
    the only place the turn tells of, and it stays. `said`: each text's stems, kept between calls of
    one search."""
    asked = {w[:5] for w in words}
    said = {} if said is None else said  # each text's stems, worked out once

    def stems_of(text: str) -> set[str]:
        if (known := said.get(text)) is None:
            known = said[text] = stems(text)
        return known

    out = []
    for f in found:
        if f.candidate.kind == "episode" and f.agents:
            by_agent = (asked & stems_of(f.agents)) - stems_of(f.persons)
            if by_agent and not asked & stems_of(f.persons) and any(
                    o.candidate.at < f.candidate.at and by_agent <= stems_of(o.text)
                    and (stems_of(f.agents) & stems_of(o.persons)) - asked for o in found if o is not f):
                continue
        out.append(f)
    return out


def below_corrections(found: Sequence[Found], corrections_of: dict[int, Found]) -> list[Found]:
    """A learning a correction replaced goes just below the correction: the one found, or else the one
    in `corrections_of` (by the replaced learning's id), brought in at its place."""
    out = [f for f in found if not (f.candidate.kind == "learning" and f.replaced_by is not None)]
    for f in found:
        if f.candidate.kind != "learning" or f.replaced_by is None:
            continue
        at = next((i for i, o in enumerate(out) if o.candidate.kind == "learning"
                   and o.candidate.id == f.replaced_by), None)
        if at is None and (fix := corrections_of.get(f.candidate.id)) is not None:
            at = _place_of(out, found, f)
            out.insert(at, replace(fix, candidate=replace(fix.candidate, score=f.candidate.score)))
        out.insert(_place_of(out, found, f) if at is None else at + 1, f)  # its correction gone: its own place
    return out


def _place_of(out: Sequence[Found], found: Sequence[Found], f: Found) -> int:
    """Where `f` would sit in `out`: after what ranked above it."""
    above = {(o.candidate.kind, o.candidate.id) for o in found[:found.index(f)]}
    return sum(1 for o in out if (o.candidate.kind, o.candidate.id) in above)


# ---------------------------------------------------------------- memory.db


class Rows:
    """What memory.db holds of the memories one search looks at, each row read once: the words that
    weigh them (`memory_texts`) and what hydration shows (`shown`) are read from the same rows. One
    search's, never kept longer: a forget between two searches is seen by the next. A forget during the
    search, after its weighing read a row (the search then waits for the query's embedding and the scan),
    is seen by hydration: `recheck` asks memory.db again, in one indexed query, which of them are forgotten.
    What a forget job holds back (memory_store.held_back, HELD_TURNS) is not held: memory.db may hold its words
    still, the forget cut short."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._episodes: dict[int, ep.Episode | None] = {}
        self._learnings: dict[int, tuple[Found, bool] | None] = {}  # the row, and whether it is forgotten
        self._held_turns: set[int] | None = None  # read with the first episodes

    def episodes(self, ids: Sequence[int]) -> dict[int, ep.Episode]:
        """The episodes among `ids` memory.db holds (a forgotten one too: its text is empty)."""
        if missing := [i for i in dict.fromkeys(ids) if i not in self._episodes]:
            got = ep.get(self.conn, missing)
            if self._held_turns is None:
                self._held_turns = {i for (i,) in self.conn.execute(HELD_TURNS)}
            held = self._held_turns
            self._episodes.update((i, None if i in held else got.get(i)) for i in missing)
        return {i: e for i in ids if (e := self._episodes[i]) is not None}

    def recheck(self) -> None:
        """Forget what was forgotten since its row was read: a turn's text emptied, a learning marked."""
        episodes = [i for i, e in self._episodes.items() if e is not None and e.text]
        learnings = [i for i, row in self._learnings.items() if row is not None and not row[1]]
        if not episodes and not learnings:
            return
        for kind, i in self.conn.execute(
                f"SELECT 0, id FROM episodes WHERE id IN ({marks(episodes)}) AND text = '' UNION ALL "
                f"SELECT 1, id FROM learnings WHERE id IN ({marks(learnings)}) AND forgotten_at IS NOT NULL",
                [*episodes, *learnings]):
            if kind and (row := self._learnings[i]) is not None:
                self._learnings[i] = (row[0], True)
            elif not kind:
                self._episodes[i] = None  # gone from what hydration shows, as a forgotten turn is

    def learnings(self, ids: Sequence[int], forgotten: bool = False) -> dict[int, Found]:
        """The learnings among `ids` memory.db holds, as memories (their candidate a placeholder), the
        forgotten ones only if `forgotten`."""
        if missing := [i for i in dict.fromkeys(ids) if i not in self._learnings]:
            got = {r[0]: (Found(Candidate("learning", r[0], 0.0, r[7]), r[1] or r[5], r[6], r[2], r[3], r[4], r[4],
                                ""), bool(r[8]))
                   for r in self.conn.execute(
                       "SELECT l.id, l.session_id, l.source_observation_id, l.type, l.content, e.session_id, e.turn, "
                       "l.created_at, l.forgotten_at IS NOT NULL FROM learnings l "
                       f"LEFT JOIN episodes e ON e.id = l.source_observation_id WHERE l.id IN ({marks(missing)}) "
                       f"AND NOT {held_back('l')}", missing)}
            self._learnings.update((i, got.get(i)) for i in missing)
        return {i: row[0] for i in ids if (row := self._learnings[i]) is not None and (forgotten or not row[1])}


def read(rows: Rows, ranked: Sequence[Candidate]) -> list[Found]:
    """What memory.db holds of each ranked memory, in order; forgotten (a turn's text is gone, a learning
    is marked) and vanished ones dropped."""
    episode_ids = [c.id for c in ranked if c.kind == "episode"]
    learning_ids = [c.id for c in ranked if c.kind == "learning"]
    episodes = rows.episodes(episode_ids)
    learnings = rows.learnings(learning_ids)
    replaced = corrections.replacements(rows.conn, learning_ids)
    out = []
    for c in ranked:
        if c.kind == "episode" and (e := episodes.get(c.id)) is not None and e.text:  # no text: forgotten
            out.append(Found(c, e.session_id, e.turn, e.id, "EPISODE", e.text, e.persons_part, e.agents_part))
        elif c.kind == "learning" and (row := learnings.get(c.id)) is not None:
            out.append(replace(row, candidate=c, replaced_by=replaced.get(c.id)))
    return out


def _corrections_of(rows: Rows, found: Sequence[Found]) -> dict[int, Found]:
    """The correction of each replaced learning found, as a memory of its own."""
    wanted = {f.candidate.id: f.replaced_by for f in found if f.replaced_by is not None}
    got = rows.learnings(sorted({c for c in wanted.values() if c is not None}))
    return {old: got[new] for old, new in wanted.items() if new is not None and new in got}


@dataclass(frozen=True)
class Said:
    text: str  # what the person said in an episode (its whole text when not known apart); a learning
    place: tuple[str, int] | None  # an episode's session and turn


def memory_texts(conn: sqlite3.Connection | Rows, ranked: Sequence[Keyed]) -> dict[tuple[str, int], Said]:
    """What each ranked memory says (an episode: the person's part, not the agent's answer), and
    where an episode sits in its session; read through a search's `Rows`, if given."""
    rows = conn if isinstance(conn, Rows) else Rows(conn)
    episode_ids = [c.id for c in ranked if c.kind == "episode"]
    learning_ids = [c.id for c in ranked if c.kind == "learning"]
    out = {("episode", e.id): Said(e.persons_part, (e.session_id, e.turn))
           for e in rows.episodes(episode_ids).values()}
    if learning_ids:
        out.update({("learning", i): Said(f.text, None)
                    for i, f in rows.learnings(learning_ids, forgotten=True).items()})
    return out


def shown(conn: sqlite3.Connection | Rows, ranked: Sequence[Candidate], words: Sequence[str],
          said: dict[str, set[str]] | None = None) -> list[RecallHit]:
    """The ranked memories as hits, after the three rules (`said`: as drop_echoes); read through a
    search's `Rows`, if given (the search re-checks them for a forget first: Rows.recheck)."""
    rows = conn if isinstance(conn, Rows) else Rows(conn)
    found = read(rows, ranked)
    found = below_corrections(fold_sources(drop_echoes(found, words, said)), _corrections_of(rows, found))
    was = corrections.replaced_learnings(rows.conn, [f.candidate.id for f in found if f.type == "CORRECTION"
                                                     and f.candidate.kind == "learning"])
    return [_hit(f, words, was) for f in found]


def _hit(f: Found, words: Sequence[str], was: dict[int, tuple[str, float]]) -> RecallHit:
    c = f.candidate
    if c.kind == "episode":
        text = snippet(f.text, words)
    else:
        text = snippet(f.text, words, LEARNING_SNIPPET_CHARS)
        if (old := was.get(c.id)) is not None:
            text += " " + corrections.was(*old)
        elif f.replaced_by is not None:
            text += " (replaced by the correction above)"
    return RecallHit(c.kind, c.id, c.score, c.at, f.session_id, f.turn, f.observation_id, f.type, text, c.bm25,
                     c.cosine, f.replaced_by is not None)
