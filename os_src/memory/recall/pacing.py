"""When the embedder may take the CPU: the agent's turn comes first.

Embedding a turn costs 30-150 ms of CPU by its length (dense.py), and nobody waits on it: word search finds a turn
within a second of its recording, and ranking is fair to a turn without a vector. On a Sprite's
two cores, embedding during a turn slows the turn (the CLI, the event loop and the embedder want
the CPU at once). So the embedder waits while a turn runs, and for a short quiet spell after one
ends (the next message often follows at once: a queue, a retry); it never waits longer than
MAX_DEFER in all, so a new turn still gets its vector within seconds while the agent works
without pause. Between turns, the person reading and typing, it runs at full speed.

Pure: the agent's activity is a value its owner updates, and the policy takes `now` (monotonic).
"""

from __future__ import annotations

from dataclasses import dataclass

QUIET_AFTER_TURN = 0.5  # seconds after a turn ends before embedding resumes
MAX_DEFER = 10.0  # the longest the embedder waits for the agent, from when it had work


@dataclass
class AgentActivity:
    """The agent's turns as the embedder needs to know them (monotonic seconds)."""

    running_since: float | None = None
    ended_at: float | None = None

    def started(self, now: float) -> None:
        self.running_since = now

    def ended(self, now: float) -> None:
        self.running_since, self.ended_at = None, now


def embed_delay(activity: AgentActivity, wanted_since: float, now: float) -> float:
    """Seconds the embedder should wait before its next batch, which it has had since
    `wanted_since`: 0 to go now. While a turn runs, until MAX_DEFER is up (the owner also wakes it
    when the turn ends); after a turn, until QUIET_AFTER_TURN has passed."""
    left = wanted_since + MAX_DEFER - now
    if left <= 0:
        return 0.0
    if activity.running_since is not None:
        return left
    if activity.ended_at is not None:
        return max(0.0, min(left, activity.ended_at + QUIET_AFTER_TURN - now))
    return 0.0
