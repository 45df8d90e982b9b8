"""Past sessions and a session's turns, answered from what Sprite OS recorded: transcript.db,
the turns still on their way to it (the current session's newest), and memory.db's summaries.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Protocol

from .. import protocol as p
from ..errors import StillSaving
from . import session_frames as ps
from . import session_queries as q
from .requests import Handler, Request, RequestFailed

if TYPE_CHECKING:
    from ..memory.system import MemorySystem


FORGOTTEN_BY = "the person, in the console"
WRITES_BUDGET = 2.0  # seconds a listing waits, at most, for the turns still on their way to transcript.db


class TurnHold(Protocol):
    """runtime.TurnHold: the turn running when the hold began, and a restart that comes before any held turn."""

    @property
    def running(self) -> str | None: ...
    def restart(self, session_id: str) -> bool: ...


HoldTurns = Callable[[], AbstractAsyncContextManager[TurnHold]]  # AgentRuntime.holding_turns


class _NoAgent:
    """No runtime (tests of the console alone): no turn runs, and a restart does nothing."""

    running = None

    def restart(self, session_id: str) -> bool:
        return False


@contextlib.asynccontextmanager
async def _no_agent() -> AsyncIterator[TurnHold]:
    yield _NoAgent()


class SessionsConsole:
    def __init__(self, system: MemorySystem, current_session: Callable[[], str],
                 publish: Callable[[p.ServerFrame], None] = lambda _f: None,
                 holding_turns: HoldTurns = _no_agent) -> None:
        self._system = system
        self._current = current_session
        self._publish = publish
        self._holding_turns = holding_turns  # the runtime's: no turn starts while a forget takes the words out

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return {ps.SessionsRequest: self._sessions, ps.SessionTurnsRequest: self._turns,
                ps.ForgetTurnsRequest: self._forget}

    async def _sessions(self, req: ps.SessionsRequest) -> ps.SessionsResult:
        await self._system.writer.drained(WRITES_BUDGET)  # a turn that just ended counts its session in
        found, more = await self._system.transcript.call(lambda t: q.sessions_page(t, req.before, req.limit))
        ids = [row.id for row in found]
        summaries = await self._system.memory_reads.call(lambda m: q.summaries(m, ids))
        current = self._current()
        return ps.SessionsResult(request_id=req.request_id, more=more, sessions=[
            q.info(row, summaries.get(row.id), row.id == current) for row in found])

    async def _forget(self, req: ps.ForgetTurnsRequest) -> ps.ForgetTurnsResult:
        if not (req.observation_ids or req.turn_ids or req.session_id):
            raise RequestFailed("not_found", "name the turns to forget: observation_ids, turn_ids or session_id")
        # No turn starts until the words are out of the transcript and search (the agent could search for,
        # or be reminded of, them) and the session holding them in its context has been restarted.
        async with self._holding_turns() as hold:
            await self._refuse_if_busy(req, hold.running)
            try:
                done = await self._system.forget_turns(req.observation_ids, turn_ids=req.turn_ids,
                                                       session_id=req.session_id, by=FORGOTTEN_BY)
            except StillSaving as exc:
                raise RequestFailed("busy", str(exc)) from None
            current = self._current()
            # Its session's turn, or a past session's its boot prompt or auto-recall brought it.
            restarted = (done.in_context or any(o.session_id == current for o in done.turns)) and hold.restart(current)
        if not done.turns and not req.session_id:
            raise RequestFailed("not_found", "no recorded turn matches (or it was forgotten already)")
        if not done.turns and req.session_id:
            sid = req.session_id
            if await self._system.transcript.call(lambda t: q.session_row(t, sid)) is None:
                raise RequestFailed("not_found", f"no recorded session {sid!r}")
        sessions = sorted({o.session_id for o in done.turns})
        for sid, group in itertools.groupby(sorted(done.turns, key=lambda o: (o.session_id, o.sequence_num)),
                                            key=lambda o: o.session_id):
            turns = list(group)
            self._publish(p.TurnsForgotten(session_id=sid, turns=[o.sequence_num for o in turns],
                                           turn_ids=[o.turn_id for o in turns if o.turn_id], forgotten_at=done.at))
        return ps.ForgetTurnsResult(request_id=req.request_id, forgotten=len(done.turns), learnings=done.learnings,
                                    sessions=sessions, restarted=restarted)

    async def _refuse_if_busy(self, req: ps.ForgetTurnsRequest, running: str | None) -> None:
        """A running turn is recorded when it ends, words and all: forgetting it now would miss it. And a
        turn running while an earlier turn of its session is forgotten has that turn in its context: its
        answer (recorded, and kept) could quote it; so has one auto-recall brought the current session."""
        if running is not None and (req.session_id == self._current() or running in req.turn_ids
                                    or await self._in_current(req) or await self._recalled_now(req)):
            raise RequestFailed("busy", "a turn is running in this session: interrupt it or wait, then forget")

    async def _in_current(self, req: ps.ForgetTurnsRequest) -> bool:
        """Whether a turn named is of the current session (the newest may still be on their way)."""
        if not (req.observation_ids or req.turn_ids):
            return False
        current, wire = self._current(), set(req.turn_ids)
        if any(o.session_id == current and o.turn_id in wire for o in self._system.writer.waiting()):
            return True
        ids, turn_ids = req.observation_ids, req.turn_ids
        return current in await self._system.transcript.call(lambda t: q.sessions_of(t, ids, turn_ids))

    async def _recalled_now(self, req: ps.ForgetTurnsRequest) -> bool:
        """Whether a turn named is one auto-recall brought the current session."""
        recalled = self._system.recalled(self._current())
        if not recalled:
            return False
        named = set(req.observation_ids)
        sid, turn_ids = req.session_id, req.turn_ids
        if turn_ids:
            named |= set(await self._system.transcript.call(lambda t: t.ids_of(turn_ids=turn_ids)))
        if sid is not None:
            named |= set(await self._system.transcript.call(lambda t: t.ids_of(session_id=sid)))
        return bool(named & recalled)

    async def _turns(self, req: ps.SessionTurnsRequest) -> ps.SessionTurnsResult:
        current = self._current()
        sid = req.session_id or current
        row, (recorded, more), tombstones = await self._system.transcript.call(
            lambda t: (q.session_row(t, sid), q.turns_page(t, sid, req.before, req.limit), t.tombstones(sid)))
        # The current session's newest turns may still be on their way to transcript.db.
        seen = {o.sequence_num for o in recorded}
        waiting = [o for o in self._system.writer.waiting()
                   if o.session_id == sid and o.sequence_num not in seen and (req.before is None or o.sequence_num < req.before)]
        if row is None and sid != current:
            raise RequestFailed("not_found", f"no recorded session {sid!r}")
        turns = sorted([*(q.past_turn(o, tombstones.get(o.sequence_num)) for o in recorded),
                        *map(q.past_turn, waiting)], key=lambda t: t.turn)
        more = more or len(turns) > req.limit
        turns, more = q.within_budget(turns[-req.limit:], more)
        summary = await self._system.memory_reads.call(lambda m: q.summaries(m, [sid])) if row is not None else {}
        session = (q.info(row, summary.get(sid), sid == current, len(waiting), len(tombstones)) if row is not None
                   else ps.SessionInfo(id=sid, started_at=turns[0].at if turns else 0.0, ended_at=None,
                                       turns=len(waiting), first_line=q.first_line(turns[0].user_message) if turns else "",
                                       summary=None, cost_usd=None, current=True, forgotten=0))
        return ps.SessionTurnsResult(request_id=req.request_id, session=session, turns=turns, more=more)
