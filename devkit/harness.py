"""Driving a Sprite OS in-process: settings for a scratch workspace, a running server, and a
WebSocket client that keeps every frame it received. Tests, benchmarks and the chaos suite
share it, with `wait_for`, the one way they wait on a condition.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from websockets.asyncio.client import ClientConnection, connect

from sprite_os.config import Settings

if TYPE_CHECKING:  # importing the server loads the agent SDK (seconds): only callers that run it pay
    from sprite_os.server import SpriteOS

TOKEN = "test-token-0123456789abcdef"
# A guard against a hang, not a margin a test passes inside: a fresh server's first turn starts the CLI,
# which on a loaded two-core machine (a full suite beside other work) has taken more than 30 s.
FRAME_TIMEOUT = 90.0


TEST_RATE = 100_000  # the agent's model calls a minute, in tests (see make_settings)


def make_settings(workspace: Path, base_url: str, **overrides: Any) -> Settings:
    # isolation "none" unless asked: a test's workspace under pytest's tmp_path (0700) can't be reached by the
    # agent's user; tests of the isolation itself use tests/conftest.py's agent_* fixtures.
    # A zero-latency model answers far faster than the agent's default rate (60 calls a minute) allows:
    # tests of the rate set their own.
    values: dict[str, Any] = dict(workspace=workspace, host="127.0.0.1", port=0, token=TOKEN,
                                  anthropic_base_url=base_url, precompact_budget=15.0, isolation="none",
                                  agent_requests_per_minute=TEST_RATE)
    values.update(overrides)
    return Settings(**values)


@asynccontextmanager
async def running(settings: Settings, *, memory: bool = True) -> AsyncIterator[SpriteOS]:
    from sprite_os.server import SpriteOS

    app = SpriteOS(settings, TOKEN, memory=memory)
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


class Restartable:
    """A server a test stops and starts again, on the same port: a restart, as its clients see it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app: SpriteOS | None = None
        self.port = settings.port

    async def start(self) -> SpriteOS:
        from sprite_os.server import SpriteOS

        self.app = SpriteOS(self.settings.with_overrides(port=self.port), TOKEN)
        await self.app.start()
        self.port = self.app.port
        return self.app

    async def stop(self) -> None:
        app, self.app = self.app, None
        if app is not None:
            await app.stop()


@asynccontextmanager
async def restartable(settings: Settings) -> AsyncIterator[Restartable]:
    """A running server the test may stop and start again; stopped at the end whatever state it is in."""
    server = Restartable(settings)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


class Client:
    """A test's WebSocket client: keeps every frame it received, in order."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []
        self._read = 0

    async def send(self, **frame: Any) -> None:
        await self.ws.send(json.dumps(frame))

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def recv(self, timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        if self._read < len(self.frames):
            self._read += 1
            return self.frames[self._read - 1]
        frame: dict[str, Any] = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.frames.append(frame)
        self._read += 1
        return frame

    async def until(self, kind: str, pred: Callable[[dict[str, Any]], bool] | None = None,
                    timeout: float = FRAME_TIMEOUT) -> dict[str, Any]:
        """Read frames until one of `kind` (matching `pred`) arrives."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.recv(timeout)
                if frame["type"] == kind and (pred is None or pred(frame)):
                    return frame

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]

    @property
    def last_seq(self) -> int:
        return max((f["seq"] for f in self.frames), default=0)

    async def close(self) -> None:
        await self.ws.close()


Connect = Callable[..., Awaitable[Client]]


async def connect_client(port: int, *, hello: dict[str, Any] | None = None, token: str = TOKEN,
                         **kwargs: Any) -> Client:
    """A client of the server on `port` (`kwargs` go to websockets' connect); with `hello`, it
    has said hello and read `ready`."""
    ws = await connect(f"ws://127.0.0.1:{port}", additional_headers={"Authorization": f"Bearer {token}"}, **kwargs)
    client = Client(ws)
    if hello is not None:
        await client.send(type="hello", **hello)
        await client.until("ready")
    return client


@asynccontextmanager
async def client_factory(port: int) -> AsyncIterator[Connect]:
    clients: list[Client] = []

    async def open_client(*, hello: dict[str, Any] | None = None, token: str = TOKEN, **kwargs: Any) -> Client:
        client = await connect_client(port, hello=hello, token=token, **kwargs)
        clients.append(client)
        return client

    try:
        yield open_client
    finally:
        for c in clients:
            await c.close()


class Ticks:
    """How often the event loop ran a 10 ms sleeper while `loop_ticks()` was open: none means it was held."""

    count = 0


@asynccontextmanager
async def loop_ticks() -> AsyncIterator[Ticks]:
    """Count the loop's turns meanwhile: a test that something waits off the event loop asserts the count grew."""
    ticks = Ticks()

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.01)
            ticks.count += 1

    ticker = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        ticker.cancel()


async def wait_for(condition: Callable[[], object], timeout: float = 30.0, interval: float = 0.02,
                   what: str | None = None) -> None:
    """Wait until `condition()` (a function or a coroutine function) is true, checking every
    `interval` seconds; after `timeout` seconds, fail with what was waited for."""
    async def check() -> bool:
        value = condition()
        return bool(await value) if inspect.isawaitable(value) else bool(value)

    try:
        async with asyncio.timeout(timeout):
            while not await check():
                await asyncio.sleep(interval)
    except TimeoutError:
        raise TimeoutError(f"not reached within {timeout:g} s: {what or getattr(condition, '__name__', 'condition')}") from None
