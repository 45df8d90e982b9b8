"""The reads behind past sessions and a session's turns: transcript.db's sessions and turns,
and memory.db's summaries. Each function runs on its store's worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from ..database import marks, rows
from ..memory.memory_store import MemoryDB, held_back
from ..memory.transcript_store import (
    ClientObservation,
    NewObservation,
    Observation,
    Tombstone,
    TranscriptDB,
)
from .memory_frames import ToolCall
from .session_frames import PastTurn, SessionInfo

FIRST_LINE_CHARS = 160
TOOL_CHARS = 300  # of each tool call's input and output, as a live turn shows it
PAGE_CHARS = 1_000_000  # a page of turns stops short of this much text: frames stay small


class SessionRow(msgspec.Struct, frozen=True):
    id: str
    started_at: float
    ended_at: float | None
    turns: int
    first_message: str | None
    cost_usd: float | None
    forgotten: int


_SESSIONS = """SELECT s.id, s.started_at, s.ended_at, s.observation_count AS turns,
    (SELECT o.user_message FROM observations o WHERE o.session_id = s.id AND o.user_message != ''
     ORDER BY o.sequence_num LIMIT 1) AS first_message,
    (SELECT sum(o.cost_usd) FROM observations o WHERE o.session_id = s.id) AS cost_usd,
    (SELECT count(*) FROM forgotten_turns f WHERE f.session_id = s.id) AS forgotten
  FROM sessions s"""


def sessions_page(db: TranscriptDB, before: str | None, limit: int) -> tuple[list[SessionRow], bool]:
    """Sessions that had a turn, newest first: `limit` of them after `before`, and whether more follow."""
    where = "WHERE s.observation_count > 0"
    args: list[float | str] = []
    if before is not None:
        anchor = db.conn.execute("SELECT started_at, id FROM sessions WHERE id = ?", (before,)).fetchone()
        if anchor is not None:
            where += " AND (s.started_at, s.id) < (?, ?)"
            args = [anchor[0], anchor[1]]
    found = rows(db.conn.execute(f"{_SESSIONS} {where} ORDER BY s.started_at DESC, s.id DESC LIMIT ?",
                                 [*args, limit + 1]), SessionRow)
    return found[:limit], len(found) > limit


def session_row(db: TranscriptDB, session_id: str) -> SessionRow | None:
    found = rows(db.conn.execute(f"{_SESSIONS} WHERE s.id = ?", (session_id,)), SessionRow)
    return found[0] if found else None


def sessions_of(db: TranscriptDB, observation_ids: Sequence[int], turn_ids: Sequence[str]) -> set[str]:
    """The sessions the turns named (by id, or by their wire id) were recorded in."""
    ids, wire = list(observation_ids), list(turn_ids)
    return {sid for (sid,) in db.conn.execute(
        f"SELECT DISTINCT session_id FROM observations WHERE id IN ({marks(ids)}) OR turn_id IN ({marks(wire)})",
        [*ids, *wire])}


def turns_page(db: TranscriptDB, session_id: str, before: int | None,
               limit: int) -> tuple[list[ClientObservation], bool]:
    """The session's turns before turn `before` (None: its newest), oldest first, and whether more precede."""
    where = "o.session_id = ?"
    args: list[str | int] = [session_id]
    if before is not None:
        where += " AND o.sequence_num < ?"
        args.append(before)
    found = rows(db.conn.execute(
        f"""SELECT o.*, c.client_id FROM observations o LEFT JOIN turn_clients c
            ON c.session_id = o.session_id AND c.sequence_num = o.sequence_num
            WHERE {where} ORDER BY o.sequence_num DESC LIMIT ?""", [*args, limit + 1]), ClientObservation)
    return list(reversed(found[:limit])), len(found) > limit


def summaries(db: MemoryDB, session_ids: Sequence[str]) -> dict[str, str]:
    """The curator's newest SUMMARY of each of these sessions (not forgotten; none a forget job holds back:
    memory_store.held_back)."""
    if not session_ids:
        return {}
    found = db.conn.execute(f"SELECT session_id, content FROM learnings WHERE type = 'SUMMARY' AND forgotten_at "
                            f"IS NULL AND session_id IN ({marks(session_ids)}) AND NOT {held_back()} "
                            "ORDER BY id", list(session_ids))
    return {sid: content for sid, content in found}


def first_line(text: str | None) -> str:
    line = next((part.strip() for part in (text or "").splitlines() if part.strip()), "")
    return line if len(line) <= FIRST_LINE_CHARS else line[: FIRST_LINE_CHARS - 1] + "…"


def info(row: SessionRow, summary: str | None, current: bool, waiting: int = 0, forgotten: int = 0) -> SessionInfo:
    return SessionInfo(id=row.id, started_at=row.started_at, ended_at=row.ended_at, turns=row.turns + waiting,
                       first_line=first_line(row.first_message), summary=summary,
                       cost_usd=round(row.cost_usd, 10) if row.cost_usd is not None else None, current=current,
                       forgotten=forgotten or row.forgotten)


def _cut(value: Any, chars: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= chars else text[: chars - 1] + "…"


def tool_calls(tool_calls_json: str, chars: int = TOOL_CHARS) -> list[ToolCall]:
    """A turn's recorded tool calls, each input and output cut to `chars`. Whatever the column
    holds (an older import, a hand-made row): what is not a JSON list of objects shows no call."""
    try:
        calls = json.loads(tool_calls_json)
    except ValueError:
        return []
    if not isinstance(calls, list):
        return []
    return [ToolCall(name=str(c.get("name", "?")), input=_cut(c.get("input", ""), chars),
                     output=_cut(c.get("output", ""), chars), is_error=bool(c.get("is_error")))
            for c in calls if isinstance(c, dict)]


def past_turn(obs: ClientObservation | NewObservation, tombstone: Tombstone | None = None) -> PastTurn:
    return PastTurn(observation_id=obs.id if isinstance(obs, Observation) else None, turn_id=obs.turn_id,
                    client_id=obs.client_id, turn=obs.sequence_num, at=obs.timestamp, user_message=obs.user_message,
                    agent_response=obs.agent_response, tool_calls=tool_calls(obs.tool_calls_json),
                    status=obs.status, cost_usd=obs.cost_usd,
                    forgotten_at=tombstone.forgotten_at if tombstone is not None else None)


def within_budget(turns: list[PastTurn], more: bool) -> tuple[list[PastTurn], bool]:
    """The newest of `turns` whose text fits PAGE_CHARS (always one): a page never makes a huge frame."""
    kept: list[PastTurn] = []
    size = 0
    for turn in reversed(turns):
        size += len(turn.user_message) + len(turn.agent_response) + sum(
            len(c.input) + len(c.output) for c in turn.tool_calls)
        if kept and size > PAGE_CHARS:
            return list(reversed(kept)), True
        kept.append(turn)
    return list(reversed(kept)), more
