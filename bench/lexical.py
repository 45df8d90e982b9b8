"""Word search at scale when every question names someone half the memory mentions.

    python -m bench --only lexical [--quick]

The recall benchmark's questions among N filler turns and N filler learnings (bench/recall/build.py's
filler, N = 1,000,000; --quick: 20,000), with "Dana" added to every other document and to every
question: a name that half the documents hold, as a person's partner or child is in a real
memory. Each question is asked through `recall.Searcher` (lexical: tantivy BM25 with neighbours,
what search_memory runs first), and also without the name, side by side, and with the name again
searched exactly (every posting read, not the common words' shortcut: common_words.py), with the
share of the top 10 the shortcut keeps and each way's recall@10: each question asked the three ways
in turn, each way first as often as the others. Latency is the searching
thread's CPU time (the machine is shared), p50 / p95.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.recall import build
from bench.recall.generate import Turn
from bench.recall.run import pct
from sprite_os.commands.memory_search import open_searcher
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.recall import episodes as ep
from sprite_os.memory.recall.documents import build as build_index
from sprite_os.memory.recall.documents import write_marks
from sprite_os.memory.recall.service import index_path

NAME = "Dana"
QUESTIONS = 1_000


def episode_ids(turns: Sequence[Turn]) -> dict[tuple[str, int], int]:
    """Each benchmark turn's episode id in the workspace: the newest, after the filler."""
    return {(t.session, t.turn): build.NEW_BASE + i for i, t in enumerate(turns)}


def workspace(n: int) -> Path:
    """The benchmark's turns as the newest among n filler turns and n learnings, half of everything
    naming NAME; built once and cached."""
    turns, _ = build.benchmark()
    ids = episode_ids(turns)
    path = build.CACHE / f"lexical-name-{n}"
    built = path / "built"
    if built.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    settings = build.settings_for(path)
    settings.layout.ensure()
    shutil.copyfile(build.filler(n), settings.layout.memory_db)
    memory = MemoryDB(settings.layout.memory_db)
    ep.add(memory.conn, [ep.Episode(ids[(t.session, t.turn)], t.session, t.turn, t.timestamp, f"{t.user}\n{t.assistant}")
                         for t in turns])
    memory.conn.execute(f"UPDATE episodes SET text = text || ' {NAME}' WHERE id % 2 = 0")
    memory.conn.execute(f"UPDATE learnings SET content = content || ' {NAME}' WHERE id % 2 = 0")
    write_marks(memory.conn, build_index(memory.conn, index_path(settings.layout.memory_dir), build.progress))
    memory.close()
    built.write_text("ok\n")
    return path


def lexical(quick: bool) -> dict[str, Any]:
    n = 20_000 if quick else 1_000_000
    turns, questions = build.benchmark()
    placed = episode_ids(turns)
    questions = questions[:: max(1, len(questions) // QUESTIONS)][:QUESTIONS]
    settings = build.settings_for(workspace(n))
    searcher = open_searcher(settings, lexical=True)
    index = searcher.index
    assert index is not None
    docs = index.documents
    out: dict[str, Any] = {"documents": docs, "questions": len(questions)}
    ways = {  # each way's suffix to the question, and where the index splits its common words from
        "with_name": (f" {NAME}?", index.split_from),
        "with_name_exact": (f" {NAME}?", 1 << 62),  # out of reach: every posting read, exact BM25
        "without": ("", index.split_from),
    }
    cpu: dict[str, list[float]] = {label: [] for label in ways}
    tops: dict[str, list[list[tuple[str, int]]]] = {label: [] for label in ways}
    try:
        for q in questions[:20]:  # warm the page cache, each way
            for suffix, index.split_from in ways.values():
                searcher.search(q.question + suffix, q.asked_at, 10, use_dense=False)
        # side by side: each question asked every way in turn, each way first, second and third as often,
        # so that what the machine does meanwhile, and what the way before left in the caches, weigh alike
        labels = list(ways)
        for i, q in enumerate(questions):
            for label in labels[i % 3:] + labels[:i % 3]:
                suffix, index.split_from = ways[label]
                started = time.thread_time()
                hits = searcher.search(q.question + suffix, q.asked_at, 10, use_dense=False)
                cpu[label].append((time.thread_time() - started) * 1000)
                tops[label].append([(h.kind, h.id) for h in hits])
        for label in ways:
            found = sum(any(("episode", placed[e]) in top for e in q.evidence if e in placed)
                        for q, top in zip(questions, tops[label], strict=True))
            times = cpu[label]
            out[label] = {"cpu_p50_ms": pct(times, 0.5), "cpu_p95_ms": pct(times, 0.95), "cpu_max_ms": pct(times, 1.0),
                          "recall@10": round(found / len(questions), 3)}
        # how far the common words' shortcut strays from exact BM25: the share of each question's top 10 it keeps
        out["top10_kept"] = round(sum(len(set(a) & set(b)) / len(b) if b else float(not a) for a, b in
                                      zip(tops["with_name"], tops["with_name_exact"], strict=True)) / len(questions), 4)
        name_docs = index.index.searcher().doc_freq("text", NAME.lower())
        out["name_share"] = round(name_docs / docs, 3)
    finally:
        searcher.close()
    return out
