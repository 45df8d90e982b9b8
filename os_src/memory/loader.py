"""The boot sequence: the system prompt every new agent session starts with.

It is assembled from the six memory files, the pending actions, the learnings
of the last 48 hours, the latest sessions' one-line summaries, and the turns the
curator has not taken in yet (so that
"Continue" works after a crash, before any curator call). Each file is cut to
its line limit and a byte cap, and a cut is said in the prompt, so the agent
knows something is missing and can search for it. A missing, empty or
unreadable file gets a default; a database that can't be read leaves its part
out. Whatever wrote them (the curator, a person, a migration), the prompt is
plain text (text.safe_text): one NUL byte in it would fail every session start.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from ..db_worker import Worker
from ..logs import get_logger
from ..text import safe_text, utc
from .corrections import replaced_learnings, was
from .curation.curator import Turn, render_turn
from .files import BOOT_ORDER, MAX_FILE_BYTES, SPECS, MemoryFiles
from .forget.jobs import named
from .forget.lines import without
from .memory_store import Learning, MemoryDB, PendingAction
from .transcript_store import TranscriptDB

log = get_logger(__name__)

RECENT_HOURS = 48
MAX_RECENT = 40
MAX_ACTIONS = 20
BOOT_SUMMARIES = 5  # the latest sessions' one-line summaries, listed after context.md
FUTURE_SLACK = 86_400.0  # a learning dated later than this past now is a bad row, not a recent one
# Turns not yet curated: the newest are kept first, within these bounds.
MAX_TURNS = 20
TURNS_CHARS = 16_000
BOOT_TURN_CHARS = 1_500  # of an uncurated turn: the person's message, and the agent's answer, each
TURN_TOOL_CALLS = 8
TURN_TOOL_CHARS = 150

MEMORY_PREAMBLE = """# Your memory
Sprite OS keeps your memory for you. What follows was curated from your earlier sessions and is \
updated in the background as you work: you never need to save, update or write memory, and nothing \
under .os/ is yours to change. To recall something older or more detailed than what is here, call \
the search_memory tool."""


@dataclass(frozen=True)
class Capped:
    text: str
    note: str | None


def cap(name: str, text: str) -> Capped:
    """Cut a file to its line limit and the byte cap, saying so when it cuts."""
    spec = SPECS[name]
    text = safe_text(text).strip("\n")
    if not text.strip():
        return Capped(spec.empty, None)
    lines = text.split("\n")
    kept = lines[: spec.max_lines]
    out = "\n".join(kept)
    if len(out.encode()) > MAX_FILE_BYTES:
        out = out.encode()[:MAX_FILE_BYTES].decode("utf-8", errors="ignore")
        kept = out.split("\n")
    if len(kept) < len(lines) or out != "\n".join(lines):
        return Capped(out, f"[{name} was cut to fit: showing {len(kept)} of {len(lines)} lines; "
                           "search_memory can find the rest]")
    return Capped(out, None)


def _date(ts: float) -> str:
    return utc(ts, "%Y-%m-%d")


def recent_sessions(summaries: Sequence[Learning]) -> str:
    """The latest sessions, one line each (the curator's SUMMARY learnings), newest first."""
    return "## Recent sessions\n" + "\n".join(f"- {_date(s.created_at)}: {s.content}" for s in summaries)


def turns_section(turns: Sequence[Turn]) -> str | None:
    """The turns not yet curated (given in the order they were recorded), oldest first: the newest
    that fit the budget. Their timestamps are shown, never used to order them: a clock set back
    would stamp a turn before the one it follows."""
    kept: list[str] = []
    size = 0
    for turn in list(reversed(turns))[:MAX_TURNS]:
        when = utc(turn.timestamp, "%Y-%m-%d %H:%M UTC")
        text = render_turn(turn, f"### {when}", BOOT_TURN_CHARS, TURN_TOOL_CALLS, TURN_TOOL_CHARS)
        if kept and size + len(text) > TURNS_CHARS:
            break
        kept.append(text)
        size += len(text)
    if not kept:
        return None
    more = len(turns) - len(kept)
    return ("## Recent turns not yet in your memory\n"
            "The latest turns, which the files above do not cover yet, oldest first"
            + (f" ({more} older ones are left out)" if more > 0 else "") + ". A turn the server stopped "
            "before it ended says so: if the person asks you to continue, pick it up where it stopped.\n\n"
            + "\n\n".join(reversed(kept)))


def learned_line(item: Learning, replaced: Mapping[int, tuple[str, float]]) -> str:
    """One recent learning; a correction says what it replaced, and until when."""
    line = f"- {_date(item.created_at)} {item.type}: {item.content}"
    if (old := replaced.get(item.id)) is not None:
        line += " " + was(*old)
    return line


def memory_section(files: dict[str, str], actions: list[PendingAction], recent: list[Learning], *,
                   summaries: Sequence[Learning] = (), turns: Sequence[Turn] = (),
                   replaced: Mapping[int, tuple[str, float]] | None = None) -> str:
    """Everything daemon-curated, as one markdown section, and the turns not curated yet."""
    parts = [MEMORY_PREAMBLE]
    for name in BOOT_ORDER:
        if SPECS[name].owner != "daemon":
            continue
        capped = cap(name, files.get(name, ""))
        parts.append(f"## {SPECS[name].title} ({name})\n{capped.text}")
        if capped.note:
            parts.append(capped.note)
        if name == "context.md" and summaries:
            parts.append(recent_sessions(summaries))
    recent = [item for item in recent if item.type != "SUMMARY"]  # listed once, under Recent sessions
    if actions:
        parts.append("## Pending actions\n" + "\n".join(f"- {a.content}" for a in actions))
    if recent:
        parts.append(f"## Learned in the last {RECENT_HOURS} hours\n"
                     "Newest first; a CORRECTION overrides any older learning it contradicts.\n"
                     + "\n".join(learned_line(item, replaced or {}) for item in recent))
    if (pending := turns_section(turns)) is not None:
        parts.append(pending)
    return safe_text("\n\n".join(parts))


def assemble(files: dict[str, str], actions: list[PendingAction], recent: list[Learning], *,
             summaries: Sequence[Learning] = (), turns: Sequence[Turn] = (),
             replaced: Mapping[int, tuple[str, float]] | None = None) -> str:
    """The whole system prompt: the deploy-managed files, then the curated memory."""
    parts = []
    for name in BOOT_ORDER:
        if SPECS[name].owner == "deploy":
            capped = cap(name, files.get(name, ""))
            parts.append(capped.text)
            if capped.note:
                parts.append(capped.note)
    parts.append(memory_section(files, actions, recent, summaries=summaries, turns=turns, replaced=replaced))
    return safe_text("\n\n".join(parts)) + "\n"


@dataclass(frozen=True)
class Remembered:
    """What memory.db gives the boot prompt."""

    actions: list[PendingAction]
    recent: list[Learning]
    summaries: list[Learning]
    replaced: dict[int, tuple[str, float]]  # by each recent correction: what it replaced, and when


def remembered_now(db: MemoryDB, now: float) -> Remembered:
    """memory.db's part of the boot prompt as of `now` (a learning dated past now, a bad row, is not recent).
    None of what a forget job holds back (memory_store.held_back: a forget cut short may have left it)."""
    recent = db.learnings_since(now - RECENT_HOURS * 3600, MAX_RECENT, now + FUTURE_SLACK)
    return Remembered(db.pending_actions(MAX_ACTIONS), recent, db.summaries(BOOT_SUMMARIES),
                      replaced_learnings(db.conn, [x.id for x in recent if x.type == "CORRECTION"]))


def assemble_from(files: dict[str, str], r: Remembered, turns: Sequence[Turn]) -> str:
    return assemble(files, r.actions, r.recent, summaries=r.summaries, turns=turns, replaced=r.replaced)


def boot_prompt_now(files: MemoryFiles, memory: MemoryDB, transcript: TranscriptDB, now: float) -> str:
    """The prompt a session starting now would boot with, read in this thread (a command's view: the
    server's BootLoader also shows turns still on their way to transcript.db)."""
    return assemble_from(files.read_all(), remembered_now(memory, now),
                         transcript.recent_pending(MAX_TURNS, named(memory)))


PendingTurns = Callable[[int], Awaitable[Sequence[Turn]]]  # the newest n turns not yet curated, as recorded
HiddenLines = Callable[[], Awaitable[set[str]]]  # file lines (by hash) a forget is taking out


async def _no_turns(_limit: int) -> Sequence[Turn]:
    return ()


async def _none_hidden() -> set[str]:
    return set()


class BootLoader:
    def __init__(self, files: MemoryFiles, memory: Worker[MemoryDB], pending: PendingTurns = _no_turns,
                 hidden: HiddenLines = _none_hidden) -> None:
        self._files = files
        self._memory = memory
        self._pending = pending
        self._hidden = hidden

    async def _inputs(self) -> tuple[dict[str, str], Remembered]:
        files = await asyncio.to_thread(self._files.read_all)
        try:  # lines a person's forget takes out, until the daemon has rewritten the files
            hidden = await self._hidden()
        except Exception as exc:
            log.error("boot_forget_jobs_unreadable", error=repr(exc)[:300])
            hidden = set()
        files = {name: without(text, hidden) for name, text in files.items()} if hidden else files
        # The last 48 hours by the clock now. A clock set back keeps what was learned "later" in the
        # window (it is stamped after `since`), newest first by the order it was learned in.
        now = time.time()
        try:
            remembered = await self._memory.call(lambda db: remembered_now(db, now))
        except Exception as exc:  # a broken memory.db must not stop a session: the files still boot it
            log.error("boot_memory_unreadable", error=repr(exc)[:300])
            remembered = Remembered([], [], [], {})
        return files, remembered

    async def boot_prompt(self) -> str:
        files, remembered = await self._inputs()
        try:
            turns = await self._pending(MAX_TURNS)
        except Exception as exc:
            log.error("boot_turns_unreadable", error=repr(exc)[:300])
            turns = ()
        return assemble_from(files, remembered, turns)

    async def refresh_context(self) -> str:
        """After a compaction: the curated memory as it is now, which may be newer than the
        system prompt this session booted with."""
        files, r = await self._inputs()
        section = memory_section(files, r.actions, r.recent, summaries=r.summaries, replaced=r.replaced)
        return "Your memory was refreshed after the conversation was compacted; this replaces the " \
               "memory in your system prompt.\n\n" + section
