"""What capture's writes are, and the files the transcript writer keeps beside transcript.db.

- The writes: a turn's observation, a session's start or end, the client id of a command that
  left no turn. Each has a key that makes it unique, so a replay is a no-op.
- The spill file (`.os/state/capture-spill.jsonl`): writes that could not land yet, as
  fsync'd JSON lines, appended in order; a torn line (a process killed mid-append, a full
  disk's short write that could not be cut off) is skipped when read, and never runs into
  the line after it.
- The status file (`.os/state/capture.json`): the failing spell of capture's writes, for
  `memory status`, which runs in another process. It has a fixed size, allocated at start while
  there is room, and is rewritten in place: a full disk (likely the spell's cause) can't stop it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import msgspec

from ...fsutil import append_whole, atomic_write, sync_dir
from ...logs import get_logger
from ...paths import Layout
from ..transcript_store import NewObservation, TranscriptDB
from .health import degraded, set_aside_journals

log = get_logger(__name__)

SPILL_NAME = "capture-spill.jsonl"
STATUS_NAME = "capture.json"


def spill_path(layout: Layout) -> Path:
    return layout.state_dir / SPILL_NAME


def status_path(layout: Layout) -> Path:
    return layout.state_dir / STATUS_NAME


class ObservationWrite(msgspec.Struct, tag="observation", frozen=True):
    observation: NewObservation

    def apply(self, db: TranscriptDB) -> None:
        db.append(self.observation)


class SessionWrite(msgspec.Struct, tag="session", frozen=True):
    session_id: str
    event: Literal["start", "end"]
    at: float

    def apply(self, db: TranscriptDB) -> None:
        if self.event == "start":
            db.start_session(self.session_id, self.at)
        else:
            db.end_session(self.session_id, self.at)


class CommandWrite(msgspec.Struct, tag="command", frozen=True):
    """A message the agent took that left no turn (a command the CLI ran itself): its client id."""

    client_id: str
    session_id: str
    turn_id: str | None
    at: float

    def apply(self, db: TranscriptDB) -> None:
        db.record_command(self.client_id, self.session_id, self.turn_id, self.at)


Write = ObservationWrite | SessionWrite | CommandWrite
_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Write] = msgspec.json.Decoder(Write)


def read_spill(path: Path) -> list[Write | None]:
    """The writes in a spill file, one per line, in order. A line that can't be read (the torn
    end of an append the process died in) is None, and logged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    out: list[Write | None] = []
    for n, line in enumerate(data.splitlines(), start=1):
        try:
            out.append(_decoder.decode(line))
        except msgspec.MsgspecError as exc:
            log.error("capture_spill_line_unreadable", path=str(path), line=n, error=str(exc)[:200])
            out.append(None)
    return out


def spill_count(path: Path) -> int:
    """How many writes a spill file holds (for `memory status`, from another process)."""
    try:
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0


class SpillFile:
    """The spill file's one writer, on the capture files' thread: appends, fsync'd."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._named = False  # its folder was synced since the file was made: its name is durable

    def append(self, writes: list[Write]) -> None:
        """Append the writes, fsync'd, with no buffer (a buffered file's own cut-back flushes first,
        fails again on a full disk, and left the torn bytes). An append that fails is cut off again;
        a tail torn all the same (a kill mid-append, a cut that failed) is ended with a newline
        first, so it stays one unreadable line and never swallows the next. The folder is synced
        too until one such sync has succeeded since the file was made: until then a power cut may
        lose the file's name, and with it every line the fsync made durable."""
        data = b"".join(_encoder.encode(w) + b"\n" for w in writes)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                self._named = False  # made now (or again): its name is not known durable
            elif os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            append_whole(fd, data, size, os.fsync)
            if not self._named:
                try:
                    sync_dir(self.path.parent)
                except OSError:
                    with contextlib.suppress(OSError):  # not durable: counted as not appended
                        os.ftruncate(fd, size)
                    raise
                self._named = True
        finally:
            os.close(fd)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self._named = False


def write_key(write: Write) -> tuple[str, int | str]:
    """What makes a write unique: a turn's (session, sequence), a session's (id, event), a command's
    (session, "command " + its client id)."""
    if isinstance(write, ObservationWrite):
        return write.observation.session_id, write.observation.sequence_num
    if isinstance(write, CommandWrite):
        return write.session_id, f"command {write.client_id}"
    return write.session_id, write.event


@dataclass
class CaptureHealth:
    """The failing spell of capture's writes: what /healthz and `memory status` show."""

    failing_since: float | None = None
    failures: int = 0  # failed attempts in a row
    last_error: str | None = None
    next_retry_at: float | None = None

    def report(self, queued: int, spilled: int) -> dict[str, Any]:
        return {"queued": queued, "spilled": spilled,
                "consecutive_failures": self.failures, "failing_since": self.failing_since,
                "last_error": self.last_error, "next_retry_at": self.next_retry_at}


STATUS_BYTES = 4096  # one block: the status file's size, for good


def prepare_status(path: Path) -> None:
    """Allocate the status file at its fixed size (blank: no spell), unless it has it. Blocking."""
    with contextlib.suppress(OSError):
        if path.stat().st_size == STATUS_BYTES:
            return
    atomic_write(path, b" " * STATUS_BYTES)


def save_status(path: Path, health: CaptureHealth) -> None:
    """Write the spell, or blank it when there is none: in place, within the file's allocated
    size, so no new block and no temp file is needed. Blocking; a write that fails is skipped."""
    data = b"" if health.failing_since is None else msgspec.json.encode({
        "failing_since": health.failing_since, "consecutive_failures": health.failures,
        "last_error": health.last_error, "next_retry_at": health.next_retry_at})
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, data[:STATUS_BYTES].ljust(STATUS_BYTES), 0)
        finally:
            os.close(fd)


def read_status(layout: Layout) -> dict[str, Any]:
    """What `memory status` shows about capture: the server's saved spell, the spill file, and the
    journals set aside (`degraded` by the rule /healthz applies, to what this process can see)."""
    saved: dict[str, Any] = {}
    with contextlib.suppress(OSError, msgspec.MsgspecError):
        raw = status_path(layout).read_bytes().strip()
        if raw:
            saved = msgspec.json.decode(raw)
    health = CaptureHealth(saved.get("failing_since"), int(saved.get("consecutive_failures") or 0),
                           saved.get("last_error"), saved.get("next_retry_at"))
    report = health.report(0, spill_count(spill_path(layout)))
    del report["queued"]  # only the server knows its queue
    report["journals_set_aside"] = [p.name for p in set_aside_journals(layout.state_dir)]
    report["degraded"] = degraded(report)
    return report
