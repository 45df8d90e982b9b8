"""A clock that jumps back: order comes from sequence (ids, turn numbers, the order things were
written), never from timestamps, wherever order matters. Found with the wall clock set back 2 h:
turn 7 was stamped before turn 6, and everything that ordered by timestamp put it first."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from claude_agent_sdk import ResultMessage

from sprite_os.db_worker import Worker
from sprite_os.memory.capture.journal import Entry, journal_path, recover
from sprite_os.memory.capture.pipeline import Capture
from sprite_os.memory.capture.spill import ObservationWrite, SpillFile, spill_path
from sprite_os.memory.files import MemoryFiles
from sprite_os.memory.loader import BootLoader
from sprite_os.memory.memory_store import MemoryDB
from sprite_os.memory.transcript_store import NewObservation, TranscriptDB
from sprite_os.paths import Layout

T = 1_790_000_000.0
BACK = 2 * 3600.0


class JumpingClock:
    """The wall clock: a second per reading, until it is set back."""

    def __init__(self) -> None:
        self.now = T

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def result(text: str) -> ResultMessage:
    return ResultMessage(subtype="success", duration_ms=5, duration_api_ms=4, is_error=False, num_turns=1,
                         session_id="x", result=text)


@pytest.fixture
async def capture(tmp_path: Path) -> AsyncIterator[tuple[Capture, JumpingClock, Worker[TranscriptDB]]]:
    layout = Layout(tmp_path)
    layout.ensure()
    clock = JumpingClock()
    db: Worker[TranscriptDB] = Worker("t", lambda: TranscriptDB(layout.transcript_db))
    c = Capture(db, layout, on_recorded=lambda: None, clock=clock)
    await c.start(1.0)
    c.recorder.start_session("s1")
    yield c, clock, db
    await c.stop(5)
    await db.close()


async def test_turns_recorded_across_a_jump_back_stay_in_the_order_they_happened(
        capture: tuple[Capture, JumpingClock, Worker[TranscriptDB]]) -> None:
    c, clock, db = capture
    for n in range(1, 8):
        if n == 7:
            clock.now -= BACK  # the clock is set back 2 h between turns 6 and 7
        record = c.recorder.open(f"turn {n}")
        record.close(result(f"answer {n}"))
        assert await record.durable(budget=10)
    assert await c.writer.drained(10)
    pending = await db.call(lambda t: t.pending())
    assert [o.sequence_num for o in pending] == list(range(1, 8))
    assert pending[6].timestamp < pending[5].timestamp  # stamped as the clock said...
    assert await db.call(lambda t: t.oldest_pending_timestamp()) == pending[0].timestamp  # ...ordered by sequence
    recent = await db.call(lambda t: t.recent_pending(3))
    assert [o.sequence_num for o in recent] == [7, 6, 5]


async def test_the_boot_prompt_shows_turns_and_learnings_in_the_order_they_came(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.ensure()
    memory: Worker[MemoryDB] = Worker("m", lambda: MemoryDB(layout.memory_db))
    db = MemoryDB(layout.memory_db)
    now = time.time()
    with db.conn:
        for n, at in ((1, now - 60), (2, now - 30), (3, now - BACK)):  # the third learned after a jump back
            db.conn.execute("INSERT INTO learnings (created_at, type, content, content_key) VALUES (?, 'FACT', ?, ?)",
                            (at, f"fact {n}", f"fact {n}"))
    db.close()
    turns = [NewObservation(T + n, "s1", n, f"message {n}", "[]", f"answer {n}") for n in (1, 2)]
    turns.append(NewObservation(T + 2 - BACK, "s1", 3, "message 3", "[]", "answer 3"))

    async def pending(limit: int) -> list[NewObservation]:
        return turns[-limit:]

    prompt = await BootLoader(MemoryFiles(layout), memory, pending).boot_prompt()
    await memory.close()
    learned = prompt[prompt.index("## Learned in the last"):]
    assert learned.index("fact 3") < learned.index("fact 2") < learned.index("fact 1")  # newest first, by order
    section = prompt[prompt.index("## Recent turns"):]
    assert section.index("message 1") < section.index("message 2") < section.index("message 3")


async def test_a_restart_replays_the_spill_file_and_the_journal_in_turn_order(tmp_path: Path) -> None:
    """What a killed server left: turns 5 and 7 in the spill file, turn 6 (stamped 2 h earlier, the
    clock having jumped) in the journal. They land 5, 6, 7."""
    layout = Layout(tmp_path)
    layout.ensure()

    def turn(n: int, at: float) -> NewObservation:
        return NewObservation(at, "s1", n, f"turn {n}", "[]", f"answer {n}")

    SpillFile(spill_path(layout)).append([ObservationWrite(turn(5, T + 5)), ObservationWrite(turn(7, T + 7))])
    journal_path(layout).write_bytes(msgspec.json.encode([Entry(turn(6, T + 6 - BACK), ended=True)]) + b"\n")
    assert [o.sequence_num for o in recover(journal_path(layout))] == [6]
    db: Worker[TranscriptDB] = Worker("t", lambda: TranscriptDB(layout.transcript_db))
    c = Capture(db, layout, on_recorded=lambda: None)
    await c.start(5.0)
    assert await c.writer.drained(10)
    rows = await db.call(lambda t: [(o.id, o.sequence_num) for o in t.iter_all()])
    await c.stop(5)
    await db.close()
    assert rows == [(1, 5), (2, 6), (3, 7)]
