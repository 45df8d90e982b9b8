"""The two hooks only a hook can do: keep memory fresh around the CLI's compaction.

PreCompact waits, within a budget, for the daemon to flush every finished turn into
memory, so that the SessionStart hook that follows the compaction (source "compact")
can put the freshly curated files back in front of the model. Turns themselves are
captured from the runtime's message stream (memory/capture/recorder.py), not by hooks: each hook event
costs the CLI about 4 ms, and these two fire only around a compaction.

Every callback fails open: it catches everything and returns `{}`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ..logs import get_logger

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import HookCallback, HookContext, HookInput, HookJSONOutput

log = get_logger(__name__)

# Our callbacks read their input as a plain mapping: the SDK's HookInput union has no
# SessionStart member, though the CLI sends that event.
Hook = Callable[[Mapping[str, Any], str | None, Any], Awaitable[dict[str, Any]]]


@dataclass
class HookTimings:
    """Time memory spends on the agent's path (capture's steps, hook callbacks), for the
    benchmark; its errors count in /healthz."""

    samples_ns: list[int] = field(default_factory=list)
    errors: int = 0

    def add(self, ns: int) -> None:
        if len(self.samples_ns) < 100_000:
            self.samples_ns.append(ns)

    def guard(self, what: str) -> Guarded:
        return Guarded(self, what)


class Guarded:
    """Times one step on the agent's path and keeps its failure inside (logged and counted):
    memory never breaks a turn."""

    def __init__(self, timings: HookTimings, what: str) -> None:
        self._timings = timings
        self._what = what
        self._start = 0

    def __enter__(self) -> None:
        self._start = time.perf_counter_ns()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> bool:
        self._timings.add(time.perf_counter_ns() - self._start)
        if not isinstance(exc, Exception):
            return False
        self._timings.errors += 1
        log.error("memory_callback_failed", callback=self._what, error=type(exc).__name__)  # repr() may quote a turn
        return True


def fail_open(timings: HookTimings) -> Callable[[Hook], HookCallback]:
    def wrap(fn: Hook) -> HookCallback:
        @functools.wraps(fn)
        async def hook(data: HookInput, tool_use_id: str | None, context: HookContext) -> HookJSONOutput:
            with timings.guard(fn.__name__):
                return cast("HookJSONOutput", await fn(cast(Mapping[str, Any], data), tool_use_id, context))
            return {}

        return hook

    return wrap


class CompactionHooks:
    """PreCompact flushes memory (bounded wait); SessionStart(compact) re-injects the fresh files."""

    def __init__(self, flush: Callable[[str, float], Awaitable[bool]], refresh: Callable[[], Awaitable[str]],
                 budget: float, timings: HookTimings) -> None:
        self._flush = flush
        self._refresh = refresh
        self._budget = budget
        guarded = fail_open(timings)
        self.on_pre_compact = guarded(self._on_pre_compact)
        self.on_session_start = guarded(self._on_session_start)

    async def _on_pre_compact(self, data: Mapping[str, Any], _id: str | None, _ctx: Any) -> dict[str, Any]:
        started = time.monotonic()
        ok = await self._flush(f"precompact-{data.get('trigger', '?')}", self._budget)
        log.info("precompact_flush", trigger=data.get("trigger"), ok=ok,
                 seconds=round(time.monotonic() - started, 3))
        return {}

    async def _on_session_start(self, data: Mapping[str, Any], _id: str | None, _ctx: Any) -> dict[str, Any]:
        if data.get("source") != "compact":
            return {}
        context = await self._refresh()
        return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}
