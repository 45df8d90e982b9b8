"""Turning a `Reply` into Anthropic Messages API JSON or SSE events."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from .script import Reply, Text, ToolUse

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class Event:
    name: str
    data: dict[str, Any]
    delay: float = 0.0  # seconds to wait before sending it

    def encode(self) -> bytes:
        return f"event: {self.name}\ndata: {json.dumps(self.data)}\n\n".encode()


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _block_json(block: Text | ToolUse) -> dict[str, Any]:
    if isinstance(block, ToolUse):
        return {"type": "tool_use", "id": block.id, "name": block.name, "input": block.input}
    return {"type": "text", "text": block.text}


def message_json(reply: Reply, message_id: str, model: str) -> dict[str, Any]:
    """The non-streaming response body."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [_block_json(b) for b in reply.blocks],
        "stop_reason": reply.stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def text_chunks(text: Text) -> list[str]:
    """Word chunks (each word keeps its trailing whitespace), or fixed-size character chunks."""
    if text.chunk_size:
        size = text.chunk_size
        return [text.text[i : i + size] for i in range(0, len(text.text), size)]
    return re.findall(r"\s*\S+\s*|\s+", text.text)


def _json_chunks(value: dict[str, Any], size: int = 32) -> list[str]:
    raw = json.dumps(value)
    return [raw[i : i + size] for i in range(0, len(raw), size)]


def _event(name: str, delay: float = 0.0, **data: Any) -> Event:
    return Event(name, {"type": name, **data}, delay)


def reply_events(reply: Reply, message_id: str, model: str) -> list[Event]:
    """The SSE event sequence the Claude Code CLI accepts."""
    start = message_json(reply, message_id, model) | {"content": [], "stop_reason": None}
    start["usage"] = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    events = [_event("message_start", message=start)]
    for index, block in enumerate(reply.blocks):
        if isinstance(block, ToolUse):
            opening: dict[str, Any] = {
                "type": "tool_use",
                "id": block.id,
                "name": block.name,
                "input": {},
            }
            deltas = [
                _event(
                    "content_block_delta",
                    index=index,
                    delta={"type": "input_json_delta", "partial_json": part},
                )
                for part in _json_chunks(block.input)
            ]
        else:
            opening = {"type": "text", "text": ""}
            deltas = [
                _event(
                    "content_block_delta",
                    block.chunk_delay if n else 0.0,
                    index=index,
                    delta={"type": "text_delta", "text": part},
                )
                for n, part in enumerate(text_chunks(block))
            ]
        events.append(_event("content_block_start", index=index, content_block=opening))
        events.extend(deltas)
        events.append(_event("content_block_stop", index=index))
    stop = {"stop_reason": reply.stop_reason, "stop_sequence": None}
    events.append(_event("message_delta", delta=stop, usage={"output_tokens": reply.output_tokens}))
    events.append(_event("message_stop"))
    return events


# A `data:` line that is not valid JSON, for the "malformed" fault.
MALFORMED_EVENT = b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": {"type": "text_del\n\n'
