"""What goes into the recall index: turns made episodes, newest first, with the documents of the
turns around them whose context they change; learnings; and a whole index at once.

Synchronous functions on memory.db's connection (and transcript.db's, for the turns); the
server runs them on those databases' threads (memory/recall/indexer.py), `memory rebuild`
and `memory import` directly. What the index holds is kept in memory.db's `meta`
(MARKS_KEY): the turn ids taken, as ranges (memory/recall/backlog.py), and the last
learning. Indexing is idempotent (a document is replaced whole), so a crash between a
commit and its marks only means some documents are written again.
"""

from __future__ import annotations

import itertools
import sqlite3
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import tantivy

from ...database import marks
from ..transcript_store import Observation, TranscriptDB
from . import episodes as ep
from .backlog import Range, highest_gap, mark, normalise, unseen
from .index import RecallIndex, doc_id, episode_doc, learning_doc

MARKS_KEY = "recall_index"
CHUNK = 2_000  # turns a step takes, at most: a long catch-up commits about once a second
Progress = Callable[[str, int, int], None]  # (what, done, of)


class Marks(msgspec.Struct):
    """What the index holds: the turn ids it has taken (ranges, walked newest first) and every learning
    up to `learnings`."""

    episodes: int = 0  # before ranges, marks said: every turn up to this id (read, never written again)
    learnings: int = 0
    turns: list[tuple[int, int]] = msgspec.field(default_factory=list)

    def seen(self) -> list[Range]:
        return normalise([*self.turns, *([(1, self.episodes)] if self.episodes else [])])

    def with_turns(self, lo: int, hi: int) -> Marks:
        return Marks(0, self.learnings, mark(self.seen(), lo, hi))


def read_marks(conn: sqlite3.Connection) -> Marks:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (MARKS_KEY,)).fetchone()
    try:
        return msgspec.json.decode(row[0], type=Marks) if row else Marks()
    except (msgspec.DecodeError, msgspec.ValidationError):
        return Marks()


def write_marks(conn: sqlite3.Connection, value: Marks) -> None:
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                 (MARKS_KEY, msgspec.json.encode(value).decode()))


@dataclass
class Staged:
    """Documents to write in one commit, the ids they replace, and the marks once they are in."""

    docs: list[tantivy.Document]
    replace: list[int]
    marks: Marks
    added: int = 0  # episodes new to memory.db


def episode_docs(conn: sqlite3.Connection, ids: Sequence[int]) -> tuple[list[tantivy.Document], list[int]]:
    """Documents for the episodes `ids` and for the turns around them whose context they join (their
    places read now: a turn that landed before others of its session moved them)."""
    docs, out = [], []
    found = sorted(ep.get(conn, ids).values(), key=lambda e: (e.session_id, e.turn))
    for session, group in itertools.groupby(found, key=lambda e: e.session_id):
        turns = [e.turn for e in group]
        first, last = min(turns) - ep.NEIGHBOURS, max(turns) + ep.NEIGHBOURS
        window = ep.session_window(conn, session, first - ep.NEIGHBOURS, last + ep.NEIGHBOURS)
        for e in window:
            if first <= e.turn <= last:
                out.append(e.id)
                if e.text:  # a forgotten turn's episode has no text: its document goes, none comes
                    docs.append(episode_doc(e.id, e.at, e.text, ep.context(window, e.turn)))
    return docs, out


def next_turns(transcript: TranscriptDB, marks: Marks, limit: int = CHUNK) -> tuple[list[Observation], Range] | None:
    """The newest turns the index has not taken (at most `limit`), and the id range they close, or None
    when it has them all. A turn recorded since the walk began comes first."""
    gap = highest_gap(marks.seen(), transcript.max_id())
    if gap is None:
        return None
    found = transcript.between(gap[0], gap[1], limit)
    return found, (found[-1].id if len(found) == limit else gap[0], gap[1])


def stage_turns(conn: sqlite3.Connection, observations: Sequence[Observation], taken: Range, base: Marks) -> Staged:
    """Episodes for the turns, and the documents to write for them; `base` is what the index holds now."""
    added = ep.add(conn, [ep.from_observation(o) for o in observations])
    docs, ids = episode_docs(conn, [o.id for o in observations])
    return Staged(docs, ids, base.with_turns(*taken), added)


def stage_learnings(conn: sqlite3.Connection, at: Marks, limit: int = CHUNK) -> Staged | None:
    """The next learnings the index lacks (it holds `at`), or None when it has them all."""
    learned = conn.execute("SELECT id, created_at, content, forgotten_at FROM learnings WHERE id > ? ORDER BY id "
                           "LIMIT ?", (at.learnings, limit)).fetchall()
    if not learned:
        return None
    docs = [learning_doc(lid, created, content) for lid, created, content, forgotten in learned if forgotten is None]
    return Staged(docs, [doc_id("learning", r[0]) for r in learned],
                  Marks(0, learned[-1][0], at.seen()))


def forgotten(conn: sqlite3.Connection, episode_ids: Sequence[int], learning_ids: Sequence[int]) -> Staged:
    """Turns a person forgot (their episodes have no text now) and the learnings deleted with them:
    their documents go, and their neighbours' come back with a context that no longer holds them."""
    docs, ids = episode_docs(conn, episode_ids)
    return Staged(docs, [*ids, *(doc_id("learning", i) for i in learning_ids)], read_marks(conn))


def learning_changes(conn: sqlite3.Connection, ids: Sequence[int]) -> Staged:
    """Learnings forgotten (their documents go) or remembered again (they come back)."""
    at = read_marks(conn)  # a learning past the marks is indexed when its turn comes
    docs = [learning_doc(lid, created, content) for lid, created, content in conn.execute(
        f"SELECT id, created_at, content FROM learnings WHERE id IN ({marks(ids)}) AND forgotten_at IS NULL "
        "AND id <= ?", [*ids, at.learnings])]
    return Staged(docs, [doc_id("learning", i) for i in ids], at)


def catch_up(transcript: TranscriptDB, conn: sqlite3.Connection, index: RecallIndex,
             progress: Progress | None = None, commit_docs: int = 20_000) -> int:
    """Bring the index up to date here, newest turns first (the caller is the writer: `memory import`
    with no server running). Returns how many turns it took."""
    held = read_marks(conn)
    taken, pending, total = 0, 0, unseen(held.seen(), transcript.max_id())
    while True:
        step = next_turns(transcript, held)
        staged = stage_turns(conn, *step, held) if step else stage_learnings(conn, held)
        if staged is not None:
            index.put(staged.docs, staged.replace)
            held, pending, taken = staged.marks, pending + len(staged.docs), taken + (len(step[0]) if step else 0)
        if (pending and (staged is None or pending >= commit_docs)) or staged is None:
            index.commit()
            write_marks(conn, held)
            pending = 0
            if progress:
                progress("indexed turns", min(taken, total), total)
        if staged is None:
            return taken


def build(conn: sqlite3.Connection, path: Path, progress: Progress | None = None) -> Marks:
    """A whole new index at `path` from memory.db: every episode, with its neighbours, and every
    learning not forgotten. Returns the marks it reached (write them once the index is in place)."""
    index = RecallIndex(path, writable=True)
    try:
        top_turn = ep.max_id(conn)
        top = fill(conn, index, [(1, top_turn)] if top_turn else [], progress)
        index.commit()
        return top
    finally:
        index.close()


def rewrite(conn: sqlite3.Connection, index: RecallIndex) -> Marks:
    """The index written anew in place, from memory.db, and the files of its old segments deleted:
    after a person forgot turns, no segment on disk keeps their words (a deletion alone only marks
    them). Readers see the old index until the commit. Returns the marks it reached."""
    index.clear()
    held = read_marks(conn)  # what it held, read before its episodes and learnings: each has one
    top = fill(conn, index, held.seen(), learnings=held.learnings)
    index.commit()
    index.collect_garbage()
    return top


def fill(conn: sqlite3.Connection, index: RecallIndex, turns: Sequence[Range],
         progress: Progress | None = None, learnings: int | None = None) -> Marks:
    """Every episode with text, with its neighbours, and every learning not forgotten (up to the id
    `learnings`, when given), into `index`. Returns the marks it reached: the turns taken (`turns`,
    whose episodes memory.db holds: an episode is stored before its turn is marked taken) and the
    last learning. A rewrite passes the learnings the index held: a newer one is the indexer's to
    take, which tells auto-recall's reach that a learning can be found (reach.py)."""
    if learnings is None:
        learnings = int(conn.execute("SELECT coalesce(max(id), 0) FROM learnings").fetchone()[0])
    top = Marks(0, learnings, list(turns))
    total, done, last_report = ep.count(conn), 0, time.monotonic()
    for session in ep.by_session(conn):
        index.put(episode_doc(e.id, e.at, e.text, ep.context(session, e.turn)) for e in session if e.text)
        done += len(session)
        if progress and time.monotonic() - last_report > 2:
            progress("indexed turns", done, total)
            last_report = time.monotonic()
    if progress:
        progress("indexed turns", done, total)
    learned = conn.execute("SELECT id, created_at, content FROM learnings WHERE forgotten_at IS NULL "
                           "AND id <= ?", (top.learnings,))
    index.put(learning_doc(lid, created, content) for lid, created, content in learned)
    return top
