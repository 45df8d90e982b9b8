"""A request as the mock Bridge saw it, and reading a Messages API request body: the prompt of its
last user message, its tool results, its system prompt. Bodies come from any client, so nothing
here trusts their shape."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SYSTEM_REMINDER = "<system-reminder>"


@dataclass
class UserMessage:
    prompt: str  # the last text block that is not a <system-reminder>
    tool_results: list[dict[str, Any]]


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def parse_user_message(body: dict[str, Any] | None) -> UserMessage:
    """Read the LAST role=user message (a trailing role=system message may follow it).

    The CLI merges history into it: tool_results, then prompt texts (possibly older ones too), then
    <system-reminder> blocks. So block order means nothing; the prompt is the last real text.
    """
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return UserMessage("", [])
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            blocks = _blocks(message.get("content"))
            texts = [
                b.get("text", "")
                for b in blocks
                if b.get("type") == "text"
                and isinstance(b.get("text"), str)
                and not b["text"].lstrip().startswith(SYSTEM_REMINDER)
            ]
            results = [b for b in blocks if b.get("type") == "tool_result"]
            return UserMessage(texts[-1] if texts else "", results)
    return UserMessage("", [])


def system_text(body: dict[str, Any] | None) -> str:
    """The request's system prompt: a string, or the texts of its blocks."""
    system = body.get("system") if isinstance(body, dict) else None
    if isinstance(system, str):
        return system
    return "\n\n".join(b["text"] for b in _blocks(system) if isinstance(b.get("text"), str))


def message_text(message: Any) -> str:
    """The text blocks of one message, joined."""
    content = message.get("content") if isinstance(message, dict) else None
    return "\n".join(b["text"] for b in _blocks(content) if isinstance(b.get("text"), str))


def tool_result_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in _blocks(content) if b.get("type") == "text")


Kind = Literal["messages", "count_tokens", "other"]


@dataclass
class RecordedRequest:
    """One HTTP request as the bridge saw it (and how it answered it)."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    time: float
    kind: Kind = "other"
    # The prompt text: the last non-<system-reminder> text of the last user message.
    last_user_text: str = ""
    is_tool_result: bool = False  # answered as a tool_result continuation of a scripted turn
    is_compaction: bool = False  # the CLI's compaction summary request
    faults: list[str] = field(default_factory=list)  # kinds of the faults applied to it
    status: int | None = None  # HTTP status sent (None if the connection was cut before headers)
    reply_text: str = ""  # text of the reply sent (if any)

    @property
    def user_agent(self) -> str:
        return next((v for k, v in self.headers.items() if k.lower() == "user-agent"), "")

    @property
    def target(self) -> Literal["agent", "curator"]:
        return "agent" if self.user_agent.startswith("claude-cli/") else "curator"

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream") is True)

    @property
    def model(self) -> str:
        model = self.body.get("model") if self.body else None
        return model if isinstance(model, str) else "mock-model"

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages = self.body.get("messages") if self.body else None
        return messages if isinstance(messages, list) else []

    @property
    def system_text(self) -> str:
        return system_text(self.body)

    @property
    def tools(self) -> list[str]:
        tools = self.body.get("tools") if self.body else None
        if not isinstance(tools, list):
            return []
        return [t["name"] for t in tools if isinstance(t, dict) and isinstance(t.get("name"), str)]
