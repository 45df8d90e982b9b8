"""Rebuilding recall from transcript.db: the episodes, a new index swapped in, the missing embeddings.

Part of `memory rebuild` (after the curator has made the learnings again) and all of `memory
rebuild --index` (no curator call). The server must be stopped: it holds the index's writer.
Embeddings are stored, not derived: the vector store (.os/memory/vectors/) is kept (a full
rebuild replaces memory.db, not the store; vectors an older memory.db still held move into
it), and only the turns without one are embedded, newest first, in batches, reporting progress.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...config import Settings
from ...database import read_only
from ...logs import get_logger
from ..forget.jobs import named
from ..memory_store import MemoryDB
from ..transcript_store import TranscriptDB
from . import episodes as ep
from .dense import Embedder, load
from .documents import build, write_marks
from .index import building, swap_in
from .service import index_path, vectors_path
from .vectors import VectorWriter

REBUILD_EMBED_BATCH = 32  # turns embedded at once offline (the live indexer's batch is smaller)
CARRY_PAGE = 5_000  # turns told at once which turn their kept vector was made after
Progress = Callable[[str, int, int], None]
log = get_logger(__name__)


@dataclass
class RecallReport:
    episodes: int
    documents: int
    embedded: int  # turns embedded now
    vectors: int  # turns with a vector in all
    dense: str  # the model, or why there is none
    seconds: float
    warning: str = ""  # what the operator must know of it (the kept vectors to be made again), or ""


def _episodes(memory: MemoryDB, transcript: TranscriptDB) -> int:
    """Every turn's episode, from transcript.db; a turn a forget not finished names, without its words (the
    transcript may hold them still: a forget an error cut short, which a full rebuild carried over into a
    memory.db with no episode of it). The next start finishes the forget."""
    held, last = named(memory), 0
    while found := transcript.after(last, 2_000):
        ep.add(memory.conn, [ep.wordless(o) if o.id in held else ep.from_observation(o) for o in found])
        last = found[-1].id
    return ep.count(memory.conn)


def _adopt(conn: sqlite3.Connection, writer: VectorWriter, model: str) -> None:
    """Vectors a memory.db still holds (from before the store) into the store, ids the turns'."""
    with contextlib.suppress(sqlite3.Error):  # an old memory.db without the table: nothing to keep
        cursor = conn.execute("SELECT v.id, coalesce(e.at, 0), v.vector FROM episode_vectors v "
                              "LEFT JOIN episodes e ON e.id = v.id WHERE v.model = ? ORDER BY v.id", (model,))
        while page := cursor.fetchmany(CARRY_PAGE):
            matrix = np.frombuffer(b"".join(bytes(v) for _, _, v in page), dtype=np.float32).reshape(len(page), -1)
            writer.add([int(i) for i, _, _ in page], [float(at) for _, at, _ in page], matrix)


@contextlib.contextmanager
def _open_set_aside(backup: Path) -> Iterator[sqlite3.Connection | None]:
    """The memory.db a full rebuild set aside was checkpointed then, so it is read as immutable: no lock,
    no -wal or -shm beside it (None: it can't be opened)."""
    try:
        old = read_only(backup, set_aside=True)
    except sqlite3.Error:
        yield None
        return
    with contextlib.closing(old):
        yield old


def _adopt_backup(backup: Path, writer: VectorWriter, model: str) -> None:
    with _open_set_aside(backup) as old:
        if old is not None:
            _adopt(old, writer, model)


def _carry_embedded_after(memory: MemoryDB, backup: Path) -> str:
    """Which turn each kept vector was made after, as the memory.db set aside says, a page at a time (nothing
    from one that predates it). All or nothing: a page that fails after others went in (a disk error)
    would leave the rest as the rebuild's own adds guessed, so every turn's vector is then to be made
    again (-1: lending nothing till it is). What went wrong, said to the operator, or "" when nothing did."""
    try:
        with _open_set_aside(backup) as old:
            if old is None or not ep.records_embedded_after(old):
                return ""
            cursor = old.execute("SELECT id, embedded_after FROM episodes WHERE embedded_after IS NOT NULL")
            while page := cursor.fetchmany(CARRY_PAGE):
                ep.carry_embedded_after(memory.conn, [(int(i), int(after)) for i, after in page])
    except sqlite3.Error as exc:
        ep.make_every_vector_again(memory.conn)
        log.warning("rebuild_vectors_made_again", error=str(exc), backup=str(backup))
        return (f"which turn each kept vector was made after could not be read from {backup.name} ({exc}): "
                "every turn's vector will be made again, at the server's next start")
    return ""


def rebuild_recall(settings: Settings, progress: Progress, backup: Path | None = None) -> RecallReport:
    started = time.monotonic()
    layout = settings.layout
    memory, transcript = MemoryDB(layout.memory_db), TranscriptDB(layout.transcript_db)
    try:
        episodes = _episodes(memory, transcript)
        warning = ""
        if backup is not None:  # the store's vectors are kept: so is which turn each was made after
            warning = _carry_embedded_after(memory, backup)
        target = index_path(layout.memory_dir)
        fresh = building(target)
        shutil.rmtree(fresh, ignore_errors=True)
        reached = build(memory.conn, fresh, progress)
        swap_in(fresh, target)
        write_marks(memory.conn, reached)
        embedder, status = load(settings.embedding_model) if settings.recall_dense_weight > 0 else (None, None)
        embedded = vectors = 0
        if embedder is not None and status is not None and status.model is not None:
            writer = VectorWriter(vectors_path(layout.memory_dir, status.model), status.model)
            _adopt(memory.conn, writer, status.model)
            if backup is not None:
                _adopt_backup(backup, writer, status.model)
            ep.drop_legacy(memory.conn, status.model, None)
            embedded = _embed_missing(memory, embedder, writer, progress)
            vectors = len(writer)
        dense = (status.model or status.detail) if status else "switched off (SPRITE_RECALL_DENSE_WEIGHT=0)"
        return RecallReport(episodes, episodes + reached.learnings, embedded, vectors, dense or "",
                            time.monotonic() - started, warning)
    finally:
        memory.close()
        transcript.close()


def _embed_missing(memory: MemoryDB, embedder: Embedder, writer: VectorWriter, progress: Progress) -> int:
    """Embed the episodes without a vector, newest first."""
    total = ep.count(memory.conn)
    missing, done, below = max(0, total - len(writer)), 0, ep.max_id(memory.conn)
    while below > 0 and (ids := ep.ids_between(memory.conn, 1, below, 4_096)):
        todo = [i for i, has in zip(ids, writer.has(ids), strict=True) if not has]
        for start in range(0, len(todo), REBUILD_EMBED_BATCH):
            batch, after = ep.texts_to_embed(memory.conn, todo[start:start + REBUILD_EMBED_BATCH])
            if not batch:  # forgotten turns only
                continue
            vectors = embedder.passages([text for _, _, text in batch])
            done += writer.add([i for i, _, _ in batch], [at for _, at, _ in batch], vectors)
            ep.record_embedded_after(memory.conn, after)
            progress("embedded turns", done, missing)
        below = ids[-1] - 1
    return done
