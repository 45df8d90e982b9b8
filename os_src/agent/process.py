"""One Claude Code CLI process, as the runtime drives it: connect, prompt, replies, interrupt, close.

It is the only module that reaches into the SDK's private parts: the SDK gives no public
way to read the CLI's pid or exit status, or to kill a CLI whose `disconnect` hangs
(its `disconnect` can wait forever on a CLI that does not exit), nor to find the CLI it bundles (`bundled_cli`, which user
isolation copies where the agent's user can run it). If a new SDK moves `_transport._process`, `pid` and
`returncode` read None and `kill` does nothing; the runtime still works, blind to an
idle CLI's death until its next write fails (that prompt is then resent once).

Each CLI is recorded in its workspace's ledger (agent/ledger.py: the CLI runs in the
workspace root, `options.cwd`) from the moment its pid is known until it is closed, so a
server killed with -9 leaves the next start a record of the CLI to end.

In `user` isolation the process is the launcher (isolation/launch.py): root, holding the CLI in a pid
namespace of its own, so killing it ends the CLI and everything the CLI started, and a server
killed with -9 takes it along (a parent-death signal); the ledger is then only a backstop.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..logs import get_logger
from .ledger import CliLedger

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, Message

log = get_logger(__name__)

ClientFactory = Callable[["ClaudeAgentOptions"], "ClaudeSDKClient"]

DISCONNECT_TIMEOUT = 10.0
INTERRUPT_TIMEOUT = 5.0
SPAWN_POLL = 0.01  # while connecting: how often to look for the new CLI's pid, to record it
EXIT_POLL = 0.05  # while an interrupt waits for its answer: how often to look whether the CLI exited
EXIT_GRACE = 1.0  # an interrupt the CLI failed: how long its exit may take to show, to tell an exit from a fault


async def load_sdk() -> None:
    """Import the agent SDK, once, on a thread. Its import is a second of CPU (mcp's pydantic types):
    on the event loop, the first turn of every server would hold up every connection meanwhile."""
    if "claude_agent_sdk" not in sys.modules:
        await asyncio.to_thread(importlib.import_module, "claude_agent_sdk")


def bundled_cli() -> Path:
    """The SDK's own CLI (where this SDK version keeps it), or the `claude` on PATH if it bundles none."""
    spec = importlib.util.find_spec("claude_agent_sdk")  # where it is, without importing it
    package = Path(spec.origin).parent if spec is not None and spec.origin else Path("/nonexistent")
    bundled = package / "_bundled" / "claude"
    found = bundled if bundled.is_file() else Path(shutil.which("claude") or bundled)
    return found.resolve()


class AgentProcess:
    """Owns one `ClaudeSDKClient` and the CLI process behind it. Drive it from one task
    (the SDK requires it), except `interrupt`, which the SDK allows from outside."""

    def __init__(self, options: ClaudeAgentOptions, factory: ClientFactory | None = None) -> None:
        if factory is None:
            from claude_agent_sdk import ClaudeSDKClient

            factory = ClaudeSDKClient
        self._client = factory(options)
        self._ledger = CliLedger.for_workspace(Path(options.cwd)) if options.cwd else None
        self._recorded: int | None = None

    async def connect(self) -> None:
        """Start the CLI. Its pid is recorded as soon as it exists, while the SDK still connects."""
        watch = asyncio.create_task(self._record_when_spawned()) if self._ledger is not None else None
        try:
            await self._client.connect()
        finally:
            if watch is not None:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
        await self._record()

    async def _record_when_spawned(self) -> None:
        while self.pid is None:  # noqa: ASYNC110 -- the SDK signals nothing when it spawns the CLI
            await asyncio.sleep(SPAWN_POLL)
        await self._record()

    async def _record(self) -> None:
        pid = self.pid
        if self._ledger is None or pid is None or self._recorded == pid:
            return
        self._recorded = pid
        try:
            await asyncio.to_thread(self._ledger.record, pid)
        except OSError as exc:  # a full disk: the CLI still runs; only a crash's clean-up is at stake
            log.warning("cli_ledger_write_failed", pid=pid, error=repr(exc))

    async def send(self, prompt: str, context: str | None = None) -> None:
        """Send the person's message; `context` (auto-recalled memories) goes before it in the same
        user message as a text block of its own, so the message itself stays as it was typed."""
        if context is None:
            await self._client.query(prompt)
            return
        blocks = [{"type": "text", "text": context}, {"type": "text", "text": prompt}]
        message = {"type": "user", "message": {"role": "user", "content": blocks}, "parent_tool_use_id": None}

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield message

        await self._client.query(one())

    def replies(self) -> AsyncIterator[Message]:
        """The messages about the prompt just sent, through its ResultMessage."""
        return self._client.receive_response()

    async def interrupt(self) -> None:
        """Ask the CLI to stop the running turn. Never raises: the CLI may already be gone, and the
        turn ends either way. A CLI that exits meanwhile needs no answer: a Ctrl-C in the foreground
        (`make run`) reaches the CLI as well as the server, which shares its process group, and the
        CLI ends at once, while the server's stop asks it to stop its turn; that stop waits no longer."""
        process = self._process()
        asking = asyncio.ensure_future(self._client.interrupt())
        ending = asyncio.ensure_future(_exit_of(process))
        try:
            await asyncio.wait({asking, ending}, timeout=INTERRUPT_TIMEOUT, return_when=asyncio.FIRST_COMPLETED)
            if asking.done() and asking.exception() is not None:  # a CLI that exits can fail the ask first
                await asyncio.wait({ending}, timeout=EXIT_GRACE)
        finally:
            for task in (asking, ending):
                task.cancel()
            await asyncio.gather(asking, ending, return_exceptions=True)
        answered = asking.done() and not asking.cancelled() and asking.exception() is None
        if answered:
            return
        if ending.done() and not ending.cancelled():
            log.info("cli_exited_during_interrupt", pid=process.pid, returncode=process.returncode)
            return
        error = asking.exception() if asking.done() and not asking.cancelled() else TimeoutError()
        log.warning("interrupt_failed", pid=self.pid, error=repr(error))

    async def close(self) -> None:
        """Disconnect; if that fails or hangs, kill the process, so that none outlives its session."""
        pid = self.pid
        try:
            await asyncio.wait_for(self._client.disconnect(), DISCONNECT_TIMEOUT)
        except BaseException as exc:
            log.warning("cli_disconnect_failed", pid=pid, error=repr(exc))
            self.kill()
            if isinstance(exc, asyncio.CancelledError):
                self._forget()  # no more awaiting once cancelled: a small file, written in place
                raise
        await asyncio.to_thread(self._forget)
        log.info("cli_disconnected", pid=pid)

    def _forget(self) -> None:
        """The CLI is gone: out of the ledger. Blocking."""
        recorded, self._recorded = self._recorded, None
        if self._ledger is not None and recorded is not None:
            with contextlib.suppress(OSError):
                self._ledger.forget(recorded)

    # ------------------------------------------------------------ the process itself (SDK internals)

    def _process(self) -> Any:
        return getattr(getattr(self._client, "_transport", None), "_process", None)

    @property
    def pid(self) -> int | None:
        return getattr(self._process(), "pid", None)

    @property
    def returncode(self) -> int | None:
        return getattr(self._process(), "returncode", None)

    @property
    def exited(self) -> bool:
        """True once the process has exited: it may have crashed while idle."""
        return self.returncode is not None

    def kill(self) -> None:
        process = self._process()
        if process is not None and getattr(process, "returncode", 0) is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                process.kill()


async def _exit_of(process: Any) -> None:
    """Return once `process` (the SDK's, None before the CLI starts) has exited: its returncode is
    set when the event loop reaps it, whoever waits on it."""
    if process is None:
        await asyncio.Event().wait()
    while getattr(process, "returncode", None) is None:  # noqa: ASYNC110 -- the SDK's wait() is its own
        await asyncio.sleep(EXIT_POLL)
