"""The embedder steps aside for the agent's turns, never for long: the pure policy, and the
indexer that follows it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from sprite_os.memory.recall import indexer as indexer_module
from sprite_os.memory.recall import pacing
from sprite_os.memory.recall.pacing import MAX_DEFER, QUIET_AFTER_TURN, AgentActivity, embed_delay
from sprite_os.memory.recall.vectors import VectorReader
from tests.test_recall import turn
from tests.test_recall_backfill import indexer_for, with_turns


def test_an_idle_agent_never_holds_the_embedder_back() -> None:
    assert embed_delay(AgentActivity(), wanted_since=100.0, now=100.0) == 0.0


def test_a_running_turn_holds_it_until_the_turn_ends_or_max_defer_is_up() -> None:
    busy = AgentActivity()
    busy.started(now=99.0)
    assert embed_delay(busy, wanted_since=100.0, now=100.0) == MAX_DEFER
    assert embed_delay(busy, wanted_since=100.0, now=104.0) == pytest.approx(MAX_DEFER - 4)
    assert embed_delay(busy, wanted_since=100.0, now=100.0 + MAX_DEFER) == 0.0  # the agent never stops: go anyway


def test_a_turn_that_just_ended_holds_it_for_a_quiet_spell() -> None:
    after = AgentActivity()
    after.started(now=90.0)
    after.ended(now=100.0)
    assert after.running_since is None
    assert embed_delay(after, wanted_since=95.0, now=100.0) == pytest.approx(QUIET_AFTER_TURN)
    assert embed_delay(after, wanted_since=95.0, now=100.0 + QUIET_AFTER_TURN) == 0.0
    # back-to-back turns: the quiet spell never outlasts MAX_DEFER from when the work was there
    assert embed_delay(after, wanted_since=100.2 - MAX_DEFER, now=100.0) == pytest.approx(0.2)


async def test_the_indexer_embeds_nothing_while_a_turn_runs_and_catches_up_once_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Shorter than the product's, neither examined here: the index's own hold for a turn (1 s, the next
    # tests'), before the embedder has work; the quiet spell after the turn (0.5 s), still asserted. The
    # embedder still has its work a whole second during the turn, and takes none of it.
    monkeypatch.setattr(indexer_module, "AFTER_TURN_WAIT", 0.2)
    monkeypatch.setattr(pacing, "QUIET_AFTER_TURN", 0.2)
    layout = with_turns(tmp_path, 10, "an earlier turn ")
    model, store, indexer, workers = indexer_for(layout)
    indexer.turn_started()  # the agent is in a turn as the server starts
    await indexer.start(fresh_index=True)
    try:
        await asyncio.wait_for(indexer.current.wait(), 30)  # words are held back a second at most: current
        await asyncio.sleep(1.0)
        assert model.calls == 0, "embedded during the agent's turn"
        ended = time.monotonic()
        indexer.turn_ended()
        await asyncio.wait_for(indexer.embedded_all.wait(), 30)
        assert time.monotonic() - ended >= pacing.QUIET_AFTER_TURN
        assert model.calls == 10 and len(VectorReader(store)) == 10
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in workers))


async def test_a_landed_turn_is_indexed_once_the_turn_is_over_not_while_it_ends(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A nudge comes as the turn lands, before its turn_complete is out: the catch-up waits for the
    turn's end (bounded by AFTER_TURN_WAIT, long here), so it never races the turn's last step."""
    monkeypatch.setattr(indexer_module, "AFTER_TURN_WAIT", 30.0)
    layout = with_turns(tmp_path, 10, "an earlier turn ")
    _model, _store, indexer, workers = indexer_for(layout)
    indexer.turn_started()
    await indexer.start(fresh_index=True)
    try:
        await asyncio.sleep(1.5)
        assert not indexer.current.is_set(), "the index caught up while the turn was ending"
        indexer.turn_ended()
        await asyncio.wait_for(indexer.current.wait(), 30)
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in workers))


async def test_a_commit_held_back_a_second_waits_for_a_turn_begun_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The catch-up began between turns, then held its commit back (COMMIT_EVERY); the next turn began
    meanwhile, and the commit (the index's write, its marks) ran in the middle of it. It now waits for
    that turn's end too (AFTER_TURN_WAIT at most, long here)."""
    monkeypatch.setattr(indexer_module, "AFTER_TURN_WAIT", 30.0)
    layout = with_turns(tmp_path, 10, "an earlier turn ")
    _model, _store, indexer, workers = indexer_for(layout)
    commits: list[bool] = []  # at each index write: whether the agent's turn was running
    real = indexer.index.call

    def call(fn: Any) -> Any:
        commits.append(indexer.activity.running_since is not None)
        return real(fn)

    monkeypatch.setattr(indexer.index, "call", call)
    await indexer.start(fresh_index=True)
    try:
        await asyncio.wait_for(indexer.current.wait(), 30)
        assert commits == [False]
        await workers[0].call(lambda t: t.append(turn("s9", 1, "a turn that just landed", at=1_700_000_000.0)))
        indexer.nudge()  # between turns: the catch-up begins, and holds its commit back a second
        await asyncio.sleep(0.1)
        indexer.turn_started()  # the next turn
        await asyncio.sleep(indexer_module.COMMIT_EVERY + 0.5)
        assert commits == [False], "the index committed in the middle of the agent's turn"
        indexer.turn_ended()
        await asyncio.wait_for(indexer.current.wait(), 30)
        assert commits == [False, False]
    finally:
        await indexer.stop()
        await asyncio.gather(*(w.close() for w in workers))
