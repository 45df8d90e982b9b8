"""Recall end to end, through the real CLI: a fact said in an early session, which the curator never
kept, is found by search_memory sessions later, and comes to the agent unasked with a later message."""

from __future__ import annotations

import json

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os.commands.main import main as cli
from sprite_os.config import Settings
from sprite_os.memory.files import CURATED, MemoryFiles
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.recall import service
from tests.conftest import client_factory, running, wait_for
from tests.test_memory_e2e import observations, turn

pytestmark = pytest.mark.e2e

FACT = "The spare key to the shed hangs behind the blue flowerpot on the balcony."
QUESTION = "Where did I leave the spare key for the shed?"


async def test_an_early_fact_is_searched_and_auto_recalled_sessions_later(
        bridge: MockBridge, settings: Settings, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # what is recalled is the point here, not how fast (benchmarks.md): a loaded machine must not
    # make auto-recall give up and send the message alone
    monkeypatch.setattr(service, "AUTO_RECALL_TIMEOUT", 60.0)
    # the curator keeps nothing: the fact is in no curated file and no learning
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, FACT)
        for n in range(4):  # sessions pass
            await c.send(type="new_session")
            await c.until("session_started")
            await turn(c, f"Let's plan dinner number {n}: something with mushrooms.")
        await wait_for(lambda: len(observations(settings)) == 5, timeout=20)
        await c.send(type="new_session")
        await c.until("session_started")
        bridge.agent.script(Turn(ToolCall("mcp__memory__search_memory", {"query": "spare key shed"}),
                                 Text("It is behind the blue flowerpot.")))
        await turn(c, "Search your memory: the shed key.")
        result = next(f for f in c.frames if f["type"] == "tool_result")
        assert not result["is_error"] and "blue flowerpot" in result["summary"] and "turn" in result["summary"]
        # the person comes back once the past turns have their vectors (the embedder steps aside while
        # turns run): auto-recall's gate weighs how far the nearest memory stands out by meaning
        assert app.memory is not None
        recall = app.memory.recall
        await wait_for(lambda: recall.indexer.health.embedded >= 6, timeout=120, what="the turns' vectors")
        recall_frames_before = sum(1 for f in c.frames if f["type"] == "recall")
        done = await turn(c, QUESTION)
        recalled = [f for f in c.frames if f["type"] == "recall"][recall_frames_before:]
    memory_db = MemoryDB(settings.layout.memory_db)
    assert not any("flowerpot" in x.content for x in memory_db.all_learnings())
    memory_db.close()
    assert not any("flowerpot" in MemoryFiles(settings.layout).read(name) for name in CURATED)
    first = observations(settings)[0]
    # the client saw what was recalled, and from where
    [frame] = recalled
    assert frame["turn_id"] == done["turn_id"] and frame["tokens"] > 0
    memory = next(m for m in frame["memories"] if "flowerpot" in m["snippet"])
    assert (memory["kind"], memory["session_id"], memory["turn"], memory["observation_id"]) == (
        "episode", first.session_id, 1, first.id)
    # the model got it with the message, in a block of its own before it; capture recorded the
    # person's message alone
    request = next(r for r in bridge.agent_requests() if r.last_user_text == QUESTION)
    last_user = next(m for m in reversed(request.messages) if m["role"] == "user")
    texts = [b["text"] for b in last_user["content"] if isinstance(b, dict) and b.get("type") == "text"]
    context = next(t for t in texts if t.startswith("<recalled-memories>"))
    assert "blue flowerpot" in context and texts.index(context) < texts.index(QUESTION)
    assert observations(settings)[-1].user_message == QUESTION
    # `sprite-os memory recall` shows the block and the memories the runtime sent, through its path
    capsys.readouterr()
    session = observations(settings)[-1].session_id
    assert cli(["--workspace", str(settings.workspace), "memory", "recall", QUESTION, "--json",
                "--session", session]) == 0
    [shown] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(h["kind"], h["id"]) for h in shown["hits"]] == [(m["kind"], m["id"]) for m in frame["memories"]]
    assert shown["block"] == context and shown["tokens"] == frame["tokens"]


async def test_auto_recall_off_sends_the_message_alone(bridge: MockBridge, settings: Settings) -> None:
    settings = settings.with_overrides(auto_recall=False)
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        await turn(c, FACT)
        await c.send(type="new_session")
        await c.until("session_started")
        await turn(c, QUESTION)
        assert not [f for f in c.frames if f["type"] == "recall"]
    assert any(r.last_user_text == QUESTION for r in bridge.agent_requests())
