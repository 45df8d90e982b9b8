"""The durable write's cost: from a turn's close to the moment it is on disk, which is what
`turn_complete` now waits for. Side by side, turn by turn, in one scratch workspace each:

- `full`: today's: transcript.db's commit with synchronous=FULL (the WAL synced at every commit),
  raced by the turn journal's fsync'd append, the first of the two answering;
- `normal`: the same commit with synchronous=NORMAL (no sync until a checkpoint): what a commit
  cost before, when a power loss could take the last turns a person had seen complete;
- `journal`: transcript.db's thread held busy (a long read): the turn journal's fsync'd append
  takes the turn (saved at the close, racing the commit);
- `fsync`: one fsync of a 4 KiB append on the same disk, for reference.

The end-to-end cost, a turn through the real CLI with memory on against off, is `hooks`'s row.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from claude_agent_sdk import ResultMessage

from bench.stats import summary_ms
from sprite_os.db_worker import Worker
from sprite_os.memory.capture.pipeline import Capture
from sprite_os.memory.transcript_store import TranscriptDB
from sprite_os.paths import Layout


class _Normal(TranscriptDB):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.conn.execute("PRAGMA synchronous=NORMAL")


class _Held(TranscriptDB):
    """transcript.db whose thread is busy while `hold` is clear."""

    hold = threading.Event()

    def group(self) -> Any:
        self.hold.wait(30)
        return super().group()


_RESULT = ResultMessage(subtype="success", duration_ms=1, duration_api_ms=1, is_error=False, num_turns=1,
                        session_id="bench", result="An answer of a typical length. " * 20)


async def _path(root: Path, opener: Callable[[Path], TranscriptDB]) -> tuple[Capture, Worker[TranscriptDB]]:
    layout = Layout(root)
    layout.ensure()
    db: Worker[TranscriptDB] = Worker("t", lambda: opener(layout.transcript_db))
    capture = Capture(db, layout, on_recorded=lambda: None)
    await capture.start(1.0)
    capture.recorder.start_session("bench")
    await capture.writer.drained(5)
    return capture, db


async def _turn(capture: Capture, n: int) -> float:
    record = capture.recorder.open(f"turn {n}: a message of a typical length, " + "words " * 30)
    started = time.perf_counter()
    record.close(_RESULT)
    assert await record.durable(budget=30)
    return time.perf_counter() - started


def _fsyncs(folder: Path, n: int) -> list[float]:
    out = []
    fd = os.open(folder / "fsync.probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(n):
            os.write(fd, b"x" * 4096)
            started = time.perf_counter()
            os.fsync(fd)
            out.append(time.perf_counter() - started)
    finally:
        os.close(fd)
    return out


async def durable(turns: int) -> dict[str, Any]:
    samples: dict[str, list[float]] = {"full": [], "normal": [], "journal": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = {"full": await _path(root / "full", TranscriptDB), "normal": await _path(root / "normal", _Normal),
                 "journal": await _path(root / "journal", _Held)}
        _Held.hold.set()
        try:
            for n in range(turns + 3):
                for name, (capture, _db) in paths.items():
                    if name == "journal":
                        _Held.hold.clear()
                    took = await _turn(capture, n)
                    if name == "journal":
                        _Held.hold.set()
                        await capture.writer.drained(30)
                    if n >= 3:
                        samples[name].append(took)
        finally:
            _Held.hold.set()
            for capture, db in paths.values():
                await capture.stop(10)
                await db.close()
        fsync = _fsyncs(root, turns)
    out: dict[str, Any] = {name: summary_ms(s) for name, s in samples.items()}
    out["fsync"] = summary_ms(fsync)
    out["added_median_ms"] = round(out["full"]["median_ms"] - out["normal"]["median_ms"], 3)
    return out
