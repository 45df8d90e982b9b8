"""The demo model: what the agent answers when no Turn is scripted (dev mode relies on it).

- `card: <title>` -> calls mcp__canvas__create_card, then confirms.
- `search: <query>` -> calls mcp__memory__search_memory, then summarises the result.
- a question about the person ("What is my name?", "Where do I live?", "What do you know
  about me?"; see `phrases`) -> answered from user.md in its system prompt, the memory a
  session boots with; when that doesn't say, from search_memory.
- `what do you remember about <x>` -> calls search_memory, then summarises the result.
- anything else -> `You said: <prompt>`.

Every reply streams a word per delta, `agent.demo_word_delay` seconds apart (dev mode sets it),
so the console shows a reply arrive as it does from a real model.
"""

from __future__ import annotations

from typing import Any

from .phrases import AboutMe, AboutTopic, Question, Recall, answer, question, topic_of
from .profile import Profile
from .request import tool_result_text
from .script import AgentScript, Continuation, Plan, Reply, Text, ToolCall

CREATE_CARD = "mcp__canvas__create_card"
SEARCH_MEMORY = "mcp__memory__search_memory"
DEV_WORD_DELAY = 0.04  # dev mode's pace: a word every 40 ms, about what a real model streams
UNKNOWN = "I don't know that yet: nothing in my memory says. Tell me, and I'll know it from your next session on."


def _failed(results: list[dict[str, Any]]) -> str | None:
    for r in results:
        if r.get("is_error"):
            return tool_result_text(r)
    return None


def respond(agent: AgentScript, prompt: str, tools: list[str], system: str) -> Plan:
    text = prompt.strip()
    lowered = text.lower()
    if lowered.startswith("card:"):
        title = text[len("card:") :].strip()

        def after_card(results: list[dict[str, Any]]) -> Reply:
            error = _failed(results)
            if error is not None:
                return Reply([_text(agent, f"The tool {CREATE_CARD} failed: {error[:200]}")])
            return Reply([_text(agent, f'Created the card "{title}".')])

        call = ToolCall(
            CREATE_CARD, {"title": title, "body": "Created by the demo model.", "kind": "note"}
        )
        return _call_tool(agent, call, tools, after_card)
    if lowered.startswith("search:"):
        query = text[len("search:") :].strip()
        return _search(agent, query, tools, f'Memory search for "{query}" returned:')
    if (asked := question(text)) is not None:
        return _answer(agent, asked, Profile.from_boot_prompt(system), tools)
    return _say(agent, f"You said: {text}")


def _answer(agent: AgentScript, asked: Question, profile: Profile, tools: list[str]) -> Plan:
    match asked:
        case AboutMe():
            known = [answer(topic_of(key), key, [value]) for key, value in profile.items()]
            return _say(agent, "What I know about you: " + " ".join(known) if known else UNKNOWN)
        case AboutTopic(topic=topic, key=key):
            if values := profile.values(key):
                return _say(agent, answer(topic, key, values))
            if SEARCH_MEMORY not in tools:
                return _say(agent, UNKNOWN)
            return _search(agent, key, tools, f'My notes don\'t say, but memory search for "{key}" returned:')
        case Recall(query=query):
            return _search(agent, query, tools, f'What I remember about "{query}":')


def _text(agent: AgentScript, text: str) -> Text:
    return Text(text, chunk_delay=agent.demo_word_delay)


def _say(agent: AgentScript, text: str) -> Plan:
    return Plan(Reply([_text(agent, text)]))


def _search(agent: AgentScript, query: str, tools: list[str], intro: str) -> Plan:
    def after_search(results: list[dict[str, Any]]) -> Reply:
        error = _failed(results)
        if error is not None:
            return Reply([_text(agent, f"The tool {SEARCH_MEMORY} failed: {error[:200]}")])
        found = "\n".join(tool_result_text(r) for r in results).strip()
        return Reply([_text(agent, f"{intro} {found[:2000] or '(nothing)'}")])

    return _call_tool(agent, ToolCall(SEARCH_MEMORY, {"query": query}), tools, after_search)


def _call_tool(agent: AgentScript, call: ToolCall, tools: list[str], after: Continuation) -> Plan:
    if call.name not in tools:
        return _say(agent, f"I can't do that: the tool {call.name} is not available here.")
    return agent.demo_plan(lambda: agent.issue([call], after))
