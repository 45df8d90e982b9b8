"""The database reads behind the console's memory requests: learnings with their source
turns, one recorded turn, and what the curator spent. Each function runs on its store's
worker thread (`Worker.call`), so the event loop never waits on SQLite.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from ..database import marks, rows
from ..memory.memory_store import MemoryDB, held_back
from ..memory.recall.searcher import RecallHit
from ..memory.schema import PENDING, PROCESSED
from ..memory.transcript_store import TranscriptDB
from .memory_frames import BatchInfo, LearningHit, Spend, TurnRecord, TurnRef
from .session_queries import tool_calls

TOOL_TEXT_CHARS = 2_000  # of each tool call's input and output shown with a turn


class LearningRow(msgspec.Struct, frozen=True):
    id: int
    type: str
    content: str
    created_at: float
    confidence: float
    session_id: str | None
    source_observation_id: int | None
    forgotten_at: float | None


_LEARNING = "id, type, content, created_at, confidence, session_id, source_observation_id, forgotten_at"


def learnings_by_id(db: MemoryDB, ids: Sequence[int]) -> dict[int, LearningRow]:
    found = rows(db.conn.execute(f"SELECT {_LEARNING} FROM learnings WHERE id IN ({marks(ids)})", list(ids)),
                 LearningRow)
    return {row.id: row for row in found}


def listed_learnings(db: MemoryDB, types: Sequence[str], forgotten: bool, limit: int) -> list[int]:
    """Without a query: the newest learnings, or the newest forgotten (by when they were forgotten); never one a
    forget job holds back (memory_store.held_back: a forget cut short may have left it)."""
    where = "forgotten_at IS NOT NULL" if forgotten else "forgotten_at IS NULL"
    where += f" AND NOT {held_back()}"
    order = "forgotten_at DESC, id DESC" if forgotten else "id DESC"
    if types:
        where += f" AND type IN ({marks(types)})"
    found = db.conn.execute(f"SELECT id FROM learnings WHERE {where} ORDER BY {order} LIMIT ?", [*types, limit])
    return [r for (r,) in found]


def turn_refs(db: TranscriptDB, ids: Sequence[int]) -> dict[int, TurnRef]:
    found = db.conn.execute(f"SELECT id, session_id, sequence_num, timestamp FROM observations "
                            f"WHERE id IN ({marks(ids)})", list(ids))
    return {r[0]: TurnRef(observation_id=r[0], session_id=r[1], sequence_num=r[2], timestamp=r[3]) for r in found}


def hit(row: LearningRow, score: float | None, refs: dict[int, TurnRef]) -> LearningHit:
    source = row.source_observation_id
    return LearningHit(kind="learning", id=row.id, type=row.type, content=row.content, created_at=row.created_at,
                       confidence=row.confidence, score=score, session_id=row.session_id,
                       turn=refs.get(source) if source is not None else None, forgotten_at=row.forgotten_at)


def episode_hit(h: RecallHit) -> LearningHit:
    """A raw turn found by search, as the console lists hits: kind "episode", type EPISODE."""
    turn = (TurnRef(observation_id=h.id, session_id=h.session_id, sequence_num=h.turn, timestamp=h.at)
            if h.session_id is not None and h.turn is not None else None)
    return LearningHit(kind="episode", id=h.id, type=h.type, content=h.snippet, created_at=h.at, confidence=1.0,
                       score=h.score, session_id=h.session_id, turn=turn, forgotten_at=None)


def turn_record(db: TranscriptDB, observation_id: int) -> TurnRecord | None:
    found = db.get([observation_id])
    if not found:
        return None
    obs = found[0]
    tools = tool_calls(obs.tool_calls_json, TOOL_TEXT_CHARS)
    state: Literal["pending", "processed", "stale"] = (
        "pending" if obs.processed == PENDING else "processed" if obs.processed == PROCESSED else "stale")
    return TurnRecord(observation_id=obs.id, session_id=obs.session_id, sequence_num=obs.sequence_num,
                      timestamp=obs.timestamp, user_message=obs.user_message, tool_calls=tools,
                      agent_response=obs.agent_response, processed=state)


def spend_since(db: MemoryDB, since: float) -> Spend:
    return Spend(**msgspec.structs.asdict(db.batch_totals(since)))


def last_batch(db: MemoryDB) -> BatchInfo | None:
    found = db.recent_batches(1)
    if not found:
        return None
    b = found[0]
    return BatchInfo(id=b.id, created_at=b.created_at, trigger=b.trigger, status=b.status,
                     turns=len(b.observation_ids), learnings_added=b.learnings_added, cost_usd=b.cost_usd,
                     error=b.error)
