"""The boot sequence: the system prompt every new agent session starts with.

It is assembled from the six memory files, the pending actions and the
learnings of the last 48 hours. Each file is cut to its line limit and a byte
cap, and a cut is said in the prompt, so the agent knows something is missing
and can search for it. A missing, empty or unreadable file gets a default.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ..db_worker import Worker
from .files import BOOT_ORDER, MAX_FILE_BYTES, SPECS, MemoryFiles
from .memory_store import Learning, MemoryDB, PendingAction

RECENT_HOURS = 48
MAX_RECENT = 40
MAX_ACTIONS = 20
MAX_SUMMARIES = 5  # the latest sessions' one-line summaries, listed after context.md

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
    text = text.strip("\n")
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
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def recent_sessions(summaries: list[Learning]) -> str:
    """The latest sessions, one line each (the curator's SUMMARY learnings), newest first."""
    return "## Recent sessions\n" + "\n".join(f"- {_date(s.created_at)}: {s.content}" for s in summaries)


def memory_section(files: dict[str, str], actions: list[PendingAction], recent: list[Learning],
                   summaries: list[Learning] | None = None) -> str:
    """Everything daemon-curated, as one markdown section."""
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
                     + "\n".join(f"- {_date(item.created_at)} {item.type}: {item.content}" for item in recent))
    return "\n\n".join(parts)


def assemble(files: dict[str, str], actions: list[PendingAction], recent: list[Learning],
             summaries: list[Learning] | None = None) -> str:
    """The whole system prompt: the deploy-managed files, then the curated memory."""
    parts = []
    for name in BOOT_ORDER:
        if SPECS[name].owner == "deploy":
            capped = cap(name, files.get(name, ""))
            parts.append(capped.text)
            if capped.note:
                parts.append(capped.note)
    parts.append(memory_section(files, actions, recent, summaries))
    return "\n\n".join(parts) + "\n"


class BootLoader:
    def __init__(self, files: MemoryFiles, memory: Worker[MemoryDB]) -> None:
        self._files = files
        self._memory = memory

    async def _inputs(self) -> tuple[dict[str, str], list[PendingAction], list[Learning], list[Learning]]:
        files = await asyncio.to_thread(self._files.read_all)
        since = time.time() - RECENT_HOURS * 3600

        def read(db: MemoryDB) -> tuple[list[PendingAction], list[Learning], list[Learning]]:
            return db.pending_actions(MAX_ACTIONS), db.learnings_since(since, MAX_RECENT), db.summaries(MAX_SUMMARIES)

        actions, recent, summaries = await self._memory.call(read)
        return files, actions, recent, summaries

    async def boot_prompt(self) -> str:
        return assemble(*await self._inputs())

    async def refresh_context(self) -> str:
        """After a compaction: the curated memory as it is now, which may be newer than the
        system prompt this session booted with."""
        section = memory_section(*await self._inputs())
        return "Your memory was refreshed after the conversation was compacted; this replaces the " \
               "memory in your system prompt.\n\n" + section
