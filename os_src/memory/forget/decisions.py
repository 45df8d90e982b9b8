"""A forget's decision of which file lines came from its turns, on a task of its own after the forget
answers (`TurnForgetting` runs it): the current files' lines first (a new session's boot waits for
those alone), then the rest; a check that fails is tried again after a pause, its lines kept in the
files meanwhile. What it decides goes in the forget's job, for the daemon's pass."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import log_expected
from ...logs import get_logger
from ..memory_store import MemoryDB
from .jobs import FORGET_PASS, decide_current, set_job_lines
from .judge import CheckFailed, LineJudge
from .lines import Lines

log = get_logger(__name__)

# A decision whose kept-turn check failed is tried again after these pauses (seconds), the last again and
# again until one succeeds (with no new turn, nothing else would try it); its lines stay in the files
# (out of the boot prompt) meanwhile.
DECIDE_RETRIES = (2.0, 10.0, 60.0, 300.0)
Apply = Callable[[Callable[[MemoryDB], Any]], Awaitable[Any]]  # MemoryDaemon.apply


@dataclass
class Decision:
    """What a forget keeps in memory (never on disk) until the daemon's pass: the turns' words, what
    they and their learnings said (the meaning's anchors), the lines judged and the words' guess."""

    words: set[str]
    anchors: list[str]
    lines: Lines
    by_words: set[str]


class Deciding:
    """The decisions under way, for `TurnForgetting` (whose fields these are): one task each, taking
    turns, its current files' part told apart (`current_decided`)."""

    judge: LineJudge
    apply: Apply
    retries: Sequence[float]
    wake_daemon: Callable[[str], None]
    _deciding: dict[int, asyncio.Task[None] | None]
    _current: dict[int, asyncio.Event]
    _check_failing: dict[int, float]  # job -> time.monotonic() at its decision's first failed check, until it ends
    _one_at_a_time: asyncio.Lock

    def _start_decision(self, job: int, decision: Decision) -> None:
        self._current[job] = asyncio.Event()
        self._deciding[job] = asyncio.create_task(self._decide(job, decision), name=f"forget-decide-{job}")

    async def decided(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, for the forgets deciding their lines. True if none is left."""
        running = [task for task in self._deciding.values() if task is not None]
        if not running:
            return True
        _, pending = await asyncio.wait(running, timeout=budget)
        return not pending

    async def _decide(self, job: int, decision: Decision) -> None:
        """The current files' lines first (tens of them: a new session's boot waits for those alone, and
        the boot prompt leaves out what they find from then on), then the rest: their history, the
        batches' records, the backups."""
        current, rest = decision.lines.split()
        found_current: set[str] | None = None
        try:
            pauses = itertools.chain(self.retries, itertools.repeat(self.retries[-1] if self.retries else DECIDE_RETRIES[-1]))
            for attempt, pause in enumerate(pauses):
                try:
                    if found_current is None:
                        async with self._one_at_a_time:
                            found_current = await self.judge.found(decision.by_words & set(current.files),
                                                                   decision.anchors, current)
                        await self.apply(lambda m, c=set(current.files), f=found_current:  # type: ignore[misc]
                                         decide_current(m, job, c, f))
                        self._current_ready(job)
                    async with self._one_at_a_time:
                        hashes = found_current | await self.judge.found(decision.by_words - set(current.files),
                                                                        decision.anchors, rest)
                except CheckFailed as exc:
                    # Precision first: a line the check could not judge stays in the files until it can. The
                    # pass leaves the job alone meanwhile: /healthz says it is kept from here (`status`).
                    self._check_failing.setdefault(job, time.monotonic())
                    log.warning("forget_check_failed", job=job, attempt=attempt + 1, error=str(exc)[:200],
                                lines_kept_for_now=len(decision.by_words), next_try_s=pause)
                    await asyncio.sleep(pause)
                    continue
                await self.apply(lambda m, h=hashes: set_job_lines(m, job, h))  # type: ignore[misc]
                log.info("forget_lines_decided", job=job, lines=len(hashes))
                # No await from this wake to the pop in `finally`: the pass it wakes skips a job still in
                # `_deciding`, and nothing would wake it again.
                self.wake_daemon(FORGET_PASS)
                return
        except Exception as exc:  # a database error: the job stays undecided, for the daemon's pass
            log_expected(log, "forget_decision_failed", exc)
            # Asked for now (no await before the pop below): nothing else might wake it on an idle Sprite.
            self.wake_daemon(FORGET_PASS)
        finally:
            self._current_ready(job)
            self._deciding.pop(job, None)
            self._check_failing.pop(job, None)

    def _current_ready(self, job: int) -> None:
        if (ready := self._current.pop(job, None)) is not None:
            ready.set()

    async def current_decided(self, budget: float) -> bool:
        """Wait, at most `budget` seconds, until the forgets deciding their lines have decided the current
        files' (what a new session's boot prompt holds). True if none is left."""
        waiting = [asyncio.create_task(ready.wait()) for ready in self._current.values()]
        if not waiting:
            return True
        _, pending = await asyncio.wait(waiting, timeout=budget)
        for task in pending:
            task.cancel()
        return not pending
