"""`sprite-os memory import FILE.jsonl`: past conversations into transcript.db, as turns like any other.

One turn a line: `{"session": ..., "timestamp": ..., "user": ..., "assistant": ...}`, with
`assistant` and `tool_calls` optional and `timestamp` in epoch seconds or ISO 8601 (UTC when
no offset is given). A session's turns are numbered 1, 2, ... in the order the file lists them.
Each goes through TranscriptDB.append, the writer live turns use, so the daemon curates it
and the indexer makes it searchable; a turn already recorded (same session and number) is
left alone, so importing a file twice adds nothing. A bad line is reported with its number
and skipped; every other line is imported. Text is cleaned, bounded and stripped of
`<private>` blocks exactly as capture does it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..text import clean_text
from .capture.recorder import (
    RESPONSE_CHARS,
    TOOL_INPUT_CHARS,
    TOOL_OUTPUT_CHARS,
    USER_MESSAGE_CHARS,
    strip_private,
)
from .transcript_store import NewObservation, TranscriptDB

MAX_LINE_CHARS = 1_000_000
IMPORT_GROUP = 500  # turns per transaction
MAX_TOOL_CALLS = 50


class BadLine(ValueError):
    pass


@dataclass
class ImportReport:
    lines: int = 0
    added: int = 0
    already: int = 0  # recorded before: the same session and turn
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)
    sessions: set[str] = field(default_factory=set)


def _text(value: Any, limit: int) -> str:
    text = strip_private(clean_text(value[: limit + 2_000]))
    return text if len(text) <= limit else text[:limit] + "…[more]"


def timestamp(value: Any) -> float:
    if isinstance(value, bool):
        raise BadLine("timestamp must be epoch seconds or ISO 8601")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise BadLine("timestamp must be a finite, non-negative number of seconds")
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise BadLine(f"timestamp {value[:40]!r} is not ISO 8601") from None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    raise BadLine("timestamp must be epoch seconds or ISO 8601")


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


def parse(line: str, turn: dict[str, int]) -> NewObservation:
    """One line as a turn; `turn` counts each session's turns so far (updated only on success)."""
    if len(line) > MAX_LINE_CHARS:
        raise BadLine(f"longer than {MAX_LINE_CHARS:,} characters")
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadLine(f"not JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise BadLine("not a JSON object")
    session = data.get("session")
    if isinstance(session, (int, float)) and not isinstance(session, bool):
        session = str(session)
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
    at, calls = timestamp(data["timestamp"]), _calls(data.get("tool_calls"))
    session = clean_text(session.strip())[:200]
    number = turn.get(session, 0) + 1
    turn[session] = number
    return NewObservation(timestamp=at, session_id=session, sequence_num=number,
                          user_message=_text(user, USER_MESSAGE_CHARS), tool_calls_json=calls,
                          agent_response=_text(assistant, RESPONSE_CHARS))


def numbered(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(lines, 1):
        if line.strip():
            yield number, line


def import_turns(transcript: TranscriptDB, lines: Iterable[str]) -> ImportReport:
    """Import every line; what the report counts is durable when it returns (each group of
    IMPORT_GROUP turns is one synced transaction: one fsync, not one per turn)."""
    report = ImportReport()
    turn: dict[str, int] = {}
    last: dict[str, float] = {}
    rest = numbered(lines)
    while group := list(itertools.islice(rest, IMPORT_GROUP)):
        with transcript.group():
            for number, line in group:
                _import_line(transcript, number, line, turn, last, report)
    with transcript.group():
        for session, ended in last.items():  # a past conversation is over: its curation may summarise it
            transcript.end_session(session, ended)
    return report


def _import_line(transcript: TranscriptDB, number: int, line: str, turn: dict[str, int], last: dict[str, float],
                 report: ImportReport) -> None:
    report.lines += 1
    try:
        obs = parse(line, turn)
    except BadLine as exc:
        report.bad.append((number, str(exc)))
        return
    if transcript.append(obs) is None:
        report.already += 1
    else:
        report.added += 1
    report.sessions.add(obs.session_id)
    last[obs.session_id] = max(last.get(obs.session_id, 0.0), obs.timestamp)
