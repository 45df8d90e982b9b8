"""The model relay: the agent's CLI reaches the model proxy through the server, which adds the key.

Whatever is in the CLI's environment, the agent can read (`printenv`, /proc/$PPID/environ), and
with isolation the agent runs as the CLI's user. So the CLI never gets the proxy's key: it gets
ANTHROPIC_BASE_URL=http://127.0.0.1:<port> of this relay and a key of the relay's own, made at
start. The relay checks that key, swaps in the real one, and forwards:

- only the Messages API calls the CLI makes (`ROUTES`), by their exact paths: anything else gets
  404, and what goes to the proxy is the route's own path, never the bytes the client sent;
- only calls the agent's budget allows (agent/budget.py: the models, max_tokens, the rate, the
  day's spending), whose cost it then reads from the reply's usage (agent/usage.py);
- the response as it comes (SSE included), status and headers (retry-after, x-should-retry,
  request-id) untouched, so the CLI retries as it would against the proxy itself;
- with backpressure: the next chunk is read from the proxy only once the CLI has taken the last,
  and a CLI that goes away (an interrupt) closes its request to the proxy at once, as does one that
  sends more than 64 KiB during a call (held, it would grow the relay without bound).

It is bounded, since any local user can connect to it and the agent can send it anything: a body
of 8 MiB at most, all bodies being read together within a memory budget, every request head and
body within a deadline, and at most 16 connections that presented the key. Connections that have
not yet presented it are counted apart, the oldest that has said nothing making room for the
newest, so that silent connections from another user, or a flood of new ones, cannot keep the CLI
out once it has sent its request's head.

When the proxy can't be reached, or says nothing in time, the CLI gets 502 or 504 with an
Anthropic-style error body (and `x-should-retry: true`), which it retries like any 5xx.
HTTP is h11 (sans-I/O) towards the CLI and httpx towards the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import json
import os
import secrets
import struct
import termios
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import h11
import httpx2 as httpx

from ..errors import SpriteOSError
from ..logs import get_logger
from .budget import Call, Refusal, read_call
from .spend_book import SpendBook
from .usage import UsageMeter

log = get_logger(__name__)

# All the CLI calls (the mock Bridge records), by exact path. What goes to the proxy is the path here.
MESSAGES, COUNT_TOKENS = b"/v1/messages", b"/v1/messages/count_tokens"
ROUTES = frozenset({MESSAGES, COUNT_TOKENS})
QUERIES = frozenset({b"", b"beta=true"})  # the CLI sends ?beta=true
DEFAULT_UPSTREAM = "https://api.anthropic.com"
PLACEHOLDER_KEY = "sprite-os"  # what the proxy got before there was a relay, when no key is set
READ_CHUNK = 64 * 1024
LINGER_SECONDS = 2.0
WRITE_BUFFER_BYTES = 64 * 1024  # unsent bytes held for a slow CLI before the relay waits for it
PIPELINED_BYTES = 64 * 1024  # what a client may send during a call, before its connection is dropped
SEND_CHUNK = 256 * 1024  # a held body goes to the proxy in slices of this (no copy of it whole)

# Framing and connection headers belong to each hop; credentials are the relay's to set; the reply
# comes unencoded, so its usage can be read (agent/usage.py).
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
                         b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# The relay holds the body whole, so `expect: 100-continue` was answered here.
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"expect", b"x-api-key", b"authorization",
                                b"accept-encoding"}
# What httpx raises when no connection to the proxy was made: the request never left.
_NEVER_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
                504: "timeout_error", 529: "overloaded_error"}


class RelayError(SpriteOSError):
    """The relay cannot start (it listens on a loopback port the system picks)."""


@dataclass(frozen=True)
class RelayLimits:
    max_body_bytes: int = 8 * 1024 * 1024  # a long turn's request is a few hundred KiB; the API allows 32 MiB
    max_buffered_bytes: int = 16 * 1024 * 1024  # all bodies being read or sent, together: two at the limit
    max_connections: int = 16  # connections that presented the key (the CLI uses a few)
    max_unverified: int = 32  # connections yet to present it: the oldest is closed to make room
    max_header_bytes: int = 64 * 1024
    idle_timeout: float = 75.0  # a kept-alive connection's wait for the next request
    head_timeout: float = 10.0  # a request's head, from the connection (or its first byte) to its end
    body_timeout: float = 60.0  # a request's body, whole (the CLI's arrives in milliseconds)
    connect_timeout: float = 5.0  # to the proxy: a proxy that is down is told within seconds
    upstream_read_timeout: float = 600.0  # silence from the proxy, as long as the CLI itself waits
    write_timeout: float = 60.0  # a CLI that takes nothing for this long is dropped, with its upstream


# ---------------------------------------------------------------- pure rules


def error_body(status: int, message: str) -> bytes:
    """An Anthropic-style error body, as the proxy would send."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def route(method: bytes, target: bytes) -> bytes | tuple[int, str]:
    """The target to forward (the route's own path, and the one query the CLI sends), or why the
    request is refused: (status, message). Exact bytes, nothing decoded or resolved: `//host/...`,
    `/../`, `%2f` and absolute URLs match no route."""
    path, _, query = target.partition(b"?")
    if method != b"POST" or path not in ROUTES or query not in QUERIES:
        names = ", ".join(r.decode() for r in sorted(ROUTES))
        return 404, f"the model relay forwards only POST {names} (with ?beta=true at most)"
    return target


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name == b"x-api-key":
            return value
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].strip()
    return None


def upstream_headers(headers: Iterable[tuple[bytes, bytes]], api_key: str) -> list[tuple[bytes, bytes]]:
    """The CLI's headers, minus each hop's own and the credentials, plus the real key."""
    out = [(name, value) for name, value in headers if name not in _NOT_FORWARDED]
    out += [(b"x-api-key", api_key.encode()), (b"accept-encoding", b"identity")]
    return out


def downstream_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The proxy's headers, minus each hop's own (h11 frames the body for the CLI's connection)."""
    return [(name, value) for name, value in headers if name.lower() not in _HOP_BY_HOP]


def _declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h11 has checked that it is a number
    return None


# ---------------------------------------------------------------- the relay


class _Refused(Exception):
    def __init__(self, status: int, message: str, retry_after: float | None = None,
                 should_retry: bool | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.should_retry = status >= 500 if should_retry is None else should_retry


@dataclass
class _Forwarded:
    call: Call | None  # what the budget let out (None: no budget)
    sent: bool = False  # the request may have reached the proxy (its head was being written): it may bill it
    status: int | None = None  # the proxy's, once it answered
    meter: UsageMeter | None = None
    settled: bool = False


@dataclass
class _Unverified:
    """A connection yet to present the key: whether it has said anything."""

    fd: int
    heard: bool = False  # bytes of it were read

    def silent(self) -> bool:
        """Nothing read of it, nor waiting to be (a flood keeps the loop from reading the CLI's head)."""
        if self.heard:
            return False
        try:
            pending = int(struct.unpack("i", fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0"))[0])
        except OSError:
            return True  # closed meanwhile
        return pending == 0


def _victim(unverified: dict[asyncio.Task[None], _Unverified]) -> asyncio.Task[None]:
    """The connection to close for a new one: the oldest that has said nothing, so that a flood of empty
    connections never closes one that sent its head (the CLI's); the oldest of all if every one has."""
    return next((task for task, conn in unverified.items() if conn.silent()), next(iter(unverified)))


class ModelRelay:
    """`async with ModelRelay(upstream, key, book=...) as relay:` listens on 127.0.0.1 (a free
    port); `relay.cli_env()` is what the CLI needs to reach the model through it. With a `book`
    (agent/spend_book.py), every call is judged by the agent's budget and its cost counted."""

    def __init__(self, upstream: str | None, api_key: str | None, limits: RelayLimits | None = None,
                 book: SpendBook | None = None) -> None:
        self._upstream = (upstream or DEFAULT_UPSTREAM).rstrip("/")
        self._api_key = api_key or PLACEHOLDER_KEY
        self._limits = limits or RelayLimits()
        self.book = book
        # The CLI's key: the agent can read it, and it opens this relay only, while it runs.
        self.client_key = "sprite-relay-" + secrets.token_urlsafe(24)
        self._server: asyncio.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._stopped = False  # no client is made after stop (until a start): nothing would close it
        self._connections: set[asyncio.Task[None]] = set()  # every one, to end at stop
        self._verified: set[asyncio.Task[None]] = set()  # those that presented the key
        self._unverified: dict[asyncio.Task[None], _Unverified] = {}  # the others, oldest first
        self.buffered = 0  # bytes of request bodies held now
        self.upstream_open = 0  # requests to the proxy not yet closed

    @property
    def port(self) -> int:
        assert self._server is not None, "the relay is not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli_env(self) -> dict[str, str]:
        """The CLI's model settings: this relay, and its key; and, with a budget, the ceiling on a
        reply, so that the CLI asks for no more than the relay lets through. ANTHROPIC_AUTH_TOKEN is
        blanked: the CLI would send it as a bearer token in place of the key."""
        env = {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": self.client_key, "ANTHROPIC_AUTH_TOKEN": ""}
        if self.book is not None:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(self.book.limits.max_tokens)
        return env

    async def prepare(self) -> None:
        """Make the client towards the proxy now (the runtime awaits it before a CLI starts), so that
        the CLI's first call finds it made. RelayError once the relay is stopped."""
        await self._upstream_client()

    async def _upstream_client(self) -> httpx.AsyncClient:
        """The client towards the proxy, made when the first CLI is about to start (`prepare`) or calls:
        its making imports httpx's transport (httpcore, anyio) and reads the system's certificates, about
        a tenth of a second of CPU, in a thread (on the loop it would stall every connection meanwhile),
        which a server start that runs no turn never pays. RelayError after `stop`: nothing would close
        a client made then."""
        if self._client is None and not self._stopped:
            made = await asyncio.to_thread(self._make_client)
            if self._client is None and not self._stopped:
                self._client = made
            else:  # another made one meanwhile, or the relay stopped
                await made.aclose()
        if self._stopped:
            raise RelayError("the model relay is stopped")
        assert self._client is not None
        return self._client

    def _make_client(self) -> httpx.AsyncClient:
        lim = self._limits
        return httpx.AsyncClient(
            timeout=httpx.Timeout(lim.upstream_read_timeout, connect=lim.connect_timeout,
                                  write=lim.write_timeout, pool=lim.connect_timeout),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=15.0),
            follow_redirects=False)

    async def start(self) -> None:
        self._stopped = False
        if self.book is not None:
            await self.book.start()
        try:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        except OSError as exc:
            if self.book is not None:
                await self.book.stop()
            raise RelayError(f"the model relay cannot listen on 127.0.0.1: {exc.strerror}") from None
        upstream = urlsplit(self._upstream)
        log.info("model_relay_started", url=self.url, upstream=f"{upstream.scheme}://{upstream.hostname}")

    async def stop(self) -> None:
        self._stopped = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self.book is not None:
            await self.book.stop()

    async def __aenter__(self) -> ModelRelay:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # ------------------------------------------------------------ one connection from the CLI

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # taken just before `stop`, run after its cancelling: no call after stop,
            writer.close()  # nor a client towards the proxy made then and never closed
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        sock = writer.get_extra_info("socket")
        self._unverified[task] = _Unverified(sock.fileno() if sock is not None else -1)
        if len(self._unverified) > self._limits.max_unverified:
            victim = _victim(self._unverified)
            self._unverified.pop(victim)
            victim.cancel()  # it has sent no whole request in all this time: the newest may be the CLI
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes)
        try:
            first = True
            while await self._exchange(conn, reader, writer, first=first):
                conn.start_next_cycle()
                first = False
        except (ConnectionError, TimeoutError, h11.ProtocolError):
            pass  # the CLI went away, or stopped reading: its connection closes below
        except asyncio.CancelledError:
            pass  # the relay is stopping, or this connection made room for a newer one
        finally:
            self._connections.discard(task)
            self._verified.discard(task)
            self._unverified.pop(task, None)
            writer.close()

    def _verify(self) -> None:
        """The connection presented the key: it counts against max_connections from now on."""
        task = asyncio.current_task()
        assert task is not None
        if task in self._verified:
            return
        if len(self._verified) >= self._limits.max_connections:
            log.warning("model_relay_busy", connections=len(self._verified))
            raise _Refused(503, f"the model relay serves {self._limits.max_connections} connections at most")
        self._unverified.pop(task, None)
        self._verified.add(task)

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter, *, first: bool) -> bool:
        """Serve one request; whether the connection may carry another."""
        try:
            event = await self._read_head(conn, reader, first=first)
        except TimeoutError:
            return False  # idle, silent, or a request head that dribbles in (a byte every few seconds)
        except h11.RemoteProtocolError as exc:
            await self._refuse(conn, writer, _Refused(exc.error_status_hint, f"bad HTTP request: {exc}"), reader)
            return False
        if not isinstance(event, h11.Request):
            return False  # the CLI closed a kept-alive connection
        call: Call | None = None
        try:
            target = route(event.method, event.target)
            if isinstance(target, tuple):
                raise _Refused(*target)
            if not hmac.compare_digest(presented_key(event.headers) or b"", self.client_key.encode()):
                raise _Refused(401, "the model relay's key is missing or wrong")
            self._verify()
            body = await self._read_body(conn, reader, writer, event)
            try:
                call = await self._judge(target, event.headers, body)
                return await self._relay(conn, reader, writer, event, target, body, call)
            finally:
                self.buffered -= len(body)
        except _Refused as refused:
            log.info("model_relay_refused", status=refused.status, method=event.method.decode("latin-1"),
                     path=event.target[:100].decode("latin-1"))
            await self._refuse(conn, writer, refused, reader)
            return False

    async def _judge(self, target: bytes, headers: Iterable[tuple[bytes, bytes]], body: bytearray) -> Call | None:
        """The call, once the agent's budget lets it out (None with no budget); else _Refused."""
        if self.book is None:
            return None
        betas = [value for name, value in headers if name == b"anthropic-beta"]
        # Parsed in a thread: 8 MiB of JSON, read twice (duplicate keys, then the facts), takes ~100 ms.
        call = await asyncio.to_thread(read_call, body, target.startswith(COUNT_TOKENS), betas)
        if isinstance(call, Refusal):
            self.book.refuse(call.reason)
            raise _Refused(call.status, call.message, should_retry=False)
        if (refusal := self.book.admit(call)) is not None:
            raise _Refused(refusal.status, refusal.message, refusal.retry_after, should_retry=refusal.retry)
        return call

    async def _read_head(self, conn: h11.Connection, reader: asyncio.StreamReader, *, first: bool) -> h11.Event:
        """The next request's head. The first on a connection must be whole within head_timeout
        of the connection; a later one within head_timeout of its first byte, which may take
        idle_timeout to come. So a peer that connects and says nothing, or sends a byte now and
        then, holds its place for seconds only."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.head_timeout if first else None
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                assert event is not h11.PAUSED  # only asked for between a response and the next request
                return event  # type: ignore[return-value]
            wait = self._limits.idle_timeout if deadline is None else max(0.0, deadline - loop.time())
            async with asyncio.timeout(wait):
                data = await reader.read(READ_CHUNK)
            if deadline is None:
                deadline = loop.time() + self._limits.head_timeout
            if data and (task := asyncio.current_task()) and (unverified := self._unverified.get(task)):
                unverified.heard = True
            conn.receive_data(data)  # b"": the CLI closed its side

    async def _read_body(self, conn: h11.Connection, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, request: h11.Request) -> bytearray:
        """The body, whole, within body_timeout; counted in `buffered` (the caller gives it back)."""
        lim = self._limits
        too_large = _Refused(413, f"the request body is larger than the model relay's limit ({lim.max_body_bytes} bytes)")
        declared = _declared_length(request.headers)
        if declared is not None and declared > lim.max_body_bytes:
            raise too_large  # refused before a byte of it is read
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        body = bytearray()
        try:
            async with asyncio.timeout(lim.body_timeout):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        conn.receive_data(await reader.read(READ_CHUNK))
                    elif isinstance(event, h11.Data):
                        if len(body) + len(event.data) > lim.max_body_bytes:
                            raise too_large
                        self._hold(len(event.data))
                        body += event.data
                    elif isinstance(event, h11.EndOfMessage):
                        return body
                    else:  # ConnectionClosed mid-body
                        raise ConnectionResetError("the CLI closed the connection mid-request")
        except TimeoutError:
            self.buffered -= len(body)
            raise _Refused(408, "the request body did not arrive in time") from None
        except BaseException:
            self.buffered -= len(body)
            raise

    def _hold(self, size: int) -> None:
        if self.buffered + size > self._limits.max_buffered_bytes:
            log.warning("model_relay_bodies_full", buffered=self.buffered)
            raise _Refused(503, "the model relay holds as many request bodies as it may; try again")
        self.buffered += size

    async def _relay(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     request: h11.Request, target: bytes, body: bytearray, call: Call | None) -> bool:
        """Forward the request, and stop the moment the CLI goes away: its upstream request closes.
        The call's cost is counted whatever happens: what the reply reported, or its worst case."""
        outcome = _Forwarded(call)
        forward = asyncio.create_task(self._forward(conn, writer, request, target, body, outcome))
        gone = asyncio.create_task(self._client_gone(conn, reader))
        try:
            await asyncio.wait((forward, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (forward, gone):
                task.cancel()
            await asyncio.gather(forward, gone, return_exceptions=True)
            self._settle(outcome)
        if forward.cancelled():
            log.info("model_relay_client_gone", path=target.decode("latin-1"))
            return False
        return forward.result()

    def _settle(self, outcome: _Forwarded) -> None:
        """Count what the call cost, once: what the reply reported, or (cut short) the most it can
        have. A refusal by the proxy (not 2xx) costs nothing, nor does a call that never reached it
        (no connection); one that did and ended before the reply's head (the CLI gave up, the proxy
        went silent) may still be billed in full: its worst case."""
        call = outcome.call
        if outcome.settled or call is None or self.book is None:
            return
        outcome.settled = True
        cost = call.worst_case_usd() if outcome.status is None and outcome.sent else 0.0
        if outcome.status is not None and 200 <= outcome.status < 300 and outcome.meter is not None:
            outcome.meter.finish()
            cost = outcome.meter.cost(call.model, call.worst_case_usd())
        self.book.settle(call, cost)

    @staticmethod
    async def _client_gone(conn: h11.Connection, reader: asyncio.StreamReader) -> None:
        """Returns when the CLI closes its connection, or sends more during the call than a pipelined
        request's head and a small body (PIPELINED_BYTES): the relay would hold it all, and the
        connection is dropped instead. What it may send waits in h11's buffer."""
        held = 0
        while data := await reader.read(READ_CHUNK):
            held += len(data)
            if held > PIPELINED_BYTES:
                log.warning("model_relay_pipelined_too_much", held=held)
                return
            conn.receive_data(data)

    async def _forward(self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request,
                       target: bytes, body: bytearray, outcome: _Forwarded) -> bool:
        try:
            client = await self._upstream_client()
        except RelayError as exc:  # a connection accepted just before the stop, served after it
            raise _Refused(503, str(exc)) from None
        started = time.monotonic()
        headers = [*upstream_headers(request.headers, self._api_key), (b"content-length", str(len(body)).encode())]

        async def trace(event: str, _info: dict[str, object]) -> None:
            # The request may reach the proxy once its head is being written, not before: a CLI that gives up
            # while the connection is still being made (slow on a loaded machine) leaves a call never sent.
            if event.endswith("send_request_headers.started"):
                outcome.sent = True

        upstream = client.build_request(request.method.decode("ascii"), self._upstream + target.decode("ascii"),
                                        headers=headers, content=_slices(body), extensions={"trace": trace})
        try:
            response = await client.send(upstream, stream=True)
        except httpx.TransportError as exc:
            outcome.sent = outcome.sent and not isinstance(exc, _NEVER_SENT)
            self._settle(outcome)  # before the CLI hears of it, as for a reply
            await self._refuse(conn, writer, _unreachable(exc))  # the request was read whole
            return False
        self.upstream_open += 1
        outcome.status = response.status_code
        outcome.meter = meter = UsageMeter(stream="text/event-stream" in response.headers.get("content-type", ""))
        try:
            head = h11.Response(status_code=response.status_code, headers=downstream_headers(response.headers.raw),
                                reason=response.reason_phrase.encode("latin-1"))
            await self._send(writer, conn.send(head))
            try:
                async for chunk in response.aiter_raw():
                    meter.feed(chunk)
                    await self._send(writer, conn.send(h11.Data(data=chunk)))
            except httpx.TransportError as exc:  # the proxy cut the body: the CLI's is cut the same way
                log.warning("model_relay_upstream_cut", error=_describe(exc), status=response.status_code)
                return False
            self._settle(outcome)  # before the CLI sees the end: its next call is judged with this one paid
            await self._send(writer, conn.send(h11.EndOfMessage()))
        finally:
            self.upstream_open -= 1
            await response.aclose()
        log.debug("model_relay_forwarded", path=target.decode("latin-1"), status=response.status_code,
                  ms=int((time.monotonic() - started) * 1000))
        return conn.our_state is h11.DONE and conn.their_state is h11.DONE

    async def _send(self, writer: asyncio.StreamWriter, data: bytes | None) -> None:
        """Write; wait only when the CLI's socket is backed up (most chunks go out at once, and a
        timeout per chunk costs more than the write)."""
        if data:
            writer.write(data)
            if writer.transport.get_write_buffer_size() > WRITE_BUFFER_BYTES:
                async with asyncio.timeout(self._limits.write_timeout):
                    await writer.drain()

    async def _refuse(self, conn: h11.Connection, writer: asyncio.StreamWriter, refused: _Refused,
                      unread: asyncio.StreamReader | None = None) -> None:
        """Answer with an error body and close. What is left of the request (`unread`) is never parsed."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        body = error_body(refused.status, refused.message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), (b"x-should-retry", b"true" if refused.should_retry else b"false")]
        if refused.retry_after is not None:
            headers.append((b"retry-after", str(int(refused.retry_after)).encode()))
        with contextlib.suppress(ConnectionError, TimeoutError):
            await self._send(writer, conn.send(h11.Response(status_code=refused.status, headers=headers)))
            await self._send(writer, conn.send(h11.Data(data=body)))
            await self._send(writer, conn.send(h11.EndOfMessage()))
            if unread is not None:
                await self._linger(unread, writer)

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Take, and drop, what the client is still sending for a moment before closing: closing on
        unread bytes resets the connection, and the client may then lose the answer."""
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_SECONDS):
            while await reader.read(READ_CHUNK):
                pass


async def _slices(body: bytearray) -> AsyncIterator[bytes]:
    """The held body for httpx, a slice at a time: never a second copy of it whole."""
    view = memoryview(body)
    try:
        for start in range(0, len(view), SEND_CHUNK):
            yield bytes(view[start:start + SEND_CHUNK])
    finally:
        view.release()


def _describe(exc: BaseException) -> str:
    """The failure as a person reads it: the system's reason (Connection refused), when one is in
    the exception's chain, else httpx's own words."""
    reason, seen = "", exc
    for _ in range(8):
        if isinstance(seen, OSError) and seen.errno:  # asyncio's strerror repeats the address
            reason = os.strerror(seen.errno) if seen.errno > 0 else str(seen.strerror)
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return (reason or f"{type(exc).__name__}: {exc}")[:200]


def _unreachable(exc: httpx.TransportError) -> _Refused:
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        log.warning("model_relay_upstream_timeout", error=_describe(exc))
        return _Refused(504, f"the model proxy did not answer in time ({_describe(exc)})")
    log.warning("model_relay_upstream_unreachable", error=_describe(exc))
    return _Refused(502, f"the model proxy could not be reached ({_describe(exc)})")
