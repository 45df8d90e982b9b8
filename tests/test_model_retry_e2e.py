"""A turn whose model proxy fails tells the client within seconds, at each retry the CLI makes,
instead of minutes of silence, through the real CLI."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from devkit.mock_bridge import Fault, MockBridge
from sprite_os.agent.process import load_sdk
from sprite_os.server import SpriteOS
from tests.conftest import Client, Connect, client_factory, make_settings, running

pytestmark = pytest.mark.e2e


async def first_retry(c: Client, text: str) -> tuple[dict, float]:  # type: ignore[type-arg]
    """Send `text`; the first model_retry frame, and how long after the message it came (printed, not
    asserted: a busy machine stretches the CLI's start, not the order of events the tests check).
    The agent SDK is imported first, as the server's first turn would: a cold import under coverage
    on a loaded machine took 31 s, which the wait for the frame then had to cover too."""
    await load_sdk()
    started = time.monotonic()
    await c.send(type="user_message", text=text)
    first = await c.until("model_retry", timeout=60)
    return first, time.monotonic() - started


async def test_an_overloaded_proxy_is_announced_at_each_retry_and_the_turn_completes_once_it_recovers(
        server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    overloaded = bridge.faults.add(Fault("status", status=529, target="agent"))
    c = await client(hello={})
    first, announced = await first_retry(c, "hello?")
    # Announced at the CLI's first retry, not after its retries: the proxy has seen at most the failed
    # request and the retry it announces (the CLI waits retry_delay_ms between them, longer each time).
    assert len(bridge.agent_requests()) <= 2, len(bridge.agent_requests())
    assert (first["attempt"], first["error_status"], first["error"]) == (1, 529, "overloaded")
    assert first["max_retries"] >= 1 and first["retry_delay_ms"] > 0
    second = await c.until("model_retry", timeout=30)
    assert second["attempt"] == 2 and second["turn_id"] == first["turn_id"]
    bridge.faults.remove(overloaded)
    done = await c.until("turn_complete", timeout=60)
    assert done["status"] == "completed" and not c.of("error")
    print(f"\nfirst model_retry {announced:.2f} s after the message (HTTP 529)")


async def test_an_unreachable_proxy_is_announced_within_seconds(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on: connection refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    async with running(make_settings(tmp_path / "ws", url)) as app, client_factory(app.port) as client:
        c = await client(hello={})
        first, announced = await first_retry(c, "anyone there?")
        # The relay answers for a proxy that does not: 502, which the CLI retries like any 5xx.
        assert first["attempt"] == 1 and first["error_status"] == 502
        await c.send(type="interrupt")  # the person need not sit through every retry
        assert (await c.until("turn_complete", timeout=30))["status"] == "interrupted"
    print(f"\nfirst model_retry {announced:.2f} s after the message (connection refused)")
