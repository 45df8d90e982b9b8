"""The model proxy's key never reaches the agent, through the real CLI: its shell reads its own
environment and its parent's (the CLI's), and neither holds the key or the server's token."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from devkit.mock_bridge.request import parse_user_message, tool_result_text
from tests.conftest import client_factory, make_settings, running

pytestmark = pytest.mark.e2e

# Distinctive values: any trace of them in what the agent saw is a leak.
PROXY_KEY = "sk-proxy-key-7f3a9c61-never-in-the-agent"
SERVER_TOKEN = "server-token-4b8e1d90-never-in-the-agent"
OTHER_SECRET = "a-deploy-secret-52c7e0aa"
PROBE = "printenv; echo ---; cat /proc/$PPID/environ | tr '\\0' '\\n'"


async def test_the_agents_shell_sees_neither_the_proxy_key_nor_the_server_token(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, bridge: MockBridge,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a Sprite: the server's own environment holds the key and the token (the SDK hands the
    # CLI all of it), besides the settings that carry them.
    monkeypatch.setenv("ANTHROPIC_API_KEY", PROXY_KEY)
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", PROXY_KEY)
    monkeypatch.setenv("SPRITE_OS_TOKEN", SERVER_TOKEN)
    monkeypatch.setenv("BRIDGE_DEPLOY_SECRET", OTHER_SECRET)
    monkeypatch.setenv("LC_RELAY_TEST", "passed-through")
    bridge.agent.script(Turn(ToolCall("Bash", {"command": PROBE, "description": "environment"}), Text("Seen.")))
    settings = make_settings(tmp_path / "ws", bridge.url, anthropic_api_key=PROXY_KEY)
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await c.send(type="user_message", text="what is in your environment?")
        done = await c.until("turn_complete", timeout=60)
        relay_key = app.relay.client_key
    assert done["status"] == "completed"
    [answered] = [r for r in bridge.agent_requests() if r.is_tool_result]
    [result] = parse_user_message(answered.body).tool_results
    seen = tool_result_text(result)
    shell, cli = seen.split("\n---\n")
    for environment in (shell, cli):  # the probe ran, and read both
        assert "PATH=" in environment and "LC_RELAY_TEST=passed-through" in environment
        assert f"ANTHROPIC_API_KEY={relay_key}" in environment  # the relay's key: it opens the relay only
        assert "ANTHROPIC_BASE_URL=http://127.0.0.1:" in environment
        assert "SPRITE_OS_TOKEN=\n" in environment + "\n" and "BRIDGE_DEPLOY_SECRET=\n" in environment + "\n"
        # The suite's CLIs have a home in the run's temp folder (tests/conftest.py), never the host's:
        # its shell config is not theirs to run, nor its ~/.claude theirs to write.
        [home] = [line.removeprefix("HOME=") for line in environment.splitlines() if line.startswith("HOME=")]
        assert Path(home).is_relative_to(tmp_path_factory.getbasetemp()), home
    assert PROXY_KEY not in seen and SERVER_TOKEN not in seen and OTHER_SECRET not in seen
    # Every request of the CLI reached the proxy with the real key, put there by the relay.
    keys = {next(v for k, v in r.headers.items() if k.lower() == "x-api-key") for r in bridge.agent_requests()}
    assert keys == {PROXY_KEY}
    assert all("authorization" not in {k.lower() for k in r.headers} for r in bridge.agent_requests())
