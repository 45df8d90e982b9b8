"""SDK messages -> protocol frames, as pure functions (tested with SDK message objects, no CLI).

Sub-agent traffic (messages with a `parent_tool_use_id`) is not streamed to clients: the
sub-agent's tool call, and its result, are.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from .. import protocol as p
from ..text import clean_text
from ..turn_end import result_status
from .budget import REFUSED_BY
from .memory_port import Recalled
from .state import TurnCost

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import AssistantMessage, ResultMessage

SUMMARY_CHARS = 300
ERROR_DETAIL_CHARS = 300

# How the CLI reports a model proxy it could not reach at all (no HTTP status to go by).
_UNREACHABLE = re.compile(r"ECONNREFUSED|ENOTFOUND|ETIMEDOUT|ECONNRESET|EAI_AGAIN|Connection refused|"
                          r"Can't reach the API|Unable to connect", re.IGNORECASE)


def summarize(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """A short, single-line rendering of a tool's input or output, for clients."""
    if isinstance(value, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in value):
        value = "\n".join(b.get("text", "") for b in value)
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(clean_text(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def assistant_text(message: AssistantMessage) -> str:
    from claude_agent_sdk import TextBlock

    return clean_text("".join(b.text for b in message.content if isinstance(b, TextBlock)))


def message_frames(turn_id: str, message: Any, *, interrupted: bool = False,
                   cost: TurnCost | None = None) -> list[p.ServerFrame]:
    """The frames one SDK message of a turn becomes (often none). `cost` is the turn's own (the
    CLI's `total_cost_usd` is its process's running total: state.CostMeter takes the difference)."""
    from claude_agent_sdk import (
        AssistantMessage,
        ResultMessage,
        StreamEvent,
        SystemMessage,
        ToolResultBlock,
        UserMessage,
    )

    if isinstance(message, StreamEvent):
        event = message.event
        if (message.parent_tool_use_id is None and event.get("type") == "content_block_delta"
                and event.get("delta", {}).get("type") == "text_delta"):
            return [p.TextDelta(turn_id=turn_id, text=clean_text(event["delta"].get("text", "")))]
    elif isinstance(message, AssistantMessage):
        # A message with `error` is the CLI's notice of a failed model call ("API Error: 502 ..."), not
        # the agent's reply: the result's error frame says it, plainly, with those words as its detail.
        if message.parent_tool_use_id is not None or message.error is not None:
            return []
        return _assistant_frames(turn_id, message)
    elif isinstance(message, UserMessage) and isinstance(message.content, list):
        return [p.ToolResult(turn_id=turn_id, tool_use_id=block.tool_use_id, is_error=bool(block.is_error),
                             summary=summarize(block.content))
                for block in message.content if isinstance(block, ToolResultBlock)]
    elif isinstance(message, ResultMessage):
        return result_frames(turn_id, message, interrupted=interrupted, cost=cost)
    elif isinstance(message, SystemMessage) and message.subtype == "api_retry":
        return [retry_frame(turn_id, message.data)]
    return []


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def retry_frame(turn_id: str, data: dict[str, Any]) -> p.ModelRetry:
    """The CLI's `api_retry` notice: {attempt, max_retries, retry_delay_ms, error_status, error}."""
    status = data.get("error_status")
    return p.ModelRetry(turn_id=turn_id, attempt=_int(data.get("attempt")), max_retries=_int(data.get("max_retries")),
                        retry_delay_ms=_int(data.get("retry_delay_ms")),
                        error_status=_int(status) if status is not None else None,
                        error=clean_text(str(data.get("error") or ""))[:ERROR_DETAIL_CHARS])


def _assistant_frames(turn_id: str, message: AssistantMessage) -> list[p.ServerFrame]:
    from claude_agent_sdk import ToolUseBlock

    frames: list[p.ServerFrame] = []
    if text := assistant_text(message):
        frames.append(p.AssistantMessage(turn_id=turn_id, text=text))
    frames += [p.ToolUse(turn_id=turn_id, tool_use_id=block.id, name=clean_text(block.name),
                         summary=summarize(block.input))
               for block in message.content if isinstance(block, ToolUseBlock)]
    return frames


def result_frames(turn_id: str, result: ResultMessage, *, interrupted: bool = False,
                  cost: TurnCost | None = None, by_server: bool = False) -> list[p.ServerFrame]:
    """turn_complete, after an error frame saying why when the turn failed (not when interrupted; one whose
    interrupt came after the answer was whole is completed: turn_end.py).
    Without `cost`, the turn's cost is unknown (None), never the CLI's running total. `by_server`:
    the interrupt was the server's stop, not the person's."""
    frames: list[p.ServerFrame] = []
    status: p.TurnStatus = result_status(result.subtype, result.is_error, interrupted)  # as the record says
    if status == "error":
        frames.append(result_error(turn_id, result))
    usage = result.usage or {}
    frames.append(p.TurnComplete(
        turn_id=turn_id,
        status=status,
        duration_ms=result.duration_ms,
        usage=p.Usage(**{k: int(usage.get(k) or 0) for k in p.Usage.__struct_fields__}),
        cost_usd=cost.turn if cost is not None else None,
        session_cost_usd=cost.session if cost is not None else None,
        by_server=status == "interrupted" and by_server,
    ))
    return frames


# What a person is told when the model proxy fails a turn, by the HTTP status the CLI saw: plain
# words they can act on (a Retry, waiting, telling the operator). The CLI's own text, with its
# addresses and codes, goes in the error's `detail`.
CANT_BE_REACHED = "The model proxy can't be reached."
_PROXY_FAILURES = {
    401: "The model proxy refused the Sprite's key.",
    403: "The model proxy refused the Sprite's key.",
    429: "The model proxy is limiting requests right now.",
    502: CANT_BE_REACHED,  # the relay answers 502 for a proxy it cannot connect to
    503: "The model proxy is unavailable right now.",
    504: "The model proxy did not answer in time.",
    529: "The model is overloaded right now.",
}


def proxy_failure(status: int | None) -> str:
    """The plain sentence for a model proxy that failed a turn with `status` (None: unreachable)."""
    if status is None:
        return CANT_BE_REACHED
    if status in _PROXY_FAILURES:
        return _PROXY_FAILURES[status]
    return f"The model proxy failed (HTTP {status})." if status >= 500 else f"The model proxy refused the request (HTTP {status})."


def result_error(turn_id: str, result: ResultMessage) -> p.Error:
    """Why the CLI failed a turn: the Sprite's limits on the agent (the relay refused the call: it
    says so in its own words), the model proxy (an HTTP error, unreachable), or the agent. The
    message is a plain sentence; the CLI's own words are the `detail`."""
    detail = clean_text("; ".join(result.errors or []) or result.result or result.subtype)
    if result.api_error_status and (limit := _relay_refusal(detail)):
        return p.Error(code="agent_limit", turn_id=turn_id, message=limit,
                       detail=f"HTTP {result.api_error_status}: {detail[:ERROR_DETAIL_CHARS]}")
    detail = detail[:ERROR_DETAIL_CHARS]
    if result.api_error_status:
        return p.Error(code="model_unavailable", turn_id=turn_id, message=proxy_failure(result.api_error_status),
                       detail=f"HTTP {result.api_error_status}: {detail}")
    if _UNREACHABLE.search(detail):
        return p.Error(code="model_unavailable", turn_id=turn_id, message=proxy_failure(None), detail=detail)
    return p.Error(code="agent_failed", turn_id=turn_id, message="The turn failed before the agent finished.",
                   detail=detail)


def _relay_refusal(detail: str) -> str | None:
    """The relay's refusal as it wrote it (it begins with REFUSED_BY), out of the CLI's wrapping
    ("API Error: Request rejected (429) · ..."), or None when the proxy refused."""
    at = detail.find(REFUSED_BY)
    return detail[at:][:ERROR_DETAIL_CHARS * 2] if at >= 0 else None


def ended_frame(turn_id: str, status: p.TurnStatus, duration_ms: int, saved: bool = True,
                by_server: bool = False) -> p.TurnComplete:
    """turn_complete for a turn that ended without a ResultMessage (never sent, or the CLI failed)."""
    return p.TurnComplete(turn_id=turn_id, status=status, duration_ms=duration_ms, usage=p.Usage(), saved=saved,
                          by_server=status == "interrupted" and by_server)


def recall_frame(turn_id: str, recalled: Recalled) -> p.Recall:
    """What auto-recall sent to the agent with the message of `turn_id`, for clients to show."""
    return p.Recall(turn_id=turn_id, tokens=recalled.tokens, memories=[
        p.RecalledMemory(kind="episode" if m.kind == "episode" else "learning", id=m.id, type=m.type, at=m.at,
                         session_id=m.session_id, turn=m.turn, observation_id=m.observation_id, snippet=m.snippet,
                         score=round(m.score, 4)) for m in recalled.memories])
