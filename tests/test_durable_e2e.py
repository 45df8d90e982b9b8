"""Durable, then acknowledged, through the real CLI: at the moment `turn_complete` is published, the
turn is on disk whole (what a kill -9 or a power cut then leaves), whether transcript.db's thread
is free (its synced commit) or busy (the turn journal)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devkit.mock_bridge import MockBridge, Text, Turn
from sprite_os import protocol as p
from sprite_os.config import Settings
from sprite_os.events import EventHub
from sprite_os.memory.capture import journal as journal_mod
from sprite_os.memory.capture import recorder as recorder_mod
from sprite_os.memory.capture.journal import journal_path, read_state
from sprite_os.memory.capture.spill import ObservationWrite, read_spill, spill_path
from tests.conftest import client_factory, running, wait_for
from tests.test_faults_e2e import healthz
from tests.test_memory_e2e import turn

pytestmark = pytest.mark.e2e


def on_disk(settings: Settings) -> dict[str, tuple[str, bool]]:
    """What a server killed right now leaves (the journal, the spill file, transcript.db): each
    turn's answer by its message, and whether it ended (False: it would be recorded as cut short)."""
    found: dict[str, tuple[str, bool]] = {}
    state = read_state(journal_path(settings.layout))
    assert state is not None, "the journal is damaged"
    for entry in state:
        found[entry.observation.user_message] = (entry.observation.agent_response, entry.ended)
    for write in read_spill(spill_path(settings.layout)):
        if isinstance(write, ObservationWrite):
            found[write.observation.user_message] = (write.observation.agent_response, True)
    if settings.layout.transcript_db.exists():
        conn = sqlite3.connect(f"file:{settings.layout.transcript_db}?mode=ro", uri=True)
        try:
            for message, answer in conn.execute("SELECT user_message, agent_response FROM observations"):
                found[message] = (answer, True)
        finally:
            conn.close()
    return found


@pytest.fixture
def at_turn_complete(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> Iterator[list[dict[str, Any]]]:
    """The disk as it is at the instant each turn_complete is published (before any client has it)."""
    seen: list[dict[str, Any]] = []
    publish = EventHub.publish

    def spy(hub: EventHub, frame: p.ServerFrame) -> Any:
        if isinstance(frame, p.TurnComplete):
            seen.append(on_disk(settings))
        return publish(hub, frame)

    monkeypatch.setattr(EventHub, "publish", spy)
    yield seen


ANSWER = "Noted: the boiler is serviced on the 3rd."


async def test_a_turn_is_on_disk_whole_when_turn_complete_goes_out(
        bridge: MockBridge, settings: Settings, at_turn_complete: list[dict[str, Any]]) -> None:
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        bridge.agent.script(Turn(Text(ANSWER)))
        assert (await turn(c, "remember the boiler"))["status"] == "completed"
        assert at_turn_complete[-1]["remember the boiler"] == (ANSWER, True)

        assert app.memory is not None  # transcript.db's thread held busy (a long read): the journal takes it
        hold = threading.Event()
        app.memory.transcript.submit(lambda _t: hold.wait(60))
        try:
            bridge.agent.script(Turn(Text("Second answer.")))
            assert (await turn(c, "and the second"))["status"] == "completed"
            assert at_turn_complete[-1]["and the second"] == ("Second answer.", True)
            assert not c.of("error")
        finally:
            hold.set()


async def test_healthz_is_degraded_while_a_turn_could_not_be_saved_on_a_disk_that_hangs(
        bridge: MockBridge, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that hangs (a dead network volume) fails no write: /healthz said ok while every turn
    was acknowledged as not saved."""
    # The disk hangs until the test lets it go: how long a turn waits for it is no margin (5 s deployed).
    monkeypatch.setattr(recorder_mod, "DURABLE_WAIT", 1.0)
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        assert (await turn(c, "before"))["status"] == "completed"
        assert app.memory is not None
        hold = threading.Event()
        app.memory.transcript.submit(lambda _t: hold.wait(120))  # transcript.db's commit hangs
        app.memory.capture._files.submit(hold.wait, 120)  # so does the journal's fsync
        try:
            done = await turn(c, "during the hang")
            assert done["status"] == "completed" and done["saved"] is False
            assert [f["code"] for f in c.of("error")] == ["not_saved"]
            health = await asyncio.to_thread(healthz, app.port)
            assert health["status"] == "degraded" and health["memory"]["capture"]["not_saved"] == 1
            assert await asyncio.to_thread(healthz, app.port, None) == {"status": "degraded"}
        finally:
            hold.set()
        await wait_for(lambda: app.memory is not None and not app.memory.capture.acks.unsaved,
                       what="the turn landed once the disk answered")
        assert (await asyncio.to_thread(healthz, app.port))["status"] == "ok"


async def test_more_turns_than_the_journal_keeps_while_transcript_db_is_busy_are_all_on_disk(
        bridge: MockBridge, settings: Settings, at_turn_complete: list[dict[str, Any]]) -> None:
    """With transcript.db's thread held, the journal dropped its oldest closed turn past 32 while the
    writer held it in memory only: acknowledged turns on no disk."""
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        assert (await turn(c, "warm up"))["status"] == "completed"
        assert app.memory is not None
        hold = threading.Event()
        app.memory.transcript.submit(lambda _t: hold.wait(120))  # a long read holds the thread
        try:
            for n in range(journal_mod.MAX_CLOSED + 2):
                bridge.agent.script(Turn(Text(f"answer {n}")))
                assert (await turn(c, f"busy {n}"))["status"] == "completed"
                disk = at_turn_complete[-1]  # what a kill -9 at this turn_complete leaves
                assert [f"busy {m}" for m in range(n + 1) if disk.get(f"busy {m}") != (f"answer {m}", True)] == []
        finally:
            hold.set()
