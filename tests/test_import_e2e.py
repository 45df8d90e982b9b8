"""Import end to end: `sprite-os memory import` run while the server serves goes through the server (never
beside it); the agent's search_memory, through the real CLI, finds the imported turn; its vector is
made in the background; importing the file again adds nothing."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from devkit.mock_bridge import MockBridge, Text, ToolCall, Turn
from sprite_os.config import Settings
from sprite_os.memory.recall.service import vectors_path
from sprite_os.memory.recall.vectors import VectorReader
from tests.conftest import client_factory, running, wait_for
from tests.test_memory_e2e import observations, turn

pytestmark = pytest.mark.e2e

FACT = "The spare key to the shed hangs behind the blue flowerpot on the balcony."


async def import_file(settings: Settings, path: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "sprite_os", "--workspace", str(settings.workspace), "memory", "import", str(path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_an_import_while_the_server_runs_is_found_by_the_agents_search(
        bridge: MockBridge, settings: Settings, tmp_path: Path) -> None:
    past = tmp_path / "past.jsonl"
    lines = [{"session": "old-phone", "timestamp": 1_600_000_000 + 60 * i, "user": text, "assistant": "Noted."}
             for i, text in enumerate(["We repainted the fence green.", FACT, "Dinner was mushroom risotto."])]
    past.write_text("".join(json.dumps(x) + "\n" for x in lines))
    async with running(settings) as app, client_factory(app.port) as client:
        c = await client(hello={})
        status, out, err = await import_file(settings, past)
        assert status == 0, err
        assert re.search(r"^the server \(pid \d+\) is recording the turns$", err, re.M)
        assert "imported 3 turns from 1 sessions (0 already recorded, 0 bad lines)" in out
        assert app.memory is not None
        await asyncio.wait_for(app.memory.recall.indexer.current.wait(), 20)
        bridge.agent.script(Turn(ToolCall("mcp__memory__search_memory", {"query": "spare key shed"}),
                                 Text("It is behind the blue flowerpot.")))
        await turn(c, "Search your memory: the shed key.")
        result = next(f for f in c.frames if f["type"] == "tool_result")
        assert not result["is_error"] and "blue flowerpot" in result["summary"] and "old-phone" in result["summary"]
        model = app.memory.recall.status()["dense"]["model"]
        reader = VectorReader(vectors_path(settings.layout.memory_dir, model))
        key = next(o.id for o in observations(settings) if o.user_message == FACT)
        await wait_for(lambda: bool(reader.has([key])[0]), timeout=60, what="the imported turn's vector")
        status, out, _ = await import_file(settings, past)
        assert status == 0 and "imported 0 turns from 1 sessions (3 already recorded" in out
    assert sum(1 for o in observations(settings) if o.session_id == "old-phone") == 3
