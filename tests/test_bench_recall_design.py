"""The dialogue recall benchmark's design: each question is searched in the memory as it was when it
is asked, never in one that holds turns from after it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from bench.recall import build, run
from bench.recall.generate import Turn
from sprite_os.config import Settings


class _Searcher:
    """Records each search and the workspace it was asked of; finds nothing."""

    def __init__(self, settings: Settings, searched: list[tuple[Path, str, float]]) -> None:
        self.workspace, self.searched, self.dense = settings.workspace, searched, None

    def search(self, question: str, now: float, _limit: int, use_dense: bool = True) -> list[Any]:
        self.searched.append((self.workspace, question, now))
        return []

    def close(self) -> None:
        pass


def test_each_dialogue_question_is_searched_in_the_memory_as_it_was_when_asked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every turn of the workspace a question is searched in (besides the labelled whole-workspace row)
    is dated before the question's asked_at, each of its evidence turns is there, every question is
    searched so, and the workspaces are prefixes of the whole one (the same episode ids)."""
    holds: dict[Path, list[Turn]] = {}

    def workspace(name: str, turns: Sequence[Turn]) -> tuple[Settings, dict[tuple[str, int], int]]:
        path = tmp_path / f"{name}-{len(holds)}"
        holds[path] = list(turns)
        return build.settings_for(path), {(t.session, t.turn): i for i, t in enumerate(turns, 1)}

    whole: set[Path] = set()  # the labelled row of every question against the whole workspace, as before
    whole_workspace = build.dialogue_workspace

    def dialogue_workspace(eras: Sequence[int]) -> build.Moment:
        made = whole_workspace(eras)
        whole.add(made[0].workspace)
        return made

    searched: list[tuple[Path, str, float]] = []
    monkeypatch.setattr(build, "workspace", workspace)
    monkeypatch.setattr(build, "dialogue_workspace", dialogue_workspace)
    monkeypatch.setattr(run, "open_searcher", lambda settings, lexical=False: _Searcher(settings, searched))
    out = run.dialogue_bench(quick=False, fused_only=True)

    turns, questions = build.dialogue_benchmark()
    by_asked = defaultdict(list)  # a few questions are asked twice, of different facts
    for q in questions:
        by_asked[(q.question, q.asked_at)].append(q)
    asked_then: set[str] = set()
    for path, text, now in searched:
        alike, held = by_asked[(text, now)], holds[path]
        q = alike[0]
        group = next(g for g in build.DIALOGUE_GROUPS if q.conversation in g)
        everything = [t for t in turns if int(t.session[1:t.session.index("-")]) in group]
        assert held == everything[:len(held)]  # a prefix of its group: the episode ids of the whole workspace
        if path in whole:
            assert held == everything
            continue
        assert all(t.timestamp < now for t in held), (q.id, "searched in a memory holding turns after it")
        assert held == [t for t in everything if t.timestamp < now], q.id  # and every turn known then
        for q in alike:
            assert {(t.session, t.turn) for t in held} >= {tuple(e) for e in q.evidence}, q.id
            asked_then.add(q.id)
    assert asked_then == {q.id for q in questions}
    assert sum(1 for path, _, _ in searched if path in whole) >= len(questions)
    assert out["fused"]["questions"] == len(questions) == out[run.WHOLE]["questions"]
