"""The memory daemon's retry and failure policy, as pure code.

Nothing here sleeps, reads a clock or touches a database: time comes in as `now`
(epoch seconds), randomness as a number in [0, 1), so every rule is tested
without asyncio.

- `CURATOR_BACKOFF` (backoff.py's policy, which capture and the runtime share with their own
  steps): how long to wait after the n-th failed call.
- `FailureClock`: the failing spell (since when, how many calls, the last one),
  the six-hour rule, and the spell's record in memory.db's `meta` table.
- `PoisonTurns`: what an unusable reply means for the turns that got it.
- `Probe`: when, during a long backoff, to ask the proxy cheaply whether it answers again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import msgspec

from ...backoff import Backoff

BACKOFF_FIRST = 2.0
BACKOFF_MAX = 300.0
# rebuild's curator calls wait by it; the daemon builds the same from the two above at its start (tests
# shorten the daemon's by patching its names)
CURATOR_BACKOFF = Backoff(BACKOFF_FIRST, BACKOFF_MAX)
STALE_AFTER = 6 * 3600.0
STALE_MIN_FAILURES = 5  # besides the six hours: wall-clock time alone counts a Sprite's sleep as failing
# More time than this since the last failed call was no backoff (at most BACKOFF_MAX, plus one call
# of at most 120 s) but a sleep or a stopped daemon: that time is not failing.
FAILING_GAP = 2 * BACKOFF_MAX
DEGRADED_AFTER = 3  # failed calls in a row before /healthz says `degraded`
UNUSABLE_LIMIT = 3  # unusable replies in a row before the isolation acts
FAILING_KEY = "daemon_failing"  # memory.db meta: the spell, "" when not failing


class Spell(msgspec.Struct):
    """A failing spell as memory.db keeps it. Values saved by older versions lack `last` (read as a
    gap: the clock restarts) and `next_retry_at`."""

    since: float
    failures: int
    last: float | None = None
    next_retry_at: float | None = None


@dataclass
class FailureClock:
    """How long the curator has been failing, counted in failed calls and in time.

    A restart keeps the clock (it is saved after every failed call), and a sleep does not count:
    more than `gap` since the last failed call restarts it at the next one."""

    stale_after: float = STALE_AFTER
    min_failures: int = STALE_MIN_FAILURES
    gap: float = FAILING_GAP
    since: float | None = None  # the first failed call of the spell; None: not failing
    failures: int = 0  # failed calls in a row
    last: float | None = None  # the last failed call
    next_retry_at: float | None = None

    def failed(self, now: float) -> bool:
        """Count a failed call. True if the clock restarted first (a sleep since the last one).
        The caller sets `next_retry_at` from the new count."""
        restarted = self.since is not None and (self.last is None or now - self.last > self.gap)
        if restarted or self.since is None:
            self.since, self.failures = now, 0
        self.failures += 1
        self.last = now
        return restarted

    def succeeded(self) -> bool:
        """End the spell. True if there was one, so its saved record must be cleared."""
        was_failing = self.since is not None
        self.since, self.failures, self.last, self.next_retry_at = None, 0, None, None
        return was_failing

    def stale_cutoff(self, now: float) -> float | None:
        """The six-hour rule: after `stale_after` of failing AND `min_failures` failed calls, turns
        recorded before the returned time stop being retried. None: not yet."""
        if self.since is None or now - self.since < self.stale_after or self.failures < self.min_failures:
            return None
        return now - self.stale_after

    def report(self) -> dict[str, Any]:
        """What /healthz and `memory status` show about failing."""
        return {"consecutive_failures": self.failures, "failing_since": self.since,
                "next_retry_at": self.next_retry_at, "degraded": self.failures >= DEGRADED_AFTER}

    def dumps(self) -> str:
        if self.since is None:
            return ""
        return msgspec.json.encode(Spell(self.since, self.failures, self.last, self.next_retry_at)).decode()

    def restore(self, raw: str | None) -> None:
        """Take up a saved spell. ValueError if it is unreadable: then the clock starts afresh."""
        self.succeeded()
        if not raw:
            return
        try:
            spell = msgspec.json.decode(raw, type=Spell)
        except msgspec.MsgspecError as exc:
            raise ValueError(f"unreadable failing spell: {exc}") from None
        self.since, self.failures, self.last, self.next_retry_at = (
            spell.since, spell.failures, spell.last, spell.next_retry_at)


PROBE_EVERY = 15.0  # during a proxy outage's backoff, ask the proxy this often whether it answers
PROBE_SOONEST = 5.0  # a new turn asking for a batch brings the next question this close to the last


@dataclass
class Probe:
    """When to ask the proxy, cheaply (no model call), whether it answers again, while the next
    retry of a batch is far off: an outage's backoff grows to minutes, and curation must resume
    within moments of the proxy's return, not at the end of the step. Times are the loop's clock."""

    every: float = PROBE_EVERY
    soonest: float = PROBE_SOONEST
    last: float = -math.inf  # the last question, or the failed call that began the wait
    asked: bool = False  # a batch was asked for since (a new turn, a session's end)

    def waiting(self, now: float) -> None:
        """A call failed for the proxy: the backoff begins now."""
        self.last, self.asked = now, False

    def due(self, now: float, retry_at: float) -> float | None:
        """When to ask next (at the earliest `now`), or None when the retry itself comes first."""
        at = max(now, self.last + (self.soonest if self.asked else self.every))
        return None if at >= retry_at else at

    def probed(self, now: float) -> None:
        self.last, self.asked = now, False


class Verdict(Enum):
    RETRY = "retry"  # back off, then the same turns again
    ISOLATE = "isolate"  # go on at once, one turn at a time
    SET_ASIDE = "set-aside"  # back off, then the next turn: this one goes last
    GIVE_UP = "give-up"  # every turn failed alone, none succeeded: back off, whole chunks again
    STALE = "stale"  # mark this one turn stale and go on at once

    @property
    def goes_on(self) -> bool:
        return self in (Verdict.ISOLATE, Verdict.STALE)


@dataclass
class PoisonTurns:
    """Unusable replies (a refusal, garbage) to the oldest turns must not hold back every newer one.

    After `limit` in a row for a chunk, its turns run one at a time, oldest first. A turn that
    gets `limit` in a row is marked stale, but only on evidence that the proxy and model work: a
    turn that succeeded alone since the isolation began. Before that evidence, a turn that fails
    alone is set aside (moved last) after one reply; once there is evidence, the turns set aside
    run first. When a turn is marked stale and none set aside is left, the rest of the chunk goes
    back to one call. If every turn fails alone, nothing says the turns are at fault (a proxy or
    model answering everything with garbage): the isolation is dropped, and no new one starts
    until a call succeeds or newer turns join the oldest chunk. So turns are never marked stale
    wholesale. Kept in memory only: a restart starts over with whole chunks."""

    limit: int = UNUSABLE_LIMIT
    queue: list[int] = field(default_factory=list)  # the turns to run alone, in order; empty: whole chunks
    evidence: bool = False  # a turn succeeded alone since the isolation began
    probed: int = 0  # the size of the chunk whose isolation found no evidence
    _aside: set[int] = field(default_factory=set)  # turns that failed alone before the evidence
    _unusable: tuple[int, int] = (0, 0)  # (first turn of the last call, unusable replies in a row)

    def next_turn(self, pending: list[int]) -> int | None:
        """The one turn to run next, given the oldest pending turns; None: run whole chunks."""
        waiting = set(pending)
        self.queue = [i for i in self.queue if i in waiting]  # done, or marked stale by the six-hour rule
        if not self.queue:
            self.evidence, self._aside = False, set()
        return self.queue[0] if self.queue else None

    def succeeded(self) -> None:
        self._unusable, self.probed = (0, 0), 0
        if self.queue and not self.evidence:  # the first turn that succeeded alone: the suspects go first
            self.evidence = True
            self.queue.sort(key=lambda i: (i not in self._aside, i))

    def unusable(self, ids: list[int]) -> Verdict:
        """An unusable reply to the call that carried `ids` (the oldest pending turns)."""
        first, count = self._unusable
        count = count + 1 if first == ids[0] else 1
        self._unusable = (ids[0], count) if count < self.limit else (0, 0)
        if not self.queue:  # a whole chunk
            if count < self.limit or len(ids) <= max(1, self.probed):
                return Verdict.RETRY  # a lone turn can't be told apart from a broken model
            self.queue, self.evidence, self._aside = list(ids), False, set()
            return Verdict.ISOLATE
        if self.evidence:
            if count < self.limit:
                return Verdict.RETRY
            self._aside.discard(self.queue.pop(0))
            if not self._aside.intersection(self.queue):
                self.queue = []  # found: the rest go back to one call (another poison starts anew)
            return Verdict.STALE
        self._unusable = (0, 0)
        self._aside.add(self.queue[0])
        self.queue.append(self.queue.pop(0))
        if self.queue[0] in self._aside:
            self.probed, self.queue = len(self.queue), []
            return Verdict.GIVE_UP
        return Verdict.SET_ASIDE
