"""Capture from the runtime's stream: one observation per turn, recorded once, private text never
stored, bounded work per value, sub-agents left out, never in the agent's way."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import (
    AssistantMessage,
    ResultMessage,
    StreamEvent,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserMessage,
)

from sprite_os import protocol as p
from sprite_os.agent.frames import result_frames
from sprite_os.console.session_queries import turns_page
from sprite_os.db_worker import Worker
from sprite_os.memory.capture.journal import STOPPED_NOTE
from sprite_os.memory.capture.recorder import (
    MAX_TOOL_CALLS,
    PRIVATE_MARGIN,
    TurnRecorder,
    _bounded,
    strip_private,
)
from sprite_os.memory.capture.writer import TranscriptWriter
from sprite_os.memory.hooks import HookTimings, fail_open
from sprite_os.memory.transcript_store import Observation, TranscriptDB
from sprite_os.paths import Layout


def result(subtype: str = "success", text: str | None = "final answer", num_turns: int = 1,
           **fields: Any) -> ResultMessage:
    values: dict[str, Any] = dict(subtype=subtype, duration_ms=1, duration_api_ms=1, is_error=subtype != "success",
                                  num_turns=num_turns, session_id="cli", result=text)
    return ResultMessage(**(values | fields))


def says(text: str, parent: str | None = None) -> AssistantMessage:
    return AssistantMessage(content=[TextBlock(text=text)], model="m", parent_tool_use_id=parent)


def calls(tool_id: str, name: str, tool_input: dict[str, Any], parent: str | None = None) -> AssistantMessage:
    return AssistantMessage(content=[ToolUseBlock(id=tool_id, name=name, input=tool_input)], model="m",
                            parent_tool_use_id=parent)


def answers(tool_id: str, content: Any, is_error: bool | None = None, parent: str | None = None) -> UserMessage:
    return UserMessage(content=[ToolResultBlock(tool_use_id=tool_id, content=content, is_error=is_error)],
                       parent_tool_use_id=parent)


class Kit:
    def __init__(self, tmp_path: Path) -> None:
        self.worker: Worker[TranscriptDB] = Worker("t", lambda: TranscriptDB(tmp_path / "t.db"))
        self.files = ThreadPoolExecutor(max_workers=1)
        self.writer = TranscriptWriter(self.worker, Layout(tmp_path), self.files)
        self.recorded: list[int] = []
        self.recorder = TurnRecorder(self.writer, lambda: self.recorded.append(1))

    async def rows(self) -> list[Observation]:
        await self.writer.drained(10)
        return await self.worker.call(lambda t: list(t.iter_all()))


@pytest.fixture
async def kit(tmp_path: Path) -> AsyncIterator[Kit]:
    k = Kit(tmp_path)
    await k.writer.start()
    k.recorder.start_session("sess-1")
    yield k
    await k.writer.stop(5)
    await k.worker.close()
    k.files.shutdown()


async def test_one_observation_per_turn(kit: Kit) -> None:
    record = kit.recorder.open("make a card")
    for message in (StreamEvent(uuid="u", session_id="s", event={"type": "message_start"}),
                    calls("t1", "mcp__canvas__create_card", {"title": "A"}),
                    answers("t1", [{"type": "text", "text": "ok"}]),
                    calls("t2", "Read", {"file_path": "x"}),
                    answers("t2", "y" * 10_000),
                    says("Done.")):
        record.observe(message)
    record.close(result(text="Done."))
    record.close(result(text="Done."))  # a second close must not record again
    [obs] = await kit.rows()
    tool_calls = json.loads(obs.tool_calls_json)
    assert (obs.session_id, obs.sequence_num, obs.user_message, obs.agent_response) == (
        "sess-1", 1, "make a card", "Done.")
    assert [c["name"] for c in tool_calls] == ["mcp__canvas__create_card", "Read"]
    assert tool_calls[0] == {"name": "mcp__canvas__create_card", "input": '{"title": "A"}',
                             "output": '[{"type": "text", "text": "ok"}]', "is_error": False}
    assert len(tool_calls[1]["output"]) < 1100  # tool output is cut to a bounded summary
    assert kit.recorded == [1]  # the daemon hears of each recorded turn once (its batch trigger)


async def test_interrupted_turn_is_closed_from_the_result(kit: Kit) -> None:
    record = kit.recorder.open("write a long essay")
    record.interrupted()
    record.close(result("error_during_execution", text=""))
    [obs] = await kit.rows()
    assert "interrupted" in obs.agent_response and obs.status == "interrupted"


@pytest.mark.parametrize("stopped_by", [None, "person", "server"])
@pytest.mark.parametrize("end", [
    result(text="all of it"),  # whole: a stop that came after the answer leaves it completed
    result("error_during_execution", text=""),  # cut short by the stop (or, unstopped, a failure)
    result("error_max_turns", text="gave up"),
], ids=["success", "cut short", "failed"])
async def test_what_the_person_is_told_live_is_what_the_record_keeps(
        kit: Kit, end: ResultMessage, stopped_by: str | None) -> None:
    """A turn whose interrupt reached the CLI after the answer was whole was sent live as interrupted and
    recorded completed. One rule now says both (turn_end.py); the record's `stopped` is the live frame's
    interrupted by the server."""
    record = kit.recorder.open("an answer", "t-1")
    if stopped_by is not None:
        record.interrupted(by_server=stopped_by == "server")
    record.close(end)
    [obs] = await kit.rows()
    [*_, live] = result_frames("t-1", end, interrupted=stopped_by is not None, by_server=stopped_by == "server")
    assert isinstance(live, p.TurnComplete)
    assert obs.status == ("stopped" if live.status == "interrupted" and live.by_server else live.status)


@pytest.mark.parametrize("text", ["/compact", "an answer"])
async def test_a_turn_cut_short_that_nobody_stopped_is_recorded_error_even_when_the_cli_calls_it_no_error(
        kit: Kit, text: str) -> None:
    """The real CLI ends a turn an API error cut short with `error_during_execution`, `is_error: false`
    (and, for a command, no model turn). Nobody stopped it: it was recorded `completed`, and a command was
    taken for one the CLI ran itself, its client id kept with no turn, so that Past sessions showed
    nothing of the failure. Both are a turn that failed."""
    kit.recorder.open(text, "t-1", client_id="c-1").close(
        result("error_during_execution", text=None, num_turns=0, is_error=False))
    [obs] = await kit.rows()
    assert obs.status == "error"


async def test_a_turn_the_servers_stop_cut_short_is_recorded_so_not_as_the_persons_interrupt(kit: Kit) -> None:
    """The server's stop interrupts the running turn, and the CLI's result says it was interrupted: the
    record (and the console's Past sessions) said the person interrupted it. Now it says the server
    stopped before the turn ended, as a turn a kill cut short reads at the next start."""
    cut = kit.recorder.open("write a long essay")
    cut.observe(says("the first part"))
    cut.interrupted(by_server=True)
    cut.close(result("error_during_execution", text=""))
    waited = kit.recorder.open("waited out")
    waited.interrupted(by_server=True)
    waited.close(None)  # the runtime cancelled by the stop
    done = kit.recorder.open("done in time")
    done.interrupted(by_server=True)
    done.close(result(text="all of it"))  # it ended before the stop
    rows = [(o.agent_response, o.status) for o in await kit.rows()]
    assert rows == [(f"the first part\n{STOPPED_NOTE}", "stopped"), (STOPPED_NOTE, "stopped"), ("all of it", "completed")]


async def test_a_turn_the_person_stopped_first_is_theirs_though_the_stop_then_cuts_or_cancels_it(kit: Kit) -> None:
    """Whoever stopped the turn first names it: the person's interrupt, then the server's stop, is the
    person's, whether the CLI's result came (interrupted) or the stop's grace ran out (cancelled)."""
    for prompt, end in (("answered", result("error_during_execution", text="")), ("cancelled", None)):
        record = kit.recorder.open(prompt)
        record.observe(says("so far"))
        record.interrupted()
        record.interrupted(by_server=True)
        record.close(end)
    rows = [(o.agent_response, o.status) for o in await kit.rows()]
    assert rows == [("so far\n(interrupted by the user)", "interrupted")] * 2


async def test_failed_cli_still_records_the_prompt(kit: Kit) -> None:
    kit.recorder.open("hello?").close(None, "CLIConnectionError()")
    [obs] = await kit.rows()
    assert obs.user_message == "hello?" and "failed" in obs.agent_response and obs.status == "error"


async def test_a_turn_keeps_its_wire_id_its_client_id_its_status_and_its_own_cost(kit: Kit) -> None:
    kit.recorder.open("hello", "turn-7f3a", "web-1").close(result(text="hi"), cost_usd=0.0003)
    failed = kit.recorder.open("again", "turn-8b1c")
    failed.observe(AssistantMessage(model="<synthetic>", error="server_error",
                                    content=[TextBlock(text="API Error: 502 Bad Gateway")]))
    failed.close(result(text="", is_error=True, api_error_status=502))
    await kit.rows()
    ok, bad = await kit.worker.call(lambda t: turns_page(t, "sess-1", None, 10)[0])  # as session_turns reads them
    assert (ok.turn_id, ok.client_id, ok.status, ok.cost_usd) == ("turn-7f3a", "web-1", "completed", 0.0003)
    assert (bad.turn_id, bad.client_id, bad.status, bad.cost_usd) == ("turn-8b1c", None, "error", None)
    assert "API Error" not in bad.agent_response  # the CLI's notice is not the agent's words


async def test_turns_are_numbered_as_they_close_and_one_never_closed_leaves_nothing(kit: Kit) -> None:
    kit.recorder.open("interrupted before it was sent")  # the runtime never closes such a turn
    kit.recorder.open("first").close(result(text="ok"))
    kit.recorder.open("second").close(result(text="ok"))
    assert [(o.sequence_num, o.user_message) for o in await kit.rows()] == [(1, "first"), (2, "second")]


async def test_the_response_is_the_result_or_else_the_last_thing_the_agent_said(kit: Kit) -> None:
    record = kit.recorder.open("tell me")
    record.observe(says("a first part"))
    record.observe(says("the last part"))
    record.interrupted()
    record.close(result("error_during_execution", text=None))
    [obs] = await kit.rows()
    assert obs.agent_response == "the last part\n(interrupted by the user)"


async def test_private_text_is_never_stored(kit: Kit) -> None:
    record = kit.recorder.open("my pin is <private>4321</private>, remember the cat")
    record.observe(calls("t", "Bash", {"command": "echo <private>s3cret</private>"}))
    record.observe(answers("t", "ok"))
    record.close(result(text="Noted <private>4321</private>."))
    [obs] = await kit.rows()
    stored = obs.user_message + obs.tool_calls_json + obs.agent_response
    assert "4321" not in stored and "s3cret" not in stored and "remember the cat" in stored
    assert strip_private("a <PRIVATE>b\nc</Private> d <private>unclosed") == "a [private] d [private]"


async def test_capture_fails_open(kit: Kit) -> None:
    record = kit.recorder.open("hi")
    record.observe(AssistantMessage(content=None, model="m"))  # type: ignore[arg-type]  # raises inside; never outside
    assert kit.recorder.timings.errors == 1
    record.close(object())  # type: ignore[arg-type]
    assert kit.recorder.timings.errors == 2
    assert kit.recorder.timings.samples_ns  # every step is timed for the benchmark

    timings = HookTimings()

    @fail_open(timings)
    async def broken(data: Any, _id: str | None, _ctx: Any) -> dict[str, Any]:
        raise RuntimeError(data)

    assert await broken({"x": 1}, None, None) == {}  # and so do the hooks
    assert timings.errors == 1 and len(timings.samples_ns) == 1


async def test_lone_surrogates_from_the_cli_are_recorded_not_dropped(kit: Kit) -> None:
    broken = json.loads('"cut mid-emoji \\ud83d"')  # what a UTF-16 truncation leaves
    record = kit.recorder.open(broken)
    record.observe(calls("t", "Read", {}))
    record.observe(answers("t", broken))
    record.close(result(text=broken))
    [obs] = await kit.rows()
    assert obs.user_message.startswith("cut mid-emoji") and obs.agent_response.startswith("cut mid-emoji")


async def test_a_closed_turn_is_not_recorded_again_when_the_stream_then_fails(kit: Kit) -> None:
    record = kit.recorder.open("make a card")
    record.close(result(text="Done."))
    record.close(None, "CLIConnectionError()")
    assert [(o.sequence_num, o.agent_response) for o in await kit.rows()] == [(1, "Done.")]
    # The next turn fails before the CLI said anything: its prompt is still recorded, once.
    kit.recorder.open("are you there?").close(None, "CLIConnectionError()")
    assert [o.user_message for o in await kit.rows()] == ["make a card", "are you there?"]


async def test_an_interrupted_turn_does_not_hide_the_next_failed_turn(kit: Kit) -> None:
    kit.recorder.open("long essay").close(result("error_during_execution", text=""))
    kit.recorder.open("hello?").close(None, "CLIConnectionError()")
    assert [o.user_message for o in await kit.rows()] == ["long essay", "hello?"]


async def test_sub_agent_tool_calls_are_not_the_users_turn(kit: Kit) -> None:
    record = kit.recorder.open("research this")
    record.observe(calls("task", "Task", {"prompt": "look it up"}))
    record.observe(calls("sub", "WebFetch", {"url": "https://example.org"}, parent="task"))
    record.observe(answers("sub", "a page", parent="task"))
    record.observe(says("sub-agent notes", parent="task"))
    record.observe(answers("task", "found it"))
    record.close(result(text=None))
    [obs] = await kit.rows()
    assert [(c["name"], c["output"]) for c in json.loads(obs.tool_calls_json)] == [("Task", "found it")]
    assert obs.agent_response == ""  # the sub-agent's words are not the agent's answer


async def test_tool_calls_past_the_limit_are_counted_not_stored(kit: Kit) -> None:
    record = kit.recorder.open("busy turn")
    for n in range(MAX_TOOL_CALLS + 5):
        record.observe(calls(f"t{n}", "Read", {"file_path": f"f{n}"}))
        record.observe(answers(f"t{n}", "x", is_error=n == 0))
    record.close(result())
    [obs] = await kit.rows()
    stored = json.loads(obs.tool_calls_json)
    assert len(stored) == MAX_TOOL_CALLS + 1 and stored[0]["is_error"] is True
    assert stored[-1] == {"name": "(more)", "input": "", "output": "5 more calls", "is_error": False}


async def test_a_command_the_cli_runs_itself_is_not_a_turn(kit: Kit) -> None:
    kit.recorder.open("/compact").close(result(text="", num_turns=0))
    kit.recorder.open("/etc/hosts is odd, isn't it?").close(result(text="It is."))
    assert [o.user_message for o in await kit.rows()] == ["/etc/hosts is odd, isn't it?"]
    assert kit.recorded == [1]


async def test_closing_a_turn_never_waits_for_the_disk(kit: Kit) -> None:
    entered, gate, finished = threading.Event(), threading.Event(), threading.Event()

    def busy(_db: TranscriptDB) -> None:
        entered.set()
        gate.wait(10)
        finished.set()

    kit.worker.submit(busy)
    assert entered.wait(5)
    kit.recorder.open("quick").close(result(text="ok"))
    assert kit.recorded == [1] and not finished.is_set()  # closed while the database thread was still busy
    gate.set()
    [obs] = await kit.rows()
    assert obs.user_message == "quick"


@pytest.mark.parametrize("offset", [0, 990, 997, 1000, 1005, 1000 + PRIVATE_MARGIN - 5, 1000 + PRIVATE_MARGIN + 5])
def test_a_huge_value_is_cut_before_private_text_is_stripped_and_nothing_private_leaks(offset: int) -> None:
    secret = "<private>" + "SECRET " * 2_000_000 + "</private> public tail"  # about 14 MB
    for value in ("x" * offset + secret, {"stdout": "x" * offset + secret, "stderr": ""},
                  [{"type": "text", "text": "x" * offset + secret}]):
        out = _bounded(value, 1000)
        assert "SE" not in out and len(out) <= 1020
        assert out.endswith("more]")


def test_a_huge_structure_is_cut_to_its_limit() -> None:
    out = _bounded({"rows": list(range(1_000_000)), "note": "y" * 10_000_000}, 1000)
    assert out.startswith('{"rows": [0, 1, 2') and len(out) <= 1020 and out.endswith("…[more]")
    assert _bounded({"a": "<private>pin</private> ok"}, 1000) == '{"a": "[private] ok"}'  # small: whole
