"""The world a chaos run acts on: the mock Bridge, one workspace, the real server as a child
process (`python -m sprite_os serve`, leading its own process group, as `sprite-os service`
starts it), one WebSocket client, and the record of every turn sent.

The curator is scripted to answer every batch with one FACT per turn, naming the turn's marker
and the call's number, and a context.md rewrite: so a batch that ran twice leaves two learnings
for one marker, and every batch rewrites a file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed

from chaos.turns import MARKER, Outcome, Turn, TurnLog
from devkit.harness import Client, connect_client
from devkit.mock_bridge import MockBridge, RecordedRequest, Text
from devkit.mock_bridge import Turn as ScriptedTurn
from devkit.processes import ServerProcess

TURN_TIMEOUT = 240.0  # a turn through a flapping proxy waits on the CLI's own retries
_OBSERVATION = re.compile(r"^\[#(\d+)\]", re.MULTILINE)


@dataclass(frozen=True)
class Settings:
    batch_turns: int = 3
    env: dict[str, str] = field(default_factory=dict)  # more of the server's environment (its isolation)


class World:
    def __init__(self, workspace: Path, bridge: MockBridge, settings: Settings, *, disk: Any = None,
                 first_marker: int = 1) -> None:
        self.workspace = workspace
        self.bridge = bridge
        self.settings = settings
        self.disk = disk  # the fault-making disk the workspace is on, if any (devkit.faults)
        self.server: ServerProcess | None = None
        self.client: Client | None = None
        self.log = TurnLog(_next=first_marker)
        self.scenario = ""
        self.starts = 0
        self.kills = 0
        self.curator_calls = 0
        self.attach()

    def attach(self) -> None:
        """This world's curator answers the Bridge's curator calls (worlds take turns)."""
        self.bridge.curator.default = self.curate

    # ------------------------------------------------------------ the curator

    def curate(self, request: RecordedRequest) -> str:
        self.curator_calls += 1
        parts = _OBSERVATION.split(request.last_user_text)
        facts = []
        for obs_id, body in zip(parts[1::2], parts[2::2], strict=True):
            if (m := MARKER.search(body)) is not None:
                facts.append((m.group(0), obs_id))
        if not facts:
            return "NONE"
        lines = [f"FACT: The person's turn carried {marker} (curator call {self.curator_calls}) [#{obs_id}]"
                 for marker, obs_id in facts]
        lines += ["CONTEXT_MD_UPDATE:", "# Now", f"- Latest chaos marker: {facts[-1][0]}",
                  f"- Curator calls so far: {self.curator_calls}"]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------ the server

    def new_server(self) -> ServerProcess:
        return ServerProcess(self.workspace, self.bridge.url, new_session=True,
                             SPRITE_MEMORY_BATCH_TURNS=str(self.settings.batch_turns), SPRITE_LOG_LEVEL="info",
                             **self.settings.env)

    async def start(self, timeout: float = 120.0) -> None:
        self.server = await self.new_server().start(timeout)
        self.starts += 1
        await self.connect()

    async def connect(self) -> None:
        assert self.server is not None
        # No keepalive pings: a frozen server must not look like a dead one to this client.
        self.client = await connect_client(self.server.port, hello={}, ping_interval=None,
                                           max_size=None)

    async def drop_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 2)

    def kill_now(self, group: bool) -> None:
        """kill -9 of the server alone, or of its whole process group (the server, its CLI and
        whatever the CLI runs), at once: no await between the caller's moment and the signal."""
        assert self.server is not None
        self.kills += 1
        (os.killpg if group else os.kill)(self.server.pid, signal.SIGKILL)

    async def kill(self, group: bool) -> None:
        """kill_now, then wait for the server to be gone and drop the connection."""
        assert self.server is not None
        self.kill_now(group)
        await self.reap()

    async def reap(self) -> None:
        """After a kill: wait for the server to be gone, drop the connection."""
        assert self.server is not None
        await self.server.wait()
        await self.drop_client()

    async def stop(self) -> None:
        await self.drop_client()
        if self.server is not None:
            await self.server.stop()

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    @property
    def server_pid(self) -> int:
        assert self.server is not None
        return self.server.pid

    # ------------------------------------------------------------ turns

    def script_slow_turn(self, words: int = 300, delay: float = 0.02) -> None:
        """The next turn streams its answer for about `words * delay` seconds: time to act mid-turn."""
        self.bridge.agent.script(ScriptedTurn(Text("chaos " * words, chunk_delay=delay)))

    async def turn(self, note: str = "", *, started: asyncio.Event | None = None,
                   completed: Callable[[dict[str, Any]], None] | None = None, kept: bool = True,
                   timeout: float = TURN_TIMEOUT) -> Turn:
        """Send one message with a fresh marker and wait for its turn to end (or the connection
        to go). `started` is set once the server acknowledged it (turn_started); `completed` is
        called with the turn_complete frame the moment the client has read it (a kill after the
        acknowledgement); `kept` False: the turn may be lost (the disk can't be written)."""
        marker = self.log.new_marker()
        text = f"{marker} {note or 'please note this marker'}"
        began = ended = time.monotonic()
        acknowledged = False
        outcome: Outcome
        try:
            if self.client is None:
                raise ConnectionError("no connection")
            c = self.client
            await c.send(type="user_message", text=text)
            frame = await c.until("turn_started", lambda f: f["text"] == text, timeout)
            acknowledged = True
            if started is not None:
                started.set()
            done = await c.until("turn_complete", lambda f: f["turn_id"] == frame["turn_id"], timeout)
            ended = time.monotonic()
            if completed is not None:
                completed(done)
            outcome = done["status"]
        except (ConnectionClosed, ConnectionError, OSError):
            outcome = "cut" if acknowledged else "unsent"
            ended = time.monotonic()
        turn = Turn(marker, self.scenario, outcome, ended - began, kept)
        self.log.add(turn)
        return turn

    async def turns(self, n: int, note: str = "") -> list[Turn]:
        return [await self.turn(note) for _ in range(n)]

    async def new_session(self) -> None:
        """End the session (which asks for a batch of what is pending) and start the next."""
        assert self.client is not None
        await self.client.send(type="new_session")
        await self.client.until("session_started", timeout=120)

    def frames(self) -> list[dict[str, Any]]:
        return self.client.frames if self.client is not None else []
