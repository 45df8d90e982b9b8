"""The model relay: the agent's CLI reaches the model proxy through the server, which adds the key.

Whatever is in the CLI's environment, the agent can read (`printenv`, /proc/$PPID/environ), and
with isolation the agent runs as the CLI's user. So the CLI never gets the proxy's key:
it gets ANTHROPIC_BASE_URL=http://127.0.0.1:<port> of this relay and a key of the relay's own,
made at start. The relay checks that key, swaps in the real one, and forwards:

- only the Messages API paths the CLI calls (`ROUTES`); anything else gets 404;
- the response as it comes (SSE included), status and headers (retry-after, x-should-retry,
  request-id) untouched, so the CLI retries as it would against the proxy itself;
- with backpressure: the next chunk is read from the proxy only once the CLI has taken the last,
  and a CLI that goes away (an interrupt) closes its request to the proxy at once.

When the proxy can't be reached, or says nothing in time, the CLI gets 502 or 504 with an
Anthropic-style error body (and `x-should-retry: true`), which it retries like any 5xx.
HTTP is h11 (sans-I/O) towards the CLI and httpx towards the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from urllib.parse import urlsplit

import h11
import httpx2 as httpx

from ..errors import SpriteOSError
from ..logs import get_logger

log = get_logger(__name__)

ROUTES = frozenset({"/v1/messages", "/v1/messages/count_tokens"})  # all the CLI calls (mock Bridge records)
DEFAULT_UPSTREAM = "https://api.anthropic.com"
PLACEHOLDER_KEY = "sprite-os"  # what the proxy got before there was a relay, when no key is set
READ_CHUNK = 64 * 1024
LINGER_SECONDS = 2.0
WRITE_BUFFER_BYTES = 64 * 1024  # unsent bytes held for a slow CLI before the relay waits for it

# Framing and connection headers belong to each hop; credentials are the relay's to set.
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization",
                         b"proxy-connection", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
# The relay holds the body whole, so `expect: 100-continue` was answered here.
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length", b"expect", b"x-api-key", b"authorization"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                429: "rate_limit_error", 500: "api_error", 502: "api_error", 503: "overloaded_error",
                504: "timeout_error", 529: "overloaded_error"}


class RelayError(SpriteOSError):
    """The relay cannot start (it listens on a loopback port the system picks)."""


@dataclass(frozen=True)
class RelayLimits:
    max_body_bytes: int = 32 * 1024 * 1024  # the Messages API's own request limit
    max_connections: int = 16  # the CLI uses a few; bodies are held whole, so this bounds memory too
    max_header_bytes: int = 64 * 1024
    idle_timeout: float = 75.0  # a kept-alive connection's wait for the next request, and between its bytes
    head_timeout: float = 10.0  # a request's head, from its first byte to its last (the CLI's takes microseconds)
    connect_timeout: float = 5.0  # to the proxy: a proxy that is down is told within seconds
    upstream_read_timeout: float = 600.0  # silence from the proxy, as long as the CLI itself waits
    write_timeout: float = 60.0  # a CLI that takes nothing for this long is dropped, with its upstream


# ---------------------------------------------------------------- pure rules


def error_body(status: int, message: str) -> bytes:
    """An Anthropic-style error body, as the proxy would send."""
    kind = _ERROR_TYPES.get(status, "api_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def route(method: bytes, target: bytes) -> tuple[int, str] | None:
    """Why a request is refused ((status, message)), or None if it is forwarded."""
    path = urlsplit(target).path if target.startswith(b"/") else b""
    if method != b"POST" or path.decode("latin-1") not in ROUTES:
        return 404, f"the model relay forwards only POST {', '.join(sorted(ROUTES))}"
    return None


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
    out.append((b"x-api-key", api_key.encode()))
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
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


class ModelRelay:
    """`async with ModelRelay(upstream, key) as relay:` listens on 127.0.0.1 (a free port);
    `relay.cli_env()` is what the CLI needs to reach the model through it."""

    def __init__(self, upstream: str | None, api_key: str | None, limits: RelayLimits | None = None) -> None:
        self._upstream = (upstream or DEFAULT_UPSTREAM).rstrip("/")
        self._api_key = api_key or PLACEHOLDER_KEY
        self._limits = limits or RelayLimits()
        # The CLI's key: the agent can read it, and it opens this relay only, while it runs.
        self.client_key = "sprite-relay-" + secrets.token_urlsafe(24)
        self._server: asyncio.Server | None = None
        self._client: httpx.AsyncClient | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.upstream_open = 0  # requests to the proxy not yet closed

    @property
    def port(self) -> int:
        assert self._server is not None, "the relay is not started"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli_env(self) -> dict[str, str]:
        """The CLI's model settings: this relay, and its key. ANTHROPIC_AUTH_TOKEN is blanked: the
        CLI would send it as a bearer token in place of the key."""
        return {"ANTHROPIC_BASE_URL": self.url, "ANTHROPIC_API_KEY": self.client_key, "ANTHROPIC_AUTH_TOKEN": ""}

    async def start(self) -> None:
        lim = self._limits
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(lim.upstream_read_timeout, connect=lim.connect_timeout,
                                  write=lim.write_timeout, pool=lim.connect_timeout),
            limits=httpx.Limits(max_connections=32, max_keepalive_connections=8, keepalive_expiry=15.0),
            follow_redirects=False)
        try:
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        except OSError as exc:
            await self._client.aclose()
            raise RelayError(f"the model relay cannot listen on 127.0.0.1: {exc.strerror}") from None
        upstream = urlsplit(self._upstream)
        log.info("model_relay_started", url=self.url, upstream=f"{upstream.scheme}://{upstream.hostname}")

    async def stop(self) -> None:
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

    async def __aenter__(self) -> ModelRelay:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    # ------------------------------------------------------------ one connection from the CLI

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=self._limits.max_header_bytes)
        try:
            if len(self._connections) > self._limits.max_connections:
                log.warning("model_relay_busy", connections=len(self._connections))
                busy = _Refused(503, f"the model relay serves {self._limits.max_connections} connections at most")
                await self._refuse(conn, writer, busy, reader)
                return
            while await self._exchange(conn, reader, writer):
                conn.start_next_cycle()
        except (ConnectionError, TimeoutError, h11.ProtocolError):
            pass  # the CLI went away, or stopped reading: its connection closes below
        except asyncio.CancelledError:
            pass  # the relay is stopping
        finally:
            self._connections.discard(task)
            writer.close()

    async def _exchange(self, conn: h11.Connection, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> bool:
        """Serve one request; whether the connection may carry another."""
        try:
            event = await self._next_event(conn, reader, head=True)
        except TimeoutError:
            return False  # idle, or a request head that dribbles in (a byte every few seconds)
        except h11.RemoteProtocolError as exc:
            await self._refuse(conn, writer, _Refused(exc.error_status_hint, f"bad HTTP request: {exc}"), reader)
            return False
        if not isinstance(event, h11.Request):
            return False  # the CLI closed a kept-alive connection
        try:
            if (refused := route(event.method, event.target)) is not None:
                raise _Refused(*refused)
            if not hmac.compare_digest(presented_key(event.headers) or b"", self.client_key.encode()):
                raise _Refused(401, "the model relay's key is missing or wrong")
            body = await self._read_body(conn, reader, writer, event)
        except _Refused as refused:
            log.info("model_relay_refused", status=refused.status, method=event.method.decode("latin-1"),
                     path=event.target[:100].decode("latin-1"))
            await self._refuse(conn, writer, refused, reader)
            return False
        return await self._relay(conn, reader, writer, event, body)

    async def _next_event(self, conn: h11.Connection, reader: asyncio.StreamReader, *, head: bool = False) -> h11.Event:
        """The next event; each read waits `idle_timeout` at most. For a request's `head`, the
        whole of it must also arrive within `head_timeout` of its first byte, so that a peer
        sending a byte now and then cannot hold a connection (and the cap on them) for long."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                assert event is not h11.PAUSED  # only asked for between a response and the next request
                return event  # type: ignore[return-value]
            wait = self._limits.idle_timeout if deadline is None else max(0.0, deadline - loop.time())
            async with asyncio.timeout(wait):
                data = await reader.read(READ_CHUNK)
            if head and deadline is None:
                deadline = loop.time() + self._limits.head_timeout
            conn.receive_data(data)  # b"": the CLI closed its side

    async def _read_body(self, conn: h11.Connection, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter, request: h11.Request) -> bytes:
        limit = self._limits.max_body_bytes
        too_large = _Refused(413, f"the request body is larger than the model relay's limit ({limit} bytes)")
        declared = _declared_length(request.headers)
        if declared is not None and declared > limit:
            raise too_large  # refused before a byte of it is read
        if conn.they_are_waiting_for_100_continue:
            writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        parts: list[bytes] = []
        size = 0
        while True:
            try:
                event = await self._next_event(conn, reader)
            except TimeoutError:
                raise _Refused(408, "the request body did not arrive in time") from None
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > limit:
                    raise too_large
                parts.append(event.data)
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            else:  # ConnectionClosed mid-body
                raise ConnectionResetError("the CLI closed the connection mid-request")

    async def _relay(self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     request: h11.Request, body: bytes) -> bool:
        """Forward the request, and stop the moment the CLI goes away: its upstream request closes."""
        forward = asyncio.create_task(self._forward(conn, writer, request, body))
        gone = asyncio.create_task(self._client_gone(conn, reader))
        try:
            await asyncio.wait((forward, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (forward, gone):
                task.cancel()
            await asyncio.gather(forward, gone, return_exceptions=True)
        if forward.cancelled():
            log.info("model_relay_client_gone", path=request.target[:100].decode("latin-1"))
            return False
        return forward.result()

    @staticmethod
    async def _client_gone(conn: h11.Connection, reader: asyncio.StreamReader) -> None:
        """Returns when the CLI closes its connection. Anything it sends meanwhile (a pipelined
        request) waits in h11's buffer."""
        while data := await reader.read(READ_CHUNK):
            conn.receive_data(data)

    async def _forward(self, conn: h11.Connection, writer: asyncio.StreamWriter, request: h11.Request,
                       body: bytes) -> bool:
        assert self._client is not None
        started = time.monotonic()
        upstream = self._client.build_request(
            request.method.decode("ascii"), self._upstream + request.target.decode("ascii"),
            headers=upstream_headers(request.headers, self._api_key), content=body)
        try:
            response = await self._client.send(upstream, stream=True)
        except httpx.TransportError as exc:
            await self._refuse(conn, writer, _unreachable(exc))  # the request was read whole
            return False
        self.upstream_open += 1
        try:
            head = h11.Response(status_code=response.status_code, headers=downstream_headers(response.headers.raw),
                                reason=response.reason_phrase.encode("latin-1"))
            await self._send(writer, conn.send(head))
            try:
                async for chunk in response.aiter_raw():
                    await self._send(writer, conn.send(h11.Data(data=chunk)))
            except httpx.TransportError as exc:  # the proxy cut the body: the CLI's is cut the same way
                log.warning("model_relay_upstream_cut", error=_describe(exc), status=response.status_code)
                return False
            await self._send(writer, conn.send(h11.EndOfMessage()))
        finally:
            self.upstream_open -= 1
            await response.aclose()
        log.debug("model_relay_forwarded", path=request.target[:100].decode("latin-1"),
                  status=response.status_code, ms=int((time.monotonic() - started) * 1000))
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
                   (b"connection", b"close")]
        if refused.status >= 500:
            headers.append((b"x-should-retry", b"true"))
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
