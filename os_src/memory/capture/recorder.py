"""Capture: each turn the runtime runs becomes ONE observation in transcript.db.

The runtime sent the prompt and reads every message the CLI sends back, so it is the
turn's one writer: it opens a `TurnRecord` when a turn starts, shows it each message
(tool calls and their results, the assistant's text), and closes it exactly once when
the turn ends, however it ends: a result, an interrupt, a failure, a shutdown (a turn
interrupted before its prompt was sent is never closed: nothing happened). No hook
is involved, so the CLI pays nothing per turn for capture (it spends about 4 ms per
hook event it dispatches; see docs/benchmarks.md).

Nothing here waits: each value is cut to a bounded size before any work that grows
with it, and the write is queued to the transcript writer (memory/capture/writer.py), which
retries it until it lands. While a turn is open it is kept in the turn journal
(memory/capture/journal.py), so that a server killed mid-turn loses nothing of it. A capture
error is logged and counted, never raised into the runtime. Only `TurnRecord.durable` waits:
the runtime awaits it before it tells the person the turn is done (memory/capture/acks.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ...text import clean_text
from ...text import strip_private as strip_private  # memory/importer.py takes it from here
from ...turn_end import result_status
from ..hooks import HookTimings
from ..transcript_store import NewObservation
from .acks import Acks, Key
from .journal import STOPPED, STOPPED_NOTE, TurnJournal
from .spill import CommandWrite, ObservationWrite, SessionWrite, write_key
from .writer import TranscriptWriter

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import (
        AssistantMessage,
        Message,
        ResultMessage,
        TextBlock,
        ToolResultBlock,
        ToolUseBlock,
        UserMessage,
    )

TOOL_INPUT_CHARS = 500
TOOL_OUTPUT_CHARS = 1000
MAX_TOOL_CALLS = 50  # per turn; more are counted, not stored
USER_MESSAGE_CHARS = 20_000
RESPONSE_CHARS = 20_000
PRIVATE_MARGIN = 2_000  # read this far past the cut, so a closed <private> block before it shrinks the text
# At most this long for a closed turn to be durable: a disk that hangs (rather than fails) must
# not hold the person's turn forever. A failing disk is known at once (capture/acks.py).
DURABLE_WAIT = 5.0
StoppedBy = Literal["person", "server"]  # who stopped a turn: the person's interrupt, or the server's stop

def _bounded(value: Any, limit: int) -> str:
    """At most `limit` characters of `value` (a string or JSON-like data), private text removed.

    Capture runs on the event loop, so the work is bounded by `limit`, not by the input: the
    value is cut (with a margin) before it is encoded and before <private> is looked for. That
    stays safe because an unclosed <private> hides the rest: a block the cut splits leaks nothing.
    """
    head_chars = limit + PRIVATE_MARGIN
    if isinstance(value, str):
        total, head = len(value), value[:head_chars]
        cut = total > head_chars
    else:
        budget = [head_chars]
        total, head = None, json.dumps(_shrink(value, budget), ensure_ascii=False)
        cut = budget[0] <= 0 or len(head) > head_chars
        head = head[:head_chars]
    text = strip_private(clean_text(head))
    if not cut and len(text) <= limit:
        return text
    more = f"{total - limit} more" if total is not None and total > limit else "more"
    return text[:limit] + f"…[{more}]"


def _shrink(value: Any, budget: list[int]) -> Any:
    """A copy of JSON-like `value` holding about budget[0] characters at most; it visits at most
    that many nodes, however big the value."""
    if budget[0] <= 0:
        return "…"
    budget[0] -= 1
    if isinstance(value, dict):
        return {str(k)[:200]: _shrink(v, budget) for k, v in itertools.islice(value.items(), budget[0])}
    if isinstance(value, (list, tuple)):
        return [_shrink(v, budget) for v in itertools.islice(value, budget[0])]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = (value if isinstance(value, str) else str(value))[: budget[0]]
    budget[0] -= len(text)
    return text


@functools.cache
def _message_kinds() -> tuple[type[AssistantMessage], type[TextBlock], type[ToolResultBlock], type[ToolUseBlock],
                             type[UserMessage]]:
    """The SDK's message and block classes `observe` tells apart, looked up once: the runtime shows it
    every streamed event of a turn (two dozen with a zero-latency model), and a `from ... import` of a
    package's names inside it ran the import machinery for each."""
    from claude_agent_sdk import (
        AssistantMessage,
        TextBlock,
        ToolResultBlock,
        ToolUseBlock,
        UserMessage,
    )

    return AssistantMessage, TextBlock, ToolResultBlock, ToolUseBlock, UserMessage


@dataclass
class _ToolCall:
    name: str
    input: str
    output: str = ""
    is_error: bool = False


@dataclass
class _Turn:
    user_message: str
    started: float
    command: bool  # a slash command, which the CLI may run itself (/compact)
    turn_id: str | None = None  # its id on the wire, so a client can match a record to what it saw
    client_id: str | None = None  # the id its sender gave the message, so a page can find its own message
    session: str | None = None  # the session it was opened in
    tool_calls: dict[str, _ToolCall] = field(default_factory=dict)  # by tool_use_id, in call order
    dropped_calls: int = 0
    last_text: str = ""
    stopped_by: StoppedBy | None = None  # who stopped it first, if anyone: that one names it

    def tool_use(self, block: ToolUseBlock) -> None:
        if len(self.tool_calls) >= MAX_TOOL_CALLS:
            self.dropped_calls += 1
        else:
            self.tool_calls[block.id] = _ToolCall(clean_text(block.name), _bounded(block.input, TOOL_INPUT_CHARS))

    def tool_result(self, block: ToolResultBlock) -> None:
        if (call := self.tool_calls.get(block.tool_use_id)) is not None:
            call.output, call.is_error = _bounded(block.content, TOOL_OUTPUT_CHARS), bool(block.is_error)

    def calls_json(self) -> str:
        calls = [vars(c) for c in self.tool_calls.values()]
        if self.dropped_calls:
            calls.append({"name": "(more)", "input": "", "output": f"{self.dropped_calls} more calls",
                          "is_error": False})
        return json.dumps(calls, ensure_ascii=False)


class TurnRecord:
    """One turn as it happens; `close` hands it to the recorder, once."""

    def __init__(self, recorder: TurnRecorder, turn: _Turn | None) -> None:
        self._recorder = recorder
        self._turn = turn
        # Set once the turn is recorded (its key None: a command with no client id, which waits on the journal alone).
        self._durable: tuple[Key | None, asyncio.Future[bool]] | None = None

    def observe(self, message: Message) -> None:
        """Note a tool call, a tool result or the assistant's text. Sub-agents' traffic (it carries a
        parent_tool_use_id) is not the user's turn; their tool call, seen by the main agent, is."""
        turn = self._turn
        if turn is None or getattr(message, "parent_tool_use_id", None) is not None:
            return
        AssistantMessage, TextBlock, ToolResultBlock, ToolUseBlock, UserMessage = _message_kinds()
        if isinstance(message, AssistantMessage):
            if message.error is not None:  # the CLI's notice of a failed model call, not the agent's words
                return
            with self._recorder.timings.guard("observe"):
                texts = []
                for block in message.content:
                    if isinstance(block, ToolUseBlock):
                        turn.tool_use(block)
                    elif isinstance(block, TextBlock):
                        texts.append(block.text)
                if texts:
                    turn.last_text = "".join(texts)
                self._recorder.touched()
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            with self._recorder.timings.guard("observe"):
                for block in message.content:
                    if isinstance(block, ToolResultBlock):
                        turn.tool_result(block)
                self._recorder.touched()

    def interrupted(self, by_server: bool = False) -> None:
        """Someone stopped the turn: the person, or the server's stop (`by_server`). Whoever stopped it
        first names it: a turn the server's stop cut short is recorded as STOPPED, not as the person's
        interrupt, and one the person stopped stays theirs though the stop then cuts it."""
        if self._turn is not None and self._turn.stopped_by is None:
            self._turn.stopped_by = "server" if by_server else "person"

    def close(self, result: ResultMessage | None, error: str | None = None, cost_usd: float | None = None) -> None:
        """The turn ended: with the CLI's result, or with `error` when it failed without one (None and
        None: it was cancelled); `cost_usd` is the turn's own cost. Only the first close records."""
        turn, self._turn = self._turn, None
        if turn is not None:
            with self._recorder.timings.guard("close"):
                self._durable = self._recorder.record(turn, result, error, cost_usd)

    async def durable(self, budget: float | None = None) -> bool:
        """Once closed: True when the turn is on disk (or was not recorded at all), False when it
        can't be for now, or not within `budget` seconds (DURABLE_WAIT, read at the call)."""
        if self._durable is None:
            return True
        key, done = self._durable
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(asyncio.shield(done), DURABLE_WAIT if budget is None else budget):
                return True
        if key is not None:
            self._recorder.not_saved(key)
        return False


class TurnRecorder:
    """Numbers the turns of the current session and queues each one's observation."""

    def __init__(self, writer: TranscriptWriter, on_recorded: Callable[[], None],
                 timings: HookTimings | None = None, journal: TurnJournal | None = None,
                 acks: Acks | None = None, clock: Callable[[], float] = time.time) -> None:
        self._writer = writer
        self._on_recorded = on_recorded
        self.timings = timings or HookTimings()
        self._journal = journal
        self._acks = acks or Acks()
        self._clock = clock  # a turn's and a session's timestamp: what it says, never what orders it
        self.session_id: str | None = None
        self._sequence = 0

    def start_session(self, session_id: str) -> None:
        self.session_id, self._sequence = session_id, 0
        self._writer.submit(SessionWrite(session_id, "start", self._clock()))
        if self._journal is not None:  # an open turn moves to this session: its old key leaves the file now
            self._journal.moved()

    def end_session(self, session_id: str) -> None:
        self._writer.submit(SessionWrite(session_id, "end", self._clock()))

    def open(self, prompt: str, turn_id: str | None = None, client_id: str | None = None) -> TurnRecord:
        turn = None
        with self.timings.guard("open"):
            turn = _Turn(_bounded(prompt, USER_MESSAGE_CHARS), self._clock(), prompt.startswith("/"), turn_id,
                         client_id, self.session_id)
        if turn is not None and self._journal is not None and self.session_id is not None:
            with self.timings.guard("journal"):
                self._journal.opened(lambda: self._observation(turn, self._open_key(), None))
        return TurnRecord(self, turn)

    def _open_key(self) -> tuple[str, int]:
        """The open turn's number if it closed now: taken at each save, never at open, since a turn
        resent to a fresh CLI closes in the session that CLI starts."""
        assert self.session_id is not None
        return self.session_id, self._sequence + 1

    def touched(self) -> None:
        if self._journal is not None:
            self._journal.touched()

    def _observation(self, turn: _Turn, key: tuple[str, int], text: str | None, status: str | None = None,
                     cost_usd: float | None = None) -> NewObservation:
        """The turn as recorded: `text` is its response (None: what the agent said last, so far)."""
        return NewObservation(
            timestamp=turn.started, session_id=key[0], sequence_num=key[1], user_message=turn.user_message,
            tool_calls_json=turn.calls_json(),
            agent_response=_bounded(turn.last_text, RESPONSE_CHARS) if text is None else text,
            turn_id=turn.turn_id, status=status, cost_usd=cost_usd, client_id=turn.client_id,
        )

    def not_saved(self, key: Key) -> None:
        self._acks.not_saved(key)

    def record(self, turn: _Turn, result: ResultMessage | None, error: str | None,
               cost_usd: float | None = None) -> tuple[Key | None, asyncio.Future[bool]] | None:
        """Queue the turn's observation; returns its key and what says when it is durable (None: not
        recorded)."""
        obs = self._closed_turn(turn, result, error, cost_usd)
        if obs is None and self._ran_itself(turn, result):
            return self._left(turn, self._command_taken(turn) if turn.client_id is not None else None)
        durable = None
        if obs is not None:
            key = (obs.session_id, obs.sequence_num)
            durable = key, self._acks.expect(key)
        # Resent to a fresh CLI, it closes in a session it was not opened in: its open entry may be on
        # disk under its first key, and transcript.db gets it only once a journal save without that
        # entry has ended, so that no acknowledgement comes before it (a replay would duplicate it).
        moved = obs is not None and self._journal is not None and turn.session != obs.session_id
        if self._journal is not None:  # saved at once, racing transcript.db's commit (journal.py)
            self._journal.closed(obs)
        if obs is not None:
            write = ObservationWrite(obs)
            if moved and self._journal is not None:
                self._journal.after_save((obs.session_id, obs.sequence_num), lambda: self._writer.submit(write))
            else:
                self._writer.submit(write)
            self._on_recorded()
        return durable

    def _command_taken(self, turn: _Turn) -> tuple[Key, asyncio.Future[bool]] | None:
        """A command the CLI ran itself left no turn, but the agent took its message: its client id alone is
        recorded (command_clients), so that a restart refuses its resend as it does a turn's. No observation:
        nothing of it joins the conversation, curation or search. Durable (transcript.db or the spill file;
        the journal never held it) before the person is told the command is done, as a turn is. The spill
        file takes it at once, on the files' thread ahead of the journal's save that lets the running entry
        go: a kill while transcript.db is locked or slow must not leave it on no disk (a restart would then
        run the console's resend of it again). One fsync per command."""
        durable = None
        if self.session_id is not None and turn.client_id is not None:
            write = CommandWrite(turn.client_id, self.session_id, turn.turn_id, turn.started)
            key = write_key(write)
            durable = key, self._acks.expect(key, ways=1)
            self._writer.submit(write)
            self._writer.spill_waiting()
        return durable

    def _left(self, turn: _Turn, durable: tuple[Key, asyncio.Future[bool]] | None
              ) -> tuple[Key | None, asyncio.Future[bool]] | None:
        """A turn that leaves no observation (a command the CLI ran itself) lets its running entry go from
        the journal, saved at once and synced, and is acknowledged (`durable`: its client id on disk, if it
        has one) only once that save has ended: a kill -9 right after its turn_complete (or a power cut,
        later too) must not leave the entry, or the restart records a command the person saw done as a
        turn the server's stop cut short. One fsync a command."""
        journal = self._journal
        if journal is None or turn.session is None:  # the journal never held it
            return durable
        journal.closed(None, sync=True)
        key, ack = durable if durable is not None else (None, None)

        async def both() -> bool:
            ok = True if ack is None else await ack
            await journal.saved()
            return ok

        return key, asyncio.ensure_future(both())

    @staticmethod
    def _ran_itself(turn: _Turn, result: ResultMessage | None) -> bool:
        """The CLI ran the command itself, with no model turn: not part of the conversation. One that failed
        or was cut short (turn_end.py) is a turn, recorded so."""
        return (turn.command and result is not None and result.num_turns == 0
                and result_status(result.subtype, result.is_error, turn.stopped_by is not None) == "completed")

    def _closed_turn(self, turn: _Turn, result: ResultMessage | None, error: str | None,
                     cost_usd: float | None) -> NewObservation | None:
        if self.session_id is None or self._ran_itself(turn, result):
            return None
        note, status = None, "completed"
        # With a result, the live turn_complete's rule (turn_end.py): a stop that reached the CLI after the
        # answer was whole leaves the turn completed, as the person was told; its text is then the CLI's.
        ended = result_status(result.subtype, result.is_error, turn.stopped_by is not None) if result else None
        if error is not None:
            note, status = "(the turn failed before the agent finished)", "error"
        elif (ended == "interrupted" or result is None) and turn.stopped_by == "server":
            note, status = STOPPED_NOTE, STOPPED  # as a turn a kill cut short reads at the next start
        elif ended == "interrupted" or (result is None and turn.stopped_by == "person"):
            note, status = "(interrupted by the user)", "interrupted"
        elif ended == "error":
            status = "error"  # its text is the CLI's account of the failure
        text = _bounded((result.result if result is not None else None) or turn.last_text, RESPONSE_CHARS)
        if note:
            text = f"{text}\n{note}".strip()
        self._sequence += 1
        return self._observation(turn, (self.session_id, self._sequence), text, status, cost_usd)
