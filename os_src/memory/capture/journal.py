"""The turns not yet safe in transcript.db, on disk as they happen (.os/state/turn-journal.json).

Capture records a turn when it ends. A server killed mid-turn would lose it, and with it
the task a "Continue" must pick up. So the open turn (the person's message, the tool calls
so far, the last thing the agent said) is kept in this file as it goes, and so is a closed
turn until its observation is durable (in transcript.db, or in the writer's spill file).
At the next start, whatever the file holds is recorded: a turn that never ended with a note
that the server stopped before it did. Replaying a turn that had landed changes nothing
(the unique (session, sequence) key).

The file is rewritten whole and atomically, off the event loop, at most every DELAY
seconds (changes in between are coalesced): a kill -9 leaves the old content or the new.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import msgspec

from ...fsutil import atomic_write
from ...logs import get_logger
from ...paths import Layout
from ..transcript_store import NewObservation

log = get_logger(__name__)

DELAY = 0.05  # seconds: a tool call's events within it cost one rewrite
MAX_CLOSED = 32  # closed turns kept while their writes wait; more wait in the writer's memory only
JOURNAL_NAME = "turn-journal.json"
STOPPED_NOTE = "(the server stopped before the turn ended)"

Key = tuple[str, int]  # (session_id, sequence_num)


def journal_path(layout: Layout) -> Path:
    return layout.state_dir / JOURNAL_NAME


class Entry(msgspec.Struct, frozen=True):
    observation: NewObservation
    ended: bool


def recover(path: Path) -> list[NewObservation]:
    """The turns an earlier run left in its journal, as observations to record, oldest first.
    An unreadable journal is logged and costs only what it held; temp files a kill left are removed."""
    for debris in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            debris.unlink()
    try:
        entries = msgspec.json.decode(path.read_bytes(), type=list[Entry])
    except FileNotFoundError:
        return []
    except (OSError, msgspec.MsgspecError) as exc:
        log.error("turn_journal_unreadable", path=str(path), error=str(exc)[:200])
        return []
    out = []
    for entry in entries:
        obs = entry.observation
        if not entry.ended:
            obs = msgspec.structs.replace(obs, agent_response=f"{obs.agent_response}\n{STOPPED_NOTE}".strip())
        out.append(obs)
    if out:
        log.warning("turn_journal_recovered", turns=len(out), unfinished=sum(not e.ended for e in entries))
    return sorted(out, key=lambda o: o.timestamp)


class TurnJournal:
    """The journal file's one writer. Called from the event loop; writes on `executor`'s thread."""

    def __init__(self, path: Path, executor: Executor, delay: float = DELAY) -> None:
        self._path = path
        self._executor = executor
        self._delay = delay
        self._open: Callable[[], NewObservation] | None = None  # the open turn, as it would record now
        self._closed: dict[Key, NewObservation] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._written: asyncio.Future[None] | None = None

    def restore(self, observations: list[NewObservation]) -> None:
        """Keep what `recover` found until it is durable again (a second crash must not lose it)."""
        for obs in observations:
            self._closed[(obs.session_id, obs.sequence_num)] = obs
        self._changed()

    def opened(self, snapshot: Callable[[], NewObservation]) -> None:
        """A turn began; `snapshot()` is what it would record now. A turn still open was never
        sent (the runtime closes every turn it sent): it is forgotten."""
        self._open = snapshot
        self._changed()

    def touched(self) -> None:
        """The open turn changed (a tool call, a result, the agent's text)."""
        if self._open is not None:
            self._changed()

    def closed(self, obs: NewObservation | None) -> None:
        """The open turn ended: as `obs` (its observation, kept until durable), or not recorded."""
        self._open = None
        if obs is not None:
            self._closed[(obs.session_id, obs.sequence_num)] = obs
            while len(self._closed) > MAX_CLOSED:
                self._closed.pop(next(iter(self._closed)))
        self._changed()

    def durable(self, key: Key) -> None:
        if self._closed.pop(key, None) is not None:
            self._changed()

    async def flush(self) -> None:
        """At shutdown, once the runtime has stopped: write what is pending, and wait for it. A turn
        still open then was never sent (every turn sent is closed, at worst as cut short)."""
        if self._open is not None:
            self._open = None
            self._changed()
        if self._timer is not None:
            self._timer.cancel()
            self._write()
        if self._written is not None:
            with contextlib.suppress(Exception):
                await self._written

    # ------------------------------------------------------------ writing

    def _changed(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._write)

    def _write(self) -> None:
        self._timer = None
        entries = [Entry(obs, ended=True) for obs in self._closed.values()]
        if self._open is not None:
            try:
                entries.append(Entry(self._open(), ended=False))
            except Exception as exc:  # a bug in capture: the journal goes on without the open turn
                log.error("turn_journal_snapshot_failed", error=repr(exc)[:200])
        data = msgspec.json.encode(entries) if entries else None
        self._written = asyncio.get_running_loop().run_in_executor(self._executor, _save, self._path, data)
        self._written.add_done_callback(_log_failure)


def _save(path: Path, data: bytes | None) -> None:
    if data is None:
        path.unlink(missing_ok=True)
    else:
        atomic_write(path, data, mode=0o600)


def _log_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and (exc := future.exception()) is not None:
        log.error("turn_journal_write_failed", error=repr(exc)[:200])
