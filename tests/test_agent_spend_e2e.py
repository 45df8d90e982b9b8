"""The agent's budget and the bounded relay, through the real CLI as its own user: the agent calls
the relay itself (`curl`, with the URL and key its environment holds) for a model it may not use,
for more than the ceiling, faster than the rate; a day's cap ends its turns, saying so; its slow
huge bodies do not grow the server; and another user's silent connections keep nothing out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os.config import Settings
from sprite_os.isolation.policy import AgentUser
from tests.conftest import ServerProcess, client_factory, running

pytestmark = pytest.mark.e2e

TURN = 120.0
MIB = 1024 * 1024


def bash(command: str) -> ToolCall:
    return ToolCall("Bash", {"command": command, "description": "a step of the test"})


def curl(model: str, max_tokens: int, out: str) -> str:
    """One call to the relay from the agent's shell, as any of its commands could make it; the
    status goes to documents/<out>."""
    body = json.dumps({"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]})
    return (f"curl -s -o /dev/null -w '%{{http_code}}\\n' -X POST \"$ANTHROPIC_BASE_URL/v1/messages\" "
            f"-H \"x-api-key: $ANTHROPIC_API_KEY\" -H 'content-type: application/json' -H 'user-agent: curl-agent' "
            f"-d '{body}' >> documents/{out}")


async def test_the_agents_own_calls_are_held_to_its_models_its_ceiling_and_its_rate(
        agent_settings: Settings, bridge: MockBridge, agent_user: AgentUser) -> None:
    settings = replace(agent_settings, agent_max_tokens=2000, agent_requests_per_minute=6)
    script = agent_settings.workspace / "documents" / "calls.sh"
    calls = "\n".join([
        curl(settings.agent_model, 100, "allowed"),  # the control: the same call, within every limit, goes
        curl("claude-opus-4-1", 100, "model"),
        curl(settings.agent_model, 100_000, "ceiling"),
        *(curl(settings.agent_model, 100, "burst") for _ in range(6)),
    ])
    bridge.agent.script(Turn(ToolCall("Write", {"file_path": str(script), "content": calls + "\n"}),
                             bash("bash documents/calls.sh"), Text("Called.")))
    async with running(settings) as app, client_factory(app.port) as connect:
        app.spend.limits = replace(app.spend.limits, window=6.0)  # the minute, shortened: the CLI waits it out
        c = await connect(hello={})
        await c.send(type="user_message", text="spend")
        done = await c.until("turn_complete", timeout=TURN)
        report = app.spend.report()
    docs = agent_settings.workspace / "documents"
    assert done["status"] == "completed", c.of("error")
    assert (docs / "allowed").read_text().split() == ["200"]
    assert (docs / "model").read_text().split() == ["403"]
    assert (docs / "ceiling").read_text().split() == ["400"]
    burst = (docs / "burst").read_text().split()
    assert "429" in burst and burst[0] == "200", burst
    assert {"model", "max_tokens", "rate"} <= set(report["refused_today"])
    # The CLI's own next call met the rate too: it waited, retried, and the turn said why.
    retries = c.of("model_retry")
    assert retries and all(r["error_status"] == 429 for r in retries)
    assert "Sprite OS refused the agent's call: the agent may make 6 model calls" in retries[0]["error"]
    # Nothing refused reached the proxy.
    assert {r.model for r in bridge.requests if r.user_agent == "curl-agent"} == {settings.agent_model}
    assert all(r.body and r.body["max_tokens"] <= 2000 for r in bridge.agent_requests())


async def test_a_day_over_the_cap_ends_the_turn_saying_so(
        agent_settings: Settings, bridge: MockBridge) -> None:
    # The first turn's calls are allowed and report 400,000 input tokens ($6 each, at Opus's price);
    # then the day's $10 cannot cover another call's worst case.
    settings = replace(agent_settings, agent_daily_budget_usd=10.0, agent_max_tokens=60_000)  # a call: up to $4.58
    bridge.agent.script(Turn(Text("An expensive answer."), input_tokens=400_000), Turn(Text("never said")))
    async with running(settings) as app, client_factory(app.port) as connect:
        c = await connect(hello={})
        await c.send(type="user_message", text="first")
        first = await c.until("turn_complete", timeout=TURN)
        await c.send(type="user_message", text="second")
        second = await c.until("turn_complete", timeout=TURN)
        report = app.spend.report()
    assert first["status"] == "completed"  # the control: the same cap let the first turn through
    assert second["status"] == "error"
    [error] = [e for e in c.of("error") if e.get("turn_id") == second["turn_id"]]
    assert error["code"] == "agent_limit"
    assert error["message"].startswith("Sprite OS refused the agent's call: its daily budget of $10.00 is spent")
    assert report["spent_today_usd"] == pytest.approx(6.0, abs=0.1) and report["refused_today"] == {"budget": 1}
    assert [r.last_user_text for r in bridge.agent_requests()] == ["first"]  # the second never reached the proxy


# ---------------------------------------------------------------- the relay's bounds, a real server


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def hold_silent_connections(port: int, n: int) -> subprocess.Popen[bytes]:
    """`n` connections to the relay from another user (nobody), saying nothing, held open."""
    code = (f"import socket, sys, time; s = [socket.create_connection(('127.0.0.1', {port})) for _ in range({n})]; "
            "print('held', flush=True); time.sleep(600)")
    proc = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                             sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
    return proc


async def slow_huge_body(port: int, key: str, chunked: bool, stop: asyncio.Event) -> None:
    """A 32 MiB request body, sent a MiB at a time, slowly: declared, or chunked."""
    with contextlib.suppress(OSError):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        framing = b"transfer-encoding: chunked" if chunked else f"content-length: {32 * MIB}".encode()
        writer.write(b"POST /v1/messages HTTP/1.1\r\nhost: relay\r\nx-api-key: " + key.encode() + b"\r\n" +
                     framing + b"\r\ncontent-type: application/json\r\n\r\n")
        chunk = b" " * MIB
        for _ in range(32):
            if stop.is_set() or reader.at_eof():
                break
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if chunked else chunk)
            await writer.drain()
            await asyncio.sleep(0.3)
        writer.close()


async def test_slow_huge_bodies_do_not_grow_the_server_and_silent_strangers_keep_nothing_out(
        bridge: MockBridge, agent_user: AgentUser, agent_workspace: Path) -> None:
    server = await ServerProcess(agent_workspace, bridge.url, SPRITE_ISOLATION="user",
                                 SPRITE_AGENT_USER=agent_user.name).start()
    stranger: subprocess.Popen[bytes] | None = None
    try:
        bridge.agent.script(Turn(bash("printenv ANTHROPIC_BASE_URL ANTHROPIC_API_KEY > documents/relay"),
                                 Text("Noted.")))
        async with client_factory(server.port) as connect:
            c = await connect(hello={})
            await c.send(type="user_message", text="where is the model?")
            assert (await c.until("turn_complete", timeout=TURN))["status"] == "completed"
            url, key = (agent_workspace / "documents" / "relay").read_text().split()
            port = int(url.rsplit(":", 1)[1])
            pid = server.pid
            idle = 0
            for _ in range(20):  # idle, as it settles after a turn (recall indexes it meanwhile)
                idle = max(idle, rss(pid))
                await asyncio.sleep(0.3)
            stop = asyncio.Event()
            senders = [asyncio.create_task(slow_huge_body(port, key, chunked=i % 2 == 1, stop=stop)) for i in range(16)]
            peak = idle
            for _ in range(40):  # while they send (12 s at most: the relay may cut them short sooner)
                peak = max(peak, rss(pid))
                if all(sender.done() for sender in senders):
                    break
                await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*senders)
            # Another user's silent connections, more than the relay serves, and the agent's turn goes on.
            stranger = await asyncio.to_thread(hold_silent_connections, port, 40)
            bridge.agent.script(Turn(bash("echo still > documents/still"), Text("Still here.")))
            await c.send(type="user_message", text="are you still there?")
            done = await c.until("turn_complete", timeout=TURN)
        assert done["status"] == "completed", c.of("error")
        assert (agent_workspace / "documents" / "still").read_text() == "still\n"
        print(f"server RSS idle {idle / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB")  # for -s
        assert peak - idle < 50 * MIB, (idle / MIB, peak / MIB)
        assert [r.path for r in bridge.requests if r.user_agent == ""] == []  # no body reached the proxy
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
        await server.stop()
