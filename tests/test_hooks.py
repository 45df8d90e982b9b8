"""Capture: one observation per turn, recorded once, private text never stored, hooks fail open."""

import json
from pathlib import Path
from typing import Any

import pytest
from claude_agent_sdk import ResultMessage

from sprite_os.db_worker import Worker
from sprite_os.memory.hooks import PRIVATE_MARGIN, TurnRecorder, _bounded, strip_private
from sprite_os.memory.transcript_store import TranscriptDB


def result(subtype: str = "success", text: str = "final answer") -> ResultMessage:
    return ResultMessage(subtype=subtype, duration_ms=1, duration_api_ms=1, is_error=subtype != "success",
                         num_turns=1, session_id="cli", result=text)


@pytest.fixture
async def recorder(tmp_path: Path) -> Any:
    worker = Worker("t", lambda: TranscriptDB(tmp_path / "t.db"))
    recorded: list[int] = []
    rec = TurnRecorder(worker, lambda: recorded.append(1))
    rec.start_session("sess-1")
    rec.recorded = recorded  # type: ignore[attr-defined]
    rec.worker = worker  # type: ignore[attr-defined]
    yield rec
    await worker.close()


async def rows(rec: Any) -> list[Any]:
    return await rec.worker.call(lambda t: list(t.iter_all()))


async def test_one_observation_per_turn(recorder: Any) -> None:
    await recorder.on_user_prompt({"prompt": "make a card", "prompt_id": "p1"}, None, None)
    await recorder.on_post_tool_use({"tool_name": "mcp__canvas__create_card", "tool_input": {"title": "A"},
                                     "tool_response": [{"type": "text", "text": "ok"}]}, "t1", None)
    await recorder.on_post_tool_use({"tool_name": "Read", "tool_input": {"file_path": "x"},
                                     "tool_response": "y" * 10_000}, "t2", None)
    await recorder.on_stop({"prompt_id": "p1", "last_assistant_message": "Done."}, None, None)
    recorder.turn_finished("make a card", result(), None)  # the ResultMessage path: must not record again
    [obs] = await rows(recorder)
    calls = json.loads(obs.tool_calls_json)
    assert (obs.session_id, obs.sequence_num, obs.user_message, obs.agent_response) == (
        "sess-1", 1, "make a card", "Done.")
    assert [c["name"] for c in calls] == ["mcp__canvas__create_card", "Read"]
    assert len(calls[1]["output"]) < 1100  # tool output is cut to a bounded summary
    assert recorder.recorded == [1]


async def test_interrupted_turn_is_closed_from_the_result(recorder: Any) -> None:
    await recorder.on_user_prompt({"prompt": "write a long essay", "prompt_id": "p1"}, None, None)
    recorder.turn_finished("write a long essay", result("error_during_execution", text=""), None)
    [obs] = await rows(recorder)
    assert "interrupted" in obs.agent_response


async def test_failed_cli_still_records_the_prompt(recorder: Any) -> None:
    recorder.turn_finished("hello?", None, "CLIConnectionError()")
    [obs] = await rows(recorder)
    assert obs.user_message == "hello?" and "failed" in obs.agent_response


async def test_a_turn_that_never_closed_is_recorded_when_the_next_begins(recorder: Any) -> None:
    await recorder.on_user_prompt({"prompt": "first", "prompt_id": "p1"}, None, None)
    await recorder.on_user_prompt({"prompt": "second", "prompt_id": "p2"}, None, None)
    await recorder.on_stop({"prompt_id": "p2", "last_assistant_message": "ok"}, None, None)
    assert [(o.sequence_num, o.user_message) for o in await rows(recorder)] == [(1, "first"), (2, "second")]


async def test_private_text_is_never_stored(recorder: Any) -> None:
    await recorder.on_user_prompt({"prompt": "my pin is <private>4321</private>, remember the cat", "prompt_id": "p"},
                                  None, None)
    await recorder.on_post_tool_use({"tool_name": "Bash", "tool_input": {"command": "echo <private>s3cret</private>"},
                                     "tool_response": "ok"}, "t", None)
    await recorder.on_stop({"prompt_id": "p", "last_assistant_message": "Noted <private>4321</private>."}, None, None)
    [obs] = await rows(recorder)
    stored = obs.user_message + obs.tool_calls_json + obs.agent_response
    assert "4321" not in stored and "s3cret" not in stored and "remember the cat" in stored
    assert strip_private("a <PRIVATE>b\nc</Private> d <private>unclosed") == "a [private] d [private]"


async def test_hooks_fail_open(recorder: Any) -> None:
    assert await recorder.on_user_prompt(None, None, None) == {}  # malformed input raises inside; never outside
    assert recorder.timings.errors == 1
    assert await recorder.on_stop({}, None, None) == {}
    assert recorder.timings.samples_ns  # every call is timed for the benchmark


async def test_lone_surrogates_from_the_cli_are_recorded_not_dropped(recorder: Any) -> None:
    broken = json.loads('"cut mid-emoji \\ud83d"')  # what a UTF-16 truncation leaves
    await recorder.on_user_prompt({"prompt": broken, "prompt_id": "p"}, None, None)
    await recorder.on_post_tool_use({"tool_name": "Read", "tool_input": {}, "tool_response": broken}, "t", None)
    await recorder.on_stop({"prompt_id": "p", "last_assistant_message": broken}, None, None)
    [obs] = await rows(recorder)
    assert obs.user_message.startswith("cut mid-emoji") and obs.agent_response.startswith("cut mid-emoji")


async def test_a_turn_stop_recorded_is_not_recorded_again_when_the_stream_then_fails(recorder: Any) -> None:
    await recorder.on_user_prompt({"prompt": "make a card", "prompt_id": "p1"}, None, None)
    await recorder.on_stop({"prompt_id": "p1", "last_assistant_message": "Done."}, None, None)
    recorder.turn_finished("make a card", None, "CLIConnectionError()")
    assert [(o.sequence_num, o.agent_response) for o in await rows(recorder)] == [(1, "Done.")]
    # The next turn fails before any hook fired: its prompt is still recorded, once.
    recorder.turn_finished("are you there?", None, "CLIConnectionError()")
    assert [o.user_message for o in await rows(recorder)] == ["make a card", "are you there?"]


async def test_a_turn_closed_by_the_runtime_does_not_hide_the_next_failed_turn(recorder: Any) -> None:
    await recorder.on_user_prompt({"prompt": "long essay", "prompt_id": "p1"}, None, None)
    recorder.turn_finished("long essay", result("error_during_execution", text=""), None)  # no Stop: interrupted
    recorder.turn_finished("hello?", None, "CLIConnectionError()")  # fails before any hook fires
    assert [o.user_message for o in await rows(recorder)] == ["long essay", "hello?"]


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
