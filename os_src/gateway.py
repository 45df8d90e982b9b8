"""Message routing: each WebSocket connection in, the shared event stream out.

A connection's first frame is `hello` (any other frame implies a hello without
`last_seq`). The gateway answers with `ready`, replays what the client missed,
and from then on the connection receives every broadcast event through its own
bounded queue, drained by its own writer task. Frames the client sends are
validated, rate-limited and dispatched to the runtime; each bad frame gets an
`error` reply and the connection stays open unless the client floods it. Requests
(memory, past sessions, files: console/requests.py) are answered to their connection alone,
by the `requests` callable the server passes in (console/requests.ConsoleApi), one at a time
and in order by the connection's own request task, so that a slow answer, or a client that
does not read its answers, never holds up its messages and interrupts. A request whose type is
`aside` (a forget, which can take seconds) is answered by a second task of the connection's,
in order with the other aside ones, so the quick ones (a listing, a download's chunks) never wait
behind it. At shutdown the gateway takes no more requests and lets those in flight end (bounded)
before the server stops what answers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from . import protocol as p
from .console import requests as rq
from .errors import AlreadyTaken, QueueFull, ShuttingDown
from .events import EventHub, Subscriber
from .logs import get_logger
from .runtime import AgentRuntime
from .tools.canvas import CanvasStore

log = get_logger(__name__)

MAX_FRAME_CHARS = 1024 * 1024  # larger frames get frame_too_large (the socket's hard cap is 4 MiB)
RATE_PER_SECOND = 20.0
RATE_BURST = 60
FLOOD_LIMIT = 200  # frames dropped for rate within one minute before the connection is closed
# Answers to requests waiting to go out before this client's next request is handled: a client that
# asks for file chunks faster than it reads them gets its answers as fast as it reads them, and the
# server holds at most this much of them (plus the batch its writer is sending).
REPLY_BACKLOG = 1024 * 1024
# Requests read and waiting for their turn; past this, a request is answered `queue_full` (never handled:
# send it again). The frames themselves are at most MAX_FRAME_CHARS each.
REQUEST_QUEUE = 4
ASIDE_QUEUE = 2  # the same, for the aside requests (forgets) waiting behind the one being answered
NOT_TAKEN = "the server is stopping; this request was not handled: send it again after reconnecting"

CUT_WAIT = 0.5  # seconds a stop waits for the requests it cut past their grace to end

CLOSE_LAGGING = 4000  # fell too far behind; reconnect with hello.last_seq to resume
LAGGING_CLOSE_TIMEOUT = 2.0
CLOSE_DRAIN_TIMEOUT = 0.5  # at shutdown, how long queued frames may take to go out before the close frame
CLOSE_POLICY = 1008  # flooding


@dataclass
class _TokenBucket:
    rate: float = RATE_PER_SECOND
    burst: float = RATE_BURST
    tokens: float = RATE_BURST
    stamp: float = 0.0

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


Requests = Callable[[rq.Request], Awaitable[rq.Reply]]
Left = Callable[[str], None]  # told a connection's client key when the connection ends
_keys = itertools.count(1)


class Gateway:
    def __init__(self, hub: EventHub, runtime: AgentRuntime, canvas: CanvasStore, server_version: str,
                 requests: Requests | None = None, left: Left | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hub = hub
        self.runtime = runtime
        self.canvas = canvas
        self.server_version = server_version
        self.requests = requests  # None: every request is answered memory_unavailable
        self.left = left
        self.connections: set[_Connection] = set()
        self.stopping = False  # stop_requests was called: no request is taken any more
        self.clock = clock  # the rate limit's time (a test holds it still: its burst then can't refill)

    async def handle(self, ws: ServerConnection) -> None:
        conn = _Connection(ws, self)
        self.connections.add(conn)
        log.info("client_connected", client=conn.name, clients=len(self.connections))
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            log.info("client_disconnected", client=conn.name, clients=len(self.connections),
                     code=ws.close_code)

    async def close_all(self, code: int = 1001, reason: str = "server shutting down") -> None:
        """Send what is queued, then close every connection."""
        await asyncio.gather(*(c.close(code, reason) for c in list(self.connections)), return_exceptions=True)

    def stop_requests(self) -> None:
        """The server is stopping: every request from now on, and each one still waiting its turn,
        is answered shutting_down; the ones being answered go on (requests_done waits for them)."""
        self.stopping = True
        for conn in list(self.connections):
            conn.stop_requests()

    async def requests_done(self, grace: float) -> None:
        """Wait for the requests being answered to end; past `grace` seconds, cut them (shutting_down)."""
        tasks = [task for conn in list(self.connections) for task in conn.request_tasks()]
        if not tasks:
            return
        _, cut = await asyncio.wait(tasks, timeout=grace)
        if cut:
            log.warning("requests_cut_at_shutdown", requests=len(cut), after_s=grace)
            for task in cut:
                task.cancel()
            # A cut request may still wait for a thread (a file's read or write, which a cancel can't
            # stop): the stop goes on without it after CUT_WAIT; what it holds goes with the process.
            _, stuck = await asyncio.wait(cut, timeout=CUT_WAIT)
            if stuck:
                log.warning("requests_not_ended_at_shutdown", requests=len(stuck), after_s=CUT_WAIT)


class _Connection:
    def __init__(self, ws: ServerConnection, gateway: Gateway) -> None:
        self.ws = ws
        self.gw = gateway
        self.sub = Subscriber(on_overflow=self._lagging)
        self.name = f"{ws.remote_address[0] if ws.remote_address else '?'}#{id(ws) % 100000}"
        self._greeted = False
        self._bucket = _TokenBucket(stamp=gateway.clock())
        self._dropped: list[float] = []
        self._last_rate_error = 0.0
        self._writer: asyncio.Task[None] | None = None
        self._closing: asyncio.Task[None] | None = None  # a flooder's close, under way
        self.key = f"c{next(_keys)}"  # what the console's requests know this connection by (rq.client)
        self._quick = _Lane(REQUEST_QUEUE)
        self._aside = _Lane(ASIDE_QUEUE)

    async def run(self) -> None:
        self._writer = asyncio.create_task(self._write(), name=f"ws-writer-{self.name}")
        token = rq.client.set(self.key)  # the request tasks' contexts copy it
        quick = self._quick.task = asyncio.create_task(self._answer(self._quick), name=f"ws-requests-{self.name}")
        aside = self._aside.task = asyncio.create_task(self._answer(self._aside), name=f"ws-requests-aside-{self.name}")
        rq.client.reset(token)
        try:
            async for message in self.ws:
                await self._receive_safely(message)
        except ConnectionClosed:
            pass
        finally:
            self.gw.hub.unsubscribe(self.sub)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
            if self._closing is not None:
                with contextlib.suppress(ConnectionClosed):
                    await self._closing
            # The requests being answered are answered (never cut mid-way, as an upload's write);
            # those still waiting are dropped: nobody is left to read their answers.
            for lane in (self._quick, self._aside):
                lane.end()
            try:
                await asyncio.wait([quick])
                # The downloads were the quick lane's: they linger now, while a forget may still run.
                try:
                    if self.gw.left is not None:
                        self.gw.left(self.key)
                finally:  # the aside lane's task is awaited whatever the console did
                    await asyncio.wait([aside])
            except asyncio.CancelledError:  # the server's hard stop: they go too
                quick.cancel()
                aside.cancel()
                raise

    def stop_requests(self) -> None:
        for lane in (self._quick, self._aside):
            for frame in lane.end():
                self._error("shutting_down", NOT_TAKEN, frame.request_id)

    def request_tasks(self) -> list[asyncio.Task[None]]:
        return [lane.task for lane in (self._quick, self._aside) if lane.task is not None]

    async def close(self, code: int, reason: str) -> None:
        # What is queued goes out before the close frame; a client that stopped reading can't
        # hold the close up for longer than the timeout.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.sub.drained.wait(), CLOSE_DRAIN_TIMEOUT)
        await self.ws.close(code, reason)

    def _lagging(self) -> None:
        if self._writer is not None:
            self._writer.cancel()

    async def _write(self) -> None:
        """The one task that writes to this socket. It ends when the client falls too far behind."""
        try:
            while True:
                batch = await self.sub.next_batch()
                if not batch:
                    break
                for data in batch:
                    await self.ws.send(data, text=True)
                self.sub.batch_sent()
        except ConnectionClosed:
            return
        except asyncio.CancelledError:
            if not self.sub.overflowed:
                raise
        log.warning("client_lagging", client=self.name)
        try:  # a client that stopped reading can't take a close frame either: then drop the socket
            await asyncio.wait_for(self.ws.close(CLOSE_LAGGING, "too far behind; reconnect with last_seq"),
                                   LAGGING_CLOSE_TIMEOUT)
        except (TimeoutError, ConnectionClosed):
            self.ws.transport.abort()

    def _reply(self, frame: p.ServerFrame | rq.Reply) -> None:
        """A frame for this client alone. It repeats the last seq this client was sent."""
        self.sub.push_direct(p.encode(p.with_seq(frame, self.sub.last_seq)))

    def _error(self, code: p.ErrorCode, message: str, request_id: str | None = None,
               client_id: str | None = None) -> None:
        self._reply(p.Error(code=code, message=message, request_id=request_id, client_id=client_id))

    async def _receive_safely(self, message: str | bytes) -> None:
        """One frame's bug costs that frame, not the connection: the client gets internal_error."""
        try:
            await self._receive(message)
        except ConnectionClosed:
            raise
        except Exception as exc:  # no user content at info: the type names the bug, the traceback at debug
            log.error("frame_failed", client=self.name, error=type(exc).__name__)
            log.debug("frame_failed_detail", client=self.name, exc_info=True)
            self._error("internal_error", "the server failed to handle this frame; it keeps serving")

    async def _receive(self, message: str | bytes) -> None:
        if self._closing is not None:  # closed for flooding: what it sent meanwhile is read and dropped
            return
        now = self.gw.clock()
        if not self._bucket.take(now):
            await self._rate_limited(now, message)
            return
        if isinstance(message, bytes):
            self._error("binary_not_supported", "frames must be JSON text, not binary")
            return
        if len(message) > MAX_FRAME_CHARS:  # a message named (a paste too long), or its page waits for ever
            # Its client_id is read from the whole frame (up to the socket's 4 MiB cap): msgspec scans the
            # rest without building it, about 1 ms of CPU for 4 MiB of text (4 for as much of small values),
            # once per refused frame, and the rate limit above bounds how many that can be.
            self._error("frame_too_large", f"frames are limited to {MAX_FRAME_CHARS} characters",
                        client_id=p.ids_of(message).client_id)
            return
        try:
            frame = p.decode_client_frame(message)
        except p.FrameError as exc:
            ids = p.ids_of(message)
            self._error(exc.code, exc.message, ids.request_id, ids.client_id)
            return
        if not self._greeted:
            self._hello(frame if isinstance(frame, p.Hello) else p.Hello())
            if isinstance(frame, p.Hello):
                return
        await self._dispatch(frame)

    async def _rate_limited(self, now: float, message: str | bytes) -> None:
        self._dropped = [t for t in self._dropped if now - t < 60.0]
        self._dropped.append(now)
        if len(self._dropped) > FLOOD_LIMIT:
            log.warning("client_flooding", client=self.name)
            # Not awaited here: the close waits for the client's answer, which comes after the frames it
            # flooded with, and only this loop reads them (awaited, it waited out the 10 s close timeout).
            self._closing = asyncio.create_task(self.ws.close(CLOSE_POLICY, "too many frames"))
            return
        # A dropped request (an upload's chunk) is answered, or its sender would wait for ever; so is a
        # dropped message that names itself, or its sender would show it waiting for the agent for ever.
        ids = p.ids_of(message) if len(message) <= MAX_FRAME_CHARS else p.RefusedIds()
        request_id = ids.request_id
        client_id = ids.client_id if request_id is None else None
        if request_id is not None or client_id is not None:
            self._error("rate_limited", f"more than {RATE_PER_SECOND:g} frames per second; this "
                        f"{'request' if request_id is not None else 'message'} was dropped: send it again",
                        request_id, client_id)
        elif now - self._last_rate_error >= 1.0:  # one notice per second, not one per dropped frame
            self._last_rate_error = now
            self._error("rate_limited", f"more than {RATE_PER_SECOND:g} frames per second; frames were dropped")

    async def _backlog_room(self) -> None:
        """Over REPLY_BACKLOG queued: wait until the writer has taken it to send (or has stopped)."""
        while self.sub.queued_bytes > REPLY_BACKLOG and self._writer is not None and not self._writer.done():
            taken = asyncio.ensure_future(self.sub.taken())
            try:
                await asyncio.wait([taken, self._writer], return_when=asyncio.FIRST_COMPLETED)
            finally:
                taken.cancel()

    def _hello(self, hello: p.Hello) -> None:
        hub, rt = self.gw.hub, self.gw.runtime
        if hello.protocol > p.PROTOCOL_VERSION:
            self._error("unsupported_protocol",
                        f"this server speaks protocol {p.PROTOCOL_VERSION}, not {hello.protocol}")
        replay: list[bytes] | None = None
        if hello.last_seq is not None and hello.stream == hub.stream:  # a seq means nothing without its stream
            replay = hub.replay_since(hello.last_seq)
        base = hello.last_seq if replay is not None and hello.last_seq is not None else hub.seq
        ready = p.Ready(
            seq=base,
            protocol=p.PROTOCOL_VERSION,
            server_version=self.gw.server_version,
            stream=hub.stream,
            session_id=rt.session_id,
            last_seq=hub.seq,
            agent=rt.state,
            turn_id=rt.turn_id,
            turn_text=rt.turn_text,
            turn_client_id=rt.turn_client_id,
            waiting=rt.waiting,
            knows_commands=rt.knows_commands,
            cards=self.gw.canvas.cards(),
            replayed=len(replay or ()),
            resync=hello.last_seq is not None and replay is None,
        )
        # No await between the snapshot and subscribing: no event can fall in between.
        self.sub.push_direct(p.encode(ready))
        for data in replay or ():
            self.sub.push_direct(data)
        hub.subscribe(self.sub)
        self._greeted = True
        log.info("client_ready", client=self.name, client_name=hello.client, last_seq=hello.last_seq,
                 replayed=ready.replayed, resync=ready.resync)

    async def _dispatch(self, frame: p.AnyClientFrame) -> None:
        rt = self.gw.runtime
        match frame:
            case p.UserMessage(text=text, client_id=client_id):
                try:
                    rt.submit(text, client_id)
                except AlreadyTaken as exc:  # not an error to act on: the page marks its message taken
                    self._reply(p.Error(code="already_taken", message=str(exc), client_id=client_id,
                                        session_id=exc.session_id, turn_id=exc.turn_id))
                except QueueFull as exc:
                    self._error("queue_full", str(exc), client_id=client_id)
                except ShuttingDown as exc:
                    self._error("shutting_down", str(exc), client_id=client_id)
            case p.Interrupt():
                if not await rt.interrupt():
                    self._error("nothing_to_interrupt", "the agent is not running a turn")
            case p.NewSession():
                try:
                    rt.new_session()
                except ShuttingDown as exc:
                    self._error("shutting_down", str(exc))
            case p.Ping(nonce=nonce):
                self._reply(p.Pong(nonce=nonce))
            case rq.Request():
                self._queue_request(frame)
            case p.Hello():
                self._error("invalid_frame", "hello is only valid as a connection's first frame")

    def _queue_request(self, frame: rq.Request) -> None:
        if self.gw.requests is None:
            self._error("memory_unavailable", "this server runs without memory", frame.request_id)
            return
        if self.gw.stopping:
            self._error("shutting_down", NOT_TAKEN, frame.request_id)
            return
        lane = self._aside if frame.aside else self._quick
        try:
            lane.queue.put_nowait(frame)
        except asyncio.QueueFull:
            waiting = lane.queue.maxsize
            self._error("queue_full", f"{waiting} requests are waiting for their answers; this one was dropped: "
                        "send it again once they are answered", frame.request_id)

    async def _answer(self, lane: _Lane) -> None:
        """One of the connection's request tasks: each request of its lane in turn, the next one only
        once the answers still queued are back under REPLY_BACKLOG."""
        while (frame := await lane.queue.get()) is not None:
            try:
                await self._backlog_room()
            except asyncio.CancelledError:
                self._cut(frame)
                raise
            await self._request(frame)

    def _cut(self, frame: rq.Request) -> None:
        """This task is being cancelled: at a stop, the client is told its request was cut."""
        if self.gw.stopping:
            self._error("shutting_down", "the server stopped before this request was answered", frame.request_id)

    async def _request(self, frame: rq.Request) -> None:
        answer, request_id = self.gw.requests, frame.request_id
        assert answer is not None  # _queue_request queues none without it
        try:
            try:
                self._reply(await answer(frame))
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    self._cut(frame)  # cut at shutdown, past the requests' grace: the client is told
                    raise  # the connection or the server is ending
                # a future the handler awaited was cancelled, not this task: a failed request, and the
                # connection's request task must go on answering the next ones
                raise RuntimeError("the request's work was cancelled") from None
        except rq.RequestFailed as exc:
            self._error(exc.code, exc.message, request_id)
        except Exception as exc:  # as in _receive_safely, but the error names the request it answers
            log.error("request_failed", client=self.name, request=frame.__struct_config__.tag,
                      error=type(exc).__name__)
            log.debug("request_failed_detail", client=self.name, exc_info=True)
            self._error("internal_error", "the server failed to answer this request; it keeps serving", request_id)


class _Lane:
    """Requests answered one at a time, in order, by one task of the connection's."""

    def __init__(self, waiting: int) -> None:
        self.queue: asyncio.Queue[rq.Request | None] = asyncio.Queue(waiting)  # None: the end
        self.task: asyncio.Task[None] | None = None  # the one answering them, from run()'s start

    def end(self) -> list[rq.Request]:
        """Take the requests still waiting (never handled) and let the task end after the one it
        is answering."""
        dropped: list[rq.Request] = []
        while not self.queue.empty():
            if (frame := self.queue.get_nowait()) is not None:
                dropped.append(frame)
        self.queue.put_nowait(None)  # room: it was just emptied
        return dropped
