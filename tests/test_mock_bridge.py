"""Tests for the mock Bridge (tests/mock_bridge), driven through the real anthropic SDK and CLI."""

from __future__ import annotations

import asyncio
import logging
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx2
import pytest

from devkit.harness import wait_for
from devkit.mock_bridge import Fault, MockBridge, RecordedRequest, Step, Text, ToolCall, Turn
from devkit.mock_bridge.demo import DEV_WORD_DELAY
from devkit.processes import kit_env

CLI_UA = "claude-cli/2.1.329 (external, sdk-py, agent-sdk/0.2.186)"
MODEL = "claude-test"
# The bridge is plain http; an empty TLS context skips loading CA certificates (~0.1 s per client).
NO_CA = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def make_client(bridge: MockBridge, user_agent: str | None = None) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=bridge.url,
        api_key="x",
        max_retries=0,
        default_headers={"User-Agent": user_agent} if user_agent else None,
        http_client=anthropic.DefaultAsyncHttpxClient(verify=NO_CA),
    )


@pytest.fixture
async def bridge() -> AsyncIterator[MockBridge]:
    async with MockBridge() as b:
        yield b


@pytest.fixture
async def curator(bridge: MockBridge) -> AsyncIterator[anthropic.AsyncAnthropic]:
    async with make_client(bridge) as c:
        yield c


@pytest.fixture
async def agent(bridge: MockBridge) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """A client that the bridge classifies as the Claude Code CLI (by its User-Agent)."""
    async with make_client(bridge, user_agent=CLI_UA) as c:
        yield c


async def ask(
    client: anthropic.AsyncAnthropic, messages: list[dict[str, Any]] | str, **kw: Any
) -> Any:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return await client.messages.create(model=MODEL, max_tokens=100, messages=messages, **kw)


async def stream(
    client: anthropic.AsyncAnthropic, messages: list[dict[str, Any]] | str
) -> tuple[Any, list[str]]:
    """Stream a reply; returns the final message and the text deltas seen."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    deltas: list[str] = []
    async with client.messages.stream(model=MODEL, max_tokens=100, messages=messages) as s:
        async for event in s:
            if event.type == "text":
                deltas.append(event.text)
        return await s.get_final_message(), deltas


def tool_result(tool_use_id: str, text: str = "ok", is_error: bool = False) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": text,
        "is_error": is_error,
    }


def after_tool(prompt: str, reply: Any, *results: dict[str, Any]) -> list[dict[str, Any]]:
    """History the CLI would send after a tool_use reply."""
    return [
        {"role": "user", "content": prompt},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        {"role": "user", "content": list(results)},
    ]


# --- curator ------------------------------------------------------------------------------


async def test_curator_scripted_replies_then_default(
    bridge: MockBridge, curator: anthropic.AsyncAnthropic
) -> None:
    bridge.curator.script(
        "FACT: The user's name is Ada\nUSER_MD_UPDATE:\n# User\n- Name: Ada\n", "second"
    )
    first = await ask(curator, "extract facts")
    assert first.content[0].text.startswith("FACT: The user's name is Ada")
    assert first.stop_reason == "end_turn"
    assert (await ask(curator, "again")).content[0].text == "second"
    assert (await ask(curator, "empty queue")).content[0].text == "NONE"
    bridge.curator.default = "NOTHING NEW"
    assert (await ask(curator, "new default")).content[0].text == "NOTHING NEW"
    assert [r.target for r in bridge.requests] == ["curator"] * 4
    assert len(bridge.curator_requests()) == 4 and bridge.agent_requests() == []


async def test_curator_callable_gets_the_request(
    bridge: MockBridge, curator: anthropic.AsyncAnthropic
) -> None:
    seen: list[RecordedRequest] = []

    def reply(request: RecordedRequest) -> str:
        seen.append(request)
        return f"echo: {request.last_user_text}"

    bridge.curator.script(reply)
    msg = await ask(curator, "remember tea", system="You are the curator.")
    assert msg.content[0].text == "echo: remember tea"
    assert seen[0].system_text == "You are the curator."
    assert bridge.curator.pending() == 0


async def test_curator_callable_that_raises_gives_500(
    bridge: MockBridge, curator: anthropic.AsyncAnthropic
) -> None:
    bridge.curator.script(lambda request: 1 / 0)  # type: ignore[arg-type,return-value]
    with pytest.raises(anthropic.InternalServerError):
        await ask(curator, "boom")
    assert (await ask(curator, "still alive")).content[0].text == "NONE"


# --- agent streaming and turns ---------------------------------------------------------------


async def test_stream_text_then_tool_use(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(
        Turn(
            [
                Text("Let me check the list"),
                ToolCall("mcp__canvas__create_card", {"title": "Groceries", "n": [1, 2]}),
            ],
            Text("Created it."),
        )
    )
    msg, deltas = await stream(agent, "make a card")
    assert msg.stop_reason == "tool_use"
    assert msg.content[0].text == "Let me check the list"
    assert deltas == ["Let ", "me ", "check ", "the ", "list"]  # one delta per word
    use = msg.content[1]
    assert use.type == "tool_use" and use.name == "mcp__canvas__create_card"
    assert use.input == {"title": "Groceries", "n": [1, 2]}
    assert use.id.startswith("toolu_mock_")
    assert bridge.agent.pending() == 0


async def test_tool_result_continues_the_turn_exactly_once(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(Turn(ToolCall("Read", {"file_path": "x"}), Text("done")))
    first = await ask(agent, "read x")
    history = after_tool("read x", first, tool_result(first.content[0].id, "file contents"))
    second = await ask(agent, history)
    assert second.content[0].text == "done" and second.stop_reason == "end_turn"
    assert bridge.agent_requests()[1].is_tool_result
    # The same tool_result again is no longer a continuation: it's a new (empty) prompt for the demo.
    again = await ask(agent, history)
    assert not bridge.agent_requests()[2].is_tool_result
    assert again.content[0].text == "You said: "


async def test_turn_without_steps_left_ends(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(Turn(ToolCall("Read", {"file_path": "x"})))
    first = await ask(agent, "read")
    second = await ask(agent, after_tool("read", first, tool_result(first.content[0].id)))
    assert second.content[0].text == "(end of scripted turn)"


async def test_unknown_tool_use_id_is_a_new_prompt(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(Turn(Text("first turn")), Turn(Text("second turn")))
    content = [tool_result("toolu_not_ours"), {"type": "text", "text": "next please"}]
    msg = await ask(agent, [{"role": "user", "content": content}])
    assert msg.content[0].text == "first turn"
    rec = bridge.agent_requests()[0]
    assert not rec.is_tool_result and rec.last_user_text == "next please"
    assert bridge.agent.pending() == 1


async def test_merged_cli_history_is_read_by_meaning_not_order(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    """A tool_result before a new prompt's text, an older prompt, reminders, and a trailing system message."""
    bridge.agent.script(
        Turn(ToolCall("Read", {"file_path": "a"}), Text("continued")), Turn(Text("new turn"))
    )
    first = await ask(agent, "older prompt")
    merged = [
        tool_result(first.content[0].id),
        {"type": "text", "text": "older prompt"},
        {"type": "text", "text": "queued prompt"},
        {"type": "text", "text": "<system-reminder>\nignore me\n</system-reminder>"},
    ]
    history = [*after_tool("older prompt", first)[:2], {"role": "user", "content": merged}]
    history.append({"role": "system", "content": "trailing system message"})  # the CLI may add one
    second = await ask(agent, history)
    assert second.content[0].text == "continued"  # answered the tool_result, once
    rec = bridge.agent_requests()[1]
    assert rec.is_tool_result and rec.last_user_text == "queued prompt"
    third = await ask(agent, history)  # same message again: now it's a new prompt
    assert third.content[0].text == "new turn"


async def test_message_and_tool_ids_are_unique(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(*(Turn(ToolCall("Read", {"file_path": str(i)})) for i in range(3)))
    replies = [await ask(agent, f"p{i}") for i in range(3)]
    replies.append((await stream(agent, "streamed"))[0])
    replies.append(await ask(agent, "demo"))
    message_ids = [m.id for m in replies]
    assert len(set(message_ids)) == len(message_ids)
    assert all(i.startswith("msg_mock_") for i in message_ids)
    tool_ids = [m.content[0].id for m in replies[:3]]
    assert len(set(tool_ids)) == 3


async def test_compaction_request_does_not_consume_the_script(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(Turn(Text("real answer")))
    summary = await ask(
        agent, "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nSummarize."
    )
    assert summary.content[0].text == "<summary>Conversation summary (mock).</summary>"
    assert bridge.agent.pending() == 1 and bridge.agent_requests()[0].is_compaction
    assert (await ask(agent, "question")).content[0].text == "real answer"


async def test_usage_from_turn_and_step(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(
        Turn(
            ToolCall("Read", {"file_path": "x"}),
            Step(Text("small"), input_tokens=7),
            input_tokens=150000,
        )
    )
    first, _ = await stream(agent, "big context")
    assert first.usage.input_tokens == 150000
    second = await ask(agent, after_tool("big context", first, tool_result(first.content[0].id)))
    assert second.usage.input_tokens == 7 and second.usage.output_tokens == 5


async def test_chunk_size_and_delay(bridge: MockBridge, agent: anthropic.AsyncAnthropic) -> None:
    bridge.agent.script(Turn(Text("abcdefghij", chunk_size=3, chunk_delay=0.1)))
    started = time.monotonic()
    msg, deltas = await stream(agent, "slow")
    assert deltas == ["abc", "def", "ghi", "j"]
    assert msg.content[0].text == "abcdefghij"
    assert time.monotonic() - started >= 0.3  # three delays between four deltas


# --- demo model ---------------------------------------------------------------------------

CARD_TOOL = {"name": "mcp__canvas__create_card", "input_schema": {"type": "object"}}
SEARCH_TOOL = {"name": "mcp__memory__search_memory", "input_schema": {"type": "object"}}


async def test_demo_card_calls_the_tool_then_confirms(agent: anthropic.AsyncAnthropic) -> None:
    first = await ask(agent, "Card: Groceries", tools=[CARD_TOOL])
    use = first.content[0]
    assert use.name == "mcp__canvas__create_card"
    assert use.input == {"title": "Groceries", "body": "Created by the demo model.", "kind": "note"}
    ok = await ask(
        agent, after_tool("Card: Groceries", first, tool_result(use.id)), tools=[CARD_TOOL]
    )
    assert ok.content[0].text == 'Created the card "Groceries".'

    again = await ask(agent, "card: Tea", tools=[CARD_TOOL])
    failed_result = tool_result(again.content[0].id, "x" * 300, is_error=True)
    failed = await ask(agent, after_tool("card: Tea", again, failed_result), tools=[CARD_TOOL])
    assert "failed" in failed.content[0].text and "x" * 200 in failed.content[0].text
    assert "x" * 201 not in failed.content[0].text


async def test_demo_search_and_echo_and_missing_tool(agent: anthropic.AsyncAnthropic) -> None:
    first = await ask(agent, "search: tea", tools=[SEARCH_TOOL])
    assert first.content[0].input == {"query": "tea"}
    found = await ask(
        agent,
        after_tool("search: tea", first, tool_result(first.content[0].id, "Ada likes green tea")),
    )
    assert "Ada likes green tea" in found.content[0].text
    unavailable = await ask(agent, "card: Groceries", tools=[SEARCH_TOOL])
    assert unavailable.stop_reason == "end_turn" and "not available" in unavailable.content[0].text
    msg, deltas = await stream(agent, "hello there friend")
    assert msg.content[0].text == "You said: hello there friend" and len(deltas) == 5


async def test_in_dev_mode_the_demo_model_streams_its_reply_a_word_at_a_time() -> None:
    """Dev mode's pace: each word a delta of its own, arriving over time as from a real model."""
    async with MockBridge(demo_word_delay=DEV_WORD_DELAY) as paced, make_client(paced, CLI_UA) as client:
        arrived: list[float] = []
        asked = time.monotonic()
        async with client.messages.stream(model=MODEL, max_tokens=100,
                                          messages=[{"role": "user", "content": "one two three four"}]) as s:
            async for event in s:
                if event.type == "text":
                    arrived.append(time.monotonic())
        assert (await s.get_final_message()).content[0].text == "You said: one two three four"
    assert len(arrived) == 6  # "You ", "said: ", "one ", ...
    # Paced: the last word cannot come before five pauses have passed. Measured from the request, not
    # from the first word, which a busy client may read late, and the rest right after it.
    assert arrived[-1] - asked >= 5 * DEV_WORD_DELAY


# --- faults --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "exc", "error_type"),
    [
        (429, anthropic.RateLimitError, "rate_limit_error"),
        (500, anthropic.InternalServerError, "api_error"),
        (529, anthropic.OverloadedError, "overloaded_error"),
    ],
)
async def test_status_fault(
    bridge: MockBridge,
    curator: anthropic.AsyncAnthropic,
    status: int,
    exc: type[Exception],
    error_type: str,
) -> None:
    bridge.curator.script("after the fault")
    bridge.faults.add(Fault("status", status=status, target="curator", times=2))
    for _ in range(2):
        with pytest.raises(exc) as info:
            await ask(curator, "hi")
        assert info.value.status_code == status  # type: ignore[attr-defined]
        assert info.value.body["error"]["type"] == error_type  # type: ignore[attr-defined]
    assert (await ask(curator, "hi")).content[0].text == "after the fault"  # script not consumed
    assert bridge.faults.active() == []


async def test_fault_target_and_clear(
    bridge: MockBridge, curator: anthropic.AsyncAnthropic, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.faults.add(Fault("status", status=529, target="curator"))  # until removed
    assert (await ask(agent, "unaffected")).content[0].text == "You said: unaffected"
    for _ in range(3):
        with pytest.raises(anthropic.OverloadedError):
            await ask(curator, "hi")
    bridge.faults.clear()
    assert (await ask(curator, "hi")).content[0].text == "NONE"


async def test_cut_stream_raises_and_keeps_the_script(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic
) -> None:
    bridge.agent.script(Turn(Text("one two three four five")))
    bridge.faults.add(Fault("cut", after_events=3, target="agent", times=1))
    deltas: list[str] = []
    with pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)):
        async with agent.messages.stream(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]
        ) as s:
            async for event in s:
                if event.type == "text":
                    deltas.append(event.text)
    assert deltas == ["one "]  # message_start, content_block_start, first delta, then the cut
    assert bridge.agent.pending() == 1  # the retry gets the same turn
    msg, _ = await stream(agent, "x")
    assert msg.content[0].text == "one two three four five"


async def test_cut_non_streaming_raises(
    bridge: MockBridge, curator: anthropic.AsyncAnthropic
) -> None:
    bridge.faults.add(Fault("cut", times=1))
    with pytest.raises(anthropic.APIConnectionError):
        await ask(curator, "hi")
    assert (await ask(curator, "hi")).content[0].text == "NONE"


async def test_malformed_stream_raises(bridge: MockBridge, agent: anthropic.AsyncAnthropic) -> None:
    bridge.faults.add(Fault("malformed", target="agent", times=1))
    with pytest.raises(ValueError):  # json.JSONDecodeError from the SDK's SSE decoding
        await stream(agent, "hi")
    assert (await stream(agent, "hi"))[0].content[0].text == "You said: hi"


async def test_latency_delays_and_combines(
    bridge: MockBridge, curator: anthropic.AsyncAnthropic
) -> None:
    bridge.faults.add(Fault("latency", seconds=0.3, target="curator", times=1))
    bridge.faults.add(Fault("status", status=500, target="curator", times=1))
    started = time.monotonic()
    with pytest.raises(anthropic.InternalServerError):
        await ask(curator, "slow")
    assert time.monotonic() - started >= 0.3
    assert bridge.requests[0].faults == ["latency", "status"]
    await ask(curator, "fast")
    assert bridge.requests[1].faults == []  # each fault was used up by its one time


async def test_interrupt_and_cut_keep_the_server_quiet_and_alive(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    bridge.agent.script(Turn(Text("a b c d e f g h", chunk_delay=0.05)))
    messages = [{"role": "user", "content": "x"}]
    async with agent.messages.stream(model=MODEL, max_tokens=10, messages=messages) as s:  # type: ignore[arg-type]
        async for event in s:
            if event.type == "text":
                break  # leaving the block closes the connection mid-stream, like an interrupt
    # An interrupted turn counts as started (the server notices the close on its next write).
    await wait_for(lambda: bridge.agent.pending() == 0, timeout=5)
    bridge.faults.add(Fault("cut", times=1))
    with pytest.raises(anthropic.APIConnectionError):
        await ask(agent, "cut")
    assert (await ask(agent, "still there")).content[0].text == "You said: still there"
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- records and HTTP edges ----------------------------------------------------------------


async def test_records(
    bridge: MockBridge, agent: anthropic.AsyncAnthropic, curator: anthropic.AsyncAnthropic
) -> None:
    await agent.messages.create(
        model=MODEL,
        max_tokens=10,
        system=[{"type": "text", "text": "preamble"}, {"type": "text", "text": "TEST PROMPT"}],
        tools=[CARD_TOOL, {"name": "Read", "input_schema": {"type": "object"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )
    await ask(curator, "curate", system="plain string system")
    a, c = bridge.requests
    assert (a.target, c.target) == ("agent", "curator")
    assert a.user_agent == CLI_UA and c.user_agent.startswith("AsyncAnthropic/Python")
    assert a.system_text == "preamble\n\nTEST PROMPT" and c.system_text == "plain string system"
    assert a.tools == ["mcp__canvas__create_card", "Read"] and c.tools == []
    assert a.last_user_text == "hi" and c.last_user_text == "curate"
    assert a.path == "/v1/messages" and a.method == "POST" and a.messages[0]["role"] == "user"
    assert a.body is not None and a.body["model"] == MODEL
    assert a.time <= c.time


async def test_count_tokens(bridge: MockBridge, agent: anthropic.AsyncAnthropic) -> None:
    counted = await agent.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "x" * 400}]
    )
    assert counted.input_tokens >= 100
    assert bridge.requests[0].kind == "count_tokens" and bridge.agent_requests() == []


async def test_bad_requests_get_json_errors(bridge: MockBridge) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{bridge.url}/v1/messages", data=b"{not json") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["type"] == "invalid_request_error"
        async with http.post(f"{bridge.url}/v1/messages", json=["a list"]) as resp:
            assert resp.status == 400
        async with http.get(f"{bridge.url}/v1/nope") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "not_found_error"
        async with http.post(f"{bridge.url}/v1/messages", json={"messages": []}) as resp:
            assert resp.status == 200  # still serving
    assert bridge.requests[0].body is None


async def test_wait_for(bridge: MockBridge, curator: anthropic.AsyncAnthropic) -> None:
    task = asyncio.create_task(ask(curator, "hi"))
    await bridge.wait_for(lambda b: len(b.curator_requests()) >= 1, timeout=5)
    await task
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"not met within 0\.2s"):
        await bridge.wait_for(lambda b: len(b.curator_requests()) >= 2, timeout=0.2)
    assert time.monotonic() - started >= 0.2


async def test_start_stop_explicitly() -> None:
    bridge = MockBridge()
    url = await bridge.start(port=0)
    try:
        assert url == bridge.url and bridge.port > 0
        async with make_client(bridge) as c:
            assert (await ask(c, "hi")).content[0].text == "NONE"
    finally:
        await bridge.stop()
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"{url}/health")


def test_standalone_run_prints_url_and_serves() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "devkit.mock_bridge", "--host", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        env=kit_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("mock bridge listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1]
        http = anthropic.DefaultHttpxClient(verify=NO_CA)
        with anthropic.Anthropic(
            base_url=url, api_key="x", max_retries=0, http_client=http
        ) as client:
            msg = client.messages.create(
                model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
            )
        assert msg.content[0].text == "NONE"
    finally:
        proc.terminate()
        assert proc.wait(timeout=5) == 0
        if proc.stdout is not None:
            proc.stdout.close()


# --- end to end with the real Claude Code CLI ----------------------------------------------


@pytest.mark.e2e
async def test_real_cli_runs_a_scripted_tool_turn(bridge: MockBridge, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from claude_agent_sdk import (
        ClaudeAgentOptions,
        ClaudeSDKClient,
        ResultMessage,
        create_sdk_mcp_server,
        tool,
    )

    calls: list[dict[str, Any]] = []

    @tool("create_card", "Create a card on the canvas", {"title": str, "body": str, "kind": str})
    async def create_card(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"content": [{"type": "text", "text": "card c1 created"}]}

    card = {"title": "Groceries", "body": "milk", "kind": "note"}
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", card), Text("Created it.")))
    options = ClaudeAgentOptions(
        system_prompt="TEST",
        cwd=tmp_path,
        setting_sources=[],
        tools=["Read"],
        allowed_tools=["mcp__canvas__create_card"],
        mcp_servers={"canvas": create_sdk_mcp_server("canvas", tools=[create_card])},
        env={
            "ANTHROPIC_BASE_URL": bridge.url,
            "ANTHROPIC_API_KEY": "x",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "ENABLE_TOOL_SEARCH": "false",
            "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",
        },
    )
    # The SDK waits 60 s for the CLI's answer to its first request unless told longer (in ms): a CLI
    # started on a loaded machine can take that long, and the test is about the turn, not the start.
    monkeypatch.setenv("CLAUDE_CODE_STREAM_CLOSE_TIMEOUT", "300000")
    client = ClaudeSDKClient(options)
    results: list[ResultMessage] = []
    try:
        await client.connect()
        await client.query("Make a groceries card")
        async for message in client.receive_response():
            if isinstance(message, ResultMessage):
                results.append(message)
    finally:
        await client.disconnect()

    assert calls == [card]
    assert results and results[-1].result == "Created it." and not results[-1].is_error
    requests = bridge.agent_requests()
    assert len(requests) == 2 and requests[1].is_tool_result
    assert all(r.user_agent.startswith("claude-cli/") for r in bridge.requests)
    assert requests[0].last_user_text == "Make a groceries card"
    assert "TEST" in requests[0].system_text and "mcp__canvas__create_card" in requests[0].tools
