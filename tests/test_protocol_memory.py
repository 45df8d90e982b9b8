"""The memory frames: requests decode (and are validated) with the rest of the protocol, and
every answer round-trips with its seq (test_protocol runs MEMORY_REPLIES with its own)."""

import msgspec
import pytest

from sprite_os import protocol as p
from sprite_os.console import memory_frames as pm

INFO = pm.FileInfo(name="user.md", owner="daemon", editable=True, lines=3, max_lines=200, bytes=40,
                   max_bytes=24000, versions=2, sha256="a" * 64)
VERSION = pm.VersionInfo(number=2, created_at=1.0, source="person-edit", lines=3)
REF = pm.TurnRef(observation_id=7, session_id="s1", sequence_num=3, timestamp=1.0)
HIT = pm.LearningHit(kind="learning", id=1, type="FACT", content="c", created_at=1.0, confidence=0.8, score=1.5,
                     session_id="s1", turn=REF, forgotten_at=None)
SPEND = pm.Spend(batches=1, failed_batches=0, input_tokens=10, output_tokens=5, cost_usd=0.01)

MEMORY_REPLIES: list[pm.MemoryReply] = [
    pm.MemoryFilesResult(request_id="r", files=[INFO]),
    pm.MemoryFileResult(request_id="r", file=INFO, text="# User\n", history=[VERSION]),
    pm.MemoryVersionResult(request_id="r", name="user.md", version=VERSION, text="x\n", previous=1, diff="-a\n+x"),
    pm.MemoryEditResult(request_id="r", file=INFO, version=VERSION),
    pm.MemoryRollbackResult(request_id="r", file=INFO, version=VERSION),
    pm.MemorySearchResult(request_id="r", hits=[HIT]),
    pm.MemoryTurnResult(request_id="r", turn=pm.TurnRecord(
        observation_id=7, session_id="s1", sequence_num=3, timestamp=1.0, user_message="hi", agent_response="yo",
        tool_calls=[pm.ToolCall(name="Bash", input="ls", output="a", is_error=False)], processed="processed")),
    pm.MemoryForgetResult(request_id="r", learning=msgspec.structs.replace(HIT, forgotten_at=2.0)),
    pm.MemoryUnforgetResult(request_id="r", learning=HIT),
    pm.MemoryAuditResult(request_id="r", entries=[pm.AuditEntry(id=1, at=2.0, action="forget", learning_id=1,
                                                               file=None, detail="FACT: c")]),
    pm.MemoryHealthResult(request_id="r", health=pm.MemoryHealth(
        running=False, failing=False, consecutive_failures=0, last_error=None, next_retry_at=None,
        last_success_at=1.0, last_batch=pm.BatchInfo(id=1, created_at=1.0, trigger="t", status="done", turns=2,
                                                     learnings_added=1, cost_usd=0.01, error=None),
        today=SPEND, total=SPEND, observations={"pending": 0, "processed": 2, "stale": 0, "total": 2},
        learnings=1, forgotten=0, pending_actions=0)),
    pm.MemoryBootPromptResult(request_id="r", text="You are", chars=7, tokens_estimate=2, estimate="chars / 4"),
]


def test_every_memory_reply_is_covered_and_named_after_its_request() -> None:
    assert {type(f) for f in MEMORY_REPLIES} == set(pm.AnyMemoryReply.__args__)
    requests = {r.__struct_config__.tag for r in pm.AnyMemoryRequest.__args__}
    assert {f.__struct_config__.tag for f in MEMORY_REPLIES} == {f"{r}_result" for r in requests}


@pytest.mark.parametrize(("raw", "expected"), [
    ('{"type":"memory_files","request_id":"r1"}', pm.MemoryFilesRequest(request_id="r1")),
    ('{"type":"memory_version","request_id":"r","name":"user.md","number":3}',
     pm.MemoryVersionRequest(request_id="r", name="user.md", number=3)),
    ('{"type":"memory_search","request_id":"r","query":"tea","types":["FACT"],"later":1}',
     pm.MemorySearchRequest(request_id="r", query="tea", types=["FACT"])),
    ('{"type":"memory_forget","request_id":"r","learning_id":4}', pm.MemoryForgetRequest(request_id="r", learning_id=4)),
])
def test_memory_requests_decode_with_the_client_frames(raw: str, expected: pm.MemoryRequest) -> None:
    assert p.decode_client_frame(raw) == expected


@pytest.mark.parametrize(("raw", "request_id"), [
    ('{"type":"memory_file","request_id":"r9"}', "r9"),  # no name
    ('{"type":"memory_version","request_id":"r9","name":"user.md","number":0}', "r9"),  # versions start at 1
    ('{"type":"memory_search","request_id":"r9","types":["GOSSIP"]}', "r9"),
    ('{"type":"memory_search","request_id":"r9","limit":51}', "r9"),
    ('{"type":"memory_edit","request_id":"r9","name":"user.md","text":"x","base_sha256":"nope"}', "r9"),
    ('{"type":"memory_files"}', None),  # no request_id at all
    ('{"type":"memory_files","request_id":""}', ""),  # present, but empty: invalid, still echoed
    ('{"type":"memory_files","request_id":7}', None),  # not a string: not echoed
])
def test_a_bad_request_is_invalid_and_its_request_id_is_still_read(raw: str, request_id: str | None) -> None:
    with pytest.raises(p.FrameError) as info:
        p.decode_client_frame(raw)
    assert info.value.code == "invalid_frame"
    assert p.ids_of(raw).request_id == request_id
