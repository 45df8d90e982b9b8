"""The red team's instruments, without a CLI: what the model was told about each tool call."""

from __future__ import annotations

from typing import Any

from devkit.mock_bridge import MockBridge
from devkit.mock_bridge.request import RecordedRequest
from tests.redteam_support import ToolResult, tool_result


class Counted(list[dict[str, Any]]):
    """A request's messages that count how often they are read."""

    reads = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        Counted.reads += 1
        return super().__iter__()


def result(tool_use_id: str, text: str, is_error: bool = False) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": [{"type": "text", "text": text}],
            "is_error": is_error}


def ask(bridge: MockBridge, results: list[dict[str, Any]]) -> None:
    """The CLI's next request: every tool_result so far, each in a user message after its call."""
    messages = Counted()
    for r in results:
        messages.append({"role": "assistant", "content": [{"type": "tool_use", "id": r["tool_use_id"]}]})
        messages.append({"role": "user", "content": [r]})
    bridge.requests.append(RecordedRequest("POST", "/v1/messages", {"user-agent": "claude-cli/2.1"},
                                           {"messages": messages}, 0.0, kind="messages"))


def test_the_first_tool_result_is_found_and_each_request_is_read_once() -> None:
    """A shared server's CLI repeats every earlier tool_result in each request: asking after each
    of n attacks read every request again, n squared over two in all (a fifth of the red team's CPU)."""
    bridge = MockBridge()
    told: list[dict[str, Any]] = []
    Counted.reads = 0
    for n in range(60):
        assert tool_result(bridge, f"toolu_{n}") is None  # not yet told
        told.append(result(f"toolu_{n}", f"refused {n}", is_error=n % 2 == 0))
        ask(bridge, told)
        assert tool_result(bridge, f"toolu_{n}") == ToolResult(n % 2 == 0, f"refused {n}")
        assert tool_result(bridge, "toolu_0") == ToolResult(True, "refused 0")
    assert Counted.reads == 60  # each request once, however often asked
    # A later request that tells it otherwise (an old result cleared) does not change the first.
    ask(bridge, [result("toolu_0", "[cleared]"), *told[1:]])
    assert tool_result(bridge, "toolu_0") == ToolResult(True, "refused 0")
    # The curator's requests are not the CLI's.
    bridge.requests.append(RecordedRequest("POST", "/v1/messages", {"user-agent": "anthropic/0.1"},
                                           {"messages": [{"role": "user", "content": [result("toolu_c", "x")]}]},
                                           0.0, kind="messages"))
    assert tool_result(bridge, "toolu_c") is None
