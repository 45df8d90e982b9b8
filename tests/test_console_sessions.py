"""Past sessions and a session's turns, answered from what Sprite OS recorded (no server, no
browser): newest first, paged back, each session's first line, summary and cost, the current
session's turns still on their way to transcript.db, and bad requests."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import pytest

from sprite_os import protocol as p
from sprite_os.console import session_frames as ps
from sprite_os.console import session_queries
from sprite_os.console.requests import ConsoleApi, RequestFailed
from sprite_os.console.sessions_api import SessionsConsole
from sprite_os.memory import system as system_mod
from sprite_os.memory.capture.spill import ObservationWrite
from sprite_os.memory.memory_store import NewLearning
from sprite_os.memory.system import MemorySystem
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from tests.conftest import wait_for
from tests.test_console_api import system

__all__ = ["system"]  # the fixture: a MemorySystem on a fresh workspace

NOW = 1_800_000_000.0


def turn(session: str, n: int, text: str, **fields: object) -> NewObservation:
    return NewObservation(timestamp=NOW + n, session_id=session, sequence_num=n, user_message=text,
                          agent_response=f"answer to {text}", tool_calls_json=json.dumps(
                              [{"name": "Read", "input": {"file_path": "x" * 1000}, "output": "y", "is_error": False}]),
                          **fields)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def waiting_to_be_saved(system: MemorySystem, obs: NewObservation,
                              monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    """`obs` waits in capture's queue, as while another process holds transcript.db locked: its append
    fails until the block ends, then it lands (capture runs for the block; the system is not started)."""
    real = TranscriptDB.append

    def append(self: TranscriptDB, o: NewObservation) -> int | None:
        if (o.session_id, o.sequence_num) == (obs.session_id, obs.sequence_num):
            raise sqlite3.OperationalError("database is locked")
        return real(self, o)

    monkeypatch.setattr(TranscriptDB, "append", append)
    await system.writer.start()
    try:
        system.writer.submit(ObservationWrite(obs))
        await wait_for(lambda: system.writer.failing, what="the write failing")
        yield
    finally:
        monkeypatch.setattr(TranscriptDB, "append", real)
        assert await system.capture.stop(30)  # lands it, and ends capture's files thread


class FakeAgent:
    """The runtime's `holding_turns`, as the console sees it: what happened, in order."""

    def __init__(self, running: str | None = None) -> None:
        self.running = running  # the wire id of the turn running now
        self.events: list[Any] = []

    @contextlib.asynccontextmanager
    async def holding_turns(self) -> AsyncIterator[FakeAgent.Hold]:
        self.events.append("held")
        try:
            yield FakeAgent.Hold(self, self.running)
        finally:
            self.events.append("released")

    class Hold:
        def __init__(self, agent: FakeAgent, running: str | None) -> None:
            self.agent, self.running = agent, running

        def restart(self, session_id: str) -> bool:
            self.agent.events.append(("restart", session_id))
            return True


async def seed(system: MemorySystem) -> None:
    def write(t: TranscriptDB) -> None:
        t.start_session("s1", NOW)
        t.append(turn("s1", 1, "\n  Plan my week\nand more", turn_id="a1", status="completed", cost_usd=0.0002))
        t.append(turn("s1", 2, "Thanks", turn_id="a2", status="completed", cost_usd=0.0003))
        t.end_session("s1", NOW + 10)
        t.start_session("s2", NOW + 100)
        t.start_session("empty", NOW + 150)  # never had a turn: not listed
        for n in range(1, 6):
            t.append(turn("s3", n, f"message {n}", turn_id=f"c{n}", status="completed", cost_usd=0.0001,
                          client_id=f"web-{n}" if n > 1 else None))
        t.conn.execute("UPDATE sessions SET started_at = ? WHERE id = 's3'", (NOW + 200,))

    await system.transcript.call(write)
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=[1, 2], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[NewLearning("SUMMARY", "Planned the week; the bank call is still open.", "s1", 2)],
        file_updates={}, base_hashes={}))


async def test_sessions_newest_first_with_first_line_summary_cost_and_paging(system: MemorySystem) -> None:
    await seed(system)
    api = SessionsConsole(system, lambda: "s3")
    first = await api.handlers[ps.SessionsRequest](ps.SessionsRequest(request_id="r", limit=1))
    assert [s.id for s in first.sessions] == ["s3"] and first.more
    assert first.sessions[0].current and first.sessions[0].turns == 5
    rest = await api.handlers[ps.SessionsRequest](ps.SessionsRequest(request_id="r", before="s3"))
    assert [s.id for s in rest.sessions] == ["s1"] and not rest.more  # s2 and "empty" had no turn
    [s1] = rest.sessions
    assert (s1.first_line, s1.summary, s1.cost_usd, s1.current, s1.turns) == (
        "Plan my week", "Planned the week; the bank call is still open.", 0.0005, False, 2)
    assert s1.ended_at == NOW + 10


async def test_a_sessions_turns_page_back_oldest_first_within_each_page(system: MemorySystem) -> None:
    await seed(system)
    api = SessionsConsole(system, lambda: "s3")
    newest = await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", limit=2))
    assert newest.session.id == "s3" and [t.turn for t in newest.turns] == [4, 5] and newest.more
    older = await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", before=4, limit=10))
    assert [t.turn for t in older.turns] == [1, 2, 3] and not older.more
    t = older.turns[0]
    assert (t.turn_id, t.client_id, t.user_message, t.agent_response, t.status, t.cost_usd) == (
        "c1", None, "message 1", "answer to message 1", "completed", 0.0001)
    assert [x.client_id for x in older.turns[1:] + newest.turns] == ["web-2", "web-3", "web-4", "web-5"]
    assert t.observation_id is not None and len(t.tool_calls[0].input) == 300  # cut as a live turn shows it
    past = await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", session_id="s1"))
    assert [x.user_message for x in past.turns] == ["\n  Plan my week\nand more", "Thanks"]
    assert not past.session.current and past.session.summary is not None


async def test_the_current_sessions_newest_turns_come_before_they_are_written(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    await seed(system)
    on_the_way = turn("s3", 6, "just now", turn_id="c6", status="completed", client_id="web-6")
    async with waiting_to_be_saved(system, on_the_way, monkeypatch):
        api = SessionsConsole(system, lambda: "s3")
        page = await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", limit=2))
    assert [(t.turn, t.observation_id, t.client_id) for t in page.turns][-1] == (6, None, "web-6")
    assert page.session.turns == 6


async def test_a_huge_page_stops_short_and_an_unknown_session_is_not_found(system: MemorySystem,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    await seed(system)
    monkeypatch.setattr(session_queries, "PAGE_CHARS", 1_000)  # about three turns
    api = SessionsConsole(system, lambda: "s3")
    page = await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", limit=5))
    assert 1 <= len(page.turns) < 5 and page.more and page.turns[-1].turn == 5
    with pytest.raises(RequestFailed) as failed:
        await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", session_id="nope"))
    assert failed.value.code == "not_found"


async def test_without_memory_sessions_are_unavailable_and_bad_requests_are_refused() -> None:
    with pytest.raises(RequestFailed) as failed:
        await ConsoleApi().handle(ps.SessionsRequest(request_id="r"))
    assert failed.value.code == "memory_unavailable"
    for bad in ('{"type": "sessions", "request_id": "r", "limit": 0}',
                '{"type": "session_turns", "request_id": "r", "before": 0}',
                '{"type": "session_turns", "request_id": "r", "session_id": ""}'):
        with pytest.raises(p.FrameError) as refused:
            p.decode_client_frame(bad)
        assert refused.value.code == "invalid_frame"


INFO = ps.SessionInfo(id="s1", started_at=1.0, ended_at=None, turns=2, first_line="Plan my week", summary=None,
                      cost_usd=0.0005, current=True, forgotten=0)
SESSION_REPLIES: list[object] = [  # test_protocol round-trips each
    ps.SessionsResult(request_id="r", sessions=[INFO], more=False),
    ps.SessionTurnsResult(request_id="r", session=INFO, more=True, turns=[ps.PastTurn(
        observation_id=3, turn_id="t", client_id="web-1", turn=1, at=2.0, user_message="hi", agent_response="hello", tool_calls=[],
        status="completed", cost_usd=0.0001)]),
    ps.ForgetTurnsResult(request_id="r", forgotten=2, learnings=1, sessions=["s1"], restarted=False),
    p.TurnsForgotten(session_id="s1", turns=[2, 3], turn_ids=["t2"], forgotten_at=3.0),
]


async def test_forgetting_turns_by_wire_id_or_a_whole_session_leaves_tombstones_for_every_client(
        system: MemorySystem) -> None:
    await seed(system)
    published: list[p.ServerFrame] = []
    agent = FakeAgent()
    api = SessionsConsole(system, lambda: "s3", published.append, agent.holding_turns)
    forget = api.handlers[ps.ForgetTurnsRequest]
    done = await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=["c2"]))
    assert (done.forgotten, done.sessions, done.restarted) == (1, ["s3"], True)  # type: ignore[attr-defined]
    # The agent's context lets go of it: a new session, asked for while turns are held (it comes first).
    assert agent.events == ["held", ("restart", "s3"), "released"]
    [event] = published
    assert isinstance(event, p.TurnsForgotten) and (event.session_id, event.turns, event.turn_ids) == ("s3", [2], ["c2"])
    page = await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r", limit=10))
    two = page.turns[1]
    assert (two.turn, two.user_message, two.agent_response, two.tool_calls) == (2, "", "", [])
    assert two.forgotten_at is not None and page.session.forgotten == 1
    whole = await forget(ps.ForgetTurnsRequest(request_id="f", session_id="s1"))
    assert (whole.forgotten, whole.restarted) == (2, False)  # type: ignore[attr-defined]
    listed = await api.handlers[ps.SessionsRequest](ps.SessionsRequest(request_id="r"))
    s1 = next(s for s in listed.sessions if s.id == "s1")
    assert (s1.first_line, s1.summary, s1.forgotten) == ("", None, 2)  # its summary went with it
    with pytest.raises(RequestFailed) as nothing:
        await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=["c2"]))  # already forgotten
    assert nothing.value.code == "not_found"
    with pytest.raises(RequestFailed):
        await forget(ps.ForgetTurnsRequest(request_id="f"))


async def test_forgetting_an_earlier_turn_of_the_session_a_turn_is_running_in_is_busy(system: MemorySystem) -> None:
    """The running turn has the earlier turn in its context: its answer, recorded and kept, could quote
    what is being forgotten."""
    await seed(system)
    s3 = await system.transcript.call(lambda t: t.ids_of(session_id="s3"))
    await busy_while_c9_runs(system, [ps.ForgetTurnsRequest(request_id="f", turn_ids=["c2"]),
                                      ps.ForgetTurnsRequest(request_id="f", observation_ids=[s3[0]])],
                             meanwhile="a1", after="c2")


async def busy_while_c9_runs(system: MemorySystem, refused: list[ps.ForgetTurnsRequest], meanwhile: str,
                             after: str) -> None:
    """While turn c9 runs in session s3, each of `refused` is busy and turn `meanwhile` is forgotten;
    once c9 ends, turn `after` is."""
    agent = FakeAgent(running="c9")
    forget = SessionsConsole(system, lambda: "s3", holding_turns=agent.holding_turns).handlers[ps.ForgetTurnsRequest]
    for req in refused:
        with pytest.raises(RequestFailed) as busy:
            await forget(req)
        assert busy.value.code == "busy"
    assert (await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=[meanwhile]))).forgotten == 1  # type: ignore[attr-defined]
    agent.running = None
    assert (await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=[after]))).forgotten == 1  # type: ignore[attr-defined]


async def test_forgetting_a_past_turn_auto_recall_brought_the_running_session_is_busy(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto-recall put a past session's turn into the current session: the turn running now has it in its
    context, and its answer (recorded, and kept) could quote it."""
    from types import SimpleNamespace

    await seed(system)
    a1 = (await system.transcript.call(lambda t: t.ids_of(session_id="s1")))[0]

    async def recalling(message: str, session_id: str, turn_id: str) -> Any:
        return SimpleNamespace(memories=[SimpleNamespace(observation_id=a1)])

    monkeypatch.setattr(system.recall, "auto_recall", recalling)
    await system.recall_for("What was my plan?", "s3", "c9")
    await busy_while_c9_runs(system, [ps.ForgetTurnsRequest(request_id="f", turn_ids=["a1"]),
                                      ps.ForgetTurnsRequest(request_id="f", observation_ids=[a1]),
                                      ps.ForgetTurnsRequest(request_id="f", session_id="s1")],
                             meanwhile="a2", after="a1")


async def test_the_busy_check_and_the_forget_run_while_turns_are_held(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """No turn may start between the busy check (which reads the transcript, on its thread) and the
    forget: it would run with the forgotten turn in its context, or search for it."""
    await seed(system)
    agent = FakeAgent(running="c9")
    sessions_of, forget_turns = session_queries.sessions_of, system.forget_turns

    def checked(*args: Any) -> set[str]:
        agent.events.append("busy_check")
        return sessions_of(*args)

    async def forgetting(*args: Any, **kwargs: Any) -> Any:
        agent.events.append("forget")
        return await forget_turns(*args, **kwargs)

    monkeypatch.setattr(session_queries, "sessions_of", checked)
    monkeypatch.setattr(system, "forget_turns", forgetting)
    api = SessionsConsole(system, lambda: "s3", holding_turns=agent.holding_turns)
    forget = api.handlers[ps.ForgetTurnsRequest]
    assert (await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=["a1"]))).forgotten == 1  # type: ignore[attr-defined]
    assert agent.events == ["held", "busy_check", "forget", "released"]
    agent.events.clear()
    with pytest.raises(RequestFailed):
        await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=["c2"]))  # busy: the hold lets go
    assert agent.events == ["held", "busy_check", "released"]


async def test_forgetting_a_session_with_a_turn_running_is_busy_and_an_unknown_session_is_not_found(
        system: MemorySystem) -> None:
    """A running turn is recorded, words and all, when it ends: forgetting its session now would miss it."""
    await seed(system)
    agent = FakeAgent(running="c9")
    api = SessionsConsole(system, lambda: "s3", holding_turns=agent.holding_turns)
    forget = api.handlers[ps.ForgetTurnsRequest]
    for req in (ps.ForgetTurnsRequest(request_id="f", session_id="s3"),
                ps.ForgetTurnsRequest(request_id="f", turn_ids=["c9"])):
        with pytest.raises(RequestFailed) as busy:
            await forget(req)
        assert busy.value.code == "busy" and "interrupt it or wait" in str(busy.value)
    assert len((await api.handlers[ps.SessionTurnsRequest](ps.SessionTurnsRequest(request_id="r"))).turns) == 5
    past = await forget(ps.ForgetTurnsRequest(request_id="f", session_id="s1"))  # another session: fine
    assert past.forgotten == 2  # type: ignore[attr-defined]
    with pytest.raises(RequestFailed) as unknown:
        await forget(ps.ForgetTurnsRequest(request_id="f", session_id="never"))
    assert unknown.value.code == "not_found"
    again = await forget(ps.ForgetTurnsRequest(request_id="f", session_id="s1"))  # forgotten already: known
    assert again.forgotten == 0  # type: ignore[attr-defined]
    agent.running = None
    assert (await forget(ps.ForgetTurnsRequest(request_id="f", session_id="s3"))).forgotten == 5  # type: ignore[attr-defined]


async def test_forgetting_a_session_whose_turn_still_waits_to_be_saved_is_busy(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:
    """transcript.db locked past the forget's wait: the turn still queued would land after an acknowledged
    forget, words and all. The person is told to try again, and nothing is forgotten meanwhile."""
    await seed(system)
    monkeypatch.setattr(system_mod, "FORGET_DRAIN_BUDGET", 0.1)
    late = turn("s1", 3, "one more thing", turn_id="a3", status="completed")
    forget = SessionsConsole(system, lambda: "s3", holding_turns=FakeAgent().holding_turns).handlers[ps.ForgetTurnsRequest]
    async with waiting_to_be_saved(system, late, monkeypatch):
        for req in (ps.ForgetTurnsRequest(request_id="f", session_id="s1"),
                    ps.ForgetTurnsRequest(request_id="f", turn_ids=["a3"])):
            with pytest.raises(RequestFailed) as busy:
                await forget(req)
            assert busy.value.code == "busy" and "still being saved" in busy.value.message
        # A turn of another session waiting holds up no forget.
        assert (await forget(ps.ForgetTurnsRequest(request_id="f", turn_ids=["c1"]))).forgotten == 1  # type: ignore[attr-defined]
    assert (await forget(ps.ForgetTurnsRequest(request_id="f", session_id="s1"))).forgotten == 3  # type: ignore[attr-defined]
