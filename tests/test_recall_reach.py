"""Auto-recall's "nothing outside the session" shortcut (recall/reach.py) against a forget's rewrite of the
index: learnings the rewrite takes are still known to be there."""

from __future__ import annotations

import asyncio
import time

import pytest

from sprite_os.memory.memory_store import NewLearning
from sprite_os.memory.recall.reach import Reach
from sprite_os.memory.system import MemorySystem
from tests.test_recall import record, system, turn  # noqa: F401  (the fixture)

pytestmark = pytest.mark.usefixtures("recall_unhurried")  # what is recalled, not how fast


async def test_a_learning_a_forgets_purge_indexed_is_still_auto_recalled(system: MemorySystem) -> None:  # noqa: F811
    """A first session; the curator commits a learning; before the indexer's next poll takes it, a
    forget starts the purge, which writes the index anew from memory.db, learning included, and
    moves the learnings mark past it. The indexer then never stages it, so the reach never hears
    of it, and auto-recall says "nothing" although a search finds the learning."""
    now = time.time()
    await record(system, turn("s1", 1, "I had lunch at a place downtown", at=now))
    system.recall.indexer.turn_started()  # the agent's turn runs: the indexer waits (as in a busy session)
    await system.memory.call(lambda m: m.commit_batch(
        trigger="t", observation_ids=[], model="m", input_tokens=0, output_tokens=0, cost_usd=0,
        learnings=[NewLearning("FACT", "The user's sister Maya loves the Lotus Garden Thai restaurant")],
        file_updates={}, base_hashes={}))
    await system.recall.forget([], [])  # any forget (console, tool): the index is written anew
    assert await system.recall.purged(10)
    system.recall.indexer.turn_ended()
    system.recall.indexer.nudge()
    await asyncio.wait_for(system.recall.indexer.current.wait(), 10)
    found = await system.recall.search("Where does Maya like to eat?", 5)
    assert [h.kind for h in found] == ["learning"], "the learning is searchable"
    recalled = await system.recall_for("Where does my sister Maya like to eat?", "s1", "t9")
    assert recalled is not None, "auto-recall said nothing: reach never heard of the purge's learning"


async def test_the_same_learning_is_auto_recalled_by_the_search_the_reach_skipped(
        system: MemorySystem, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The control: as before the reach (every message searched), the same steps recall the learning."""
    monkeypatch.setattr(Reach, "beyond", lambda self, session_id: True)
    await test_a_learning_a_forgets_purge_indexed_is_still_auto_recalled(system)
