"""The dialogue recall benchmark's design: its headline is one memory of all ten eras, each question
searched in it as it was when the question is asked, never in one that holds turns from after it; the
reference methods and auto-recall search the same memory; the labelled rows of before (two groups of
five eras asked then, the groups' whole workspaces) are what they say; and the real workspace cache
tells two memories apart by all their turns."""

from __future__ import annotations

import functools
import sqlite3
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import sprite_os.memory.files
import sprite_os.memory.loader
import sprite_os.memory.memory_store
import sprite_os.memory.transcript_store
from bench.recall import build, reference, run
from bench.recall.generate import Question, Turn
from sprite_os.config import Settings

Searched = list[tuple[Path, str, float]]


def _era(t: Turn) -> int:
    return int(t.session[1:t.session.index("-")])


class _Bench:
    """The benchmark's turns and questions, built at the first test that asks (about 1 s of CPU): built at
    import, every worker of `make test-fast` paid it while collecting, though one runs these tests."""

    def __init__(self) -> None:
        self.turns, self.questions = build.dialogue_benchmark()
        # a few questions are asked twice
        self.by_asked: dict[tuple[str, float], list[Question]] = defaultdict(list)
        for q in self.questions:
            self.by_asked[(q.question, q.asked_at)].append(q)
        self.eras = [_era(t) for t in self.turns]


@functools.cache
def _bench() -> _Bench:
    return _Bench()


# What a memory must hold, asked by the checks below of each of the bench's thousands of searches: each
# answer computed once (a scan of every turn per search was most of this module's CPU, three times that
# under `make test`'s coverage).
@functools.cache
def _of_eras(eras: tuple[int, ...]) -> list[Turn]:
    """The turns of `eras`, in order."""
    bench = _bench()
    return [t for t, era in zip(bench.turns, bench.eras, strict=True) if era in eras]


@functools.cache
def _before(now: float, eras: tuple[int, ...] | None = None) -> list[Turn]:
    """The turns (of `eras`; None: of all) before `now`, in order."""
    return [t for t in (_bench().turns if eras is None else _of_eras(eras)) if t.timestamp < now]


class _Searcher:
    """Records each search and the workspace it was asked of; finds a question's evidence where `finds`
    says so, else nothing."""

    def __init__(self, settings: Settings, searched: Searched, finds: Callable[[Path], bool],
                 holds: dict[Path, list[Turn]]) -> None:
        self.workspace, self.searched, self.dense, self.policies = settings.workspace, searched, None, True
        self.finds, self.holds = finds, holds
        self._ids: dict[tuple[str, int], int] | None = None

    def search(self, question: str, now: float, _limit: int, use_dense: bool = True) -> list[Any]:
        self.searched.append((self.workspace, question, now))
        if not self.finds(self.workspace):
            return []
        if self._ids is None:  # once a searcher: its workspace's turns don't change
            self._ids = {(t.session, t.turn): i for i, t in enumerate(self.holds[self.workspace], 1)}
        ids = self._ids
        return [SimpleNamespace(id=ids[tuple(e)], kind="episode")
                for q in _bench().by_asked[(question, now)] for e in q.evidence if tuple(e) in ids]

    def close(self) -> None:
        pass


class _Memory:
    """Which workspaces the bench made: each one's turns, and what made it."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        self.holds: dict[Path, list[Turn]] = {}
        self.made_by: dict[Path, tuple[str, tuple[int, ...]]] = {}
        self.checked: set[tuple[Path, float, tuple[int, ...]]] = set()
        self.keys: dict[Path, set[tuple[str, int]]] = {}  # each memory's turns, as evidence names them
        moments, whole = build.dialogue_moments, build.dialogue_workspace

        def workspace(name: str, turns: Sequence[Turn]) -> tuple[Settings, dict[tuple[str, int], int]]:
            path = tmp_path / f"{name}-{len(self.holds)}"
            self.holds[path] = list(turns)
            return build.settings_for(path), {(t.session, t.turn): i for i, t in enumerate(turns, 1)}

        def dialogue_moments(eras: Sequence[int]) -> list[build.Moment]:
            made = moments(eras)
            self.made_by |= {m[0].workspace: ("then", tuple(eras)) for m in made}
            return made

        def dialogue_workspace(eras: Sequence[int]) -> build.Moment:
            made = whole(eras)
            self.made_by[made[0].workspace] = ("whole", tuple(eras))
            return made

        monkeypatch.setattr(build, "workspace", workspace)
        monkeypatch.setattr(build, "dialogue_moments", dialogue_moments)
        monkeypatch.setattr(build, "dialogue_workspace", dialogue_workspace)

    def check_then(self, path: Path, text: str, now: float, eras: Sequence[int]) -> list[Question]:
        """The workspace searched for a question holds every turn of `eras` before it, and nothing else."""
        alike, held = _bench().by_asked[(text, now)], self.holds[path]
        assert alike, text
        if (path, now, tuple(eras)) not in self.checked:  # the same memory and moment: checked once
            assert all(t.timestamp < now for t in held), (alike[0].id, "searched in a memory holding turns after it")
            assert held == _before(now, tuple(eras)), alike[0].id
            self.checked.add((path, now, tuple(eras)))
        if (keys := self.keys.get(path)) is None:  # a memory's turns do not change: gathered once
            keys = self.keys[path] = {(t.session, t.turn) for t in held}
        for q in alike:
            assert keys >= {tuple(e) for e in q.evidence}, q.id
        return alike


def test_each_dialogue_question_is_searched_in_one_memory_as_it_was_when_asked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The headline rows (shipped, words only, without policies, the reference methods) search one memory
    of all ten eras as it was when each question is asked; the labelled rows search the two groups
    asked then and the groups' whole workspaces; each row's figures come from its own searches."""
    memory = _Memory(monkeypatch, tmp_path)
    searched: Searched = []
    # the fake finds every question's evidence in the one memory only: the headline reads 1.0, the rest 0
    monkeypatch.setattr(run, "open_searcher", lambda settings, lexical=False: _Searcher(
        settings, searched, lambda path: memory.made_by[path] == ("then", build.DIALOGUE_ERAS), memory.holds))
    referenced: list[tuple[list[Turn], str]] = []

    def reference_build(turns: Sequence[Turn], _cache: Path, embed: bool) -> Any:
        corpus = list(turns)
        return SimpleNamespace(fts5=lambda text: referenced.append((corpus, text)) or [])

    monkeypatch.setattr(reference, "build", reference_build)
    out = run.dialogue_bench(quick=False, fused_only=False)

    assert build.DIALOGUE_ERAS == tuple(range(10))
    headline: defaultdict[str, int] = defaultdict(int)
    seen: dict[tuple[str, tuple[int, ...]], set[str]] = defaultdict(set)
    for path, text, now in searched:
        kind, eras = memory.made_by[path]
        if kind == "whole":
            assert eras in build.DIALOGUE_GROUPS and memory.holds[path] == _of_eras(eras)
            alike = _bench().by_asked[(text, now)]
        else:
            assert eras in (build.DIALOGUE_ERAS, *build.DIALOGUE_GROUPS)
            alike = memory.check_then(path, text, now, eras)
        assert all(q.conversation in eras for q in alike)
        seen[(kind, eras)] |= {q.id for q in alike}
    every = {q.id for q in _bench().questions}
    assert seen[("then", build.DIALOGUE_ERAS)] == every
    assert set().union(*(seen[("then", g)] for g in build.DIALOGUE_GROUPS)) == every
    assert set().union(*(seen[("whole", g)] for g in build.DIALOGUE_GROUPS)) == every
    # the reference methods search the same memory: the turns before the question, of all ten eras
    assert len(referenced) == len(_bench().questions)
    for corpus, text in referenced:
        assert any(corpus == _before(q.asked_at) for q in _bench().questions if q.question == text), text
        headline[text] += 1
    for label in ("fused", "lexical", "fused_plain", "fused_tuning", "fused_held_out"):
        assert out[label]["r@10"] == 1.0 and out[label]["all@10"] == 1.0, label
    for label in (run.GROUPS, run.WHOLE):
        assert out[label]["questions"] == len(_bench().questions) and out[label]["r@10"] == 0.0, label
    assert out["fused"]["questions"] == len(_bench().questions) == out["reference_fts5"]["questions"]
    assert out["turns"] == len(_bench().turns) and out["eras"] == 10
    assert out["searched_turns_mean"] == round(sum(
        len(_before(q.asked_at)) for q in _bench().questions) / len(_bench().questions))


def test_auto_recall_asks_each_question_of_one_memory_as_it_was_then(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Auto-recall's figures: each question against the one memory of all ten eras as it was when asked
    (with that moment's boot prompt), the messages with nothing to recall against the whole of it."""
    memory = _Memory(monkeypatch, tmp_path)
    searched: Searched = []
    booted: list[tuple[Path, float]] = []
    monkeypatch.setattr(run, "open_searcher", lambda settings, lexical=False: _Searcher(
        settings, searched, lambda path: False, memory.holds))

    def auto_recalled(searcher: _Searcher, text: str, now: float, *_: Any) -> list[Any]:
        return searcher.search(text, now, 20)

    class _Db:
        def __init__(self, path: Path) -> None:
            self.path = path

        def close(self) -> None:
            pass

    def boot(_files: Any, db: _Db, _transcript: Any, now: float) -> str:
        booted.append((db.path, now))
        return ""

    monkeypatch.setattr(run, "auto_recalled", auto_recalled)
    monkeypatch.setattr(sprite_os.memory.memory_store, "MemoryDB", _Db)
    monkeypatch.setattr(sprite_os.memory.transcript_store, "TranscriptDB", _Db)
    monkeypatch.setattr(sprite_os.memory.files, "MemoryFiles", lambda layout: None)
    monkeypatch.setattr(sprite_os.memory.loader, "boot_prompt_now", boot)
    out = run._auto_recall(quick=False, lexical=False)

    asked: set[str] = set()
    unrelated = 0
    for path, text, now in searched:
        assert memory.made_by[path] == ("then", build.DIALOGUE_ERAS)
        if (text, now) in _bench().by_asked:
            asked |= {q.id for q in memory.check_then(path, text, now, build.DIALOGUE_ERAS)}
        else:  # a message with nothing to recall: the memory's last moment, the most turns
            unrelated += 1
            assert len(memory.holds[path]) == max(len(h) for h in memory.holds.values())
    assert asked == {q.id for q in _bench().questions} and out["questions"] == len(_bench().questions)
    assert unrelated == out["unrelated_messages"] == len(run.dialogue.unrelated())
    assert {p.parents[2] for p, _ in booted} == {p for p, m in memory.made_by.items() if m[0] == "then"}


def test_the_workspace_cache_tells_memories_apart_by_every_turn(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """The real `build.workspace` (its import, its cache key; the index and vectors left out): prefixes of
    one history, and histories that differ in one turn's text or time, are different workspaces, each
    holding exactly its turns; the same turns find the one built."""
    monkeypatch.setattr(build, "CACHE", tmp_path)
    monkeypatch.setattr(build, "rebuild_recall", lambda settings, progress: None)
    monkeypatch.setattr(build, "_vectors_from_cache", lambda settings, turns: None)
    monkeypatch.setattr(build, "_vectors_to_cache", lambda settings, turns: None)
    turns = _bench().turns[:6]
    variants = [turns[:3], turns[:4], turns, [*turns[:5], replace(turns[5], assistant=turns[5].assistant + "!")],
                [*turns[:5], replace(turns[5], timestamp=turns[5].timestamp + 1)],
                [*turns[:5], replace(turns[5], user=turns[5].user + "?")]]
    paths = []
    for held in variants:
        settings, ids = build.workspace("dialogue-0", held)
        paths.append(settings.workspace)
        with sqlite3.connect(settings.layout.transcript_db) as db:
            stored = db.execute("SELECT timestamp, user_message, agent_response FROM observations ORDER BY id").fetchall()
        assert stored == [(t.timestamp, t.user, t.assistant) for t in held]
        assert ids == {(t.session, t.turn): i for i, t in enumerate(held, 1)}
    assert len(set(paths)) == len(variants)
    assert build.workspace("dialogue-0", turns[:4])[0].workspace == paths[1]
