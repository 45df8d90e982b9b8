"""Reading the curator's reply: strict about structure, forgiving about decoration, never guessing.

The format is the design's: learning lines (`FACT: ...`), or `NONE`, `DONE: A<id>` lines, then
`<NAME>_MD_UPDATE:` blocks that each hold a whole file. A marker starts its line (a label
after it that names its file, like `(user.md)`, is ignored; any other text after it, like
`(no changes needed)`, means the line opens no block); a line inside a file block is file
content even if it starts with `FACT:`, and so is a marker-shaped line inside a ``` code
block opened in that block, but any other marker-shaped line ends the block, and the block
of an unknown or forbidden marker (`SOUL_MD_UPDATE`) is dropped (counted as a rewrite not
applied); a ``` fence wrapping the whole reply is ignored; anything unrecognised is reported,
never guessed at. Control characters and lone surrogates are taken out before anything is
read (text.safe_text). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from ...text import safe_text
from ..files import CURATED
from ..memory_store import LEARNING_TYPES, NewLearning

MAX_LEARNING_CHARS = 600
# A reply's learnings are kept up to MAX_LEARNINGS, or LEARNINGS_PER_TURN a turn of the call if more: a bound on a
# runaway reply that still keeps every learning of a backlog's call (up to the daemon's MAX_CHUNK_TURNS), whose turns
# are all marked curated: a fixed 60 lost a large call's later learnings while their turns counted as curated.
MAX_LEARNINGS = 60
LEARNINGS_PER_TURN = 3
CONFIDENCE = {"CORRECTION": 0.95, "PREFERENCE": 0.85, "TOOL_INSTALL": 0.9, "FACT": 0.8, "ACTION": 0.8,
              "PATTERN": 0.7, "SUMMARY": 0.9}
MARKERS = {f"{name.split('.')[0].upper()}_MD_UPDATE": name for name in CURATED}

# Any line that starts like a marker is one, known or not: a forbidden SOUL_MD_UPDATE inside a
# user.md block must end that block, not become user.md content (unless it sits in a code block
# of that file). Text after the colon is kept apart (group 2), never taken as file content.
_MARKER = re.compile(r"^\s*(?:#+\s*)?[*`]*\s*([A-Z]+_MD_UPDATE)\b[*`]*\s*:?[*`]*\s*(.*?)\s*$")
_LEARNING = re.compile(r"^\s*(?:[-*]\s+)?\**\s*([A-Za-z_]+)\s*\**\s*:\s*(.+?)\s*$")
_REF = re.compile(r"\s*\[#(\d+)\]\s*$")
_DONE = re.compile(r"^\s*(?:[-*]\s+)?\**\s*DONE\s*\**\s*:\s*\[?A?(\d+)\]?", re.IGNORECASE)
_FENCE = re.compile(r"^\s*```")


@dataclass
class CuratorReply:
    learnings: list[NewLearning] = field(default_factory=list)
    file_updates: dict[str, str] = field(default_factory=dict)
    said_none: bool = False
    done_actions: list[int] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)  # lines that fit no rule
    rejected_files: list[str] = field(default_factory=list)  # blocks dropped as ambiguous or empty
    declined_files: list[str] = field(default_factory=list)  # `USER_MD_UPDATE: (no changes needed)`
    over_bound: int = 0  # learnings past the bound, dropped
    # The turns the learnings name by `[#id]`: those kept, and those dropped past the bound or cut off at the token
    # limit (the last). A turn only dropped learnings name held what was never learned (`cited_only_by_dropped`).
    cited_by_kept: set[int] = field(default_factory=set)
    cited_by_dropped: set[int] = field(default_factory=set)
    # Blocks with text under an unknown or forbidden marker (`SOUL_MD_UPDATE`): file rewrites, dropped
    foreign_rewrites: int = 0

    @property
    def lines_ignored(self) -> int:
        """The lines memory.db counts as ignored (memory_store.LeftOut): those in `ignored` but the markers
        that decline their file (`USER_MD_UPDATE: (no changes needed)`), which answer the format, and those
        that open a foreign rewrite, counted as the rewrites they open (a soul.md rewrite a prompt injection
        asked for is no stray line); `ignored` keeps both for the log."""
        return len(self.ignored) - len(self.declined_files) - self.foreign_rewrites

    @property
    def cited_only_by_dropped(self) -> set[int]:
        """The turns that only dropped learnings (past the bound, or cut off) name: what they held was never learned."""
        return self.cited_by_dropped - self.cited_by_kept

    @property
    def recognised(self) -> bool:
        """False for garbage or an empty reply: nothing in it follows the format."""
        return (self.said_none or bool(self.learnings) or bool(self.file_updates) or bool(self.rejected_files)
                or bool(self.done_actions) or bool(self.declined_files))


def parse_reply(text: str, observation_ids: list[int], session_of: dict[int, str] | None = None,
                truncated: bool = False) -> CuratorReply:
    """Read a reply. `truncated`: the model hit its token limit, so whatever came last (a file
    block or a learning line) is incomplete and is dropped, never applied (a dropped learning's `[#id]`
    joins `cited_by_dropped`, as one past the bound does; one past it is dropped already). The reply is made plain
    text first (text.safe_text: no NUL or other control character, valid UTF-8), whatever the
    model sent: it becomes files and learnings, and from them the boot prompt."""
    parser = _Parser(observation_ids, session_of or {})
    lines = safe_text(text).splitlines()
    parser.last_fence = max((i for i, x in enumerate(lines) if _FENCE.match(x)), default=-1)
    for i, raw in enumerate(lines):
        parser.line(i, raw)
    return parser.finish(truncated)


class _Parser:
    """One reply, read line by line: each line is a marker, a line of the open file block, or an item."""

    def __init__(self, observation_ids: list[int], session_of: dict[int, str]) -> None:
        self.reply = CuratorReply()
        self.ids = observation_ids
        self.session_of = session_of
        self.default_source = observation_ids[-1] if observation_ids else None
        self.max_learnings = max(MAX_LEARNINGS, LEARNINGS_PER_TURN * len(observation_ids))
        self.blocks: dict[str, list[list[str]]] = {}
        self.foreign: list[list[str]] = []  # the blocks of unknown or forbidden markers, dropped
        self.current: list[str] | None = None  # the open file block's lines
        self.last_block: str | None = None  # the reply's last item, if a file block ("": nothing to drop)
        self.in_code = False  # inside a ``` code block opened within the open file block (not its wrapper)
        self.wrapper = False  # ...or inside a fence opened as the block's first line, around the whole file
        self.last_fence = -1
        # The kept learnings' `[#id]`s, counted (the last learning may still be dropped, cut off), and the last's
        self.kept_cites: Counter[int] = Counter()
        self.last_cite: int | None = None

    def line(self, i: int, raw: str) -> None:
        marker = _MARKER.match(raw)
        if marker and self.current is not None and self.in_code and i < self.last_fence:
            marker = None  # the file documents the format in a code block (closed later): content
        if marker:
            self._marker(marker, raw)
        elif self.current is not None:
            self._file_line(raw)
        else:
            self._item(raw.strip())

    def _marker(self, marker: re.Match[str], raw: str) -> None:
        self.in_code = self.wrapper = False
        name = MARKERS.get(marker[1])
        if name is not None and marker[2] and not _is_label(marker[2], name) and not _is_intro(marker[2]):
            # `USER_MD_UPDATE: (no changes needed)`: narration follows, not the file. The block
            # before still ends here; this line opens none.
            self.current, self.last_block = None, ""
            self.reply.declined_files.append(name)  # the format, answered: not garbage
            self.reply.ignored.append(raw.strip()[:200])
            return
        self.current = []  # an unknown or forbidden marker's block is read, then dropped
        self.last_block = name or marker[1]
        if name is not None:
            self.blocks.setdefault(name, []).append(self.current)
        else:
            said = f"{marker[1].removesuffix('_MD_UPDATE').lower()}.md"
            if not marker[2] or _is_label(marker[2], said) or _is_intro(marker[2]):
                self.foreign.append(self.current)  # a rewrite (`SOUL_MD_UPDATE: (no changes needed)` is none)
            self.reply.ignored.append(raw.strip()[:200])

    def _file_line(self, raw: str) -> None:
        assert self.current is not None
        if _FENCE.match(raw):
            # A fence that opens the block wraps the file: a marker inside it is more likely the
            # next block after a fence the model forgot to close than part of the file.
            if self.wrapper:
                self.wrapper = False
            elif not self.in_code and not any(x.strip() for x in self.current):
                self.wrapper = True
            else:
                self.in_code = not self.in_code
        self.current.append(raw.rstrip())

    def _item(self, line: str) -> None:
        reply = self.reply
        if not line or _FENCE.match(line):  # blank, or a fence around the whole reply
            return
        if line.strip("*`").upper() == "NONE":
            reply.said_none = True
        elif done := _DONE.match(line):
            reply.done_actions.append(int(done[1]))
        elif (m := _LEARNING.match(line)) and m[1].upper() in LEARNING_TYPES:
            if len(reply.learnings) < self.max_learnings:
                self._learning(m[1].upper(), m[2].strip())
            else:
                reply.over_bound += 1
                self.last_block = ""  # the last item, already dropped: a cut leaves the kept learnings whole
                if (ref := _REF.search(m[2])) and int(ref[1]) in self.ids:
                    reply.cited_by_dropped.add(int(ref[1]))
        else:
            reply.ignored.append(line[:200])

    def _learning(self, kind: str, content: str) -> None:
        source, cite = self.default_source, None
        if ref := _REF.search(content):
            content = content[: ref.start()].strip()
            if int(ref[1]) in self.ids:
                source = cite = int(ref[1])
                self.kept_cites[cite] += 1  # (a learning with no words left keeps its turn curated too)
        if content:
            self.last_block, self.last_cite = None, cite  # the reply's last item is now this learning
            self.reply.learnings.append(NewLearning(
                type=kind, content=content[:MAX_LEARNING_CHARS],
                session_id=self.session_of.get(source) if source is not None else None,
                source_observation_id=source, confidence=CONFIDENCE[kind]))

    def finish(self, truncated: bool) -> CuratorReply:
        reply = self.reply
        reply.foreign_rewrites = sum(any(x.strip() for x in block) for block in self.foreign)
        if truncated and self.last_block is not None:
            if self.last_block in self.blocks:
                reply.rejected_files.append(self.last_block)
                del self.blocks[self.last_block]
        elif truncated and reply.learnings:  # the last item was a learning: dropped, as one past the bound is
            reply.learnings.pop()
            if self.last_cite is not None:
                self.kept_cites[self.last_cite] -= 1
                reply.cited_by_dropped.add(self.last_cite)
        reply.cited_by_kept = set(+self.kept_cites)
        for name, found in self.blocks.items():
            content = _file_text(found[0]) if len(found) == 1 else None
            if content is None or not content.strip():
                # Two blocks for one file (which is right?) or an empty one (a wipe is never wanted).
                reply.rejected_files.append(name)
            else:
                reply.file_updates[name] = content
        return reply


def _is_intro(text: str) -> bool:
    """`Here is the new file:`: the text ends with a colon, so it announces what follows (the file),
    unlike `(no changes needed)`. The intro itself is never file content."""
    return text.strip("*` ").endswith(":")


def _is_label(text: str, name: str) -> bool:
    """True if the text after a marker only names its file: `user.md`, `(user.md)`, `` `user.md` ``,
    `(user.md, at most 200 lines)`. `(no changes needed)` or `here it is` is not a label."""
    text = text.strip("*").strip()
    if text.startswith("(") and text.endswith(")"):
        inner = text[1:-1].strip()
        return bool(re.match(rf"`?{re.escape(name)}`?(?:$|\s*[,:;]|\s+[-–—])", inner, re.IGNORECASE))
    return bool(re.fullmatch(rf"`?{re.escape(name)}`?", text, re.IGNORECASE))


def _file_text(lines: list[str]) -> str:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    if lines and sum(bool(_FENCE.match(x)) for x in lines) % 2:
        # An unpaired fence: the close (or open) of a fence that wraps the whole reply.
        if _FENCE.match(lines[-1]):
            lines = lines[:-1]
        elif _FENCE.match(lines[0]):
            lines = lines[1:]
    if lines and _FENCE.match(lines[0]) and _FENCE.match(lines[-1]) and len(lines) >= 2:
        lines = lines[1:-1]
    return "\n".join(lines) + "\n" if lines else ""
