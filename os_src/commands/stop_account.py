"""What a stopped server left of its stop, for `sprite-os service stop` to say: its account
(stopping.STOP_REPORT, written as the stop ends), or, where a full or read-only disk refused that
file, what it logged during the stop (its log file, through a rotation, and server.out)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..stopping import UNFINISHED_SAID


def report_id(path: Path) -> tuple[int, int] | None:
    """Which file `path` is (None: none is there); the server writes a new one (atomic_write)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def account_steps(report: Path, earlier: tuple[int, int] | None = None) -> list[str] | None:
    """The steps of memory's stop the server said did not finish (None: no account: a full disk
    refused it, or a server that predates it). `earlier`: an earlier stop's account that could not be
    removed (a read-only disk), which is not this stop's."""
    if earlier is not None and report_id(report) == earlier:
        return None
    try:
        steps = json.loads(report.read_bytes()).get("unfinished", [])
    except (OSError, ValueError, AttributeError):
        return None
    return [str(s) for s in steps] if isinstance(steps, list) else None


@dataclass
class LoggedStop:
    """What the server logged of its stop, read when its account (STOP_REPORT) is missing."""

    began: bool = False  # `server_stopping`
    ended: bool = False  # `server_stopped`: every step ran, or was cut by its share
    unfinished: list[str] = field(default_factory=list)  # `server_stopped_with_memory_unfinished`
    unwritten: str = ""  # `stop_report_unwritten`: why the account could not be written

    @property
    def steps(self) -> list[str] | None:
        """The account the log gives (None: it says nothing of this stop)."""
        if self.ended:
            return self.unfinished
        return ["memory"] if self.began else None  # it began and never ended: memory's stop did not finish


def _logged_event(line: str) -> tuple[str, dict[str, Any]]:
    """A log line's event and fields: JSON (the service's log), or key=value (development's)."""
    with contextlib.suppress(ValueError):
        fields = json.loads(line)
        if isinstance(fields, dict):
            return str(fields.get("event", "")), fields
    event = next((w[6:] for w in line.split() if w.startswith("event=")), "")
    return event, {"line": line}


def _logged_steps(fields: dict[str, Any]) -> list[str]:
    steps = fields.get("steps")
    if isinstance(steps, list):
        return [str(s) for s in steps]
    text = str(fields.get("line", ""))  # key=value: the known steps named in its list
    return [step for step in UNFINISHED_SAID if f"'{step}'" in text or f'"{step}"' in text]


@dataclass(frozen=True)
class LogMark:
    """Where a log stood at the SIGTERM: its size, and which file it was (a rotation renames it `.1`)."""

    offset: int
    inode: int | None


def _logged_lines(path: Path, mark: LogMark) -> Iterator[str]:
    """The lines logged to `path` since `mark`: when the file was rotated since (logs.py renames it
    `.1` at its size), the rest of the renamed file, then all of the new one."""
    parts: list[tuple[Path, int]] = [(path, mark.offset)]
    with contextlib.suppress(OSError):
        if mark.inode is not None and path.stat().st_ino != mark.inode:
            parts = [(path, 0)]
            renamed = path.with_name(path.name + ".1")
            if renamed.stat().st_ino == mark.inode:
                parts.insert(0, (renamed, mark.offset))
    for part, offset in parts:
        try:
            with open(part, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(offset if offset <= size else 0)  # truncated since: all of it is this stop's
                # All of it, a line at a time (a log rotates at its size: logs.py): a storm of errors
                # during the stop must not hide its last lines.
                for raw in f:
                    yield raw.decode("utf-8", "replace").rstrip("\r\n")
        except OSError:
            continue


def read_logged_stop(logs: Mapping[Path, LogMark]) -> LoggedStop:
    """What the server logged of its stop, in each log from where it stood at the SIGTERM."""
    stop = LoggedStop()
    for path, mark in logs.items():
        for line in _logged_lines(path, mark):
            event, fields = _logged_event(line)
            if event == "server_stopping":
                stop.began = True
            elif event == "server_stopped":
                stop.ended = True
            elif event == "server_stopped_with_memory_unfinished":
                stop.unfinished = _logged_steps(fields)
            elif event == "stop_report_unwritten":
                stop.unwritten = str(fields.get("error", "")) or "see the log"
    return stop




def log_marks(paths: list[Path]) -> dict[Path, LogMark]:
    offsets = {}
    for path in paths:
        try:
            st = path.stat()
            offsets[path] = LogMark(st.st_size, st.st_ino)
        except OSError:
            offsets[path] = LogMark(0, None)  # not there yet: all of it is this stop's
    return offsets
