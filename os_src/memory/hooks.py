"""SDK hook callbacks: capture each turn as one observation, and keep memory fresh around compaction.

UserPromptSubmit opens a turn, PostToolUse adds a bounded summary of each tool
call, Stop closes the turn and hands ONE observation to the transcript writer.
Stop may not fire (claude-code #3113; it never does after an interrupt), so the
runtime also closes the turn when it ends (`turn_finished`, once per turn it
sent); whichever comes first records it. The recorder itself keeps it to one
record: the database's unique (session, sequence) key can't, since a second
record would carry the next sequence number. A turn that Stop recorded is not
recorded again when the stream then fails.

Every callback fails open: it catches everything, returns `{}`, and never
waits on the network or the disk (the write is queued to the database thread).
PreCompact is the one exception by design: it waits, within a budget, for the
daemon to flush, so that the SessionStart hook that follows the compaction can
put the fresh memory files back in front of the model.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from claude_agent_sdk import ResultMessage

from ..db_worker import Worker
from ..logs import get_logger
from ..text import clean_text
from .transcript_store import NewObservation, TranscriptDB

log = get_logger(__name__)

TOOL_INPUT_CHARS = 500
TOOL_OUTPUT_CHARS = 1000
MAX_TOOL_CALLS = 50  # per turn; more are counted, not stored
USER_MESSAGE_CHARS = 20_000
RESPONSE_CHARS = 20_000
PRIVATE_MARGIN = 2_000  # read this far past the cut, so a closed <private> block before it shrinks the text

_PRIVATE = re.compile(r"<private>.*?(?:</private>|\Z)", re.DOTALL | re.IGNORECASE)

Hook = Callable[[Any, str | None, Any], Awaitable[dict[str, Any]]]


def strip_private(text: str) -> str:
    """Text inside <private>...</private> is never stored (an unclosed tag hides the rest)."""
    return _PRIVATE.sub("[private]", text)


def _bounded(value: Any, limit: int) -> str:
    """At most `limit` characters of `value` (a string or JSON-like data), private text removed.

    The hooks run on the event loop, so the work is bounded by `limit`, not by the input: the
    value is cut (with a margin) before it is encoded and before <private> is looked for. That
    stays safe because an unclosed <private> hides the rest: a block the cut splits leaks nothing.
    """
    head_chars = limit + PRIVATE_MARGIN
    if isinstance(value, str):
        total, head = len(value), value[:head_chars]
        cut = total > head_chars
    else:
        budget = [head_chars]
        total, head = None, json.dumps(_shrink(value, budget), ensure_ascii=False)
        cut = budget[0] <= 0 or len(head) > head_chars
        head = head[:head_chars]
    text = strip_private(clean_text(head))
    if not cut and len(text) <= limit:
        return text
    more = f"{total - limit} more" if total is not None and total > limit else "more"
    return text[:limit] + f"…[{more}]"


def _shrink(value: Any, budget: list[int]) -> Any:
    """A copy of JSON-like `value` holding about budget[0] characters at most; it visits at most
    that many nodes, however big the value."""
    if budget[0] <= 0:
        return "…"
    budget[0] -= 1
    if isinstance(value, dict):
        return {str(k)[:200]: _shrink(v, budget) for k, v in itertools.islice(value.items(), budget[0])}
    if isinstance(value, (list, tuple)):
        return [_shrink(v, budget) for v in itertools.islice(value, budget[0])]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    text = (value if isinstance(value, str) else str(value))[: budget[0]]
    budget[0] -= len(text)
    return text


@dataclass
class HookTimings:
    """Time spent inside hook callbacks, for the benchmark and /healthz."""

    samples_ns: list[int] = field(default_factory=list)
    errors: int = 0

    def add(self, ns: int) -> None:
        if len(self.samples_ns) < 100_000:
            self.samples_ns.append(ns)


def fail_open(timings: HookTimings) -> Callable[[Hook], Hook]:
    def wrap(fn: Hook) -> Hook:
        @functools.wraps(fn)
        async def hook(data: Any, tool_use_id: str | None, context: Any) -> dict[str, Any]:
            start = time.perf_counter_ns()
            try:
                return await fn(data, tool_use_id, context)
            except Exception as exc:
                timings.errors += 1
                log.error("hook_failed", hook=fn.__name__, error=repr(exc))
                return {}
            finally:
                timings.add(time.perf_counter_ns() - start)

        return hook

    return wrap


@dataclass
class _OpenTurn:
    prompt_id: str | None
    user_message: str
    started: float
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    dropped_calls: int = 0


class TurnRecorder:
    """Buffers the current turn in memory and records it once, when it closes."""

    def __init__(self, transcript: Worker[TranscriptDB], on_recorded: Callable[[], None]) -> None:
        self._transcript = transcript
        self._on_recorded = on_recorded
        self._turn: _OpenTurn | None = None
        self.session_id: str | None = None
        self._sequence = 0
        self._recorded = False  # the runtime's current turn already has its record (from Stop)
        self.timings = HookTimings()
        guarded = fail_open(self.timings)
        self.on_user_prompt = guarded(self._on_user_prompt)
        self.on_post_tool_use = guarded(self._on_post_tool_use)
        self.on_stop = guarded(self._on_stop)

    def start_session(self, session_id: str) -> None:
        self.session_id, self._sequence, self._turn = session_id, 0, None
        started = time.time()
        self._submit(lambda t: t.start_session(session_id, started))

    def end_session(self, session_id: str) -> None:
        ended = time.time()
        self._submit(lambda t: t.end_session(session_id, ended))

    # -- hook callbacks (wrapped by fail_open in __init__)

    async def _on_user_prompt(self, data: Any, _id: str | None, _ctx: Any) -> dict[str, Any]:
        if self._turn is not None:  # the previous turn never closed: record what we have
            self._close("", note="(turn ended without a final response)")
        self._turn = _OpenTurn(data.get("prompt_id"), _bounded(data.get("prompt", ""), USER_MESSAGE_CHARS),
                               time.time())
        return {}

    async def _on_post_tool_use(self, data: Any, _id: str | None, _ctx: Any) -> dict[str, Any]:
        turn = self._turn
        if turn is None or data.get("agent_id"):  # sub-agents' tool calls are not the user's turn
            return {}
        if len(turn.tool_calls) >= MAX_TOOL_CALLS:
            turn.dropped_calls += 1
            return {}
        response = data.get("tool_response")
        turn.tool_calls.append({
            "name": str(data.get("tool_name", "?")),
            "input": _bounded(data.get("tool_input", {}), TOOL_INPUT_CHARS),
            "output": _bounded(response, TOOL_OUTPUT_CHARS),
            "is_error": bool(isinstance(response, dict) and response.get("is_error")),
        })
        return {}

    async def _on_stop(self, data: Any, _id: str | None, _ctx: Any) -> dict[str, Any]:
        turn = self._turn
        if turn is not None and (turn.prompt_id is None or data.get("prompt_id") in (None, turn.prompt_id)):
            self._close(data.get("last_assistant_message") or "")
        return {}

    # -- the runtime's path, for when Stop did not fire

    def turn_finished(self, prompt: str, result: ResultMessage | None, error: str | None) -> None:
        """The runtime's turn ended (it calls this once per turn it sent): record it unless Stop did."""
        try:
            if self._turn is None:
                if error is None or self._recorded:
                    return  # Stop recorded it, even if the stream failed afterwards
                # The CLI failed before UserPromptSubmit fired: the prompt still deserves a record.
                self._turn = _OpenTurn(None, _bounded(prompt, USER_MESSAGE_CHARS), time.time())
            note = None
            if error is not None:
                note = "(the turn failed before the agent finished)"
            elif result is not None and result.subtype == "error_during_execution":
                note = "(interrupted by the user)"
            self._close((result.result if result is not None else None) or "", note=note)
        except Exception as exc:
            log.error("turn_record_failed", error=repr(exc))
        finally:
            self._recorded = False  # the next runtime turn starts clean

    # -- recording

    def _close(self, response: str, note: str | None = None) -> None:
        turn, self._turn = self._turn, None
        if turn is None or self.session_id is None:
            return
        self._sequence += 1
        calls = turn.tool_calls + ([{"name": "(more)", "input": "", "output": f"{turn.dropped_calls} more calls",
                                     "is_error": False}] if turn.dropped_calls else [])
        text = _bounded(response, RESPONSE_CHARS)
        if note:
            text = f"{text}\n{note}".strip()
        obs = NewObservation(
            timestamp=turn.started, session_id=self.session_id, sequence_num=self._sequence,
            user_message=turn.user_message, tool_calls_json=json.dumps(calls, ensure_ascii=False),
            agent_response=text,
        )
        self._submit(lambda t: t.append(obs))
        self._recorded = True
        self._on_recorded()

    def _submit(self, fn: Callable[[TranscriptDB], Any]) -> None:
        future = self._transcript.submit(fn)
        future.add_done_callback(_log_write_failure)


def _log_write_failure(future: Any) -> None:
    if (exc := future.exception()) is not None:  # not repr(): it can quote the whole turn
        log.error("transcript_write_failed", error=type(exc).__name__, detail=str(exc)[:200])


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

    async def _on_pre_compact(self, data: Any, _id: str | None, _ctx: Any) -> dict[str, Any]:
        started = time.monotonic()
        ok = await self._flush(f"precompact-{data.get('trigger', '?')}", self._budget)
        log.info("precompact_flush", trigger=data.get("trigger"), ok=ok,
                 seconds=round(time.monotonic() - started, 3))
        return {}

    async def _on_session_start(self, data: Any, _id: str | None, _ctx: Any) -> dict[str, Any]:
        if data.get("source") != "compact":
            return {}
        context = await self._refresh()
        return {"hookSpecificOutput": {"hookEventName": "SessionStart", "additionalContext": context}}
