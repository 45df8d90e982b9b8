"""The demo model: what the agent answers when no Turn is scripted (`make run` relies on it).

- `card: <title>` -> calls mcp__canvas__create_card, then confirms.
- `search: <query>` -> calls mcp__memory__search_memory, then summarises the result.
- anything else -> `You said: <prompt>`.
"""

from __future__ import annotations

from typing import Any

from .script import AgentScript, Continuation, Plan, Reply, Text, ToolCall, tool_result_text

CREATE_CARD = "mcp__canvas__create_card"
SEARCH_MEMORY = "mcp__memory__search_memory"


def _failed(results: list[dict[str, Any]]) -> str | None:
    for r in results:
        if r.get("is_error"):
            return tool_result_text(r)
    return None


def respond(agent: AgentScript, prompt: str, tools: list[str]) -> Plan:
    text = prompt.strip()
    lowered = text.lower()
    if lowered.startswith("card:"):
        title = text[len("card:") :].strip()

        def after_card(results: list[dict[str, Any]]) -> Reply:
            error = _failed(results)
            if error is not None:
                return Reply([Text(f"The tool {CREATE_CARD} failed: {error[:200]}")])
            return Reply([Text(f'Created the card "{title}".')])

        call = ToolCall(
            CREATE_CARD, {"title": title, "body": "Created by the demo model.", "kind": "note"}
        )
        return _call_tool(agent, call, tools, after_card)
    if lowered.startswith("search:"):
        query = text[len("search:") :].strip()

        def after_search(results: list[dict[str, Any]]) -> Reply:
            error = _failed(results)
            if error is not None:
                return Reply([Text(f"The tool {SEARCH_MEMORY} failed: {error[:200]}")])
            found = "\n".join(tool_result_text(r) for r in results).strip()
            return Reply(
                [Text(f'Memory search for "{query}" returned: {found[:500] or "(nothing)"}')]
            )

        return _call_tool(agent, ToolCall(SEARCH_MEMORY, {"query": query}), tools, after_search)
    return Plan(Reply([Text(f"You said: {text}")]))


def _call_tool(agent: AgentScript, call: ToolCall, tools: list[str], after: Continuation) -> Plan:
    if call.name not in tools:
        return Plan(Reply([Text(f"I can't do that: the tool {call.name} is not available here.")]))
    return agent.demo_plan(lambda: agent.issue([call], after))
