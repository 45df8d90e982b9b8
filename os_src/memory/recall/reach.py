"""Whether a search could find anything outside one session, known on the event loop.

Auto-recall never returns the current session's own turns (the agent has them), so in a first
session with nothing learned it can find nothing, yet its search went to the recall thread and
back before every message (0.5-2 ms of the turn, by the machine's load: docs/benchmarks.md).
The indexer keeps this: every turn it takes, by its session, before the turn's episode exists,
and every learning it indexes; a start reads memory.db. It only grows: "something" may be wrong (a forget emptied
memory), and costs one search that finds nothing; "nothing" never is.

`Reach` is pure, no I/O: the indexer tells it what it takes. `sessions_and_learnings` is not: its
SQL reads memory.db, once, at a start.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field

KEPT = 2  # sessions remembered: with two known, every session has another


@dataclass
class Reach:
    known: bool = False  # memory.db read yet; until then, anything may be there
    learnings: bool = False  # a learning is (or was) searchable
    sessions: set[str] = field(default_factory=set)  # sessions with turns, at most KEPT of them

    def load(self, sessions: Iterable[str], learnings: bool) -> None:
        self.turns(sessions)
        self.learnings = self.learnings or learnings
        self.known = True

    def turns(self, sessions: Iterable[str]) -> None:
        """Turns of these sessions are (about to be) searchable."""
        for session in sessions:
            if len(self.sessions) >= KEPT:
                return
            self.sessions.add(session)

    def learned(self) -> None:
        self.learnings = True

    def beyond(self, session_id: str) -> bool:
        """Could a search find anything outside `session_id`?"""
        return not self.known or self.learnings or bool(self.sessions - {session_id})


def sessions_and_learnings(conn: sqlite3.Connection) -> tuple[list[str], bool]:
    """Two of memory.db's sessions with turns, if it has two (the first and last by id: two lookups
    in the index on session_id), and whether it holds a learning not forgotten."""
    first, last = conn.execute(
        "SELECT (SELECT min(session_id) FROM episodes), (SELECT max(session_id) FROM episodes)").fetchone()
    sessions = [s for s in {first, last} if s is not None]
    learned = conn.execute("SELECT EXISTS (SELECT 1 FROM learnings WHERE forgotten_at IS NULL)").fetchone()[0]
    return sessions, bool(learned)
