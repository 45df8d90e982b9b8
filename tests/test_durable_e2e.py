"""Durable, then acknowledged, through the real CLI: at the moment `turn_complete` is published, the
turn is on disk whole (what a kill -9 or a power cut then leaves), whether transcript.db's thread
is free (its synced commit) or busy (the turn journal)."""

from __future__ import annotations

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
from sprite_os.memory.capture.journal import journal_path
from tests.conftest import client_factory, running
from tests.test_memory_e2e import turn

pytestmark = pytest.mark.e2e


def on_disk(settings: Settings) -> dict[str, tuple[str, bool]]:
    """What a server killed right now leaves: each turn's answer by its message, and whether it
    ended (False: it would be recorded as cut short)."""
    found: dict[str, tuple[str, bool]] = {}
    path = journal_path(settings.layout)
    if path.exists():
        for entry in journal_mod._last_state(path.read_bytes(), path):
            found[entry.observation.user_message] = (entry.observation.agent_response, entry.ended)
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
