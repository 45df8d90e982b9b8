"""The Sprite OS process: one WebSocket port, the agent runtime, the memory daemon.

`SpriteOS` is the composition root: it builds each component, starts them in
order and stops them in reverse. The port (default 8765) serves WebSocket
clients, authenticated at the handshake, `GET /healthz`, and the console page
(console/pages.py) on plain GETs. A browser's upgrade must come from the console's
own origin or an allow-listed one (console/origin.py), or it gets HTTP 403.

Authentication: `Authorization: Bearer <token>`, or, for browsers (which cannot
set headers on a WebSocket), the subprotocol pair `sprite-os.v1, bearer.<token>`.
A missing or wrong token gets HTTP 401 with an empty body; a request with two Authorization (or
Origin, Host) headers gets 400. `/healthz` answers
anyone, but says only its status (`ok`, `degraded` or `failed`) without the token (a
Sprite listens on 0.0.0.0); with it, everything. `/metrics` (metrics.py, the Prometheus
text format) needs the token.

A start takes the workspace's writer lock before anything else: a second server on the
same workspace is refused before it can kill the first one's agent or rewrite its state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import hmac
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from . import __version__
from .agent.budget import AgentLimits
from .agent.ledger import CliLedger
from .agent.model_relay import ModelRelay
from .agent.spend_book import SPEND_FILE, SpendBook
from .config import Settings, describe, resolve_token
from .console import requests as rq
from .console.cards import CardsConsole
from .console.files_api import FilesConsole
from .console.memory_api import MemoryConsole
from .console.origin import origin_allowed
from .console.pages import ConsolePages, http_response
from .console.sessions_api import SessionsConsole
from .errors import PortUnavailable
from .events import DeltaCoalescer, EventHub
from .fsutil import WriterLock, atomic_write, sweep_temp_files
from .gateway import Gateway
from .isolation.launch import AgentLaunch, Resources
from .isolation.policy import Isolation
from .logs import configure_logging, get_logger
from .malloc_arenas import limit_arenas
from .memory.system import MemorySystem
from .metrics import CONTENT_TYPE as METRICS_TYPE
from .metrics import Metrics
from .protocol import SUBPROTOCOL, ServerFrame
from .runtime import AgentRuntime
from .stopping import (
    EXIT,
    STOP_REPORT,
    STOP_TIMEOUT,
    StopDeadline,
)
from .tools import memory_search
from .tools.canvas import CanvasStore

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk.types import McpSdkServerConfig

log = get_logger(__name__)

HARD_FRAME_LIMIT = 4 * 1024 * 1024  # beyond this the socket closes with 1009


def bearer_token(request: Request) -> str | None:
    """The token a client presented, from the Authorization header or a `bearer.` subprotocol."""
    auth = request.headers.get("Authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    for header in request.headers.get_all("Sec-WebSocket-Protocol"):
        for proto in header.split(","):
            proto = proto.strip()
            if proto.startswith("bearer."):
                return proto[len("bearer."):]
    return None


def _select_subprotocol(_conn: ServerConnection, offered: Sequence[Subprotocol]) -> Subprotocol | None:
    # Echo only our protocol name, never the bearer entry that carries the token.
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


class SpriteOS:
    def __init__(self, settings: Settings, token: str, *, memory: bool = True, lock: WriterLock | None = None,
                 isolation: Isolation | None = None) -> None:
        """`lock`: the workspace's writer lock, if the caller took it already (serve_main); `isolation`:
        the mode it chose already (serve_main), else chosen at start."""
        self._isolation = isolation
        self.settings = settings
        self._token = token.encode()
        self.started_at = time.monotonic()
        layout = settings.layout
        self.hub = EventHub()
        self.metrics = Metrics()
        publish = DeltaCoalescer(self._publish)  # the runtime, the canvas and the files share it: one order
        self.canvas = CanvasStore(layout.canvas_file, publish)
        # The workspace's one server: taken first at start, so a refused start changes nothing.
        self.lock = lock or WriterLock(layout.memory_lock, WriterLock.SERVER)
        self.memory = MemorySystem(settings, self.lock) if memory else None
        # The agent's CLI reaches the model through it: the proxy's key stays in this process, and
        # the agent's budget is enforced there, on every call the agent can make.
        self.spend = SpendBook(AgentLimits.of(settings), layout.state_dir / SPEND_FILE)
        self.relay = ModelRelay(settings.anthropic_base_url, settings.anthropic_api_key, book=self.spend)
        self.launch = AgentLaunch(layout, resources=Resources(settings.agent_max_processes, settings.agent_memory_max))
        self.runtime = AgentRuntime(settings, publish=publish, canvas_store=self.canvas, memory=self.memory,
                                    model_env=self.relay.cli_env, prepare_model=self.relay.prepare,
                                    launch=self.launch,
                                    retry_reason=self.spend.retry_reason,
                                    tool_servers=self._memory_tools if self.memory is not None else None)
        self._coalesced = publish  # what the console's requests publish through, in the same order
        self.files = FilesConsole(layout, publish, self.runtime.note)
        self.api = rq.ConsoleApi(*self._request_handlers())
        self.gateway = Gateway(self.hub, self.runtime, self.canvas, __version__, self.api.handle,
                               left=self.files.left)
        self.pages = ConsolePages(self._authorized, settings.allowed_origins)
        self._server: Server | None = None
        self.stop_timeout = STOP_TIMEOUT  # SIGTERM to the service's SIGKILL: the stop's one deadline
        self.stopped = False  # the stop ended (memory flushed): what a process still alive then holds is no loss
        self.unfinished: list[str] = []  # memory's stop steps that did not finish (stopping.STOP_REPORT)

    def _publish(self, frame: ServerFrame) -> None:
        self.metrics.observe(frame)
        self.hub.publish(frame)

    def _memory_tools(self) -> dict[str, McpSdkServerConfig]:
        """search_memory, over what memory holds: the agent's one way into it, read-only."""
        assert self.memory is not None
        return {memory_search.SERVER_NAME: memory_search.memory_search_server(self.memory.search)}

    def _request_handlers(self) -> list[Mapping[type[rq.Request], rq.Handler]]:
        """Who answers each request on the socket: memory's and past sessions' need memory."""
        handlers = [CardsConsole(self.canvas).handlers, self.files.handlers]
        if self.memory is not None:
            handlers += [MemoryConsole(self.memory, agent_spend=self.spend.report).handlers,
                         SessionsConsole(self.memory, lambda: self.runtime.session_id, self._coalesced,
                                         self.runtime.holding_turns).handlers]
        return handlers

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        layout = self.settings.layout
        layout.memory_dir.mkdir(parents=True, exist_ok=True)  # where the lock lives
        # Before anything that changes the workspace (the agent user's leftovers killed, isolation.json,
        # the launcher, ownership, the CLI ledger's reap): LockHeld if another server runs here.
        await asyncio.to_thread(self.lock.acquire)  # a contended take retries for about 1 s: off the loop
        layout.ensure()
        # The stop report is the server's own file, memory on or off: what a kill mid-write left of it goes now.
        await asyncio.to_thread(sweep_temp_files, layout.state_dir, lambda name: name == STOP_REPORT)
        # A Sprite that can't isolate its agent as asked refuses to start (ConfigError).
        await asyncio.to_thread(self.launch.resolve, self.settings.isolation, self.settings.agent_user,
                                self._isolation)
        self.canvas.load()
        if self.memory is not None:
            await self.memory.start()
            # Holding the workspace's lock: a CLI left by a server killed with -9 is no live server's.
            await asyncio.to_thread(CliLedger.for_workspace(self.settings.layout.root).reap)
        await self.relay.start()
        await self.files.start()
        await self.runtime.start()
        self._server = await self._listen()
        # The SDKs leave ~240k long-lived objects from import; full collections traversing them
        # paused the loop for up to 230 ms (measured: the fan-out p95 fell from 51 to 14 ms).
        gc.collect()
        gc.freeze()
        log.info("server_started", host=self.settings.host, port=self.port, version=__version__,
                 settings=describe(self.settings))
        if not self.settings.anthropic_base_url:  # on a Sprite, Bridge's proxy is always set
            log.warning("model_proxy_unset", detail="ANTHROPIC_BASE_URL is not set: the agent and the memory "
                        "curator call the Anthropic API directly, and need ANTHROPIC_API_KEY")

    async def _listen(self) -> Server:
        host, port = self.settings.host, self.settings.port
        try:
            return await serve(
                self.gateway.handle,
                host,
                port,
                process_request=self._process_request,
                select_subprotocol=_select_subprotocol,
                max_size=HARD_FRAME_LIMIT,
                ping_interval=20,
                ping_timeout=20,
                server_header=f"sprite-os/{__version__}",
            )
        except OSError as exc:  # port taken, address not ours, host unresolvable (gaierror): a setting to fix
            # asyncio's message repeats the address; the errno alone says it (gaierror's errno is negative)
            reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
            raise PortUnavailable(f"cannot listen on {host}:{port}: {reason}") from None

    async def stop(self, deadline: StopDeadline | None = None) -> None:
        """Stop accepting connections and requests, end the running turn while the requests in flight
        end, tell clients, stop the files' transfers, flush memory, close the databases: each step
        within its share of the stop's one deadline (stopping.py), memory's share kept for it whatever
        the steps before it do. Each step runs whatever failed before it: memory's flush above all."""
        loop = asyncio.get_running_loop()
        deadline = deadline or StopDeadline(loop.time(), self.stop_timeout)
        log.info("server_stopping", budget_s=round(deadline.budget(loop.time()), 1))
        if self._server is not None:
            self._server.close(close_connections=False)
        try:
            self.gateway.stop_requests()
        except Exception as exc:  # never in the way of the steps below: the CLI's end above all
            log.error("server_stop_step_failed", error=repr(exc)[:300], exc_info=exc)
        # Beside the turn's end (which must never wait for a request: the CLI goes in its grace),
        # and before what answers them stops: files' transfers, then memory.
        requests = asyncio.create_task(self.gateway.requests_done(deadline.requests(loop.time())),
                                       name="requests-done")
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("runtime", lambda: self.runtime.shutdown(deadline.turn(loop.time()), deadline.cli(loop.time()))),
            ("agent_group", functools.partial(asyncio.to_thread, self.launch.close)),  # empty now
            ("relay", self.relay.stop),  # after the CLI: a turn ending in the grace still reaches the model
            ("requests", lambda: requests), ("connections", self.gateway.close_all), ("files", self.files.stop),
            ("listener", self._closed)]
        try:
            for name, step in steps:  # none of them takes memory's reserve
                await self._step(name, step, deadline.before_memory(loop.time()))
            # Memory bounds each of its own steps (the capture's and the flush's shares are kept for them).
            if not await self._step("memory", lambda: self._stop_memory(deadline), deadline.stores(loop.time())):
                self.unfinished.append("memory")
        finally:  # a stop that is itself cancelled leaves no task of its own behind
            requests.cancel()
        self._report_stop()
        self.lock.release()
        self.stopped = True
        log.info("server_stopped", after_s=round(loop.time() - deadline.start, 1))

    @staticmethod
    async def _step(name: str, step: Callable[[], Awaitable[None]], budget: float) -> bool:
        """False: the step was cut past `budget`, or failed."""
        try:
            async with asyncio.timeout(budget):
                await step()
            return True
        except TimeoutError:
            log.error("server_stop_step_cut", step=name, after_s=round(budget, 1))
        except Exception as exc:
            log.error("server_stop_step_failed", step=name, error=repr(exc)[:300], exc_info=exc)
        return False

    def stop_asked(self) -> None:
        """The stop is asked (the signal): until its end says otherwise, memory's stop did not finish. A
        stop that never reaches its end (a start that outlasts the deadline, which the exit guard ends; a
        crash) leaves this account, never none, which `sprite-os service stop` would read as a clean stop."""
        self._write_stop_report(["memory"])

    def _report_stop(self) -> None:
        """Which of memory's steps did not finish, for `sprite-os service stop` to tell the operator."""
        if self.unfinished:
            log.warning("server_stopped_with_memory_unfinished", steps=self.unfinished)
        self._write_stop_report(self.unfinished)

    def _write_stop_report(self, unfinished: list[str]) -> None:
        # Unsynced: it runs on the loop at the signal, before the stop begins, and a slow disk's fsync would
        # hold the whole stop; `service stop` reads it on this machine right after the exit, from the page cache.
        try:
            atomic_write(self.settings.layout.state_dir / STOP_REPORT, json.dumps({"unfinished": unfinished}).encode(),
                         synced=False)
        except OSError as exc:  # a full or read-only disk: the stop itself goes on
            log.warning("stop_report_unwritten", error=repr(exc)[:200])

    async def _closed(self) -> None:
        if self._server is not None:
            await self._server.wait_closed()

    async def _stop_memory(self, deadline: StopDeadline) -> None:
        if self.memory is not None:
            self.unfinished += await self.memory.stop(deadline)

    def _agent(self) -> dict[str, Any]:
        rt = self.runtime
        return {"state": rt.state, "session_id": rt.session_id, "cli_running": rt.cli_running,
                "queued_messages": rt.queued, "failure": rt.health.report(), "budget": self.spend.report()}

    async def health(self, counts: bool = True) -> dict[str, Any]:
        """What /healthz shows with the token: counts and states, never user content or secrets. The
        status is computed from this same body. `counts=False`: memory's state without its counts
        (no database is read at all). The loop never touches the disk for it: the counts and the folders
        listed come from threads, each waited for at most memory's HEALTH_WAIT."""
        body: dict[str, Any] = {
            "version": __version__,
            "pid": os.getpid(),  # which process answers: `memory status` asks only the one holding its workspace
            "uptime_s": round(time.monotonic() - self.started_at, 1),
            "agent": self._agent(),
            "clients": len(self.gateway.connections),
            "isolation": self.launch.mode,  # how the agent is kept out of .os/: user, sandbox or none
            "isolation_reason": self.launch.isolation.reason,
            "limits": self.launch.limits,  # what holds the agent's processes to their share, and by what
        }
        if self.memory is not None:
            body["memory"] = await (self.memory.health() if counts else self.memory.status())
        return {"status": overall_status(body), **body}

    async def _process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        if (name := _repeated_header(request)) is not None:  # ambiguous: which token, which origin?
            remote = str(conn.remote_address[0] if conn.remote_address else "?")
            log.info("request_rejected", remote=remote, reason=f"more than one {name} header")
            return conn.respond(HTTPStatus.BAD_REQUEST, f"Only one {name} header is allowed.\n")
        if request.method != "GET":  # the console, /healthz and the upgrade all serve GET, nothing else
            response = http_response(conn, HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n",
                                     "text/plain; charset=utf-8")
            response.headers["Allow"] = "GET"
            return response
        if request.path.split("?", 1)[0] == "/healthz":
            # Without the token, only the status: nothing that helps anyone who may reach the port.
            if self._authorized(request):
                body = await self.health()
            else:
                body = {"status": (await self.health(counts=False))["status"]}
            return http_response(conn, HTTPStatus.OK, json.dumps(body).encode(), "application/json")
        if request.path.split("?", 1)[0] == "/metrics":
            if not self._authorized(request):
                return self._unauthorized(conn)
            return http_response(conn, HTTPStatus.OK, self.metrics.render(await self.health()), METRICS_TYPE)
        if (page := self.pages.respond(conn, request)) is not None:
            return page
        remote = str(conn.remote_address[0] if conn.remote_address else "?")
        origin = request.headers.get("Origin")
        if not origin_allowed(origin, request.headers.get("Host"), self.settings.allowed_origins):
            log.info("origin_rejected", remote=remote, origin=(origin or "")[:200])
            return conn.respond(HTTPStatus.FORBIDDEN, "")
        if not self._authorized(request):
            log.info("auth_rejected", remote=remote, presented=bearer_token(request) is not None)
            return self._unauthorized(conn)
        return None

    @staticmethod
    def _unauthorized(conn: ServerConnection) -> Response:
        response = conn.respond(HTTPStatus.UNAUTHORIZED, "")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response

    def _authorized(self, request: Request) -> bool:
        given = bearer_token(request)
        return given is not None and hmac.compare_digest(given.encode(), self._token)


# The headers read as one value each: a request with two of any of them is refused (400), never
# answered by whichever one a lookup would pick (websockets raises on a repeated one).
SINGLE_HEADERS = ("Authorization", "Origin", "Host", "X-Sprite-Origin", "If-None-Match")


def _repeated_header(request: Request) -> str | None:
    return next((name for name in SINGLE_HEADERS if len(request.headers.get_all(name)) > 1), None)


def overall_status(body: dict[str, Any]) -> str:
    """/healthz's status, from the body it reports: `failed` while the agent cannot start, `degraded`
    while memory's curator or capture's writes are failing (the agent still serves), else `ok`."""
    if body["agent"].get("failure") is not None:
        return "failed"
    if (body.get("memory") or {}).get("degraded"):
        return "degraded"
    return "ok"


class ExitGuard:
    """The process's end, bounded by the stop's deadline. A thread that never returns (a database
    call stuck on a disk, a hung forget decision's thread) holds asyncio.run's end and the
    interpreter's, which both wait for their threads, until the service's SIGKILL: then the stop
    itself, memory's flush included, would be the one cut. Armed when the stop begins, for the
    deadline's end; armed again, for EXIT, once the stop has ended (memory flushed): what a thread
    still holds then is no loss. Exits 0 if the stop ended, else 1."""

    def __init__(self, app: SpriteOS) -> None:
        self._app = app
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(max(0.0, seconds), self._exit)
        self._timer.daemon = True  # never what holds the exit up itself
        self._timer.start()

    def _exit(self) -> None:
        code = 0 if self._app.stopped else 1
        last = threading.Timer(LAST_WORD, os._exit, (code,))  # even if the log below can't be written
        last.daemon = True
        last.start()
        held = [t.name for t in threading.enumerate() if t is not threading.current_thread() and not t.daemon]
        log.error("exit_forced", stopped=self._app.stopped, threads=held)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


LAST_WORD = 0.2  # seconds the forced exit's log line may take


async def run_until_signalled(app: SpriteOS, ready: asyncio.Event | None = None,
                              guard: ExitGuard | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully, within the stop's one deadline
    (`guard`: and end the process by then, whatever a thread holds)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    asked: list[StopDeadline] = []  # the service's SIGKILL counts from the signal, even one during the start

    def signalled() -> None:
        if not asked:
            asked.append(StopDeadline(loop.time(), app.stop_timeout))
            if guard is not None:  # a start that never ends can't hold the process past the deadline either
                guard.arm(asked[0].exit_at() - loop.time())
            app.stop_asked()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled)
    try:
        await app.start()
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        # A second signal (another `service stop`, a second Ctrl-C) must not end the stop under way with
        # the signal's default action: memory's flush unrun, the CLI left behind. The deadline still holds.
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, functools.partial(log.warning, "stop_signal_repeated", signal=sig.name))
        deadline = asked[0] if asked else StopDeadline(loop.time(), app.stop_timeout)
        if guard is not None:
            guard.arm(deadline.exit_at() - loop.time())
        try:
            await app.stop(deadline)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        if guard is not None:
            guard.arm(min(deadline.exit_at() - loop.time(), deadline.seconds(EXIT)))


def serve_main(settings: Settings, lock: WriterLock, isolation: Isolation) -> int:
    """Entry point of `sprite-os serve` (commands/main.py), with the workspace's lock taken and the
    agent's isolation chosen."""
    limit_arenas()  # before any thread starts: see malloc_arenas.py
    configure_logging(settings.log_format, settings.log_level, settings.log_file)
    token = resolve_token(settings, create=True)
    app = SpriteOS(settings, token, lock=lock, isolation=isolation)
    asyncio.run(run_until_signalled(app, guard=ExitGuard(app)))
    return 0
