"""Learnings' FTS5 index over 1,000,000 learnings (query building, the database thread, BM25), on a
corpus whose word frequencies follow Zipf's law like real text. This is search's fallback, used only
while the recall index is missing (it is being rebuilt): the agent's search_memory runs on the recall
index (tantivy, and the dense retriever), measured by bench/recall."""

from __future__ import annotations

import asyncio
import itertools
import random
import sqlite3
import time
from pathlib import Path
from typing import Any

from bench.stats import summary_ms
from sprite_os.db_worker import Worker
from sprite_os.memory.memory_store import MemoryDB, content_key
from sprite_os.memory.recall.learnings import search_learnings, search_terms

CACHE = Path(__file__).resolve().parent / "results" / "cache"
TYPES = ("FACT", "PREFERENCE", "CORRECTION", "PATTERN", "ACTION", "TOOL_INSTALL")
QUERIES = 1000


def _vocabulary(rng: random.Random, size: int = 30_000) -> list[str]:
    consonants, vowels = "bcdfghjklmnprstvwz", "aeiou"
    words: set[str] = set()
    while len(words) < size:
        n = rng.choice((1, 2, 2, 3, 3, 4))
        words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(n)) + rng.choice(("", "s", "n")))
    return sorted(words)


class Corpus:
    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.words = _vocabulary(self.rng)
        # Zipf: the k-th most common word appears ~1/k as often as the first.
        self.cumulative = list(itertools.accumulate(1 / (k + 1) for k in range(len(self.words))))

    def sentence(self, lo: int, hi: int) -> str:
        return " ".join(self.rng.choices(self.words, cum_weights=self.cumulative, k=self.rng.randint(lo, hi)))


def build(path: Path, rows: int) -> None:
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    tmp.unlink(missing_ok=True)
    MemoryDB(tmp).close()  # the real schema, FTS triggers included
    conn = sqlite3.connect(tmp)
    corpus = Corpus()
    now = time.time()
    conn.execute("BEGIN")
    batch = []
    for n in range(rows):
        text = corpus.sentence(6, 16)
        batch.append((now - n, "bench", TYPES[n % len(TYPES)], text, None, 0.8, content_key(f"{n} {text}")))
        if len(batch) == 10_000:
            conn.executemany("INSERT INTO learnings (created_at, session_id, type, content, source_observation_id,"
                             " confidence, content_key) VALUES (?, ?, ?, ?, ?, ?, ?)", batch)
            batch.clear()
    conn.executemany("INSERT INTO learnings (created_at, session_id, type, content, source_observation_id,"
                     " confidence, content_key) VALUES (?, ?, ?, ?, ?, ?, ?)", batch)
    conn.execute("COMMIT")
    conn.execute("INSERT INTO learnings_fts(learnings_fts) VALUES ('optimize')")
    conn.close()
    tmp.rename(path)


async def search(rows: int = 1_000_000) -> dict[str, Any]:
    path = CACHE / f"learnings-{rows}.db"
    started = time.perf_counter()
    build(path, rows)
    built_s = time.perf_counter() - started
    worker = Worker("memory", lambda: MemoryDB(path))
    corpus = Corpus(seed=99)
    questions = [f"what about {corpus.sentence(2, 6)}?" for _ in range(QUERIES)]
    for q in questions[:20]:  # warm the page cache
        await worker.call(lambda m, q=q: search_learnings(m, search_terms(q), 10))
    samples, hits = [], 0
    for q in questions:
        t = time.perf_counter()
        terms = search_terms(q)
        result = await worker.call(lambda m, terms=terms: search_learnings(m, terms, 10)) if terms else []
        samples.append(time.perf_counter() - t)
        hits += bool(result)
    await worker.close()
    return {"learnings": rows, "queries": QUERIES, "queries_with_hits": hits, "db_mb": round(path.stat().st_size / 2**20),
            "build_s": round(built_s, 1), **summary_ms(samples)}


if __name__ == "__main__":
    print(asyncio.run(search()))
