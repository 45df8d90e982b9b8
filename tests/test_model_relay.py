"""The model relay (os_src/agent/model_relay.py) in front of the mock Bridge, a real HTTP server: what the
CLI's side sends and sees, and what reaches the proxy."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
import socket
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from devkit.harness import wait_for
from devkit.mock_bridge import Fault, MockBridge, Text, Turn
from sprite_os.agent.model_relay import ModelRelay, RelayError, RelayLimits, route

PROXY_KEY = "sk-proxy-key-9d1e44-only-upstream"
CLI_UA = "claude-cli/2.1.329 (external, sdk-py, agent-sdk/0.2.186)"  # the bridge answers it as the agent
BODY = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
async def bridge() -> AsyncIterator[MockBridge]:
    async with MockBridge() as b:
        yield b


@pytest.fixture
async def relay(bridge: MockBridge) -> AsyncIterator[ModelRelay]:
    async with ModelRelay(bridge.url, PROXY_KEY) as r:
        yield r


def cli(relay: ModelRelay, key: str | None = None) -> httpx2.AsyncClient:
    """An HTTP client standing in for the CLI: the relay's URL and key, the CLI's User-Agent."""
    return httpx2.AsyncClient(base_url=relay.url, timeout=30, headers={
        "x-api-key": relay.client_key if key is None else key, "user-agent": CLI_UA,
        "anthropic-version": "2023-06-01"})


def header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name), None)


def without_ids(raw: bytes) -> bytes:
    return re.sub(rb"msg_mock_\w+", b"msg_ID", raw)


async def stream_bytes(client: httpx2.AsyncClient, body: dict[str, Any]) -> tuple[int, bytes, list[float]]:
    """POST a streaming request: the status, the raw body, and when each chunk arrived."""
    arrivals: list[float] = []
    chunks: list[bytes] = []
    async with client.stream("POST", "/v1/messages?beta=true", json=body | {"stream": True}) as response:
        async for chunk in response.aiter_raw():
            arrivals.append(time.monotonic())
            chunks.append(chunk)
    return response.status_code, b"".join(chunks), arrivals


# ---------------------------------------------------------------- passthrough


async def test_a_stream_through_the_relay_is_byte_identical_to_one_straight_from_the_proxy(
        bridge: MockBridge, relay: ModelRelay) -> None:
    reply = Turn(Text("one two three four five six", chunk_delay=0.15))
    bridge.agent.script(reply)
    async with httpx2.AsyncClient(base_url=bridge.url, headers={"user-agent": CLI_UA}) as direct:
        status, straight, _ = await stream_bytes(direct, BODY)
    bridge.agent.script(reply)
    async with cli(relay) as c:
        relayed_status, relayed, arrivals = await stream_bytes(c, BODY)
    assert status == relayed_status == 200
    assert b"event: message_stop" in relayed
    assert without_ids(relayed) == without_ids(straight)  # message ids are the bridge's only difference
    # Unbuffered: the first events came while the proxy was still writing the rest (5 x 0.15 s).
    assert arrivals[-1] - arrivals[0] > 0.5


async def test_json_replies_and_count_tokens_pass_through(bridge: MockBridge, relay: ModelRelay) -> None:
    bridge.curator.script("a plain answer")
    async with cli(relay) as c:
        counted = await c.post("/v1/messages/count_tokens", json=BODY)
        answered = await c.post("/v1/messages", json=BODY, headers={"user-agent": "anthropic-python"})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    assert answered.status_code == 200 and answered.json()["content"][0]["text"] == "a plain answer"
    assert [r.kind for r in bridge.requests] == ["count_tokens", "messages"]
    assert [r.path for r in bridge.requests] == ["/v1/messages/count_tokens", "/v1/messages"]


async def test_one_connection_carries_request_after_request(bridge: MockBridge, relay: ModelRelay) -> None:
    ports = set()
    async with cli(relay) as c:
        for _ in range(3):
            response = await c.post("/v1/messages/count_tokens", json=BODY)
            assert response.status_code == 200
            ports.add(response.extensions["network_stream"].get_extra_info("client_addr")[1])
    assert len(bridge.requests) == 3 and len(ports) == 1  # the CLI's side kept its one connection


# ---------------------------------------------------------------- the client towards the proxy


async def test_the_client_towards_the_proxy_is_made_in_a_thread_when_prepared_never_by_cli_env(
        bridge: MockBridge, relay: ModelRelay, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its making (httpx's transport imported, the system's certificates read) is some 95 ms of CPU: on
    the event loop, the first turn would hold up every connection meanwhile. `cli_env` only describes."""
    made_in: list[int] = []
    real = httpx2.AsyncClient

    def recording(*args: Any, **kwargs: Any) -> httpx2.AsyncClient:
        made_in.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(httpx2, "AsyncClient", recording)
    relay.cli_env()
    assert made_in == [] and relay._client is None
    await asyncio.gather(relay.prepare(), relay.prepare())  # two CLIs starting at once: one client kept
    kept = relay._client
    await relay.prepare()
    assert kept is not None and relay._client is kept
    assert made_in and threading.get_ident() not in made_in


async def test_a_stopped_relay_makes_no_client_towards_the_proxy(bridge: MockBridge) -> None:
    """A connection accepted just before the stop may be served after it: a client it made then would
    never be closed. It is refused; and the CLI that asks then is answered 503."""
    relay = ModelRelay(bridge.url, PROXY_KEY)
    async with relay:
        pass
    with pytest.raises(RelayError, match="stopped"):
        await relay._upstream_client()
    with pytest.raises(RelayError):
        await relay.prepare()
    assert relay._client is None
    async with relay:  # started again, it serves again
        await relay.prepare()
        assert relay._client is not None
    assert relay._client is None


# ---------------------------------------------------------------- the key


async def test_the_proxy_gets_the_real_key_and_the_cli_side_never_sees_it(
        bridge: MockBridge, relay: ModelRelay) -> None:
    bridge.agent.script(Turn(Text("fine")))
    async with cli(relay) as c:
        c.headers["authorization"] = f"Bearer {relay.client_key}"
        status, body, _ = await stream_bytes(c, BODY)
        counted = await c.post("/v1/messages/count_tokens", json=BODY)
    [streamed, count] = bridge.requests
    for request in (streamed, count):
        assert header(request.headers, "x-api-key") == PROXY_KEY
        assert header(request.headers, "authorization") is None  # the CLI's credentials stay here
        assert header(request.headers, "user-agent") == CLI_UA  # the rest passes as sent
        assert relay.client_key not in json.dumps(request.headers)
    assert status == 200 and PROXY_KEY.encode() not in body
    assert PROXY_KEY not in counted.text and PROXY_KEY not in json.dumps(dict(counted.headers))
    assert PROXY_KEY not in json.dumps(relay.cli_env())


async def test_a_wrong_or_missing_key_gets_401_and_nothing_reaches_the_proxy(
        bridge: MockBridge, relay: ModelRelay) -> None:
    for key in ("", PROXY_KEY, relay.client_key + "x"):
        async with cli(relay, key=key) as c:
            response = await c.post("/v1/messages", json=BODY)
        assert response.status_code == 401, key
        assert response.json()["error"]["type"] == "authentication_error"
    assert bridge.requests == []


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/models"), ("POST", "/v1/complete"), ("GET", "/v1/messages"), ("POST", "/v1/messages/batches"),
    ("POST", "/v1/messages/../files"), ("POST", "/health"), ("POST", "/v1/messages/count_tokens/x"),
])
async def test_anything_but_the_messages_api_gets_404(
        bridge: MockBridge, relay: ModelRelay, method: str, path: str) -> None:
    async with cli(relay) as c:
        response = await c.request(method, path, json=BODY)
    assert response.status_code == 404
    assert response.json() == {"type": "error", "error": {"type": "not_found_error", "message": response.json()["error"]["message"]}}
    assert bridge.requests == []


@pytest.mark.parametrize("target", [
    b"//evil.example/v1/messages", b"//../v1/files/v1/messages", b"/v1/messages/", b"/v1//messages",
    b"/v1/messages%2f..", b"/v1/%6dessages", b"http://elsewhere/v1/messages", b"/./v1/messages",
    b"/v1/messages/../messages", b"/v1/messages?beta=true&x=1", b"/v1/messages?target=//evil.example",
    b"/v1/messages#frag", b"*", b"",
])
def test_only_the_exact_paths_are_routes_and_nothing_is_resolved(target: bytes) -> None:
    assert route(b"POST", target)[0] == 404  # type: ignore[index]


def test_what_is_forwarded_is_the_route_itself() -> None:
    assert route(b"POST", b"/v1/messages?beta=true") == b"/v1/messages?beta=true"
    assert route(b"POST", b"/v1/messages/count_tokens") == b"/v1/messages/count_tokens"
    assert route(b"GET", b"/v1/messages") == (404, route(b"GET", b"/v1/messages")[1])  # type: ignore[index]


async def test_odd_paths_never_reach_the_proxy(bridge: MockBridge, relay: ModelRelay) -> None:
    """The red team's two: a path that begins `//` read as an authority, and one that walks up."""
    for target in (b"//evil.example/v1/messages", b"//../v1/files/v1/messages", b"/v1/messages/../../v1/files"):
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        body = json.dumps(BODY).encode()
        writer.write(b"POST " + target + b" HTTP/1.1\r\nhost: x\r\nx-api-key: " + relay.client_key.encode() +
                     b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        head = await asyncio.wait_for(reader.read(100), 5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 404 "), (target, head)
    assert bridge.requests == []


async def test_an_oversize_body_is_refused_before_it_is_read_and_chunked_ones_when_they_pass_the_limit(
        bridge: MockBridge) -> None:
    async with ModelRelay(bridge.url, PROXY_KEY, RelayLimits(max_body_bytes=10_000)) as relay, cli(relay) as c:
        big = BODY | {"messages": [{"role": "user", "content": "x" * 20_000}]}
        declared = await c.post("/v1/messages", json=big)

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(20):
                yield b"x" * 1000

        chunked = await c.post("/v1/messages", content=chunks())
        fits = await c.post("/v1/messages/count_tokens", json=BODY)
    for response in (declared, chunked):
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "request_too_large"
    assert fits.status_code == 200 and [r.kind for r in bridge.requests] == ["count_tokens"]


async def test_a_malformed_request_gets_400_and_the_relay_keeps_serving(relay: ModelRelay) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
    writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n")
    head = await asyncio.wait_for(reader.read(100), 5)
    writer.close()
    assert head.startswith(b"HTTP/1.1 400 ")
    async with cli(relay) as c:
        assert (await c.post("/v1/messages/count_tokens", json=BODY)).status_code == 200


# ---------------------------------------------------------------- the proxy failing


async def test_a_proxy_that_is_down_gets_the_cli_a_502_at_once() -> None:
    with socket.socket() as closed:  # a port nothing listens on: connection refused
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    async with ModelRelay(url, PROXY_KEY) as relay, cli(relay) as c:
        started = time.monotonic()
        response = await c.post("/v1/messages", json=BODY)
        took = time.monotonic() - started
    assert response.status_code == 502 and took < 20  # refused, told at once: not a wait for a timeout
    assert response.headers["x-should-retry"] == "true"  # the CLI retries it, as any 5xx
    error = response.json()["error"]
    assert error["type"] == "api_error" and "Connection refused" in error["message"]
    assert url not in response.text and PROXY_KEY not in response.text


async def test_a_proxy_that_never_answers_gets_a_504_after_the_read_timeout() -> None:
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, then says nothing
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        async with ModelRelay(url, PROXY_KEY, RelayLimits(upstream_read_timeout=0.5)) as relay, cli(relay) as c:
            response = await c.post("/v1/messages", json=BODY)
    finally:
        silent.close()
    assert response.status_code == 504 and response.json()["error"]["type"] == "timeout_error"


async def test_status_codes_retry_after_and_error_bodies_pass_through(bridge: MockBridge, relay: ModelRelay) -> None:
    bridge.faults.add(Fault("status", status=529, retry_after=7, times=1, message="overloaded, try later"))
    async with cli(relay) as c:
        overloaded = await c.post("/v1/messages", json=BODY)
        bridge.faults.add(Fault("status", status=429, times=1))
        limited = await c.post("/v1/messages", json=BODY)
        fine = await c.post("/v1/messages", json=BODY)
    assert overloaded.status_code == 529 and overloaded.headers["retry-after"] == "7"
    assert overloaded.json()["error"] == {"type": "overloaded_error", "message": "overloaded, try later"}
    assert limited.status_code == 429 and limited.json()["error"]["type"] == "rate_limit_error"
    assert fine.status_code == 200


async def test_latency_passes_through_and_a_cut_stream_is_cut_for_the_cli_too(
        bridge: MockBridge, relay: ModelRelay) -> None:
    bridge.faults.add(Fault("latency", seconds=0.6, times=1))
    async with cli(relay) as c:
        started = time.monotonic()
        assert (await c.post("/v1/messages", json=BODY)).status_code == 200
        assert time.monotonic() - started >= 0.6
        bridge.faults.add(Fault("cut", after_events=2, times=1))
        bridge.agent.script(Turn(Text("never finished")))
        with pytest.raises(httpx2.RemoteProtocolError):  # an incomplete body, as straight from the proxy
            await stream_bytes(c, BODY)
    assert relay.upstream_open == 0


# ---------------------------------------------------------------- clients that go away or stall


async def test_a_cli_that_goes_away_mid_stream_frees_the_upstream_at_once(
        bridge: MockBridge, relay: ModelRelay) -> None:
    bridge.agent.script(Turn(Text("word " * 100, chunk_delay=0.6)))  # 60 s of stream
    async with cli(relay) as c, c.stream("POST", "/v1/messages", json=BODY | {"stream": True}) as response:
        async for _ in response.aiter_raw():
            assert relay.upstream_open == 1
            break  # the CLI was interrupted: it closes the connection
    started = time.monotonic()
    await wait_for(lambda: relay.upstream_open == 0, timeout=40, what="the upstream request closed")
    assert time.monotonic() - started < 40  # long before the stream's end


async def test_a_cli_that_stops_reading_is_dropped_and_memory_stays_bounded(bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("x" * (16 * 1024 * 1024), chunk_size=64 * 1024)))  # far more than buffers hold
    limits = RelayLimits(write_timeout=1.0)
    async with ModelRelay(bridge.url, PROXY_KEY, limits) as relay:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", relay.port))
        body = json.dumps(BODY | {"stream": True}).encode()
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: relay\r\ncontent-type: application/json\r\n"
                     b"x-api-key: " + relay.client_key.encode() + b"\r\nuser-agent: " + CLI_UA.encode() +
                     b"\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            await wait_for(lambda: relay.upstream_open == 1, timeout=5, what="the stream started")
            # Never read: the relay stops taking from the proxy, then gives up on the CLI.
            await wait_for(lambda: relay.upstream_open == 0, timeout=10, what="the stalled CLI dropped")
        finally:
            sock.close()
        async with cli(relay) as c:  # and it keeps serving
            assert (await c.post("/v1/messages/count_tokens", json=BODY)).status_code == 200


async def test_stop_ends_open_streams_and_closes_the_port(bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("word " * 100, chunk_delay=0.6)))  # 60 s of stream
    relay = ModelRelay(bridge.url, PROXY_KEY)
    await relay.start()
    port = relay.port
    async with cli(relay) as c, c.stream("POST", "/v1/messages", json=BODY | {"stream": True}) as response:
        chunks = response.aiter_raw()
        await chunks.__anext__()
        started = time.monotonic()
        await relay.stop()
        assert time.monotonic() - started < 40 and relay.upstream_open == 0  # not at the stream's end
        with pytest.raises(httpx2.HTTPError):
            async for _ in chunks:
                pass
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


async def test_connections_beyond_the_limit_get_503_and_the_open_one_goes_on(bridge: MockBridge) -> None:
    bridge.agent.script(Turn(Text("word " * 10, chunk_delay=0.1)))
    async with ModelRelay(bridge.url, PROXY_KEY, RelayLimits(max_connections=1)) as relay, cli(relay) as c:
        async with c.stream("POST", "/v1/messages", json=BODY | {"stream": True}) as response:
            chunks = response.aiter_raw()
            first = await chunks.__anext__()
            async with cli(relay) as other:
                busy = await other.post("/v1/messages/count_tokens", json=BODY)
            rest = b"".join([chunk async for chunk in chunks])
    assert busy.status_code == 503 and busy.json()["error"]["type"] == "overloaded_error"
    assert b"event: message_stop" in first + rest
    assert [r.kind for r in bridge.requests] == ["messages"]


async def test_a_request_head_that_dribbles_in_is_dropped_and_frees_its_place(bridge: MockBridge) -> None:
    """The hostile review: a local user holding every connection by sending a byte every few
    seconds kept the CLI at 503. The head must arrive whole within head_timeout of its first byte:
    the relay closes the connection, however long the dribble would go on (here: until it does)."""
    async with ModelRelay(bridge.url, PROXY_KEY, RelayLimits(max_connections=1, head_timeout=0.5)) as relay:
        host, port = relay.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v1/messages HTTP/1.1\r\n")

        async def dribble() -> None:  # a header byte every 0.1 s: never idle, never done
            while not reader.at_eof():
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.1)

        with contextlib.suppress(ConnectionError):
            await asyncio.wait_for(dribble(), 60)  # a relay without the head deadline never ends it
        writer.close()
        async with cli(relay) as c:
            answer = await c.post("/v1/messages/count_tokens", json=BODY)
    assert answer.status_code == 200  # its place is free again


# ---------------------------------------------------------------- only the key counts


async def test_silent_connections_without_the_key_never_keep_the_cli_out(bridge: MockBridge) -> None:
    """Another local user's silent connections, more than the relay serves: the cap counts only
    connections that presented the key, and the oldest silent one makes room for a newer one."""
    limits = RelayLimits(max_connections=2, max_unverified=4, head_timeout=60)  # silence alone never ends them
    async with ModelRelay(bridge.url, PROXY_KEY, limits) as relay:
        silent = [await asyncio.open_connection("127.0.0.1", relay.port) for _ in range(16)]
        try:
            await wait_for(lambda: len(relay._connections) <= 4, timeout=5, what="the oldest silent ones closed")
            async with cli(relay) as c:
                answers = [await c.post("/v1/messages/count_tokens", json=BODY) for _ in range(3)]
            closed = [await asyncio.wait_for(reader.read(1), 5) == b"" for reader, _ in silent[:12]]
        finally:
            for _, writer in silent:
                writer.close()
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert all(closed)  # the twelve oldest made room


async def test_keyed_connections_beyond_the_cap_get_503(bridge: MockBridge) -> None:
    async with ModelRelay(bridge.url, PROXY_KEY, RelayLimits(max_connections=1)) as relay, \
            cli(relay) as first, cli(relay) as second, cli(relay, key="wrong") as stranger:
        assert (await first.post("/v1/messages/count_tokens", json=BODY)).status_code == 200  # kept alive: counted
        assert (await stranger.post("/v1/messages/count_tokens", json=BODY)).status_code == 401
        busy = await second.post("/v1/messages/count_tokens", json=BODY)
    assert busy.status_code == 503 and busy.headers["x-should-retry"] == "true"


# ---------------------------------------------------------------- bodies are bounded


async def test_slow_bodies_together_stay_within_the_relays_memory_budget(bridge: MockBridge) -> None:
    """Sixteen bodies sent slowly, each as large as the relay takes: what it holds of them together
    stays within max_buffered_bytes; those that do not fit are told to come back (503)."""
    limits = RelayLimits(max_body_bytes=1_000_000, max_buffered_bytes=3_000_000, body_timeout=30)
    async with ModelRelay(bridge.url, PROXY_KEY, limits) as relay:
        peak = 0
        stop = asyncio.Event()

        async def watch() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, relay.buffered)
                await asyncio.sleep(0.005)

        async def slow_body(c: httpx2.AsyncClient) -> int:
            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b" " * 99_000
                    await asyncio.sleep(0.05)
            response = await c.post("/v1/messages", content=chunks(), headers={"content-type": "application/json"})
            return response.status_code

        watcher = asyncio.create_task(watch())
        clients = [cli(relay) for _ in range(16)]
        try:
            statuses = await asyncio.gather(*(slow_body(c) for c in clients))
        finally:
            stop.set()
            await watcher
            for c in clients:
                await c.aclose()
    assert peak <= 3_000_000 and relay.buffered == 0
    assert 503 in statuses and set(statuses) <= {503, 200, 400}


async def test_a_body_that_never_finishes_is_dropped_at_its_deadline(bridge: MockBridge) -> None:
    async with ModelRelay(bridge.url, PROXY_KEY, RelayLimits(body_timeout=0.5)) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: " + relay.client_key.encode() +
                     b"\r\ncontent-length: 1000\r\n\r\n{\"model\"")
        head = await asyncio.wait_for(reader.read(100), 5)
        writer.close()
    assert head.startswith(b"HTTP/1.1 408 ") and relay.buffered == 0


# ---------------------------------------------------------------- the agent's budget


def booked(bridge: MockBridge, tmp_path: Any, **limits: Any) -> ModelRelay:
    from sprite_os.agent.budget import AgentLimits
    from sprite_os.agent.spend_book import SpendBook

    settings = {"models": frozenset({"claude-test"}), "daily_usd": 1.0, "max_tokens": 1000, "per_minute": 100} | limits
    return ModelRelay(bridge.url, PROXY_KEY, book=SpendBook(AgentLimits(**settings), tmp_path / "spend.json"))


async def test_calls_the_budget_refuses_never_reach_the_proxy(bridge: MockBridge, tmp_path: Any) -> None:
    async with booked(bridge, tmp_path, per_minute=3) as relay, cli(relay) as c:
        model = await c.post("/v1/messages", json=BODY | {"model": "claude-opus-4-1"})
        size = await c.post("/v1/messages", json=BODY | {"max_tokens": 100_000})
        junk = await c.post("/v1/messages", content=b"[1, 2]")
        fine = [await c.post("/v1/messages", json=BODY) for _ in range(3)]
        burst = await c.post("/v1/messages", json=BODY)
        report = relay.book.report() if relay.book else {}
    assert (model.status_code, model.json()["error"]["type"]) == (403, "permission_error")
    assert (size.status_code, size.json()["error"]["type"]) == (400, "invalid_request_error")
    assert junk.status_code == 400 and [f.status_code for f in fine] == [200, 200, 200]
    assert (burst.status_code, burst.headers["x-should-retry"]) == (429, "true") and int(burst.headers["retry-after"]) >= 1
    for refused in (model, size, junk):
        assert refused.headers["x-should-retry"] == "false"
        assert refused.json()["error"]["message"].startswith("Sprite OS refused the agent's call:")
    assert len(bridge.requests) == 3  # only the three allowed
    assert report["refused_today"] == {"model": 1, "max_tokens": 1, "invalid": 1, "rate": 1}


async def test_a_call_costs_what_its_reply_reports_and_the_day_stops_at_the_cap(
        bridge: MockBridge, tmp_path: Any) -> None:
    from sprite_os.spending import cost_usd

    bridge.agent.script(Turn(Text("expensive"), input_tokens=400_000, output_tokens=100))
    async with booked(bridge, tmp_path, daily_usd=6.01) as relay, cli(relay) as c:
        status, _, _ = await stream_bytes(c, BODY)
        assert relay.book is not None
        spent = relay.book.report()["spent_today_usd"]
        after = await c.post("/v1/messages", json=BODY)
    assert status == 200
    assert spent == pytest.approx(cost_usd("claude-test", 400_000, 100), abs=1e-6)  # priced as the dearest: $6.0075
    assert after.status_code == 429 and "daily budget of $6.01 is spent" in after.json()["error"]["message"]
    assert after.headers["x-should-retry"] == "false" and len(bridge.requests) == 1


async def test_a_reply_the_proxy_refused_costs_nothing_and_a_cut_one_its_input(
        bridge: MockBridge, tmp_path: Any) -> None:
    async with booked(bridge, tmp_path) as relay, cli(relay) as c:
        assert relay.book is not None
        bridge.faults.add(Fault("status", status=500, times=1))
        assert (await c.post("/v1/messages", json=BODY)).status_code == 500
        assert relay.book.report()["spent_today_usd"] == 0.0
        bridge.faults.add(Fault("cut", after_events=2, times=1))
        bridge.agent.script(Turn(Text("never finished"), input_tokens=1000))
        with pytest.raises(httpx2.RemoteProtocolError):
            await stream_bytes(c, BODY)
        await wait_for(lambda: relay.book is not None and relay.book.report()["in_flight_usd"] == 0.0, timeout=5)
        spent = relay.book.report()["spent_today_usd"]
    assert 0.0 < spent < 0.1  # 1,000 input tokens and a few bytes of output, not the worst case


def test_the_cli_is_told_the_ceiling(bridge: MockBridge, tmp_path: Any) -> None:
    relay = booked(bridge, tmp_path, max_tokens=777)
    relay._server = type("S", (), {"sockets": [type("K", (), {"getsockname": lambda self: ("127.0.0.1", 1)})()]})()
    assert relay.cli_env()["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "777"


async def test_calls_abandoned_before_the_reply_or_timed_out_cost_their_worst_case(
        bridge: MockBridge, tmp_path: Any) -> None:
    """The proxy bills a call it received whatever became of its reply: one the CLI gave up on before
    the reply's head, or one the proxy went silent on, is counted at its worst case."""
    from sprite_os.agent.budget import read_call

    body = json.dumps(BODY | {"max_tokens": 1000}).encode()
    worst = read_call(body, counts_tokens=False)
    assert not isinstance(worst, str)
    bridge.faults.add(Fault("latency", seconds=3, times=8))
    async with booked(bridge, tmp_path, daily_usd=8.5 * worst.worst_case_usd()) as relay, cli(relay) as c:
        assert relay.book is not None
        for n in range(1, 9):  # the CLI gives up once the proxy has the call (a timeout of its own would race
            # the relay's connection to the proxy: a call cut before that never reached it, and costs nothing)
            post = asyncio.create_task(c.post("/v1/messages", content=body))
            await bridge.wait_for(lambda b, n=n: len(b.requests) == n)  # type: ignore[misc]
            post.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await post
        await wait_for(lambda: relay.book is not None and relay.book.report()["in_flight_usd"] == 0.0, timeout=10,
                       what="the abandoned calls settled")
        spent = relay.book.report()["spent_today_usd"]
        refused = await c.post("/v1/messages", content=body)
    assert spent == pytest.approx(8 * worst.worst_case_usd(), rel=1e-6)
    assert refused.status_code == 429 and "daily budget" in refused.json()["error"]["message"]
    assert len(bridge.requests) == 8


async def test_a_call_the_cli_gave_up_on_before_it_left_the_relay_costs_nothing(
        bridge: MockBridge, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a loaded machine the relay's connection to the proxy can take longer than the CLI waits: a call
    cut then never reached the proxy, and costs nothing (it was counted at its worst case)."""
    async with booked(bridge, tmp_path) as relay, cli(relay) as c:
        assert relay.book is not None
        connecting = asyncio.Event()

        async def not_connected_yet(request: httpx2.Request, **kwargs: Any) -> httpx2.Response:
            connecting.set()
            await asyncio.sleep(3600)
            raise AssertionError("never")

        monkeypatch.setattr(await relay._upstream_client(), "send", not_connected_yet)
        post = asyncio.create_task(c.post("/v1/messages", json=BODY))
        await asyncio.wait_for(connecting.wait(), 10)
        post.cancel()  # the CLI gives up
        with contextlib.suppress(asyncio.CancelledError):
            await post
        await wait_for(lambda: relay.book is not None and relay.book.report()["in_flight_usd"] == 0.0, timeout=10,
                       what="the call settled")
        assert relay.book.report()["spent_today_usd"] == 0.0
    assert bridge.requests == []


async def test_a_call_the_proxy_went_silent_on_costs_its_worst_case_and_one_never_sent_nothing(
        tmp_path: Any) -> None:
    from sprite_os.agent.budget import AgentLimits
    from sprite_os.agent.spend_book import SpendBook

    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # accepts, then says nothing
    url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: refused
    limits = AgentLimits(frozenset({"claude-test"}), 10.0, 1000, 100)
    try:
        async with ModelRelay(url, PROXY_KEY, RelayLimits(upstream_read_timeout=0.5),
                              book=SpendBook(limits, tmp_path / "a.json")) as relay, cli(relay) as c:
            timed_out = await c.post("/v1/messages", json=BODY)
            assert relay.book is not None
            silent_spent = relay.book.report()["spent_today_usd"]
        async with ModelRelay(closed, PROXY_KEY, book=SpendBook(limits, tmp_path / "b.json")) as relay, \
                cli(relay) as c:
            unreachable = await c.post("/v1/messages", json=BODY)
            assert relay.book is not None
            unreachable_spent = relay.book.report()["spent_today_usd"]
    finally:
        silent.close()
    assert (timed_out.status_code, unreachable.status_code) == (504, 502)
    assert silent_spent > 0.0 and unreachable_spent == 0.0


async def test_a_client_that_pipelines_megabytes_during_a_call_is_dropped_not_buffered(bridge: MockBridge) -> None:
    """What a client sends during a call waits in the relay's memory: past a small bound its connection is
    dropped (and its call with it), so writing megabytes during a slow reply grows nothing."""
    bridge.faults.add(Fault("latency", seconds=5, times=1))
    async with ModelRelay(bridge.url, PROXY_KEY) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        body = json.dumps(BODY).encode()
        writer.write(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: " + relay.client_key.encode() +
                     b"\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode() +
                     b"\r\n\r\n" + body)
        await wait_for(lambda: relay.upstream_open == 0 and len(bridge.requests) == 1, timeout=5,
                       what="the call reached the proxy")
        sent, chunk = 0, b"x" * (1 << 20)
        started = time.monotonic()
        with contextlib.suppress(ConnectionError):
            while sent < 32 << 20 and time.monotonic() - started < 4:
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), 4)
                sent += len(chunk)
        try:
            dropped = await asyncio.wait_for(reader.read(), 10)  # EOF, or a reset: never the reply
        except ConnectionResetError:
            dropped = b""
        writer.close()
    assert dropped == b""  # held, the bytes waited for the reply (a 200) and then made a 400
    assert sent < 32 << 20  # the relay stopped taking them: nothing held them for it


async def test_calls_the_budget_cannot_bound_are_refused_before_the_proxy(bridge: MockBridge, tmp_path: Any) -> None:
    """An input by URL, a server tool, a premium beta or a key given twice: each could cost more than
    the budget reckons (16 such small calls reached $36 against a $10 cap). None reaches the proxy."""
    async with booked(bridge, tmp_path) as relay, cli(relay) as c:
        by_url = await c.post("/v1/messages", json=BODY | {"messages": [{"role": "user", "content": [
            {"type": "document", "source": {"type": "url", "url": "https://example.com/big.pdf"}}]}]})
        search = await c.post("/v1/messages", json=BODY | {"tools": [{"type": "web_search_20250305", "name": "web_search"}]})
        long_context = await c.post("/v1/messages", json=BODY, headers={"anthropic-beta": "context-1m-2025-08-07"})
        twice = await c.post("/v1/messages", content=b'{"model": "claude-test", "max_tokens": 64, "max_tokens": 64, '
                                                     b'"messages": []}')
        fine = await c.post("/v1/messages", json=BODY, headers={"anthropic-beta": "claude-code-20250219,effort-2025-11-24"})
        assert relay.book is not None
        report = relay.book.report()
    for refused in (by_url, search, long_context, twice):
        assert (refused.status_code, refused.headers["x-should-retry"]) == (400, "false")
        assert refused.json()["error"]["message"].startswith("Sprite OS refused the agent's call:")
    assert "could not bound" in long_context.json()["error"]["message"]
    assert fine.status_code == 200 and len(bridge.requests) == 1
    assert report["refused_today"] == {"unbounded": 3, "invalid": 1}


async def test_a_flood_of_empty_connections_never_closes_one_that_sent_its_head(bridge: MockBridge) -> None:
    """Any local user can open connections faster than the CLI sends its request: closing the oldest
    unverified one closed the CLI's (0 of 7 through, 130,000 connections in 20 s). The one to make
    room is the oldest that has said nothing."""
    limits = RelayLimits(max_unverified=4, head_timeout=60)
    body = json.dumps(BODY).encode()
    head = (b"POST /v1/messages/count_tokens HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n")
    async with ModelRelay(bridge.url, PROXY_KEY, limits) as relay:
        reader, writer = await asyncio.open_connection("127.0.0.1", relay.port)
        writer.write(head)  # the CLI's head, its key still on the way
        await writer.drain()  # read by the relay, or waiting in its socket: either way, it has said something
        flood = []
        try:
            for _ in range(40):
                flood.append(await asyncio.open_connection("127.0.0.1", relay.port))
            await wait_for(lambda: len(relay._unverified) <= 4, timeout=5, what="room made")
            writer.write(b"x-api-key: " + relay.client_key.encode() + b"\r\n\r\n" + body)
            answer = await asyncio.wait_for(reader.read(100), 10)
        finally:
            writer.close()
            for _, w in flood:
                w.close()
    assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_connection_accepted_as_the_relay_stops_never_reaches_the_proxy_nor_leaves_a_client(
        bridge: MockBridge) -> None:
    """A connection the listener took just before `stop` runs only after stop's cancelling: its
    request must not go on to the proxy, nor make the (lazily made) client towards it after stop."""
    relay = ModelRelay(bridge.url, PROXY_KEY)
    await relay.start()
    body = json.dumps(BODY).encode()
    raw = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
    try:
        raw.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: relay\r\ncontent-type: application/json\r\n"
                    b"x-api-key: " + relay.client_key.encode() + b"\r\nanthropic-version: 2023-06-01\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        late: asyncio.Task[Any] | None = None
        for _ in range(10_000):  # until the connection's task exists but has not run a step
            late = next((t for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "")
                         == "ModelRelay._serve" and inspect.getcoroutinestate(t.get_coro()) == "CORO_CREATED"),
                        None)
            if late is not None:
                break
            await asyncio.sleep(0)
        assert late is not None
        await relay.stop()
        await asyncio.wait_for(late, 10)
        assert bridge.requests == [] and relay._client is None
    finally:
        raw.close()
