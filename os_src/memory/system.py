"""The memory system as the runtime sees it: turn capture, the compaction hooks, the search
tool, auto-recall, the boot prompt, health.

It owns the two database threads, the transcript writer and the turn journal (and the
thread that writes their files), the daemon task and the curator client, the recall
index and its indexer (memory/recall/service.py), the import inbox's task, and holds the
writer lock so that only one process writes a workspace's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config import Settings
from ..db_worker import Reads, Worker
from ..errors import ForgetWouldMiss, StillSaving, log_expected
from ..fsutil import WriterLock, sweep_temp_files
from ..logs import get_logger
from ..paths import Layout
from ..spending import DailyBudget, day_start
from ..stopping import StopDeadline
from .capture.health import JOURNAL_NAME, set_aside_journals
from .capture.pipeline import Capture
from .capture.recorder import TurnRecord
from .capture.spill import STATUS_NAME
from .curation.curator import check_batch_tokens
from .curation.daemon import MemoryDaemon
from .curation.rebuild import UNFINISHED
from .files import SPECS, VERSION_NAME, MemoryFiles
from .forget.backups import sweep_backup_temps
from .forget.context import SessionContext
from .forget.jobs import Waiting, hidden_lines, named, waiting
from .forget.judge import LineJudge
from .forget.lines import line_hash
from .forget.turns import Forgotten, TurnForgetting
from .hooks import CompactionHooks, HookTimings
from .import_inbox import SET_ASIDE_ENDING, ImportInbox, holding, inbox_files
from .loader import BootLoader
from .memory_store import MemoryDB
from .processor import BatchProcessor, CuratorClient
from .recall.index import sweep_swap_leftovers
from .recall.searcher import RecallHit
from .recall.service import PROGRESS_FILE, Recalled, RecallService, index_path
from .schema import FORGOTTEN
from .transcript_store import NewObservation, Observation, TakenClient, TranscriptDB

if TYPE_CHECKING:  # the agent SDK (a second of imports) loads with the first agent, not the server
    from claude_agent_sdk import HookMatcher

log = get_logger(__name__)

REPLAY_BUDGET = 2.0  # at start, for the turns an earlier run left to land before the first batch
BOOT_SETTLE_BUDGET = 15.0  # a new session waits this long, at most, for the last session's batch
RECALL_SETTLE_BUDGET = 2.0  # ...and this long for what that batch learned to be searchable
HEALTH_CACHE_SECONDS = 1.0
# A set-aside listing under way for longer than this (the disk hangs) makes memory degraded: the one shown may
# no longer be so, a file set aside since unseen. Not the shown one's age: /healthz polled once a minute on a
# loaded machine, whose listing took more than HEALTH_WAIT, showed a minute-old listing, and said degraded.
SET_ASIDE_STALE = 30.0
HEALTH_WAIT = 0.5  # /healthz waits at most this long for fresh counts (a lock holds a database for seconds)
# ...and for the listing of what is set aside (a hung disk holds a directory read): then the last listing stands
FORGET_DRAIN_BUDGET = 5.0  # a forget waits this long, at most, for the turns still being written
JOURNAL_SET_ASIDE = ("some of these turns may be in a turn journal the server could not read at a start, which is "
                     "kept for the operator: this needs the operator, not a moment's wait; the forget can be done "
                     "once they have replayed or removed it (`sprite-os memory status` says how)")
JOURNAL_STUCK = ("some of these turns may be in a turn journal the server could neither read nor set aside, which the "
                 "next start reads again and may replay: this needs the operator, not a moment's wait; the forget "
                 "can be done once a restart has read it (`sprite-os memory status` says what is wrong)")
IMPORT_WAITING = ("some turns of this session are still being imported (`sprite-os memory import`), and would be "
                  "recorded after the forget, words and all: forget it once the import is done (`sprite-os memory "
                  "status` shows it; a file set aside for the operator must be applied again or removed first)")
IMPORT_HOLDS_TURN = ("a `sprite-os memory import` file still holds these turns, and would keep their words on disk: "
                     "forget them once the import is done (`sprite-os memory status` shows it; a file set aside for "
                     "the operator must be applied again or removed first)")
BOOT_DECIDE_BUDGET = 10.0  # a boot prompt waits this long, at most, for a forget deciding its current files' lines


class SetAside(NamedTuple):
    """What waits for the operator, as the folders hold it: the turn journals a start could not read
    (in .os/state/), the import files the server gave up on (in .os/state/imports/)."""

    journals: list[str]
    imports: list[str]
    listed_at: float | None = None  # when the listing began (wall clock; None: no listing has come back)
    error: str | None = None  # the last listing's failure: the one shown is older


def list_set_aside(layout: Layout) -> SetAside:
    """The two folders listed (two directory reads: tens of microseconds on a healthy disk): on a thread."""
    return SetAside([p.name for p in set_aside_journals(layout.state_dir)],
                    [p.name for p in inbox_files(layout, SET_ASIDE_ENDING)])


class MemorySystem:
    def __init__(self, settings: Settings, lock: WriterLock | None = None) -> None:
        """`lock`: the workspace's writer lock, when the server takes it before anything else."""
        check_batch_tokens(settings.memory_batch_tokens)  # a bad setting fails before the server listens
        layout = settings.layout
        self.settings = settings
        self.transcript: Worker[TranscriptDB] = Worker("transcript", lambda: TranscriptDB(layout.transcript_db))
        self.memory: Worker[MemoryDB] = Worker("memory", lambda: MemoryDB(layout.memory_db))
        # What other tasks (the console) may do with memory.db's thread: read. The daemon writes it.
        self.memory_reads = Reads(self.memory)
        self.files = MemoryFiles(layout)
        self.curator = CuratorClient(settings)
        self.processor = BatchProcessor(self.transcript, self.memory, self.files, self.curator)
        self.daemon = MemoryDaemon(self.processor, settings.memory_batch_turns,
                                   budget=DailyBudget(settings.memory_daily_budget_usd),
                                   batch_tokens=settings.memory_batch_tokens)
        self.timings = HookTimings()
        # The forget pass waits for the word index's rewrite after a forget, and tries a failed one again
        self.recall = RecallService(settings, self.transcript, self.memory,
                                    on_purge_ended=lambda purged: self.forgetting.purge_ended(purged))
        self.processor.on_commit = self.recall.learned
        self.capture = Capture(self.transcript, layout, on_recorded=self.daemon.note_turn,
                               on_landed=self.recall.indexer.nudge, timings=self.timings)
        self.writer = self.capture.writer
        self.forgetting = TurnForgetting(layout, self.transcript, self.memory, self.files, self.recall.forget,
                                         self.daemon.trigger, self.daemon.apply,
                                         judge=LineJudge(self.recall.embed_passages, self.recall.kept_near),
                                         purge_state=self.recall.purge_state, purge_again=self.recall.purge_again)
        self.daemon.before_batches = self.forgetting.rewrite_files  # the files' one writer takes lines out
        self._booted: set[str] = set()  # the hashes of the lines of the prompt the current session booted with
        self._booted_lines: list[str] = []  # and their texts (turns not yet curated, learnings, summaries too)
        self._recalled: tuple[str, set[int]] = ("", set())  # the turns auto-recall brought a session
        self.loader = BootLoader(self.files, self.memory, self._pending_turns, self._hidden_lines)
        self.compaction = CompactionHooks(self._flush, self.loader.refresh_context,
                                          settings.precompact_budget, self.timings)
        self.imports = ImportInbox(layout, self.transcript, self.recall.indexer.nudge)
        self._lock = lock or WriterLock(layout.memory_lock, WriterLock.SERVER)
        self._started = False
        self._counts: dict[str, int] = {}
        self._spent = 0.0  # today's spending, as last counted
        self._totals: dict[str, Any] | None = None
        self._forgets_waiting = Waiting(0, None)  # as last counted
        self._counted_at: float | None = None  # wall clock of the counts /healthz shows
        self._fresh_until = -1e18  # the counts are recounted after this (the loop's clock)
        self._counting: asyncio.Task[None] | None = None
        self._listing: asyncio.Task[SetAside] | None = None
        self._listed = SetAside([], [])  # the last listing, for when one does not come in HEALTH_WAIT
        self._listing_began = 0.0  # when the listing under way (`_listing`) began: monotonic, so a clock set back hides no hang
        self._slow_said = False  # the listing under way was logged as slow

    async def start(self) -> None:
        self.settings.layout.ensure()
        await asyncio.to_thread(self._lock.acquire)  # a contended take retries for about 1 s: off the loop
        self._started = True
        if swept := await asyncio.to_thread(self._sweep):
            log.warning("temp_files_swept", files=[str(p.relative_to(self.settings.layout.os_dir)) for p in swept])
        await self.capture.start(REPLAY_BUDGET)
        await self.recall.start()
        if resumed := await self.forgetting.resume():  # a forget a stop or kill cut short, finished first
            log.warning("forgets_resumed", forgets=resumed)
        self.imports.start()  # what `memory import` hands over, applied through transcript.db's thread
        await self.daemon.start()
        await self._list()  # what /healthz shows of what is set aside (a journal this start set aside) from now
        await self._count()  # what /healthz shows until it is counted again (at its first call)
        self._fresh_until = -1e18
        log.info("memory_started", **self._counts, batch_turns=self.settings.memory_batch_turns,
                 model=self.settings.memory_model, daily_budget_usd=self.settings.memory_daily_budget_usd,
                 batch_tokens=self.settings.memory_batch_tokens)

    def _sweep(self) -> list[Path]:
        """What a kill between a temp file and its rename left of the files memory writes (the one
        writer now: it holds the lock, as `memory rebuild` and `migrate-v1` do). Other files, and other
        programs' temp files, stay. So does the marker an unfinished `memory rebuild` leaves (UNFINISHED):
        it names the memory.db that rebuild set aside, which the next rebuild reads what was forgotten from;
        only its temp file goes."""
        layout = self.settings.layout
        removed = sweep_temp_files(layout.memory_dir, lambda name: name in SPECS or name == UNFINISHED)
        for folder in (layout.history_dir / name for name in SPECS):
            removed += sweep_temp_files(folder, VERSION_NAME.match)
        removed += sweep_backup_temps(layout)  # the forget pass's rewrites of v1's memory files
        state = (JOURNAL_NAME, STATUS_NAME, PROGRESS_FILE)  # capture's, and recall's status for `memory status`
        removed += sweep_temp_files(layout.state_dir, lambda name: name in state)
        # A killed `memory rebuild --index`'s half-built index and the one it set aside: the next rebuild removed
        # them (or a forget's pass), and until then they held every turn's words on disk
        return removed + sweep_swap_leftovers(index_path(layout.memory_dir))

    async def stop(self, deadline: StopDeadline | None = None) -> list[str]:
        """Flush and close, each step within its share of the stop's deadline (stopping.py; alone, a
        whole stop's): the capture's and the flush's shares are kept for them whatever the steps before
        do. A start that was refused (the lock is another's) touches nothing here. Returns the steps that
        did not finish (stopping.UNFINISHED_SAID): their work is left to the next start."""
        if not self._started:
            return []
        loop = asyncio.get_running_loop()
        deadline = deadline or StopDeadline(loop.time())
        log.info("memory_stopping", budget_s=round(deadline.stores(loop.time()), 1))
        for task in (self._counting, self._listing):
            if task is not None:
                task.cancel()
        # A forget deciding its lines: what is left before memory's reserve, at most DECISION (what it keeps
        # in memory judges lines at the last pass), then cut short: its job is on disk, the next start decides it.
        done = {"decision": await _within("decision", deadline.before_memory(loop.time()),
                                          self.forgetting.stop(deadline.decision(loop.time())))}
        # First: the flush below must see the last turns. What does not land stays in the spill file; the
        # journal's last state is synced after it.
        landing, cut = deadline.capture(loop.time())
        done["capture"] = await _within("capture", cut, self.capture.stop(landing))
        done["imports"] = await _within("imports", deadline.stores(loop.time()), self.imports.stop())  # the rest: next start
        flushing, cut = deadline.flush(loop.time())
        done["flush"] = await _within("flush", cut, self.daemon.stop(flush_budget=flushing))
        # Cut: a thread still at work (a huge turn's index write) keeps its store; its work is redone at start.
        done["stores"] = await _within("stores", deadline.stores(loop.time()), self._close())
        self._lock.release()
        return [step for step, finished in done.items() if not finished]

    async def _close(self) -> None:
        await self.recall.stop()
        await self.curator.close()
        await asyncio.gather(self.transcript.close(), self.memory.close())

    async def _flush(self, reason: str, budget: float) -> bool:
        """Curate every turn so far (before a compaction): the turns still being written first."""
        started = time.monotonic()
        await self.writer.drained(budget / 2)
        return await self.daemon.flush(reason, budget - (time.monotonic() - started))

    async def _hidden_lines(self) -> set[str]:
        return await self.memory.call(hidden_lines)

    async def forget_turns(self, ids: Sequence[int] = (), *, turn_ids: Sequence[str] = (),
                           session_id: str | None = None, by: str) -> Forgotten:
        """A person forgets turns (by id, by their id on the wire, or a whole session): their words
        leave every store now, the memory files on the daemon's next pass (memory/forget/turns.py).
        The turns still being written land first. The caller holds the agent's turns meanwhile
        (the console, with the runtime's `holding_turns`). StillSaving: a turn named (by session or
        wire id) has still not landed after FORGET_DRAIN_BUDGET (transcript.db locked or failing): it
        would land after the forget, words and all, so the forget is refused rather than acknowledged.
        So is one by session or wire id while a turn journal a start could not read is set aside: it may
        hold such turns, which the documented replay (renaming it back) would record, words and all; or
        while one is stuck (it could not even be set aside): the next start reads it again and, if the read
        then succeeds, replays it with no one asking. A forget by session is refused too while a `memory
        import` file (being written, waiting, being applied, or set aside) holds turns of that session
        (`import_inbox.holding`): they would be recorded after it, words and all. A turn named by its row id is
        in transcript.db already (a replay never records it again), but its forget is refused while an import
        file (applied in part, or set aside) holds it too: the file would keep its words on disk
        (`_refuse_if_an_import_holds`)."""
        if session_id is not None or turn_ids:
            await self._refuse_if_journal_set_aside()
        if session_id is not None and (waiting := await asyncio.to_thread(holding, self.settings.layout, session_id)):
            log.warning("forget_refused_import_waiting", files=[p.name for p in waiting])
            raise StillSaving(IMPORT_WAITING)
        if not await self.writer.drained(FORGET_DRAIN_BUDGET) and self.writer.holds_turns(
                {session_id} if session_id is not None else set(), set(turn_ids)):
            raise StillSaving("some of these turns are still being saved (transcript.db is locked or failing): "
                              "forget them once they are saved; try again in a moment")
        wanted = list(ids)
        if turn_ids:
            wanted += await self.transcript.call(lambda t: t.ids_of(turn_ids=turn_ids))
        if wanted:  # turns named, recorded already: an import file may keep their words on disk
            await self._refuse_if_an_import_holds(wanted)
        if session_id is not None:
            wanted += await self.transcript.call(lambda t: t.ids_of(session_id=session_id))
        # What the current session holds as the forget starts: the caller holds the agent's turns, so no turn
        # (nor its auto-recall) adds to it meanwhile.
        context = SessionContext(frozenset(self._booted), tuple(self._booted_lines), frozenset(self._recalled[1]))
        whole = session_id is not None and not ids and not turn_ids
        return await self.forgetting.forget(wanted, by, context, whole_session=whole)

    async def _refuse_if_an_import_holds(self, ids: list[int]) -> None:
        """Refuse the forget of recorded turns an inbox file holds too (one applied in part, or set aside for the
        operator after its first turns were recorded): the file would keep their words on disk, the forget said
        done. Once it is applied (or removed), it is gone, and the forget leaves no copy. A file that can't be read
        refuses it only for a turn that could have come from an import: one with no wire id (an import records
        none; a turn captured live has one). It used to refuse the forget of any turn while such a file stayed."""
        turns = [o for o in await self.transcript.call(lambda t: t.get(ids)) if o.processed != FORGOTTEN]
        places, imported = [(o.session_id, o.timestamp) for o in turns], any(o.turn_id is None for o in turns)
        if places and (waiting := await asyncio.to_thread(
                lambda: holding(self.settings.layout, places=places, unreadable=imported))):
            log.warning("forget_refused_import_waiting", files=[p.name for p in waiting])
            raise StillSaving(IMPORT_HOLDS_TURN)

    async def _refuse_if_journal_set_aside(self) -> None:
        # The folder as /healthz lists it, read on a thread: a directory read never holds the loop up.
        aside = await asyncio.to_thread(set_aside_journals, self.settings.layout.state_dir)
        if journals := [p.name for p in aside]:
            log.warning("forget_refused_journal_set_aside", journals=journals,
                        hint="replay or remove it: `sprite-os memory status` says how for each")
            raise ForgetWouldMiss(JOURNAL_SET_ASIDE)
        if self.capture.journal.stuck:
            log.warning("forget_refused_journal_stuck", hint="restart once the disk reads the turn journal")
            raise ForgetWouldMiss(JOURNAL_STUCK)

    async def _pending_turns(self, limit: int) -> Sequence[Observation | NewObservation]:
        """The newest turns not yet curated, in the order they were recorded: those in transcript.db,
        then those still on their way to it."""
        held = await self.memory.call(named)  # a forget's turns, one an error cut short too: their words are not shown
        recorded: list[Observation] = await self.transcript.call(lambda t: t.recent_pending(limit, held))
        seen = {(o.session_id, o.sequence_num) for o in recorded}
        waiting = [o for o in self.writer.waiting() if (o.session_id, o.sequence_num) not in seen]
        turns: list[Observation | NewObservation] = [*reversed(recorded), *waiting]
        return turns[-limit:]

    # ------------------------------------------------------------ what the runtime uses

    def hooks(self) -> dict[Any, list[HookMatcher]]:
        """Only what a hook alone can do: turns are captured from the runtime's stream."""
        from claude_agent_sdk import HookMatcher

        budget = self.settings.precompact_budget
        return {
            "PreCompact": [HookMatcher(hooks=[self.compaction.on_pre_compact], timeout=budget + 10)],
            "SessionStart": [HookMatcher(hooks=[self.compaction.on_session_start])],
        }

    async def boot_prompt(self, settle: bool = True) -> str:
        """The new session's prompt. `settle`: first wait (within budgets) for the last session's
        batch and what it learned; False: what memory holds now (an agent that is failing to start)."""
        if settle and not await self.daemon.settle(BOOT_SETTLE_BUDGET):
            log.warning("boot_without_latest_memory", budget=BOOT_SETTLE_BUDGET)
        # A forget deciding which lines came from its turns (the curator's rewordings among them): a new
        # session waits for the current files' part, so that one the forget restarted never boots with them.
        if settle and not await self.forgetting.current_decided(BOOT_DECIDE_BUDGET):
            log.warning("boot_before_forget_decided", budget=BOOT_DECIDE_BUDGET)
        prompt = await self.loader.boot_prompt()
        self.recall.booted_with(prompt)  # auto-recall never repeats it
        self._booted_lines = [line for line in prompt.splitlines() if line.strip()]
        self._booted = {line_hash(line) for line in self._booted_lines}
        if settle:
            await self.recall.settle(RECALL_SETTLE_BUDGET)  # what the last batch learned is searchable too
        return prompt

    def session_started(self, session_id: str) -> None:
        if self._recalled[0] != session_id:  # what auto-recall brought the session before is not in this one
            self._recalled = (session_id, set())
        self.capture.recorder.start_session(session_id)

    def session_ended(self, session_id: str, reason: str) -> None:
        self.capture.recorder.end_session(session_id)
        self.daemon.trigger(f"session-end-{reason}")

    def turn_started(self, prompt: str, turn_id: str | None = None, client_id: str | None = None) -> TurnRecord:
        self.curator.warm()  # a batch will follow: its SDK loads meanwhile, off the loop
        self.recall.indexer.turn_started()
        return self.capture.recorder.open(prompt, turn_id, client_id)

    def turn_ended(self) -> None:
        """The agent's turn is over, however it ended (the embedder may have the CPU again)."""
        self.recall.indexer.turn_ended()

    async def taken_messages(self, limit: int) -> list[TakenClient]:
        """The messages the record holds a turn of (or a command that left none), by client id, newest
        first: the runtime never runs one of them again. First those whose turns are still on their way to it (the spill file's, a cut turn's
        from the journal: a start on a disk that still refuses writes leaves them waiting), then the newest
        `limit` recorded."""
        waiting = [TakenClient(o.client_id, o.session_id, o.turn_id)
                   for o in reversed(self.writer.waiting()) if o.client_id is not None]
        waiting += [TakenClient(c.client_id, c.session_id, c.turn_id) for c in reversed(self.writer.waiting_commands())]
        return waiting + await self.transcript.call(lambda t: t.taken_clients(limit))

    async def search(self, query: str, limit: int) -> list[RecallHit]:
        """Episodes and learnings together, best first (search_memory, the console)."""
        return await self.recall.search(query, limit)

    def message_arrived(self, message: str, session_id: str) -> None:
        """A person's message is waiting for the agent: its auto-recall's query embedding begins now."""
        self.recall.expect(message, session_id)

    async def recall_for(self, message: str, session_id: str, turn_id: str) -> Recalled | None:
        """Auto-recall for a person's message: the prompt to send and what was added, or None."""
        recalled = await self.recall.auto_recall(message, session_id, turn_id)
        if recalled is not None:
            seen = self._recalled[1] if self._recalled[0] == session_id else set()
            seen |= {m.observation_id for m in recalled.memories if m.observation_id is not None}
            self._recalled = (session_id, seen)
        return recalled

    def recalled(self, session_id: str) -> set[int]:
        """The turns auto-recall brought the session (their ids)."""
        return set(self._recalled[1]) if self._recalled[0] == session_id else set()

    async def set_aside(self) -> SetAside:
        """What waits for the operator, listed now on a thread, never on the loop (a hung disk holds a
        directory read, and the loop serves every client). A listing under way when this is called is
        shared, not started again; one that takes more than HEALTH_WAIT (or fails) leaves the last one
        standing, and goes on: its result is the next caller's. It says when it began (`listed_at`) and
        whether the last listing failed (`error`); the import files the inbox set aside after it began are
        added (the inbox remembers them)."""
        if self._listing is None:
            self._listing, self._slow_said = asyncio.create_task(self._list(), name="memory-set-aside-listing"), False
            self._listing_began = time.monotonic()
        try:
            listed = await asyncio.wait_for(asyncio.shield(self._listing), HEALTH_WAIT)
        except TimeoutError:
            if not self._slow_said:  # once a listing: every /healthz meanwhile shows the last one
                self._slow_said = True
                log.warning("set_aside_listing_slow", waited_s=HEALTH_WAIT, detail="the last listing is shown")
            listed = self._listed
        return listed._replace(imports=self.imports.set_aside_files(listed.imports, listed.listed_at))

    async def _list(self) -> SetAside:
        began = time.time()
        unreadable = self.forgetting.unreadable_backups
        try:
            listed = await asyncio.to_thread(list_set_aside, self.settings.layout)
            self._listed = listed._replace(listed_at=began)  # its error None: this one came back
            # The backups the forget pass could not read, said until they are gone: looked at here too, as a pass
            # runs only for a forget (the operator's removal was said at the next forget, or restart)
            if unreadable:
                os_dir = self.settings.layout.os_dir
                self.forgetting.backups_gone(await asyncio.to_thread(
                    lambda: [p for p in unreadable if not os.path.lexists(os_dir / p)]))
        except OSError as exc:  # an unreadable folder: the last listing stands, and the failure is said
            self._listed = self._listed._replace(error=repr(exc)[:300])
            log_expected(log, "set_aside_listing_failed", exc)
        finally:
            self._listing = None
        return self._listed

    async def status(self) -> dict[str, Any]:
        """What memory's state is now, with no database read: the daemon's failing spell, capture's, the
        hooks', recall's, and what is set aside (set_aside(): two folders listed on a thread). `degraded`:
        the curator has failed three calls in a row, or capture is (its writes failing or stalled, or a
        turn not saved yet, or a turn journal set aside), or the import inbox is (its attempts failing:
        import_inbox.FAILED_ATTEMPTS_DEGRADED, or a file set aside), or what is set aside is not known: a
        listing has been under way for more than SET_ASIDE_STALE, or the last one failed; or forgetting is
        stuck (forget/turns.py's `stuck`: a job the file pass has kept for a minute, or a forget cut short)."""
        aside = await self.set_aside()
        daemon, capture, imports = self.daemon.status(), self.capture.status(aside.journals), \
            self.imports.status(aside.imports)
        hung = self._listing is not None and time.monotonic() - self._listing_began > SET_ASIDE_STALE
        unknown = aside.error is not None or aside.listed_at is None or hung
        forget = self.forgetting.status(time.monotonic())
        degraded = bool(daemon["degraded"] or capture["degraded"] or (imports or {}).get("degraded") or unknown
                        or forget["degraded"])
        return {**daemon, "degraded": degraded, "forget": forget,
                "curator_degraded": daemon["degraded"], "capture": capture, "hook_errors": self.timings.errors,
                "recall": {**self.recall.status(), "import": imports},
                "set_aside_listed_at": aside.listed_at, "set_aside_listing_error": aside.error}

    async def health(self) -> dict[str, Any]:
        """status(), with the turns' counts and the day's budget: counted at most once a second, and
        waited for at most HEALTH_WAIT, so a locked database never holds /healthz up (the counts
        then are the last ones, as of `counted_at`; the budget's wait is the daemon's, live)."""
        loop = asyncio.get_running_loop()
        if self._counting is None and loop.time() > self._fresh_until:
            self._fresh_until = loop.time() + HEALTH_CACHE_SECONDS
            self._counting = asyncio.create_task(self._count(), name="memory-health-count")
        status, _ = await asyncio.gather(self.status(), self._counted())  # both waits at once
        backlog = status["recall"]["turns_waiting_for_index"]
        budget = self.daemon.budget.report(time.time(), self._spent, self.daemon.resumes_at)
        return {**status, "forget": {**status["forget"], **self._forgets_waiting._asdict()},
                "observations": self._counts, "budget": budget, "totals": self._totals,
                "index_backlog": backlog, "counted_at": self._counted_at}

    async def _counted(self) -> None:
        if self._counting is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._counting), HEALTH_WAIT)

    async def _count(self) -> None:
        try:
            counts = await self.transcript.call(lambda t: t.counts())
            since = day_start(time.time())
            spent, totals, forgets = await self.memory.call(lambda m: (m.cost_since(since), m.totals(), waiting(m)))
            self._counts, self._spent, self._totals, self._forgets_waiting = counts, spent, totals, forgets
            self._counted_at = time.time()
        except Exception as exc:  # a locked or failing database: the last counts stand
            log_expected(log, "memory_health_count_failed", exc)
        finally:
            self._counting = None


async def _within(step: str, seconds: float, work: Coroutine[Any, Any, bool | None]) -> bool:
    """A stop's step, cut past `seconds` (it bounds its own waits: this is for what hangs beyond them).
    False: it did not finish (cut, failed, or it says it left work: False)."""
    try:
        async with asyncio.timeout(seconds):
            return await work is not False
    except TimeoutError:
        log.error("memory_stop_step_cut", step=step, after_s=round(seconds, 1))
    except Exception as exc:  # the steps after it still run: the capture's and the flush's above all
        log.exception("memory_stop_step_failed", step=step, error=repr(exc)[:300])
    return False
