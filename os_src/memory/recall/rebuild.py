"""Rebuilding recall from transcript.db: the episodes, a new index swapped in, the missing embeddings.

Part of `memory rebuild` (after the curator has made the learnings again) and all of `memory
rebuild --index` (no curator call). The server must be stopped: it holds the index's writer.
Embeddings are stored, not derived: vectors of the same model are kept (or copied from the
memory.db a full rebuild set aside), and only the turns without one are embedded, in batches,
reporting progress.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...config import Settings
from ...database import transaction
from ..memory_store import MemoryDB
from ..transcript_store import TranscriptDB
from . import episodes as ep
from .dense import Embedder, load, to_blob
from .documents import build, write_marks
from .index import swap_in
from .service import index_path

REBUILD_EMBED_BATCH = 32  # turns embedded at once offline (the live indexer's batch is smaller)
Progress = Callable[[str, int, int], None]


@dataclass
class RecallReport:
    episodes: int
    documents: int
    embedded: int  # turns embedded now
    vectors: int  # turns with a vector in all
    dense: str  # the model, or why there is none
    seconds: float


def _episodes(memory: MemoryDB, transcript: TranscriptDB) -> int:
    last = 0
    while found := transcript.after(last, 2_000):
        ep.add(memory.conn, [ep.from_observation(o) for o in found])
        last = found[-1].id
    return ep.count(memory.conn, None)[0]


def _copy_vectors(memory: MemoryDB, backup: Path, model: str) -> None:
    """Keep the vectors the set-aside memory.db holds for the same model (ids are the turns'). It was
    checkpointed when it was set aside, so it is read as immutable: no lock, no -wal or -shm beside it."""
    try:
        old = sqlite3.connect(f"file:{backup}?immutable=1", uri=True)
    except sqlite3.Error:
        return
    with contextlib.closing(old), contextlib.suppress(sqlite3.Error):
        cursor = old.execute("SELECT id, vector FROM episode_vectors WHERE model = ?", (model,))
        while page := cursor.fetchmany(5_000):
            with transaction(memory.conn) as c:
                c.executemany("INSERT OR IGNORE INTO episode_vectors (id, model, vector) SELECT ?, ?, ? "
                              "WHERE EXISTS (SELECT 1 FROM episodes WHERE id = ?)",
                              [(i, model, v, i) for i, v in page])


def rebuild_recall(settings: Settings, progress: Progress, backup: Path | None = None) -> RecallReport:
    started = time.monotonic()
    layout = settings.layout
    memory, transcript = MemoryDB(layout.memory_db), TranscriptDB(layout.transcript_db)
    try:
        episodes = _episodes(memory, transcript)
        target = index_path(layout.memory_dir)
        fresh = target.with_name(target.name + ".new")
        shutil.rmtree(fresh, ignore_errors=True)
        reached = build(memory.conn, fresh, progress)
        swap_in(fresh, target)
        write_marks(memory.conn, reached)
        embedder, status = load(settings.embedding_model) if settings.recall_dense_weight > 0 else (None, None)
        embedded = 0
        if embedder is not None and status is not None and status.model is not None:
            if backup is not None:
                _copy_vectors(memory, backup, status.model)
            embedded = _embed_missing(memory, embedder, status.model, progress)
        vectors = ep.count(memory.conn, status.model if status else None)[1]
        dense = (status.model or status.detail) if status else "switched off (SPRITE_RECALL_DENSE_WEIGHT=0)"
        return RecallReport(episodes, episodes + reached.learnings, embedded, vectors, dense or "",
                            time.monotonic() - started)
    finally:
        memory.close()
        transcript.close()


def _embed_missing(memory: MemoryDB, embedder: Embedder, model: str, progress: Progress) -> int:
    total, have = ep.count(memory.conn, model)
    missing, done, below = total - have, 0, math.inf
    while batch := ep.missing_vectors(memory.conn, model, 0, int(min(below, 1 << 62)), REBUILD_EMBED_BATCH):
        texts = [ep.embed_text(ep.previous(memory.conn, e), e) for e in batch]
        vectors = np.asarray(embedder.passages(texts), dtype=np.float32)
        ep.put_vectors(memory.conn, model, [(e.id, to_blob(v)) for e, v in zip(batch, vectors, strict=True)])
        done += len(batch)
        below = batch[-1].id
        progress("embedded turns", done, missing)
    return done
