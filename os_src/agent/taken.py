"""Which messages the agent has taken, by client id, so that none runs twice (pure code).

A user_message's `client_id` is its idempotency key. The runtime keeps the ids of the messages it
accepted (queued, running or done: taken), seeded at start from transcript.db's `turn_clients` and
`command_clients` through memory's port (the turns an earlier run recorded, and the commands its CLI ran
itself, which left no turn), and refuses a message whose id it holds
(`already_taken`). A message refused (queue_full, rate_limited, invalid, too large) never gets here, and
one a restart dropped from the queue was never recorded: their resend with the same id is taken.

Bounded: the newest TAKEN_LIMIT ids. An id older than those is not recognised (its message would run
again); so is one whose turn was never recorded (memory off, a turn interrupted before it was sent)
once the server restarts, and one whose turn was running at a power loss, or in its first 200 ms
(the journal's OPEN_GRACE) at a kill -9: until its close the id's only record is the open turn's
unsynced journal entry, and syncing it first would cost every turn a second fsync before its prompt
reaches the CLI (docs/protocol.md says why).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

TAKEN_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class Taken:
    """A message the agent took: the session and turn it ran as, where known."""

    client_id: str
    session_id: str | None = None
    turn_id: str | None = None


class TakenIds:
    """The newest `limit` client ids taken, each with where it ran."""

    def __init__(self, limit: int = TAKEN_LIMIT) -> None:
        self._limit = limit
        self._ids: OrderedDict[str, Taken] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ids)

    def seed(self, newest_first: Iterable[Taken]) -> None:
        """The ids a record holds, newest first: kept under those taken since (they are newer)."""
        sessions: dict[str, str] = {}  # one copy of each session's id, not one per message (a few MB at the bound)
        for taken in newest_first:
            if len(self._ids) >= self._limit:
                return
            if taken.client_id not in self._ids:
                session = sessions.setdefault(taken.session_id, taken.session_id) if taken.session_id else None
                self._ids[taken.client_id] = Taken(taken.client_id, session, taken.turn_id)
                self._ids.move_to_end(taken.client_id, last=False)

    def get(self, client_id: str) -> Taken | None:
        return self._ids.get(client_id)

    def add(self, taken: Taken) -> None:
        self._ids[taken.client_id] = taken
        self._ids.move_to_end(taken.client_id)
        while len(self._ids) > self._limit:
            self._ids.popitem(last=False)
