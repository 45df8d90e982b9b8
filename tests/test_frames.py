"""SDK messages -> protocol frames, with the SDK's own message objects and no CLI."""

from __future__ import annotations

import json
from typing import Any

import pytest
from claude_agent_sdk import (
    AssistantMessage,
    ResultMessage,
    StreamEvent,
    SystemMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)

from sprite_os import protocol as p
from sprite_os.agent.frames import ended_frame, message_frames, recall_frame, summarize
from sprite_os.agent.state import TurnCost
from sprite_os.memory.recall.searcher import RecallHit
from sprite_os.memory.recall.service import Recalled


def delta(text: str, parent: str | None = None, kind: str = "text_delta") -> StreamEvent:
    return StreamEvent(uuid="u", session_id="s", parent_tool_use_id=parent,
                       event={"type": "content_block_delta", "index": 0, "delta": {"type": kind, "text": text}})


def result(is_error: bool = False, **fields: Any) -> ResultMessage:
    values: dict[str, Any] = dict(subtype="success", duration_ms=42, duration_api_ms=40, is_error=is_error,
                                  num_turns=1, session_id="s", total_cost_usd=0.01,
                                  usage={"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": None,
                                         "server_tool_use": {"web_search_requests": 0}})
    values.update(fields)
    return ResultMessage(**values)


def test_streamed_text_becomes_text_deltas_and_nothing_else_does() -> None:
    assert message_frames("t1", delta("Hel")) == [p.TextDelta(turn_id="t1", text="Hel")]
    assert message_frames("t1", delta("{\"a\":", kind="input_json_delta")) == []
    assert message_frames("t1", StreamEvent(uuid="u", session_id="s", event={"type": "message_start"})) == []
    assert message_frames("t1", delta("a sub-agent thinks aloud", parent="toolu_task")) == []


def test_an_assistant_message_gives_its_text_then_its_tool_calls() -> None:
    message = AssistantMessage(model="m", content=[
        ThinkingBlock(thinking="hmm", signature="sig"),
        TextBlock(text="Let me "), TextBlock(text="look."),
        ToolUseBlock(id="toolu_1", name="mcp__canvas__create_card", input={"title": "Groceries", "body": "- milk"}),
        ToolUseBlock(id="toolu_2", name="Read", input={"file_path": "notes.md"}),
    ])
    assert message_frames("t1", message) == [
        p.AssistantMessage(turn_id="t1", text="Let me look."),
        p.ToolUse(turn_id="t1", tool_use_id="toolu_1", name="mcp__canvas__create_card",
                  summary='{"title": "Groceries", "body": "- milk"}'),
        p.ToolUse(turn_id="t1", tool_use_id="toolu_2", name="Read", summary='{"file_path": "notes.md"}'),
    ]
    only_tools = AssistantMessage(model="m", content=[ToolUseBlock(id="toolu_3", name="Bash", input={"command": "ls"})])
    assert [type(f) for f in message_frames("t1", only_tools)] == [p.ToolUse]  # no empty assistant_message


def test_a_sub_agents_messages_are_not_streamed() -> None:
    message = AssistantMessage(model="m", parent_tool_use_id="toolu_task", content=[
        TextBlock(text="sub-agent notes"), ToolUseBlock(id="toolu_sub", name="WebFetch", input={"url": "x"})])
    assert message_frames("t1", message) == []


def test_tool_results_become_tool_result_frames() -> None:
    message = UserMessage(content=[
        ToolResultBlock(tool_use_id="toolu_1", content=[{"type": "text", "text": "card created:\n  groceries"}]),
        ToolResultBlock(tool_use_id="toolu_2", content="Permission denied: .os/ is read-only", is_error=True),
        TextBlock(text="not a result"),
    ])
    assert message_frames("t1", message) == [
        p.ToolResult(turn_id="t1", tool_use_id="toolu_1", is_error=False, summary="card created: groceries"),
        p.ToolResult(turn_id="t1", tool_use_id="toolu_2", is_error=True,
                     summary="Permission denied: .os/ is read-only"),
    ]
    assert message_frames("t1", UserMessage(content="a prompt echoed back")) == []


def test_a_successful_result_completes_the_turn_with_its_usage_and_its_own_cost() -> None:
    assert message_frames("t1", result(total_cost_usd=0.07), cost=TurnCost(0.01, 0.07)) == [p.TurnComplete(
        turn_id="t1", status="completed", duration_ms=42, cost_usd=0.01, session_cost_usd=0.07,
        usage=p.Usage(input_tokens=12, output_tokens=3, cache_read_input_tokens=0, cache_creation_input_tokens=0))]
    assert message_frames("t1", result(usage=None))[0].usage == p.Usage()  # type: ignore[attr-defined]
    # without the meter's figure the cost is unknown, never the CLI's running total
    assert message_frames("t1", result(total_cost_usd=0.07))[0].cost_usd is None  # type: ignore[attr-defined]


def test_an_interrupted_turn_completes_as_interrupted_without_an_error() -> None:
    stopped = result(is_error=True, subtype="error_during_execution")
    [done] = message_frames("t1", stopped, interrupted=True)
    assert isinstance(done, p.TurnComplete) and done.status == "interrupted"


def test_a_turn_cut_short_that_nobody_stopped_fails_live_even_when_the_cli_calls_it_no_error() -> None:
    """The real CLI ends a turn an API error cut short with `error_during_execution` and `is_error: false`:
    with nobody's stop, that was said `completed` (the person held part of an answer, or none, told it was
    whole) and recorded so. It is a failure, said with its error frame."""
    cut = result(is_error=False, subtype="error_during_execution")
    failed, done = message_frames("t1", cut)
    assert isinstance(failed, p.Error) and failed.code == "agent_failed"
    assert isinstance(done, p.TurnComplete) and done.status == "error"
    [stopped] = message_frames("t1", cut, interrupted=True)  # someone stopped it: interrupted, as ever
    assert isinstance(stopped, p.TurnComplete) and stopped.status == "interrupted"


@pytest.mark.parametrize(("fields", "code", "says", "detail"), [
    ({"api_error_status": 529, "result": "Overloaded"}, "model_unavailable", "The model is overloaded right now.",
     "HTTP 529: Overloaded"),
    ({"api_error_status": 502, "result": "API Error: 502 Bad Gateway (127.0.0.1:34179)"}, "model_unavailable",
     "The model proxy can't be reached.", "HTTP 502: API Error: 502 Bad Gateway (127.0.0.1:34179)"),
    ({"api_error_status": 500, "result": "boom"}, "model_unavailable", "The model proxy failed (HTTP 500).",
     "HTTP 500: boom"),
    ({"api_error_status": 400, "result": "bad"}, "model_unavailable",
     "The model proxy refused the request (HTTP 400).", "HTTP 400: bad"),
    ({"result": "API Error: Connection refused (ECONNREFUSED)"}, "model_unavailable",
     "The model proxy can't be reached.", "API Error: Connection refused (ECONNREFUSED)"),
    ({"errors": ["max turns reached", "gave up"]}, "agent_failed", "The turn failed before the agent finished.",
     "max turns reached; gave up"),
    ({"subtype": "error_max_turns"}, "agent_failed", "The turn failed before the agent finished.", "error_max_turns"),
    # The relay's own refusal, in the CLI's wrapping: said in the Sprite's words, not as the proxy's.
    ({"api_error_status": 429, "result": "API Error: Request rejected (429) · Sprite OS refused the agent's call: "
                                         "its daily budget of $10.00 is spent"}, "agent_limit",
     "Sprite OS refused the agent's call: its daily budget of $10.00 is spent",
     "HTTP 429: API Error: Request rejected (429) · Sprite OS refused the agent's call: its daily budget of $10.00 "
     "is spent"),
    ({"api_error_status": 500, "result": "Sprite OS refused the agent's call: no"}, "agent_limit",
     "Sprite OS refused the agent's call: no", "HTTP 500: Sprite OS refused the agent's call: no"),
    ({"result": "Sprite OS refused the agent's call"}, "agent_failed",  # no HTTP error: not the relay's refusal
     "The turn failed before the agent finished.", "Sprite OS refused the agent's call"),
])
def test_a_failed_result_says_why_plainly_then_completes_as_an_error(fields: dict[str, Any], code: str, says: str,
                                                                      detail: str) -> None:
    error, done = message_frames("t1", result(is_error=True, **fields))
    assert isinstance(error, p.Error) and (error.code, error.message, error.detail) == (code, says, detail)
    assert error.turn_id == "t1"
    assert isinstance(done, p.TurnComplete) and done.status == "error"


def test_the_clis_notice_of_a_failed_model_call_is_no_reply() -> None:
    notice = AssistantMessage(model="<synthetic>", error="server_error",
                              content=[TextBlock(text="API Error: 502 Bad Gateway (127.0.0.1:34179)")])
    assert message_frames("t1", notice) == []


def test_the_cli_error_detail_is_bounded() -> None:
    error, _ = message_frames("t1", result(is_error=True, result="x" * 10_000))
    assert isinstance(error, p.Error) and len(error.message) < 100 and len(error.detail or "") <= 300


def test_lone_surrogates_from_the_cli_become_encodable_text() -> None:
    broken = json.loads('"cut mid-emoji \\ud83d"')
    frames = [*message_frames("t1", delta(broken)), *message_frames("t1", AssistantMessage(
        model="m", content=[TextBlock(text=broken), ToolUseBlock(id="x", name=broken, input={"k": broken})]))]
    assert len(frames) == 3
    for frame in frames:
        assert p.decode_server_frame(p.encode(frame)) == frame  # it encodes, and round-trips


def test_other_messages_give_no_frames() -> None:
    boundary = SystemMessage(subtype="compact_boundary", data={"compact_metadata": {"trigger": "auto"}})
    assert message_frames("t1", boundary) == [] and message_frames("t1", object()) == []


def test_summaries_are_one_short_line() -> None:
    assert summarize([{"type": "text", "text": "a\n\nb"}, {"type": "text", "text": "c"}]) == "a b c"
    assert summarize({"path": "x"}) == '{"path": "x"}'
    long = summarize("word " * 200)
    assert len(long) == 300 and long.endswith("…")
    assert summarize({"when": object()}).startswith('{"when": "<object object')  # anything renders


def test_a_turn_without_a_result_ends_with_empty_usage() -> None:
    assert ended_frame("t1", "error", 7) == p.TurnComplete(turn_id="t1", status="error", duration_ms=7, usage=p.Usage())


def test_a_retry_the_cli_announces_becomes_model_retry() -> None:
    data = {"type": "system", "subtype": "api_retry", "attempt": 2, "max_retries": 10, "retry_delay_ms": 1180.6,
            "error_status": 529, "error": "overloaded", "uuid": "u", "session_id": "s"}
    assert message_frames("t1", SystemMessage(subtype="api_retry", data=data)) == [p.ModelRetry(
        turn_id="t1", attempt=2, max_retries=10, retry_delay_ms=1180, error_status=529, error="overloaded")]
    refused = {"subtype": "api_retry", "attempt": "1", "max_retries": None, "error_status": None, "error": "unknown"}
    assert message_frames("t1", SystemMessage(subtype="api_retry", data=refused)) == [p.ModelRetry(
        turn_id="t1", attempt=1, max_retries=0, retry_delay_ms=0, error_status=None, error="unknown")]
    frame = p.encode(message_frames("t1", SystemMessage(subtype="api_retry", data=data))[0])
    assert json.loads(frame)["type"] == "model_retry"


def test_what_auto_recall_added_is_told_as_a_recall_frame() -> None:
    """Memory hands the runtime its hits; the frame clients see is built here, with the wire's kinds."""
    hits = [RecallHit(kind="episode", id=7, score=0.0312345, at=1.7e9, session_id="s1", turn=2, observation_id=7,
                      type="EPISODE", snippet="my dog is Rex", bm25=3.0),
            RecallHit(kind="learning", id=3, score=0.02, at=1.7e9, session_id=None, turn=None, observation_id=None,
                      type="FACT", snippet="The user's dog is Rex.")]
    frame = recall_frame("t1", Recalled("context", hits, 42))
    assert frame == p.Recall(turn_id="t1", tokens=42, memories=[
        p.RecalledMemory(kind="episode", id=7, type="EPISODE", at=1.7e9, session_id="s1", turn=2, observation_id=7,
                         snippet="my dog is Rex", score=0.0312),
        p.RecalledMemory(kind="learning", id=3, type="FACT", at=1.7e9, session_id=None, turn=None,
                         observation_id=None, snippet="The user's dog is Rex.", score=0.02)])
    assert json.loads(p.encode(frame))["memories"][0]["kind"] == "episode"
