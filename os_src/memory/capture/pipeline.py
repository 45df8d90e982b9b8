"""Capture's parts, wired as one: what the memory system starts, stops and hands the runtime.

- the recorder (recorder.py), which the runtime's stream feeds and which closes each turn;
- the two ways a closed turn reaches the disk: the transcript writer (writer.py: transcript.db,
  or its spill file) and the turn journal (journal.py);
- the acks (acks.py), which say when a closed turn is durable by either way;
- one thread that does the writer's and the journal's file work, in order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ...db_worker import Worker
from ...paths import Layout
from ..hooks import HookTimings
from ..transcript_store import TranscriptDB
from .acks import Acks
from .health import degraded
from .journal import TurnJournal, journal_path, recover_at_start
from .recorder import TurnRecorder
from .spill import CommandWrite, ObservationWrite, Write, write_key
from .writer import TranscriptWriter


class Capture:
    def __init__(self, transcript: Worker[TranscriptDB], layout: Layout, *, on_recorded: Callable[[], None],
                 on_landed: Callable[[], None] = lambda: None, timings: HookTimings | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`on_recorded()`: a turn was closed and queued; `on_landed()`: one is durable."""
        self._layout = layout
        self._on_landed = on_landed
        self._files = ThreadPoolExecutor(max_workers=1, thread_name_prefix="capture-files")
        self.acks = Acks()
        self.writer = TranscriptWriter(transcript, layout, self._files, on_durable=self._durable,
                                       on_failed=self._refused)
        self.journal = TurnJournal(journal_path(layout), self._files, on_saved=self.acks.journal_saved,
                                   on_full=self.writer.spill_waiting)
        self.recorder = TurnRecorder(self.writer, on_recorded, timings, self.journal, self.acks, clock)

    async def start(self, replay_budget: float) -> None:
        """What an earlier run left unwritten comes first: its spill file, then its turn journal (the
        turn it was killed in, recorded with a note); at most `replay_budget` seconds are waited for it."""
        loop = asyncio.get_running_loop()
        recovered = await loop.run_in_executor(self._files, recover_at_start, journal_path(self._layout))
        self.journal.restore(recovered.observations, recovered.stuck)
        await self.writer.start([ObservationWrite(obs) for obs in recovered.observations])
        await self.writer.drained(replay_budget)

    async def stop(self, budget: float) -> bool:
        """Land what is queued within `budget` seconds (the rest stays in the spill file), then
        write the journal's last state. False: some did not land."""
        landed = await self.writer.stop(budget)
        await self.journal.flush()
        self._files.shutdown(wait=False)  # idle by now: the journal and the writer are done
        return landed

    def status(self, journals_set_aside: list[str]) -> dict[str, Any]:
        """The writer's state, the turns the person was told are not saved, and the turn journal's:
        `degraded` by health.degraded, the rule `memory status` applies too. `journals_set_aside`: the
        journals set aside as the caller's last listing of the folder found them, off the loop
        (MemorySystem.set_aside; older when a listing is slow or fails), whichever start set them aside:
        one the operator removed or replayed no longer counts, without a restart."""
        report = self.writer.status()
        report["not_saved"], report["not_saved_total"] = len(self.acks.unsaved), self.acks.unsaved_total
        report["journals_set_aside"] = journals_set_aside
        report["journal_stuck"] = self.journal.stuck
        report["degraded"] = degraded(report)
        return report

    def _refused(self, writes: list[Write]) -> None:
        """The spill file could not take these writes. A turn has the journal too; a command's id (spilled at
        once, transcript.db healthy or not) has only transcript.db left, so it fails only once that fails too
        (its writes failing: the writer then spills again, and this is called again)."""
        transcript_failing = self.writer.failing
        self.acks.transcript_failed(write_key(w) for w in writes if isinstance(w, ObservationWrite)
                                    or (transcript_failing and isinstance(w, CommandWrite)))

    def _durable(self, write: Write) -> None:
        if isinstance(write, CommandWrite):  # a command's client id: acknowledged, nothing for the journal or curation
            self.acks.durable(write_key(write))
        elif isinstance(write, ObservationWrite):
            key = _turn_key(write)
            self.journal.durable(key)
            self.acks.durable(key)
            self._on_landed()  # in transcript.db (or the spill file, which lands later)


def _turn_key(write: ObservationWrite) -> tuple[str, int]:
    return write.observation.session_id, write.observation.sequence_num
