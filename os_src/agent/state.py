"""The runtime's rules as pure state machines: a turn's phases, a session's, and the inbox.

No asyncio and no SDK here: `runtime.py` drives these and does the I/O they call for,
so every rule (when an interrupt goes to the CLI, when a prompt may be resent, when
`new_session` changes nothing) is unit-tested on its own (tests/test_agent_state.py).

A turn, as the owner task runs it:

    IDLE ─begin(connect)─► STARTING ─connected─► SENDING ─sent─► WAITING ─heard─► STREAMING
             └─begin(warm)──────────────────────────┘    ▲          │
                                     STARTING ◄─resend───┴──────────┘  (a reused CLI died silently)

Once the CLI's answer is in (or the turn failed), the turn is SAVING until it is on disk: only
then is the person told it is done. An interrupt then changes nothing.

and the interrupt that may come from outside at any point:

    STARTING ─► CANCELLED        the turn ends unsent: once the CLI is up, or at once if its
                                 start has not begun (the SDK's import on a first turn)
    SENDING  ─► STOP_AFTER_SEND  an interrupt that reached the CLI before the prompt would stop
                                 nothing: it goes to the CLI right after the prompt (then STOPPING);
                                 before the prompt's write begins (auto-recall looking, or waiting
                                 for a forget's end), the turn ends unsent instead
    WAITING, STREAMING ─► STOPPING   it goes to the CLI now

`end` returns any phase to IDLE.
"""

from __future__ import annotations

import enum
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from ..backoff import Backoff
from ..errors import SpriteOSError
from ..protocol import AgentState


class IllegalTransition(SpriteOSError):
    """The runtime asked a state machine for a step its rules do not allow: a bug in the runtime."""


class TurnPhase(enum.Enum):
    IDLE = "idle"
    STARTING = "starting"  # a CLI is being connected for the turn
    SENDING = "sending"  # the prompt is being written to the CLI
    WAITING = "waiting"  # the prompt is sent; the CLI has said nothing about it yet
    STREAMING = "streaming"  # the CLI has answered, at least in part: the turn is under way
    CANCELLED = "cancelled"  # interrupted while starting: ends unsent
    STOP_AFTER_SEND = "stop_after_send"  # interrupted while the prompt is written
    STOPPING = "stopping"  # the interrupt went to the CLI; the reply stream is ending
    SAVING = "saving"  # the turn is over: it is made durable before turn_complete goes out


class Stop(enum.Enum):
    """What an interrupt asks of the runtime."""

    NOTHING = "nothing"  # no turn is running (or it is already stopping): tell the client so
    UNSENT = "unsent"  # still starting: the turn ends, unsent, once the CLI is up
    AFTER_SEND = "after_send"  # the prompt is being written: interrupt the CLI right after it
    NOW = "now"  # interrupt the CLI now
    OVER = "over"  # the turn is already over (being saved): nothing to do, and no error either
    ALREADY = "already"  # the turn is already stopping (a second press): nothing more to do, no error


_PUBLIC: dict[TurnPhase, AgentState] = {
    TurnPhase.IDLE: "idle",
    TurnPhase.STARTING: "starting",
    TurnPhase.SENDING: "running",
    TurnPhase.WAITING: "running",
    TurnPhase.STREAMING: "running",
    TurnPhase.CANCELLED: "stopping",
    TurnPhase.STOP_AFTER_SEND: "stopping",
    TurnPhase.STOPPING: "stopping",
    TurnPhase.SAVING: "running",
}

_INTERRUPTS: dict[TurnPhase, tuple[TurnPhase, Stop]] = {
    TurnPhase.STARTING: (TurnPhase.CANCELLED, Stop.UNSENT),
    TurnPhase.SENDING: (TurnPhase.STOP_AFTER_SEND, Stop.AFTER_SEND),
    TurnPhase.WAITING: (TurnPhase.STOPPING, Stop.NOW),
    TurnPhase.STREAMING: (TurnPhase.STOPPING, Stop.NOW),
    TurnPhase.SAVING: (TurnPhase.SAVING, Stop.OVER),
    TurnPhase.CANCELLED: (TurnPhase.CANCELLED, Stop.ALREADY),
    TurnPhase.STOP_AFTER_SEND: (TurnPhase.STOP_AFTER_SEND, Stop.ALREADY),
    TurnPhase.STOPPING: (TurnPhase.STOPPING, Stop.ALREADY),
}


class TurnState:
    """The phase of the turn the runtime is running, and the steps between phases."""

    def __init__(self) -> None:
        self.phase = TurnPhase.IDLE
        self.by_server = False  # the interrupt that stopped the turn was the server's stop, not the person's

    @property
    def public(self) -> AgentState:
        """The agent's state as clients see it (`ready.agent`, /healthz)."""
        return _PUBLIC[self.phase]

    @property
    def interrupted(self) -> bool:
        return self.phase in (TurnPhase.CANCELLED, TurnPhase.STOP_AFTER_SEND, TurnPhase.STOPPING)

    @property
    def stopped_unsent(self) -> bool:
        """Asked before the prompt's write begins: the turn was stopped while a CLI was to start
        (CANCELLED) or while its prompt waited to be written (STOP_AFTER_SEND: auto-recall looking, a
        forget's hold). Nothing reached the CLI, so the turn ends unsent."""
        return self.phase in (TurnPhase.CANCELLED, TurnPhase.STOP_AFTER_SEND)

    @property
    def may_resend(self) -> bool:
        """Nothing of the turn happened yet: the CLI has not answered and no one interrupted it."""
        return self.phase in (TurnPhase.SENDING, TurnPhase.WAITING)

    def begin(self, connect: bool) -> None:
        """A turn starts: with a CLI to connect first, or on the one that is up."""
        self._step({TurnPhase.IDLE}, TurnPhase.STARTING if connect else TurnPhase.SENDING)
        self.by_server = False

    def connected(self) -> bool:
        """The CLI is up. False: the turn was interrupted meanwhile and ends unsent."""
        if self.phase is TurnPhase.CANCELLED:
            return False
        self._step({TurnPhase.STARTING}, TurnPhase.SENDING)
        return True

    def sent(self) -> bool:
        """The prompt is written. True: an interrupt arrived meanwhile and must go to the CLI now."""
        if self.phase is TurnPhase.STOP_AFTER_SEND:
            self.phase = TurnPhase.STOPPING
            return True
        self._step({TurnPhase.SENDING}, TurnPhase.WAITING)
        return False

    def heard(self) -> None:
        """The CLI said something about the turn: from now on it is under way, and never resent."""
        if self.phase is TurnPhase.WAITING:
            self.phase = TurnPhase.STREAMING
        elif self.phase not in (TurnPhase.STREAMING, TurnPhase.STOPPING):
            raise IllegalTransition(f"heard from the CLI while {self.phase.value}")

    def interrupt(self, by_server: bool = False) -> Stop:
        """`by_server`: the server's stop asks it, not the person. Whoever stopped the turn first names
        it (`by_server` afterwards), as its record does (capture/recorder.py)."""
        phase, stop = _INTERRUPTS.get(self.phase, (self.phase, Stop.NOTHING))
        if stop in (Stop.UNSENT, Stop.AFTER_SEND, Stop.NOW):
            self.by_server = by_server
        self.phase = phase
        return stop

    def resend(self) -> None:
        """The prompt goes once more, to a fresh CLI (only while `may_resend`)."""
        self._step({TurnPhase.SENDING, TurnPhase.WAITING}, TurnPhase.STARTING)

    def saving(self) -> None:
        """The turn is over, however it ended: it is being made durable."""
        if self.phase is TurnPhase.IDLE:
            raise IllegalTransition("turn: idle -> saving")
        self.phase = TurnPhase.SAVING

    def end(self) -> None:
        self.phase = TurnPhase.IDLE

    def _step(self, allowed: set[TurnPhase], to: TurnPhase) -> None:
        if self.phase not in allowed:
            raise IllegalTransition(f"turn: {self.phase.value} -> {to.value}")
        self.phase = to


class SessionPhase(enum.Enum):
    FRESH = "fresh"  # no turn has run in it: ending it would only churn clients and memory
    USED = "used"  # a turn ran in it: new_session ends it
    CLOSING = "closing"  # the server is shutting down: no new work is accepted, to the end


class SessionState:
    def __init__(self) -> None:
        self.phase = SessionPhase.FRESH

    @property
    def accepting(self) -> bool:
        return self.phase is not SessionPhase.CLOSING

    @property
    def worth_ending(self) -> bool:
        """Whether a new_session request should end this session."""
        return self.phase is SessionPhase.USED

    def began(self) -> None:
        if self.phase is not SessionPhase.CLOSING:
            self.phase = SessionPhase.FRESH

    def turn_ran(self) -> None:
        """Set per attempt: a turn resent to a fresh CLI counts as the new session's turn."""
        if self.phase is SessionPhase.FRESH:
            self.phase = SessionPhase.USED

    def close(self) -> None:
        self.phase = SessionPhase.CLOSING


# The agent that cannot start (a read-only disk, its CLI missing) is tried again on its own, soon at
# first; a message brings the next attempt forward to at once.
START_BACKOFF = Backoff(first=2.0, max=60.0)


@dataclass
class AgentHealth:
    """Whether the agent can run: the spell of failed starts (why, since when, how many in a row)
    and when the runtime tries again on its own. Time comes in as `now` (the loop's clock, for the
    retry) and `wall` (for people); randomness as `rand` in [0, 1)."""

    backoff: Backoff = START_BACKOFF
    reason: str | None = None
    since: float | None = None  # wall clock
    failures: int = 0
    retry_at: float | None = None  # the loop's clock
    retry_wall: float | None = None

    @property
    def failed(self) -> bool:
        return self.reason is not None

    def start_failed(self, reason: str, now: float, wall: float, rand: float) -> float:
        """A start failed: returns the seconds until the runtime tries again on its own."""
        if self.since is None:
            self.since = wall
        self.reason, self.failures = reason, self.failures + 1
        delay = self.backoff.delay(self.failures, rand)
        self.retry_at, self.retry_wall = now + delay, wall + delay
        return delay

    def started(self) -> bool:
        """A start succeeded. True if it ended a spell of failures (the agent recovered)."""
        was = self.failed
        self.reason, self.since, self.failures, self.retry_at, self.retry_wall = None, None, 0, None, None
        return was

    def retry_in(self, now: float) -> float | None:
        """Seconds until the next attempt of its own; None when the agent is not failing."""
        return None if self.retry_at is None else max(0.0, self.retry_at - now)

    def report(self) -> dict[str, Any] | None:
        """What /healthz says: None while the agent can run."""
        if not self.failed:
            return None
        return {"reason": self.reason, "since": self.since, "failed_starts": self.failures,
                "next_attempt_at": self.retry_wall}


@dataclass(frozen=True)
class TurnCost:
    """What one turn cost, and its session so far (USD; None when the CLI reported no cost)."""

    turn: float | None
    session: float


COST_DIGITS = 10  # a difference of running totals, rounded: 0.0003 - 0.0001 is 0.0002, not 0.00019999...


class CostMeter:
    """A turn's own cost. The CLI reports `total_cost_usd` as its process's running total (the turns
    of one session read $0.0001, $0.0004, $0.0007 ...), so a turn's cost is the difference from the
    process's total at its previous result. A new CLI process starts again from zero; a session's
    total adds up its turns, whichever processes ran them."""

    def __init__(self) -> None:
        self._process = 0.0  # the running CLI's total at its last result
        self._session = 0.0

    def new_process(self) -> None:
        self._process = 0.0

    def new_session(self) -> None:
        self._session = 0.0

    def charge(self, running_total: float | None) -> TurnCost:
        if running_total is None:
            return TurnCost(None, round(self._session, COST_DIGITS))
        # Below the last total: a process this meter was not told about; its total is all this turn's.
        turn = running_total - self._process if running_total >= self._process else running_total
        self._process = running_total
        self._session += turn
        return TurnCost(round(turn, COST_DIGITS), round(self._session, COST_DIGITS))


@dataclass
class Turn:
    """A user message, queued for the agent."""

    text: str
    client_id: str | None
    turn_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    cost: TurnCost | None = None  # once the CLI reported its result


@dataclass(frozen=True)
class EndSession:
    """End the session: a person's `new_session`, or a forget's restart of `session_id` (skipped when
    that session has ended already), so that the agent's context lets go of a forgotten turn."""

    reason: Literal["new_session", "forget"]
    session_id: str | None = None


@dataclass(frozen=True)
class Shutdown:
    pass


Command = Turn | EndSession | Shutdown


class Inbox:
    """What the owner task has yet to do, in order. Back-to-back new_session requests are one
    request (the queue stays bounded); a new_session queued after it is taken counts again. A
    forget's restart goes first and is never merged with a person's."""

    def __init__(self) -> None:
        self._commands: deque[Command] = deque()

    def __len__(self) -> int:
        return len(self._commands)

    def put(self, command: Command) -> bool:
        """Queue `command`; False when it adds nothing (a new_session right after another)."""
        if command == PERSONS_NEW_SESSION and self._commands and self._commands[-1] == command:
            return False
        self._commands.append(command)
        return True

    def put_first(self, command: Command) -> None:
        """Before everything queued (a forget's restart comes before the messages it held)."""
        self._commands.appendleft(command)

    def peek(self) -> Command:
        return self._commands[0]

    def messages(self) -> int:
        """The person's messages queued: what the queue's limit counts (not the new sessions between them)."""
        return sum(isinstance(c, Turn) for c in self._commands)

    def waiting(self) -> list[str]:
        """The client ids of the messages still queued, in order (those sent without one left out)."""
        return [c.client_id for c in self._commands if isinstance(c, Turn) and c.client_id is not None]

    def take(self) -> Command:
        return self._commands.popleft()

    def clear(self) -> None:
        self._commands.clear()


PERSONS_NEW_SESSION = EndSession("new_session")
