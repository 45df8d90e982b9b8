"""One connection's rules, with the runtime faked: what a client gets when handling its frame fails."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import serve

from devkit.harness import make_settings
from sprite_os import gateway
from sprite_os.console import files_frames as pf
from sprite_os.console import requests as rq
from sprite_os.console import transfers
from sprite_os.errors import AlreadyTaken, QueueFull, ShuttingDown
from sprite_os.events import EventHub
from sprite_os.gateway import Gateway
from tests.conftest import client_factory, running


class FakeRuntime:
    session_id = "session-1"
    state = "idle"
    turn_id: str | None = None
    turn_text: str | None = None
    turn_client_id: str | None = None
    knows_commands = True

    def __init__(self) -> None:
        self.fail: Exception | None = None
        self.waiting: list[str] = []

    def submit(self, text: str, client_id: str | None = None) -> None:
        if self.fail is not None:
            raise self.fail

    def new_session(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def interrupt(self) -> bool:
        return False


class FakeCanvas:
    def cards(self) -> list[Any]:
        return []


@pytest.fixture
def runtime() -> FakeRuntime:
    return FakeRuntime()


@contextlib.asynccontextmanager
async def served(gateway: Gateway) -> AsyncIterator[ClientConnection]:
    async with serve(gateway.handle, "127.0.0.1", 0) as server:
        async with connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}") as client:
            yield client


@pytest.fixture
async def ws(runtime: FakeRuntime) -> AsyncIterator[ClientConnection]:
    async with served(Gateway(EventHub(), runtime, FakeCanvas(), "test")) as client:  # type: ignore[arg-type]
        yield client


async def send(ws: ClientConnection, **frame: Any) -> dict[str, Any]:
    await ws.send(json.dumps(frame))
    return json.loads(await ws.recv())


async def test_ready_names_the_messages_still_waiting_for_the_agent(ws: ClientConnection, runtime: FakeRuntime) -> None:
    runtime.waiting = ["web-1", "web-2"]  # queued behind the running turn, in order
    assert (await send(ws, type="hello"))["waiting"] == ["web-1", "web-2"]


async def test_ready_names_the_running_turns_client_id(ws: ClientConnection, runtime: FakeRuntime) -> None:
    """A reloaded page knows the running turn is its own message (not another device's) by this id."""
    runtime.turn_id, runtime.turn_text, runtime.turn_client_id = "t-1", "Hello", "web-1"
    ready = await send(ws, type="hello")
    assert (ready["turn_id"], ready["turn_text"], ready["turn_client_id"]) == ("t-1", "Hello", "web-1")


@pytest.mark.parametrize("frame", [
    "[" * 100_000 + "]" * 100_000,
    '{"type": "ping", "nonce": "a", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"type": "user_message", "text": ' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}",
])
async def test_a_frame_nested_100k_deep_is_an_invalid_frame_not_a_bug(ws: ClientConnection, frame: str) -> None:
    assert (await send(ws, type="hello"))["type"] == "ready"
    await ws.send(frame)
    answer = json.loads(await ws.recv())
    assert answer["type"] == "error" and answer["code"] == "invalid_frame", answer
    assert (await send(ws, type="ping", nonce="still"))["type"] == "pong"  # and the connection serves on


async def test_a_bug_handling_a_frame_is_internal_error_and_the_connection_stays(
        ws: ClientConnection, runtime: FakeRuntime) -> None:
    assert (await send(ws, type="hello"))["type"] == "ready"
    runtime.fail = RuntimeError("a bug near the user's words: SECRET PLANS")
    with capture_logs() as logs:
        error = await send(ws, type="user_message", text="SECRET PLANS", client_id="web-1")
    assert error["type"] == "error" and error["code"] == "internal_error"
    assert error["client_id"] is None  # the bug may have struck after the message was queued: not said refused
    [failed] = [e for e in logs if e["event"] == "frame_failed"]
    assert failed["log_level"] == "error" and failed["error"] == "RuntimeError"
    assert "SECRET" not in repr([e for e in logs if e["log_level"] != "debug"])
    assert await send(ws, type="ping", nonce="still-here") == {"type": "pong", "seq": 0, "nonce": "still-here"}


@pytest.fixture
async def still_ws(runtime: FakeRuntime) -> AsyncIterator[ClientConnection]:
    """`ws` with the rate limit's clock held still: on a busy machine, sending past the burst took long
    enough for the bucket to refill, the frame meant to be dropped was taken, and the test timed out."""
    gateway = Gateway(EventHub(), runtime, FakeCanvas(), "test", clock=lambda: 1000.0)  # type: ignore[arg-type]
    async with served(gateway) as client:
        yield client


async def past_the_burst(ws: ClientConnection, frame: dict[str, Any], field: str) -> dict[str, Any]:
    """Send `frame` past the rate's burst (it is dropped), and return the answer that names it by `field`."""
    assert (await send(ws, type="hello"))["type"] == "ready"
    for n in range(gateway.RATE_BURST):  # with the hello, past the burst: the clock held still, none comes back
        await ws.send(json.dumps({"type": "ping", "nonce": str(n)}))
    await ws.send(json.dumps(frame))
    async with asyncio.timeout(10):
        while True:
            answer: dict[str, Any] = json.loads(await ws.recv())
            if answer.get(field) == frame[field]:
                return answer


async def test_a_request_dropped_for_rate_is_answered_so_its_sender_never_waits(still_ws: ClientConnection) -> None:
    frame = await past_the_burst(still_ws, {"type": "upload_chunk", "request_id": "chunk-9", "upload_id": "u", "offset": 0,
                                      "data": ""}, "request_id")
    assert (frame["type"], frame["code"]) == ("error", "rate_limited") and "send it again" in frame["message"]


async def test_work_sent_while_shutting_down_gets_an_error(ws: ClientConnection, runtime: FakeRuntime) -> None:
    await send(ws, type="hello")
    runtime.fail = ShuttingDown("the server is shutting down")
    for frame in ({"type": "user_message", "text": "hi"}, {"type": "new_session"}):
        reply = await send(ws, **frame)
        assert (reply["type"], reply["code"], reply["client_id"]) == ("error", "shutting_down", None)


@pytest.mark.parametrize(("fail", "code"), [(QueueFull("16 messages are already waiting"), "queue_full"),
                                            (ShuttingDown("the server is shutting down"), "shutting_down")])
async def test_a_refused_message_is_named_by_its_client_id(ws: ClientConnection, runtime: FakeRuntime,
                                                           fail: Exception, code: str) -> None:
    """The sender learns which of its messages was refused, not only that one was."""
    await send(ws, type="hello")
    runtime.fail = fail
    reply = await send(ws, type="user_message", text="hi", client_id="web-2")
    assert (reply["type"], reply["code"], reply["client_id"]) == ("error", code, "web-2")


async def test_a_message_taken_already_is_answered_already_taken_with_where_it_ran(
        ws: ClientConnection, runtime: FakeRuntime) -> None:
    """Its sender marks the message taken (not refused: it offers no Send again), and can say where it ran."""
    await send(ws, type="hello")
    runtime.fail = AlreadyTaken("the agent took this message already", "session-0", "t-1")
    reply = await send(ws, type="user_message", text="hi", client_id="web-2")
    assert {k: reply[k] for k in ("type", "code", "client_id", "session_id", "turn_id")} == {
        "type": "error", "code": "already_taken", "client_id": "web-2", "session_id": "session-0", "turn_id": "t-1"}


@pytest.mark.parametrize("frame", [
    {"type": "user_message", "text": "", "client_id": "web-3"},  # empty
    {"type": "user_message", "text": "x" * 100_001, "client_id": "web-3"},  # too long
    {"type": "user_message", "client_id": "web-3"},  # no text
])
async def test_a_message_that_fails_validation_is_named_by_its_client_id(ws: ClientConnection,
                                                                         frame: dict[str, Any]) -> None:
    await send(ws, type="hello")
    reply = await send(ws, **frame)
    assert (reply["type"], reply["code"], reply["client_id"]) == ("error", "invalid_frame", "web-3")
    reply = await send(ws, type="ping", nonce="x", client_id="web-4")  # another frame's field names nothing
    assert reply["type"] == "pong"
    bad_id = await send(ws, type="user_message", text="", client_id="w" * 200)  # an id past the limit is not echoed
    assert (bad_id["code"], bad_id["client_id"]) == ("invalid_frame", None)


async def test_a_message_dropped_for_rate_is_answered_with_its_client_id(still_ws: ClientConnection) -> None:
    """Dropped unanswered, the message stayed "waiting for the agent" on its sender's page for ever."""
    frame = await past_the_burst(still_ws, {"type": "user_message", "text": "hi", "client_id": "web-9"}, "client_id")
    assert (frame["type"], frame["code"]) == ("error", "rate_limited") and "message was dropped" in frame["message"]


async def test_an_error_before_ready_carries_seq_0(ws: ClientConnection) -> None:
    error = await send(ws, type="teleport")  # no hello yet, and not a frame that implies one
    assert (error["code"], error["seq"]) == ("unknown_type", 0)


async def test_a_client_stalled_with_answers_queued_still_has_its_message_handled(tmp_path: Path) -> None:
    # A person on a stalled link (a train tunnel) with file chunks queued can still stop the agent or
    # send a message: only its requests wait for the answers queued to go out.
    settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
    async with running(settings, memory=False) as app, client_factory(app.port) as connect:
        (app.settings.layout.root / "big.bin").write_bytes(os.urandom(pf.CHUNK_BYTES))
        a = await connect(hello={})
        b = await connect(hello={})
        a.ws.transport.pause_reading()
        for n in range(30):  # past what the socket buffers and REPLY_BACKLOG hold
            await a.send(type="file_read", request_id=f"r{n}", path="big.bin")
        await asyncio.sleep(1.0)
        await a.send(type="user_message", text="stop what you're doing", client_id="m1")
        async with asyncio.timeout(10):  # the other device sees it: A's frames are still read
            while (await b.recv(timeout=10))["type"] not in ("user_message", "turn_started", "message_queued"):
                pass
        a.ws.transport.resume_reading()
        answers = []
        async with asyncio.timeout(30):
            while len(answers) < 30:
                if (frame := await a.recv(timeout=30)).get("request_id", "").startswith("r"):
                    answers.append(frame)
        busy = [f for f in answers if f["type"] == "error"]
        assert busy and all(f["code"] == "queue_full" and "send it again" in f["message"] for f in busy), busy
        assert len(answers) - len(busy) >= gateway.REQUEST_QUEUE  # the ones queued were answered


async def test_requests_are_answered_in_order_by_their_own_task_and_past_the_queue_are_busy(
        runtime: FakeRuntime) -> None:
    started, release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []
    clients: list[str] = []

    async def answer(request: rq.Request) -> rq.Reply:
        handled.append(request.request_id)
        clients.append(rq.client.get())
        started.set()
        await release.wait()
        raise rq.RequestFailed("not_found", "nothing here")

    left: list[str] = []
    gw = Gateway(EventHub(), runtime, FakeCanvas(), "test", answer, left=left.append)  # type: ignore[arg-type]
    async with serve(gw.handle, "127.0.0.1", 0) as server:
        async with connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}") as ws:
            assert (await send(ws, type="hello"))["type"] == "ready"
            for n in range(gateway.REQUEST_QUEUE + 3):  # q0 being answered, REQUEST_QUEUE waiting, 2 dropped
                await ws.send(json.dumps({"type": "memory_files", "request_id": f"q{n}"}))
                if n == 0:
                    await started.wait()
            dropped = [json.loads(await ws.recv()) for _ in range(2)]
            assert [(f["code"], f["request_id"]) for f in dropped] == [("queue_full", "q5"), ("queue_full", "q6")]
            # while a request is being answered, the connection's other frames are handled
            assert await send(ws, type="ping", nonce="p") == {"type": "pong", "seq": 0, "nonce": "p"}
            release.set()
            answered = [json.loads(await ws.recv())["request_id"] for _ in range(gateway.REQUEST_QUEUE + 1)]
            assert answered == handled == [f"q{n}" for n in range(gateway.REQUEST_QUEUE + 1)]
    assert len(set(clients)) == 1 and clients[0] and left == clients[:1]


async def test_a_request_being_answered_when_its_connection_ends_is_finished_not_cut(runtime: FakeRuntime) -> None:
    # An upload's chunk half-handled when the tab closes is finished (its write and its books agree);
    # the requests still waiting are dropped, and only then are the connection's downloads let go.
    started, release = asyncio.Event(), asyncio.Event()
    events: list[str] = []

    async def answer(request: rq.Request) -> rq.Reply:
        events.append(f"start {request.request_id}")
        started.set()
        await release.wait()
        events.append(f"end {request.request_id}")
        raise rq.RequestFailed("not_found", "nothing here")

    gw = Gateway(EventHub(), runtime, FakeCanvas(), "test", answer,  # type: ignore[arg-type]
                 left=lambda key: events.append("left"))
    async with serve(gw.handle, "127.0.0.1", 0) as server:
        async with connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}") as ws:
            assert (await send(ws, type="hello"))["type"] == "ready"
            for n in range(3):
                await ws.send(json.dumps({"type": "memory_files", "request_id": f"q{n}"}))
            await started.wait()
        await asyncio.sleep(0.1)  # the connection is gone
        assert events == ["start q0"]
        release.set()
        async with asyncio.timeout(10):
            while "left" not in events:
                await asyncio.sleep(0.01)
    assert events == ["start q0", "end q0", "left"]


async def test_a_request_whose_work_was_cancelled_fails_alone_and_the_next_is_answered(runtime: FakeRuntime) -> None:
    """A handler's awaited future cancelled elsewhere (a worker stopped, a shield let go) raises
    CancelledError inside the connection's request task: that request fails; the task goes on."""
    async def answer(request: rq.Request) -> rq.Reply:
        if request.request_id == "first":
            never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            never.cancel()
            await never
        raise rq.RequestFailed("not_found", "nothing here")

    gw = Gateway(EventHub(), runtime, FakeCanvas(), "test", answer)  # type: ignore[arg-type]
    async with serve(gw.handle, "127.0.0.1", 0) as server:
        async with connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}") as ws:
            assert (await send(ws, type="hello"))["type"] == "ready"
            for request_id in ("first", "second"):
                await ws.send(json.dumps({"type": "memory_files", "request_id": request_id}))
            got = [json.loads(await asyncio.wait_for(ws.recv(), 5)) for _ in range(2)]
    assert [(f["code"], f["request_id"]) for f in got] == [("internal_error", "first"), ("not_found", "second")]


async def test_a_slow_aside_request_holds_up_none_of_the_quick_ones(runtime: FakeRuntime) -> None:
    """A forget runs for tens of seconds: the connection's listings and download chunks are
    answered meanwhile, in their order; forgets wait for each other, in theirs, and are bounded."""
    started, release = asyncio.Event(), asyncio.Event()
    forgets: list[str] = []

    async def answer(request: rq.Request) -> rq.Reply:
        if request.aside:
            forgets.append(request.request_id)
            started.set()
            await release.wait()
        raise rq.RequestFailed("not_found", f"answered {request.request_id}")

    gw = Gateway(EventHub(), runtime, FakeCanvas(), "test", answer)  # type: ignore[arg-type]
    async with serve(gw.handle, "127.0.0.1", 0) as server, contextlib.AsyncExitStack() as stack:
        stack.callback(release.set)  # whatever fails: a connection ends only once its forget has
        async with connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}") as ws:
            assert (await send(ws, type="hello"))["type"] == "ready"
            for n in range(1 + gateway.ASIDE_QUEUE + 1):  # one answered, ASIDE_QUEUE waiting, one dropped
                await ws.send(json.dumps({"type": "forget_turns", "request_id": f"f{n}", "turn_ids": ["t"]}))
                if n == 0:
                    await asyncio.wait_for(started.wait(), 5)
            dropped = json.loads(await asyncio.wait_for(ws.recv(), 5))
            assert (dropped["code"], dropped["request_id"]) == ("queue_full", f"f{gateway.ASIDE_QUEUE + 1}")
            quick = []
            for n in range(2 * gateway.REQUEST_QUEUE):  # more than the quick queue holds: each is answered
                await ws.send(json.dumps({"type": "memory_files", "request_id": f"q{n}"}))
                quick.append(json.loads(await asyncio.wait_for(ws.recv(), 5))["request_id"])
            assert quick == [f"q{n}" for n in range(2 * gateway.REQUEST_QUEUE)] and forgets == ["f0"]
            release.set()
            answered = [json.loads(await asyncio.wait_for(ws.recv(), 5))["request_id"]
                        for _ in range(1 + gateway.ASIDE_QUEUE)]
            assert answered == forgets == [f"f{n}" for n in range(1 + gateway.ASIDE_QUEUE)]



@contextlib.asynccontextmanager
async def _stopping_while_asked(gw: Gateway, asked: asyncio.Event) -> AsyncIterator[ClientConnection]:
    """A client connected that sent a request; once `asked` is set, the server begins to stop."""
    async with serve(gw.handle, "127.0.0.1", 0) as server:
        async with connect(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}") as ws:
            assert (await send(ws, type="hello"))["type"] == "ready"
            await ws.send(json.dumps({"type": "memory_files", "request_id": "r"}))
            await asyncio.wait_for(asked.wait(), 5)
            gw.stop_requests()
            yield ws


async def test_a_stop_is_bounded_even_when_a_cut_request_waits_for_its_thread(runtime: FakeRuntime) -> None:
    # A cut download chunk still waits for its read's thread (settled): the stop waits CUT_WAIT for it,
    # not for the thread.
    started, release = asyncio.Event(), threading.Event()

    async def answer(request: rq.Request) -> rq.Reply:
        started.set()
        await transfers.settled(asyncio.to_thread(release.wait, 10))  # a thread that outlives the grace
        raise rq.RequestFailed("not_found", "late")

    gw = Gateway(EventHub(), runtime, FakeCanvas(), "test", answer)  # type: ignore[arg-type]
    async with _stopping_while_asked(gw, started):
        with capture_logs() as logs:
            stop = asyncio.ensure_future(gw.requests_done(0.05))
            await asyncio.wait_for(asyncio.shield(stop), 5)  # main: waits for the thread, ended below
        release.set()
    assert [e["event"] for e in logs] == ["requests_cut_at_shutdown", "requests_not_ended_at_shutdown"]


async def test_a_request_cut_while_waiting_for_room_for_its_answer_is_answered(
        runtime: FakeRuntime, monkeypatch: pytest.MonkeyPatch) -> None:
    # A client that doesn't read its answers: its next request waits for the backlog to go down when
    # the stop cuts it; it is told shutting_down, as one cut while being answered is.
    waiting = asyncio.Event()

    async def no_room(self: object) -> None:
        waiting.set()
        await asyncio.Event().wait()

    async def answer(request: rq.Request) -> rq.Reply:
        raise AssertionError("never handled")

    monkeypatch.setattr(gateway._Connection, "_backlog_room", no_room)
    gw = Gateway(EventHub(), runtime, FakeCanvas(), "test", answer)  # type: ignore[arg-type]
    async with _stopping_while_asked(gw, waiting) as ws:
        await gw.requests_done(0.05)
        got = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert (got["type"], got["code"], got["request_id"]) == ("error", "shutting_down", "r")
