"""The agent runtime: one Claude Code CLI per agent session, driven by one task.

`AgentRuntime` owns the `ClaudeSDKClient`. Every connect, query and disconnect
happens in its owner task, fed by a queue; only `interrupt` comes from outside,
as the SDK documents. The runtime turns SDK messages into protocol frames and
publishes them; it tells the memory system where sessions and turns begin and end.

A session is one CLI process and one context. It starts lazily at the first
message and ends on `new_session`, after an idle timeout, at shutdown, or when
the CLI fails; the next message then starts a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKClient,
    CLIConnectionError,
    HookMatcher,
    ProcessError,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)
from claude_agent_sdk.types import McpSdkServerConfig

from . import protocol as p
from .config import Settings
from .errors import QueueFull, ShuttingDown
from .guard import MATCHER as GUARDED_TOOLS
from .guard import WriteGuard
from .logs import get_logger
from .text import clean_text
from .tools import canvas

log = get_logger(__name__)

# Built-in tools the agent may use, all pre-approved. Anything else is invisible to it.
BUILTIN_TOOLS = ("Read", "Write", "Edit", "NotebookEdit", "Bash", "WebFetch")
MAX_QUEUED_MESSAGES = 16
SUMMARY_CHARS = 300
DISCONNECT_TIMEOUT = 10.0
# One message from the CLI can be large (a long answer, a big file read); the SDK's 1 MB default
# would fail such a turn with CLIJSONDecodeError.
MAX_CLI_MESSAGE_BYTES = 64 * 1024 * 1024
INTERRUPT_TIMEOUT = 5.0

# Environment for the CLI: offline-safe, no telemetry, MCP tools listed directly
# (not deferred behind ToolSearch), and no path by which the CLI writes memory itself.
CLI_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "ENABLE_TOOL_SEARCH": "false",
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "SPRITE_OS_TOKEN": "",  # the CLI inherits our environment; the agent must not see the server's key
}

DEFAULT_PROMPT = "You are the agent of a Sprite: a small computer that belongs to one person."

Publish = Callable[[p.ServerFrame], None]


class AgentMemory(Protocol):
    """What the runtime needs from the memory system (memory/system.py)."""

    def hooks(self) -> dict[Any, list[HookMatcher]]: ...
    def mcp_servers(self) -> dict[str, McpSdkServerConfig]: ...
    async def boot_prompt(self) -> str: ...
    def session_started(self, session_id: str) -> None: ...
    def session_ended(self, session_id: str, reason: str) -> None: ...
    def turn_finished(self, prompt: str, result: ResultMessage | None, error: str | None) -> None: ...


# How the CLI reports a model proxy it could not reach at all (no HTTP status to go by).
_UNREACHABLE = re.compile(r"ECONNREFUSED|ENOTFOUND|ETIMEDOUT|ECONNRESET|EAI_AGAIN|Connection refused|"
                          r"Can't reach the API|Unable to connect", re.IGNORECASE)


class _NoResult(Exception):
    """The CLI ended a turn's stream without a result: it exited under the turn."""


@dataclass
class _Turn:
    text: str
    client_id: str | None
    turn_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


@dataclass
class _EndSession:
    reason: str


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A short, single-line rendering of a tool's input or output, for clients."""
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in value):
        value = "\n".join(b.get("text", "") for b in value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(clean_text(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def new_session_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


class AgentRuntime:
    def __init__(
        self,
        settings: Settings,
        *,
        publish: Publish,
        canvas_store: canvas.CanvasStore,
        memory: AgentMemory | None = None,
        client_factory: Callable[[ClaudeAgentOptions], ClaudeSDKClient] = ClaudeSDKClient,
    ) -> None:
        self._settings = settings
        self._publish = publish
        self._canvas = canvas_store
        self._memory = memory
        self._client_factory = client_factory
        self._guard = WriteGuard(settings.layout)
        self._queue: asyncio.Queue[_Turn | _EndSession | None] = asyncio.Queue()
        self._client: ClaudeSDKClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._turn: _Turn | None = None
        self._interrupted = False
        self._heard = False  # the CLI said something about the running turn
        self._sending = False  # the prompt is being written to the CLI
        self._closing = False  # set by shutdown: frames that would start work are refused
        self._session_had_turn = False  # a new_session on a session with no turn changes nothing
        self._new_session_last = False  # the queue's tail is a new_session: another adds nothing
        self.session_id = new_session_id()
        self.state: p.AgentState = "idle"

    # ------------------------------------------------------------ called by the gateway

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="agent-runtime")
        self._begin_session()

    def submit(self, text: str, client_id: str | None = None) -> None:
        self._refuse_if_closing()
        if self._queue.qsize() >= MAX_QUEUED_MESSAGES:
            raise QueueFull(f"{MAX_QUEUED_MESSAGES} messages are already waiting for the agent")
        self._queue.put_nowait(_Turn(text, client_id))
        self._new_session_last = False

    def new_session(self) -> None:
        self._refuse_if_closing()
        if not self._new_session_last:  # back-to-back requests are one request: the queue stays bounded
            self._queue.put_nowait(_EndSession("new_session"))
            self._new_session_last = True

    def _refuse_if_closing(self) -> None:
        if self._closing:
            raise ShuttingDown("the server is shutting down; send it again after reconnecting")

    async def interrupt(self) -> bool:
        """Stop the running turn. False when nothing is running."""
        client, turn = self._client, self._turn
        if turn is None or self.state not in ("starting", "running"):
            return False
        self._interrupted = True
        self.state = "stopping"
        if client is None:  # still starting: the turn ends as soon as the CLI is up, unsent
            return True
        if self._sending:  # the prompt is being written: _send interrupts right after it, not before
            return True
        await self._interrupt_cli(client, turn)
        return True

    @staticmethod
    async def _interrupt_cli(client: ClaudeSDKClient, turn: _Turn) -> None:
        try:
            await asyncio.wait_for(client.interrupt(), INTERRUPT_TIMEOUT)
        except Exception as exc:  # the CLI may already be gone; the turn ends either way
            log.warning("interrupt_failed", turn_id=turn.turn_id, error=repr(exc))

    @property
    def turn_id(self) -> str | None:
        return self._turn.turn_id if self._turn else None

    @property
    def cli_running(self) -> bool:
        return self._client is not None and not cli_exited(self._client)

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    async def shutdown(self, grace: float = 30.0) -> None:
        """End the running turn cleanly, end the session, and disconnect the CLI."""
        if self._task is None:
            return
        self._closing = True
        # Drop queued messages: they were never started, and the server is going away.
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)
        if self._turn is not None:
            await self.interrupt()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace)
        except TimeoutError:
            log.error("runtime_shutdown_timeout", grace=grace)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            await self._disconnect()
            self._publish(p.SessionEnded(session_id=self.session_id, reason="shutdown"))
            if self._memory is not None:
                self._memory.session_ended(self.session_id, "shutdown")
        self._task = None

    # ------------------------------------------------------------ the owner task

    async def _run(self) -> None:
        try:
            while True:
                timeout = self._settings.idle_timeout if self._client is not None else None
                try:
                    cmd = await asyncio.wait_for(self._queue.get(), timeout)
                except TimeoutError:
                    await self._end_session("idle")
                    continue
                if self._queue.empty():
                    self._new_session_last = False
                if cmd is None:
                    await self._end_session("shutdown", restart=False)
                    return
                if isinstance(cmd, _EndSession):
                    await self._new_session()
                else:
                    if self._client is not None and cli_exited(self._client):
                        await self._cli_lost()
                    await self._run_turn(cmd)
        finally:
            await self._disconnect()

    async def _run_turn(self, turn: _Turn) -> None:
        self._turn, self._interrupted = turn, False
        started = time.monotonic()
        self._publish(p.TurnStarted(turn_id=turn.turn_id, text=turn.text, client_id=turn.client_id))
        log.info("turn_started", turn_id=turn.turn_id, session_id=self.session_id, chars=len(turn.text))
        result: ResultMessage | None = None
        try:
            result = await self._exchange(turn, started)
            if result is None:  # interrupted before it was sent
                return
        except asyncio.CancelledError:  # shutdown ran out of patience: the prompt is still worth a record
            if self._memory is not None:
                self._memory.turn_finished(turn.text, None, "the server shut down before the turn ended")
            raise
        except Exception as exc:
            await self._turn_failed(turn, started, exc)
        else:
            if self._memory is not None:
                self._memory.turn_finished(turn.text, result, None)
        finally:
            self._turn = None
            self.state = "idle"

    async def _exchange(self, turn: _Turn, started: float) -> ResultMessage | None:
        """Send the prompt and stream the reply: the result, or None if interrupted before sending.

        A CLI that died after the last turn, too recently for _run to see its exit, swallows the
        prompt (a write to a dying pipe can succeed) and fails, or ends the stream, before saying
        anything. Nothing of the turn happened, so it is sent once more, to a fresh CLI, unless
        the person interrupted it or the server is stopping meanwhile."""
        reused = self._client is not None
        try:
            return await self._attempt(turn, started)
        except (CLIConnectionError, ProcessError, _NoResult):
            if not reused or self._heard or self._interrupted or self._closing:
                raise
        await self._cli_lost()
        return await self._attempt(turn, started)

    async def _attempt(self, turn: _Turn, started: float) -> ResultMessage | None:
        self._heard = False  # whether the CLI said anything about this turn
        self._session_had_turn = True  # set per attempt: a resend runs in a new session
        if not await self._send(turn, started):
            return None
        assert self._client is not None
        result: ResultMessage | None = None
        async for message in self._client.receive_response():
            self._heard = True
            if isinstance(message, ResultMessage):
                result = message
            self._translate(turn, message)
        if result is None:  # the stream ended early: the CLI exited (with status 0) under the turn
            raise _NoResult("the CLI ended the turn without a result")
        return result

    async def _send(self, turn: _Turn, started: float) -> bool:
        if self._client is None:
            self.state = "starting"
            await self._connect()
        assert self._client is not None
        if self._interrupted:  # interrupted while the CLI was starting: never sent
            self._publish(p.TurnComplete(turn_id=turn.turn_id, status="interrupted",
                                         duration_ms=int((time.monotonic() - started) * 1000), usage=p.Usage()))
            return False
        self.state = "running"
        # An interrupt that reached the CLI before the prompt would stop nothing, and the turn
        # would run to its end: one arriving while the prompt is written is sent after it.
        self._sending = True
        try:
            await self._client.query(turn.text)
        finally:
            self._sending = False
        if self._interrupted:
            await self._interrupt_cli(self._client, turn)
        return True

    async def _cli_lost(self) -> None:
        """The CLI exited between turns: tell clients, as for a crash mid-turn, and end its session."""
        log.error("cli_exited_between_turns", session_id=self.session_id, pid=cli_pid(self._client),
                  returncode=cli_returncode(self._client))
        self._publish(p.Error(code="agent_failed",
                              message="The agent stopped while idle; your message goes to a fresh session."))
        await self._end_session("crash")

    async def _turn_failed(self, turn: _Turn, started: float, exc: Exception) -> None:
        log.error("turn_failed", turn_id=turn.turn_id, session_id=self.session_id, error=repr(exc))
        self._publish(p.Error(code="agent_failed", turn_id=turn.turn_id,
                              message="The agent stopped unexpectedly; your next message starts a fresh session."))
        self._publish(p.TurnComplete(turn_id=turn.turn_id, status="error",
                                     duration_ms=int((time.monotonic() - started) * 1000), usage=p.Usage()))
        if self._memory is not None:
            self._memory.turn_finished(turn.text, None, repr(exc))
        await self._end_session("crash")

    def _translate(self, turn: _Turn, message: Any) -> None:
        """SDK message -> protocol frames. Sub-agent traffic (parent_tool_use_id) is not streamed."""
        tid = turn.turn_id
        if isinstance(message, StreamEvent):
            event = message.event
            if (message.parent_tool_use_id is None and event.get("type") == "content_block_delta"
                    and event.get("delta", {}).get("type") == "text_delta"):
                self._publish(p.TextDelta(turn_id=tid, text=clean_text(event["delta"].get("text", ""))))
        elif isinstance(message, AssistantMessage):
            if message.parent_tool_use_id is not None:
                return
            text = clean_text("".join(b.text for b in message.content if isinstance(b, TextBlock)))
            if text:
                self._publish(p.AssistantMessage(turn_id=tid, text=text))
            for block in message.content:
                if isinstance(block, ToolUseBlock):
                    self._publish(p.ToolUse(turn_id=tid, tool_use_id=block.id, name=clean_text(block.name),
                                            summary=summarize(block.input)))
        elif isinstance(message, UserMessage) and isinstance(message.content, list):
            for block in message.content:
                if isinstance(block, ToolResultBlock):
                    self._publish(p.ToolResult(turn_id=tid, tool_use_id=block.tool_use_id,
                                               is_error=bool(block.is_error), summary=summarize(block.content)))
        elif isinstance(message, ResultMessage):
            self._publish_result(turn, message)
        elif isinstance(message, SystemMessage) and message.subtype == "compact_boundary":
            log.info("context_compacted", session_id=self.session_id,
                     trigger=message.data.get("compact_metadata", {}).get("trigger"))

    def _publish_result(self, turn: _Turn, result: ResultMessage) -> None:
        usage = result.usage or {}
        status: p.TurnStatus = "completed"
        if self._interrupted:
            status = "interrupted"
        elif result.is_error:
            status = "error"
            detail = clean_text("; ".join(result.errors or []) or result.result or result.subtype)[:300]
            if result.api_error_status:
                code, message = "model_unavailable", f"The model proxy answered HTTP {result.api_error_status}: {detail}"
            elif _UNREACHABLE.search(detail):
                code, message = "model_unavailable", f"The model proxy could not be reached: {detail}"
            else:
                code, message = "agent_failed", f"The turn failed: {detail}"
            # The CLI's error text, not the person's words: fit for a warning, so operators see why.
            log.warning("turn_error", turn_id=turn.turn_id, code=code, detail=detail)
            self._publish(p.Error(code=code, turn_id=turn.turn_id, message=message))
        self._publish(p.TurnComplete(
            turn_id=turn.turn_id,
            status=status,
            duration_ms=result.duration_ms,
            usage=p.Usage(**{k: int(usage.get(k) or 0) for k in p.Usage.__struct_fields__}),
            cost_usd=result.total_cost_usd,
        ))
        log.info("turn_complete", turn_id=turn.turn_id, status=status, duration_ms=result.duration_ms,
                 cost_usd=result.total_cost_usd, turns=result.num_turns)

    # ------------------------------------------------------------ sessions and the CLI

    def _begin_session(self) -> None:
        self._session_had_turn = False
        self._publish(p.SessionStarted(session_id=self.session_id))
        if self._memory is not None:
            self._memory.session_started(self.session_id)

    async def _new_session(self) -> None:
        if not self._session_had_turn:  # already fresh: ending it would only churn clients and memory
            log.info("new_session_skipped", session_id=self.session_id)
            return
        await self._end_session("new_session")

    async def _end_session(self, reason: str, restart: bool = True) -> None:
        had_cli = self._client is not None
        await self._disconnect()
        if not had_cli and reason == "idle":
            return
        ended = self.session_id
        self._publish(p.SessionEnded(session_id=ended, reason=reason))  # type: ignore[arg-type]
        if self._memory is not None:
            self._memory.session_ended(ended, reason)
        log.info("session_ended", session_id=ended, reason=reason)
        if restart:
            self.session_id = new_session_id()
            self._begin_session()

    async def _connect(self) -> None:
        prompt = await self._memory.boot_prompt() if self._memory is not None else DEFAULT_PROMPT
        client = self._client_factory(self._options(prompt))
        started = time.monotonic()
        await client.connect()
        self._client = client
        log.info("cli_connected", session_id=self.session_id, seconds=round(time.monotonic() - started, 3),
                 pid=cli_pid(client), prompt_chars=len(prompt))

    def _options(self, system_prompt: str) -> ClaudeAgentOptions:
        """The one place the agent's capabilities are decided: tools, hooks, MCP servers."""
        mcp: dict[str, Any] = {canvas.SERVER_NAME: canvas.canvas_server(self._canvas)}
        hooks: dict[Any, list[HookMatcher]] = {
            "PreToolUse": [HookMatcher(matcher=GUARDED_TOOLS, hooks=[self._guard.hook])],
        }
        if self._memory is not None:
            mcp.update(self._memory.mcp_servers())
            hooks.update(self._memory.hooks())
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
            env={**self._settings.model_env(), **CLI_ENV},
            stderr=_log_cli_stderr,
            max_buffer_size=MAX_CLI_MESSAGE_BYTES,
        )

    async def _disconnect(self) -> None:
        """Disconnect the CLI; if that hangs (SDK #378, #886), kill the process."""
        client, self._client = self._client, None
        if client is None:
            return
        pid = cli_pid(client)
        try:
            await asyncio.wait_for(client.disconnect(), DISCONNECT_TIMEOUT)
        except BaseException as exc:
            log.warning("cli_disconnect_failed", pid=pid, error=repr(exc))
            kill_cli(client)
            if isinstance(exc, asyncio.CancelledError):
                raise
        log.info("cli_disconnected", pid=pid)


def _cli_process(client: ClaudeSDKClient | None) -> Any:
    return getattr(getattr(client, "_transport", None), "_process", None)


def cli_pid(client: ClaudeSDKClient | None) -> int | None:
    return getattr(_cli_process(client), "pid", None)


def cli_returncode(client: ClaudeSDKClient | None) -> int | None:
    return getattr(_cli_process(client), "returncode", None)


def cli_exited(client: ClaudeSDKClient) -> bool:
    """True once the CLI's process has exited: it may have crashed while idle."""
    return cli_returncode(client) is not None


def kill_cli(client: ClaudeSDKClient) -> None:
    process = _cli_process(client)
    if process is not None and getattr(process, "returncode", 0) is None:
        with contextlib.suppress(ProcessLookupError, OSError):
            process.kill()


def _log_cli_stderr(line: str) -> None:
    log.debug("cli_stderr", line=line[:500])

