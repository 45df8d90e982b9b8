"""`sprite-os chat` as a user runs it: a process on a terminal or pipe that stays open."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection, serve

from sprite_os import protocol as p
from tests.conftest import TOKEN

EXIT_BOUND = 30.0  # seconds: leaving is immediate; a client that did not leave would wait forever


async def _greet(ws: ServerConnection) -> None:
    """The server's side of a connection, reduced to what an idle chat needs: hello -> ready."""
    async for message in ws:
        if json.loads(message)["type"] == "hello":
            ready = p.Ready(seq=0, protocol=1, server_version="test", stream="s", session_id="sess",
                            last_seq=0, agent="idle", turn_id=None, cards=[])
            await ws.send(p.encode(ready).decode())


@pytest.fixture
async def fake_server() -> AsyncIterator[int]:
    async with serve(_greet, "127.0.0.1", 0) as server:
        yield server.sockets[0].getsockname()[1]


async def _chat_process(port: int | None, **env: str) -> asyncio.subprocess.Process:
    """`sprite-os chat --url` the server on `port`, or with `port` None, the server it finds."""
    url = ["--url", f"ws://127.0.0.1:{port}"] if port is not None else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sprite_os", "chat", *url, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SPRITE_")}, "SPRITE_OS_TOKEN": TOKEN, **env})
    assert proc.stdout is not None
    async with asyncio.timeout(30):  # start-up, then the ready line: the client is idle at its prompt
        while b"connected to session" not in await proc.stdout.readline():
            pass
    return proc


async def _exits_promptly(proc: asyncio.subprocess.Process) -> int:
    try:
        code = await asyncio.wait_for(proc.wait(), EXIT_BOUND)
        assert proc.stderr is not None
        errors = await proc.stderr.read()
        assert b"Traceback" not in errors and b"Fatal" not in errors  # the reading thread died quietly
        return code
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_quit_leaves_at_once_while_stdin_stays_open(fake_server: int) -> None:
    proc = await _chat_process(fake_server)
    assert proc.stdin is not None
    proc.stdin.write(b"/quit\n")  # and stdin stays open, as a terminal's does
    await proc.stdin.drain()
    assert await _exits_promptly(proc) == 0


async def test_ctrl_c_while_idle_leaves_at_once(fake_server: int) -> None:
    proc = await _chat_process(fake_server)
    proc.send_signal(signal.SIGINT)
    assert await _exits_promptly(proc) == 0


async def test_a_server_never_reached_is_one_clear_line_not_endless_retries() -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sprite_os", "chat", "--url", f"ws://127.0.0.1:{port}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "SPRITE_OS_TOKEN": TOKEN})
    try:
        out, _ = await asyncio.wait_for(proc.communicate(b"hello\n"), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 1
    assert f"! cannot connect to ws://127.0.0.1:{port}:".encode() in out and b"reconnecting" not in out


async def test_a_wrong_token_says_so() -> None:
    async with serve(_greet, "127.0.0.1", 0,
                     process_request=lambda conn, req: conn.respond(401, "")) as server:
        port = server.sockets[0].getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sprite_os", "chat", "--url", f"ws://127.0.0.1:{port}",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "SPRITE_OS_TOKEN": "a-wrong-token-0123456789"})
        out, _ = await asyncio.wait_for(proc.communicate(b""), 30)
    assert proc.returncode == 1 and b"HTTP 401 (wrong token" in out


def test_a_turn_shows_its_own_cost_and_the_sessions_and_a_failure_its_details() -> None:
    import io

    from sprite_os import protocol as p
    from sprite_os.commands.chat import Renderer

    out = io.StringIO()
    show = Renderer(out).show
    show(p.TurnComplete(turn_id="t", status="completed", duration_ms=1200, usage=p.Usage(), cost_usd=0.0003,
                        session_cost_usd=0.0009))
    show(p.Error(code="model_unavailable", message="The model proxy can't be reached.", turn_id="t",
                 detail="HTTP 502: API Error: 502 Bad Gateway"))
    assert out.getvalue() == ("· completed in 1.2s, $0.0003 (session $0.0009)\n"
                              "! model_unavailable: The model proxy can't be reached.\n"
                              "  (HTTP 502: API Error: 502 Bad Gateway)\n")


def test_a_turn_the_servers_stop_cut_is_said_stopped_by_the_server_not_interrupted() -> None:
    import io

    from sprite_os.commands.chat import Renderer

    out = io.StringIO()
    show = Renderer(out).show
    show(p.TurnComplete(turn_id="t", status="interrupted", duration_ms=1200, usage=p.Usage(), by_server=True))
    show(p.TurnComplete(turn_id="u", status="interrupted", duration_ms=300, usage=p.Usage()))
    assert out.getvalue() == "· stopped by the server in 1.2s\n· interrupted in 0.3s\n"


def test_a_message_the_server_refused_is_no_longer_waited_for() -> None:
    """Refused (queue_full, say), no turn of it will complete: a piped chat waiting for its messages'
    turns before it leaves would have waited for it for ever."""
    import io

    from sprite_os.commands.chat import Renderer

    r = Renderer(io.StringIO())
    r.sent("chat-1")
    r.sent("chat-2")
    r.show(p.Error(code="queue_full", message="16 messages are already waiting", client_id="chat-2"))
    r.show(p.Error(code="queue_full", message="someone else's", client_id="web-7"))
    assert r.outstanding == {"chat-1"} and not r.settled.is_set()
    r.show(p.Error(code="shutting_down", message="the server is stopping", client_id="chat-1"))
    assert r.settled.is_set()


async def test_each_message_has_a_client_id_of_its_own_across_runs_and_reconnects() -> None:
    """Every run sent `chat-1` first, and again after each reconnect. The server echoes a message's id
    to every client (turn_started) and the record keeps it: a piped chat took another run's turn for
    its own and left when that one completed, and a refusal of one message ended the wait for another."""
    ids: list[str] = []

    async def serve_and_drop(ws: ServerConnection) -> None:
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] == "hello":
                ready = p.Ready(seq=0, protocol=1, server_version="test", stream="s", session_id="sess",
                                last_seq=0, agent="idle", turn_id=None, cards=[])
                await ws.send(p.encode(ready).decode())
            elif frame["type"] == "user_message":
                ids.append(frame["client_id"])
                await ws.close()  # the link drops: the chat reconnects

    async def send_and_reconnect(proc: asyncio.subprocess.Process, line: bytes) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(line)
        await proc.stdin.drain()
        async with asyncio.timeout(30):  # sent, dropped, and connected again
            while b"connected to session" not in await proc.stdout.readline():
                pass

    async with serve(serve_and_drop, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        procs = list(await asyncio.gather(*(_chat_process(port) for _ in range(2))))
        try:
            for line in (b"first\n", b"second\n"):  # the two runs side by side: each reconnect waits 0.5 s
                await asyncio.gather(*(send_and_reconnect(proc, line) for proc in procs))
            assert len(ids) == 4 and len(set(ids)) == 4, ids
        finally:
            for proc in procs:
                proc.kill()
                await proc.wait()


async def test_a_line_over_the_message_limit_is_said_too_long_and_not_sent() -> None:
    """The server refuses text over MAX_USER_TEXT: chat says so plainly, sends nothing, a piped chat does
    not wait at its end for an answer to a message that was never sent, and exits 1 for it."""
    sent: list[str] = []

    async def serve_and_record(ws: ServerConnection) -> None:
        await ws.send(p.encode(p.Ready(seq=0, protocol=1, server_version="test", stream="s", session_id="sess",
                                       last_seq=0, agent="idle", turn_id=None, cards=[])).decode())
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] == "user_message":
                sent.append(frame["text"])

    async with serve(serve_and_record, "127.0.0.1", 0) as server:
        proc = await _chat_process(server.sockets[0].getsockname()[1])
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"x" * (p.MAX_USER_TEXT + 1) + b"\n")
        proc.stdin.close()
        assert await _exits_promptly(proc) == 1  # a message of the script did not run (it exited 0)
        said = (await proc.stdout.read()).decode()
        assert "! not sent: the message is too long to send: 100,001 characters, and the limit is 100,000" in said
        assert sent == []


async def test_without_a_url_chat_finds_the_port_the_environment_or_the_service_gave(
        fake_server: int, tmp_path: Path) -> None:
    """SPRITE_OS_PORT, or what `sprite-os service start` remembered of it (a shell that never set
    it is the usual case on a Sprite); not the default port regardless."""
    for name, env in (("given", {"SPRITE_OS_PORT": str(fake_server)}), ("remembered", {})):
        ws = tmp_path / name
        if name == "remembered":
            (ws / ".os" / "state").mkdir(parents=True)
            (ws / ".os" / "state" / "service.env").write_text(json.dumps({"SPRITE_OS_PORT": str(fake_server)}))
        proc = await _chat_process(None, SPRITE_WORKSPACE=str(ws), **env)  # it reached the fake server
        assert proc.stdin is not None
        proc.stdin.write(b"/quit\n")
        await proc.stdin.drain()
        assert await _exits_promptly(proc) == 0


@pytest.mark.parametrize(("ending", "code"), [("completed", 0), ("not_saved", 1), ("error", 1),
                                               ("connection_closed", 1), ("server_comes_back", 0)])
async def test_a_piped_chat_exits_non_zero_for_a_turn_that_failed_was_not_saved_or_never_finished(
        ending: str, code: int) -> None:
    """A script's `echo … | sprite-os chat` exited 0 when the server died mid-turn, and when its turn
    ended `error` or `saved: false` (only a separate line said so): "done" for a message that never
    finished, or was never saved. A connection that closes mid-turn is resumed, as a typed chat's is:
    exit 1 only if the resume finds the message gone (here a server that lost it), not for a blip
    (a script that retries on exit 1 would send the message again, and the agent run it twice)."""
    connections = 0

    async def serve_a_turn(ws: ServerConnection) -> None:
        nonlocal connections
        connections += 1
        back = connections > 1
        replay = [p.TurnComplete(seq=2, turn_id="t1", duration_ms=500, usage=p.Usage(), status="completed")]
        replay = replay if back and ending == "server_comes_back" else []
        await ws.send(p.encode(p.Ready(seq=1 if back else 0, protocol=1, server_version="test", stream="s",
                                       session_id="sess", last_seq=1 + len(replay), agent="idle", turn_id=None,
                                       cards=[], replayed=len(replay))).decode())
        for frame in replay:
            await ws.send(p.encode(frame).decode())
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] != "user_message":
                continue
            await ws.send(p.encode(p.TurnStarted(seq=1, turn_id="t1", text=frame["text"],
                                                 client_id=frame["client_id"])).decode())
            await asyncio.sleep(0.5)  # the chat has read the end of its input and waits for the turn
            if ending in ("connection_closed", "server_comes_back"):
                await ws.close()
                return
            await ws.send(p.encode(p.TurnComplete(seq=2, turn_id="t1", duration_ms=500, usage=p.Usage(),
                                                  status="error" if ending == "error" else "completed",
                                                  saved=ending != "not_saved")).decode())

    async with serve(serve_a_turn, "127.0.0.1", 0) as server:
        proc = await _chat_process(server.sockets[0].getsockname()[1])
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"hello\n")
        proc.stdin.close()
        assert await _exits_promptly(proc) == code
        said = (await proc.stdout.read()).decode()
    if ending == "not_saved":
        assert "· completed in 0.5s, saved: false" in said
    if ending in ("connection_closed", "server_comes_back"):
        assert connections == 2 and "connection lost; reconnecting" in said, said
    if ending == "connection_closed":
        assert "! after reconnecting, 1 of your messages were neither answered, running nor waiting" in said
    if ending == "server_comes_back":
        assert "· completed in 0.5s" in said and "!" not in said, said


async def test_a_long_script_is_fed_as_the_agent_takes_it_never_more_than_the_server_queues() -> None:
    """A piped chat sent every line at once: past the MAX_QUEUED_MESSAGES the server lets wait, the rest
    were refused `queue_full` and the run exited 1. It keeps fewer than that outstanding: every line runs,
    in order, and it exits 0."""
    lines = [f"step {n}" for n in range(p.MAX_QUEUED_MESSAGES * 2 + 3)]
    ran: list[str] = []
    refused = 0

    async def serve_one_at_a_time(ws: ServerConnection) -> None:
        nonlocal refused
        await ws.send(p.encode(p.Ready(seq=0, protocol=1, server_version="test", stream="s", session_id="sess",
                                       last_seq=0, agent="idle", turn_id=None, cards=[])).decode())
        waiting: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        seq = 0

        async def agent() -> None:  # one turn at a time, as the runtime runs them
            nonlocal seq
            while True:
                frame = await waiting.get()
                turn = f"t{len(ran)}"
                seq += 1
                await ws.send(p.encode(p.TurnStarted(seq=seq, turn_id=turn, text=frame["text"],
                                                     client_id=frame["client_id"])).decode())
                await asyncio.sleep(0.01)
                ran.append(frame["text"])
                waiting.task_done()
                seq += 1
                await ws.send(p.encode(p.TurnComplete(seq=seq, turn_id=turn, duration_ms=10, usage=p.Usage(),
                                                      status="completed")).decode())

        running = asyncio.create_task(agent())
        try:
            async for message in ws:
                frame = json.loads(message)
                if frame["type"] != "user_message":
                    continue
                if waiting.qsize() >= p.MAX_QUEUED_MESSAGES:
                    refused += 1
                    await ws.send(p.encode(p.Error(seq=seq, code="queue_full", message="full",
                                                   client_id=frame["client_id"])).decode())
                else:
                    waiting.put_nowait(frame)
        finally:
            running.cancel()

    async with serve(serve_one_at_a_time, "127.0.0.1", 0) as server:
        proc = await _chat_process(server.sockets[0].getsockname()[1])
        assert proc.stdin is not None
        proc.stdin.write("".join(f"{line}\n" for line in lines).encode())
        proc.stdin.close()
        assert await _exits_promptly(proc) == 0
    assert (ran, refused) == (lines, 0)


async def test_a_message_sent_before_the_ready_came_is_not_called_lost() -> None:
    """A piped chat sends its lines at once, before the server's ready: the server made that ready (its
    `waiting`) before it read them. The chat counted them lost ("after reconnecting, 1 of your messages
    were neither answered, running nor waiting"), left while the turn ran, and exited 1 on a healthy run."""
    async def ready_made_before_the_line(ws: ServerConnection) -> None:
        await ws.recv()  # the hello
        line = json.loads(await ws.recv())  # the script's line, on its way before the ready went
        await ws.send(p.encode(p.Ready(seq=0, protocol=1, server_version="test", stream="s", session_id="sess",
                                       last_seq=0, agent="idle", turn_id=None, cards=[])).decode())
        await ws.send(p.encode(p.TurnStarted(seq=1, turn_id="t1", text=line["text"],
                                             client_id=line["client_id"])).decode())
        await asyncio.sleep(0.3)
        await ws.send(p.encode(p.TurnComplete(seq=2, turn_id="t1", duration_ms=300, usage=p.Usage(),
                                              status="completed")).decode())
        async for _ in ws:
            pass

    async with serve(ready_made_before_the_line, "127.0.0.1", 0) as server:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "sprite_os", "chat", "--url", f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SPRITE_")}, "SPRITE_OS_TOKEN": TOKEN})
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"hello\n")
        proc.stdin.close()
        assert await _exits_promptly(proc) == 0
        said = (await proc.stdout.read()).decode()
    assert "· completed in 0.3s" in said and "!" not in said, said


async def test_a_piped_chat_gives_up_on_a_server_that_never_comes_back_with_lines_unsent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound on reconnecting applied only once the input had ended. A script longer than the server's
    queue is still mid-input when the server dies (its next line waits for room), so it reconnected every
    10 s forever, and a cron job or CI step that relied on exit 1 hung. A piped chat gives up after
    RESUME_WAIT whether or not its input ended."""
    import io

    from sprite_os.commands import chat

    monkeypatch.setattr(chat, "RESUME_WAIT", 1.0)
    script = "".join(f"step {n}\n" for n in range(p.MAX_QUEUED_MESSAGES + 4))
    monkeypatch.setattr(sys, "stdin", io.StringIO(script))  # not a terminal: a script's input
    got: list[str] = []
    full = asyncio.Event()

    async def take_then_die(ws: ServerConnection) -> None:  # takes the messages, runs none, then is gone
        async for message in ws:
            frame = json.loads(message)
            if frame["type"] == "hello":
                await ws.send(p.encode(p.Ready(seq=0, protocol=1, server_version="test", stream="s",
                                               session_id="sess", last_seq=0, agent="idle", turn_id=None,
                                               cards=[])).decode())
            elif frame["type"] == "user_message":
                got.append(frame["text"])
                if len(got) == p.MAX_QUEUED_MESSAGES:
                    full.set()

    out = io.StringIO()
    async with serve(take_then_die, "127.0.0.1", 0) as server:
        client = asyncio.create_task(chat.chat(f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}", TOKEN, out))
        await asyncio.wait_for(full.wait(), EXIT_BOUND)
    try:  # the server is gone for good, with the script's last lines unsent
        assert await asyncio.wait_for(asyncio.shield(client), 10) == 1
    finally:
        client.cancel()
    assert len(got) == p.MAX_QUEUED_MESSAGES
    assert "could not be reached again within 1s" in out.getvalue()
