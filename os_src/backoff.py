"""How long to wait after the n-th failure in a row: the one backoff policy, pure code.

The memory daemon's curator calls, capture's transcript writes, the import inbox's attempts at a
file, the forget pass's tries again at a job it left for later (a disk that would not rewrite, a WAL a reader
keeps) and the runtime's attempts to start an agent
that cannot start all wait by it. Randomness comes in as a number in [0, 1), so
it is tested without a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

JITTER = 0.2  # +-20 %: many Sprites must not retry in lockstep


@dataclass(frozen=True)
class Backoff:
    first: float  # each user says its own: a disk, a proxy and an agent's start differ
    max: float
    jitter: float = JITTER

    def delay(self, failures: int, rand: float) -> float:
        """Seconds to wait after `failures` failed calls in a row: `first`, doubling, up to `max`.
        The jitter (`rand` in [0, 1)) never goes beyond `max`: at the top it only shortens the wait."""
        base = min(self.max, self.first * 2.0 ** min(max(failures - 1, 0), 64))
        low, high = base * (1 - self.jitter), min(self.max, base * (1 + self.jitter))
        return low + (high - low) * rand

