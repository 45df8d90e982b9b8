"""One Claude Code CLI process, as the runtime drives it: connect, prompt, replies, interrupt, close.

It is the only module that reaches into the SDK's private parts: the SDK gives no public
way to read the CLI's pid or exit status, or to kill a CLI whose `disconnect` hangs
(claude-agent-sdk #378, #886). If a new SDK moves `_transport._process`, `pid` and
`returncode` read None and `kill` does nothing; the runtime still works, blind to an
idle CLI's death until its next write fails (that prompt is then resent once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from claude_agent_sdk import ClaudeAgentOptions, ClaudeSDKClient, Message

from .logs import get_logger

log = get_logger(__name__)

ClientFactory = Callable[[ClaudeAgentOptions], ClaudeSDKClient]

DISCONNECT_TIMEOUT = 10.0
INTERRUPT_TIMEOUT = 5.0


class AgentProcess:
    """Owns one `ClaudeSDKClient` and the CLI process behind it. Drive it from one task
    (the SDK requires it), except `interrupt`, which the SDK allows from outside."""

    def __init__(self, options: ClaudeAgentOptions, factory: ClientFactory = ClaudeSDKClient) -> None:
        self._client = factory(options)

    async def connect(self) -> None:
        await self._client.connect()

    async def send(self, prompt: str) -> None:
        await self._client.query(prompt)

    def replies(self) -> AsyncIterator[Message]:
        """The messages about the prompt just sent, through its ResultMessage."""
        return self._client.receive_response()

    async def interrupt(self) -> None:
        """Ask the CLI to stop the running turn. Never raises: the CLI may already be gone,
        and the turn ends either way."""
        try:
            await asyncio.wait_for(self._client.interrupt(), INTERRUPT_TIMEOUT)
        except Exception as exc:
            log.warning("interrupt_failed", pid=self.pid, error=repr(exc))

    async def close(self) -> None:
        """Disconnect; if that fails or hangs, kill the process, so that none outlives its session."""
        pid = self.pid
        try:
            await asyncio.wait_for(self._client.disconnect(), DISCONNECT_TIMEOUT)
        except BaseException as exc:
            log.warning("cli_disconnect_failed", pid=pid, error=repr(exc))
            self.kill()
            if isinstance(exc, asyncio.CancelledError):
                raise
        log.info("cli_disconnected", pid=pid)

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
