"""search_memory: the agent's one, read-only, way into everything memory has learned."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from claude_agent_sdk import ToolAnnotations, create_sdk_mcp_server, tool
from claude_agent_sdk.types import McpSdkServerConfig

from ..logs import get_logger
from ..memory.search import MAX_LIMIT, SearchHit, clamp_limit

log = get_logger(__name__)

SERVER_NAME = "memory"

Search = Callable[[str, int], Awaitable[list[SearchHit]]]

SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What to recall, in plain words."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 10,
                  "description": "How many memories to return at most."},
    },
    "required": ["query"],
}


def render(query: str, hits: list[SearchHit]) -> str:
    if not hits:
        return f"No memories match {query[:100]!r}."
    lines = [f"{len(hits)} memories, best match first:"]
    for n, hit in enumerate(hits, 1):
        day = time.strftime("%Y-%m-%d", time.gmtime(hit.created_at))
        lines.append(f"{n}. [{hit.type}, {day}] {hit.content}")
    return "\n".join(lines)


def memory_search_server(search: Search) -> McpSdkServerConfig:
    @tool("search_memory",
          "Search everything you have learned in past sessions (facts, preferences, corrections, "
          "procedures). Read-only.",
          SCHEMA, annotations=ToolAnnotations(readOnlyHint=True))
    async def search_memory(args: dict[str, Any]) -> dict[str, Any]:
        query = str(args.get("query", ""))
        try:
            hits = await search(query, clamp_limit(args.get("limit", 10)))
        except Exception as exc:  # never leak database errors into the conversation
            log.error("search_memory_failed", error=repr(exc), query_chars=len(query))
            return {"content": [{"type": "text", "text": "Memory search is unavailable right now."}],
                    "is_error": True}
        return {"content": [{"type": "text", "text": render(query, hits)}]}

    return create_sdk_mcp_server(SERVER_NAME, tools=[search_memory])
