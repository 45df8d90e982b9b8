"""Shared fixtures: a mock Bridge, a workspace, a running Sprite OS, and WebSocket clients.

End-to-end tests run Sprite OS in-process (or as a subprocess where a test must
kill or signal it) with the real Claude Code CLI; the only test double is the
mock Bridge at the HTTP boundary.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sprite_os.config import Settings
from sprite_os.dev.harness import (
    TOKEN,
    Client,
    Connect,
    client_factory,
    make_settings,
    running,
    wait_for,
)
from sprite_os.dev.mock_bridge import MockBridge
from sprite_os.dev.processes import ServerProcess, child_cli_processes, free_port, pid_alive

if TYPE_CHECKING:  # importing the server loads the agent SDK (seconds): only tests that run it pay
    from sprite_os.server import SpriteOS

__all__ = ["TOKEN", "Client", "Connect", "ServerProcess", "child_cli_processes", "client_factory", "free_port",
           "make_settings", "pid_alive", "running", "wait_for"]


@pytest.fixture
async def bridge() -> AsyncIterator[MockBridge]:
    async with MockBridge() as b:
        yield b


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return tmp_path / "workspace"


@pytest.fixture
def settings(workspace: Path, bridge: MockBridge) -> Settings:
    return make_settings(workspace, bridge.url)


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[SpriteOS]:
    async with running(settings) as app:
        yield app


@pytest.fixture
async def client(server: SpriteOS) -> AsyncIterator[Connect]:
    async with client_factory(server.port) as factory:
        yield factory
