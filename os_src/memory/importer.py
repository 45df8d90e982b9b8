"""`sprite-os memory import FILE.jsonl`: past conversations into transcript.db, as turns like any other.

One turn a line: `{"session": ..., "timestamp": ..., "user": ..., "assistant": ...}`, with
`assistant` and `tool_calls` optional and `timestamp` in epoch seconds or ISO 8601 (UTC when
no offset is given), from 1970 to tomorrow. A bad line is reported with its number and why
(not JSON, nested too deeply, a number out of range, a missing or mistyped field) and skipped;
every other line is imported. Text is cleaned, bounded and stripped of `<private>` blocks
exactly as capture does it. A UTF-8 byte order mark is allowed.

A turn's identity is its content and its place in time: its session, its timestamp and its
text (the person's message and the answer, as stored). So importing a file again adds exactly
the turns the workspace lacks: a line fixed since, a session's new turns, the n-th copy of a
turn the file repeats. A turn a person forgot counts as recorded at its session and time, so its
words never come back. A new turn is numbered after its session's last one (the number only
identifies it); its place in the session is by time (see memory/recall/episodes.py).

Two steps, so that transcript.db keeps one writer: `read_turns` checks the lines (in the CLI)
and the good ones go to the import inbox (memory/import_inbox.py); `apply` records them, run by
the workspace's writer: the running server, or the CLI when it holds the writer lock.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO, TypeVar

import msgspec

from ..text import clean_text, utc
from .capture.recorder import (
    MAX_TOOL_CALLS,
    RESPONSE_CHARS,
    TOOL_INPUT_CHARS,
    TOOL_OUTPUT_CHARS,
    USER_MESSAGE_CHARS,
    strip_private,
)
from .transcript_store import ImportedTurn, TranscriptDB

MAX_LINE_CHARS = 1_000_000
AHEAD = 86_400.0  # a timestamp may be this far past `now` (clocks differ), not more
APPLY_CHUNK = 500  # turns a transaction records
T = TypeVar("T")


class BadLine(ValueError):
    pass


@dataclass
class ReadReport:
    """What reading the file found."""

    lines: int = 0
    turns: int = 0
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    sessions: set[str] = field(default_factory=set)


@dataclass
class ApplyReport:
    """What recording the turns did."""

    turns: int = 0
    added: int = 0
    already: int = 0  # recorded before: the same session, timestamp and text


def _text(value: Any, limit: int) -> str:
    text = strip_private(clean_text(value[: limit + 2_000]))
    return text if len(text) <= limit else text[:limit] + "…[more]"


def timestamp(value: Any, now: float) -> float:
    """Epoch seconds from a number or an ISO 8601 string, between 1970 and a day past `now`."""
    if isinstance(value, bool):
        raise BadLine("timestamp must be epoch seconds or ISO 8601")
    if isinstance(value, (int, float)):
        at = float(value) if isinstance(value, float) or abs(value) < 1 << 60 else math.inf
        shown = f"{value:.6g}" if isinstance(value, float) or abs(value) < 1 << 60 else "a number that large"
    elif isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise BadLine(f"timestamp {value[:40]!r} is not ISO 8601") from None
        at, shown = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp(), repr(value.strip()[:40])
    else:
        raise BadLine("timestamp must be epoch seconds or ISO 8601")
    if not math.isfinite(at) or not 0 <= at <= now + AHEAD:
        raise BadLine(f"timestamp {shown} is out of range: it must fall between 1970-01-01 and "
                      f"{utc(now + AHEAD, '%Y-%m-%d')}")
    return at


def _calls(value: Any) -> str:
    if value is None:
        return "[]"
    if not isinstance(value, list):
        raise BadLine("tool_calls must be a list")
    calls = []
    for call in value[:MAX_TOOL_CALLS]:
        call = call if isinstance(call, dict) else {"name": str(call)}
        calls.append({"name": _text(str(call.get("name", "?")), 100),
                      "input": _text(_json(call.get("input", "")), TOOL_INPUT_CHARS),
                      "output": _text(_json(call.get("output", "")), TOOL_OUTPUT_CHARS),
                      "is_error": bool(call.get("is_error", False))})
    return json.dumps(calls, ensure_ascii=False)


def _json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)[:TOOL_OUTPUT_CHARS + 2_000]


def _decode(line: str) -> Any:
    try:
        return msgspec.json.decode(line)
    except msgspec.ValidationError as exc:  # a number msgspec cannot hold (1e400, 5,000 digits)
        raise BadLine(f"not JSON that can be read ({str(exc).split(' - ')[0].lower()})") from None
    except msgspec.DecodeError as exc:
        raise BadLine(f"not JSON ({str(exc).removeprefix('JSON is malformed: ')})") from None


def parse(line: str, now: float) -> ImportedTurn:
    """One line as a turn (its `occurrence` is left at 1: `read_turns` counts copies)."""
    if len(line) > MAX_LINE_CHARS:
        raise BadLine(f"longer than {MAX_LINE_CHARS:,} characters")
    try:
        return _parse(_decode(line), now)
    except RecursionError:  # deeply nested JSON, decoding or re-encoding a tool call's input
        raise BadLine("nested too deeply") from None


def _parse(data: Any, now: float) -> ImportedTurn:
    if not isinstance(data, dict):
        raise BadLine("not a JSON object")
    session = data.get("session")
    if isinstance(session, (int, float)) and not isinstance(session, bool):
        session = str(session)[:200]
    if not isinstance(session, str) or not session.strip():
        raise BadLine("session must be a non-empty string")
    user, assistant = data.get("user"), data.get("assistant", "")
    if not isinstance(user, str):
        raise BadLine("user must be a string")
    if assistant is None:
        assistant = ""
    if not isinstance(assistant, str):
        raise BadLine("assistant must be a string")
    if "timestamp" not in data:
        raise BadLine("timestamp is missing")
    at, calls = timestamp(data["timestamp"], now), _calls(data.get("tool_calls"))
    return ImportedTurn(session_id=clean_text(session.strip())[:200], timestamp=at,
                        user_message=_text(user, USER_MESSAGE_CHARS), tool_calls_json=calls,
                        agent_response=_text(assistant, RESPONSE_CHARS))


def lines(source: TextIO) -> Iterator[tuple[int, str | None]]:
    """(line number, text) of each non-blank line, or None for a line over MAX_LINE_CHARS (read past,
    never held whole: a file of one endless line costs no memory)."""
    number = 0
    while True:
        line = source.readline(MAX_LINE_CHARS + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            while (rest := source.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass
            yield number, None
        elif line.strip():
            yield number, line


def _identity(turn: ImportedTurn) -> bytes:
    h = hashlib.blake2b(digest_size=12)
    for part in (turn.session_id, repr(turn.timestamp), turn.user_message, turn.agent_response):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


def read_turns(source: TextIO, report: ReadReport, now: float | None = None) -> Iterator[ImportedTurn]:
    """The file's good lines as turns, each with which copy of its turn in the file it is; bad lines
    go to `report`."""
    now = time.time() if now is None else now
    copies: dict[bytes, int] = {}
    for number, line in lines(source):
        report.lines += 1
        try:
            if line is None:
                raise BadLine(f"longer than {MAX_LINE_CHARS:,} characters")
            turn = parse(line, now)
        except BadLine as exc:
            report.bad.append((number, str(exc)))
            continue
        key = _identity(turn)
        copies[key] = copies.get(key, 0) + 1
        report.turns += 1
        report.sessions.add(turn.session_id)
        yield msgspec.structs.replace(turn, occurrence=copies[key])


def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """`items` in lists of `size` (the last may be shorter)."""
    chunk: list[T] = []
    for t in items:
        chunk.append(t)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def apply(transcript: TranscriptDB, turns: Iterable[ImportedTurn],
          progress: Callable[[ApplyReport], None] | None = None) -> ApplyReport:
    """Record the turns (a chunk a transaction), then mark their sessions ended: a past
    conversation is over, so its curation may summarise it."""
    report = ApplyReport()
    last: dict[str, float] = {}
    for chunk in chunks(turns, APPLY_CHUNK):
        ids = transcript.import_turns(chunk)
        record(report, chunk, ids, last)
        if progress:
            progress(report)
    end_sessions(transcript, last)
    return report


def record(report: ApplyReport, chunk: list[ImportedTurn], ids: list[int | None], last: dict[str, float]) -> None:
    """Count what one chunk did, and the latest time of each session it touched."""
    report.turns += len(chunk)
    report.added += sum(1 for i in ids if i is not None)
    report.already += sum(1 for i in ids if i is None)
    for t in chunk:
        last[t.session_id] = max(last.get(t.session_id, 0.0), t.timestamp)


def end_sessions(transcript: TranscriptDB, last: dict[str, float]) -> None:
    with transcript.group():  # one synced transaction
        for session, ended in last.items():
            transcript.end_session(session, ended)
