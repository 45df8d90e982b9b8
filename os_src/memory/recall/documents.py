"""What goes into the recall index, read from memory.db: the documents of new episodes (and of
the earlier turns whose context they change), of learnings, and a whole index at once.

Synchronous functions on a memory.db connection; the server runs them on the memory
thread (memory/recall/indexer.py), `memory rebuild` directly. How far the index has got is kept in
memory.db's `meta` (MARKS_KEY); indexing is idempotent (a document is replaced whole), so
a crash between a commit and its marks only means some documents are written again.
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
from . import episodes as ep
from .index import RecallIndex, doc_id, episode_doc, learning_doc

MARKS_KEY = "recall_index"
CHUNK = 2_000  # episodes a commit takes, at most: a long catch-up commits once a second
Progress = Callable[[str, int, int], None]  # (what, done, of)


class Marks(msgspec.Struct):
    """The last episode and learning ids the index holds (every earlier one is in it too)."""

    episodes: int = 0
    learnings: int = 0


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
    """Documents to write in one commit, and the ids they replace."""

    docs: list[tantivy.Document]
    replace: list[int]
    episodes_through: int
    learnings_through: int


def episode_docs(conn: sqlite3.Connection, new: Sequence[ep.Episode]) -> tuple[list[tantivy.Document], list[int]]:
    """Documents for `new` episodes and for the turns before them whose context they join."""
    docs, ids = [], []
    for session, group in itertools.groupby(sorted(new, key=lambda e: (e.session_id, e.turn)),
                                            key=lambda e: e.session_id):
        turns = [e.turn for e in group]
        first, last = min(turns) - ep.NEIGHBOURS, max(turns) + ep.NEIGHBOURS
        window = ep.session_window(conn, session, first - ep.NEIGHBOURS, last + ep.NEIGHBOURS)
        for e in window:
            if first <= e.turn <= last:
                ids.append(e.id)
                if e.text:  # a forgotten turn's episode has no text: its document goes, none comes
                    docs.append(episode_doc(e.id, e.at, e.text, ep.context(window, e.turn)))
    return docs, ids


def stage(conn: sqlite3.Connection, limit: int = CHUNK) -> Staged | None:
    """The next documents the index lacks (episodes, then learnings), or None when it is current."""
    at = read_marks(conn)
    new = ep.after(conn, at.episodes, limit)
    docs, ids = episode_docs(conn, new)
    learned = conn.execute("SELECT id, created_at, content, forgotten_at FROM learnings WHERE id > ? ORDER BY id "
                           "LIMIT ?", (at.learnings, limit)).fetchall()
    for lid, created, content, forgotten in learned:
        ids.append(doc_id("learning", lid))
        if forgotten is None:
            docs.append(learning_doc(lid, created, content))
    if not new and not learned:
        return None
    return Staged(docs, ids, new[-1].id if new else at.episodes, learned[-1][0] if learned else at.learnings)


def forgotten(conn: sqlite3.Connection, episode_ids: Sequence[int], learning_ids: Sequence[int]) -> Staged:
    """Turns a person forgot (their episodes have no text now) and the learnings deleted with them:
    their documents go, and their neighbours' come back with a context that no longer holds them."""
    at = read_marks(conn)
    docs, ids = episode_docs(conn, list(ep.get(conn, episode_ids).values()))
    return Staged(docs, [*ids, *(doc_id("learning", i) for i in learning_ids)], at.episodes, at.learnings)


def learning_changes(conn: sqlite3.Connection, ids: Sequence[int]) -> Staged:
    """Learnings forgotten (their documents go) or remembered again (they come back)."""
    at = read_marks(conn)  # a learning past the marks is indexed when its turn comes
    docs = [learning_doc(lid, created, content) for lid, created, content in conn.execute(
        f"SELECT id, created_at, content FROM learnings WHERE id IN ({marks(ids)}) AND forgotten_at IS NULL "
        "AND id <= ?", [*ids, at.learnings])]
    return Staged(docs, [doc_id("learning", i) for i in ids], at.episodes, at.learnings)


def build(conn: sqlite3.Connection, path: Path, progress: Progress | None = None) -> Marks:
    """A whole new index at `path` from memory.db: every episode, with its neighbours, and every
    learning not forgotten. Returns the marks it reached (write them once the index is in place)."""
    index = RecallIndex(path, writable=True)
    try:
        top = fill(conn, index, progress)
        index.commit()
        return top
    finally:
        index.close()


def rewrite(conn: sqlite3.Connection, index: RecallIndex) -> Marks:
    """The index written anew in place, from memory.db, and the files of its old segments deleted:
    after a person forgot turns, no segment on disk keeps their words (a deletion alone only marks
    them). Readers see the old index until the commit. Returns the marks it reached."""
    index.clear()
    top = fill(conn, index)
    index.commit()
    index.collect_garbage()
    return top


def fill(conn: sqlite3.Connection, index: RecallIndex, progress: Progress | None = None) -> Marks:
    """Every episode with text, with its neighbours, and every learning not forgotten, into `index`."""
    top = Marks(ep.max_id(conn), int(conn.execute("SELECT coalesce(max(id), 0) FROM learnings").fetchone()[0]))
    total, done, last_report = ep.count(conn, None)[0], 0, time.monotonic()
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
