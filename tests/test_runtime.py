"""The runtime's turn and session rules, with the SDK client faked at its boundary.

The end-to-end tests drive the real CLI; these cover what the real CLI can't be
made to do on cue: exit cleanly in the middle of a turn, or die unseen between turns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from claude_agent_sdk import (
    AssistantMessage,
    CLIConnectionError,
    ProcessError,
    ResultMessage,
    TextBlock,
)

from sprite_os import protocol as p
from sprite_os import runtime as runtime_mod
from sprite_os.agent.state import TurnPhase
from sprite_os.backoff import Backoff
from sprite_os.errors import AlreadyTaken, QueueFull, ShuttingDown
from sprite_os.protocol import MAX_QUEUED_MESSAGES
from sprite_os.runtime import AgentRuntime
from sprite_os.tools.canvas import CanvasStore
from tests.conftest import make_settings, wait_for

_pids = itertools.count(1000)


def answer(text: str = "ok") -> list[Any]:
    return [AssistantMessage(content=[TextBlock(text=text)], model="m"),
            ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=1,
                          session_id="x", usage={"input_tokens": 3, "output_tokens": 2})]


class FakeCLI:
    """ClaudeSDKClient's surface as the runtime uses it, with a process that can die."""

    def __init__(self, harness: Harness) -> None:
        self.h = harness
        self._transport = SimpleNamespace(_process=SimpleNamespace(pid=next(_pids), returncode=None))
        self.queries: list[str] = []
        self.order: list[str] = []  # "query" and "interrupt", as the CLI received them
        self.interrupted = asyncio.Event()
        self.refuse_writes = False  # a CLI that is dead before its exit is noticed
        self.crash_after = -1  # exit with -9 after this many messages of a reply (-1: never)
        self.exit_silently = False  # the reply stream ends at once, with no result (an exit with status 0)

    def die(self) -> None:
        self._transport._process.returncode = -9

    async def connect(self) -> None:
        pass

    async def query(self, text: str) -> None:
        if self.refuse_writes or self._transport._process.returncode is not None:
            raise CLIConnectionError("Cannot write to terminated process")
        if self.h.write_gate is not None:  # a slow pipe: the write is still under way
            await self.h.write_gate.wait()
        self.queries.append(text)
        self.order.append("query")

    async def receive_response(self) -> AsyncIterator[Any]:
        if self.h.hold:  # a long turn: it runs until it is interrupted, and is cut short, as the CLI says
            await self.interrupted.wait()
        if self.exit_silently:
            return
        for n, message in enumerate(self.h.reply):
            if n == self.crash_after:
                raise ProcessError("Command failed with exit code -9", exit_code=-9)
            if self.h.hold and isinstance(message, ResultMessage) and message.subtype == "success":
                message = dataclasses.replace(message, subtype="error_during_execution", is_error=True)
            yield message

    async def interrupt(self) -> None:
        self.order.append("interrupt")
        self.interrupted.set()

    async def disconnect(self) -> None:
        if self.h.disconnect_gate is not None:  # a slow exit
            await self.h.disconnect_gate.wait()


class FakeRecord:
    def __init__(self, memory: FakeMemory, prompt: str, client_id: str | None = None) -> None:
        self.memory, self.prompt, self.client_id = memory, prompt, client_id
        self.seen: list[str] = []
        self.stopped_by: str | None = None

    def observe(self, message: Any) -> None:
        self.seen.append(type(message).__name__)

    def interrupted(self, by_server: bool = False) -> None:
        self.stopped_by = self.stopped_by or ("server" if by_server else "person")

    def close(self, result: ResultMessage | None, error: str | None = None, cost_usd: float | None = None) -> None:
        how = result.subtype if result else f"failed: {error}"
        self.memory.events.append(("closed", self.prompt, f"{how}, by the server's stop"
                                   if self.stopped_by == "server" else how))

    async def durable(self) -> bool:
        if self.memory.saving is not None:
            await self.memory.saving.wait()
        self.memory.durable.append(self.prompt)
        return self.memory.saves


class FakeMemory:
    """The memory system as the runtime sees it: what it was told, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.records: list[FakeRecord] = []
        self.booting: asyncio.Event | None = None  # when set, a CLI's boot prompt waits for it
        self.saving: asyncio.Event | None = None  # when set, a closed turn is durable once it is set
        self.saves = True  # what durable() says: False when the disk can't take the turn
        self.durable: list[str] = []  # the turns whose durability the runtime waited for
        self.boots: list[bool] = []  # each boot prompt asked for: whether it waited for memory to settle
        self.turns_ended = 0  # the ends of turns the runtime reported (the embedder waits for them)
        self.arrived: list[tuple[str, str]] = []  # messages told as they arrived (recall's embedding begins)
        self.taken: list[Any] = []  # the messages the record holds a turn of, newest first (turn_clients)

    def hooks(self) -> dict[Any, Any]:
        return {}

    async def boot_prompt(self, settle: bool = True) -> str:
        self.boots.append(settle)
        if self.booting is not None and settle:  # the last session's batch, still being curated
            await self.booting.wait()
        return "boot"

    def session_started(self, session_id: str) -> None:
        self.events.append(("session_started", session_id))

    def session_ended(self, session_id: str, reason: str) -> None:
        self.events.append(("session_ended", session_id, reason))

    def turn_started(self, prompt: str, turn_id: str, client_id: str | None) -> FakeRecord:
        self.records.append(FakeRecord(self, prompt, client_id))
        return self.records[-1]

    def turn_ended(self) -> None:
        self.turns_ended += 1

    def message_arrived(self, message: str, session_id: str) -> None:
        self.arrived.append((message, session_id))

    async def recall_for(self, message: str, session_id: str, turn_id: str) -> None:
        return None

    async def taken_messages(self, limit: int) -> list[Any]:
        return self.taken[:limit]

    def closed(self) -> list[tuple[str, ...]]:
        return [e for e in self.events if e[0] == "closed"]


class Harness:
    def __init__(self, tmp_path: Path, memory: FakeMemory | None = None,
                 prepare_model: Callable[[], Awaitable[None]] | None = None) -> None:
        self.frames: list[p.ServerFrame] = []
        self.clis: list[FakeCLI] = []
        self.reply: list[Any] = answer()
        self.hold = False  # replies wait for an interrupt
        self.write_gate: asyncio.Event | None = None  # when set, a prompt's write waits for it
        self.disconnect_gate: asyncio.Event | None = None  # when set, a CLI's disconnect waits for it
        settings = make_settings(tmp_path / "workspace", "http://127.0.0.1:9")
        settings.layout.ensure()
        canvas = CanvasStore(settings.layout.canvas_file, self.frames.append)
        self.memory = memory
        self.rt = AgentRuntime(settings, publish=self.frames.append, canvas_store=canvas, memory=memory,
                               model_env=dict, client_factory=self._new_cli, prepare_model=prepare_model)

    def _new_cli(self, _options: Any) -> Any:
        self.clis.append(FakeCLI(self))
        return self.clis[-1]

    def of(self, kind: type) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)]

    def kinds(self) -> list[str]:
        return [type(f).__name__ for f in self.frames]

    async def until(self, pred: Callable[[], bool]) -> None:
        await wait_for(pred, timeout=5, interval=0.005)

    async def turn(self, text: str, client_id: str | None = None) -> p.TurnComplete:
        done = len(self.of(p.TurnComplete))
        self.rt.submit(text, client_id)
        await self.until(lambda: len(self.of(p.TurnComplete)) > done)
        return self.of(p.TurnComplete)[-1]


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path)
    await harness.rt.start()
    yield harness
    await harness.rt.shutdown(5)


@pytest.fixture
async def hm(tmp_path: Path) -> AsyncIterator[Harness]:
    """A harness whose runtime has a (fake) memory system."""
    harness = Harness(tmp_path, FakeMemory())
    await harness.rt.start()
    yield harness
    await harness.rt.shutdown(5)


async def test_the_model_is_prepared_before_each_cli_starts(tmp_path: Path) -> None:
    """The relay's client towards the proxy is made (in a thread) before the CLI that will call it starts."""
    clis_when_prepared: list[int] = []

    async def prepare() -> None:
        clis_when_prepared.append(len(harness.clis))

    harness = Harness(tmp_path, prepare_model=prepare)
    await harness.rt.start()
    try:
        await harness.turn("hello")
        assert clis_when_prepared == [0]
    finally:
        await harness.rt.shutdown(5)


async def test_a_turn_whose_stream_ends_without_a_result_fails_and_the_next_starts_fresh(h: Harness) -> None:
    h.reply = answer("half an answer")[:1]  # the CLI exited 0 after this, before any result
    failed = await h.turn("hi")
    assert failed.status == "error"
    assert [e.code for e in h.of(p.Error)] == ["agent_failed"], h.frames
    await h.until(lambda: h.of(p.SessionEnded))  # published once the dead CLI is closed, after the turn's end
    assert h.of(p.SessionEnded)[-1].reason == "crash"
    h.reply = answer()
    assert (await h.turn("again")).status == "completed" and len(h.clis) == 2


async def test_a_cli_that_died_between_turns_is_replaced_before_the_next_turn(h: Harness) -> None:
    assert (await h.turn("one")).status == "completed"
    h.clis[0].die()
    assert not h.rt.cli_running
    first_session = h.rt.session_id
    done = await h.turn("two")
    assert done.status == "completed" and len(h.clis) == 2 and h.clis[1].queries == ["two"]
    [error] = h.of(p.Error)
    assert error.code == "agent_failed"
    [ended] = h.of(p.SessionEnded)
    assert ended.session_id == first_session and ended.reason == "crash"
    # Clients see the crash and the new session before the turn that runs in it.
    tail = h.kinds()[h.frames.index(error):]
    assert tail[:4] == ["Error", "SessionEnded", "SessionStarted", "TurnStarted"]


async def test_a_cli_found_dead_only_when_written_to_gets_the_prompt_resent_once(h: Harness) -> None:
    assert (await h.turn("one")).status == "completed"
    h.clis[0].refuse_writes = True  # dead, but its exit not yet reaped
    done = await h.turn("two")
    assert done.status == "completed" and h.clis[1].queries == ["two"]
    assert [e.code for e in h.of(p.Error)] == ["agent_failed"], h.frames
    assert [s.reason for s in h.of(p.SessionEnded)] == ["crash"]


async def test_a_cli_that_swallows_the_prompt_as_it_dies_gets_it_resent_once(h: Harness) -> None:
    assert (await h.turn("one")).status == "completed"
    h.clis[0].crash_after = 0  # the write went into a dying pipe; the exit shows up while reading
    done = await h.turn("two")
    assert done.status == "completed" and h.clis[1].queries == ["two"]
    assert [s.reason for s in h.of(p.SessionEnded)] == ["crash"]
    h.rt.new_session()  # the resent turn counts as the new session's turn
    await h.until(lambda: len(h.of(p.SessionEnded)) == 2)
    assert h.of(p.SessionEnded)[-1].reason == "new_session"


async def test_a_cli_that_exits_silently_under_the_prompt_gets_it_resent_once(h: Harness) -> None:
    assert (await h.turn("one")).status == "completed"
    h.clis[0].exit_silently = True  # status 0: no error, no result, nothing said
    done = await h.turn("two")
    assert done.status == "completed" and h.clis[1].queries == ["two"]
    assert [s.reason for s in h.of(p.SessionEnded)] == ["crash"]


async def test_an_interrupted_turn_is_not_resent_to_a_fresh_cli(h: Harness) -> None:
    assert (await h.turn("one")).status == "completed"
    h.hold = True
    h.clis[0].exit_silently = True
    h.rt.submit("two")
    await h.until(lambda: h.rt.state == "running")
    await h.rt.interrupt()
    await h.until(lambda: len(h.of(p.TurnComplete)) == 2)
    assert len(h.clis) == 1 and h.of(p.TurnComplete)[-1].status != "completed"


async def test_a_cli_that_dies_after_answering_in_part_fails_the_turn_without_resending(h: Harness) -> None:
    assert (await h.turn("one")).status == "completed"
    h.clis[0].crash_after = 1  # it said something: the turn was under way, and may have acted
    assert (await h.turn("two")).status == "error"
    assert len(h.clis) == 1 and h.clis[0].queries == ["one", "two"]
    assert [e.code for e in h.of(p.Error)] == ["agent_failed"], h.frames


async def test_an_interrupt_while_the_prompt_is_written_reaches_the_cli_after_it(h: Harness) -> None:
    h.hold, h.write_gate = True, asyncio.Event()
    h.rt.submit("long")
    await h.until(lambda: h.rt.state == "running")
    assert await h.rt.interrupt()
    assert h.clis[0].order == []  # sent now, it would reach the CLI before the prompt and stop nothing
    h.write_gate.set()
    await h.until(lambda: bool(h.of(p.TurnComplete)))
    assert h.clis[0].order == ["query", "interrupt"]
    assert h.of(p.TurnComplete)[-1].status == "interrupted"


async def test_a_second_stop_while_the_turn_is_stopping_is_no_error(h: Harness) -> None:
    """The gateway answers an interrupt the runtime refuses with `nothing_to_interrupt` ("the agent
    is not running a turn"): untrue while the turn is stopping, so a second press is accepted."""
    h.hold = True
    h.rt.submit("long")
    await h.until(lambda: h.rt.state == "running" and bool(h.clis) and bool(h.clis[0].queries))
    cli = h.clis[0]

    async def heard_not_yet_stopped() -> None:  # a CLI that takes its time to end its reply
        cli.order.append("interrupt")

    cli.interrupt = heard_not_yet_stopped  # type: ignore[method-assign]
    assert await h.rt.interrupt()
    assert h.rt.state == "stopping"
    assert await h.rt.interrupt()  # a second press: the turn is stopping, nothing more to do
    cli.interrupted.set()
    await h.until(lambda: bool(h.of(p.TurnComplete)))
    assert h.of(p.TurnComplete)[-1].status == "interrupted" and h.clis[0].order.count("interrupt") == 1
    assert not await h.rt.interrupt()  # idle again: now there is nothing to interrupt


async def test_new_session_on_a_fresh_session_changes_nothing(h: Harness) -> None:
    h.rt.new_session()
    await h.turn("hi")
    assert h.of(p.SessionEnded) == [] and len(h.of(p.SessionStarted)) == 1


async def test_repeated_new_sessions_queue_once_and_end_the_session_once(h: Harness) -> None:
    h.hold = True
    h.rt.submit("long")
    await h.until(lambda: h.rt.state == "running")
    for _ in range(50):
        h.rt.new_session()
    assert h.rt.queued == 1
    await h.rt.interrupt()
    h.hold = False
    await h.turn("after")
    assert [s.reason for s in h.of(p.SessionEnded)] == ["new_session"]


async def test_work_sent_during_shutdown_is_refused_not_lost(h: Harness) -> None:
    h.hold = True
    h.rt.submit("long")
    await h.until(lambda: h.rt.state == "running")
    stopping = asyncio.create_task(h.rt.shutdown(5))
    await asyncio.sleep(0)
    with pytest.raises(ShuttingDown):
        h.rt.submit("one more")
    with pytest.raises(ShuttingDown):
        h.rt.new_session()
    await stopping
    assert h.of(p.TurnComplete)[-1].status == "interrupted"
    assert h.of(p.SessionEnded)[-1].reason == "shutdown"
    assert len(h.of(p.TurnStarted)) == 1


# ---------------------------------------------------------------- what memory is told (capture)


async def test_each_turn_is_shown_to_memory_and_closed_once_with_its_result(hm: Harness) -> None:
    assert hm.memory is not None
    await hm.turn("one")
    await hm.turn("two")
    assert hm.memory.closed() == [("closed", "one", "success"), ("closed", "two", "success")]
    assert [r.seen for r in hm.memory.records] == [["AssistantMessage", "ResultMessage"]] * 2


async def test_memory_records_a_turn_with_the_client_id_its_message_came_with(hm: Harness) -> None:
    """The id the sender gave the message reaches the record, as it reached turn_started: a page that
    never heard the turn start finds its message in the record by it."""
    assert hm.memory is not None
    await hm.turn("one", client_id="web-1")
    await hm.turn("two")
    assert [(r.prompt, r.client_id) for r in hm.memory.records] == [("one", "web-1"), ("two", None)]
    assert [f.client_id for f in hm.of(p.TurnStarted)] == ["web-1", None]


async def test_a_failed_turn_is_closed_with_its_error_in_the_session_it_ran_in(hm: Harness) -> None:
    assert hm.memory is not None
    await hm.turn("one")
    hm.clis[0].crash_after = 1
    assert (await hm.turn("two")).status == "error"
    await hm.until(lambda: hm.memory is not None and hm.memory.events[-1][0] == "session_started")  # the crash's
    first = hm.memory.events[0][1]
    [one, two] = hm.memory.closed()
    assert one == ("closed", "one", "success") and two[2].startswith("failed: ProcessError(")
    after = hm.memory.events.index(two) + 1
    # The session ends once the dead CLI is closed, which may come after the turn's error frame.
    await hm.until(lambda: len(hm.memory.events) > after)
    assert hm.memory.events[after] == ("session_ended", first, "crash")
    assert hm.memory.records[-1].seen == ["AssistantMessage"]  # what the CLI said before it died


def prompts(hm: Harness) -> list[str]:
    return [f.text for f in hm.of(p.TurnStarted)]


async def test_a_turn_waits_for_a_forget_and_runs_in_the_new_session_it_asked_for(hm: Harness) -> None:
    """A forget of this session's turns: a message sent meanwhile stays queued until the words are out
    of the transcript and search, and runs in the new session the forget asked for (reason `forget`),
    never in the old one (whose context still holds what was forgotten). A person's new_session sent
    after the message still ends the session the message ran in: the two restarts are never merged."""
    assert hm.memory is not None
    await hm.turn("one")
    first = hm.rt.session_id
    async with hm.rt.holding_turns() as hold:
        hm.rt.submit("two")
        hm.rt.new_session()
        await asyncio.sleep(0.05)
        assert hm.rt.state == "idle" and hm.rt.queued == 2 and prompts(hm) == ["one"]  # it waits, queued
        assert hold.running is None and hold.restart(first)
    await hm.until(lambda: len(hm.of(p.SessionEnded)) == 2)
    events = hm.memory.events
    assert events.index(("session_ended", first, "forget")) < events.index(("closed", "two", "success"))
    second = hm.of(p.SessionStarted)[1].session_id
    assert events.index(("closed", "two", "success")) < events.index(("session_ended", second, "new_session"))
    assert [e.reason for e in hm.of(p.SessionEnded)] == ["forget", "new_session"] and hm.rt.queued == 0


async def test_a_persons_new_session_is_not_pulled_ahead_of_the_waiting_turn(hm: Harness) -> None:
    """A forget of another session holds the turns: "two", new_session, "three" then run in the order sent."""
    assert hm.memory is not None
    await hm.turn("one")
    first = hm.rt.session_id
    async with hm.rt.holding_turns():
        hm.rt.submit("two")
        hm.rt.new_session()
        hm.rt.submit("three")
        await asyncio.sleep(0.05)
        assert prompts(hm) == ["one"] and hm.rt.queued == 3
    await hm.until(lambda: len(hm.memory.closed()) == 3 if hm.memory else False)
    events = hm.memory.events
    ended = events.index(("session_ended", first, "new_session"))
    assert events.index(("closed", "two", "success")) < ended < events.index(("closed", "three", "success"))
    assert prompts(hm) == ["one", "two", "three"]


async def test_a_turn_waiting_at_the_gate_does_not_start_during_shutdown(hm: Harness) -> None:
    """A message held by a forget is still queued: a shutdown drops it (it never starts), and the hold
    ending during the shutdown starts nothing and connects no CLI."""
    assert hm.memory is not None
    await hm.turn("one")
    async with hm.rt.holding_turns():
        hm.rt.submit("two")
        await asyncio.sleep(0.05)
        assert hm.rt.queued == 1
        stopping = asyncio.create_task(hm.rt.shutdown(5))
        await hm.until(lambda: bool(hm.of(p.SessionEnded)))
    await stopping
    assert prompts(hm) == ["one"] and [r.prompt for r in hm.memory.records] == ["one"] and len(hm.clis) == 1
    assert [e.reason for e in hm.of(p.SessionEnded)] == ["shutdown"]


async def test_a_forget_begun_while_the_restarted_session_ends_still_holds_the_turn(hm: Harness) -> None:
    """The hold is looked at again after each step that awaits: a second forget that begins while the
    first one's restart is closing the CLI holds the message too."""
    assert hm.memory is not None
    await hm.turn("one")
    first = hm.rt.session_id
    hm.disconnect_gate = asyncio.Event()
    async with hm.rt.holding_turns() as hold:
        hm.rt.submit("two")
        hold.restart(first)
    await asyncio.sleep(0.05)  # the restart closes the CLI, slowly
    assert not hm.of(p.SessionEnded)
    async with hm.rt.holding_turns():
        hm.disconnect_gate.set()
        await hm.until(lambda: bool(hm.of(p.SessionStarted)[1:]))
        await asyncio.sleep(0.05)
        assert prompts(hm) == ["one"] and hm.rt.queued == 1
    await hm.until(lambda: prompts(hm) == ["one", "two"])


async def test_a_message_held_past_the_limit_runs_anyway(hm: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forget that never ends (a bug, a store stuck) does not silence the agent for good."""
    monkeypatch.setattr(runtime_mod, "TURN_HOLD_LIMIT", 0.1)
    async with hm.rt.holding_turns():
        assert (await hm.turn("one")).status == "completed"


async def test_memory_hears_of_a_message_as_it_arrives_before_its_turn_starts(hm: Harness) -> None:
    """Auto-recall's embedding of a message begins as it arrives (memory's `message_arrived`), so that
    it is made while the CLI boots or the turn starts, not after."""
    assert hm.memory is not None
    hm.memory.booting = asyncio.Event()  # the CLI's boot waits: the turn can't start yet
    hm.rt.submit("one")
    assert hm.memory.arrived == [("one", hm.rt.session_id)] and hm.memory.records == []
    hm.memory.booting.set()
    assert (await hm.turn("two")).status == "completed"
    assert hm.memory.arrived == [("one", hm.rt.session_id), ("two", hm.rt.session_id)]


async def test_a_turn_booting_its_cli_when_a_forget_begins_recalls_only_once_the_forget_is_done(
        hm: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn began before the hold (so it is not held at the gate): its auto-recall, which could bring
    the words being taken out, waits for the hold's end."""
    assert hm.memory is not None
    recalls: list[tuple[str, int]] = []

    async def recall_for(message: str, session_id: str, turn_id: str) -> None:
        recalls.append((message, hm.rt._holds))
        return None

    monkeypatch.setattr(hm.memory, "recall_for", recall_for)
    hm.memory.booting = asyncio.Event()
    hm.rt.submit("one")
    await hm.until(lambda: hm.rt.state == "starting")  # booting its CLI: past the gate
    async with hm.rt.holding_turns():
        hm.memory.booting.set()
        await hm.until(lambda: bool(hm.clis))
        await asyncio.sleep(0.05)  # a moment in which a recall that did not wait would have run
        assert recalls == []
    assert (await hm.turn("two")).status == "completed"
    assert recalls == [("one", 0), ("two", 0)]


async def test_a_hold_begins_only_once_the_auto_recall_under_way_has_ended(
        hm: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """What that recall brings is then memory's `recalled` when the forget asks what the session holds."""
    assert hm.memory is not None
    steps: list[str] = []
    gate = asyncio.Event()

    async def recall_for(message: str, session_id: str, turn_id: str) -> None:
        steps.append("recall")
        await gate.wait()
        steps.append("recalled")
        return None

    async def forget() -> None:
        async with hm.rt.holding_turns():
            steps.append("held")

    monkeypatch.setattr(hm.memory, "recall_for", recall_for)
    hm.rt.submit("one")
    await hm.until(lambda: steps == ["recall"])
    holding = asyncio.create_task(forget())
    await asyncio.sleep(0.05)
    assert steps == ["recall"]  # the hold waits
    gate.set()
    await asyncio.wait_for(holding, 5)
    assert steps == ["recall", "recalled", "held"]
    await hm.until(lambda: bool(hm.of(p.TurnComplete)))


async def test_a_turn_interrupted_while_the_cli_starts_is_never_closed(hm: Harness) -> None:
    assert hm.memory is not None
    hm.memory.booting = asyncio.Event()
    hm.rt.submit("never mind")
    await hm.until(lambda: hm.rt.state == "starting")
    assert await hm.rt.interrupt()
    hm.memory.booting.set()
    await hm.until(lambda: bool(hm.of(p.TurnComplete)))
    assert hm.of(p.TurnComplete)[-1].status == "interrupted" and hm.clis[0].queries == []
    assert not hm.of(p.TurnComplete)[-1].by_server  # the person's stop
    assert hm.memory.closed() == []  # nothing happened: nothing to record
    assert hm.memory.turns_ended == 1  # yet the turn is over: the embedder must not wait for a record
    assert (await hm.turn("hello")).status == "completed"
    assert hm.memory.closed() == [("closed", "hello", "success")]
    assert hm.memory.turns_ended == 2


async def test_a_turn_interrupted_while_the_sdk_is_imported_ends_unsent_without_starting_a_cli(
        h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh server's first turn imports the agent SDK on a thread (a second or more) before the
    CLI's start begins: a stop pressed then, or a SIGTERM, ends the turn unsent, not as a crash."""
    imported = asyncio.Event()

    async def slow_load_sdk() -> None:
        await imported.wait()

    monkeypatch.setattr(runtime_mod, "load_sdk", slow_load_sdk)
    h.rt.submit("never mind")
    await h.until(lambda: h.rt.state == "starting")
    assert await h.rt.interrupt()
    imported.set()
    await h.until(lambda: bool(h.of(p.TurnComplete)))
    assert h.of(p.TurnComplete)[-1].status == "interrupted"
    assert h.of(p.Error) == [] and h.of(p.SessionEnded) == []  # no "agent stopped", no crashed session
    assert h.clis == []  # nothing to send: no CLI was started for it
    assert (await h.turn("hello")).status == "completed"


async def test_a_resent_turn_is_closed_once_in_the_fresh_session(hm: Harness) -> None:
    assert hm.memory is not None
    await hm.turn("one")
    hm.clis[0].exit_silently = True
    assert (await hm.turn("two")).status == "completed"
    second = hm.rt.session_id
    assert hm.memory.closed() == [("closed", "one", "success"), ("closed", "two", "success")]
    assert hm.memory.events[-2:] == [("session_started", second), ("closed", "two", "success")]
    assert hm.memory.records[-1].seen == ["AssistantMessage", "ResultMessage"]


async def test_a_turn_stopped_by_shutdown_is_closed_before_the_session_ends(hm: Harness) -> None:
    assert hm.memory is not None
    hm.hold = True
    hm.reply = [ResultMessage(subtype="error_during_execution", duration_ms=5, duration_api_ms=4, is_error=True,
                              num_turns=1, session_id="x")]
    hm.rt.submit("long")
    await hm.until(lambda: hm.rt.state == "running")
    await hm.rt.shutdown(5)
    assert hm.memory.events[-2:] == [("closed", "long", "error_during_execution, by the server's stop"),
                                     ("session_ended", hm.rt.session_id, "shutdown")]
    # The live frame says what the record says: the server's stop cut it, not the person (who was told
    # "interrupted", as if they had pressed Stop).
    [done] = hm.of(p.TurnComplete)
    assert done.status == "interrupted" and done.by_server


async def test_a_turn_the_stop_ends_while_its_cli_starts_is_said_stopped_by_the_server(hm: Harness) -> None:
    """Unsent (nothing is recorded), but the person did not stop it: the frame says the server did."""
    assert hm.memory is not None
    hm.memory.booting = asyncio.Event()
    hm.rt.submit("never mind")
    await hm.until(lambda: hm.rt.state == "starting")
    stopping = asyncio.create_task(hm.rt.shutdown(5))
    await hm.until(lambda: hm.rt.state == "stopping")
    hm.memory.booting.set()
    await stopping
    [done] = hm.of(p.TurnComplete)
    assert done.status == "interrupted" and done.by_server


async def test_a_turn_the_person_stopped_is_recorded_so_though_the_server_stops_before_it_ends(hm: Harness) -> None:
    """A turn cut by the server's stop was recorded as interrupted by the person (memory, and Past
    sessions, said so). Who stopped it first is what the record says."""
    assert hm.memory is not None
    hm.hold = True
    hm.reply = [ResultMessage(subtype="error_during_execution", duration_ms=5, duration_api_ms=4, is_error=True,
                              num_turns=1, session_id="x")]
    hm.rt.submit("long")
    await hm.until(lambda: hm.rt.state == "running" and bool(hm.clis) and bool(hm.clis[0].queries))
    cli = hm.clis[0]

    async def slow_to_stop() -> None:  # the person's stop reaches the CLI; its reply ends after the shutdown's
        cli.order.append("interrupt")

    cli.interrupt = slow_to_stop  # type: ignore[method-assign]
    assert await hm.rt.interrupt()
    stopping = asyncio.create_task(hm.rt.shutdown(5))
    await hm.until(lambda: not hm.rt._session.accepting)  # the shutdown's own interrupt has been asked
    cli.interrupted.set()
    await stopping
    assert hm.memory.closed() == [("closed", "long", "error_during_execution")]
    [done] = hm.of(p.TurnComplete)
    assert done.status == "interrupted" and not done.by_server  # the person's, live as in the record


async def test_a_turn_the_person_stopped_is_recorded_so_when_the_stop_then_cancels_it(hm: Harness) -> None:
    """The same order, but the CLI never ends its reply: the stop's grace runs out and the turn is
    cancelled. The person stopped it first, so the record names the person, not the server's stop."""
    assert hm.memory is not None
    hm.hold = True
    hm.rt.submit("long")
    await hm.until(lambda: hm.rt.state == "running" and bool(hm.clis) and bool(hm.clis[0].queries))
    cli = hm.clis[0]

    async def never_stops() -> None:  # the person's stop reaches the CLI; its reply never ends
        cli.order.append("interrupt")

    cli.interrupt = never_stops  # type: ignore[method-assign]
    assert await hm.rt.interrupt()
    await hm.rt.shutdown(0.2, cli_end=0.2)
    assert hm.memory.closed() == [("closed", "long", "failed: None")]  # not "by the server's stop"


async def test_what_the_person_did_meanwhile_goes_with_their_next_message_once(h: Harness) -> None:
    h.rt.note("The person uploaded documents/a.pdf (1.0 KB) through the console.")
    await h.turn("what did I upload?")
    await h.turn("and now?")
    first, second = h.clis[0].queries
    [message] = [m async for m in first]  # type: ignore[attr-defined]
    context, prompt = message["message"]["content"]
    assert context["text"] == ("Since the last message, outside this conversation:\n"
                               "- The person uploaded documents/a.pdf (1.0 KB) through the console.")
    assert prompt["text"] == "what did I upload?"  # the message itself, as typed
    assert second == "and now?"  # told once


# ---------------------------------------------------------------- durable, then acknowledged


async def test_turn_complete_waits_until_the_closed_turn_is_durable(hm: Harness) -> None:
    """A person who reads turn_complete may pull the plug: it goes out only once memory says the
    turn is on disk. An interrupt meanwhile changes nothing (the answer is in)."""
    assert hm.memory is not None
    hm.memory.saving = asyncio.Event()
    hm.rt.submit("one")
    await hm.until(lambda: hm.rt._turn.phase is TurnPhase.SAVING)
    assert hm.of(p.AssistantMessage) and not hm.of(p.TurnComplete)  # answered, closed, not yet durable
    assert hm.rt.state == "running"
    assert await hm.rt.interrupt()  # no error for the client, and no interrupt for the idle CLI
    hm.memory.saving.set()
    await hm.until(lambda: bool(hm.of(p.TurnComplete)))
    assert hm.of(p.TurnComplete)[-1].status == "completed" and hm.memory.durable == ["one"]
    assert hm.clis[0].order == ["query"]


async def test_a_turn_that_cannot_be_saved_says_so_before_its_turn_complete(hm: Harness) -> None:
    assert hm.memory is not None
    hm.memory.saves = False
    done = await hm.turn("on a full disk")
    assert done.status == "completed" and done.saved is False  # completed, yet not on disk: it says so
    error = hm.of(p.Error)[-1]
    assert error.code == "not_saved" and error.turn_id == done.turn_id
    assert hm.kinds()[-2:] == ["Error", "TurnComplete"]
    hm.clis[-1].crash_after = 1  # a turn that fails, not saved either
    failed = await hm.turn("and a failing one")
    assert failed.status == "error" and failed.saved is False
    hm.memory.saves = True
    assert (await hm.turn("the disk is back")).saved is True


async def test_a_failed_turn_is_acknowledged_only_once_durable_too(hm: Harness) -> None:
    assert hm.memory is not None
    await hm.turn("one")
    hm.clis[0].crash_after = 1
    hm.memory.saving = asyncio.Event()
    hm.rt.submit("two")
    await hm.until(lambda: hm.rt._turn.phase is TurnPhase.SAVING)
    assert hm.of(p.Error) and len(hm.of(p.TurnComplete)) == 1
    hm.memory.saving.set()
    await hm.until(lambda: len(hm.of(p.TurnComplete)) == 2)
    assert hm.of(p.TurnComplete)[-1].status == "error" and hm.memory.durable == ["one", "two"]


async def test_a_failing_agent_answers_each_message_at_once_and_retries_without_waiting_for_memory(
        hm: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each message while the disk was read-only waited for memory's settle (15 s, a batch in
    flight) before finding the agent could not start; so did the runtime's own retry, and the
    messages queued behind it."""
    assert hm.memory is not None
    hm.memory.booting = asyncio.Event()  # a batch in flight, never done in this test

    def read_only(path: Path) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(runtime_mod, "_check_writable", read_only)
    hm.rt.health.backoff = Backoff(first=0.2, max=0.2)
    for n in range(3):  # each answered, none waiting for the batch
        done = await hm.turn(f"while read-only {n}")
        assert done.status == "error"
        assert "Read-only file system" in hm.of(p.Error)[-1].message
    assert hm.rt.health.failed
    monkeypatch.undo()  # the disk is back: the runtime starts the agent on its own, not waiting either
    await hm.until(lambda: not hm.rt.health.failed and hm.rt.cli_running)
    assert hm.memory.boots[-1] is False
    assert (await hm.turn("after")).status == "completed"


async def test_a_turn_stopped_while_its_auto_recall_waits_for_a_forget_ends_unsent(hm: Harness) -> None:
    """The turn began before the hold (its CLI booting), so its auto-recall waits for the forget's end (up
    to TURN_HOLD_LIMIT). A stop pressed meanwhile: nothing has been written to the CLI, so the turn ends
    unsent, as one stopped while its CLI boots does; it is not sent to the model once the forget ends."""
    assert hm.memory is not None
    hm.hold = True  # were it sent, its reply would wait for the interrupt
    hm.memory.booting = asyncio.Event()
    hm.rt.submit("never mind")
    await hm.until(lambda: hm.rt.state == "starting")
    async with hm.rt.holding_turns():
        hm.memory.booting.set()
        await hm.until(lambda: bool(hm.clis) and hm.rt.state == "running")  # connected: in the recall's wait
        assert await hm.rt.interrupt()
    await hm.until(lambda: bool(hm.of(p.TurnComplete)))
    assert hm.of(p.TurnComplete)[-1].status == "interrupted"
    assert hm.clis[0].queries == []  # the stopped message never reached the model
    assert hm.memory.closed() == []  # nor memory: nothing happened


async def test_a_resent_turns_recalled_memories_are_known_to_memory_as_the_fresh_sessions(
        hm: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn's auto-recall looked once, in the session whose CLI then proved dead; the prompt and its
    recalled context go to a fresh CLI, in a new session. A later forget of a recalled turn asks memory
    what that session holds (`recalled(session)`): memory must know the fresh session was sent them."""
    assert hm.memory is not None
    looked: list[str] = []

    async def recall_for(message: str, session_id: str, turn_id: str) -> Any:
        looked.append(session_id)
        return None

    monkeypatch.setattr(hm.memory, "recall_for", recall_for)
    assert (await hm.turn("one")).status == "completed"
    hm.clis[0].exit_silently = True
    hm.rt.note("They uploaded notes.txt")
    assert (await hm.turn("two")).status == "completed"
    assert len(hm.clis) == 2
    [message] = [m async for m in hm.clis[1].queries[-1]]  # type: ignore[attr-defined]
    context, prompt = message["message"]["content"]
    assert prompt["text"] == "two" and context["text"].endswith("- They uploaded notes.txt")  # told still
    assert looked[-1] == hm.rt.session_id, "the recall that reached the fresh session was never told to memory"


# ---------------------------------------------------------------- a message's client id: never run twice


async def test_a_message_sent_again_while_queued_or_running_is_refused_as_taken(h: Harness) -> None:
    h.hold = True
    h.rt.submit("one", "web-1")
    await h.until(lambda: h.rt.state == "running")
    h.rt.submit("two", "web-2")
    for again in ("web-1", "web-2"):  # running, then queued
        with pytest.raises(AlreadyTaken) as taken:
            h.rt.submit("the same", again)
        assert taken.value.turn_id is not None
    assert h.rt.queued == 1
    [running] = h.of(p.TurnStarted)
    with pytest.raises(AlreadyTaken) as taken:
        h.rt.submit("one", "web-1")
    assert taken.value.turn_id == running.turn_id
    h.hold = False
    await h.rt.interrupt()
    await h.until(lambda: len(h.of(p.TurnComplete)) == 2)
    assert h.clis[0].queries == ["one", "two"]


async def test_a_message_sent_again_after_its_turn_completed_is_not_run_again(h: Harness) -> None:
    await h.turn("one", "web-1")
    with pytest.raises(AlreadyTaken):
        h.rt.submit("one", "web-1")
    await h.turn("two", "web-2")  # another id is another message, the same words or not
    await h.turn("one")  # a message with no id is never refused as taken
    assert h.clis[0].queries == ["one", "two", "one"]


async def test_a_message_an_earlier_run_recorded_is_not_run_again_after_a_restart(tmp_path: Path) -> None:
    memory = FakeMemory()
    memory.taken = [SimpleNamespace(client_id="web-9", session_id="s-old", turn_id="t-9"),
                    SimpleNamespace(client_id="web-8", session_id="s-old", turn_id=None)]  # forgotten since
    harness = Harness(tmp_path, memory)
    await harness.rt.start()
    try:
        for client_id, turn_id in (("web-9", "t-9"), ("web-8", None)):
            with pytest.raises(AlreadyTaken) as taken:
                harness.rt.submit("again", client_id)
            assert (taken.value.session_id, taken.value.turn_id) == ("s-old", turn_id)
        await harness.turn("new", "web-10")  # one the old run dropped from its queue, or never had
        assert harness.clis[0].queries == ["new"]
    finally:
        await harness.rt.shutdown(5)


async def test_an_unreadable_record_leaves_only_this_runs_messages_known(tmp_path: Path) -> None:
    class Unreadable(FakeMemory):
        async def taken_messages(self, limit: int) -> list[Any]:
            raise OSError("disk I/O error")
    harness = Harness(tmp_path, Unreadable())
    await harness.rt.start()
    try:
        await harness.turn("one", "web-1")
        with pytest.raises(AlreadyTaken):
            harness.rt.submit("one", "web-1")
    finally:
        await harness.rt.shutdown(5)


async def test_the_queue_limit_counts_messages_not_new_sessions_between_them(h: Harness) -> None:
    """A script of questions each after a /new: the new sessions waiting counted against the messages'
    limit, and the ninth question was refused queue_full though eight messages waited."""
    h.hold = True
    h.rt.submit("first", "web-0")
    await h.until(lambda: h.rt.state == "running")
    for n in range(MAX_QUEUED_MESSAGES):
        h.rt.new_session()
        h.rt.submit(f"m{n}", f"web-m{n}")
    with pytest.raises(QueueFull):
        h.rt.submit("refused", "web-r")
    assert h.rt.waiting == [f"web-m{n}" for n in range(MAX_QUEUED_MESSAGES)]
    h.hold = False
    await h.rt.interrupt()


async def test_a_refused_message_sent_again_with_its_id_is_taken(h: Harness) -> None:
    h.hold = True
    h.rt.submit("first", "web-0")
    await h.until(lambda: h.rt.state == "running")
    for n in range(MAX_QUEUED_MESSAGES):
        h.rt.submit(f"m{n}", f"web-m{n}")
    with pytest.raises(QueueFull):
        h.rt.submit("refused", "web-r")
    h.hold = False
    await h.rt.interrupt()
    await h.until(lambda: len(h.of(p.TurnComplete)) == MAX_QUEUED_MESSAGES + 1)
    await h.turn("refused", "web-r")
    assert h.clis[0].queries.count("refused") == 1
