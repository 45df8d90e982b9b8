"""The recall benchmarks in `make bench`: recall@k of every evidence turn, latency, age fairness,
fairness while vectors catch up, and what auto-recall brings.

    python -m bench --only recall [--quick]

- dialogue: the dialogue benchmark (dialogue.py: 4,740 turns, one memory of ten eras, 848
  questions; --quick: the first five eras), each era's questions asked of that memory as it was
  then (build.dialogue_moments: the turns before them), ranked lexically and fused, through
  `recall.Searcher` (what search_memory runs); beside it the same fusion without the ranking
  policies ("fused_plain"), the two reference methods (reference.py) on the same turns, and the
  shipped ranking as it was measured before: in two memories of five eras asked then
  ("fused_groups_then") and against those two whole workspaces ("fused_whole_workspace").
- small: the first benchmark (generate.py: 6,400 turns, 1,500 template questions; --quick: 2 of
  its 10 conversations), the same way: the gap between the two benchmarks is the point.
- auto_recall: what auto-recall sends (`service.auto_recalled`, the runtime's own path) for the
  dialogue benchmark's questions (each of the one memory as it was then) and for messages with nothing to
  recall (of the whole memory); and what it adds to a
  turn (the server's own call: a thread hop, the search, the floor, the budget).
- backfill: vectors embedded in the server's order (every other turn first, each pass newest
  first); at each moment, the questions whose evidence has no vector yet against the same
  questions when it has (embedded oldest first to the same count), and against word search alone.
- scale: 1M turns + 1M learnings (--quick: 20k + 20k), the first benchmark placed as the oldest
  and as the newest rows, the same questions asked of both: lexical recall and latency. The dense
  half at that size is bench/vectors.py's.

A question is found at k ("any@k", recall@k) when one of its evidence turns is among the first k
hits, and wholly ("all@k") when every one is. Latency is the searching thread's CPU time (what a
free core would take: the machine is shared) and wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench.recall import build, dialogue, reference
from bench.recall.generate import Question
from sprite_os.commands.memory_search import open_searcher
from sprite_os.memory.recall.searcher import Dense, Searcher
from sprite_os.memory.recall.service import auto_recalled
from sprite_os.memory.recall.vectors import VectorReader, VectorWriter

KS = (1, 5, 10, 20)
BLOCK = 1_000  # "found at" this rank: anywhere in the recalled block
QUICK_WORKSPACES = 1
SPLIT_SEED = 2026  # the dialogue questions' tuning half and held-out half
WHOLE = "fused_whole_workspace"  # the dialogue questions asked of their group's whole workspace, as before
GROUPS = "fused_groups_then"  # asked then within two groups of five eras, as measured before
Ids = dict[tuple[str, int], int]


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[int(q * (len(ordered) - 1))], 2) if ordered else 0.0


def found_at(rows: Sequence[dict[str, Any]], k: int, every: bool = False) -> float:
    """The share of questions with one (`every`: each) of their evidence turns among the first k."""
    def found(r: dict[str, Any]) -> bool:
        hits = [x is not None and x <= k for x in r["ranks"]]
        return all(hits) if every else any(hits)
    return round(sum(1 for r in rows if found(r)) / max(1, len(rows)), 3)


def ranks(order: Sequence[int], q: Question, ids: Ids) -> list[int | None]:
    """Where each of `q`'s evidence turns is in `order` (episode ids, best first), None: not there."""
    return [order.index(w) + 1 if w in order else None for w in (ids[(s, t)] for s, t in q.evidence)]


def evaluate(searcher: Searcher, questions: Sequence[Question], ids: Ids, use_dense: bool) -> dict[str, Any]:
    return summarise(_rows(searcher, questions, ids, use_dense))


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_conv: dict[int, list[dict[str, Any]]] = defaultdict(list)
    by_cat: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_conv[r["conversation"]].append(r)
        by_cat[r["category"]].append(r)
    out = {"questions": len(rows), **{f"r@{k}": found_at(rows, k) for k in KS}, "all@10": found_at(rows, 10, True),
           "all@20": found_at(rows, 20, True),
           # the questions whose evidence is 2 to 4 turns: every one of them must come back
           "several_turns": sum(1 for r in rows if len(r["ranks"]) > 1),
           "several_turns_all@10": found_at([r for r in rows if len(r["ranks"]) > 1], 10, True),
           "oldest_conversation_r@10": found_at(by_conv[min(by_conv)], 10),
           "newest_conversation_r@10": found_at(by_conv[max(by_conv)], 10),
           "by_category": {c: {"questions": len(v), "r@10": found_at(v, 10), "all@10": found_at(v, 10, True)}
                           for c, v in sorted(by_cat.items())}}
    if rows and "ms" in rows[0]:
        cpu, wall = [r["cpu_ms"] for r in rows], [r["ms"] for r in rows]
        out |= {"cpu_p50_ms": pct(cpu, 0.5), "cpu_p95_ms": pct(cpu, 0.95), "p50_ms": pct(wall, 0.5),
                "p95_ms": pct(wall, 0.95)}
    return out


def scored(lists: Sequence[Sequence[int]], questions: Sequence[Question], ids: Ids) -> dict[str, Any]:
    """The figures of ranked lists made elsewhere (the reference methods)."""
    return summarise([{"conversation": q.conversation, "category": q.category, "ranks": ranks(list(order[:20]), q, ids)}
                      for q, order in zip(questions, lists, strict=True)])


def groups(quick: bool) -> Sequence[Sequence[int]]:
    return build.DIALOGUE_GROUPS[:QUICK_WORKSPACES] if quick else build.DIALOGUE_GROUPS


def eras(quick: bool) -> Sequence[int]:
    """The headline's memory: all ten eras (--quick: the first group's five)."""
    return groups(quick)[0] if quick else build.DIALOGUE_ERAS


def dialogue_bench(quick: bool, fused_only: bool = False) -> dict[str, Any]:
    """One memory of all the eras, each era's questions searched in it as it was when they are asked
    (`build.dialogue_moments`: the turns before them); beside it, as labelled rows of the shipped
    ranking, the two groups of five eras asked then ("fused_groups_then") and every question against
    its group's whole workspace, which also holds the years after it (WHOLE), as measured before.
    `fused_only`: the shipped ranking and its halves alone (a change's measure, in a third of the time)."""
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    turns_n, searched = 0, []
    for group in groups(quick):
        for label, made in ((WHOLE, [build.dialogue_workspace(group)]), (GROUPS, build.dialogue_moments(group))):
            for settings, questions, ids, _ in made:
                with contextlib.closing(open_searcher(settings)) as searcher:
                    rows[label] += _rows(searcher, questions, ids, True)
    for settings, questions, ids, turns in build.dialogue_moments(eras(quick)):
        turns_n = max(turns_n, len(turns))
        searched += [len(turns)] * len(questions)
        searcher = open_searcher(settings)
        try:
            for label, use_dense in (("lexical", False), ("fused", True)):
                if label == "fused" or not fused_only:
                    rows[label] += _rows(searcher, questions, ids, use_dense)
            if fused_only:
                continue
            rows["fused_plain"] += _plain(searcher, questions, ids)
            ref = reference.build(turns, build.CACHE, embed=searcher.dense is not None)
            vectors = np.stack([searcher.dense.embedder.query(q.question) for q in questions]) \
                if searcher.dense is not None else None
            for q_i, q in enumerate(questions):
                rows["reference_fts5"].append(_row(q, ref.fts5(q.question), ids))
                if vectors is not None:
                    rows["reference_rrf"].append(_row(q, ref.rrf(q.question, vectors[q_i]), ids))
        finally:
            searcher.close()
    # A constant changed to fit these questions is judged on the half it was not fitted on (the same
    # questions in every row, in the same order: eras in order, each era's questions in order).
    tuning = set(random.Random(SPLIT_SEED).sample(range(len(rows["fused"])), len(rows["fused"]) // 2))
    halves = {f"{label}_{half}": [r for i, r in enumerate(rows[label]) if (i in tuning) == (half == "tuning")]
              for label in ("fused", GROUPS, WHOLE) for half in ("tuning", "held_out")}
    return {"turns": turns_n, "eras": len(eras(quick)), "searched_turns_mean": round(statistics.mean(searched)),
            "searched_turns": [min(searched), max(searched)], "asked": "in one memory as of each question's moment",
            **{label: summarise(r) for label, r in (rows | halves).items()}}


def _plain(searcher: Searcher, questions: Sequence[Question], ids: Ids) -> list[dict[str, Any]]:
    """The same fusion without the ranking policies (specificity, neighbours, event-placed periods)
    and with equal weights: the ranking as it was before them, on the same vectors."""
    dense = searcher.dense
    searcher.policies = False
    if dense is not None:
        searcher.dense = Dense(dense.embedder, dense.vectors, 1.0)
    try:
        return _rows(searcher, questions, ids, True)
    finally:
        searcher.policies, searcher.dense = True, dense


def _row(q: Question, order: Sequence[int], ids: Ids) -> dict[str, Any]:
    return {"conversation": q.conversation, "category": q.category, "ranks": ranks(list(order[:20]), q, ids)}


def _rows(searcher: Searcher, questions: Sequence[Question], ids: Ids, use_dense: bool) -> list[dict[str, Any]]:
    for q in questions[:10]:  # warm caches
        searcher.search(q.question, q.asked_at, 20, use_dense=use_dense)
    rows = []
    for q in questions:
        started, cpu = time.perf_counter(), time.thread_time()
        hits = searcher.search(q.question, q.asked_at, 20, use_dense=use_dense)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
        rows.append(_row(q, [h.id for h in hits if h.kind == "episode"], ids) | {"ms": wall * 1000,
                                                                                  "cpu_ms": cpu * 1000})
    return rows


def small(quick: bool) -> dict[str, Any]:
    settings, questions, ids = build.small(2 if quick else None)
    searcher = open_searcher(settings)
    try:
        return {"turns": len(ids), "lexical": evaluate(searcher, questions, ids, use_dense=False),
                "fused": evaluate(searcher, questions, ids, use_dense=True)}
    finally:
        searcher.close()


def scale(quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 1_000_000
    _, questions = build.benchmark()
    if quick:
        questions = questions[::5]
    out: dict[str, Any] = {"filler_turns": n, "filler_learnings": n}
    for where in ("old", "new"):
        settings, ids, build_s = build.scale(n, where)
        searcher = open_searcher(settings, lexical=True)
        try:
            out[where] = evaluate(searcher, questions, ids, use_dense=False) | {"index_build_s": build_s}
        finally:
            searcher.close()
    out["gap_points"] = round(100 * abs(out["old"]["r@10"] - out["new"]["r@10"]), 1)
    return out


def auto_recall_bench(quick: bool) -> dict[str, Any]:
    """What auto-recall sends, through the runtime's own path (`service.auto_recalled`) against the boot
    prompt of one memory of all the eras as it was when the question is asked (`build.dialogue_moments`): for each
    question (asked in a new session), whether its evidence is in the block; for each message with nothing to
    recall (asked of the whole memory), whether a block is sent at all. With both
    retrievers, and (under "lexical") with words alone."""
    fused = _auto_recall(quick, lexical=False)
    words = _auto_recall(quick, lexical=True)
    return {**fused, "lexical": {k: words[k] for k in ("evidence_in_block", "unrelated_with_block", "tokens_mean")}}


def _auto_recall(quick: bool, lexical: bool) -> dict[str, Any]:
    from sprite_os.memory.files import MemoryFiles
    from sprite_os.memory.loader import boot_prompt_now
    from sprite_os.memory.memory_store import MemoryDB
    from sprite_os.memory.recall import auto
    from sprite_os.memory.transcript_store import TranscriptDB

    rows: list[dict[str, Any]] = []
    tokens: list[int] = []
    unrelated: list[bool] = []
    # one memory of all the eras; the messages with nothing to recall asked of it whole (its last moment:
    # the most turns to match)
    moments = build.dialogue_moments(eras(quick))
    for i, (settings, questions, ids, _) in enumerate(moments):
        memory, transcript = MemoryDB(settings.layout.memory_db), TranscriptDB(settings.layout.transcript_db)
        boot = auto.normalise(boot_prompt_now(MemoryFiles(settings.layout), memory, transcript, questions[0].asked_at))
        memory.close()
        transcript.close()
        searcher = open_searcher(settings, lexical=lexical)
        budget = settings.auto_recall_tokens
        try:
            for q in questions:
                hits = auto_recalled(searcher, q.question, q.asked_at, None, boot, budget)
                rows.append(_row(q, [h.id for h in hits if h.kind == "episode"], ids))
                tokens.append(auto.tokens(hits))
            unrelated += [bool(auto_recalled(searcher, m, questions[-1].asked_at, None, boot, budget))
                          for m in (dialogue.unrelated() if i == len(moments) - 1 else [])]
        finally:
            searcher.close()
    return {"questions": len(rows), "evidence_in_block": found_at(rows, BLOCK),
            "all_evidence_in_block": found_at(rows, BLOCK, True),
            "by_category": {c: found_at([r for r in rows if r["category"] == c], BLOCK)
                            for c in sorted({r["category"] for r in rows})},
            "tokens_mean": round(statistics.mean(tokens), 1), "tokens_p95": pct([float(t) for t in tokens], 0.95),
            "tokens_max": max(tokens), "unrelated_messages": len(unrelated),
            "unrelated_with_block": round(sum(unrelated) / max(1, len(unrelated)), 3)}


async def _auto_recall_cost(quick: bool) -> dict[str, Any]:
    """What auto-recall adds to a turn: the server's own call (a thread hop, the search, the floor,
    the budget), with the dense retriever and without."""
    from devkit.harness import wait_for
    from sprite_os.db_worker import Worker
    from sprite_os.memory.memory_store import MemoryDB
    from sprite_os.memory.recall.service import RecallService
    from sprite_os.memory.transcript_store import TranscriptDB

    settings, questions, ids, _ = build.dialogue_workspace(groups(quick)[0])
    out: dict[str, Any] = {}
    for label, weight in (("fused", settings.recall_dense_weight), ("lexical", 0.0)):
        s = build.settings_for(settings.workspace, recall_dense_weight=weight)
        transcript = Worker("transcript", lambda s=s: TranscriptDB(s.layout.transcript_db))
        memory = Worker("memory", lambda s=s: MemoryDB(s.layout.memory_db))
        service = RecallService(s, transcript, memory)
        await service.start()
        await asyncio.wait_for(service.indexer.current.wait(), 60)
        if weight:
            await wait_for(lambda s=service: s.indexer.health.embedded >= len(ids), 120)  # the stored vectors load
        ms, added = [], []
        for q in questions[:300]:
            started = time.perf_counter()
            found = await service.auto_recall(q.question, "the-current-session", "t")
            ms.append((time.perf_counter() - started) * 1000)
            added.append(found.tokens if found else 0)
        out[label] = {"turns": len(ms), "p50_ms": pct(ms, 0.5), "p95_ms": pct(ms, 0.95),
                      "recalled_share": round(sum(1 for a in added if a) / len(added), 3),
                      "tokens_mean": round(statistics.mean(added), 1), "tokens_max": max(added)}
        await service.stop()
        await asyncio.gather(transcript.close(), memory.close())
    return out


MOMENTS = (0.25, 0.5, 0.75)


def backfill(quick: bool) -> dict[str, Any]:
    """Vectors embedded in the server's order (every other turn first, each pass newest first), stopped
    at each moment: the questions whose evidence has no vector yet, against the same questions with their evidence embedded (the same
    number of vectors, embedded oldest first) and against word search alone."""
    from sprite_os.memory.recall import episodes as ep
    from sprite_os.memory.recall.backlog import first_pass

    out: dict[str, Any] = {}
    rows: dict[tuple[float, str], list[dict[str, Any]]] = defaultdict(list)
    below = 0
    for group in groups(quick):
        settings, questions, ids, _ = build.dialogue_workspace(group)
        searcher = open_searcher(settings)
        dense = searcher.dense
        if dense is None:
            return {"unavailable": "no dense retriever"}
        every = list(range(1, len(ids) + 1))
        embedded = [i for i, has in zip(every, dense.vectors.has(every), strict=True) if has]
        found = ep.get(searcher.conn, embedded)
        stored = list(zip(embedded, [found[i].at for i in embedded], dense.vectors.matrix(embedded), strict=True))
        # the server's order (indexer.py): every other turn of the backlog, newest first, then the rest
        last: dict[str, int] = defaultdict(int)
        for e in found.values():
            last[e.session_id] = max(last[e.session_id], e.turn)
        order = sorted(stored, key=lambda s: (not first_pass(found[s[0]].turn, last[found[s[0]].session_id]), -s[0]))
        try:
            for moment in MOMENTS:
                n = int(moment * len(stored))
                newest = _store(settings.workspace / "backfill" / f"newest-{moment}", order[:n])
                oldest = _store(settings.workspace / "backfill" / f"oldest-{moment}", stored[:n])
                has = {i for i, _, _ in order[:n]}
                lacking = [q for q in questions if all(ids[e] not in has for e in map(tuple, q.evidence))]
                lexical = _rows(searcher, lacking, ids, use_dense=False)
                for label, vectors in (("without", newest), ("with", oldest)):
                    searcher.dense = Dense(dense.embedder, vectors, dense.weight)
                    found = _rows(searcher, lacking, ids, use_dense=True)
                    rows[(moment, label)] += found
                    if label == "without":
                        below += sum(1 for f, w in zip(found, lexical, strict=True) for a, b in
                                     zip(f["ranks"], w["ranks"], strict=True) if b is not None and (a is None or a > b))
                rows[(moment, "words")] += lexical
        finally:
            searcher.dense = dense
            searcher.close()
    for moment in MOMENTS:
        without, with_, words = (summarise(rows[(moment, k)]) for k in ("without", "with", "words"))
        out[f"{int(moment * 100)}%"] = {
            "questions": without["questions"], "r@10_without_vector": without["r@10"],
            "r@10_with_vector": with_["r@10"], "r@10_words_alone": words["r@10"],
            "gap_points": round(100 * (with_["r@10"] - without["r@10"]), 1),
            "below_words_points": round(100 * max(0.0, words["r@10"] - without["r@10"]), 1)}
    out["evidence_ranked_below_words_alone"] = below
    return out


def _store(path: Path, stored: Sequence[tuple[int, float, Any]]) -> VectorReader:
    """A vector store holding just `stored` (id, date, vector), made again each run."""
    shutil.rmtree(path, ignore_errors=True)
    writer = VectorWriter(path, build.MODEL)
    if stored:
        writer.add([i for i, _, _ in stored], [a for _, a, _ in stored], np.stack([v for _, _, v in stored]))
    writer.close()
    return VectorReader(path)


PARTS = {"dialogue": lambda quick: dialogue_bench(quick), "dialogue_fused": lambda quick: dialogue_bench(quick, True),
         "small": small, "auto_recall": auto_recall_bench, "backfill": backfill, "scale": scale}


def main(argv: Sequence[str]) -> None:
    """`python -m bench.recall.run PART... [--quick]`: some parts alone, their results printed (nothing
    written): dialogue, dialogue_fused (the shipped ranking and its halves alone), small, auto_recall,
    backfill, scale."""
    import json

    quick = "--quick" in argv
    wanted = [a for a in argv if a != "--quick"]
    if not wanted or any(a not in PARTS for a in wanted):
        raise SystemExit(f"usage: python -m bench.recall.run {{{','.join(PARTS)}}}... [--quick]")
    print(json.dumps({part: PARTS[part](quick) for part in wanted}, indent=1))


async def recall(quick: bool) -> dict[str, Any]:
    return {"dialogue": await asyncio.to_thread(dialogue_bench, quick), "small": await asyncio.to_thread(small, quick),
            "auto_recall": await asyncio.to_thread(auto_recall_bench, quick),
            "auto_recall_cost": await _auto_recall_cost(quick),
            "backfill": await asyncio.to_thread(backfill, quick),
            "scale": await asyncio.to_thread(scale, quick)}


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
