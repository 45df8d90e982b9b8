"""The console's memory requests, answered: files, history, a person's edit, rollback,
learnings search, forgetting, the audit, the daemon's health and the next boot prompt.

The gateway hands each request frame (console/memory_frames.py) to `MemoryConsole.handle`,
which returns the answer frame or raises `RequestFailed`. Database reads run on the
stores' worker threads and file I/O in a thread, so the event loop never blocks.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..logs import get_logger
from ..memory.audit import AuditAction, audit, record
from ..memory.forget.jobs import waiting
from ..memory.forget.learnings import forgotten_count, set_forgotten
from ..memory.forget.turns import stuck
from ..memory.recall.learnings import MAX_LIMIT, search_terms
from ..spending import day_start
from ..text import CHARS_PER_TOKEN, estimate_tokens
from . import memory_files
from . import memory_frames as pm
from . import memory_queries as q
from . import requests as rq
from .requests import Handler, Request

if TYPE_CHECKING:
    from ..memory.system import MemorySystem

log = get_logger(__name__)

EPISODES_SHOWN = 5  # past turns listed after the learnings a search found
TOKEN_ESTIMATE = (f"characters / {CHARS_PER_TOKEN}, rounded up: the usual rule of thumb for English prose "
                  "with Claude's tokenizer; code, tables and other languages take more tokens")


class MemoryConsole:
    def __init__(self, system: MemorySystem, clock: Callable[[], float] = time.time,
                 agent_spend: Callable[[], dict[str, Any]] | None = None) -> None:
        self._system = system
        self._agent_spend = agent_spend
        self._memory = system.memory_reads  # memory.db is read here; its changes go through the daemon
        self._files = system.files
        self._clock = clock
        handlers: dict[type[Request], Handler] = {
            pm.MemoryFilesRequest: self._list_files, pm.MemoryFileRequest: self._file,
            pm.MemoryVersionRequest: self._version, pm.MemoryEditRequest: self._edit,
            pm.MemoryRollbackRequest: self._rollback, pm.MemorySearchRequest: self._search,
            pm.MemoryTurnRequest: self._turn, pm.MemoryForgetRequest: self._forget,
            pm.MemoryUnforgetRequest: self._forget, pm.MemoryAuditRequest: self._audit,
            pm.MemoryHealthRequest: self._health, pm.MemoryBootPromptRequest: self._boot_prompt,
        }
        self._handlers = handlers

    @property
    def handlers(self) -> Mapping[type[Request], Handler]:
        return self._handlers

    async def handle(self, request: pm.MemoryRequest) -> rq.Reply:
        return await self._handlers[type(request)](request)

    # ------------------------------------------------------------ files

    async def _list_files(self, req: pm.MemoryFilesRequest) -> pm.MemoryFilesResult:
        files = await asyncio.to_thread(memory_files.all_files, self._files)
        return pm.MemoryFilesResult(request_id=req.request_id, files=files)

    async def _file(self, req: pm.MemoryFileRequest) -> pm.MemoryFileResult:
        info, text, history = await asyncio.to_thread(memory_files.file_detail, self._files, req.name)
        return pm.MemoryFileResult(request_id=req.request_id, file=info, text=text, history=history)

    async def _version(self, req: pm.MemoryVersionRequest) -> pm.MemoryVersionResult:
        version, text, previous, diff = await asyncio.to_thread(
            memory_files.version_detail, self._files, req.name, req.number)
        return pm.MemoryVersionResult(request_id=req.request_id, name=req.name, version=version, text=text,
                                      previous=previous, diff=diff)

    async def _edit(self, req: pm.MemoryEditRequest) -> pm.MemoryEditResult:
        saved = await asyncio.to_thread(memory_files.edit, self._files, req.name, req.text, req.base_sha256)
        if saved.made:
            await self._record("edit", file=req.name, detail=f"saved as version {saved.version.number}")
        if saved.warning is not None:  # saved: a Save again is answered as saved (memory_files.edit)
            raise pm.RequestFailed("not_durable", saved.warning)
        return pm.MemoryEditResult(request_id=req.request_id, file=saved.file, version=saved.version)

    async def _rollback(self, req: pm.MemoryRollbackRequest) -> pm.MemoryRollbackResult:
        saved = await asyncio.to_thread(memory_files.rollback, self._files, req.name, req.number)
        if saved.made:
            await self._record("rollback", file=req.name,
                               detail=f"to version {req.number}, saved as version {saved.version.number}")
        if saved.warning is not None:  # done: the same click again is answered as done (memory_files.rollback)
            raise pm.RequestFailed("not_durable", saved.warning)
        return pm.MemoryRollbackResult(request_id=req.request_id, file=saved.file, version=saved.version)

    async def _record(self, action: AuditAction, *, file: str, detail: str) -> None:
        """The audit row of a change already made: a failure to add it is logged, never the change's answer
        (the person's retry would be refused as a change made by someone else)."""
        now = self._clock()
        try:
            await self._system.daemon.apply(lambda m: record(m, action, now, file=file, detail=detail))
        except Exception as exc:
            log.exception("memory_audit_failed", action=action, file=file, error=repr(exc)[:300])

    # ------------------------------------------------------------ learnings

    async def search(self, query: str, types: Sequence[str], forgotten: bool, limit: int) -> list[pm.LearningHit]:
        """The console's one seam to memory search: the same MemorySystem.search the agent's tool
        uses, over episodes and learnings. An episode maps to a hit of kind "episode" (type
        EPISODE, its id the turn's). Learnings come first, best first, then at most
        EPISODES_SHOWN past turns (unless only EPISODE is asked for): raw turns, which match many
        words, would otherwise crowd the facts out. Without a query (or for the forgotten ones) it
        lists the newest learnings."""
        if forgotten or not search_terms(query):
            ids = await self._memory.call(lambda m: q.listed_learnings(m, types, forgotten, limit))
            return await self._hits([(i, None) for i in ids])
        found = await self._system.search(query, MAX_LIMIT)
        found = [h for h in found if not types or h.type in types]
        episodes_shown = limit if list(types) == ["EPISODE"] else min(limit, EPISODES_SHOWN)
        learned_found = [h for h in found if h.kind == "learning"][:limit]
        learned = await self._hits([(h.id, h.score) for h in learned_found])
        episodes = [q.episode_hit(h) for h in found if h.kind == "episode"][:episodes_shown]
        return [*learned, *episodes]

    async def _hits(self, scored: list[tuple[int, float | None]]) -> list[pm.LearningHit]:
        if not scored:
            return []
        ids = [i for i, _ in scored]
        found = await self._memory.call(lambda m: q.learnings_by_id(m, ids))
        sources = sorted({r.source_observation_id for r in found.values() if r.source_observation_id is not None})
        refs = await self._system.transcript.call(lambda t: q.turn_refs(t, sources)) if sources else {}
        return [q.hit(found[i], score, refs) for i, score in scored if i in found]

    async def _search(self, req: pm.MemorySearchRequest) -> pm.MemorySearchResult:
        hits = await self.search(req.query, req.types, req.forgotten, req.limit)
        return pm.MemorySearchResult(request_id=req.request_id, hits=hits)

    async def _turn(self, req: pm.MemoryTurnRequest) -> pm.MemoryTurnResult:
        turn = await self._system.transcript.call(lambda t: q.turn_record(t, req.observation_id))
        if turn is None:
            raise pm.RequestFailed("not_found", f"no recorded turn #{req.observation_id}")
        return pm.MemoryTurnResult(request_id=req.request_id, turn=turn)

    async def _forget(self, req: pm.MemoryForgetRequest | pm.MemoryUnforgetRequest) -> pm.MemoryReply:
        forget, now, lid = isinstance(req, pm.MemoryForgetRequest), self._clock(), req.learning_id
        try:
            await self._system.daemon.apply(lambda m: set_forgotten(m, lid, forget, now))
        except KeyError:
            raise pm.RequestFailed("not_found", f"no learning #{lid}") from None
        self._system.recall.indexer.learning_changed(lid)  # its document leaves the index, or comes back
        [learning] = await self._hits([(lid, None)])
        if forget:
            return pm.MemoryForgetResult(request_id=req.request_id, learning=learning)
        return pm.MemoryUnforgetResult(request_id=req.request_id, learning=learning)

    async def _audit(self, req: pm.MemoryAuditRequest) -> pm.MemoryAuditResult:
        found = await self._memory.call(lambda m: audit(m, req.limit))
        entries = [pm.AuditEntry(id=e.id, at=e.at, action=e.action, learning_id=e.learning_id, file=e.file,
                                 detail=e.detail) for e in found]
        return pm.MemoryAuditResult(request_id=req.request_id, entries=entries)

    # ------------------------------------------------------------ the daemon and the next session

    async def _health(self, req: pm.MemoryHealthRequest) -> pm.MemoryHealthResult:
        status = self._system.daemon.status()
        since = day_start(self._clock())
        observations = await self._system.transcript.call(lambda t: t.counts())

        def read(m: Any) -> tuple[Any, ...]:
            return (m.totals(), q.spend_since(m, since), q.spend_since(m, 0.0), q.last_batch(m), forgotten_count(m),
                    waiting(m))

        totals, today, total, last, forgotten, forgets = await self._memory.call(read)
        recall = await self._recall()  # first: its listing drops the unreadable backups found gone, as /healthz's
        kept = self._system.forgetting.status(time.monotonic())
        cut_in = self._system.forgetting.cut_short_session_ids
        started = await self._system.transcript.call(lambda t: [row.started_at for sid in cut_in if (
            row := t.session(sid)) is not None]) if cut_in else []
        health = pm.MemoryHealth(
            running=status["running"], failing=status["degraded"],
            consecutive_failures=status["consecutive_failures"], last_error=status["last_error"],
            next_retry_at=status["next_retry_at"], last_success_at=totals["last_success_at"], last_batch=last,
            today=today, total=total, observations=observations, learnings=totals["learnings"],
            forgotten=forgotten, pending_actions=totals["pending_actions"], recall=recall,
            agent=msgspec.convert(self._agent_spend(), pm.AgentSpend) if self._agent_spend else None,
            forgets=pm.ForgetProgress(waiting=forgets.jobs_waiting, cut_short=kept["cut_short_jobs"],
                                      cut_short_in=sorted(started),
                                      cut_short_sessions=self._system.forgetting.cut_short_whole_sessions,
                                      kept_for_s=kept["kept_for_s"], kept_why=kept["kept_why"],
                                      stuck=stuck(kept["kept_for_s"], kept["cut_short_jobs"]),
                                      unreadable_backups=kept["unreadable_backups"]),
        )
        return pm.MemoryHealthResult(request_id=req.request_id, health=health)

    async def _recall(self) -> pm.RecallProgress:
        aside = await self._system.set_aside()  # the folder listed on a thread, as /healthz lists it
        status, importing = self._system.recall.status(), self._system.imports.status(aside.imports)
        vectors = status.get("embedding")
        return pm.RecallProgress(
            turns=status["turns"], waiting_for_index=status["turns_waiting_for_index"],
            embedded=vectors["embedded"] if vectors else None, waiting_for_vectors=vectors["waiting"] if vectors else 0,
            per_second=vectors["per_second"] if vectors else None, eta_s=vectors["eta_s"] if vectors else None,
            # Between failed attempts no file is under way: only the failure is said.
            importing=importing.get("turns") if importing else None,
            imported=importing.get("applied", 0) if importing else 0,
            import_failing=importing["error"] if importing and "failing" in importing else None,
            import_set_aside=importing.get("set_aside", []) if importing else [])

    async def _boot_prompt(self, req: pm.MemoryBootPromptRequest) -> pm.MemoryBootPromptResult:
        text = await self._system.loader.boot_prompt()  # exactly what the runtime passes a new session
        return pm.MemoryBootPromptResult(request_id=req.request_id, text=text, chars=len(text),
                                         tokens_estimate=estimate_tokens(len(text)),
                                         estimate=TOKEN_ESTIMATE)
