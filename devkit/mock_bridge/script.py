"""Script and fault data types, and the per-turn logic of the scripted agent model.

The agent side is a FIFO of `Turn`s. A turn is a list of steps and every step is ONE model
response. A new prompt starts the next turn (its first step); a `tool_result` for a tool_use id
the mock issued continues the turn that issued it (its next step). Everything else about the
Claude Code CLI's request shape that this depends on is handled in `request.parse_user_message`.
"""

from __future__ import annotations

import itertools
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from .request import RecordedRequest, parse_user_message, system_text

Target = Literal["agent", "curator", "any"]
FaultKind = Literal["status", "latency", "cut", "malformed"]

# Claude Code's compaction request ends with a user text starting with this.
COMPACTION_PREFIX = "CRITICAL: Respond with TEXT ONLY"
COMPACTION_SUMMARY = "<summary>Conversation summary (mock).</summary>"
END_OF_TURN = "(end of scripted turn)"


@dataclass(frozen=True)
class Text:
    """A text block. Streamed one word per delta, or `chunk_size` characters per delta."""

    text: str
    chunk_delay: float = 0.0  # seconds between deltas, so tests can interrupt mid-reply
    chunk_size: int | None = None


@dataclass(frozen=True)
class ToolCall:
    """A tool_use block. Without `id` the bridge assigns a unique `toolu_mock_...` id."""

    name: str
    input: dict[str, Any] = field(default_factory=dict)
    id: str | None = None


Block: TypeAlias = Text | ToolCall


@dataclass(frozen=True)
class Step:
    """One model response with its own usage numbers (None = inherit from the Turn).

    Only needed to override usage per step; a bare block or a list of blocks is also a step.
    """

    blocks: tuple[Block, ...]
    input_tokens: int | None = None
    output_tokens: int | None = None

    def __init__(
        self, *blocks: Block, input_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        object.__setattr__(self, "blocks", tuple(blocks))
        object.__setattr__(self, "input_tokens", input_tokens)
        object.__setattr__(self, "output_tokens", output_tokens)


StepLike: TypeAlias = Block | Sequence[Block] | Step


def _as_step(step: StepLike) -> Step:
    if isinstance(step, Step):
        return step
    if isinstance(step, Text | ToolCall):
        return Step(step)
    blocks = tuple(step)
    if not blocks or not all(isinstance(b, Text | ToolCall) for b in blocks):
        raise TypeError(
            f"a step must be Text, ToolCall, Step or a non-empty list of them: {step!r}"
        )
    return Step(*blocks)


class Turn:
    """A scripted agent turn: `Turn(ToolCall(...), Text("done"), input_tokens=150000)`."""

    def __init__(self, *steps: StepLike, input_tokens: int = 10, output_tokens: int = 5) -> None:
        if not steps:
            raise ValueError("a Turn needs at least one step")
        self.steps: list[Step] = [_as_step(s) for s in steps]
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens

    def __repr__(self) -> str:
        return f"Turn({', '.join(repr(s.blocks) for s in self.steps)})"


@dataclass
class Fault:
    """A misbehaviour applied to Messages requests of `target`, for `times` requests (None = until removed).

    - "status": answer with HTTP `status` and an Anthropic-style error body.
    - "latency": sleep `seconds` before answering (combines with the others).
    - "cut": streaming: send `after_events` SSE events, then close the connection mid-body.
      Non-streaming: send part of the JSON body, then close.
    - "malformed": streaming: send `after_events` events, then an event with broken JSON data.
      Non-streaming: a 200 with a truncated JSON body.
    """

    kind: FaultKind
    status: int = 529
    seconds: float = 0.0
    after_events: int = 2
    target: Target = "any"
    times: int | None = None
    message: str | None = None
    retry_after: float | None = None  # sets a `retry-after` header on status faults

    def __post_init__(self) -> None:
        if self.kind not in ("status", "latency", "cut", "malformed"):
            raise ValueError(f"unknown fault kind {self.kind!r}")
        if self.target not in ("agent", "curator", "any"):
            raise ValueError(f"unknown fault target {self.target!r}")
        if self.times is not None and self.times < 1:
            raise ValueError("times must be >= 1 or None")


class FaultSet:
    """Active faults. Matching faults are consumed in the order they were added."""

    def __init__(self) -> None:
        self._active: list[tuple[Fault, list[int | None]]] = []  # fault, [remaining]

    def add(self, fault: Fault) -> Fault:
        self._active.append((fault, [fault.times]))
        return fault

    def remove(self, fault: Fault) -> None:
        self._active = [(f, n) for f, n in self._active if f is not fault]

    def clear(self) -> None:
        self._active.clear()

    def active(self) -> list[Fault]:
        return [f for f, _ in self._active]

    def take(self, target: str) -> list[Fault]:
        """The faults that apply to one request of `target`, consuming one use of each."""
        taken: list[Fault] = []
        for fault, remaining in list(self._active):
            if fault.target not in ("any", target):
                continue
            taken.append(fault)
            if remaining[0] is not None:
                remaining[0] -= 1
                if remaining[0] <= 0:
                    self.remove(fault)
        return taken


# --- replies ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUse:
    """A ToolCall with its id resolved."""

    id: str
    name: str
    input: dict[str, Any]


@dataclass
class Reply:
    """One assistant message, ready to be encoded as JSON or SSE."""

    blocks: list[Text | ToolUse]
    input_tokens: int = 10
    output_tokens: int = 5
    stop: str | None = None  # overrides the stop_reason derived from the blocks

    @property
    def stop_reason(self) -> str:
        if self.stop is not None:
            return self.stop
        return "tool_use" if any(isinstance(b, ToolUse) for b in self.blocks) else "end_turn"

    @property
    def text(self) -> str:
        return "".join(b.text for b in self.blocks if isinstance(b, Text))


class Ids:
    """Unique message / tool_use ids. The CLI groups history by message id (compaction fails with
    "too_few_groups" on repeats); a per-bridge token keeps ids unique across bridge restarts too."""

    def __init__(self) -> None:
        self._token = secrets.token_hex(3)
        self._n = itertools.count(1)

    def message(self) -> str:
        return f"msg_mock_{self._token}_{next(self._n)}"

    def tool_use(self) -> str:
        return f"toolu_mock_{self._token}_{next(self._n)}"


# --- the agent model --------------------------------------------------------------------------

# Given the tool_result blocks answering a step, produce the next reply (issuing new ids as needed).
Continuation: TypeAlias = Callable[[list[dict[str, Any]]], Reply]
# The demo model: (the script, the prompt, the tools offered, the system prompt) -> what it answers.
DemoModel: TypeAlias = Callable[["AgentScript", str, list[str], str], "Plan"]


@dataclass
class Plan:
    """What the agent model would answer. Nothing changes until `commit()`, so a request that a
    fault breaks (and the CLI then retries) does not consume the script."""

    reply: Reply
    is_tool_result: bool = False
    is_compaction: bool = False
    on_commit: Callable[[], None] | None = None

    def commit(self) -> None:
        if self.on_commit is not None:
            self.on_commit()


class AgentScript:
    """The scripted agent model; falls back to the demo model when no turn is queued."""

    def __init__(self, ids: Ids, demo: DemoModel) -> None:
        self._ids = ids
        self._demo = demo
        self.demo_word_delay = 0.0  # seconds between the demo model's words (0: as fast as it can)
        self._queue: deque[Turn] = deque()
        # Issued, not yet answered tool_use id -> what to answer its tool_result with.
        self._pending: dict[str, Continuation] = {}
        # While a plan is being made, the ids it issues collect here; they join `_pending` on commit.
        self._issuing: dict[str, Continuation] | None = None

    def script(self, *turns: Turn) -> None:
        self._queue.extend(turns)

    def pending(self) -> int:
        """Scripted turns not yet started."""
        return len(self._queue)

    def clear(self) -> None:
        self._queue.clear()
        self._pending.clear()

    def plan(self, body: dict[str, Any] | None, tools: list[str]) -> Plan:
        user = parse_user_message(body)
        if user.prompt.lstrip().startswith(COMPACTION_PREFIX):
            # Checked first: a mid-turn compaction request may carry a pending tool_result too.
            return Plan(Reply([Text(COMPACTION_SUMMARY)]), is_compaction=True)
        answered = [r for r in user.tool_results if r.get("tool_use_id") in self._pending]
        if answered:
            cont = self._pending[answered[0]["tool_use_id"]]
            ids = [i for i, c in self._pending.items() if c is cont]  # the whole step's calls
            reply, issued = self._run(lambda: cont(answered))

            def commit() -> None:
                for i in ids:
                    self._pending.pop(i, None)
                self._pending.update(issued)

            return Plan(reply, is_tool_result=True, on_commit=commit)
        if self._queue:
            turn = self._queue[0]
            reply, issued = self._run(lambda: self.step_reply(turn, 0))

            def commit() -> None:
                if self._queue and self._queue[0] is turn:
                    self._queue.popleft()
                self._pending.update(issued)

            return Plan(reply, on_commit=commit)
        return self._demo(self, user.prompt, tools, system_text(body))

    def _run(self, make: Callable[[], Reply]) -> tuple[Reply, dict[str, Continuation]]:
        self._issuing = {}
        try:
            return make(), self._issuing
        finally:
            self._issuing = None

    def issue(self, blocks: Iterable[Block], cont: Continuation, input_tokens: int = 10,
              output_tokens: int = 5) -> Reply:
        """Resolve ToolCall ids; a tool_result for any of them will call `cont`."""
        resolved: list[Text | ToolUse] = []
        for b in blocks:
            if isinstance(b, ToolCall):
                use = ToolUse(b.id or self._ids.tool_use(), b.name, dict(b.input))
                if self._issuing is not None:
                    self._issuing[use.id] = cont
                resolved.append(use)
            else:
                resolved.append(b)
        return Reply(resolved, input_tokens, output_tokens)

    def step_reply(self, turn: Turn, index: int) -> Reply:
        if index >= len(turn.steps):
            return Reply([Text(END_OF_TURN)], turn.input_tokens, turn.output_tokens)
        step = turn.steps[index]
        return self.issue(
            step.blocks,
            lambda _results: self.step_reply(turn, index + 1),
            input_tokens=turn.input_tokens if step.input_tokens is None else step.input_tokens,
            output_tokens=turn.output_tokens if step.output_tokens is None else step.output_tokens,
        )

    def demo_plan(self, make: Callable[[], Reply]) -> Plan:
        """For the demo model: a plan whose commit registers the ids `make` issued."""
        reply, issued = self._run(make)
        return Plan(reply, on_commit=lambda: self._pending.update(issued))


# --- the curator model -------------------------------------------------------------------------


@dataclass(frozen=True)
class CutOff:
    """A curator reply that stopped at the token limit (stop_reason "max_tokens")."""

    text: str


CuratorReply = str | CutOff | Callable[[RecordedRequest], str]


class CuratorScript:
    """FIFO of reply texts (or CutOff replies, or callables of the request) for non-CLI requests.

    `default` answers when nothing is scripted: "NONE", or a callable such as the demo curator."""

    def __init__(self, default: str | Callable[[RecordedRequest], str] = "NONE") -> None:
        self.default = default
        self._queue: deque[CuratorReply] = deque()

    def script(self, *replies: CuratorReply) -> None:
        self._queue.extend(replies)

    def pending(self) -> int:
        return len(self._queue)

    def clear(self) -> None:
        self._queue.clear()

    def peek(self) -> CuratorReply | None:
        return self._queue[0] if self._queue else None

    def pop(self) -> None:
        if self._queue:
            self._queue.popleft()
