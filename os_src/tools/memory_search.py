"""search_memory: the agent's one, read-only, way into everything memory holds: the raw turns of past
sessions (episodes) and what was learned from them, in one ranking (memory/recall/searcher.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..logs import get_logger
from ..memory.recall.learnings import MAX_LIMIT, clamp_limit
from ..memory.recall.searcher import RecallHit
from ..text import utc

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk.types import McpSdkServerConfig

log = get_logger(__name__)

SERVER_NAME = "memory"

Search = Callable[[str, int], Awaitable[list[RecallHit]]]

SCHEMA = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What to recall, in plain words. A period may be named: "
                  "'last spring', 'in March 2023', 'about 4 months ago'; 'now' or 'currently' favours the latest."},
        "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 10,
                  "description": "How many memories to return at most."},
    },
    "required": ["query"],
}


def source(hit: RecallHit) -> str:
    if hit.session_id is None:
        return ""
    return f"session {hit.session_id}" + (f" turn {hit.turn}" if hit.turn is not None else "")


def render(query: str, hits: list[RecallHit]) -> str:
    if not hits:
        return f"No memories match {query[:100]!r}."
    lines = [f"{len(hits)} memories, best match first:"]
    for n, hit in enumerate(hits, 1):
        day = utc(hit.at, "%Y-%m-%d")
        if hit.kind == "episode":
            lines.append(f"{n}. [turn, {day}, {source(hit)}] {hit.snippet}")
        else:
            origin = f", from {source(hit)}" if hit.session_id else ""
            lines.append(f"{n}. [{hit.type}, {day}{origin}] {hit.snippet}")
    return "\n".join(lines)


def memory_search_server(search: Search) -> McpSdkServerConfig:
    from claude_agent_sdk import ToolAnnotations, create_sdk_mcp_server, tool

    @tool("search_memory",
          "Search your memory of past sessions: what was said and done in each earlier turn, and what "
          "you learned from them (facts, preferences, corrections, procedures, session summaries). Read-only.",
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
