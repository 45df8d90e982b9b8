"""Forgetting turns: a person forgets what they said (a turn, or a whole session), and the words go.

At once (`TurnForgetting.forget`), the job on disk first (below), the tombstone last:
- transcript.db: each turn keeps a tombstone (which turn, when, by whom) and its row loses its words;
- memory.db: the turn's episode loses its text and its vector, the learnings that came from it (and
  the summary of its session, which may repeat it) are deleted with their pending actions, and
  the audit keeps no word of them; free pages zeroed (secure_delete), the FTS index merged, the WAL
  emptied;
- recall: the vectors become zeros in the vector store (which then never returns nor adds them) and
  the documents leave the word index, which is then written anew in the background, so that no
  segment on disk keeps their words;
- the boot prompt: memory-file lines that came from the turns are left out of it until the daemon
  has rewritten the files;
- meanwhile no turn starts: the caller holds the agent's turns (the console, with the runtime's
  `holding_turns`), since the agent could search for, or be reminded of, what is being forgotten.

Then the memory daemon's next pass (`rewrite_files`, on the daemon's task, the memory files' one
writer) takes those lines out of the curated files (a new version, source `forget`), out of every
older version and every batch's record (a note stands where they were), and out of the backups
(older memory.db copies kept by `memory rebuild`, the v1 data kept by `migrate-v1`), each of which
keeps a note that a forget removed text. The deploy's files (soul.md, os.md) are never touched.
It finishes a job only once every file and backup is rewritten (a disk error keeps the job for a pass
asked for later, PASS_RETRY; so does an error it did not expect, on that job alone: the others go on) and both databases' WALs are emptied (a reader may have kept one through the forget's checkpoint).
Which lines came from a turn is decided after the forget answers, by a task of its own (the pass
skips a job being decided and decides one left undecided; a new session's boot prompt waits for
the current files' part alone, 10 s at most; a stop gives it the flush's budget, then cancels it): those most of whose words it said
(`came_from`, a pure rule), and, with the dense retriever on, those the curator reworded, whose
embedding is close to the turn's or to a learning drawn from it (the learnings keep the turn they
came from) and closer to it by a margin than to any kept turn or learning recall finds near the
line (`reworded`, chosen on bench/forget_lines.py's labelled set); either way, not a line a kept
turn or learning near it says as well (`kept_holds`); a line that check can't judge (the search
fails) stays until it can. `forget_jobs` in memory.db holds the turns' ids and the sha256 of each
line found, never a word: first the lines the words find, undecided, then the decided lines; a job
left undecided is decided at the pass. The job goes on disk before any store loses the words, and the
transcript's tombstone is written last: a forget a kill or an error cuts short is run again at the
next start (`resume`; the pass leaves a job whose turns lack their tombstones, or whose words memory.db still holds, alone until then, or until
the turns are forgotten again), from the words the transcript (or memory.db) still holds. The turns' words stay in memory only, for lines a batch
under way writes before the pass, which get the same check.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...backoff import Backoff
from ...database import checkpoint
from ...db_worker import Worker
from ...errors import log_expected
from ...fsutil import shown_name
from ...logs import get_logger
from ...paths import Layout
from ...text import utc
from ..files import MemoryFiles
from ..memory_store import MemoryDB
from ..schema import FORGOTTEN, PURGED, PURGING
from ..transcript_store import Observation, TranscriptDB
from .backups import backup_candidates, purge_backups
from .context import NOTHING, SessionContext
from .decisions import DECIDE_RETRIES, Apply, Deciding, Decision
from .history import (
    batch_candidates,
    current_texts,
    file_candidates,
    strip_batches,
    strip_files,
)
from .jobs import FORGET_PASS, Job, add_job, finish_job, jobs, mark_kept, set_job_lines
from .judge import CheckFailed, LineJudge
from .lines import REMOVED, Lines, lines_from, turn_text, words_of
from .purge import left_over, purge_memory

log = get_logger(__name__)


@dataclass
class Forgotten:
    turns: list[Observation]  # as they were recorded (the caller uses their ids, sessions and numbers)
    learnings: int
    at: float
    # Whether the current session holds them otherwise (its boot prompt a line the words find, or auto-recall
    # one of the turns or a learning from it): its context must let go of them too.
    in_context: bool = False


# After a pass left a job for later (a disk that would not rewrite, a check that could not be made, a WAL a
# reader kept, the pass's own unexpected failure), until the pass is tried again: 5 s, doubling, up to 5 min (each try does the job's steps
# again, the backups' vacuum included). Nothing else need wake the daemon: an idle Sprite gets its try too.
PASS_RETRY = Backoff(first=5.0, max=300.0)
# A job kept this long (a disk that will not rewrite, a search that keeps failing, a reader holding a WAL) is no
# passing moment: /healthz says memory is degraded. By then the pass has kept it four times in a row (at about
# 0, 5, 15 and 35 s: the first pass and PASS_RETRY's first three tries again; the fourth comes at about 75 s).
KEPT_STUCK = 60.0
# Why a pass kept a job for later, as /healthz says it (index: the word index's rewrite after the forget has not
# succeeded; error: the pass failed in a way it did not expect).
KEPT_DISK, KEPT_CHECK, KEPT_READER, KEPT_ERROR = "disk", "check", "reader", "error"
KEPT_INDEX = "index"
# Why the pass leaves a job alone (`_left_alone`). NOT_KNOWN: undecided while a forget takes words out, which
# may be that forget's own job (not yet `_deciding`) or one kept or cut short before: the pass cannot tell.
UNDER_WAY, CUT_SHORT, NOT_KNOWN = "under way", "cut short", "not known"
PurgeRecall = Callable[[Sequence[int], Sequence[int]], Awaitable[None]]  # recall, without these turns and learnings


@dataclass
class TurnForgetting(Deciding):
    """Owns forgetting: the at-once part for whoever asks (the console), the decision of which file
    lines go (a task of its own), the file pass for the daemon."""

    layout: Layout
    transcript: Worker[TranscriptDB]
    memory: Worker[MemoryDB]
    files: MemoryFiles
    purge_recall: PurgeRecall
    wake_daemon: Callable[[str], None]
    apply: Apply  # memory.db's one writer, for the changes made outside the daemon's pass
    # The word index's rewrite after a forget (recall's `purge_state`: PURGED, PURGING or PURGE_FAILED) and its try
    # again: a job is finished only once the index's files hold no word of its turns.
    purge_state: Callable[[], str]
    purge_again: Callable[[], None]
    clock: Callable[[], float] = time.time
    judge: LineJudge = field(default_factory=LineJudge)  # which lines came from the turns
    retries: Sequence[float] = DECIDE_RETRIES
    _decisions: dict[int, Decision] = field(default_factory=dict)  # job id -> in memory only, until its pass
    # the jobs being decided (None: until recall has lost the words), which the pass leaves alone
    _deciding: dict[int, asyncio.Task[None] | None] = field(default_factory=dict)
    _stopping: bool = False
    _current: dict[int, asyncio.Event] = field(default_factory=dict)  # set once a job's current lines are decided
    _taking_out: int = 0  # forgets taking words out now (their jobs may be on disk, not yet in `_deciding`)
    _kept_passes: int = 0  # passes in a row that left a job for later
    _kept_since: float | None = None  # time.monotonic() at the first of them
    _kept_why: str | None = None  # the last one's reason (KEPT_*)
    # The jobs cut short (their turns lack tombstones: they wait for a start or a forget again), as the last count
    # found them (`_recount`), and those a forget's error left since: job -> its sessions (where the person forgets
    # them again).
    _cut_short: dict[int, list[str]] = field(default_factory=dict)
    # Of the jobs cut short, those that forgot a whole session (Health says to forget the session again, not turns):
    # marked at the forget's error, and by the count from their rows (`Job.whole_session`), across a restart too.
    _whole_session_jobs: set[int] = field(default_factory=set)
    # Forgets an error ended before their job was written, whose stand-in job memory.db refused too: their turns
    # -> (sessions, whole session), counted cut short by this process until a forget of those turns succeeds.
    _unwritten: dict[tuple[int, ...], tuple[list[str], bool]] = field(default_factory=dict)
    # The backups the last pass that looked could not read as databases: they may hold forgotten words still
    _unreadable_backups: list[str] = field(default_factory=list)
    _awaiting_purge = False  # a pass left a job for the index's rewrite under way (UNDER_WAY): its end asks for one
    _purge_failing = False  # the index's rewrite failed since it last succeeded: a pass keeps the jobs meanwhile
    _check_failing: dict[int, float] = field(default_factory=dict)  # decisions whose check fails, since (Deciding)
    _retry: asyncio.TimerHandle | None = None  # the pass they asked for (one at a time)
    # Decisions take turns (in order, the current files' parts first as they come): forgets in a row then
    # embed each line once, the next finding the vectors the one before kept.
    _one_at_a_time: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def forget(self, ids: Iterable[int], by: str, context: SessionContext = NOTHING, *,
                     whole_session: bool = False) -> Forgotten:
        """The words out of every store at once, and the job that takes the file lines out on disk; the
        lines are then decided by a task of their own (`decided` waits for it). A turn forgotten already
        whose words memory.db still holds (a forget cut short) is taken out again. The caller holds the
        agent's turns meanwhile, and says what the current session's context holds (`context`): the
        answer says whether that holds the turns too. `whole_session`: the person forgot a session, not turns
        (cut short, Health says to forget the session again)."""
        now = self.clock()
        wanted = list(ids)
        turns = await self.transcript.call(lambda t: t.get(wanted))
        old = [o.id for o in turns if o.processed == FORGOTTEN]
        left = await self.memory.call(lambda m: left_over(m, old)) if old else {}
        settled = {o.id for o in turns if o.processed == FORGOTTEN and o.id not in left}  # nothing left to take out
        turns = [o for o in turns if o.processed != FORGOTTEN or o.id in left]
        if not turns:
            self._no_longer_unwritten(settled)
            return Forgotten([], 0, now)
        texts = await asyncio.to_thread(lambda: [turn_text(o) for o in turns if o.id not in left]) + [
            t for o in turns for t in left.get(o.id, [])]
        job, decision, learnings = await self._take_out(turns, texts, now, by, None, whole_session)
        self._start_decision(job, decision)
        self._no_longer_unwritten(settled | {o.id for o in turns})
        if self._cut_short:  # this may be the forget again that finishes one: said at once, not at the pass
            self._recount([(j, await self._left_alone(j)) for j in await self.memory.call(jobs)])
        log.info("turns_forgotten", turns=len(turns), learnings=learnings, by_words=len(decision.by_words), by=by)
        return Forgotten(turns, learnings, now, context.holds(decision.by_words, decision.words, [o.id for o in turns]))

    def _no_longer_unwritten(self, forgotten: set[int]) -> None:
        """Turns now forgotten, words and all: a forget whose job was not written (`_unwritten`) is counted while
        any of its turns is not. Its turns forgotten a part at a time, or found forgotten already by a forget again,
        finish it too (it used to take a forget of them all at once that took something out, until a restart)."""
        self._unwritten = {rest: v for k, v in self._unwritten.items()
                           if (rest := tuple(i for i in k if i not in forgotten))}

    async def resume(self) -> int:
        """At start, before any turn: finish the forgets a stop or kill cut short. A job whose turns still
        have their words in the transcript (its tombstone is written last) has every step run again, and
        so has a forgotten turn memory.db still holds words of (cut short under the order of steps
        before); each step is idempotent. One that fails again (the same disk error, a store locked) stays cut
        short, counted so (`status`), for the next start or the person's forget again: memory's start goes on,
        as a cause that lasts would otherwise keep the server down at every start. Returns the forgets finished."""
        done = 0
        for job in await self.memory.call(jobs):
            turns = await self.transcript.call(lambda t, j=job: t.get(j.observation_ids))  # type: ignore[misc]
            if any(o.processed != FORGOTTEN for o in turns):
                texts = [turn_text(o) for o in turns if o.processed != FORGOTTEN]
                done += await self._resumed(turns, texts, job.id, job.whole_session)
        old = await self.transcript.call(lambda t: t.forgotten_ids())
        if left := await self.memory.call(lambda m: left_over(m, old)):
            turns = await self.transcript.call(lambda t: t.get(sorted(left)))
            done += await self._resumed(turns, [text for texts in left.values() for text in texts], None)
        return done

    async def _resumed(self, turns: list[Observation], texts: list[str], job: int | None,
                       whole_session: bool = False) -> bool:
        try:
            job, decision, learnings = await self._take_out(turns, texts, self.clock(), "a forget cut short", job,
                                                            whole_session)
        except Exception as exc:  # cut short again: `_take_out` counted it (a job written for it if it had none)
            log_expected(log, "forget_resume_failed", exc, job=job, turns=len(turns))
            return False
        self._start_decision(job, decision)
        log.warning("forget_resumed", job=job, turns=len(turns), learnings=learnings)
        return True

    async def _failed_before_its_job(self, ids: list[int], sessions: list[str], now: float,
                                     whole_session: bool) -> None:
        """A forget (a person's, or a forget again) an error ended before it wrote its job (the files' lines
        unreadable, memory.db refusing the job): the person got an error, and nothing said the turns keep their
        words. A job with no line of its own is written for them now (unless one names them already), so the forget is cut short as one whose job
        was written (counted, the next start runs it again, the batches leave the turns out, the person's forget
        again finishes it); when memory.db refuses that too, this process counts it until a forget of those turns
        succeeds (`_unwritten`)."""
        try:
            # One on disk already names them (a forget cut short before, or this one's own, its answer lost)?
            found = [j.id for j in await self.memory.call(jobs) if set(ids) <= set(j.observation_ids)]
            job = found[0] if found else await self.apply(
                lambda m: add_job(m, ids, sessions, set(), now, whole_session=whole_session))
        except Exception as exc:
            log_expected(log, "forget_failed_unrecorded", exc, turns=len(ids))
            self._unwritten[tuple(ids)] = (sessions, whole_session)
        else:
            self._cut_short[job] = sessions
            if whole_session:
                self._whole_session_jobs.add(job)
        self.wake_daemon(FORGET_PASS)

    async def _take_out(self, turns: list[Observation], texts: list[str], now: float, by: str,
                        job: int | None, whole_session: bool = False) -> tuple[int, Decision, int]:
        """The steps, in an order a kill may cut anywhere: the job on disk first (the turns, the lines the
        words find, undecided), then memory.db, then recall (its flag to write the index anew first), and
        the transcript's tombstones last, so that until then a start finds the words and runs every step
        again."""
        done = [o.id for o in turns]
        sessions = sorted({o.session_id for o in turns})
        self._taking_out += 1  # the pass leaves undecided jobs alone meanwhile: this one may be among them
        try:
            try:
                # A whole session's tool outputs are megabytes: their words, and the lines they find, off the loop.
                words = await asyncio.to_thread(words_of, list(texts))
                lines = await self._lines()
                by_words = await asyncio.to_thread(lines_from, lines.texts(), set(words))
                if job is None:
                    job = await self.apply(lambda m: add_job(m, done, sessions, by_words, now,
                                                             whole_session=whole_session))
            except Exception:
                if job is None:  # failed before its job was written: nothing on disk says so
                    await self._failed_before_its_job(done, sessions, now, whole_session)
                raise
            self._deciding[job] = None  # the pass leaves it alone: it is decided once recall has lost the words
            fresh = [o.id for o in turns if o.processed != FORGOTTEN]
            words_in_memory = True  # until memory.db is purged
            try:
                purged = await self.apply(lambda m: purge_memory(m, turns))
                words_in_memory = False
                await self.purge_recall(done, purged.learning_ids)  # recall's search finds only kept turns from here
                if fresh:
                    await self.transcript.call(lambda t: t.forget(fresh, now, by))
            except BaseException:
                del self._deciding[job]  # the next start finishes it (the pass leaves it: no tombstone)
                # No tombstone written, or memory.db still holds the words: cut short, as the pass will find it
                # (`_taken_out`; `status` says so now).
                if fresh or words_in_memory:
                    self._cut_short[job] = sessions
                    if whole_session:
                        self._whole_session_jobs.add(job)
                # The pass counts them again: asked for now, not at the next batch or forget, which on an idle
                # Sprite may never come. It waits for a batch under way, which a backlog or a slow curator makes
                # long: counted here, /healthz and the console's Health say it meanwhile too.
                self.wake_daemon(FORGET_PASS)
                raise
        finally:
            self._taking_out -= 1
        decision = Decision(words, texts + purged.contents, lines, by_words)
        self._decisions[job] = decision
        return job, decision, len(purged.learning_ids)

    async def stop(self, budget: float) -> None:
        """A stop lets the decisions under way finish within `budget` seconds (the turns' words, which
        judge the lines a batch writes after the forget, and the meaning's anchors are in memory only:
        the shutdown's last pass uses them), then cancels the rest: their jobs are on disk, undecided,
        and the daemon's pass at the next start decides them by the words the job found."""
        try:
            if not await self.decided(budget):
                log.warning("forget_decision_cut_short", budget=budget, jobs=len(self._deciding))
        finally:  # even when the stop cuts this wait itself (nothing left of its share): cancelled all the same
            if self._retry is not None:
                self._retry.cancel()
            self._stopping = True  # the shutdown's last pass leaves undecided jobs to the next start
            running = [task for task in self._deciding.values() if task is not None]
            for task in running:
                task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def rewrite_files(self) -> int:
        """The daemon's pass: each pending job's lines out of the files, their history, the batches'
        records and the backups, then both databases' WALs emptied; only then is the job finished. A job
        stays for a later pass when `_left_alone` says so, when the check of its lines cannot be made, when
        the disk will not rewrite a file or a backup, while a reader keeps a WAL, or when the pass fails in a
        way it did not expect on that job (the jobs after it go on): for those four, the pass is asked for again
        later (`_try_again_later`), once a pass. Returns the jobs done (0 from a pass that failed unexpectedly
        outside any one job: reading the jobs)."""
        try:
            return await self._rewrite_files()
        except Exception as exc:
            # A database error reading the jobs, or a bug outside any job: the pass's own failure, never the
            # curator's (the daemon's run would count it a failed call, back curation off, and with a bug never
            # curate again). Kept like the rest: tried again later, its reason in the forget status, and stuck past
            # KEPT_STUCK. It comes before any job was looked at (a job's own failure is `_rewrite_files`'): this
            # pass asked for no try yet.
            self._kept_why = KEPT_ERROR
            log_expected(log, "forget_pass_failed", exc, next_try_s=round(self._try_again_later(), 1))
            return 0

    async def _rewrite_files(self) -> int:
        """`rewrite_files`' pass itself: each job in turn (`_pass_one`). A job it fails on in a way it did not
        expect is kept for a later try (`error`), and the jobs after it go on; what fails outside a job (reading
        the jobs) goes up to `rewrite_files`."""
        done, wait = 0, None  # wait: until the pass asked for again, once a job stayed for later

        def later(why: str) -> float:
            nonlocal wait
            self._kept_why = why
            if wait is None:
                wait = self._try_again_later()
            return round(wait, 1)

        # seen: each job and why it was left alone, for `status` (`_recount`); wal_kept: a reader kept a WAL, so
        # no job can finish this pass, but each is still looked at, for the count of those cut short.
        seen: list[tuple[Job, str | None]] = []
        kept: list[Job] = []  # the jobs this pass kept for later
        wal_kept = False
        for job in await self.memory.call(jobs):
            try:
                alone = await self._left_alone(job)
            except Exception as exc:  # whether it is cut short is not known this time: what was counted stays
                seen.append((job, NOT_KNOWN))
                kept.append(job)
                log_expected(log, "forget_pass_failed", exc, job=job.id, next_try_s=later(KEPT_ERROR))
                continue
            seen.append((job, alone))
            if alone is not None or wal_kept:
                continue
            try:
                outcome = await self._pass_one(job, later)
            except Exception as exc:
                # A bug, or a database error, on this job: it stays (each step is idempotent) for the pass asked
                # for later, and the jobs after it go on now.
                outcome = KEPT_ERROR
                log_expected(log, "forget_pass_failed", exc, job=job.id, next_try_s=later(KEPT_ERROR))
            if outcome is None:
                done += 1
            elif outcome != UNDER_WAY:  # UNDER_WAY: the index's rewrite, whose end asks for the pass again
                kept.append(job)
            wal_kept = outcome == KEPT_READER  # nor can any other job finish while it is kept
        if kept:
            await self._kept_from_the_first(kept)
        # A NOT_KNOWN job leaves what /healthz says of the ones kept as it was (it said ok while a forget took
        # words out, and counted the minute again from nothing after).
        if not self._recount(seen) and wait is None:
            self._kept_passes, self._kept_since, self._kept_why = 0, None, None
        return done

    async def _kept_from_the_first(self, kept: Sequence[Job]) -> None:
        """How long the pass has kept a job for later counts from when a pass first kept one of these, in this
        process or before a restart (each job's row says when: marked now for those kept the first time). Wall
        clock across a restart, as nothing else survives one: a clock set back counts it from now; set forward,
        it counts the jump too."""
        now, first = self.clock(), [job.id for job in kept if job.kept_since is None]
        try:
            if first:
                await self.memory.call(lambda m: mark_kept(m, first, now))
        except Exception as exc:  # the count goes on from this process's first pass alone; tried again next pass
            log_expected(log, "forget_kept_unmarked", exc, jobs=len(first))
        marked = [job.kept_since for job in kept if job.kept_since is not None]
        if marked and self._kept_since is not None:
            self._kept_since = min(self._kept_since, time.monotonic() - max(0.0, now - min(marked)))

    async def _pass_one(self, job: Job, later: Callable[[str], float]) -> str | None:
        """One job's lines out of the files, their history, the batches' records and the backups, then both WALs
        emptied, and the job finished: None. Or why it stays for later (KEPT_CHECK, KEPT_DISK, KEPT_INDEX,
        KEPT_READER: no job can finish while a reader keeps a WAL), said through `later`, which asks for the pass again; or UNDER_WAY,
        while the word index is rewritten (its end asks for the pass)."""
        try:
            hashes = await self._settled(job)
        except CheckFailed as exc:
            log.warning("forget_check_failed", job=job.id, error=str(exc)[:200],
                        lines_kept_for_now=len(job.line_hashes), next_try_s=later(KEPT_CHECK))
            return KEPT_CHECK
        note = REMOVED.format(day=utc(job.created_at, "%Y-%m-%d"))
        try:
            changed = await asyncio.to_thread(strip_files, self.files, hashes, note)
            await self.memory.call(lambda m: strip_batches(m, hashes))
            unreadable: list[Path] = []
            backups = await asyncio.to_thread(purge_backups, self.layout, job.observation_ids, job.sessions,
                                              hashes, note, unreadable)
            # Passed over (sqlite can take nothing out of them) but said until a pass finds none or /healthz's
            # listing finds them gone (`backups_gone`): /healthz and memory status (which asks /healthz) name them
            # for the operator, who alone can remove them (it used to be the log alone).
            self._unreadable_backups = sorted(str(p.relative_to(self.layout.os_dir)) for p in unreadable)
        except (OSError, sqlite3.OperationalError) as exc:
            # A file or a backup the disk would not rewrite may hold the words still: the job stays (each
            # step is idempotent) for a pass asked for later, and the other jobs go on.
            log.error("forget_pass_failed", job=job.id, error=repr(exc)[:200], next_try_s=later(KEPT_DISK))
            return KEPT_DISK
        if (purge := self.purge_state()) != PURGED:
            # The word index's files may hold the turns' words (a deletion only marks them) until its rewrite is
            # done: under way, its end asks for the pass; failed, this pass tries it again and keeps the job, as
            # for a disk that will not rewrite a file (the rewrite used to be tried again only at the next forget
            # or start, the job finished meanwhile).
            if purge == PURGING and not self._purge_failing:
                self._awaiting_purge = True  # its end asks for the pass, failed or not: no retry is asked for here
                return UNDER_WAY
            # Started again here alone, at the pace of the pass's tries again (`later`): this rewrite's failure
            # asks for no pass (`purge_ended`), or each failure would ask for the pass that starts the next. One
            # under way after a failure keeps the job as well (left as not kept, what /healthz says of it was
            # cleared and the tries again came back to 5 s, at each pass that found the try again running).
            if purge != PURGING:
                self.purge_again()
            log.warning("forget_recall_purge_failed", job=job.id, next_try_s=later(KEPT_INDEX))
            return KEPT_INDEX
        if not await self._wals_emptied():
            # A reader kept a WAL through the forget's checkpoint: the database file (or its WAL) may hold
            # the turns' words still.
            next_try = later(KEPT_READER)  # first: it counts this pass among those that kept a job
            log.warning("forget_wal_kept", job=job.id, passes=self._kept_passes, next_try_s=next_try)
            return KEPT_READER
        await self.memory.call(lambda m: finish_job(m, job, len(job.observation_ids), self.clock()))
        self._decisions.pop(job.id, None)
        log.info("forget_files_rewritten", job=job.id, files=changed, backups=backups)
        return None

    def _recount(self, seen: Sequence[tuple[Job, str | None]]) -> bool:
        """The forgets cut short, from every job and why `_left_alone` leaves it (the pass's, and a forget's at
        its end, which need not wait for a batch under way to say one is finished). A NOT_KNOWN job may be one
        cut short before: those counted then stay, with those found now. Returns whether one was NOT_KNOWN."""
        found = {job.id: job.sessions for job, alone in seen if alone == CUT_SHORT}
        unknown = any(alone == NOT_KNOWN for _, alone in seen)
        self._cut_short = {**self._cut_short, **found} if unknown else found
        whole = {job.id for job, alone in seen if alone == CUT_SHORT and job.whole_session}  # as its row says
        self._whole_session_jobs = (self._whole_session_jobs | whole) & self._cut_short.keys()
        return unknown

    @property
    def cut_short_session_ids(self) -> list[str]:
        """The sessions whose turns the forgets `status` counts cut short are of: where the person forgets them
        again (ids, never a word; the console's Health names them, /healthz only counts)."""
        return sorted({session for sessions in (*self._cut_short.values(), *(s for s, _ in self._unwritten.values()))
                       for session in sessions})

    @property
    def cut_short_whole_sessions(self) -> int:
        """Of the forgets `status` counts cut short, those of a whole session: the person forgets that session
        again, where the others name turns (the console's Health says which)."""
        return len(self._whole_session_jobs & self._cut_short.keys()) + sum(w for _, w in self._unwritten.values())

    async def _left_alone(self, job: Job) -> str | None:
        """Why the pass leaves `job` alone this time, or None if it does not:
        - UNDER_WAY: its decision is under way (its end wakes the daemon again), or it is undecided at the
          shutdown's last pass (the next start decides it);
        - NOT_KNOWN: it is undecided while a forget takes words out (that forget's own job may be on disk, not
          yet in `_deciding`);
        - CUT_SHORT: its turns lack their tombstones, or memory.db still holds words of them (`_taken_out`)."""
        if job.id in self._deciding or (not job.decided and self._stopping):
            return UNDER_WAY
        if not job.decided and self._taking_out:
            return NOT_KNOWN
        return None if await self._taken_out(job) else CUT_SHORT

    def status(self, now: float) -> dict[str, Any]:
        """What the file pass has left undone, as this process knows it (no database read; `now` is
        time.monotonic()): the passes in a row that kept a job for later, for how long and why, and the jobs
        cut short. A decision whose check keeps failing keeps its job too (`_check_failing`: the pass leaves a job
        being decided alone, so no pass counts it). `degraded` by `stuck`, or while the last pass found a backup it
        could not read (`unreadable_backups`: it may hold forgotten words, and only the operator can remove it)."""
        since = [t for t in (self._kept_since, *self._check_failing.values()) if t is not None]
        kept_for = round(now - min(since), 1) if since else None
        why = self._kept_why or (KEPT_CHECK if self._check_failing else None)
        cut_short = len(self._cut_short) + len(self._unwritten)
        return {"kept_passes": self._kept_passes, "kept_for_s": kept_for, "kept_why": why,
                "cut_short_jobs": cut_short,
                "unreadable_backups": [shown_name(p) for p in self._unreadable_backups],
                "degraded": stuck(kept_for, cut_short) or bool(self._unreadable_backups)}

    @property
    def unreadable_backups(self) -> list[str]:
        """The backups the last pass that looked could not read as databases (their paths under `.os/`)."""
        return list(self._unreadable_backups)

    def backups_gone(self, gone: Sequence[str]) -> None:
        """Those of `unreadable_backups` found gone since (the operator removed them): no longer said."""
        self._unreadable_backups = [p for p in self._unreadable_backups if p not in gone]

    def purge_ended(self, purged: bool) -> None:
        """The word index's rewrite ended (recall's `on_purge_ended`). Done, the pass finishes the jobs it kept for
        it; failed, the pass is asked for only when one left a job waiting for it (UNDER_WAY) with no try again
        asked for: a rewrite the pass started again (`purge_again`) has the pass's try again coming already."""
        waiting, self._awaiting_purge, self._purge_failing = self._awaiting_purge, False, not purged
        if purged or waiting:
            self.wake_daemon(FORGET_PASS)

    def _try_again_later(self) -> float:
        """A pass left a job for later: the pass is asked for again after PASS_RETRY's wait for this many passes
        in a row (one timer, however many passes or jobs asked). Returns the wait."""
        self._kept_passes += 1
        if self._kept_since is None:
            self._kept_since = time.monotonic()
        wait = PASS_RETRY.delay(self._kept_passes, random.random())
        if self._retry is not None:
            self._retry.cancel()
        if not self._stopping:  # the shutdown's last pass asks for none: the next start's passes do it
            self._retry = asyncio.get_running_loop().call_later(wait, self.wake_daemon, FORGET_PASS)
        return wait

    async def _wals_emptied(self) -> bool:
        """Both databases' WALs copied in and emptied (`checkpoint`): what the forget's own checkpoints did,
        unless a reader kept one through them."""
        return (await self.transcript.call(lambda t: checkpoint(t.conn))
                and await self.memory.call(lambda m: checkpoint(m.conn)))

    async def _taken_out(self, job: Job) -> bool:
        """Whether every turn of the job has its tombstone (written last), and memory.db holds no word of them:
        its forget took their words out of every store. A job without is a forget an error or a cancel cut short
        (its job's own write included, whose id the forget never learned): the pass must not finish it, or the
        turns would keep their words for good; the next start's `resume` runs every step again, as does the
        person's forget again. The words left in memory.db are those of a forget again of turns forgotten
        already (the start's, of a forget cut short after its tombstone) that failed: their tombstones were
        there before it, and its finished job would have left memory.db serving them (search, the boot prompt's
        learnings) with nothing said."""
        wanted = sorted(job.observation_ids)
        if set(await self.transcript.call(lambda t: t.forgotten_among(wanted))) != set(wanted):
            return False
        return not await self.memory.call(lambda m: left_over(m, wanted))

    async def _settled(self, job: Job) -> set[str]:
        """The lines the pass takes out for `job`: as decided at the forget; for a job left undecided,
        decided now (after a restart, by the words alone: the meaning's anchors were in memory); and the
        lines written since the forget that the turns' words find, with the same kept-turn check.
        CheckFailed: the check could not be made, and the job waits for the next pass."""
        decision = self._decisions.get(job.id)
        hashes = set(job.line_hashes)
        if not job.decided:
            if decision is not None:
                hashes = await self.judge.found(decision.by_words, decision.anchors, decision.lines)
            else:
                current = await self._lines()
                texts = current.texts()
                mine = {h: texts[h] for h in hashes if h in texts}
                hashes = await self.judge.found(set(mine), [], Lines(mine, {}, set()))
            await self.memory.call(lambda m: set_job_lines(m, job.id, hashes))
        else:
            hashes = await self._still_found(hashes)
        if decision is None:
            return hashes
        current = await self._lines()
        judged = decision.lines
        # New since the forget: a line not judged then, or one judged then but written into the current
        # files since (a kept turn may say it now). Only those the words find.
        rewritten = current.current - judged.current
        unjudged = {h: text for h, text in current.texts().items()
                    if h in rewritten or (h not in judged.files and h not in judged.backups)}
        found = await asyncio.to_thread(lines_from, unjudged, set(decision.words))
        new = {h: unjudged[h] for h in found}
        if not new:
            return hashes
        checked = await self.judge.found(set(new), [], Lines(new, {}, set()))
        log.info("forget_later_lines", job=job.id, new=len(new), found=len(checked))
        return (hashes - set(new)) | checked

    async def _still_found(self, hashes: set[str]) -> set[str]:
        """Decided lines still in the current files, checked again against what is kept now: a person may
        have said the fact again since the forget (a kept turn), and then the line stays."""
        texts = await asyncio.to_thread(current_texts, self.files)
        current = {h: texts[h] for h in hashes if h in texts}
        if not current:
            return hashes
        return (hashes - set(current)) | await self.judge.found(set(current), [], Lines(current, {}, set()))

    async def _lines(self) -> Lines:
        files, current = await asyncio.to_thread(file_candidates, self.files)
        files.update(await self.memory.call(batch_candidates))
        backups = await asyncio.to_thread(backup_candidates, self.layout)
        return Lines(files, backups, current)


def stuck(kept_for: float | None, cut_short: int) -> bool:
    """Whether forgetting needs the operator: a job kept for later for KEPT_STUCK seconds and more, or a forget
    an error cut short (its turns keep their words until the next start, or the person's forget again)."""
    return cut_short > 0 or (kept_for is not None and kept_for >= KEPT_STUCK)
