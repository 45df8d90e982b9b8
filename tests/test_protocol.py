"""The wire format: every frame round-trips, and every kind of bad frame is named precisely."""

import msgspec
import pytest

from sprite_os import protocol as p
from sprite_os.console.card_frames import CardCloseResult
from tests.test_console_files import FILES_REPLIES
from tests.test_console_sessions import SESSION_REPLIES
from tests.test_protocol_memory import MEMORY_REPLIES


@pytest.mark.parametrize(("raw", "code", "fragment"), [
    (b"{bad", "invalid_json", "not valid JSON"),
    (b"", "invalid_json", "not valid JSON"),
    (b"\xff\xfe", "invalid_json", ""),
    (b'{"type":"launch_missiles"}', "unknown_type", "launch_missiles"),
    (b'{"text":"hi"}', "invalid_frame", "no `type`"),
    (b'{"type":"user_message"}', "invalid_frame", "`text`"),
    (b'{"type":"user_message","text":42}', "invalid_frame", "Expected `str`"),
    (b'{"type":"user_message","text":""}', "invalid_frame", "length >= 1"),
    (b'{"type":"hello","last_seq":-1}', "invalid_frame", ">= 0"),
    (b'{"type":"hello","last_seq":"7"}', "invalid_frame", "Expected `int"),
    (b"[1,2]", "invalid_frame", "Expected `object`"),
    (b'"hello"', "invalid_frame", "Expected `object`"),
    (b'{"type":5}', "invalid_frame", "Expected `str`"),
])
def test_bad_frames_are_named(raw: bytes, code: str, fragment: str) -> None:
    with pytest.raises(p.FrameError) as info:
        p.decode_client_frame(raw)
    assert info.value.code == code
    assert fragment in info.value.message


def test_oversized_text_is_refused_in_plain_words() -> None:
    """Not msgspec's "Expected `str` of length <= 100000 - at `$.text`": a person reads it."""
    frame = msgspec.json.encode({"type": "user_message", "text": "é" * (p.MAX_USER_TEXT + 1), "client_id": "c1"})
    with pytest.raises(p.FrameError) as info:
        p.decode_client_frame(frame)
    assert info.value.code == "invalid_frame"
    assert info.value.message == "the message is too long to send: 100,001 characters, and the limit is 100,000"
    assert p.ids_of(frame).client_id == "c1"


def test_client_frames_decode_and_ignore_unknown_fields() -> None:
    frame = p.decode_client_frame('{"type":"user_message","text":"hi","client_id":"c1","future":1}')
    assert frame == p.UserMessage(text="hi", client_id="c1")
    assert p.decode_client_frame('{"type":"hello","last_seq":3,"stream":"s"}') == p.Hello(last_seq=3, stream="s")
    assert isinstance(p.decode_client_frame('{"type":"interrupt"}'), p.Interrupt)
    assert isinstance(p.decode_client_frame('{"type":"new_session"}'), p.NewSession)
    assert p.decode_client_frame('{"type":"ping","nonce":"n"}') == p.Ping(nonce="n")


SERVER_FRAMES = [
    p.Ready(protocol=1, server_version="1", stream="s", session_id="x", last_seq=3, agent="running", turn_id="t",
            cards=[p.Card(id="a", title="A", body="", kind="note", created_at=1.0, updated_at=2.0)], turn_text="hi"),
    p.SessionStarted(session_id="x"), p.SessionEnded(session_id="x", reason="idle"),
    p.TurnStarted(turn_id="t", text="hi"), p.TextDelta(turn_id="t", text="h"),
    p.AssistantMessage(turn_id="t", text="hello"), p.ToolUse(turn_id="t", tool_use_id="u", name="Read", summary="s"),
    p.ToolResult(turn_id="t", tool_use_id="u", is_error=False, summary="ok"),
    p.Recall(turn_id="t", tokens=30, memories=[
        p.RecalledMemory(kind="episode", id=7, type="EPISODE", at=1.0, session_id="s", turn=2, observation_id=7,
                         snippet="Lotus Garden", score=0.18),
        p.RecalledMemory(kind="learning", id=3, type="FACT", at=2.0, session_id="s", turn=None, observation_id=None,
                         snippet="Likes Thai food", score=0.09)]),
    p.CardCreated(card=p.Card(id="a", title="A", body="b", kind="task", created_at=1.0, updated_at=1.0)),
    p.CardUpdated(card=p.Card(id="a", title="A2", body="b", kind="task", created_at=1.0, updated_at=2.0)),
    p.CardClosed(card_id="a"),
    p.TurnComplete(turn_id="t", status="completed", duration_ms=5, usage=p.Usage(input_tokens=3), cost_usd=0.1,
                   session_cost_usd=0.3),
    p.ModelRetry(turn_id="t", attempt=1, max_retries=10, retry_delay_ms=560, error_status=529, error="overloaded"),
    p.Error(code="invalid_json", message="m"), p.Pong(nonce="n"),
    p.Error(code="not_found", message="m", request_id="r1"),
    p.Error(code="model_unavailable", message="The model proxy can't be reached.", turn_id="t", detail="HTTP 502"),
    *MEMORY_REPLIES,
    *SESSION_REPLIES,  # type: ignore[list-item]
    *FILES_REPLIES,  # type: ignore[list-item]
    CardCloseResult(request_id="r", card_id="a"),
]


@pytest.mark.parametrize("frame", SERVER_FRAMES, ids=lambda f: type(f).__name__)
def test_server_frames_round_trip_with_seq(frame: p.ServerFrame) -> None:
    numbered = p.with_seq(frame, 42)
    decoded = p.decode_server_frame(p.encode(numbered))
    assert decoded == numbered
    assert decoded.seq == 42
    assert b'"type":' in p.encode(frame)


def test_every_server_frame_type_is_covered_here() -> None:
    assert {type(f) for f in SERVER_FRAMES} == set(p.AnyServerFrame.__args__)


@pytest.mark.parametrize(("raw", "ids"), [
    ('{"type":"user_message","text":7,"client_id":"web-5"}', (None, "web-5")),
    ('{"type":"memory_files","request_id":"r9","client_id":"web-5"}', ("r9", None)),  # a client_id names a message
    ('{"type":"user_message","client_id":"' + "x" * (p.MAX_ID + 1) + '"}', (None, None)),  # too long to echo
    ('{"type":"user_message","client_id":7}', (None, None)),
    ("{not json", (None, None)),
    ("[1, 2]", (None, None)),
])
def test_a_refused_frames_ids_are_read_in_one_decode(raw: str, ids: tuple[str | None, str | None]) -> None:
    found = p.ids_of(raw)
    assert (found.request_id, found.client_id) == ids
