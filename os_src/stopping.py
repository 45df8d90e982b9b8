"""A stop's one deadline: the time SIGTERM leaves before the service manager's SIGKILL, shared
among the stop's stages so that memory's flush always gets its share; and the stop's account
(STOP_REPORT): which of memory's steps did not finish, and how `service stop` says each.

`sprite-os service stop` (commands/service.py) SIGKILLs the server's whole session STOP_TIMEOUT
seconds after its SIGTERM. A stop's stages, in order (server.py's `stop`), and the most each may
take, in seconds at that timeout:

    the running turn ends (the CLI interrupted)           TURN_GRACE     30   the requests in flight
    the CLI's disconnect, else it is killed                CLI_END         8   end beside them
    clients told, the files' transfers stopped             CLIENTS         2
    a forget deciding its lines                            DECISION       10   (what is left, if any)
    ---- memory's reserve: no step above may take it ------------------------------------------
    the last turns land, the turn journal is synced        CAPTURE         5
    the curator's last batch                               FLUSH          10
    the index and the databases closed                     STORES          3
    the process exits                                      EXIT            2

Each step takes what it wants, at most, and never what the steps after it reserve, so a step that
hangs costs the ones after it nothing: the turn's grace and the CLI's end keep the clients' 2 s and
memory's 20 s, a forget's decision keeps the capture's, the capture keeps the flush's. A step with
nothing left is cut at once (a forget's decision then ends at the next start: its job is on disk).
The figures add up to the timeout: the worst case uses all of it, and the process is gone by then.

A shorter stop timeout (a test's) scales every figure alike. Pure: every question takes `now`,
the event loop's clock (monotonic), so the rules are tested without asyncio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STOP_TIMEOUT = 60.0  # SIGTERM to SIGKILL, as `sprite-os service stop` does it

TURN_GRACE = 30.0
REQUEST_GRACE = 30.0  # the console's requests in flight (an upload's chunk, a forget), beside the turn
CLI_END = 8.0
CLIENTS = 2.0
DECISION = 10.0
CAPTURE = 5.0
FLUSH = 10.0
STORES = 3.0
EXIT = 2.0
MEMORY_RESERVE = CAPTURE + FLUSH + STORES + EXIT  # memory's stop and the exit: the stages before never take it

# The server's account of its last stop, in .os/state: which of memory's steps did not finish (cut by
# their share, failed, or left work for the next start), for `sprite-os service stop` to say and exit by.
STOP_REPORT = "last-stop.json"
UNFINISHED_SAID = {
    "decision": "a forget's decision (made at the next start)",
    "capture": "the last turns' writes (kept in the spill file, written at the next start)",
    "imports": "an import (resumed at the next start)",
    "flush": "the curator's last batch (its turns are curated at the next start)",
    "stores": "closing the recall index and the databases (redone at the next start)",
    "memory": "memory's stop as a whole (what is left is done at the next start)",
}
# Steps whose cut leaves the databases short of what was acknowledged until the next start (the last
# turns in the spill file, the databases not closed): a copy taken now would miss them, so `service stop`
# exits non-zero. The others only put work off (curation, a forget's decision, an import), which a stop
# while the proxy is down or the day's budget is spent always does: said, not an error.
LEAVES_THE_DATABASES_SHORT = frozenset({"capture", "stores", "memory"})


@dataclass(frozen=True)
class StopDeadline:
    """The stop that began at `start` (the loop's clock) ends at `start + timeout`, when SIGKILL comes."""

    start: float
    timeout: float = STOP_TIMEOUT

    @property
    def end(self) -> float:
        return self.start + self.timeout

    def seconds(self, share: float) -> float:
        """A figure of the table above, at this stop's timeout."""
        return share * self.timeout / STOP_TIMEOUT

    def budget(self, now: float, want: float = math.inf, keep: float = 0.0) -> float:
        """The seconds a stage starting at `now` may take: `want` at most, and never the last `keep`
        (what the stages after it reserve). 0 when nothing is left."""
        return max(0.0, min(self.seconds(want), self.end - self.seconds(keep) - now))

    # ------------------------------------------------------------ each step's share, in order

    def turn(self, now: float) -> float:
        """The running turn's grace (the requests in flight get the same, beside it)."""
        return self.budget(now, TURN_GRACE, keep=CLI_END + CLIENTS + MEMORY_RESERVE)

    def requests(self, now: float) -> float:
        return self.budget(now, REQUEST_GRACE, keep=CLI_END + CLIENTS + MEMORY_RESERVE)

    def cli(self, now: float) -> float:
        """The CLI's disconnect after the turn's grace, before it is killed."""
        return self.budget(now, CLI_END, keep=CLIENTS + MEMORY_RESERVE)

    def before_memory(self, now: float) -> float:
        """A step before memory's (the clients' steps; the runtime's cut, past its own bounds): what is
        left before memory's reserve."""
        return self.budget(now, keep=MEMORY_RESERVE)

    def decision(self, now: float) -> float:
        """A forget's decision under way (cut, if it overruns, where memory's reserve begins)."""
        return self.budget(now, DECISION, keep=MEMORY_RESERVE)

    def capture(self, now: float) -> tuple[float, float]:
        """The last turns' landing, and its cut: the journal's sync after it may take up to half the
        flush's share (the curator's batch, if cut, runs at the next start), never more."""
        return self.budget(now, CAPTURE, keep=FLUSH + STORES + EXIT), self.budget(now, keep=FLUSH / 2 + STORES + EXIT)

    def flush(self, now: float) -> tuple[float, float]:
        """The curator's last batch, and its cut: the daemon's own end may take half the stores' share."""
        return self.budget(now, FLUSH, keep=STORES + EXIT), self.budget(now, keep=STORES / 2 + EXIT)

    def stores(self, now: float) -> float:
        """Memory's other steps (the imports' task, the index, the databases closed)."""
        return self.budget(now, keep=EXIT)

    def exit_at(self) -> float:
        """When a process still alive (a thread that never returns holds its exit) is ended: within
        EXIT, before the SIGKILL."""
        return self.end - self.seconds(EXIT) / 2
