"""The agent runtime: one Claude Code CLI per agent session, driven by one task.

`AgentRuntime` owns the CLI (an `AgentProcess`). Every connect, prompt and disconnect
happens in its owner task, fed by an inbox; only `interrupt` comes from outside, as the
SDK documents, and `holding_turns`: a forget keeps turns from starting while it takes their
words out (a message waits in the inbox meanwhile). The rules it follows are pure code: the
turn's and the session's phases and the inbox in agent/state.py, SDK message -> frame
translation in agent/frames.py. This module does the I/O they call for. It tells the memory system where sessions begin and
end, and shows it every message of every turn (capture).

A session is one CLI process and one context. It starts lazily at the first
message and ends on `new_session`, after an idle timeout, at shutdown, or when
the CLI fails; the next message then starts a fresh one.

No error ends the owner task. An agent that cannot start (its boot prompt can't be written
on a read-only disk, its CLI is missing) answers each message with an error frame at once,
says why in /healthz (`failure`), and is tried again on its own, with backoff, until it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from . import protocol as p
from .agent import frames
from .agent.environment import cli_environment
from .agent.guard import MATCHER as GUARDED_TOOLS
from .agent.guard import ToolGuard
from .agent.memory_port import AgentMemory, NoRecord, TurnRecord
from .agent.process import AgentProcess, ClientFactory, load_sdk
from .agent.state import (
    PERSONS_NEW_SESSION,
    AgentHealth,
    Command,
    CostMeter,
    EndSession,
    Inbox,
    SessionState,
    Shutdown,
    Stop,
    Turn,
    TurnPhase,
    TurnState,
)
from .agent.taken import TAKEN_LIMIT, Taken, TakenIds
from .config import Settings
from .errors import AlreadyTaken, QueueFull, ShuttingDown
from .isolation.launch import AgentLaunch
from .logs import get_logger
from .stopping import CLI_END, TURN_GRACE
from .tools import canvas

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import ClaudeAgentOptions, HookMatcher, Message, ResultMessage
    from claude_agent_sdk.types import McpSdkServerConfig

log = get_logger(__name__)

# Built-in tools the agent may use, all pre-approved. Anything else is invisible to it.
BUILTIN_TOOLS = ("Read", "Write", "Edit", "NotebookEdit", "Bash", "WebFetch")
MAX_NOTES = 20  # things the person did outside the conversation, told with their next message
# One message from the CLI can be large (a long answer, a big file read); the SDK's 1 MB default
# would fail such a turn with CLIJSONDecodeError.
MAX_CLI_MESSAGE_BYTES = 64 * 1024 * 1024
# A message waits at most this long while turns are held (a forget taking words out of the transcript
# and search: its steps take seconds at worst, each bounded by its store's budget); then it runs anyway,
# said in the log, so that a stuck forget never silences the agent.
TURN_HOLD_LIMIT = 60.0

DEFAULT_PROMPT = "You are the agent of a Sprite: a small computer that belongs to one person."
NOT_SAVED = ("This turn could not be saved to disk yet (the server's disk is failing or full). It is kept "
             "in memory and saved once the disk allows; if the server stops before then, it is lost.")


Publish = Callable[[p.ServerFrame], None]
# How the CLI reaches the model: the relay's URL and key (agent/model_relay.py), asked for at each connect.
ModelEnv = Callable[[], Mapping[str, str]]
# What must be ready before a CLI starts and calls the model (the relay's client towards the proxy: made
# off the event loop), awaited before each connect.
PrepareModel = Callable[[], Awaitable[None]]
# Why the relay lately refused a call the CLI retries (agent/spend_book.py), or None.
RetryReason = Callable[[], str | None]
# The agent's tools besides the canvas (search_memory), as in-process MCP servers, built at each connect.
ToolServers = Callable[[], Mapping[str, "McpSdkServerConfig"]]


class _NoResult(Exception):
    """The CLI ended a turn's stream without a result: it exited under the turn."""


class _StartFailed(Exception):
    """The agent's CLI could not be started (the cause is chained)."""


def new_session_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


def _ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


class _Prompted(NamedTuple):
    """What goes before a turn's message: the notes told once, and auto-recall's context, looked up
    for the session the turn is sent in (a resend's fresh session looks again)."""

    turn_id: str
    session_id: str | None  # the session `context` was looked up for (None: not yet)
    told: str | None  # what the person did meanwhile
    context: str | None  # the notes and the recalled memories, as sent


@dataclass(frozen=True)
class TurnHold:
    """What `AgentRuntime.holding_turns` gives its holder: the turn running when the hold began (its wire
    id; None: none), the last to start until the hold ends, and `restart(session_id)`: end that session
    (if it is still the current one) before any message waiting runs, so the agent's context lets go of
    what it held; False when the server is stopping (the session ends anyway)."""

    running: str | None
    restart: Callable[[str], bool]


class AgentRuntime:
    def __init__(
        self,
        settings: Settings,
        *,
        publish: Publish,
        canvas_store: canvas.CanvasStore,
        model_env: ModelEnv,
        memory: AgentMemory | None = None,
        client_factory: ClientFactory | None = None,  # None: the SDK's ClaudeSDKClient
        launch: AgentLaunch | None = None,
        retry_reason: RetryReason | None = None,
        tool_servers: ToolServers | None = None,
        prepare_model: PrepareModel | None = None,
    ) -> None:
        self._settings = settings
        self._tool_servers = tool_servers
        self._model_env = model_env
        self._prepare_model = prepare_model
        self._retry_reason = retry_reason
        self._launch = launch or AgentLaunch(settings.layout)
        self._publish = publish
        self._canvas = canvas_store
        self._memory = memory
        self._client_factory = client_factory
        self._guard = ToolGuard(settings.layout)
        self._inbox = Inbox()
        self._taken = TakenIds()  # the client ids of the messages taken: none runs twice (agent/taken.py)
        # The ids of the commands an earlier run took are known: memory on, and its record read at start.
        self.knows_commands = False
        self._wake = asyncio.Event()  # set when the inbox gets a command, or the last hold on turns ends
        self._holds = 0  # holding_turns under way: no turn starts
        self._unheld = asyncio.Event()  # set while no hold is under way: a started turn's auto-recall waits for it
        self._unheld.set()
        self._recall_done = asyncio.Event()  # clear while a turn's auto-recall runs: a hold waits for it
        self._recall_done.set()
        self._held: tuple[str, float] | None = None  # the turn waiting for them, since when (monotonic)
        self._cli: AgentProcess | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: Turn | None = None
        self._record: TurnRecord = NoRecord()  # the running turn's record: it hears who stopped the turn
        self._prompted: _Prompted | None = None  # for the running turn, kept for a resend
        self._notes: list[str] = []  # for the next turn's context: what the person did meanwhile (uploads)
        self._turn = TurnState()
        self._session = SessionState()
        self._costs = CostMeter()
        self.health = AgentHealth()
        self.session_id = new_session_id()

    # ------------------------------------------------------------ called by the gateway

    async def start(self) -> None:
        if self._memory is not None:  # the messages an earlier run took: a restart runs none of them again
            try:
                self._taken.seed(Taken(t.client_id, t.session_id, t.turn_id)
                                 for t in await self._memory.taken_messages(TAKEN_LIMIT))
                self.knows_commands = True
            except Exception as exc:  # the record unreadable: only this run's messages are known
                log.error("taken_ids_unread", error=repr(exc)[:300])
        self._task = asyncio.create_task(self._run(), name="agent-runtime")
        self._begin_session()

    def submit(self, text: str, client_id: str | None = None) -> None:
        """Queue a message. AlreadyTaken: its client id names a message taken already (never run twice)."""
        self._refuse_if_closing()
        if client_id is not None and (taken := self._taken.get(client_id)) is not None:
            raise AlreadyTaken("the agent took this message already: it is not run again",
                               taken.session_id, taken.turn_id)
        if self._inbox.messages() >= p.MAX_QUEUED_MESSAGES:
            raise QueueFull(f"{p.MAX_QUEUED_MESSAGES} messages are already waiting for the agent")
        turn = Turn(text, client_id)
        self._put(turn)
        if client_id is not None:
            self._taken.add(Taken(client_id, turn_id=turn.turn_id))
        if self._memory is not None:  # its auto-recall's embedding is made while the turn starts
            self._memory.message_arrived(text, self.session_id)

    def new_session(self) -> None:
        self._refuse_if_closing()
        self._put(PERSONS_NEW_SESSION)

    @contextlib.asynccontextmanager
    async def holding_turns(self) -> AsyncIterator[TurnHold]:
        """No turn starts until this exits (a forget takes words out of the transcript and search);
        a message sent meanwhile stays queued. The turn running already, if any, goes on: the holder
        decides whether that makes it busy (`TurnHold.running`, fixed while it holds). A turn that began
        before the hold (its CLI booting) takes its auto-recall only once the hold ends, and one under way
        as it begins ends first: the holder then sees what it brought (memory's `recalled`)."""
        self._holds += 1
        self._unheld.clear()
        try:
            await self._recall_done.wait()
            yield TurnHold(self.turn_id, self._restart_first)
        finally:
            self._holds -= 1
            if not self._holds:
                self._unheld.set()
                self._wake.set()

    def _restart_first(self, session_id: str) -> bool:
        try:
            self._refuse_if_closing()
        except ShuttingDown:
            return False
        self._inbox.put_first(EndSession("forget", session_id))
        self._wake.set()
        return True

    def note(self, text: str) -> None:
        """Something the person did outside the conversation (an upload): the agent is told with their
        next message, as context before it."""
        self._notes = [*self._notes, text][-MAX_NOTES:]

    def _refuse_if_closing(self) -> None:
        if not self._session.accepting:
            raise ShuttingDown("the server is shutting down; send it again after reconnecting")

    def _put(self, command: Command) -> None:
        if self._inbox.put(command):
            self._wake.set()

    async def interrupt(self, by_server: bool = False) -> bool:
        """Stop the running turn. False when nothing is running. `by_server`: the server is stopping,
        not the person (the record names whoever stopped the turn first)."""
        stop = self._turn.interrupt(by_server)
        if stop in (Stop.AFTER_SEND, Stop.NOW):  # it reaches the CLI: an unsent turn is never recorded
            self._record.interrupted(by_server)
        if stop is Stop.NOW and self._cli is not None:
            await self._cli.interrupt()
        return stop is not Stop.NOTHING

    @property
    def state(self) -> p.AgentState:
        return self._turn.public

    @property
    def turn_id(self) -> str | None:
        return self._running.turn_id if self._running else None

    @property
    def turn_text(self) -> str | None:
        return self._running.text if self._running else None

    @property
    def turn_client_id(self) -> str | None:
        return self._running.client_id if self._running else None

    @property
    def cli_running(self) -> bool:
        return self._cli is not None and not self._cli.exited

    @property
    def queued(self) -> int:
        return len(self._inbox)

    @property
    def waiting(self) -> list[str]:
        """The client ids of the messages still queued for the agent, in order."""
        return self._inbox.waiting()

    async def shutdown(self, grace: float = TURN_GRACE, cli_end: float = CLI_END) -> None:
        """End the running turn cleanly, end the session, and disconnect the CLI: the turn's end (its
        interrupt too) within `grace` seconds; past it the task is cancelled, and the CLI it leaves has
        `cli_end` seconds to disconnect before it is killed."""
        if self._task is None:
            return
        self._session.close()
        self._inbox.clear()  # queued messages were never started, and the server is going away
        self._put(Shutdown())
        try:
            async with asyncio.timeout(grace):
                await self.interrupt(by_server=True)
                await asyncio.shield(self._task)
        except TimeoutError:
            log.error("runtime_shutdown_timeout", grace=round(grace, 1))
            self._task.cancel()  # the task's own end disconnects the CLI (`_run`'s finally)...
            if not (await asyncio.wait({self._task}, timeout=cli_end))[0]:
                self._task.cancel()  # ...and a second cancel, in the disconnect, kills it (process.py)
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._disconnect()
            self._publish(p.SessionEnded(session_id=self.session_id, reason="shutdown"))
            if self._memory is not None:
                self._memory.session_ended(self.session_id, "shutdown")
        except Exception as exc:  # a bug ended the task: the server still stops, memory still flushes
            log.exception("runtime_task_failed", error=repr(exc)[:300])
        self._task = None

    # ------------------------------------------------------------ the owner task

    async def _run(self) -> None:
        try:
            while True:
                try:
                    if await self._step():
                        return
                except Exception as exc:  # a bug, or an error no step expected: the task goes on
                    log.exception("runtime_step_failed", session_id=self.session_id, error=repr(exc)[:300])
        finally:
            await self._disconnect()

    async def _step(self) -> bool:
        """Take the next command and do it. True: shut down."""
        try:
            command = await self._next_command()
        except TimeoutError:
            await self._end_session("idle")
            return False
        if command is None:
            await self._try_start()
            return False
        if isinstance(command, Shutdown):
            self._inbox.take()
            await self._end_session("shutdown", restart=False)
            return True
        if isinstance(command, EndSession):
            self._inbox.take()
            await self._new_session(command)
            return False
        # A message stays queued (interrupt, shutdown and `queued` see it) while turns are held, and
        # each step below that awaits looks again, for a hold that began meanwhile.
        if not await self._may_start(command):
            return False
        if self._cli is not None and self._cli.exited:
            await self._cli_lost()
            return False
        self._held = None
        self._inbox.take()
        await self._run_turn(command)  # running at once: no await between the check and the start
        return False

    async def _may_start(self, turn: Turn) -> bool:
        """False: turns are held; wait until the hold ends or the inbox changes, then look again. A
        message held over TURN_HOLD_LIMIT runs anyway."""
        if not self._holds:
            return True
        now = time.monotonic()
        if self._held is None or self._held[0] != turn.turn_id:
            self._held = (turn.turn_id, now)
        left = TURN_HOLD_LIMIT - (now - self._held[1])
        if left <= 0:
            log.warning("turn_hold_overdue", turn_id=turn.turn_id, limit_s=TURN_HOLD_LIMIT)
            return True
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(left):
                await self._wake.wait()
        return False

    async def _next_command(self) -> Command | None:
        """The next command; None: the agent is failing and it is time to try starting it again.
        TimeoutError: a CLI has been idle for the idle timeout."""
        wait = self._settings.idle_timeout if self._cli is not None else self.health.retry_in(time.monotonic())
        try:
            async with asyncio.timeout(wait):
                while not self._inbox:
                    self._wake.clear()
                    await self._wake.wait()
        except TimeoutError:
            if self._cli is None:
                return None
            raise
        return self._inbox.peek()  # taken when done: a message stays queued until it starts

    async def _try_start(self) -> None:
        """The agent could not start: try again, with no message waiting. Once it starts, the CLI
        serves the next message (or ends at the idle timeout)."""
        try:
            await self._connect()
        except _StartFailed:
            await self._disconnect()

    async def _run_turn(self, turn: Turn) -> None:
        self._running = turn
        started = time.monotonic()
        self._turn.begin(connect=self._cli is None)
        self._publish(p.TurnStarted(turn_id=turn.turn_id, text=turn.text, client_id=turn.client_id))
        log.info("turn_started", turn_id=turn.turn_id, session_id=self.session_id, chars=len(turn.text))
        # Never closed if the turn ends unsent: nothing happened, so nothing is recorded.
        record = self._record = (self._memory.turn_started(turn.text, turn.turn_id, turn.client_id)
                                 if self._memory is not None else NoRecord())
        try:
            result = await self._exchange(turn, record)
        except asyncio.CancelledError:  # shutdown ran out of patience: the prompt is still worth a record
            record.interrupted(by_server=True)  # unless the person had stopped it first
            record.close(None)
            raise
        except Exception as exc:
            record.close(None, repr(exc))
            await self._turn_failed(turn, started, exc, record)
        else:
            if result is None:  # interrupted while the CLI was starting: never sent
                self._publish(frames.ended_frame(turn.turn_id, "interrupted", _ms_since(started),
                                                 by_server=self._turn.by_server))
            else:
                out = frames.result_frames(turn.turn_id, result, interrupted=self._turn.interrupted, cost=turn.cost,
                                           by_server=self._turn.by_server)
                record.close(result, cost_usd=turn.cost.turn if turn.cost is not None else None)
                if not await self._saved(turn, record):
                    out = [msgspec.structs.replace(f, saved=False) if isinstance(f, p.TurnComplete) else f
                           for f in out]
                self._publish_result(turn, result, out)
        finally:
            self._running, self._record = None, NoRecord()
            self._turn.end()
            if self._memory is not None:  # however it ended: recorded, unsent, a slash command, failed
                self._memory.turn_ended()

    async def _saved(self, turn: Turn, record: TurnRecord) -> bool:
        """Durable, then acknowledged: turn_complete waits until the closed turn is on disk. When it
        can't be (the disk is full, read-only, failing), the person is told so beside it (False:
        its turn_complete says `saved: false`)."""
        self._turn.saving()
        if await record.durable():
            return True
        log.warning("turn_not_saved", turn_id=turn.turn_id, session_id=self.session_id)
        self._publish(p.Error(code="not_saved", turn_id=turn.turn_id, message=NOT_SAVED))
        return False

    async def _exchange(self, turn: Turn, record: TurnRecord) -> ResultMessage | None:
        """Send the prompt and stream the reply: the result, or None if interrupted before sending.

        A CLI that died after the last turn, too recently for _run to see its exit, swallows the
        prompt (a write to a dying pipe can succeed) and fails, or ends the stream, before saying
        anything. Nothing of the turn happened, so it is sent once more, to a fresh CLI, unless
        the person interrupted it or the server is stopping meanwhile."""
        await load_sdk()  # its names below, and the CLI's start, find it imported
        from claude_agent_sdk import CLIConnectionError, ProcessError

        reused = self._cli is not None
        try:
            return await self._attempt(turn, record)
        except (CLIConnectionError, ProcessError, _NoResult):
            if not (reused and self._turn.may_resend and self._session.accepting):
                raise
        self._turn.resend()
        await self._cli_lost()
        return await self._attempt(turn, record)

    async def _attempt(self, turn: Turn, record: TurnRecord) -> ResultMessage | None:
        from claude_agent_sdk import ResultMessage

        if self._turn.stopped_unsent:  # stopped before a CLI's start began (the SDK's import on a fresh
            return None  # server's first turn, a resend's wait): it ends unsent, no CLI started
        self._session.turn_ran()
        if self._turn.phase is TurnPhase.STARTING:
            self._refuse_if_failing()
            await self._connect()
            if not self._turn.connected():
                return None
        cli = self._cli
        assert cli is not None
        context = await self._recalled(turn)
        if self._turn.stopped_unsent:  # stopped while auto-recall looked (or waited for a forget's end):
            return None  # nothing is written yet, so the turn ends unsent, as in a CLI's start
        await cli.send(turn.text, context)
        if self._turn.sent():  # interrupted while the prompt was written: only now can the CLI act on it
            await cli.interrupt()
        result: ResultMessage | None = None
        async for message in cli.replies():
            self._turn.heard()
            record.observe(message)
            if isinstance(message, ResultMessage):
                result = message  # its frames wait until the turn is durable (_run_turn)
                turn.cost = self._costs.charge(message.total_cost_usd)
            else:
                self._publish_message(turn, message)
        if result is None:  # the stream ended early: the CLI exited (with status 0) under the turn
            raise _NoResult("the CLI ended the turn without a result")
        return result

    async def _recalled(self, turn: Turn) -> str | None:
        """The context sent before the person's message: what they did meanwhile (the notes), then
        the memories auto-recall found for `turn` in the session it goes to. A resend goes to a fresh
        session: the notes go the same, and auto-recall looks again, for that session, so that memory
        knows what its context holds (a forget of a recalled turn then restarts it) and a forget begun
        meanwhile is waited for. Capture records the message alone."""
        if self._prompted is None or self._prompted.turn_id != turn.turn_id:
            notes, self._notes = self._notes, []
            said = "\n".join(f"- {n}" for n in notes)
            told = f"Since the last message, outside this conversation:\n{said}" if notes else None
            self._prompted = _Prompted(turn.turn_id, None, told, None)
        prompted = self._prompted
        if prompted.session_id != self.session_id:
            recalled = None
            if self._memory is not None:
                await self._recall_unheld(turn)
                self._recall_done.clear()  # no await since the look: a hold that begins now waits for it
                try:
                    recalled = await self._memory.recall_for(turn.text, self.session_id, turn.turn_id)
                finally:
                    self._recall_done.set()
            if recalled is not None:
                self._publish(frames.recall_frame(turn.turn_id, recalled))
            context = "\n\n".join(x for x in (prompted.told, recalled.context if recalled is not None else None) if x) or None
            self._prompted = prompted._replace(session_id=self.session_id, context=context)
        return self._prompted.context

    async def _recall_unheld(self, turn: Turn) -> None:
        """A forget that began after this turn did (its CLI was booting) holds turns: the turn's auto-recall
        waits until it ends, so it never brings the words being taken out, at most TURN_HOLD_LIMIT (as a
        message waiting to start does)."""
        if self._unheld.is_set():
            return
        try:
            async with asyncio.timeout(TURN_HOLD_LIMIT):
                await self._unheld.wait()
        except TimeoutError:
            log.warning("turn_hold_overdue", turn_id=turn.turn_id, limit_s=TURN_HOLD_LIMIT, step="auto_recall")

    def _publish_message(self, turn: Turn, message: Message) -> None:
        from claude_agent_sdk import SystemMessage

        out = frames.message_frames(turn.turn_id, message, interrupted=self._turn.interrupted)
        if out and isinstance(out[0], p.ModelRetry) and out[0].error_status == 429 and self._retry_reason:
            if reason := self._retry_reason():  # the Sprite's own rate, not the proxy's: say so
                out = [msgspec.structs.replace(out[0], error=reason[:frames.ERROR_DETAIL_CHARS])]
        for frame in out:
            self._publish(frame)
        if isinstance(message, SystemMessage) and message.subtype == "compact_boundary":
            log.info("context_compacted", session_id=self.session_id,
                     trigger=message.data.get("compact_metadata", {}).get("trigger"))

    def _publish_result(self, turn: Turn, result: ResultMessage, out: list[p.ServerFrame]) -> None:
        for frame in out:
            self._publish(frame)
            if isinstance(frame, p.Error):  # the CLI's error text, not the person's words: a warning
                log.warning("turn_error", turn_id=turn.turn_id, code=frame.code, detail=frame.message)
            elif isinstance(frame, p.TurnComplete):
                log.info("turn_complete", turn_id=turn.turn_id, status=frame.status,
                         duration_ms=result.duration_ms, cost_usd=frame.cost_usd, turns=result.num_turns)

    async def _cli_lost(self) -> None:
        """The CLI exited between turns: tell clients, as for a crash mid-turn, and end its session."""
        pid, returncode = (self._cli.pid, self._cli.returncode) if self._cli is not None else (None, None)
        log.error("cli_exited_between_turns", session_id=self.session_id, pid=pid, returncode=returncode)
        self._publish(p.Error(code="agent_failed",
                              message="The agent stopped while idle; your message goes to a fresh session."))
        await self._end_session("crash")

    async def _turn_failed(self, turn: Turn, started: float, exc: Exception, record: TurnRecord) -> None:
        if isinstance(exc, _StartFailed):  # no CLI ran: the session stays as it was
            self._publish(p.Error(code="agent_failed", turn_id=turn.turn_id,
                                  message=f"The agent cannot start: {self.health.reason}. Sprite OS tries again "
                                          "on its own; send your message again in a moment."))
            saved = await self._saved(turn, record)
            self._publish(frames.ended_frame(turn.turn_id, "error", _ms_since(started), saved))
            await self._disconnect()
            return
        log.error("turn_failed", turn_id=turn.turn_id, session_id=self.session_id, error=repr(exc))
        self._publish(p.Error(code="agent_failed", turn_id=turn.turn_id,
                              message="The agent stopped unexpectedly; your next message starts a fresh session."))
        saved = await self._saved(turn, record)
        self._publish(frames.ended_frame(turn.turn_id, "error", _ms_since(started), saved))
        await self._end_session("crash")

    # ------------------------------------------------------------ sessions and the CLI

    def _begin_session(self) -> None:
        self._session.began()
        self._costs.new_session()
        self._publish(p.SessionStarted(session_id=self.session_id))
        if self._memory is not None:
            self._memory.session_started(self.session_id)

    async def _new_session(self, command: EndSession) -> None:
        if command.session_id is not None and command.session_id != self.session_id:
            return  # a forget's restart of a session that has ended already
        if not self._session.worth_ending:  # already fresh: ending it would only churn clients and memory
            log.info("new_session_skipped", session_id=self.session_id)
            return
        await self._end_session(command.reason)

    async def _end_session(self, reason: p.SessionEndReason, restart: bool = True) -> None:
        had_cli = self._cli is not None
        await self._disconnect()
        if not had_cli and reason == "idle":
            return
        ended = self.session_id
        self._publish(p.SessionEnded(session_id=ended, reason=reason))
        if self._memory is not None:
            self._memory.session_ended(ended, reason)
        log.info("session_ended", session_id=ended, reason=reason)
        if restart:
            self.session_id = new_session_id()
            self._begin_session()

    def _refuse_if_failing(self) -> None:
        """A message while the agent is known to be failing, before its next attempt is due, is
        answered at once: the runtime tries again on its own (_try_start), not per message."""
        wait = self.health.retry_in(time.monotonic())
        if wait is not None and wait > 0 and self.health.reason is not None:
            raise _StartFailed(self.health.reason)

    async def _connect(self) -> None:
        """Start the agent's CLI. _StartFailed: it could not be started (the agent is failing).

        A disk that can't take the boot prompt is found before memory is waited for (a new
        session waits up to 15 s for the last batch); and while the agent is failing, a start
        does not wait for memory at all: it boots with what memory holds, so that nothing (no
        message, no retry) waits on memory only to find the agent still cannot start."""
        started = time.monotonic()
        try:
            await load_sdk()  # before _options, which builds the SDK's options (a retry's start comes here first)
            if self._prepare_model is not None:
                await self._prepare_model()  # the relay's client, made in a thread: not on the loop
            await asyncio.to_thread(_check_writable, self._launch.prompt_file)
            settle = not self.health.failed
            prompt = await self._memory.boot_prompt(settle) if self._memory is not None else DEFAULT_PROMPT
            system_prompt = await asyncio.to_thread(self._launch.write_prompt, prompt)
            # Owned from before connect: a connect that fails half-way still gets its process ended.
            self._cli = cli = AgentProcess(self._options(system_prompt), self._client_factory)
            self._costs.new_process()  # its running total starts from zero
            await cli.connect()
        except Exception as exc:  # a disk, a CLI missing or failing at its start, memory: not this turn's fault
            reason = _reason(exc)
            delay = self.health.start_failed(reason, time.monotonic(), time.time(), random.random())
            log.error("agent_start_failed", reason=reason, failures=self.health.failures, retry_in_s=round(delay, 1))
            raise _StartFailed(reason) from exc
        if self.health.started():
            log.info("agent_recovered", session_id=self.session_id)
        log.info("cli_connected", session_id=self.session_id, seconds=round(time.monotonic() - started, 3),
                 pid=cli.pid, prompt_chars=len(prompt), isolation=self._launch.mode)

    def _options(self, system_prompt: Any) -> ClaudeAgentOptions:
        """The one place the agent's capabilities are decided: tools, hooks, MCP servers."""
        from claude_agent_sdk import ClaudeAgentOptions, HookMatcher

        mcp: dict[str, Any] = {canvas.SERVER_NAME: canvas.canvas_server(self._canvas)}
        if self._tool_servers is not None:  # memory's search_memory: the composition root builds it
            mcp.update(self._tool_servers())
        hooks: dict[Any, list[HookMatcher]] = {
            "PreToolUse": [HookMatcher(matcher=GUARDED_TOOLS, hooks=[self._guard.hook])],
        }
        if self._memory is not None:
            for event, matchers in self._memory.hooks().items():
                hooks.setdefault(event, []).extend(matchers)  # added to the guard's, never in its place
        return ClaudeAgentOptions(
            system_prompt=system_prompt,
            cwd=str(self._settings.layout.root),
            setting_sources=[],
            tools=list(BUILTIN_TOOLS),
            # "mcp__<server>" approves every tool of that in-process server.
            allowed_tools=[*BUILTIN_TOOLS, *(f"mcp__{server}" for server in mcp)],
            mcp_servers=mcp,
            hooks=hooks,
            include_partial_messages=True,
            model=self._settings.agent_model,
            env={**cli_environment(os.environ, {**self._model_env(), **self._side_models()}), **self._launch.env()},
            cli_path=self._launch.cli_path(),
            settings=self._launch.settings(),
            # The CLI keeps no transcript of its own (~/.claude/projects): memory keeps the record.
            extra_args={"no-session-persistence": None},
            stderr=_log_cli_stderr,
            max_buffer_size=MAX_CLI_MESSAGE_BYTES,
        )

    def _side_models(self) -> dict[str, str]:
        """The small model the CLI uses for side jobs (WebFetch's summaries), named, so the relay's
        allow-list (Settings.agent_limits) lets it through: the memory model, a small one."""
        small = self._settings.memory_model
        return {"ANTHROPIC_SMALL_FAST_MODEL": small, "ANTHROPIC_DEFAULT_HAIKU_MODEL": small}

    async def _disconnect(self) -> None:
        cli, self._cli = self._cli, None
        if cli is not None:
            try:
                await cli.close()
            finally:
                self._launch.discard_prompt()  # a small unlink: done in place, even when cancelled


def _check_writable(path: Path) -> None:
    """OSError(EROFS) when `path`'s file system is read-only (an I/O error remounts it so): known
    from its flags, without writing anything."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:  # made at the write, if it must be
        folder = folder.parent
    if os.statvfs(folder).f_flag & os.ST_RDONLY:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


def _reason(exc: BaseException) -> str:
    """Why the agent could not start, for /healthz and the person: the error, without a traceback."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}{where}"[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def _log_cli_stderr(line: str) -> None:
    log.debug("cli_stderr", line=line[:500])
