"""The conversation's record, kept by the driver: every turn's unique marker and what the client
saw of it. Pure: the checks compare it with what the databases hold."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

Outcome = Literal["completed", "interrupted", "error", "cut", "unsent"]
# completed / interrupted / error: the server's turn_complete status. cut: the connection went
# (a kill) after turn_started; unsent: before it (the server may or may not have read the message).
MARKER = re.compile(r"CHAOS-\d{6}")


@dataclass
class Turn:
    marker: str
    scenario: str
    outcome: Outcome
    seconds: float
    kept: bool = True  # False: sent once the disk could no longer be written (it may be lost)


@dataclass
class TurnLog:
    turns: list[Turn] = field(default_factory=list)
    _next: int = 1

    @property
    def next_marker(self) -> str:
        """The marker the next turn sent will carry."""
        return f"CHAOS-{self._next:06d}"

    def new_marker(self) -> str:
        marker = self.next_marker
        self._next += 1
        return marker

    def add(self, turn: Turn) -> None:
        self.turns.append(turn)

    def outcomes(self, scenario: str | None = None) -> Counter[str]:
        return Counter(t.outcome for t in self.turns if scenario is None or t.scenario == scenario)

    def seconds(self, scenario: str, outcome: Outcome = "completed") -> list[float]:
        return [t.seconds for t in self.turns if t.scenario == scenario and t.outcome == outcome]


@dataclass(frozen=True)
class Reconciled:
    """The client's record against transcript.db's, marker by marker."""

    completed: int  # turns the client saw complete
    recorded: int  # markers with an observation
    lost: list[str]  # acknowledged turns (turn_started seen) with no observation
    cut_short: list[str]  # turns the client saw complete, recorded as stopped before they ended
    duplicated: list[str]  # markers with more than one observation
    unknown: int  # observations with no marker this run sent
    cut_recorded: int  # turns cut by a kill that were recorded anyway (the turn journal)
    cut: int
    unsent_recorded: int
    unsent: int


def reconcile(log: TurnLog, recorded: Counter[str], stopped: frozenset[str] = frozenset()) -> Reconciled:
    """`recorded`: marker -> observations whose user message carries it; `stopped`: markers whose
    observation says the server stopped before the turn ended. A turn the server acknowledged
    (turn_started) must be recorded exactly once, whatever came after, and a turn the client saw
    complete must be recorded whole; a message the server may never have read (unsent) at most
    once. A turn sent once the disk could not be written (`kept` False) may be missing."""
    sent = {t.marker: t for t in log.turns}
    acknowledged = [t for t in log.turns if t.outcome != "unsent" and t.kept]
    return Reconciled(
        completed=sum(t.outcome == "completed" for t in log.turns),
        recorded=sum(1 for m in recorded if m in sent),
        lost=[t.marker for t in acknowledged if recorded[t.marker] == 0],
        cut_short=[t.marker for t in log.turns if t.outcome == "completed" and t.marker in stopped],
        duplicated=sorted(m for m, n in recorded.items() if n > 1),
        unknown=sum(n for m, n in recorded.items() if m not in sent),
        cut_recorded=sum(1 for t in log.turns if t.outcome == "cut" and recorded[t.marker]),
        cut=sum(t.outcome == "cut" for t in log.turns),
        unsent_recorded=sum(1 for t in log.turns if t.outcome == "unsent" and recorded[t.marker]),
        unsent=sum(t.outcome == "unsent" for t in log.turns))
