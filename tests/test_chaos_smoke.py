"""`make chaos` in miniature, so its code cannot rot: a few turns with 2 kills, one fault of each
kind in a short form (a 2 s freeze, 3 s locks), and the same invariants as the full run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from chaos.run import run
from chaos.scenarios import SCENARIOS, Plan
from chaos.turns import Outcome, Turn, TurnLog, reconcile


def test_reconcile_counts_lost_duplicated_and_journal_recovered_turns() -> None:
    """The suite's own arithmetic: an acknowledged turn must be recorded once; an unsent one may be
    recorded at most once; a marker nobody sent is counted."""
    log = TurnLog()
    outcomes: tuple[Outcome, ...] = ("completed", "completed", "cut", "cut", "unsent", "error")
    for outcome in outcomes:
        log.add(Turn(log.new_marker(), "s", outcome, 0.1))
    recorded = Counter({"CHAOS-000001": 1, "CHAOS-000002": 2, "CHAOS-000003": 1, "CHAOS-000005": 1,
                        "CHAOS-999999": 1})
    r = reconcile(log, recorded)
    assert r.completed == 2 and r.recorded == 4
    assert r.lost == ["CHAOS-000004", "CHAOS-000006"]  # a cut turn the journal missed, an error turn
    assert r.duplicated == ["CHAOS-000002"] and r.unknown == 1
    assert (r.cut, r.cut_recorded, r.unsent, r.unsent_recorded) == (2, 1, 1, 1)


@pytest.mark.e2e
async def test_the_chaos_suite_in_miniature_loses_nothing(tmp_path: Path) -> None:
    lines: list[str] = []
    results = await run(tmp_path, Plan.smoke(), [name for name in SCENARIOS if name != "long_run"],
                        say=lines.append, settle_each=False)
    print("\n" + "\n".join(lines))
    assert [r.failures() for r in results] == [[]] * len(results), "\n".join(lines)
    by_name = {r.name: r.figures for r in results}
    assert by_name["kill9"]["kills"] >= 2 and by_name["kill9"]["group"] >= 1 and by_name["kill9"]["alone"] >= 1
    assert set(by_name["flapping_proxy"]["agent_outcomes"].values()) == {"completed"}
    assert by_name["flapping_proxy"]["curator_failed_calls"] >= 1
    assert by_name["freeze"]["frozen_turn"] == "completed"
    assert by_name["locked_db"]["transcript.db"]["completed"] >= 1
    last = results[-1].invariants
    assert last is not None and last.turns.completed >= 20 and last.curated_once == last.observations
