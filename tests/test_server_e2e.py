"""The server end to end: real Claude Code CLI, real WebSockets, the mock Bridge at the HTTP boundary."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import sqlite3
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from devkit.harness import restartable
from devkit.mock_bridge import Fault, MockBridge, Text, ToolCall, Turn
from devkit.processes import workspace_clis
from sprite_os import events, gateway
from sprite_os.config import Settings
from sprite_os.memory.capture.journal import STOPPED
from sprite_os.protocol import MAX_QUEUED_MESSAGES
from sprite_os.server import SpriteOS
from sprite_os.stopping import STOP_REPORT
from tests.conftest import (
    TOKEN,
    Client,
    Connect,
    ServerProcess,
    child_cli_processes,
    client_factory,
    make_settings,
    observed,
    pid_alive,
    running,
    wait_for,
)

pytestmark = pytest.mark.e2e


# ---------------------------------------------------------------- auth and health
# These only ask: one server, never given a message, serves them all (on the module's loop, and
# on one worker).

def on_the_idle_server(test: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.xdist_group("idle-server")(pytest.mark.asyncio(loop_scope="module")(test))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def idle_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SpriteOS]:
    async with MockBridge() as bridge:
        async with running(make_settings(tmp_path_factory.mktemp("idle") / "workspace", bridge.url)) as app:
            yield app


@pytest_asyncio.fixture(loop_scope="module")
async def idle_client(idle_server: SpriteOS) -> AsyncIterator[Connect]:
    """The idle server's clients for one test, closed at its end."""
    async with client_factory(idle_server.port) as factory:
        yield factory


# These run a turn each and only read what it gave (its frames, the model's requests, a replay): one
# server and its one CLI session serve them all. That CLI lives until the module ends, so this file's
# tests that count CLIs count their own server's (`workspace_clis`), not every one this process started.

def on_the_talking_server(test: Callable[..., Any]) -> Callable[..., Any]:
    return pytest.mark.xdist_group("talking-server")(pytest.mark.asyncio(loop_scope="module")(test))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def talking_server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[SpriteOS, MockBridge]]:
    async with MockBridge() as bridge:
        async with running(make_settings(tmp_path_factory.mktemp("talking") / "workspace", bridge.url)) as app:
            yield app, bridge


@pytest_asyncio.fixture(loop_scope="module")
async def talk(talking_server: tuple[SpriteOS, MockBridge]) -> AsyncIterator[tuple[SpriteOS, Connect, MockBridge]]:
    """The talking server, its clients for one test (closed at its end), and its model."""
    server, bridge = talking_server
    async with client_factory(server.port) as factory:
        yield server, factory, bridge


@on_the_idle_server
async def test_no_token_or_wrong_token_gets_401_and_nothing_else(idle_server: SpriteOS) -> None:
    url = f"ws://127.0.0.1:{idle_server.port}"
    for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": "Basic abc"}):
        with pytest.raises(InvalidStatus) as info:
            await connect(url, additional_headers=headers)
        assert info.value.response.status_code == 401
        assert info.value.response.body == b""


@on_the_idle_server
async def test_right_token_gets_ready_by_header_or_browser_subprotocol(idle_server: SpriteOS) -> None:
    async with client_factory(idle_server.port) as client:
        c = await client(hello={})
        assert c.frames[0]["type"] == "ready" and c.frames[0]["session_id"] == idle_server.runtime.session_id
    # Browsers can't set headers: they offer the token as a subprotocol, and only ours is echoed back.
    async with connect(f"ws://127.0.0.1:{idle_server.port}", subprotocols=["sprite-os.v1", f"bearer.{TOKEN}"]) as ws:  # type: ignore[list-item]
        assert ws.subprotocol == "sprite-os.v1"
        await ws.send(json.dumps({"type": "hello"}))
        assert json.loads(await ws.recv())["type"] == "ready"


@on_the_idle_server
async def test_a_newer_protocol_is_told_and_served_version_1(idle_server: SpriteOS) -> None:
    async with client_factory(idle_server.port) as client:
        c = await client()
        await c.send(type="hello", protocol=2)
        error = await c.until("error")
        ready = await c.until("ready")
    assert error["code"] == "unsupported_protocol" and ready["protocol"] == 1


@on_the_talking_server
async def test_the_terminal_chat_client(talk: tuple[SpriteOS, Connect, MockBridge],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from sprite_os.commands.chat import chat

    # Piped input: at its end the client waits for the turns it started, then leaves.
    monkeypatch.setattr("sys.stdin", io.StringIO("card: Groceries\nhello\n"))
    out = io.StringIO()
    assert await asyncio.wait_for(chat(f"ws://127.0.0.1:{talk[0].port}", TOKEN, out), 60) == 0
    text = out.getvalue()
    assert "connected to session" in text and "you › card: Groceries" in text
    assert "card created: Groceries" in text and "agent › You said: hello" in text
    assert text.count("· completed in") == 2


@on_the_idle_server
async def test_healthz(idle_server: SpriteOS) -> None:
    def get(token: str | None) -> dict:  # type: ignore[type-arg]
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(f"http://127.0.0.1:{idle_server.port}/healthz", headers=headers)
        with urllib.request.urlopen(request, timeout=5) as r:
            assert r.headers["Content-Type"] == "application/json"
            return json.loads(r.read())

    health = await asyncio.to_thread(get, TOKEN)
    assert health["status"] == "ok" and health["agent"]["state"] == "idle"
    assert {"version", "uptime_s", "clients", "memory", "isolation"} <= set(health) and health["pid"] == os.getpid()
    assert health["memory"]["observations"]["total"] == 0
    assert {"budget", "capture", "consecutive_failures", "running"} <= set(health["memory"])
    # Without the token, or with a wrong one, only the status: nothing for whoever reaches the port.
    assert await asyncio.to_thread(get, None) == {"status": "ok"}
    assert await asyncio.to_thread(get, "wrong-token-0123456789") == {"status": "ok"}


# ---------------------------------------------------------------- a turn


@on_the_talking_server
async def test_a_message_streams_text_then_completes_through_the_real_cli(
        talk: tuple[SpriteOS, Connect, MockBridge]) -> None:
    server, client, bridge = talk
    bridge.agent.script(Turn(Text("Hello from the model, streamed in pieces.", chunk_delay=0.03)))
    c = await client(hello={})
    await c.send(type="user_message", text="hi there", client_id="m1")
    done = await c.until("turn_complete")
    started = c.of("turn_started")[0]
    assert started["text"] == "hi there" and started["client_id"] == "m1"
    deltas = c.of("text_delta")
    assert len(deltas) > 1 and "".join(d["text"] for d in deltas).strip() == "Hello from the model, streamed in pieces."
    assert c.of("assistant_message")[0]["text"].strip() == "Hello from the model, streamed in pieces."
    assert done["status"] == "completed" and done["usage"]["input_tokens"] > 0 and done["duration_ms"] > 0
    seqs = [f["seq"] for f in c.frames]
    assert seqs == sorted(seqs)
    assert bridge.agent_requests() and all(r.user_agent.startswith("claude-cli/") for r in bridge.agent_requests())
    request = next(r for r in bridge.agent_requests() if r.last_user_text == "hi there")  # others ran here too
    assert "Your memory" in request.system_text  # the boot prompt reached the model
    assert "mcp__canvas__create_card" in request.tools and "mcp__memory__search_memory" in request.tools
    assert "Bash" in request.tools and "WebSearch" not in request.tools  # an explicit tool list
    # No documents database: the filesystem is the source of truth for the user's data, and the
    # only databases are the system's two, under .os/memory.
    databases = sorted(str(p.relative_to(server.settings.workspace)) for p in server.settings.workspace.rglob("*.db"))
    assert databases == [".os/memory/memory.db", ".os/memory/transcript.db"]


# ---------------------------------------------------------------- canvas


async def test_cards_reach_every_client_and_survive_a_restart(settings: Settings, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {"title": "Groceries", "body": "- milk"}),
                             Text("Made it.")))
    async with running(settings) as app, client_factory(app.port) as client:
        a, b = await client(hello={}), await client(hello={})
        await a.send(type="user_message", text="make a grocery card")
        for c in (a, b):
            created = await c.until("card_created")
            assert created["card"]["title"] == "Groceries" and created["card"]["body"] == "- milk"
        await a.until("turn_complete")
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        [card] = c.frames[0]["cards"]
        assert (card["id"], card["title"]) == ("groceries", "Groceries")
        bridge.agent.script(Turn(ToolCall("mcp__canvas__update_card", {"id": "groceries", "body": "- milk\n- eggs"}),
                                 Text("Updated.")))
        d = await client(hello={})
        await c.send(type="user_message", text="add eggs")
        for x in (c, d):
            assert (await x.until("card_updated"))["card"]["body"] == "- milk\n- eggs"
        await c.until("turn_complete")
        bridge.agent.script(Turn(ToolCall("mcp__canvas__close_card", {"id": "groceries"}), Text("Closed.")))
        await c.send(type="user_message", text="close it")
        for x in (c, d):
            assert (await x.until("card_closed"))["card_id"] == "groceries"
        await c.until("turn_complete", lambda f: f["turn_id"] == c.of("turn_started")[-1]["turn_id"])
    async with running(settings) as app, client_factory(app.port) as client:
        assert (await client(hello={})).frames[0]["cards"] == []


@on_the_talking_server
async def test_a_bad_card_is_an_error_the_model_sees(talk: tuple[SpriteOS, Connect, MockBridge]) -> None:
    _, client, bridge = talk
    bridge.agent.script(Turn(ToolCall("mcp__canvas__update_card", {"id": "missing", "title": "x"}), Text("Oops.")))
    c = await client(hello={})
    await c.send(type="user_message", text="update a card that isn't there")
    result = await c.until("tool_result")
    await c.until("turn_complete")
    assert result["is_error"] is True and "no open card" in result["summary"]
    continuation = bridge.agent_requests()[-1]
    assert "no open card" in json.dumps(continuation.messages)


# ---------------------------------------------------------------- control


async def test_interrupt_stops_the_turn_mid_stream(server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("word " * 200, chunk_delay=0.05)))
    c = await client(hello={})
    await c.send(type="user_message", text="tell me a long story")
    await c.until("text_delta")
    await c.send(type="interrupt")
    done = await c.until("turn_complete", timeout=10)
    assert done["status"] == "interrupted"
    streamed = "".join(f["text"] for f in c.of("text_delta"))
    assert streamed.startswith("word ") and len(streamed) < len("word " * 200) // 2  # it really stopped early
    await c.send(type="interrupt")
    assert (await c.until("error"))["code"] == "nothing_to_interrupt"
    await c.send(type="user_message", text="are you still there?")
    assert (await c.until("turn_complete", lambda f: f["turn_id"] != done["turn_id"]))["status"] == "completed"


async def test_interrupt_while_the_cli_is_starting_ends_the_turn_unsent(
        server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    c = await client(hello={})
    await c.send(type="user_message", text="never mind")
    await c.until("turn_started")  # published before the CLI connects (~0.5 s)
    await c.send(type="interrupt")
    done = await c.until("turn_complete")
    assert done["status"] == "interrupted" and not c.of("error")
    assert bridge.agent_requests() == []  # the message never reached the model
    await c.send(type="user_message", text="hello")
    assert (await c.until("turn_complete", lambda f: f["turn_id"] != done["turn_id"]))["status"] == "completed"


async def test_a_session_with_a_turn_running_is_not_forgotten_and_a_replay_after_a_forget_has_no_words(
        server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("the vault code is 4711. " * 40, chunk_delay=0.05)))
    c = await client(hello={})
    ready = c.frames[0]
    await c.send(type="user_message", text="keep my vault code safe")
    await c.until("text_delta")  # running: it is recorded, words and all, when it ends
    await c.send(type="forget_turns", request_id="f1", session_id=ready["session_id"])
    busy = await c.until("error", lambda f: f.get("request_id") == "f1")
    assert busy["code"] == "busy" and "interrupt it or wait" in busy["message"]
    await c.send(type="interrupt")  # seen busy, the long turn (10 s of words) ends; its words are recorded
    assert (await c.until("turn_complete", timeout=30))["status"] == "interrupted"
    await c.send(type="forget_turns", request_id="f2", session_id=ready["session_id"])
    assert (await c.until("forget_turns_result"))["forgotten"] == 1
    back = await client(hello={"last_seq": ready["last_seq"], "stream": ready["stream"]})  # a device resuming
    await back.until("turns_forgotten")
    replayed = json.dumps(back.frames).lower()
    assert "vault" not in replayed and back.of("turn_started")[0]["text"] == ""


async def test_forgetting_a_turn_of_the_current_session_restarts_it_before_the_next_message(
        server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    """The session is ended for the forget (reason `forget`), and the next message runs in a new one
    whose context never held the forgotten turn."""
    c = await client(hello={})
    first_session = c.frames[0]["session_id"]
    said = await turn_of(c, "remember the word PELICAN")
    await c.send(type="forget_turns", request_id="f1", turn_ids=[said["turn_id"]])
    result = await c.until("forget_turns_result")
    assert result["forgotten"] == 1 and result["restarted"] is True
    await c.send(type="user_message", text="what was the word?")
    await c.until("turn_complete", lambda f: f["turn_id"] != said["turn_id"])
    [ended] = c.of("session_ended")
    assert ended["session_id"] == first_session and ended["reason"] == "forget"
    assert c.frames.index(ended) < c.frames.index(c.of("turn_started")[-1])
    last = bridge.agent_requests()[-1]
    assert last.last_user_text == "what was the word?" and "PELICAN" not in json.dumps(last.messages)


async def test_new_session_starts_a_fresh_context(server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    c = await client(hello={})
    first_session = c.frames[0]["session_id"]
    await c.send(type="user_message", text="remember the word PELICAN")
    await c.until("turn_complete")
    await c.send(type="new_session")
    ended = await c.until("session_ended")
    started = await c.until("session_started")
    assert ended["session_id"] == first_session and ended["reason"] == "new_session"
    assert started["session_id"] != first_session
    await c.send(type="user_message", text="what was the word?")
    await c.until("turn_complete")
    last = bridge.agent_requests()[-1]
    assert last.last_user_text == "what was the word?"
    assert "PELICAN" not in json.dumps(last.messages)  # the old conversation is gone from the context


async def test_each_turn_costs_its_own_and_the_session_adds_them_up(server: SpriteOS, client: Connect) -> None:
    """The CLI reports a running total per process; a turn's cost_usd is its own (three alike turns cost
    alike, not 1x, 2x, 3x), session_cost_usd the sum so far, and both start again after /new."""
    c = await client(hello={})
    done = [await turn_of(c, f"turn {n}") for n in range(3)]
    costs, totals = [d["cost_usd"] for d in done], [d["session_cost_usd"] for d in done]
    assert costs[0] > 0 and costs[1] == pytest.approx(costs[0]) and costs[2] == pytest.approx(costs[0]), costs
    assert totals == pytest.approx([costs[0], costs[0] + costs[1], sum(costs)])
    await c.send(type="new_session")
    await c.until("session_started")
    fresh = await turn_of(c, "a new session")
    assert fresh["cost_usd"] == pytest.approx(costs[0]) and fresh["session_cost_usd"] == pytest.approx(costs[0])


async def test_idle_timeout_ends_the_session_and_frees_the_cli(settings: Settings, bridge: MockBridge) -> None:
    async with running(settings.with_overrides(idle_timeout=1.0)) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await c.send(type="user_message", text="hi")
        await c.until("turn_complete")
        assert workspace_clis(app.settings.workspace)
        ended = await c.until("session_ended", timeout=10)
        assert ended["reason"] == "idle"
        await c.until("session_started")
        assert not workspace_clis(app.settings.workspace)


# ---------------------------------------------------------------- resume


@on_the_talking_server
async def test_reconnect_with_last_seq_replays_what_was_missed(talk: tuple[SpriteOS, Connect, MockBridge]) -> None:
    _, client, _ = talk
    a = await client(hello={})
    await a.send(type="user_message", text="first")
    await a.until("turn_complete")
    stream, seen = a.frames[0]["stream"], a.last_seq
    await a.close()
    b = await client(hello={})
    await b.send(type="user_message", text="while you were away")
    await b.until("turn_complete")
    back = await client(hello={"last_seq": seen, "stream": stream})
    ready = back.frames[0]
    assert ready["replayed"] > 0 and not ready["resync"] and ready["seq"] == seen
    replay = [await back.recv() for _ in range(ready["replayed"])]
    assert [f["seq"] for f in replay] == sorted(f["seq"] for f in replay) and replay[0]["seq"] > seen
    assert any(f["type"] == "turn_started" and f["text"] == "while you were away" for f in replay)
    assert replay[-1]["type"] == "turn_complete" and replay[-1]["seq"] == ready["last_seq"]
    # A seq from another run of the server (another stream) can't be replayed: a fresh snapshot instead.
    other = await client(hello={"last_seq": 3, "stream": "another-run"})
    assert other.frames[0]["resync"] is True and other.frames[0]["replayed"] == 0


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(("raw", "code"), [
    ("{not json", "invalid_json"),
    ('{"type":"teleport"}', "unknown_type"),
    ('{"text":"no type"}', "invalid_frame"),
    ('{"type":"user_message"}', "invalid_frame"),
    ('{"type":"user_message","text":7}', "invalid_frame"),
    ('{"type":"hello","last_seq":"x"}', "invalid_frame"),
    ('{"type":"hello"}', "invalid_frame"),  # hello only as the first frame
    (b"\x00\x01binary", "binary_not_supported"),
    ("x" * (1024 * 1024 + 10), "frame_too_large"),
])
@on_the_idle_server
async def test_each_bad_frame_gets_an_error_and_the_connection_stays(idle_client: Connect,
                                                                    raw: str | bytes, code: str) -> None:
    c = await idle_client(hello={})
    other = await idle_client(hello={})
    await c.send_raw(raw)
    error = await c.until("error")
    assert error["code"] == code and error["message"]
    await c.send(type="ping", nonce="still-here")
    assert (await c.until("pong"))["nonce"] == "still-here"
    await other.send(type="ping", nonce="unaffected")
    assert (await other.until("pong"))["nonce"] == "unaffected"


@on_the_idle_server
async def test_a_message_past_the_frame_limit_is_named_by_its_client_id(idle_client: Connect) -> None:
    """A paste past a frame's 1 MiB (a log, a file's text) was refused without its id: the page kept
    the message "waiting for the agent" for ever beside the error."""
    c = await idle_client(hello={})
    await c.send(type="user_message", text="x" * (1024 * 1024 + 10), client_id="web-5")
    error = await c.until("error")
    assert (error["code"], error["client_id"]) == ("frame_too_large", "web-5")


@on_the_idle_server
async def test_a_flood_is_rate_limited_then_closed_and_others_keep_serving(idle_client: Connect) -> None:
    flooder, other = await idle_client(hello={}), await idle_client(hello={})
    with pytest.raises(ConnectionClosed) as info:
        for _ in range(2000):
            await flooder.send(type="ping")
            await asyncio.sleep(0)
        await flooder.until("never", timeout=5)  # closed at once, not at the 10 s close timeout
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008
    assert any(f["type"] == "error" and f["code"] == "rate_limited" for f in flooder.frames)
    await other.send(type="ping", nonce="fine")
    assert (await other.until("pong"))["nonce"] == "fine"


@on_the_idle_server
async def test_a_frame_over_the_hard_limit_closes_only_that_connection(idle_client: Connect) -> None:
    big, other = await idle_client(hello={}), await idle_client(hello={}, max_size=None)
    with pytest.raises(ConnectionClosed) as info:
        await big.send_raw("x" * (5 * 1024 * 1024))
        await big.until("never", timeout=10)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009
    await other.send(type="ping", nonce="ok")
    assert (await other.until("pong"))["nonce"] == "ok"


async def test_queue_full_is_an_error_not_a_crash(server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("slow " * 40, chunk_delay=0.05)))
    c = await client(hello={})
    for n in range(20):
        await c.send(type="user_message", text=f"message {n}")
    await c.send(type="ping", nonce="after")  # answered after every message above was handled
    await c.until("pong")
    refused = [f for f in c.of("error") if f["code"] == "queue_full"]
    # One turn runs and MAX_QUEUED_MESSAGES wait; the first may still be queued when the rest arrive.
    assert len(refused) in (20 - MAX_QUEUED_MESSAGES - 1, 20 - MAX_QUEUED_MESSAGES)
    assert len(refused) == len(c.of("error"))
    assert server.runtime.queued == 20 - len(refused) - 1  # the accepted ones, but the running one
    await c.send(type="interrupt")
    assert (await c.until("turn_complete"))["status"] == "interrupted"  # and the next queued turn starts


# ---------------------------------------------------------------- slow clients


def stalled_client(port: int) -> socket.socket:
    """A WebSocket client that completes the handshake, says hello, and then never reads again."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect, or autotuning wins
    sock.connect(("127.0.0.1", port))
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKEN}\r\n\r\n")
                 .encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    payload, mask = b'{"type":"hello"}', os.urandom(4)
    sock.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
    return sock


def read_until_close(sock: socket.socket) -> tuple[list[dict], int]:  # type: ignore[type-arg]
    """Read a stalled client's socket at last: the frames it had been sent, then its close code."""
    sock.settimeout(30)
    stream, frames = sock.makefile("rb"), []
    while True:
        head = stream.read(2)
        opcode, length = head[0] & 0x0F, head[1] & 0x7F  # server frames are unmasked
        if length >= 126:
            length = int.from_bytes(stream.read(2 if length == 126 else 8), "big")
        payload = stream.read(length)
        if opcode == 0x8:
            return frames, int.from_bytes(payload[:2], "big")
        if opcode == 0x1:
            frames.append(json.loads(payload))


async def test_a_client_that_never_reads_delays_no_one_and_can_resume(
        monkeypatch: pytest.MonkeyPatch, server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    monkeypatch.setattr(gateway, "LAGGING_CLOSE_TIMEOUT", 60.0)  # the close frame waits until it reads again
    with monkeypatch.context() as tight:  # small limits for the stalled client alone, so it falls behind
        tight.setattr(events, "SUBSCRIBER_QUEUE", 50)
        tight.setattr(events, "SUBSCRIBER_BYTES", 1024 * 1024)
        stalled = await asyncio.to_thread(stalled_client, server.port)
        await wait_for(lambda: len(server.gateway.connections) == 1, timeout=5)
    # The fast client keeps the default limits: however busy this machine, it never lags this much.
    fast = await client(hello={}, max_size=None)
    # More than loopback's socket buffers can absorb, so the stalled client really falls behind.
    bridge.agent.script(Turn(Text("x" * 8_000_000, chunk_size=4000)))
    await fast.send(type="user_message", text="a very long answer please")
    done = await fast.until("turn_complete", timeout=60)
    assert done["status"] == "completed"
    assert sum(len(f["text"]) for f in fast.of("text_delta")) == 8_000_000  # every character, coalesced
    # The stalled client reads again: what it had been sent, then close code 4000, before the turn's end.
    frames, code = await asyncio.to_thread(read_until_close, stalled)
    stalled.close()
    assert code == 4000 and frames[0]["type"] == "ready"
    assert not [f for f in frames if f["type"] == "turn_complete"]
    # It resumes from the last event it saw, and the missed events that matter are replayed.
    seen = max(f["seq"] for f in frames)
    back = await client(hello={"last_seq": seen, "stream": frames[0]["stream"]}, max_size=None)
    ready = back.frames[0]
    assert ready["resync"] is False and ready["replayed"] >= 1
    replay = [await back.recv() for _ in range(ready["replayed"])]
    assert replay[0]["seq"] > seen
    assert replay[-1]["type"] == "turn_complete" and replay[-1]["turn_id"] == done["turn_id"]


# ---------------------------------------------------------------- failures and shutdown


async def test_a_cli_crash_mid_turn_gives_an_error_and_the_next_message_starts_fresh(
        server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("word " * 400, chunk_delay=0.05)))
    c = await client(hello={})
    await c.send(type="user_message", text="start something long")
    await c.until("text_delta")
    [pid] = workspace_clis(server.settings.workspace)
    os.kill(pid, signal.SIGKILL)
    error = await c.until("error", timeout=15)
    assert error["code"] == "agent_failed"
    assert (await c.until("turn_complete"))["status"] == "error"
    assert (await c.until("session_ended"))["reason"] == "crash"
    assert pid not in workspace_clis(server.settings.workspace)
    await c.send(type="user_message", text="hello again")
    assert (await c.until("turn_complete", lambda f: f["status"] == "completed"))["status"] == "completed"
    clis = workspace_clis(server.settings.workspace)
    assert len(clis) == 1 and pid not in clis


async def test_a_cli_that_dies_between_turns_is_replaced_and_the_next_message_completes(
        server: SpriteOS, client: Connect) -> None:
    c = await client(hello={})
    assert (await turn_of(c, "hello"))["status"] == "completed"
    [pid] = workspace_clis(server.settings.workspace)
    os.kill(pid, signal.SIGKILL)
    # Dead, not merely dying: a message sent while it dies is a crash mid-turn.
    await wait_for(lambda: not pid_alive(pid), timeout=5)
    done = await turn_of(c, "are you still there?")
    assert done["status"] == "completed"  # no resend needed
    assert [e["code"] for e in c.of("error")] == ["agent_failed"]
    assert [e["reason"] for e in c.of("session_ended")] == ["crash"]
    assert len(c.of("session_started")) == 1  # the fresh session the message ran in
    clis = workspace_clis(server.settings.workspace)
    assert len(clis) == 1 and pid not in clis


async def test_a_failing_model_proxy_fails_the_turn_clearly_and_serving_goes_on(
        monkeypatch: pytest.MonkeyPatch, server: SpriteOS, client: Connect, bridge: MockBridge) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "1")  # the CLI inherits it: fail fast instead of retrying
    bridge.faults.add(Fault("status", status=500, target="agent"))
    c = await client(hello={})
    failed = await turn_of(c, "hello?")
    error = next(f for f in c.frames if f["type"] == "error")
    assert failed["status"] == "error"
    assert error["code"] == "model_unavailable" and error["message"] == "The model proxy failed (HTTP 500)."
    assert error["detail"].startswith("HTTP 500")  # the CLI's own words, for the details
    assert not c.of("assistant_message")  # the CLI's "API Error: ..." notice is not shown as the agent's reply
    bridge.faults.clear()
    assert (await turn_of(c, "and now?"))["status"] == "completed"


async def test_an_unreachable_model_proxy_is_model_unavailable(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CLAUDE_CODE_MAX_RETRIES", "1")
    with socket.socket() as closed:  # a port nothing listens on: connection refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    async with running(make_settings(tmp_path / "ws", url)) as app, client_factory(app.port) as client:
        c = await client(hello={})
        failed = await turn_of(c, "hello?")
        [error] = c.of("error")
        assert failed["status"] == "error"
        assert error["code"] == "model_unavailable" and error["message"] == "The model proxy can't be reached.", error


async def turn_of(c: Client, text: str) -> dict:  # type: ignore[type-arg]
    await c.send(type="user_message", text=text)
    started = await c.until("turn_started", lambda f: f["text"] == text)
    return await c.until("turn_complete", lambda f: f["turn_id"] == started["turn_id"], timeout=120)


async def test_stopping_ends_the_turn_tells_clients_and_leaves_no_cli(settings: Settings, bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("word " * 400, chunk_delay=0.05)))
    app = SpriteOS(settings, TOKEN)
    await app.start()
    async with client_factory(app.port) as client:
        c = await client(hello={})
        await c.send(type="user_message", text="something long")
        await c.until("text_delta")
        assert workspace_clis(settings.workspace)
        await app.stop()
        assert (await c.until("turn_complete"))["status"] == "interrupted"
        assert (await c.until("session_ended"))["reason"] == "shutdown"
        with pytest.raises(ConnectionClosed):
            await c.until("never", timeout=5)
    assert workspace_clis(settings.workspace) == []


def _sigterm(proc: ServerProcess) -> None:
    proc.signal(signal.SIGTERM)  # `sprite-os service stop`: the server alone


def _ctrl_c(proc: ServerProcess) -> None:
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in `make run`'s terminal: its whole process group, the CLI too


@pytest.mark.parametrize("stop", [_sigterm, _ctrl_c], ids=["sigterm", "ctrl_c"])
async def test_a_stop_signal_ends_the_turn_tells_clients_exits_0_and_leaves_no_cli(
        workspace: Path, bridge: MockBridge, stop: Callable[[ServerProcess], None]) -> None:
    """A stop mid-turn, by the service's SIGTERM or by Ctrl-C in the foreground (dev mode, where the
    terminal's SIGINT reaches the CLI as well as the server): the same clean stop either way."""
    bridge.agent.script(Turn(Text("word " * 400, chunk_delay=0.05)))
    proc = await ServerProcess(workspace, bridge.url, new_session=True).start()
    try:
        async with client_factory(proc.port) as client:
            c = await client(hello={})
            await c.send(type="user_message", text="something long")
            await c.until("text_delta")
            clis = child_cli_processes(proc.pid)
            assert clis
            stop(proc)
            code = await proc.wait(timeout=30)
            log = proc.log.read_text()
            assert code == 0, f"exit {code}\n{log[-2500:]}"
            done = await c.until("turn_complete")
            assert done["status"] == "interrupted" and done["by_server"], done
            assert (await c.until("session_ended"))["reason"] == "shutdown"
            with pytest.raises(ConnectionClosed) as info:
                await c.until("never", timeout=5)
            assert info.value.rcvd is not None and info.value.rcvd.code == 1001
        assert not [pid for pid in clis if pid_alive(pid)]
        # Memory's stop ran whole, and the turn is on record as the server's stop cut it short. A CLI that
        # the Ctrl-C ended by itself is no failure, nor does the stop wait on it to answer its interrupt.
        assert '"server_stopped"' in log and "Traceback" not in log, log[-2500:]
        assert '"interrupt_failed"' not in log, log[-2500:]
        assert json.loads((make_settings(workspace, bridge.url).layout.state_dir / STOP_REPORT).read_text()) == \
            {"unfinished": []}
        assert observed(workspace, bridge.url, "status") == [("something long", STOPPED)], log[-2500:]
    finally:
        await proc.stop()


@pytest.mark.parametrize(("earlier", "text", "runs"), [
    ((), "Do it once", lambda b: sum("Do it once" in r.last_user_text for r in b.agent_requests())),
    # /compact leaves no turn in the record (the CLI runs it itself), yet the agent took it: its client id
    # alone is recorded, durable before its turn_complete; no turn of it joins the conversation.
    (("The garden plan is due in May",), "/compact", lambda b: sum(r.is_compaction for r in b.agent_requests())),
], ids=["a turn", "a command the cli ran itself"])
async def test_a_message_taken_before_a_restart_is_not_run_again_after_it(
        settings: Settings, bridge: MockBridge, earlier: tuple[str, ...], text: str,
        runs: Callable[[MockBridge], int]) -> None:
    """A message's client id is its idempotency key, across a restart too: the new server knows the ids
    the record holds (transcript.db, through memory), so the same message sent again is answered
    already_taken, with the session and turn it ran as, and the agent does not get it twice."""
    async with restartable(settings) as server:
        async with client_factory(server.port) as connect:
            c = await connect(hello={})
            for n, said in enumerate(earlier):
                await c.send(type="user_message", text=said, client_id=f"web-earlier-{n}")
                await c.until("turn_complete")
            await c.send(type="user_message", text=text, client_id="web-once")
            done = await c.until("turn_complete", lambda f: f["turn_id"] == c.of("turn_started")[-1]["turn_id"])
        assert done["status"] == "completed" and done["saved"] is not False
        assert server.app is not None
        ran_in = server.app.runtime.session_id
        await server.stop()
        await server.start()
        async with client_factory(server.port) as connect:
            c = await connect(hello={})
            await c.send(type="user_message", text=text, client_id="web-once")
            refused = await c.until("error")
            await c.send(type="user_message", text="Something new", client_id="web-new")
            await c.until("turn_complete")
        assert {k: refused[k] for k in ("code", "client_id", "session_id", "turn_id")} == {
            "code": "already_taken", "client_id": "web-once", "session_id": ran_in, "turn_id": done["turn_id"]}
        assert runs(bridge) == 1
    with contextlib.closing(sqlite3.connect(settings.layout.transcript_db)) as db:  # no turn of the command
        assert [m for (m,) in db.execute("SELECT user_message FROM observations")] == [
            *earlier, *([text] if not text.startswith("/") else []), "Something new"]
