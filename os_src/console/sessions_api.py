"""Past sessions and a session's turns, answered from what Sprite OS recorded: transcript.db,
the turns still on their way to it (the current session's newest), and memory.db's summaries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from . import session_frames as ps
from . import session_queries as q
from .requests import Handler, Request, RequestFailed

if TYPE_CHECKING:
    from ..memory.system import MemorySystem


class SessionsConsole:
    def __init__(self, system: MemorySystem, current_session: Callable[[], str]) -> None:
        self._system = system
        self._current = current_session

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return {ps.SessionsRequest: self._sessions, ps.SessionTurnsRequest: self._turns}

    async def _sessions(self, req: ps.SessionsRequest) -> ps.SessionsResult:
        found, more = await self._system.transcript.call(lambda t: q.sessions_page(t, req.before, req.limit))
        ids = [row.id for row in found]
        summaries = await self._system.memory.call(lambda m: q.summaries(m, ids))
        current = self._current()
        return ps.SessionsResult(request_id=req.request_id, more=more, sessions=[
            q.info(row, summaries.get(row.id), row.id == current) for row in found])

    async def _turns(self, req: ps.SessionTurnsRequest) -> ps.SessionTurnsResult:
        current = self._current()
        sid = req.session_id or current
        row, (recorded, more) = await self._system.transcript.call(
            lambda t: (q.session_row(t, sid), q.turns_page(t, sid, req.before, req.limit)))
        # The current session's newest turns may still be on their way to transcript.db.
        seen = {o.sequence_num for o in recorded}
        waiting = [o for o in self._system.writer.waiting()
                   if o.session_id == sid and o.sequence_num not in seen and (req.before is None or o.sequence_num < req.before)]
        if row is None and sid != current:
            raise RequestFailed("not_found", f"no recorded session {sid!r}")
        turns = sorted([*map(q.past_turn, recorded), *map(q.past_turn, waiting)], key=lambda t: t.turn)
        more = more or len(turns) > req.limit
        turns, more = q.within_budget(turns[-req.limit:], more)
        summary = await self._system.memory.call(lambda m: q.summaries(m, [sid])) if row is not None else {}
        session = (q.info(row, summary.get(sid), sid == current, len(waiting)) if row is not None
                   else ps.SessionInfo(id=sid, started_at=turns[0].at if turns else 0.0, ended_at=None,
                                       turns=len(waiting), first_line=q.first_line(turns[0].user_message) if turns else "",
                                       summary=None, cost_usd=None, current=True, forgotten=0))
        return ps.SessionTurnsResult(request_id=req.request_id, session=session, turns=turns, more=more)
