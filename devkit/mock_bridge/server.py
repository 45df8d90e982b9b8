"""The aiohttp app and the `MockBridge` class: a local stand-in for the Bridge model proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from aiohttp import web

from ..harness import wait_for
from . import demo
from .demo_curator import reply as demo_curator_reply
from .request import Kind, RecordedRequest, parse_user_message
from .script import (
    AgentScript,
    CuratorScript,
    CutOff,
    Fault,
    FaultSet,
    Ids,
    Plan,
    Reply,
    Text,
)
from .sse import MALFORMED_EVENT, error_body, message_json, reply_events


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(status, message), status=status, headers=headers)


class MockBridge:
    """A real HTTP server speaking the Anthropic Messages API, scripted from tests.

    `async with MockBridge() as bridge:` binds 127.0.0.1 on a free port; `bridge.url` is the
    ANTHROPIC_BASE_URL to hand to the CLI or to `anthropic.AsyncAnthropic`. Unscripted, the
    agent side is the demo model, and the curator side answers "NONE", or with
    `demo_curator=True` (dev mode) is the demo curator. `demo_word_delay` (dev mode sets it)
    streams the demo model's replies a word at a time at that pace, as a real model does.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, demo_curator: bool = False,
                 demo_word_delay: float = 0.0) -> None:
        self.host = host
        self.port = port
        self._ids = Ids()
        self.agent = AgentScript(self._ids, demo.respond)
        self.agent.demo_word_delay = demo_word_delay
        # Tests script the curator and expect "NONE" otherwise; dev mode curates for real.
        self.curator = CuratorScript(demo_curator_reply if demo_curator else "NONE")
        self.faults = FaultSet()
        self.requests: list[RecordedRequest] = []
        self._runner: web.AppRunner | None = None

    # --- lifecycle ---

    async def start(self, port: int | None = None, host: str | None = None) -> str:
        if self._runner is not None:
            raise RuntimeError("mock bridge already started")
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_route("*", "/{tail:.*}", self._not_found)
        # No access log; a short shutdown timeout so stop() doesn't wait on slow (latency) handlers.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, host or self.host, self.port if port is None else port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or []  # an asyncio.Server once started
        self.host, self.port = sockets[0].getsockname()[:2]
        return self.url

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> MockBridge:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # --- records ---

    def agent_requests(self) -> list[RecordedRequest]:
        """Messages requests (not count_tokens) from the Claude Code CLI."""
        return [r for r in self.requests if r.kind == "messages" and r.target == "agent"]

    def curator_requests(self) -> list[RecordedRequest]:
        """Messages requests from anything else (the curator's anthropic SDK)."""
        return [r for r in self.requests if r.kind == "messages" and r.target == "curator"]

    async def wait_for(
        self,
        predicate: Callable[[MockBridge], bool],
        timeout: float = 30.0,  # a CLI start on a loaded machine: the waits are for events, not margins
        interval: float = 0.02,
    ) -> None:
        """Wait until `predicate(bridge)`; a timeout names every request recorded so far."""
        try:
            await wait_for(lambda: predicate(self), timeout, interval)
        except TimeoutError:
            seen = ", ".join(f"{r.target}:{r.kind}:{r.last_user_text[:30]!r}" for r in self.requests)
            raise TimeoutError(
                f"mock bridge: condition not met within {timeout}s; "
                f"{len(self.requests)} request(s) recorded: [{seen}]"
            ) from None

    # --- handlers ---

    async def _record(self, request: web.Request, kind: Kind) -> tuple[RecordedRequest, str | None]:
        """Record the request; returns it and an error message if its body is not a JSON object."""
        raw = await request.read()
        body: dict[str, Any] | None = None
        problem: str | None = None
        try:
            parsed = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            problem = "request body is not valid JSON"
        else:
            if isinstance(parsed, dict):
                body = parsed
            else:
                problem = "request body must be a JSON object"
        if body is not None and not isinstance(body.get("messages"), list):
            problem = "messages: field required (a list)"
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            headers=dict(request.headers),
            body=body,
            time=time.time(),
            kind=kind,
            last_user_text=parse_user_message(body).prompt,
        )
        self.requests.append(rec)
        return rec, problem

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _not_found(self, request: web.Request) -> web.Response:
        self.requests.append(
            RecordedRequest(
                request.method, request.path, dict(request.headers), None, time.time(), status=404
            )
        )
        return _error(404, f"mock bridge: no route for {request.method} {request.path}")

    async def _count_tokens(self, request: web.Request) -> web.Response:
        rec, problem = await self._record(request, "count_tokens")
        if problem:
            rec.status = 400
            return _error(400, problem)
        rec.status = 200
        return web.json_response({"input_tokens": max(1, len(json.dumps(rec.body)) // 4)})

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        rec, problem = await self._record(request, "messages")
        if problem:
            rec.status = 400
            return _error(400, problem)
        try:
            faults = self.faults.take(rec.target)
            rec.faults = [f.kind for f in faults]
            for fault in faults:
                if fault.kind == "latency":
                    await asyncio.sleep(fault.seconds)
            failing = next((f for f in faults if f.kind == "status"), None)
            if failing is not None:
                rec.status = failing.status
                headers = (
                    {"retry-after": str(failing.retry_after)}
                    if failing.retry_after is not None
                    else None
                )
                return _error(
                    failing.status,
                    failing.message or f"mock bridge fault: HTTP {failing.status}",
                    headers,
                )
            plan = self._plan(rec)
            broken = next((f for f in faults if f.kind in ("cut", "malformed")), None)
            if broken is None:
                plan.commit()  # a broken reply leaves the script as it was: the client will retry
            rec.reply_text = plan.reply.text
            if rec.stream:
                return await self._send_stream(request, rec, plan.reply, broken)
            return await self._send_json(request, rec, plan.reply, broken)
        except ConnectionResetError:
            return web.Response(status=499)  # the client went away; nobody reads this
        except Exception as exc:  # a bug in a callable script must not take the server down
            rec.status = 500
            return _error(500, f"mock bridge: {type(exc).__name__}: {exc}")

    def _plan(self, rec: RecordedRequest) -> Plan:
        if rec.target == "agent":
            plan = self.agent.plan(rec.body, rec.tools)
            rec.is_tool_result, rec.is_compaction = plan.is_tool_result, plan.is_compaction
            return plan
        nxt = self.curator.peek()
        if isinstance(nxt, CutOff):
            return Plan(Reply([Text(nxt.text)], stop="max_tokens"), on_commit=self.curator.pop)
        answer = self.curator.default if nxt is None else nxt
        if callable(answer):
            try:
                text = answer(rec)
            except Exception:
                if nxt is not None:
                    self.curator.pop()  # a broken callable is used up, or it would fail every request
                raise
        else:
            text = answer
        return Plan(Reply([Text(text)]), on_commit=self.curator.pop if nxt is not None else None)

    async def _send_json(
        self, request: web.Request, rec: RecordedRequest, reply: Reply, broken: Fault | None
    ) -> web.StreamResponse:
        data = json.dumps(message_json(reply, self._ids.message(), rec.model)).encode()
        if broken is None:
            rec.status = 200
            return web.Response(body=data, content_type="application/json")
        rec.status = 200
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if broken.kind == "malformed":
            resp.content_length = len(data) // 2
            await resp.prepare(request)
            await resp.write(data[: len(data) // 2])
            return resp
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        return self._cut(request, resp)

    async def _send_stream(
        self, request: web.Request, rec: RecordedRequest, reply: Reply, broken: Fault | None
    ) -> web.StreamResponse:
        events = reply_events(reply, self._ids.message(), rec.model)
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        rec.status = 200
        await resp.prepare(request)
        try:
            for n, event in enumerate(events):
                if broken is not None and n >= broken.after_events:
                    if broken.kind == "cut":
                        return self._cut(request, resp)
                    await resp.write(MALFORMED_EVENT)
                    break
                if event.delay:
                    await asyncio.sleep(event.delay)
                await resp.write(event.encode())
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client went away (e.g. an interrupt); nothing to clean up
        return resp

    @staticmethod
    def _cut(request: web.Request, resp: web.StreamResponse) -> web.StreamResponse:
        """Close the TCP connection mid-body: the client sees an incomplete response, no message_stop."""
        if request.transport is not None:
            request.transport.close()  # close, not abort: flush what was already written first
        with contextlib.suppress(Exception):
            resp.force_close()
        return resp
